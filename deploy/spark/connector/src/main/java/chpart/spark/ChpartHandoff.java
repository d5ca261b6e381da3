package chpart.spark;

import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;

/**
 * What {@code chpart_spark.write} (Python, calling into the same driver JVM) and the connector's
 * driver hand each other around one {@code df.write.format("chpart")}, so that neither asks the
 * ledger for what the other has just read (each {@code chpart status} is a ledger read the
 * ClickHouse server pays for):
 *
 * <ul>
 *   <li>before the write, the load's {@code chpart status} entry that chpart_spark.write read to
 *       decide whether a Spark job is needed at all: the connector plans from it (the same
 *       decision as from its own status) instead of reading the ledger again;
 *   <li>after the write, the summary of the connector's {@code chpart commit}: chpart_spark.write
 *       returns it instead of reading the load's status back.
 * </ul>
 *
 * <p>Both are keyed by load id and taken at most once; a plain {@code df.write.format("chpart")}
 * finds nothing here and reads the ledger itself. Nothing here decides correctness: a status that
 * is stale by the time of {@code chpart begin} is the race every status-then-begin has (begin
 * refuses a finished load; a commit keeps to a plan already recorded), and chpart_spark.write
 * {@link #forget}s the load once its write returns or fails.
 */
public final class ChpartHandoff {
  private ChpartHandoff() {}

  /** Marks "chpart_spark.write read the status: the load was never begun". */
  private static final String NEVER_BEGUN = "null";

  private static final ConcurrentHashMap<String, String> STATUS = new ConcurrentHashMap<>();
  private static final ConcurrentHashMap<String, String> COMMITTED = new ConcurrentHashMap<>();

  /**
   * chpart_spark.write read {@code load}'s status just now: its entry of {@code chpart status
   * --json} as JSON, or {@code null} if the load was never begun.
   */
  public static void noteStatus(String load, String statusJson) {
    STATUS.put(load, statusJson == null ? NEVER_BEGUN : statusJson);
  }

  /**
   * The status chpart_spark.write handed over for {@code load}, taken: empty if none was
   * handed over; an empty string inside if the load was never begun.
   */
  static Optional<String> takeStatus(String load) {
    String json = STATUS.remove(load);
    if (json == null) {
      return Optional.empty();
    }
    return Optional.of(NEVER_BEGUN.equals(json) ? "" : json);
  }

  /** The connector committed {@code load} for a write chpart_spark.write handed a status to. */
  static void noteCommitted(String load, String summaryJson) {
    COMMITTED.put(load, summaryJson);
  }

  /** The JSON summary of {@code chpart commit} of {@code load} by this JVM's connector, taken; null if none. */
  public static String takeCommitted(String load) {
    return COMMITTED.remove(load);
  }

  /** Drops whatever is held for {@code load} (chpart_spark.write, once its write returned or failed). */
  public static void forget(String load) {
    STATUS.remove(load);
    COMMITTED.remove(load);
  }
}
