// Loading a DataFrame into ClickHouse exactly once from a Scala (or Java) Spark job, through
// the chpart CLI: the same protocol as chpart_spark.write (deploy/spark/README.md).
//
//   driver:   chpart begin -> one Spark job (each task streams its partition as Arrow into
//             `chpart build --input -` and returns the manifest) -> collect() -> chpart commit
//
// Not compiled in CI. Written against Spark 4.3 (Scala 2.13); checked by loading it into
// spark-shell (`spark-shell --master 'local[2,4]' -i LoadEvents.scala`) and calling
// LoadEvents.write on a real table. It uses Spark's ArrowWriter
// (org.apache.spark.sql.execution.arrow, public but internal API) to turn InternalRows into
// Arrow batches with Spark's own type mapping; timestamps go out as Timestamp(us, "UTC").
// Build it into your job's jar; the chpart binary and config must exist on every executor.
import java.io.{ByteArrayOutputStream, File, InputStream, PrintWriter}
import java.nio.channels.Channels
import java.nio.charset.StandardCharsets.UTF_8

import scala.util.control.NonFatal

import org.apache.arrow.vector.ipc.ArrowStreamWriter
import org.apache.spark.TaskContext
import org.apache.spark.sql.{DataFrame, SparkSession}
import org.apache.spark.sql.execution.arrow.ArrowWriter

object LoadEvents extends Serializable { // the tasks call its helpers
  /** Collects a child's output on a thread (so it never blocks on a full pipe). */
  private class Drain(in: InputStream) extends Thread {
    private val buf = new ByteArrayOutputStream()
    setDaemon(true); start()
    override def run(): Unit = in.transferTo(buf)
    def text(): String = { join(10000); buf.toString(UTF_8) }
  }

  private def tail(text: String, lines: Int = 30) = text.linesIterator.toSeq.takeRight(lines).mkString("\n")

  /** Runs chpart on the driver; its stdout, or an exception with exit code and stderr. */
  def chpart(bin: String, args: String*): String = {
    val pb = new ProcessBuilder((bin +: args): _*)
    pb.environment().put("NO_COLOR", "1")
    val proc = pb.start()
    proc.getOutputStream.close()
    val (out, err) = (new Drain(proc.getInputStream), new Drain(proc.getErrorStream))
    val code = proc.waitFor()
    if (code != 0) throw new RuntimeException(s"chpart ${args.head} exited with code $code:\n${tail(err.text())}")
    out.text()
  }

  /** Loads `df` into `table` as load `load`; returns `chpart commit --json`'s summary line. */
  def write(df: DataFrame, table: String, load: String, config: String, chpart: String = "chpart",
            mode: String = "append"): String = {
    val sc = df.sparkSession.sparkContext
    // taskAttemptId is unique within one application attempt only (YARN restarts it at 0 in a
    // new application attempt): prefix it with the application attempt (or the driver's start
    // time) and a nonce of this write.
    val nonce = java.util.UUID.randomUUID().toString.replace("-", "").take(12)
    val prefix = s"${sc.applicationId}.${sc.applicationAttemptId.getOrElse(s"s${sc.startTime}")}.$nonce"
    val schema = df.schema
    LoadEvents.chpart(chpart, "begin", "--config", config, "--table", table, "--load", load, "--mode", mode)

    val results = df.queryExecution.toRdd.mapPartitions { rows =>
      val ctx = TaskContext.get()
      val attempt = s"$prefix.${ctx.taskAttemptId()}"
      val pb = new ProcessBuilder(chpart, "build", "--config", config, "--load", load,
        "--partition", ctx.partitionId().toString, "--attempt", attempt,
        "--stage", ctx.stageId().toString, "--stage-attempt", ctx.stageAttemptNumber().toString,
        "--attempt-number", ctx.attemptNumber().toString, "--input", "-", "--die-with-parent")
      pb.environment().put("NO_COLOR", "1")
      val proc = pb.start()
      val (out, err) = (new Drain(proc.getInputStream), new Drain(proc.getErrorStream))
      val arrow = ArrowWriter.create(schema, "UTC", true, false)
      val stream = new ArrowStreamWriter(arrow.root, null, Channels.newChannel(proc.getOutputStream))
      try {
        stream.start()
        var n = 0
        def flush(): Unit = { arrow.finish(); stream.writeBatch(); arrow.reset(); n = 0 }
        rows.foreach { row => arrow.write(row); n += 1; if (n == 8192) flush() }
        if (n > 0) flush()
        stream.end() // end-of-stream marker: the input is complete
        proc.getOutputStream.close()
      } catch {
        case _: java.io.IOException => // chpart stopped reading: its exit code and stderr say why
        case NonFatal(e) => proc.destroyForcibly(); proc.waitFor(); throw e // never publish a partial input
      } finally arrow.root.close()
      val code = proc.waitFor()
      if (code != 0) // 3 retryable, 4 permanent, 5 fenced (the load is closed)
        throw new RuntimeException(s"chpart build (partition ${ctx.partitionId()}, attempt $attempt) exited with " +
          s"code $code:\n${tail(err.text())}")
      val manifest = out.text().linesIterator.filter(_.trim.nonEmpty).toSeq.last
      Iterator((ctx.partitionId(), manifest))
    }

    val partitions = results.getNumPartitions
    val winners = try results.collect() // exactly one per partition: the attempt Spark accepted first
    catch { case e: Throwable =>
      try LoadEvents.chpart(chpart, "abort", "--config", config, "--load", load)
      catch { case NonFatal(abortFailure) => e.addSuppressed(abortFailure) }
      throw e
    }
    // Keep this file until the commit succeeds: re-running `chpart commit` with it finishes the load.
    val file = File.createTempFile(s"chpart-winners-$load-", ".jsonl")
    val w = new PrintWriter(file, UTF_8)
    try winners.sortBy(_._1).foreach { case (_, m) => w.println(m) } finally w.close()
    val summary = LoadEvents.chpart(chpart, "commit", "--config", config, "--load", load,
      "--winners", file.getPath, "--partitions", partitions.toString, "--json")
    file.delete()
    summary.trim
  }

  def main(args: Array[String]): Unit = {
    val Array(config, table, load, chpartBin) = args // e.g. /etc/chpart/chpart.toml web.events events-2026-11-30T09 chpart
    val spark = SparkSession.builder().appName(s"load-$load").getOrCreate()
    val df = spark.range(0, 1000000, 1, 8)
      .selectExpr("timestamp_millis(1796029200000 + id * 3600000 DIV 1000000) AS event_time",
        "id % 250000 AS user_id", "element_at(array('page_view', 'click', 'purchase'), int(id % 3) + 1) AS event")
    println(write(df, table, load, config, chpartBin))
    spark.stop()
  }
}
