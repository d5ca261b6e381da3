package chpart.spark;

import org.apache.spark.sql.connector.distributions.Distribution;
import org.apache.spark.sql.connector.distributions.UnspecifiedDistribution;
import org.apache.spark.sql.connector.expressions.SortOrder;
import org.apache.spark.sql.connector.metric.CustomMetric;
import org.apache.spark.sql.connector.metric.CustomTaskMetric;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.RequiresDistributionAndOrdering;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.types.StructType;

/**
 * One logical write: an exactly-once chpart load of the query's rows into the table; for a
 * streaming query, one such load per micro-batch.
 */
final class ChpartWrite implements Write, RequiresDistributionAndOrdering {
  private final ChpartOptions options;
  private final StructType schema;
  private final String queryId;
  private final String mode;
  private final ChpartBatchWrite.DriverMetrics metrics = new ChpartBatchWrite.DriverMetrics();
  private final Layout layout;

  /** @param mode chpart's load mode ({@code append}; {@code replace} or {@code overwrite} once Spark's overwrite maps to it) */
  ChpartWrite(ChpartOptions options, StructType schema, String queryId, String mode, Layout layout) {
    this.layout = layout;
    this.options = options;
    this.schema = schema;
    this.queryId = queryId;
    this.mode = mode;
  }

  @Override
  public Distribution requiredDistribution() {
    return layout.distribution;
  }

  @Override
  public SortOrder[] requiredOrdering() {
    return new SortOrder[0]; // clickhouse-local sorts each part itself (Layout)
  }

  /**
   * Option target_part_bytes: with a distribution to satisfy, Spark's adaptive execution splits a
   * shuffle partition larger than this over several tasks and coalesces small ones (0: Spark's
   * own advisory size; Spark refuses one with an unspecified distribution).
   */
  @Override
  public boolean distributionStrictlyRequired() {
    return options.targetPartBytes == 0; // else Spark may split a partition (RebalancePartitions)
  }

  @Override
  public long advisoryPartitionSizeInBytes() {
    return layout.distribution instanceof UnspecifiedDistribution ? 0 : options.targetPartBytes;
  }

  @Override
  public String description() {
    return "chpart " + mode + " into " + options.table;
  }

  @Override
  public BatchWrite toBatch() {
    return new ChpartBatchWrite(options, schema, queryId, mode, options.load, metrics);
  }

  /**
   * {@code df.writeStream.format("chpart")}: one load per micro-batch (ChpartStreamingWrite), in
   * output mode append only. Spark turns mode complete into truncate() (here chpart's replace
   * mode, which replaces the partitions the rows fall into, not the whole result table), and
   * refuses mode update itself (the builder is no SupportsStreamingUpdateAsAppend). The load id
   * is the epoch's, so options load and winners_path, which name one load, are refused.
   */
  @Override
  public StreamingWrite toStreaming() {
    if (!mode.equals("append")) {
      throw new UnsupportedOperationException("chpart streaming sink: output mode complete is not supported: it"
          + " would replace the whole table with each micro-batch's result (a table swap per batch); use"
          + " outputMode(\"append\"), or a batch write with option overwrite=table for a whole-table snapshot");
    }
    if (options.load != null || options.winnersPath != null) {
      throw new IllegalArgumentException("chpart streaming sink: options load and winners_path are for one batch"
          + " write; a streaming write loads each micro-batch as <query id>.<batch id>");
    }
    return new ChpartStreamingWrite(options, schema, queryId, metrics);
  }

  @Override
  public CustomMetric[] supportedCustomMetrics() {
    return ChpartMetrics.all();
  }

  @Override
  public CustomTaskMetric[] reportDriverMetrics() {
    if (metrics.commitMs < 0) {
      return new CustomTaskMetric[0]; // nothing was committed
    }
    return new CustomTaskMetric[] {
      ChpartMetrics.value(ChpartMetrics.ROWS, metrics.rows),
      ChpartMetrics.value(ChpartMetrics.PARTS, metrics.parts),
      ChpartMetrics.value(ChpartMetrics.BYTES, metrics.bytes),
      ChpartMetrics.value(ChpartMetrics.BUILD_MS, metrics.buildMs),
      ChpartMetrics.value(ChpartMetrics.UPLOAD_MS, metrics.uploadMs),
      ChpartMetrics.value(ChpartMetrics.PUBLISH_MS, metrics.publishMs),
      ChpartMetrics.value(ChpartMetrics.COMMIT_MS, metrics.commitMs),
    };
  }
}
