package chpart.spark;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.SparkContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.types.StructType;

/**
 * The driver's side of {@code df.writeStream.format("chpart")}: every micro-batch (Spark's epoch)
 * is one chpart load {@code <query id>.<epoch id>}, written by exactly the batch protocol of
 * {@link ChpartBatchWrite}, one instance per epoch. A replayed epoch is the same load again, so
 * that protocol makes the replay exactly once: a committed load builds and commits nothing, a load
 * whose commit recorded its plan is finished from the ledger, an open one is built again (the new
 * attempts win; the dead run's parts are losers for {@code chpart gc}).
 *
 * <p>What this relies on in Spark 4.3 (read in its code: MicroBatchExecution, V2Writes,
 * MicroBatchWrite, ContinuousExecution; checked against the 4.3.0 jars with javap):
 *
 * <ul>
 *   <li>{@code LogicalWriteInfo.queryId()} of a streaming write is the query's {@code id}
 *       ({@code WriteToMicroBatchDataSource(queryId = id.toString)}), which StreamExecution reads
 *       from the checkpoint's {@code metadata} file: the same across restarts, unlike the run id.
 *       It is also the local property {@code sql.streaming.queryId}; the two are compared.
 *   <li>Each micro-batch plans its write anew ({@code V2Writes} builds a {@code Write} and calls
 *       {@code toStreaming()} in every batch's IncrementalExecution) and wraps it in {@code
 *       MicroBatchWrite(batchId, ...)}, whose {@code createBatchWriterFactory} calls {@link
 *       #createStreamingWriterFactory} without the epoch. MicroBatchExecution.runBatch sets the
 *       local property {@code streaming.sql.batchId} on the thread that runs the batch before it
 *       plans and runs it, so that property names the epoch here; the tasks ({@code
 *       createWriter(..., epochId)}) and {@link #commit} check it against the epoch Spark gives
 *       them.
 *   <li>{@code commit(epochId, messages)} comes from {@code MicroBatchWrite.commit}, with one
 *       message per partition as in a batch write, before Spark writes the batch into the
 *       checkpoint's commit log: a driver that dies after it replays the batch with the same data.
 *   <li>Continuous processing calls {@link #createStreamingWriterFactory} once for all epochs
 *       (with the local property {@code __is_continuous_processing} = true): not supported, one
 *       load per epoch needs the epoch before the tasks start.
 * </ul>
 */
final class ChpartStreamingWrite implements StreamingWrite {
  /** Spark's local properties (MicroBatchExecution.BATCH_ID_KEY, StreamExecution's keys). */
  static final String BATCH_ID_PROPERTY = "streaming.sql.batchId";
  static final String QUERY_ID_PROPERTY = "sql.streaming.queryId";
  static final String CONTINUOUS_PROPERTY = "__is_continuous_processing";

  private final ChpartOptions options;
  private final StructType schema;
  private final String queryId;
  private final ChpartBatchWrite.DriverMetrics metrics;
  /** The batch write of each epoch whose factory was made and that is not committed yet. */
  private final Map<Long, ChpartBatchWrite> epochs = new ConcurrentHashMap<>();

  ChpartStreamingWrite(ChpartOptions options, StructType schema, String queryId,
      ChpartBatchWrite.DriverMetrics metrics) {
    this.options = options;
    this.schema = schema;
    this.queryId = queryId;
    this.metrics = metrics;
  }

  /** {@code <query id>.<epoch id>}, as {@code chpart_spark.foreach_batch} names a batch's load. */
  static String load(String queryId, long epoch) {
    return queryId + "." + epoch;
  }

  @Override
  public boolean useCommitCoordinator() {
    return true; // as ChpartBatchWrite: one attempt per partition may finish its input and publish
  }

  @Override
  public StreamingDataWriterFactory createStreamingWriterFactory(PhysicalWriteInfo info) {
    long epoch = currentEpoch();
    ChpartBatchWrite batch = new ChpartBatchWrite(options, schema, queryId, "append", load(queryId, epoch), metrics);
    DataWriterFactory factory = batch.createBatchWriterFactory(info);
    epochs.put(epoch, batch);
    return new EpochWriterFactory(factory, epoch, load(queryId, epoch));
  }

  @Override
  public void commit(long epochId, WriterCommitMessage[] messages) {
    batch(epochId).commit(messages);
    epochs.remove(epochId);
  }

  @Override
  public void abort(long epochId, WriterCommitMessage[] messages) {
    ChpartBatchWrite batch = epochs.remove(epochId);
    if (batch != null) { // else the epoch failed before its load was decided: nothing to undo
      batch.abort(messages);
    }
  }

  private ChpartBatchWrite batch(long epochId) {
    ChpartBatchWrite batch = epochs.get(epochId);
    if (batch == null) {
      throw new IllegalStateException("chpart streaming sink: Spark commits epoch " + epochId + " of query " + queryId
          + ", whose writer factory was made for epochs " + epochs.keySet() + ": refusing to commit a load no task"
          + " of this run wrote");
    }
    return batch;
  }

  /** The micro-batch this driver thread runs, from Spark's local properties (see the class doc). */
  private long currentEpoch() {
    SparkContext sc = SparkContext.getOrCreate();
    if ("true".equals(sc.getLocalProperty(CONTINUOUS_PROPERTY))) {
      throw new UnsupportedOperationException("chpart streaming sink: continuous processing"
          + " (trigger(continuous=...)) is not supported: each micro-batch is one exactly-once chpart load, named"
          + " before its tasks start; use a micro-batch trigger (processingTime, availableNow)");
    }
    String property = sc.getLocalProperty(QUERY_ID_PROPERTY);
    if (property != null && !property.equals(queryId)) {
      throw new IllegalStateException("chpart streaming sink: the write's query id " + queryId
          + " is not the streaming query's id " + property + " (local property " + QUERY_ID_PROPERTY + "): the load"
          + " ids would not survive a restart");
    }
    String batchId = sc.getLocalProperty(BATCH_ID_PROPERTY);
    try {
      return Long.parseLong(batchId);
    } catch (NumberFormatException e) {
      throw new IllegalStateException("chpart streaming sink: no micro-batch id in the local property "
          + BATCH_ID_PROPERTY + " (" + batchId + ") of query " + queryId + "; it is set by Spark's"
          + " MicroBatchExecution (Spark 4.3)", e);
    }
  }

  /** The batch write's factory, for the tasks of one epoch. */
  private static final class EpochWriterFactory implements StreamingDataWriterFactory {
    private static final long serialVersionUID = 1L;

    private final DataWriterFactory batch;
    private final long epoch;
    private final String load;

    EpochWriterFactory(DataWriterFactory batch, long epoch, String load) {
      this.batch = batch;
      this.epoch = epoch;
      this.load = load;
    }

    @Override
    public DataWriter<InternalRow> createWriter(int partitionId, long taskId, long epochId) {
      if (epochId != epoch) {
        throw new IllegalStateException("chpart streaming sink: a task of epoch " + epochId + " got the writer of epoch "
            + epoch + " (load " + load + "): refusing to write");
      }
      return batch.createWriter(partitionId, taskId);
    }
  }
}
