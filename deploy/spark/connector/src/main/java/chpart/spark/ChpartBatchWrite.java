package chpart.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Locale;
import org.apache.spark.SparkContext;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The driver's side of one write, the same protocol as {@code chpart_spark.write}:
 *
 * <pre>
 *   createBatchWriterFactory   chpart status --load L (a load an earlier run committed, or whose
 *                              commit recorded its plan, needs no build), else chpart begin; the
 *                              status chpart_spark.write has just read, if it handed one over
 *                              ({@link ChpartHandoff})
 *   (Spark job)                every task attempt: chpart build --input - (ChpartDataWriter);
 *                              Spark keeps one commit message per partition, the attempt the
 *                              commit coordinator let commit first
 *   commit(messages)           exactly those manifests, in partition order, into the winners file;
 *                              chpart commit --winners FILE --partitions N (retried on exit 3)
 *   abort(messages)            the job failed before the commit: chpart abort
 * </pre>
 *
 * A failed commit is not aborted (Spark calls abort() after a failed commit(): it is ignored
 * then): the commit may have made rows visible and it is resumable, from the kept winners file or,
 * once its plan is recorded, from the ledger alone.
 *
 * <p>A streaming write runs one of these per micro-batch, with the load {@code <query id>.<batch
 * id>} ({@link ChpartStreamingWrite}): a replayed batch is then decided by the same plan.
 */
final class ChpartBatchWrite implements BatchWrite {
  private static final Logger LOG = LoggerFactory.getLogger(ChpartBatchWrite.class);
  private static final int COMMIT_TRIES = 3;
  private static final long[] COMMIT_BACKOFF_MS = {2000, 5000};

  /** What the write has to do, decided from the ledger before the job. */
  enum Plan {
    /** A new load (or an open one without a plan): build, then commit the winners. */
    BUILD,
    /** The winners file of an earlier run exists: commit it, build nothing. */
    RESUME_FROM_FILE,
    /** An earlier run's commit recorded its plan: finish it from the ledger, build nothing. */
    RESUME_FROM_LEDGER,
    /** An earlier run committed the load: nothing to do. */
    ALREADY_COMMITTED
  }

  private final ChpartOptions options;
  private final StructType schema;
  private final String queryId;
  private final String saveMode;
  private final Chpart cli;
  /** The load id the caller chose (option load, or a streaming epoch's), or null: one per write. */
  private final String givenLoad;

  private String load;
  private Plan plan;
  private int partitions;
  private boolean commitStarted;
  /** chpart_spark.write handed this write the load's status: it takes the commit's summary back. */
  private boolean handedOff;
  private final DriverMetrics metrics;

  /**
   * @param load the load id, or null for a new one per write ({@code <applicationId>.<application
   *     attempt>.<nonce>})
   */
  ChpartBatchWrite(ChpartOptions options, StructType schema, String queryId, String saveMode, String load,
      DriverMetrics metrics) {
    this.options = options;
    this.givenLoad = load;
    this.schema = schema;
    this.queryId = queryId;
    this.saveMode = saveMode;
    this.cli = options.cli();
    this.metrics = metrics;
  }

  @Override
  public boolean useCommitCoordinator() {
    // One attempt per partition may run commit(), i.e. finish its input and publish: the others
    // are killed before their build sees the end of its input (ChpartDataWriter).
    return true;
  }

