package chpart.spark;

import java.util.Map;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.SupportsCatalogOptions;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code format("chpart")}: exactly-once loads into ClickHouse through the chpart CLI.
 *
 * <pre>
 *   df.write.format("chpart").option("table", "db.events")
 *     .option("config", "/etc/chpart/chpart.toml").mode("append").save()
 * </pre>
 *
 * The table takes the schema Spark gives it (the DataFrame's, or the columns of a SQL {@code
 * CREATE TABLE t (...) USING chpart OPTIONS (...)}); see deploy/spark/README.md.
 *
 * <p>{@code SupportsCatalogOptions}: Spark 4.3's DataFrameWriter runs the save modes
 * errorifexists and ignore only for a source that names a catalog (a plain TableProvider gets
 * UNSUPPORTED_DATA_SOURCE_SAVE_MODE); {@code df.write.format("chpart")} resolves the table {@code
 * database.table} in a {@link ChpartCatalog} (registered for the write's config if needed), whose
 * existence check over ClickHouse decides the mode.
 */
public final class ChpartDataSource implements SupportsCatalogOptions, DataSourceRegister {
  @Override
  public String shortName() {
    return "chpart";
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true; // the schema is the writer's (or the SQL table's): nothing is inferred
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    throw new UnsupportedOperationException("chpart data source: the schema cannot be inferred (chpart is"
        + " write-only): write a DataFrame, or name the columns: CREATE TABLE t (id BIGINT, ...) USING chpart"
        + " OPTIONS (table 'db.events', config '/etc/chpart/chpart.toml')");
  }

  @Override
  public Identifier extractIdentifier(CaseInsensitiveStringMap options) {
    ChpartOptions o = ChpartOptions.of(Map.of(), options.asCaseSensitiveMap());
    return Identifier.of(new String[] {o.database()}, o.tableName());
  }

  @Override
  public String extractCatalog(CaseInsensitiveStringMap options) {
    return ChpartCatalog.register(SparkSession.active(), ChpartOptions.of(Map.of(), options.asCaseSensitiveMap()));
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new ChpartTable(schema, properties);
  }
}
