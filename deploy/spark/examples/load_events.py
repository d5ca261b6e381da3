"""Example spark-submit job: load one hour of web events into ClickHouse exactly once.

    spark-submit --master 'local[2,4]' deploy/spark/examples/load_events.py \
        --config /etc/chpart/chpart.toml --table web.events --hour 2026-11-30T09 --rows 600000

The table (see --print-ddl) is partitioned by day and ordered by (event, user_id, event_time).
The events are generated here (deterministically, from the row number) instead of read from
a lake, so the job runs anywhere: timestamps with milliseconds over the hour, Zipf-like user
ids, sessions, a skewed event mix, URLs, referrers (nullable), countries, devices, revenue as
Decimal(18, 2) (nullable) and durations.

The load id is derived from table and hour (`events-2026-11-30T09`): re-running the job for an
hour that is already loaded does nothing, and a run whose driver died is resumed
(--winners-dir keeps the winners file between runs).

Demonstration flags (the quickstart uses them; not for production):
  --demo-fail-partition P   the first attempt of partition P fails after publishing its parts
                            (fail_first_attempt, a TEST HOOK)
  --verify                  compare count and checksum of the source rows and of the table
  --event-log-dir DIR       where the Spark event log is (to report failed task attempts)
The test hook and the event log reader are the tests' (tests/spark/chpart_testing.py, not part
of chpart_spark): the first and the third flag need that file importable, e.g.
`spark-submit --py-files tests/spark/chpart_testing.py` as deploy/quickstart.sh does.
  --report FILE             write what happened as JSON
"""

import argparse
import calendar
import json
import logging
import os
import sys
import time
import tomllib

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import chpart_spark

DDL = """CREATE TABLE IF NOT EXISTS {table} (
    event_time  DateTime64(3, 'UTC'),
    user_id     Int64,
    session_id  String,
    event       LowCardinality(String),
    url         String,
    referrer    Nullable(String),
    country     LowCardinality(String),
    device      LowCardinality(String),
    revenue     Nullable(Decimal(18, 2)),
    duration_ms Int32
) ENGINE = MergeTree
PARTITION BY toYYYYMMDD(event_time)
ORDER BY (event, user_id, event_time)"""

COLUMNS = ["event_time", "user_id", "session_id", "event", "url", "referrer", "country", "device", "revenue",
           "duration_ms"]


