package chpart.testing;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Map;
import org.apache.spark.TaskContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;

/**
 * TEST INSTRUMENTATION (tests/spark/test_embedded_chpart.py): a Spark plugin whose executor side
 * halts its executor JVM right after the first attempt of one partition of a write succeeded,
 * i.e. after the connector's build of that attempt published its parts, and before the executor
 * reports the task's result (Spark's Executor calls onTaskSucceeded, then sends the result). The
 * driver never gets that attempt's commit message: Spark loses the executor and runs the partition
 * again elsewhere. Nothing else in the job can fail an attempt after its build published without
 * wrapping the chpart binary, which the test must not do (the connector runs the jar's own).
 *
 * <p>Armed only for tasks whose job carries the local property {@code chpart.test.kill_partition}
 * (the partition), or, for a job that cannot set one (a spark-submit of the Java example), for
 * every task of that partition when conf {@code spark.chparttest.kill_partition} names it (the
 * job must have that partition in its write stage only); once per marker file (created with
 * O_EXCL), to which the victim's task attempt id, stage and pid are written first. Conf:
 * {@code spark.chparttest.kill_marker} (outside {@code spark.chpart.*}, whose keys the connector
 * reads as chpart config keys).
 */
public final class KillAfterPublish implements SparkPlugin {
  static final String PARTITION_PROPERTY = "chpart.test.kill_partition";
  static final String MARKER_CONF = "spark.chparttest.kill_marker";
  static final String PARTITION_CONF = "spark.chparttest.kill_partition";

  @Override
  public DriverPlugin driverPlugin() {
    return null;
  }

  @Override
  public ExecutorPlugin executorPlugin() {
    return new ExecutorPlugin() {
      private final ThreadLocal<TaskContext> task = new ThreadLocal<>();
      private String marker;
      private String partition;

      @Override
      public void init(PluginContext ctx, Map<String, String> extraConf) {
        marker = ctx.conf().get(MARKER_CONF);
        partition = ctx.conf().get(PARTITION_CONF, null);
      }

      @Override
      public void onTaskStart() {
        task.set(TaskContext.get()); // called on the task's thread, with its context set
      }

      @Override
      public void onTaskSucceeded() {
        TaskContext t = task.get();
        task.remove();
        if (t == null) {
          return;
        }
        String wanted = t.getLocalProperty(PARTITION_PROPERTY);
        if (wanted == null) {
          wanted = partition;
        }
        if (wanted == null || Integer.parseInt(wanted) != t.partitionId() || t.attemptNumber() != 0
            || t.stageAttemptNumber() != 0) {
          return;
        }
        String json = "{\"task_attempt_id\": " + t.taskAttemptId() + ", \"stage\": " + t.stageId()
            + ", \"partition\": " + t.partitionId() + ", \"pid\": " + ProcessHandle.current().pid() + "}";
        try {
          Files.writeString(Path.of(marker), json, StandardCharsets.UTF_8, StandardOpenOption.CREATE_NEW,
              StandardOpenOption.WRITE, StandardOpenOption.SYNC);
        } catch (FileAlreadyExistsException once) {
          return;
        } catch (IOException e) {
          throw new IllegalStateException("KillAfterPublish: cannot write " + marker, e);
        }
        System.err.println("KillAfterPublish: halting this executor after " + json);
        Runtime.getRuntime().halt(137);
      }
    };
  }
}
