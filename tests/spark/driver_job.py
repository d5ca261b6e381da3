"""A whole Spark driver for test (c), run as its own process so the test can let its commit
die and then run it again: builds the test dataset, loads it with chpart_spark.write and
writes what happened as JSON to --out (exit 0 on success, 1 on failure)."""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["PYSPARK_PYTHON"] = sys.executable

import chpart_spark  # noqa: E402
from chpart_testing import fail_first_attempt  # noqa: E402
from conftest import spark_builder  # noqa: E402
from datasets import events  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    for name in ("--config", "--chpart", "--table", "--load", "--winners", "--event-dir", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--crash-at")
    p.add_argument("--fail-first-attempt-of", type=int)
    p.add_argument("--marker")
    args = p.parse_args()
    os.makedirs(args.event_dir, exist_ok=True)
    spark = spark_builder("local[2,4]", args.event_dir, "chpart-test-driver").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    result = {"application_id": spark.sparkContext.applicationId, "event_dir": args.event_dir}
    code = 0
    try:
        df = events(spark, rows=args.rows, partitions=4)
        if args.crash_at:  # the first run also records the source's checksum for the test
            source = chpart_spark.spark_checksum(df)
            result.update(source_rows=source.rows, source_sum=str(source.total))
        jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
        hook = None
        if args.fail_first_attempt_of is not None:
            hook = fail_first_attempt(args.fail_first_attempt_of, args.marker)
        extra_env = {"CHPART_TEST_CRASH_AT": args.crash_at} if args.crash_at else None
        try:
            summary = chpart_spark.write(df, table=args.table, load_id=args.load, config=args.config,
                                         chpart=args.chpart, extra_env=extra_env, winners_path=args.winners,
                                         _after_build=hook)
            result["summary"] = summary
        except chpart_spark.ChpartError as e:
            result.update(error=type(e).__name__, exit_code=e.exit_code, message=str(e),
                          winners_path=getattr(e, "winners_path", None))
            code = 1
        result["jobs"] = len(spark.sparkContext.statusTracker().getJobIdsForGroup()) - jobs_before
    finally:
        spark.stop()  # completes the event log
        with open(args.out, "w") as f:
            json.dump(result, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