def hour_of_events(spark, hour, rows, partitions):
    """`rows` events of the hour starting at `hour` (e.g. "2026-11-30T09"), deterministic."""
    start_ms = calendar.timegm(time.strptime(hour + ":00:00", "%Y-%m-%dT%H:%M:%S")) * 1000

    def pick(values, h):  # values with weights, by a hash bucket 0..99
        expr, acc = None, 0
        for value, weight in values:
            acc += weight
            cond = h < acc
            expr = F.when(cond, F.lit(value)) if expr is None else expr.when(cond, F.lit(value))
        return expr.otherwise(F.lit(values[-1][0]))

    h = lambda salt: F.pmod(F.xxhash64(F.col("id"), F.lit(salt)), F.lit(100))  # noqa: E731
    u = F.pmod(F.xxhash64(F.col("id"), F.lit("u")), F.lit(1_000_000)).cast("double") / 1_000_000
    user_id = (F.pow(u, F.lit(3.0)) * 250_000).cast("long") + 1  # Zipf-like: a few users do most
    event = pick([("page_view", 62), ("click", 20), ("add_to_cart", 8), ("search", 6), ("purchase", 3),
                  ("signup", 1)], h("e"))
    paths = F.array(*[F.lit(p) for p in ("/", "/search", "/cart", "/checkout", "/account", "/deals")])
    product = F.concat(F.lit("/product/"), F.pmod(F.xxhash64(F.col("id"), F.lit("p")), F.lit(20_000)).cast("string"))
    url = F.concat(F.lit("https://shop.example.com"),
                   F.when(h("k") < 55, product).otherwise(F.element_at(paths, (h("q") % 6 + 1).cast("int"))))
    referrer = pick([("https://www.google.com/", 40), ("https://news.example.org/", 10), ("https://t.co/", 5),
                     ("", 45)], h("r"))
    return (
        spark.range(0, rows, 1, partitions)
        .withColumn("event_time", F.timestamp_millis(F.lit(start_ms) + (F.col("id") * 3_600_000 / rows).cast("long")))
        .withColumn("user_id", user_id)
        .withColumn("session_id", F.substring(F.sha2(F.concat(F.col("user_id").cast("string"), F.lit(":"),
                                                              (F.col("id") / 5000).cast("long").cast("string")), 256),
                                              1, 16))
        .withColumn("event", event)
        .withColumn("url", url)
        .withColumn("referrer", F.when(referrer == "", F.lit(None).cast("string")).otherwise(referrer))
        .withColumn("country", pick([("US", 31), ("DE", 12), ("GB", 9), ("IN", 9), ("FR", 7), ("BR", 6), ("JP", 5),
                                     ("CA", 4), ("NL", 3), ("PL", 3), ("ES", 3), ("AU", 3), ("SE", 2), ("IT", 3)],
                                    h("c")))
        .withColumn("device", pick([("mobile", 58), ("desktop", 36), ("tablet", 6)], h("d")))
        .withColumn("revenue", F.when(F.col("event") == "purchase",
                                      (F.pmod(F.xxhash64(F.col("id"), F.lit("v")), F.lit(30_000)) / 100 + 4.99)
                                      .cast("decimal(18,2)")))
        .withColumn("duration_ms", (F.pow(h("t").cast("double") / 100, F.lit(2.0)) * 30_000).cast("int") + 20)
        .select(*COLUMNS)
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="chpart config (same path on driver and executors)")
    p.add_argument("--table", default="web.events")
    p.add_argument("--hour", help="UTC hour to load, e.g. 2026-11-30T09")
    p.add_argument("--rows", type=int, default=600_000)
    p.add_argument("--partitions", type=int, default=4, help="Spark partitions (= chpart build tasks)")
    p.add_argument("--chpart", default="chpart", help="the chpart binary")
    p.add_argument("--mode", default="append", choices=["append", "replace"])
    p.add_argument("--winners-dir", help="keep the winners file here until the commit succeeds")
    p.add_argument("--print-ddl", action="store_true", help="print the table's CREATE TABLE and exit")
    p.add_argument("--demo-fail-partition", type=int)
    p.add_argument("--demo-marker", help="marker file for --demo-fail-partition")
    p.add_argument("--verify", action="store_true")
    p.add_argument("--event-log-dir")
    p.add_argument("--report")
    args = p.parse_args()
    if args.print_ddl:
        print(DDL.format(table=args.table))
        return 0
    if not args.config or not args.hour:
        p.error("--config and --hour are required")
    progress = logging.StreamHandler(sys.stdout)
    progress.setFormatter(logging.Formatter("  [chpart_spark] %(message)s"))
    logging.getLogger("chpart_spark").addHandler(progress)
    logging.getLogger("chpart_spark").setLevel(logging.INFO)

    spark = SparkSession.builder.appName(f"load-events-{args.hour}").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    app_id = spark.sparkContext.applicationId
    load_id = f"{args.table.split('.')[-1]}-{args.hour}"
    df = hour_of_events(spark, args.hour, args.rows, args.partitions)
    print(f"  {args.rows:,} events of {args.hour}:00 UTC in {args.partitions} Spark partitions -> {args.table}, "
          f"load {load_id}")

    hook = None
    if args.demo_fail_partition is not None:
        from chpart_testing import fail_first_attempt

        marker = args.demo_marker or os.path.join(os.path.dirname(os.path.abspath(args.config)), f"{load_id}.failed")
        hook = fail_first_attempt(args.demo_fail_partition, marker)
        print(f"  demo: the first attempt of partition {args.demo_fail_partition} will fail after publishing its parts")
    winners = os.path.join(args.winners_dir, f"{load_id}.jsonl") if args.winners_dir else None

    summary = chpart_spark.write(df, table=args.table, load_id=load_id, config=args.config, mode=args.mode,
                                 chpart=args.chpart, winners_path=winners, _after_build=hook)
    report = {"load": load_id, "application_id": app_id, "summary": summary}

    if args.verify:
        with open(args.config, "rb") as f:
            url = tomllib.load(f)["clickhouse"]["url"]
        t = time.monotonic()
        source = chpart_spark.spark_checksum(df)
        table = chpart_spark.clickhouse_checksum(
            url, f"SELECT {', '.join(COLUMNS)} FROM {args.table} WHERE event_time >= "
                 f"toDateTime64('{args.hour.replace('T', ' ')}:00:00', 3, 'UTC') AND event_time < "
                 f"toDateTime64('{args.hour.replace('T', ' ')}:00:00', 3, 'UTC') + INTERVAL 1 HOUR")
        report["verify"] = {"source_rows": source.rows, "source_checksum": source.hex, "table_rows": table.rows,
                            "table_checksum": table.hex, "equal": source == table,
                            "seconds": time.monotonic() - t}
    spark.stop()  # completes the event log
    if args.event_log_dir:
        from chpart_testing import task_attempts

        report["failed_attempts"] = [a for a in task_attempts(args.event_log_dir, app_id) if a["failed"]]
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    if args.verify and not report["verify"]["equal"]:
        print("  source and table differ!", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
