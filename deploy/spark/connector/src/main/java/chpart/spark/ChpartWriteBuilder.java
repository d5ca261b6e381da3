package chpart.spark;

import org.apache.spark.sql.connector.expressions.filter.AlwaysTrue;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.SupportsDynamicOverwrite;
import org.apache.spark.sql.connector.write.SupportsOverwriteV2;
import org.apache.spark.sql.connector.write.SupportsTruncate;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.types.StructType;

/**
 * Builds the write for Spark's save mode. Spark turns {@code append} into a plain build() and
 * {@code overwrite} into truncate() / overwrite(predicates) (static partition overwrite, Spark's
 * default) or overwriteDynamicPartitions() (spark.sql.sources.partitionOverwriteMode=dynamic)
 * first. Option {@code overwrite} says what an overwrite replaces:
 * <ul>
 * <li>{@code partitions} (the default): chpart's replace mode, exactly the table partitions the
 *     rows fall into, each atomically (REPLACE PARTITION), the others kept; never a TRUNCATE;
 * <li>{@code table}: chpart's overwrite mode, the whole table swapped at once (EXCHANGE TABLES);
 *     refused when Spark asks for a dynamic partition overwrite.
 * </ul>
 * (Spark asks the DataFrame writer's {@code mode("overwrite")} for a static overwrite unless the
 * table reports partitioning, which a chpart table does not: spark.sql.sources.partitionOverwriteMode
 * does not change what it replaces; option {@code overwrite} does.)
 * The default stays {@code partitions}: a job written for it would lose every other partition
 * if the default became the whole table.
 */
final class ChpartWriteBuilder implements WriteBuilder, SupportsTruncate, SupportsOverwriteV2,
    SupportsDynamicOverwrite {
  private final ChpartOptions options;
  private final LogicalWriteInfo info;
  private final boolean createTable;
  private final boolean catalogFunctions;
  private String mode = "append";

  /** @param catalogFunctions Spark resolves the write's functions in a ChpartCatalog (Layout) */
  ChpartWriteBuilder(ChpartOptions options, LogicalWriteInfo info, boolean createTable, boolean catalogFunctions) {
    this.options = options;
    this.info = info;
    this.createTable = createTable;
    this.catalogFunctions = catalogFunctions;
  }

  @Override
  public Write build() {
    checkArrowTypes(info.schema());
    if (createTable) {
      // Save mode errorifexists / ignore on a table Spark's catalog check found missing: created
      // here, once, on the driver, before chpart begin snapshots it.
      ChpartCatalog.create(options, info.schema());
    }
    return new ChpartWrite(options, info.schema(), info.queryId(), mode, Layout.of(options, info.schema(), catalogFunctions));
  }

  /** A column type Spark cannot write as Arrow fails here, at planning, before chpart begin. */
  static void checkArrowTypes(StructType schema) {
    try {
      ArrowWriter.create(schema, "UTC", true, false).root().close();
    } catch (RuntimeException e) {
      throw new IllegalArgumentException("chpart data source: the rows cannot be streamed as Arrow: " + e.getMessage(), e);
    }
  }

  @Override
  public WriteBuilder truncate() {
    return staticOverwrite();
  }

  @Override
  public WriteBuilder overwrite(Predicate[] predicates) {
    for (Predicate p : predicates) {
      if (!(p instanceof AlwaysTrue)) {
        throw new UnsupportedOperationException("chpart data source: overwrite by a filter (" + p
            + ") is not supported: mode(\"overwrite\") replaces exactly the partitions the rows fall into");
      }
    }
    return staticOverwrite();
  }

  /** Spark's static partition overwrite (what mode("overwrite") asks for): the whole table with overwrite=table. */
  private WriteBuilder staticOverwrite() {
    mode = options.overwrite.equals("table") ? "overwrite" : "replace";
    return this;
  }

  @Override
  public WriteBuilder overwriteDynamicPartitions() {
    if (options.overwrite.equals("table")) {
      throw new UnsupportedOperationException("chpart data source: option overwrite=table replaces the whole"
          + " table, but Spark asks for a dynamic partition overwrite (spark.sql.sources.partitionOverwriteMode"
          + "=dynamic on a partitioned table): use overwrite=partitions for that");
    }
    mode = "replace";
    return this;
  }
}
