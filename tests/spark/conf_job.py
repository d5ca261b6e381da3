"""The Spark driver of test_spark_conf.py, run as its own process in an empty working directory:
a local-cluster session whose chpart config is Spark conf alone (`spark.chpart.*`), with no config
file anywhere, the ClickHouse password in a file shipped with `spark.files` (--files) and
clickhouse-local in an archive shipped with `spark.archives` (--archives clickhouse.tgz#ch). It

1. tries what must be refused before anything runs: a password as an option (both paths), an
   unknown `spark.chpart.*` key (both paths);
2. loads the dataset through chpart_spark.write's Python tasks (via="python"): the first attempt
   of partition 1 fails after its build published (a hook), Spark retries it;
3. loads it again into another table through the JVM connector (`df.write.format("chpart")`
   without option config): the first build that publishes fails after publishing (the probe);

both with the option `clickhouse.user`, which must win over the conf's (a user without access);

and writes what happened as JSON to --out (exit 0 when everything ran, 1 otherwise). Each build
records where it ran (working directory, what Spark shipped there) so the test can check that the
executors read the config's relative paths in their own working directories.
"""

import argparse
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
from failure_jobs import probe  # noqa: E402


def where_built(record_dir, fail_partition, marker):
    """TEST HOOK run in each Python task after its build published: records the task's working
    directory and what it holds, and fails attempt 0 of `fail_partition` once (O_EXCL marker)."""

    def hook(ctx, manifest):
        cwd = os.getcwd()
        record = {"partition": ctx.partitionId(), "attempt_number": ctx.attemptNumber(),
                  "task_attempt_id": ctx.taskAttemptId(),
                  "attempt": manifest["attempt"]["id"], "pid": os.getpid(), "cwd": cwd,
                  "password_file_here": os.path.isfile(os.path.join(cwd, "pw.txt")),
                  "clickhouse_here": os.access(os.path.join(cwd, "ch", "clickhouse"), os.X_OK),
                  "config_files_here": sorted(f for f in os.listdir(cwd) if f.endswith(".toml"))}
        with open(os.path.join(record_dir, f"task-{ctx.taskAttemptId()}.json"), "w") as f:
            json.dump(record, f)
        if ctx.partitionId() == fail_partition and ctx.attemptNumber() == 0:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            raise RuntimeError(f"injected failure after publishing: {record['attempt']}")

    return hook


def refused(fn):
    try:
        fn()
    except Exception as e:  # the test checks the message
        return f"{type(e).__name__}: {e}"[-6000:]
    return None


def main():
    p = argparse.ArgumentParser()
    for name in ("--chpart", "--probe", "--probe-env", "--jar", "--conf", "--table-python", "--table-connector",
                 "--load", "--user", "--event-dir", "--work", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--rows", type=int, required=True)
    args = p.parse_args()
    probe_env = json.loads(args.probe_env)
    result = {"cwd": os.getcwd()}
    code = 0
    builder = spark_builder("local-cluster[2,1,1024]", args.event_dir, "chpart-conf-only")
    for key, value in {**json.loads(args.conf), "spark.jars": args.jar}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    result["application_id"] = spark.sparkContext.applicationId
    try:
        df = events(spark, rows=args.rows, partitions=4)
        source = chpart_spark.spark_checksum(df)
        result.update(source_rows=source.rows, source_sum=str(source.total))

        # 1. Refused before anything runs.
        result["python_password_option"] = refused(lambda: chpart_spark.write(
            df, args.table_python, f"{args.load}-refused", chpart=args.chpart, via="python",
            options={"clickhouse.password": "not-a-place-for-it"}))
        result["connector_password_option"] = refused(lambda: (
            df.write.format("chpart").mode("append").option("table", args.table_connector)
            .option("chpart", args.chpart).option("load", f"{args.load}-refused")
            .option("clickhouse.password", "not-a-place-for-it").save()))
        spark.conf.set("spark.chpart.clickhouse.urll", "http://typo:8123")
        result["python_unknown_conf"] = refused(lambda: chpart_spark.write(
            df, args.table_python, f"{args.load}-refused", chpart=args.chpart, via="python"))
        result["connector_unknown_conf"] = refused(lambda: (
            df.write.format("chpart").mode("append").option("table", args.table_connector)
            .option("chpart", args.chpart).option("load", f"{args.load}-refused").save()))
        spark.conf.unset("spark.chpart.clickhouse.urll")

        # 2. Python tasks, a task retry after publishing.
        records = os.path.join(args.work, "builds")
        os.makedirs(records)
        # The conf's clickhouse.user is a wrong one: the write's option must win over it.
        result["python"] = chpart_spark.write(
            df, args.table_python, f"{args.load}-py", chpart=args.chpart, via="python",
            options={"clickhouse.user": args.user},
            _after_build=where_built(records, 1, os.path.join(args.work, "fail-after-publish-py.json")))

        # 3. The JVM connector, no config option: the probe fails the first build that publishes.
        env = {**probe_env, probe.ENV_FAIL_AFTER_PUBLISH: json.dumps(
            {"partition": 1, "marker": os.path.join(args.work, "fail-after-publish-jvm.json")})}
        writer = (df.write.format("chpart").mode("append").option("table", args.table_connector)
                  .option("chpart", args.probe).option("load", f"{args.load}-jvm").option("layout", "none")
                  .option("clickhouse.user", args.user))
        for key, value in env.items():
            writer = writer.option(f"env.{key}", value)
        writer.save()
        result["connector"] = "saved"
    except BaseException:
        result["error"] = traceback.format_exc()[-8000:]
        code = 1
    finally:
        spark.stop()  # completes the event log
        with open(args.out, "w") as f:
            json.dump(result, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
