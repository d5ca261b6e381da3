package chpart.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.types.StructType;

/** What every task of one write needs, made on the driver once the load is open. */
final class ChpartWriterFactory implements DataWriterFactory {
  private static final long serialVersionUID = 1L;

  final Chpart cli;
  final String load;
  /** {@code <applicationId>.<application attempt>.<nonce>}; a task appends {@code .<taskAttemptId>}. */
  final String attemptPrefix;
  final StructType schema;
  /** The load was committed, or its commit planned, by an earlier run: tasks build nothing. */
  final boolean nothingToBuild;

  ChpartWriterFactory(Chpart cli, String load, String attemptPrefix, StructType schema, boolean nothingToBuild) {
    this.cli = cli;
    this.load = load;
    this.attemptPrefix = attemptPrefix;
    this.schema = schema;
    this.nothingToBuild = nothingToBuild;
  }

  @Override
  public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
    return new ChpartDataWriter(this, partitionId, taskId);
  }
}
