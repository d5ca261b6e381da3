"""The Spark driver of test_embedded_chpart.py's Spark tests, run as its own process with a
PATH that holds no `chpart` and no $CHPART_BIN: a PySpark job on local-cluster[2,1,1024] (two
executor JVMs, whose PATH spark.executorEnv.PATH scrubs the same way). It computes the source's
checksum, then loads the rows naming no chpart binary, by one of:

  --via connector  `df.write.format("chpart")` with the connector's jar and the test plugin's
                   jar (`spark.jars`) as the only things added; the plugin
                   (java/KillAfterPublish.java) halts the executor that ran the first attempt of
                   partition 1 right after that attempt's build published
  --via wheel      `chpart_spark.write(via="python")` with chpart_spark imported, on the driver
                   and in the executors' Python workers (spark.executorEnv.PYTHONPATH), from the
                   wheel installed into --wheel-dir; the first attempt of partition 1 fails after
                   it published (chpart_testing.fail_first_attempt, shipped by value)

Writes what happened as JSON to --out (exit 0 when the write returned, 1 when it raised)."""

import argparse
import hashlib
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["PYSPARK_PYTHON"] = sys.executable

import chpart_spark  # noqa: E402
from conftest import spark_builder  # noqa: E402
from datasets import events  # noqa: E402

KILL_PARTITION = 1


def extracted(local_dir):
    """{path: sha256} of every extracted chpart (chpart-<digest>) under the local directory."""
    found = {}
    for directory, _, files in os.walk(local_dir):
        for name in files:
            if name.startswith("chpart-"):
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    found[path] = hashlib.sha256(f.read()).hexdigest()
    return found


def main():
    p = argparse.ArgumentParser()
    for name in ("--via", "--config", "--table", "--load", "--event-dir", "--local-dir", "--marker",
                 "--executor-path", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--jars")
    p.add_argument("--wheel-dir")
    p.add_argument("--rows", type=int, required=True)
    args = p.parse_args()
    builder = (spark_builder("local-cluster[2,1,1024]", args.event_dir, "chpart-embedded")
               .config("spark.executorEnv.PATH", args.executor_path)
               .config("spark.local.dir", args.local_dir))
    if args.via == "connector":
        builder = (builder.config("spark.jars", args.jars)
                   .config("spark.plugins", "chpart.testing.KillAfterPublish")
                   .config("spark.chparttest.kill_marker", args.marker))
    else:
        builder = builder.config("spark.executorEnv.PYTHONPATH", args.wheel_dir)
    spark = builder.getOrCreate()
    result = {"application_id": spark.sparkContext.applicationId, "event_dir": args.event_dir, "error": None,
              "chpart_spark": chpart_spark.__file__}
    code = 0
    try:
        df = events(spark, rows=args.rows, partitions=4)  # one stage: each task is a write task
        source = chpart_spark.spark_checksum(df)
        result.update(source_rows=source.rows, source_sum=str(source.total))
        if args.via == "connector":
            spark.sparkContext.setLocalProperty("chpart.test.kill_partition", str(KILL_PARTITION))
            (df.write.format("chpart").mode("append").option("table", args.table).option("config", args.config)
             .option("load", args.load).option("layout", "none").save())
        else:
            from chpart_spark import _cli
            from chpart_testing import fail_first_attempt

            result["driver_binary"] = _cli.resolve_binary()
            result["summary"] = chpart_spark.write(df, args.table, args.load, args.config, via="python",
                                                   _after_build=fail_first_attempt(KILL_PARTITION, args.marker))
    except Exception:
        result["error"] = traceback.format_exc()[-12000:]
        code = 1
    finally:
        # Before the stop: Spark deletes its local directories when the JVMs end.
        result["extracted"] = extracted(args.local_dir)
        spark.stop()  # completes the event log
        with open(args.out, "w") as f:
            json.dump(result, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
