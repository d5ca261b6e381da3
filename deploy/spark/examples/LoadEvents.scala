// The Scala twin of LoadEvents.java (which the tests compile and run; nothing compiles Scala
// here): load Parquet events into ClickHouse exactly once through the chpart connector.
//   spark-submit --jars chpart-spark.jar ... (with this object in your job's jar)
import org.apache.spark.sql.{SaveMode, SparkSession}

object LoadEvents {
  def main(args: Array[String]): Unit = {
    val Array(input, table, config, load) = args // e.g. hdfs:///events/2026-11-30T09 web.events /etc/chpart/chpart.toml events-2026-11-30T09
    val spark = SparkSession.builder().appName(s"load-$load").getOrCreate()
    spark.read.parquet(input).repartition(16)
      .write.format("chpart")
      .mode(SaveMode.Append) // Spark's default mode (ErrorIfExists) is refused
      .option("table", table)
      .option("config", config) // the same path on the driver and every executor
      .option("load", load) // re-running the job with the same load id is a no-op once committed
      .save()
    spark.stop()
  }
}
