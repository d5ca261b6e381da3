package chpart.spark;

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
 * Only append is supported so far: the overwrite paths are refused here, at planning, before
 * anything runs, naming the mode (they will map to chpart's replace mode).
 */
final class ChpartWriteBuilder implements WriteBuilder, SupportsTruncate, SupportsOverwriteV2,
    SupportsDynamicOverwrite {
  private final ChpartOptions options;
  private final LogicalWriteInfo info;

  ChpartWriteBuilder(ChpartOptions options, LogicalWriteInfo info) {
    this.options = options;
    this.info = info;
  }

  @Override
  public Write build() {
    checkArrowTypes(info.schema());
    return new ChpartWrite(options, info.schema(), info.queryId(), "append");
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
    throw unsupported("overwrite (truncate the table, then write)");
  }

  @Override
  public WriteBuilder overwrite(Predicate[] predicates) {
    throw unsupported("overwrite (by filter)");
  }

  @Override
  public WriteBuilder overwriteDynamicPartitions() {
    throw unsupported("overwrite (dynamic partition overwrite)");
  }

  static UnsupportedOperationException unsupported(String mode) {
    return new UnsupportedOperationException("chpart data source: save mode " + mode
        + " is not supported yet; only append is (use .mode(\"append\") or INSERT INTO)");
  }
}
