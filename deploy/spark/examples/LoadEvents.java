// Loading Parquet events into ClickHouse exactly once from a Java Spark job, through the chpart
// connector (`format("chpart")`, deploy/spark/connector). Compiled and run by
// tests/spark/test_spark_connector.py::test_java_job_with_a_task_retry_after_publish_loads_exactly_once.
//
//   javac --release 17 -cp "$SPARK_HOME/jars/*" -d classes LoadEvents.java && jar cf load-events.jar -C classes .
//   spark-submit --jars chpart-spark.jar --class LoadEvents load-events.jar \
//       --input hdfs:///events/2026-11-30T09 --table web.events --load events-2026-11-30T09 \
//       [--config /etc/chpart/chpart.toml] [--partitions 16] [--chpart /usr/local/bin/chpart] [--option key=value]...
//
// `--load` makes the job idempotent: re-running it after a success does nothing, after a failed
// commit it finishes that commit. Without --config the config comes from `spark.chpart.*` conf
// (`--conf spark.chpart.clickhouse.url=...`) and `--option` keys; without --chpart the jar runs
// the chpart it carries. Tested on a standalone cluster with only the jar and conf:
// tests/spark/test_embedded_chpart.py::test_spark_submit_java_job_on_a_standalone_cluster_with_the_jar_and_conf_only.
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.spark.sql.DataFrameWriter;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.SparkSession;

public final class LoadEvents {
  public static void main(String[] args) {
    Map<String, String> opt = new LinkedHashMap<>();
    Map<String, String> options = new LinkedHashMap<>(); // --option key=value: any connector option
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (args[i].equals("--option")) {
        String[] kv = args[i + 1].split("=", 2);
        options.put(kv[0], kv[1]);
      } else {
        opt.put(args[i].replaceFirst("^--", ""), args[i + 1]);
      }
    }
    SparkSession spark = SparkSession.builder().appName("load-" + opt.get("load")).getOrCreate();
    // Spread the input evenly over the tasks (each builds and publishes its own parts).
    Dataset<Row> events = spark.read().parquet(opt.get("input"))
        .repartition(Integer.parseInt(opt.getOrDefault("partitions", "4")));

    DataFrameWriter<Row> writer = events.write()
        .format("chpart")
        .mode(SaveMode.Append) // Overwrite replaces the partitions written (option overwrite=table: the table)
        .option("table", opt.get("table"))
        .option("load", opt.get("load"))
        .options(options);
    if (opt.containsKey("config")) {
      writer = writer.option("config", opt.get("config"));
    }
    if (opt.containsKey("chpart")) {
      writer = writer.option("chpart", opt.get("chpart"));
    }
    writer.save(); // chpart begin, a build per task, chpart commit of the accepted attempts
    System.out.println("LoadEvents: load " + opt.get("load") + " committed into " + opt.get("table"));
    spark.stop();
  }
}
