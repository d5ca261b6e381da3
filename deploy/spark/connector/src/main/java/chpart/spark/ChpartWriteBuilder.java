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
 * {@code overwrite} into truncate() / overwrite(predicates) / overwriteDynamicPartitions() first.
 * Every overwrite is chpart's replace mode: exactly the table partitions the rows fall into are
 * replaced, each atomically (REPLACE PARTITION), the others are kept; never a TRUNCATE. Option
 * {@code overwrite=table} (the whole table) is refused: see {@link #overwriteTableRefused}.
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
    return replace();
  }

  @Override
  public WriteBuilder overwrite(Predicate[] predicates) {
    for (Predicate p : predicates) {
      if (!(p instanceof AlwaysTrue)) {
        throw new UnsupportedOperationException("chpart data source: overwrite by a filter (" + p
            + ") is not supported: mode(\"overwrite\") replaces exactly the partitions the rows fall into");
      }
    }
    return replace();
  }

  @Override
  public WriteBuilder overwriteDynamicPartitions() {
    return replace();
  }

  private WriteBuilder replace() {
    if (options.overwrite.equals("table")) {
      throw overwriteTableRefused();
    }
    mode = "replace";
    return this;
  }

  /**
   * A whole-table overwrite would have to drop the partitions the write does not have, in steps
   * apart from the REPLACE PARTITIONs (ClickHouse has no statement that swaps a table's partitions
   * at once while keeping its identity): readers would see a table with some partitions gone and
   * others not yet replaced, and a crash between the steps would leave that state. chpart refuses
   * that rather than make it look exactly-once.
   */
  static UnsupportedOperationException overwriteTableRefused() {
    return new UnsupportedOperationException("chpart data source: option overwrite=table (replace the whole"
        + " table) is refused: dropping the partitions the rows do not have cannot be made one atomic step with"
        + " replacing the others, so readers (and a crash) could see a half-replaced table. mode(\"overwrite\")"
        + " without it replaces exactly the partitions written, each atomically");
  }
}
