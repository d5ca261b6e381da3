"""The driver of test_spark_streaming.py: a Structured Streaming query over a directory of
Parquet files (one file per micro-batch) whose sink is `chpart_spark.foreach_batch`, or with
--dsv2 the connector's own streaming sink `writeStream.format("chpart")`, run with
`trigger(availableNow=True)` from its checkpoint. Every batch a foreach_batch sink finished is
appended to `<work>/batches.jsonl` (batch id, load id, the write's summary).

Faults (each once per test, claimed by an O_EXCL marker in <work>, so a restart runs clean):
  --kill-after-commit B  SIGKILL this driver's process group right after batch B's load was
                         committed, before Spark records the batch: the restart replays it
  --kill-in-build B      SIGKILL it from inside batch B's task, after its chpart build
                         published its parts and before the load is committed
  --jar JAR              the sink writes through the JVM connector (foreach_batch(connector=True);
                         no --kill-in-build then)
  --dsv2                 with --jar: writeStream.format("chpart"). chpart runs through the
                         recording probe (failure_jobs/probe.py, calls in <work>/calls), which
                         also places both kills (TESTPROBE_KILL_AFTER): after `chpart commit`
                         of batch B's load exited 0, after a `chpart build` of it exited 0
  --refusals             with --jar, instead: what writeStream.format("chpart") refuses (output
                         modes complete and update, continuous processing with and without the
                         layout), each error's text into <work>/refusals.json, then the stream
                         through toTable("chpart.<table>") of a registered ChpartCatalog
"""

import argparse
import json
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from conftest import spark_builder  # noqa: E402
from failure_jobs import probe  # noqa: E402

import chpart_spark  # noqa: E402

SCHEMA = "id BIGINT, ts TIMESTAMP, user STRING, kind STRING, amount DOUBLE, flag BOOLEAN"


def claim(path):
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def main():
    p = argparse.ArgumentParser()
    for name in ("--input", "--work", "--config", "--chpart", "--table"):
        p.add_argument(name, required=True)
    p.add_argument("--kill-after-commit", type=int)
    p.add_argument("--kill-in-build", type=int)
    p.add_argument("--jar", help="write through the JVM connector (foreach_batch(connector=True))")
    p.add_argument("--dsv2", action="store_true", help="with --jar: the connector's streaming sink")
    p.add_argument("--refusals", action="store_true", help="with --jar: the sink's refusals, then toTable")
    args = p.parse_args()
    if (args.dsv2 or args.refusals) and not args.jar:
        raise SystemExit("--dsv2 and --refusals need --jar")
    # The process group to kill, also from inside a task (Python workers inherit the variable).
    os.environ["STREAM_TEST_PGID"] = str(os.getpgrp())
    events_dir = os.path.join(args.work, "spark-events")
    os.makedirs(events_dir, exist_ok=True)
    builder = spark_builder("local[2,4]", events_dir, "chpart-streaming").config(
        "spark.local.dir", os.path.join(args.work, "spark-local"))
    if args.jar:
        builder = builder.config("spark.jars", args.jar)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    log_path = os.path.join(args.work, "batches.jsonl")
    build_marker = os.path.join(args.work, "killed-in-build")

    def after_build(ctx, manifest):
        if args.kill_in_build is not None and manifest["load"].endswith(f".{args.kill_in_build}") \
                and claim(build_marker):
            os.killpg(int(os.environ["STREAM_TEST_PGID"]), signal.SIGKILL)

    def on_batch(batch_id, load, summary):
        with open(log_path, "a") as f:
            f.write(json.dumps({"batch": batch_id, "load": load, "summary": summary}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if batch_id == args.kill_after_commit and claim(os.path.join(args.work, "killed-after-commit")):
            os.killpg(os.getpgrp(), signal.SIGKILL)

    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(args.input)
    if args.refusals:
        refusals(spark, stream, args)
        spark.stop()
        return
    if args.dsv2:
        writer = dsv2_writer(stream, args)
    elif args.jar:
        if args.kill_in_build is not None:
            raise SystemExit("--kill-in-build needs chpart_spark.write's _after_build hook or --dsv2")
        writer = stream.writeStream.foreachBatch(
            chpart_spark.foreach_batch(args.table, args.config, chpart=args.chpart, on_batch=on_batch, connector=True))
    else:
        writer = stream.writeStream.foreachBatch(
            chpart_spark.foreach_batch(args.table, args.config, chpart=args.chpart, on_batch=on_batch,
                                       _after_build=after_build))
    query = (writer.option("checkpointLocation", os.path.join(args.work, "checkpoint")).trigger(availableNow=True)
             .start())
    with open(os.path.join(args.work, "query-ids.jsonl"), "a") as f:
        f.write(json.dumps({"id": str(query.id), "run_id": str(query.runId)}) + "\n")
    query.awaitTermination()
    spark.stop()


def dsv2_writer(stream, args):
    """writeStream.format("chpart") with chpart behind the probe; the kills as probe actions on
    this driver's process group (the probe runs in the JVM's, and a task's, process tree)."""
    path, _calls, env = probe.install(args.work, args.chpart)
    kills = []
    for command, batch in (("commit", args.kill_after_commit), ("build", args.kill_in_build)):
        if batch is not None:
            marker = "killed-after-commit" if command == "commit" else "killed-in-build"
            kills.append({"command": command, "load_suffix": f".{batch}", "marker": os.path.join(args.work, marker),
                          "pgid": os.getpgrp()})
    env[probe.ENV_KILL_AFTER] = json.dumps(kills)
    writer = (stream.writeStream.format("chpart").option("table", args.table).option("config", args.config)
              .option("chpart", path))
    for key, value in env.items():
        writer = writer.option(f"env.{key}", value)
    return writer


def refusals(spark, stream, args):
    """Each refused query's error (None if it ran), then the stream through toTable."""

    def sink(df, name, **options):
        w = (df.writeStream.format("chpart").option("table", args.table).option("config", args.config)
             .option("chpart", args.chpart).option("checkpointLocation", os.path.join(args.work, f"checkpoint-{name}")))
        for key, value in options.items():
            w = w.option(key, value)
        return w

    def error(start):
        try:
            start().awaitTermination(120)
            return None
        except Exception as e:  # the query's failure, with the sink's or Spark's message
            return str(e)

    rate = spark.readStream.format("rate").option("rowsPerSecond", 10).load().selectExpr(
        "value AS id", "timestamp AS ts", "'u' AS user", "'view' AS kind", "0.5D AS amount", "true AS flag")
    result = {
        "complete": error(lambda: sink(stream.groupBy("kind").count(), "complete").outputMode("complete")
                          .trigger(availableNow=True).start()),
        "update": error(lambda: sink(stream, "update").outputMode("update").trigger(availableNow=True).start()),
        "continuous": error(lambda: sink(rate, "continuous", layout="none").trigger(continuous="1 second").start()),
        "continuous_layout": error(lambda: sink(rate, "continuous-layout").trigger(continuous="1 second").start()),
    }
    spark.conf.set("spark.sql.catalog.chpart", "chpart.spark.ChpartCatalog")
    spark.conf.set("spark.sql.catalog.chpart.config", args.config)
    spark.conf.set("spark.sql.catalog.chpart.chpart", args.chpart)
    query = (stream.writeStream.option("checkpointLocation", os.path.join(args.work, "checkpoint"))
             .trigger(availableNow=True).toTable(f"chpart.{args.table}"))
    query.awaitTermination()
    result["to_table_query_id"] = str(query.id)
    with open(os.path.join(args.work, "refusals.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
