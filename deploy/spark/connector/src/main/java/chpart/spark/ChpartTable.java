package chpart.spark;

import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * A ClickHouse table as Spark sees it: write-only, with the schema Spark gives (the DataFrame's,
 * or a SQL table's columns). chpart checks the rows against the real table when it builds; columns
 * the ClickHouse table has and the rows lack take their DEFAULT.
 */
final class ChpartTable implements SupportsWrite {
  private final StructType schema;
  private final Map<String, String> properties;
  /**
   * A table of ChpartCatalog: no columns of its own, any query schema is written (chpart checks it
   * against the real table); else the schema Spark gave, which Spark resolves the query against.
   */
  private final boolean fromCatalog;
  /** The catalog deferred the CREATE TABLE to the write (ChpartCatalog#createTable). */
  private final boolean createOnWrite;

  ChpartTable(StructType schema, Map<String, String> properties) {
    this(schema, properties, false, false);
  }

  private ChpartTable(StructType schema, Map<String, String> properties, boolean fromCatalog, boolean createOnWrite) {
    this.schema = schema;
    this.properties = Map.copyOf(properties);
    this.fromCatalog = fromCatalog;
    this.createOnWrite = createOnWrite;
  }

  static ChpartTable ofCatalog(Map<String, String> properties, boolean createOnWrite) {
    return new ChpartTable(new StructType(), properties, true, createOnWrite);
  }

  @Override
  public String name() {
    for (Map.Entry<String, String> e : properties.entrySet()) {
      String key = e.getKey();
      if (key.equalsIgnoreCase("table") || key.equalsIgnoreCase("option.table")) {
        return "chpart:" + e.getValue();
      }
    }
    return "chpart";
  }

  @Override
  public Column[] columns() {
    Column[] columns = new Column[schema.fields().length];
    for (int i = 0; i < columns.length; i++) {
      StructField f = schema.fields()[i];
      columns[i] = Column.create(f.name(), f.dataType(), f.nullable());
    }
    return columns;
  }

  @Override
  public Map<String, String> properties() {
    return properties;
  }

  @Override
  public Set<TableCapability> capabilities() {
    // TRUNCATE and OVERWRITE_*: Spark's overwrite paths, which map to chpart's replace mode
    // (ChpartWriteBuilder). STREAMING_WRITE: micro-batches in append mode (ChpartStreamingWrite).
    if (fromCatalog) {
      return Set.of(TableCapability.BATCH_WRITE, TableCapability.STREAMING_WRITE, TableCapability.TRUNCATE,
          TableCapability.OVERWRITE_BY_FILTER, TableCapability.OVERWRITE_DYNAMIC, TableCapability.ACCEPT_ANY_SCHEMA);
    }
    return Set.of(TableCapability.BATCH_WRITE, TableCapability.STREAMING_WRITE, TableCapability.TRUNCATE,
        TableCapability.OVERWRITE_BY_FILTER, TableCapability.OVERWRITE_DYNAMIC);
  }

  @Override
  public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
    ChpartOptions options = ChpartOptions.of(properties, info.options().asCaseSensitiveMap());
    // Only a table of ChpartCatalog is written through a relation whose catalog resolves the
    // partition-key functions (Layout); a session-catalog table USING chpart is not.
    return new ChpartWriteBuilder(options, info, createOnWrite, fromCatalog);
  }
}
