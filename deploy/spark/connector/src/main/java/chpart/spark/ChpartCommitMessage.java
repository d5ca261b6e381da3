package chpart.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.sql.connector.write.WriterCommitMessage;

/**
 * What one task attempt hands to the driver: the manifest line {@code chpart build} printed last
 * (for a Distributed table the cluster manifest, passed on unchanged), which {@code chpart commit}
 * takes as this partition's winner if Spark accepts this attempt, and what the build reported
 * (for metrics and the driver's log).
 */
public final class ChpartCommitMessage implements WriterCommitMessage {
  private static final long serialVersionUID = 1L;

  /**
   * The build's summary log line on stderr, e.g. {@code ...: published 3 part(s), 1000 rows, 0.1
   * MB (build 0.52s, digest 0.01s, upload 0.02s, publish 0.03s)}.
   */
  static final Pattern TIMINGS =
      Pattern.compile(
          "published \\d+ part\\(s\\), \\d+ rows, .*\\(build ([0-9.]+)s, digest ([0-9.]+)s,"
              + " upload ([0-9.]+)s, publish ([0-9.]+)s\\)");

  final int partition;
  /** Null when no build ran (the load was committed or planned by an earlier run). */
  final String attempt;
  final String manifest;
  final long rows;
  final long parts;
  final long bytesOnDisk;
  /** -1 when the build's log line was not seen. */
  final long buildMs;
  final long uploadMs;
  final long publishMs;

  private ChpartCommitMessage(
      int partition, String attempt, String manifest, long rows, long parts, long bytesOnDisk,
      long buildMs, long uploadMs, long publishMs) {
    this.partition = partition;
    this.attempt = attempt;
    this.manifest = manifest;
    this.rows = rows;
    this.parts = parts;
    this.bytesOnDisk = bytesOnDisk;
    this.buildMs = buildMs;
    this.uploadMs = uploadMs;
    this.publishMs = publishMs;
  }

  /** A task that built nothing: the load needs no new winners. */
  static ChpartCommitMessage nothingBuilt(int partition) {
    return new ChpartCommitMessage(partition, null, null, 0, 0, 0, -1, -1, -1);
  }

  /**
   * The message of a finished build: its manifest line must be this load's and this attempt's
   * (an attempt manifest, or a cluster manifest of every shard's); {@code timingsLine} is the
   * build's summary log line or null.
   *
   * @throws IllegalStateException naming what is wrong with the line
   */
  static ChpartCommitMessage ofBuild(
      int partition, String load, String attempt, String manifestLine, String timingsLine) {
    JsonNode m;
    try {
      m = Chpart.JSON.readTree(manifestLine);
    } catch (IOException e) {
      throw new IllegalStateException("no manifest on chpart build's stdout (got " + manifestLine + ")");
    }
    if (m == null || !load.equals(m.path("load").asText(null))
        || !attempt.equals(m.path("attempt").path("id").asText(null))) {
      throw new IllegalStateException(
          "the manifest is not this attempt's (load " + load + ", attempt " + attempt + "): "
              + Chpart.tailOf(manifestLine, 500));
    }
    List<JsonNode> manifests = new ArrayList<>();
    if ("chpart-cluster-manifest".equals(m.path("format").asText())) {
      m.path("shards").forEach(shard -> manifests.add(shard.path("manifest")));
    } else {
      manifests.add(m);
    }
    long rows = 0;
    long parts = 0;
    long bytes = 0;
    for (JsonNode one : manifests) {
      for (JsonNode part : one.path("parts")) {
        rows += part.path("rows").asLong();
        bytes += part.path("bytes_on_disk").asLong();
        parts++;
      }
    }
    long[] ms = {-1, -1, -1};
    if (timingsLine != null) {
      Matcher t = TIMINGS.matcher(timingsLine);
      if (t.find()) {
        ms[0] = millis(t.group(1));
        ms[1] = millis(t.group(3));
        ms[2] = millis(t.group(4));
      }
    }
    return new ChpartCommitMessage(partition, attempt, manifestLine, rows, parts, bytes, ms[0], ms[1], ms[2]);
  }

  private static long millis(String seconds) {
    return Math.round(Double.parseDouble(seconds) * 1000);
  }

  /** The Spark partition this attempt computed. */
  public int partition() {
    return partition;
  }

  /** The attempt id, or null if no build ran. */
  public String attempt() {
    return attempt;
  }

  /** The manifest line, or null if no build ran. */
  public String manifest() {
    return manifest;
  }

  @Override
  public String toString() {
    if (attempt == null) {
      return "partition " + partition + ": nothing built";
    }
    return String.format(
        java.util.Locale.ROOT,
        "partition %d: attempt %s, %d rows in %d part(s), %d bytes (build %s, upload %s, publish %s)",
        partition, attempt, rows, parts, bytesOnDisk, secs(buildMs), secs(uploadMs), secs(publishMs));
  }

  private static String secs(long ms) {
    return ms < 0 ? "?" : String.format(java.util.Locale.ROOT, "%.2fs", ms / 1000.0);
  }
}
