"""The Spark driver of test_embedded_chpart.py's connector test, run as its own process with a
PATH that holds no `chpart` and no $CHPART_BIN: a PySpark job on local-cluster[2,1,1024] (two
executor JVMs, whose PATH spark.executorEnv.PATH scrubs the same way) with the connector's jar
and the test plugin's jar (`spark.jars`) as the only things added. It computes the source's
checksum, then loads the rows with `df.write.format("chpart")` naming no chpart binary, while
the plugin (java/KillAfterPublish.java) halts the executor that ran the first attempt of
partition 1 right after that attempt's build published. Writes what happened as JSON to --out
(exit 0 when the write returned, 1 when it raised)."""

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
    for name in ("--config", "--table", "--load", "--event-dir", "--local-dir", "--jars", "--marker",
                 "--executor-path", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--rows", type=int, required=True)
    args = p.parse_args()
    builder = (spark_builder("local-cluster[2,1,1024]", args.event_dir, "chpart-embedded")
               .config("spark.jars", args.jars)
               .config("spark.plugins", "chpart.testing.KillAfterPublish")
               .config("spark.chpart.test.kill_marker", args.marker)
               .config("spark.executorEnv.PATH", args.executor_path)
               .config("spark.local.dir", args.local_dir))
    spark = builder.getOrCreate()
    result = {"application_id": spark.sparkContext.applicationId, "event_dir": args.event_dir, "error": None}
    code = 0
    try:
        df = events(spark, rows=args.rows, partitions=4)  # one stage: each task is a write task
        source = chpart_spark.spark_checksum(df)
        result.update(source_rows=source.rows, source_sum=str(source.total))
        spark.sparkContext.setLocalProperty("chpart.test.kill_partition", str(KILL_PARTITION))
        (df.write.format("chpart").mode("append").option("table", args.table).option("config", args.config)
         .option("load", args.load).option("layout", "none").save())
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
