package chpart.spark;

import java.util.Arrays;
import java.util.Locale;
import org.apache.spark.sql.connector.metric.CustomMetric;
import org.apache.spark.sql.connector.metric.CustomTaskMetric;

/**
 * The write's DSv2 custom metrics, shown on the write node in the Spark UI's SQL tab and recorded
 * in the event log.
 *
 * <p>Spark 4.3 reads a DataWriter's {@code currentMetricsValues()} while rows are written and
 * once after the last row, but never after {@code commit()} (WritingSparkTask asks the commit
 * coordinator and commits after its last metrics update). Everything {@code chpart build} does
 * happens in {@code commit()}, after the coordinator's permission: only the rows and Arrow bytes
 * streamed can be task metrics. The build's results (parts, bytes on disk, rows, build, upload and
 * publish time) travel in the commit message instead and are reported by the driver for the
 * winning attempts, after {@code chpart commit} ({@code Write.reportDriverMetrics}); the driver's
 * log has them per partition.
 *
 * <p>Spark's UI instantiates each metric class by name to aggregate values, so every metric is a
 * class with a public no-argument constructor.
 */
public final class ChpartMetrics {
  private ChpartMetrics() {}

  static final String ROWS_STREAMED = "chpartRowsStreamed";
  static final String ARROW_BYTES = "chpartArrowBytesStreamed";
  static final String ROWS = "chpartRows";
  static final String PARTS = "chpartParts";
  static final String BYTES = "chpartBytesOnDisk";
  static final String BUILD_MS = "chpartBuildMs";
  static final String UPLOAD_MS = "chpartUploadMs";
  static final String PUBLISH_MS = "chpartPublishMs";
  static final String COMMIT_MS = "chpartCommitMs";

  static CustomMetric[] all() {
    return new CustomMetric[] {
      new RowsStreamed(), new ArrowBytesStreamed(), new Rows(), new Parts(), new BytesOnDisk(),
      new BuildTime(), new UploadTime(), new PublishTime(), new CommitTime()
    };
  }

  static CustomTaskMetric value(String name, long value) {
    return new CustomTaskMetric() {
      @Override
      public String name() {
        return name;
      }

      @Override
      public long value() {
        return value;
      }
    };
  }

  /** A count, summed over tasks (or the driver's one value). */
  abstract static class Sum implements CustomMetric {
    private final String name;
    private final String description;

    Sum(String name, String description) {
      this.name = name;
      this.description = description;
    }

    @Override
    public String name() {
      return name;
    }

    @Override
    public String description() {
      return description;
    }

    @Override
    public String aggregateTaskMetrics(long[] values) {
      return String.valueOf(Arrays.stream(values).sum());
    }
  }

  /** Milliseconds, summed and shown in seconds. */
  abstract static class Seconds extends Sum {
    Seconds(String name, String description) {
      super(name, description);
    }

    @Override
    public String aggregateTaskMetrics(long[] values) {
      return String.format(Locale.ROOT, "%.2f s", Arrays.stream(values).sum() / 1000.0);
    }
  }

  public static final class RowsStreamed extends Sum {
    public RowsStreamed() {
      super(ROWS_STREAMED, "rows streamed to chpart build (every task attempt)");
    }
  }

  public static final class ArrowBytesStreamed extends Sum {
    public ArrowBytesStreamed() {
      super(ARROW_BYTES, "Arrow bytes streamed to chpart build (every task attempt)");
    }
  }

  public static final class Rows extends Sum {
    public Rows() {
      super(ROWS, "rows loaded (winning attempts' parts)");
    }
  }

  public static final class Parts extends Sum {
    public Parts() {
      super(PARTS, "parts loaded (winning attempts)");
    }
  }

  public static final class BytesOnDisk extends Sum {
    public BytesOnDisk() {
      super(BYTES, "bytes on disk loaded (winning attempts' parts)");
    }
  }

  public static final class BuildTime extends Seconds {
    public BuildTime() {
      super(BUILD_MS, "chpart build time, winning attempts (total)");
    }
  }

  public static final class UploadTime extends Seconds {
    public UploadTime() {
      super(UPLOAD_MS, "chpart upload time, winning attempts (total)");
    }
  }

  public static final class PublishTime extends Seconds {
    public PublishTime() {
      super(PUBLISH_MS, "chpart publish time, winning attempts (total)");
    }
  }

  public static final class CommitTime extends Seconds {
    public CommitTime() {
      super(COMMIT_MS, "chpart commit time");
    }
  }
}