  @Override
  public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
    partitions = info.numPartitions();
    SparkContext sc = SparkContext.getOrCreate();
    String prefix = attemptPrefix(sc, nonce(queryId));
    load = givenLoad != null ? givenLoad : prefix;
    String context = "load " + load;
    if (options.winnersPath != null && Files.exists(Path.of(options.winnersPath))) {
      List<String> lines = readWinners(Path.of(options.winnersPath), load);
      plan = Plan.RESUME_FROM_FILE;
      partitions = lines.size();
      LOG.info("chpart load {}: resuming the commit from {} ({} winners); the tasks build nothing",
          load, options.winnersPath, lines.size());
    } else {
      JsonNode status = handedOrReadStatus(context);
      String state = status == null ? null : status.path("state").asText();
      if ("committed".equals(state)) {
        plan = Plan.ALREADY_COMMITTED;
        LOG.info("chpart load {} is already committed ({} rows): nothing to do; the tasks build nothing",
            load, status.path("rows").asText());
      } else if ("open".equals(state) && planned(status)) {
        plan = Plan.RESUME_FROM_LEDGER;
        LOG.info("chpart load {}: an earlier commit recorded its plan; resuming it from the ledger"
            + " (the tasks build nothing: new winners would be refused)", load);
      } else {
        cli.runJson("begin",
            List.of("--table", options.table, "--load", load, "--mode", saveMode, "--visibility", options.visibility),
            context);
        plan = Plan.BUILD;
        LOG.info("chpart load {} opened on {} (mode {}, visibility {}); {} task(s), attempt ids {}.<taskAttemptId>",
            load, options.table, saveMode, options.visibility, partitions, prefix);
      }
    }
    return new ChpartWriterFactory(cli, load, prefix, schema, plan != Plan.BUILD);
  }

  @Override
  public void onDataWriterCommit(WriterCommitMessage message) {
    if (plan == Plan.BUILD) {
      LOG.info("chpart load {}: Spark accepted {}", load, message);
    }
  }

  @Override
  public void commit(WriterCommitMessage[] messages) {
    long started = System.nanoTime();
    JsonNode summary;
    switch (plan) {
      case ALREADY_COMMITTED:
        return;
      case RESUME_FROM_LEDGER:
        summary = runCommit(null, 0);
        break;
      case RESUME_FROM_FILE:
        summary = runCommit(Path.of(options.winnersPath), partitions);
        deleteQuietly(Path.of(options.winnersPath));
        break;
      default:
        summary = commitWinners(messages);
    }
    metrics.commitMs = (System.nanoTime() - started) / 1_000_000;
    if (handedOff) {
      ChpartHandoff.noteCommitted(load, summary.toString());
    }
    if (plan != Plan.BUILD) {
      metrics.rows = summary.path("rows").asLong();
      metrics.parts = summary.path("parts").asLong();
    }
    LOG.info("chpart load {} committed into {}: {} rows in {} part(s), {} partition(s), winners {}; commit {} s",
        load, options.table, summary.path("rows").asText(), summary.path("parts").asText(),
        summary.path("partitions").asText(), summary.path("winners"),
        String.format(Locale.ROOT, "%.2f", metrics.commitMs / 1000.0));
  }

  private JsonNode commitWinners(WriterCommitMessage[] messages) {
    if (messages.length != partitions) {
      throw new IllegalStateException("chpart load " + load + ": Spark returned " + messages.length
          + " commit messages for " + partitions + " partitions");
    }
    List<String> lines = new ArrayList<>();
    for (int p = 0; p < messages.length; p++) {
      if (!(messages[p] instanceof ChpartCommitMessage)) {
        throw new IllegalStateException("chpart load " + load + ": no commit message for partition " + p);
      }
      ChpartCommitMessage m = (ChpartCommitMessage) messages[p];
      if (m.partition != p || m.manifest == null) {
        throw new IllegalStateException("chpart load " + load + ": the message for partition " + p + " is " + m);
      }
      lines.add(m.manifest);
      metrics.add(m);
    }
    Path winners;
    boolean own = options.winnersPath == null;
    try {
      winners = own
          ? Files.createTempFile("chpart-winners-" + load + "-", ".jsonl")
          : Path.of(options.winnersPath);
      writeWinners(winners, lines);
    } catch (IOException e) {
      throw new UncheckedIOException("chpart load " + load + ": cannot write the winners file", e);
    }
    LOG.info("chpart load {}: {} winning manifest(s) -> {}", load, lines.size(), winners);
    JsonNode summary = runCommit(winners, lines.size());
    deleteQuietly(winners);
    return summary;
  }

  /** chpart commit, retried on exit 3 (it is resumable); without winners it resumes the plan. */
  private JsonNode runCommit(Path winners, int count) {
    commitStarted = true;
    List<String> args = new ArrayList<>(List.of("--load", load, "--verify", options.verify, "--visibility",
        options.visibility));
    if (winners != null) {
      args.addAll(List.of("--winners", winners.toString(), "--partitions", String.valueOf(count)));
    }
    // The config as the driver resolved it (chpart config): no secret in it, nothing to quote.
    String hint = cli.binary() + " commit " + String.join(" ", args) + "   with CHPART_CONFIG_TOML set to:\n"
        + cli.configToml();
    for (int attempt = 0; ; attempt++) {
      try {
        return cli.runJson("commit", args, "load " + load);
      } catch (ChpartException e) {
        if (e.retryable() && attempt + 1 < COMMIT_TRIES) {
          LOG.warn("chpart load {}: commit failed with a retryable error, retrying: {}", load, e.getMessage());
          sleep(COMMIT_BACKOFF_MS[Math.min(attempt, COMMIT_BACKOFF_MS.length - 1)]);
          continue;
        }
        throw new ChpartException.CommitException(e, "load " + load,
            winners == null ? null : winners.toString(), hint);
      }
    }
  }

  @Override
  public void abort(WriterCommitMessage[] messages) {
    if (commitStarted) {
      LOG.error("chpart load {}: the commit failed; the load is left open for the commit to be resumed"
          + " (not aborted: it may have made rows visible)", load);
      return;
    }
    if (plan != Plan.BUILD) {
      return; // nothing of this run to undo; the earlier run's load stays as it is
    }
    LOG.error("chpart load {}: the job failed; aborting the load", load);
    try {
      cli.runJson("abort", List.of("--load", load), "load " + load);
    } catch (RuntimeException e) {
      // Spark re-raises the job's failure; this one is only logged with it.
      LOG.error("chpart load {}: aborting the load after the failure also failed", load, e);
    }
  }

  /**
   * The load's status as chpart_spark.write handed it over ({@link ChpartHandoff}), else read
   * from the ledger: its entry of {@code chpart status --json}, or null if it was never begun.
   */
  private JsonNode handedOrReadStatus(String context) {
    var handed = ChpartHandoff.takeStatus(load);
    if (handed.isEmpty()) {
      return status(context);
    }
    handedOff = true;
    if (handed.get().isEmpty()) {
      return null;
    }
    try {
      return Chpart.JSON.readTree(handed.get());
    } catch (IOException e) {
      throw new IllegalArgumentException(context + ": the status chpart_spark handed over is not JSON", e);
    }
  }

  /** The load's entry of `chpart status --json`, or null if it was never begun. */
  private JsonNode status(String context) {
    JsonNode loads = cli.runJson("status", List.of("--load", load), context);
    for (JsonNode entry : loads) {
      if (load.equals(entry.path("load").asText())) {
        return entry;
      }
    }
    return null;
  }

  /**
   * Whether an open load's commit recorded its plan (see chpart_spark's {@code _planned}): for one
   * table {@code parts_planned}; for a Distributed table the winners of the cluster plan, listed
   * before every shard has prepared.
   */
  private static boolean planned(JsonNode status) {
    return !status.path("parts_planned").isNull() && !status.path("parts_planned").isMissingNode()
        || status.path("winners").size() > 0
        || "commit".equals(status.path("decision").asText());
  }

  /**
   * {@code <applicationId>.<application attempt>.<nonce>}: what every attempt id of one write
   * starts with (see chpart_spark's {@code attempt_prefix}). taskAttemptId restarts at 0 in a new
   * YARN application attempt, so the application attempt is part of it, or where Spark has none,
   * the driver's start time ({@code s<ms>}); the nonce is this write's.
   */
  static String attemptPrefix(SparkContext sc, String nonce) {
    scala.Option<String> option = sc.applicationAttemptId();
    String appAttempt = option.isDefined()
        ? option.get().replaceAll("[^A-Za-z0-9_-]", "-")
        : "s" + sc.startTime();
    String prefix = sc.applicationId() + "." + appAttempt + "." + nonce;
    if (!ChpartOptions.ID.matcher(prefix + "." + Long.MAX_VALUE).matches()) {
      throw new IllegalArgumentException("attempt ids " + prefix + ".<taskAttemptId> are not valid chpart attempt"
          + " ids (at most 128 of [A-Za-z0-9._-], not starting with . or -, without ..): application id "
          + sc.applicationId());
    }
    return prefix;
  }

  /**
   * 12 hex digits of the write's query id (a random UUID Spark draws for every batch write; a
   * streaming query's own id, the same for all its micro-batches, whose taskAttemptIds differ), so
   * chpart's attempt ids name the Spark query; random ones if the id is not a UUID.
   */
  static String nonce(String queryId) {
    String hex = queryId == null ? "" : queryId.replace("-", "").toLowerCase(Locale.ROOT);
    if (hex.matches("[0-9a-f]{12,}")) {
      return hex.substring(0, 12);
    }
    byte[] bytes = new byte[6];
    new SecureRandom().nextBytes(bytes);
    return HexFormat.of().formatHex(bytes);
  }

  /** Atomically (temp file, fsync, rename): a winners file holds every winner or does not exist. */
  static void writeWinners(Path path, List<String> lines) throws IOException {
    Path dir = path.toAbsolutePath().getParent();
    Files.createDirectories(dir);
    Path tmp = Files.createTempFile(dir, ".chpart-winners-", ".tmp");
    try {
      StringBuilder text = new StringBuilder();
      for (String line : lines) {
        text.append(line.strip()).append('\n');
      }
      Files.writeString(tmp, text, StandardCharsets.UTF_8);
      try (FileChannel ch = FileChannel.open(tmp, StandardOpenOption.WRITE)) {
        ch.force(true);
      }
      Files.move(tmp, path, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    } finally {
      Files.deleteIfExists(tmp);
    }
  }

  /** A winners file of an earlier run: its lines, which must all be this load's manifests. */
  static List<String> readWinners(Path path, String load) {
    List<String> lines = new ArrayList<>();
    try {
      for (String line : Files.readAllLines(path, StandardCharsets.UTF_8)) {
        if (line.isBlank()) {
          continue;
        }
        JsonNode m = Chpart.JSON.readTree(line);
        if (!load.equals(m.path("load").asText(null))) {
          throw new IllegalArgumentException(path + " holds manifests of load " + m.path("load")
              + ", not " + load + ": refusing to reuse it (give another winners_path)");
        }
        lines.add(line);
      }
    } catch (IOException e) {
      throw new IllegalArgumentException(path + " is not a winners file (JSON lines of manifests): " + e, e);
    }
    return lines;
  }

  private static void deleteQuietly(Path path) {
    try {
      Files.deleteIfExists(path);
    } catch (IOException e) {
      LOG.warn("cannot remove {}: {}", path, e.toString());
    }
  }

  private static void sleep(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted", e);
    }
  }

  /** What the driver reports as DSv2 driver metrics once the commit ran (ChpartMetrics). */
  static final class DriverMetrics {
    long rows;
    long parts;
    long bytes;
    long buildMs;
    long uploadMs;
    long publishMs;
    long commitMs = -1;

    void add(ChpartCommitMessage m) {
      rows += m.rows;
      parts += m.parts;
      bytes += m.bytesOnDisk;
      buildMs += Math.max(m.buildMs, 0);
      uploadMs += Math.max(m.uploadMs, 0);
      publishMs += Math.max(m.publishMs, 0);
    }
  }
}
