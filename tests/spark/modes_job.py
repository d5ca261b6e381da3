"""The driver of the save-mode and layout tests (test_spark_modes.py): a local Spark session
with the JVM connector's jar (it must be on the JVM's classpath when the JVM starts, so each
scenario runs in a process of its own) doing the scenario's writes through `format("chpart")`.
Its result, one JSON object, goes to --out; the test checks ClickHouse itself.

  overwrite  append 3 days (load base), mark base-loaded, wait for the test's go file, then
             mode("overwrite") with new rows for days 0 and 1 only (load replace)
  create     errorifexists into a table that does not exist (created from the options), then
             the same write again (refused: the table exists now); ignore into another missing
             table (created and loaded)
  existing   errorifexists (refused) and ignore (nothing written) into a table the test made
  layout     the same round-robin rows with the table's layout (clustered, by-kind, hourly through
             df.writeTo, sql through INSERT INTO) and without (plain)
"""

import argparse
import datetime
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from conftest import spark_builder  # noqa: E402
from datasets import events, spark_day_condition  # noqa: E402

import chpart_spark  # noqa: E402


def wait_for(path, seconds=120):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {seconds}s")
        time.sleep(0.05)


def checksum(df):
    c = chpart_spark.spark_checksum(df)
    return {"rows": c.rows, "sum": str(c.total)}


def day_checksums(df, days):
    return {str(d): checksum(df.where(spark_day_condition(d))) for d in days}


def writer(df, args, mode, load, **options):
    w = (df.write.format("chpart").mode(mode).option("table", args.table).option("config", args.config)
         .option("chpart", args.chpart).option("load", load))
    for key, value in options.items():
        w = w.option(key, value)
    return w


def attempt(step):
    """Runs step(); None, or the error's text (Spark's, with chpart's message in it)."""
    try:
        step()
        return None
    except Exception as e:  # noqa: BLE001 - the scenario reports it, the test judges it
        return f"{type(e).__name__}: {e}"


def scenario_overwrite(args, spark, result):
    base = events(spark, args.rows, partitions=3, days=3)
    result["base"] = day_checksums(base, range(3))
    writer(base, args, "append", "base").save()
    open(os.path.join(args.work, "base-loaded"), "w").close()
    wait_for(os.path.join(args.work, "go"))
    new = events(spark, args.rows, partitions=3, days=2, first_id=10_000_000, amount_scale=2.0)
    result["new"] = day_checksums(new, range(2))
    started = time.time()
    writer(new, args, "overwrite", "replace").save()
    result["replace_seconds"] = [started, time.time()]


def scenario_overwrite_table(args, spark, result):
    """Three days appended (load base); then, once the test's reader runs, a whole-table
    overwrite with option overwrite=table (load snapshot: two days of new rows); then the base
    rows by mode("overwrite") without the option (load partitions: their three days replaced,
    which is every partition the snapshot has)."""
    base = events(spark, args.rows, partitions=3, days=3)
    result["base"] = day_checksums(base, range(3))
    writer(base, args, "append", "base").save()
    open(os.path.join(args.work, "base-loaded"), "w").close()
    wait_for(os.path.join(args.work, "go"))
    new = events(spark, args.rows, partitions=3, days=2, first_id=10_000_000, amount_scale=2.0)
    result["new"] = day_checksums(new, range(2))
    started = time.time()
    writer(new, args, "overwrite", "snapshot", overwrite="table").save()
    result["snapshot_seconds"] = [started, time.time()]
    result["partitions_started"] = time.time()
    writer(base, args, "overwrite", "partitions").save()


CREATE_OPTIONS = {"engine": "MergeTree", "order_by": "(kind, id)", "partition_by": "toYYYYMMDD(ts)",
                  "settings": "index_granularity = 4096"}


def typed_events(spark, rows):
    """events() plus columns of the other mapped types (int, date, decimal, binary-free)."""
    from pyspark.sql import functions as F

    return (events(spark, rows, partitions=3, days=3)
            .withColumn("n", (F.col("id") % 1000).cast("int"))
            .withColumn("day", F.to_date(F.col("ts")))
            .withColumn("price", (F.col("id") % 100000 / F.lit(100)).cast("decimal(12,2)"))
            .withColumn("note", F.when(F.col("id") % 5 == 0, F.lit(None)).otherwise(F.lit("x"))))


def scenario_create(args, spark, result):
    from pyspark.sql import functions as F

    # The sorting and partition key columns must not be NULL (ClickHouse: allow_nullable_key = 0),
    # and Spark's nullability is the column's: coalesce makes them non-nullable.
    df = (typed_events(spark, args.rows).withColumn("kind", F.coalesce(F.col("kind"), F.lit("")))
          .withColumn("ts", F.coalesce(F.col("ts"), F.timestamp_micros(F.lit(0)))))
    result["schema"] = df.schema.simpleString()
    result["nullable"] = {f.name: f.nullable for f in df.schema.fields}
    result["source"] = checksum(df)
    result["error"] = attempt(lambda: writer(df, args, "errorifexists", "create", **CREATE_OPTIONS).save())
    result["again_error"] = attempt(lambda: writer(df, args, "errorifexists", "create-again", **CREATE_OPTIONS).save())
    # ignore creates a missing table too
    result["ignore_error"] = attempt(
        lambda: writer(df, args, "ignore", "create-ignore", **CREATE_OPTIONS).option("table", args.table + "_ignore").save())


def scenario_existing(args, spark, result):
    df = events(spark, args.rows, partitions=3, days=3)
    result["errorifexists_error"] = attempt(lambda: writer(df, args, "errorifexists", "refused").save())
    result["default_mode_error"] = attempt(
        lambda: (df.write.format("chpart").option("table", args.table).option("config", args.config)
                 .option("chpart", args.chpart).option("load", "default-mode").save()))
    result["ignore_error"] = attempt(lambda: writer(df, args, "ignore", "ignored").save())


def scenario_layout(args, spark, result):
    """The same rows, dealt round-robin over 4 tasks (every task holds every day), written
    through every write path: df.write.format("chpart") with the table's layout into db.events
    (toYYYYMMDD(ts)) and with layout=none into db.events_plain; with the layout into
    db.events_by_kind (a plain column); df.writeTo through a registered catalog into
    db.events_hourly (toStartOfHour of an Asia/Kolkata ts); SQL INSERT INTO a session-catalog
    table USING chpart over db.events_sql (toYYYYMMDD(ts), range layout); with option
    target_part_bytes into db.events_split; that option refused with layout=none or a bad value."""
    jvm = spark.sparkContext._jvm
    # The connector's INFO line naming each write's layout, for the test to read in the log.
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel("chpart.spark.Layout",
                                                                 jvm.org.apache.logging.log4j.Level.INFO)
    df = events(spark, args.rows, partitions=4, days=3).repartition(4)
    result["source"] = checksum(df)
    # With AQE's coalescing (Spark's default) these few rows end in one task after the layout's
    # shuffle; kept at spark.sql.shuffle.partitions (4) the layout has tasks to spread over.
    spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
    writer(df, args, "append", "clustered").save()
    w = writer(df, args, "append", "plain", layout="none")
    w.option("table", args.table + "_plain").save()
    writer(df, args, "append", "by-kind").option("table", args.table + "_by_kind").save()
    spark.conf.set("spark.sql.catalog.chpart", "chpart.spark.ChpartCatalog")
    spark.conf.set("spark.sql.catalog.chpart.config", args.config)
    spark.conf.set("spark.sql.catalog.chpart.chpart", args.chpart)
    df.writeTo(f"chpart.{args.table}_hourly").option("load", "hourly").append()
    df.createOrReplaceTempView("layout_rows")
    spark.sql(f"CREATE TABLE layout_sql (id BIGINT, ts TIMESTAMP, user STRING, kind STRING, amount DOUBLE, "
              f"flag BOOLEAN) USING chpart OPTIONS (table '{args.table}_sql', config '{args.config}', "
              f"chpart '{args.chpart}', load 'sql')")
    spark.sql("INSERT INTO layout_sql SELECT * FROM layout_rows")
    # Option target_part_bytes: adaptive execution splits each day's share of the shuffle, larger
    # than 1 byte, over the map outputs (4): a part per task, up to 4 per day.
    writer(df, args, "append", "split", target_part_bytes="1").option("table", args.table + "_split").save()
    result["target_with_none_error"] = attempt(
        lambda: writer(df, args, "append", "split-none", layout="none", target_part_bytes="1000").save())
    result["target_not_a_number_error"] = attempt(
        lambda: writer(df, args, "append", "split-bad", target_part_bytes="1GB").save())


FUNCTION_ZONES = ("UTC", "Europe/Berlin", "Asia/Kolkata", "America/New_York")
TIME_FUNCTIONS = ("toYYYYMMDD", "toYYYYMM", "toYear", "toDate", "toMonday", "toStartOfMonth", "toStartOfDay",
                  "toStartOfHour")


def function_instants():
    """Microseconds around the instants where a partition value changes: day, month and year
    ends, DST changes in Berlin and New York (2026), a Monday; within Date's and DateTime's range
    (ClickHouse's toDate of an instant before 1970 wraps, e.g. to 2149-06-06)."""
    anchors = ["2026-01-01T00:00:00", "2026-03-29T01:00:00", "2026-10-25T01:00:00", "2026-03-08T07:00:00",
               "2026-11-01T06:00:00", "2026-01-05T00:00:00", "2026-02-28T18:30:00"]
    out = []
    for a in anchors:
        base = int(datetime.datetime.fromisoformat(a).replace(tzinfo=datetime.timezone.utc).timestamp()) * 1_000_000
        for step in range(-8, 9):
            out.append(base + step * 900 * 1_000_000)
            out.append(base + step * 900 * 1_000_000 - 1)
    return out


FUNCTION_INTEGERS = (-1001, -1000, -999, -8, -7, -1, 0, 1, 6, 7, 999, 1000, 1001, 2**40 + 3)


def scenario_functions(args, spark, result):
    """The connector's partition-key functions (ChpartCatalog's chpart_*) evaluated by Spark SQL
    over instants, dates and integers, for the test to compare with ClickHouse's own."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # to_date(ts) is the UTC day, as the test takes it
    spark.conf.set("spark.sql.catalog.chpart", "chpart.spark.ChpartCatalog")
    spark.conf.set("spark.sql.catalog.chpart.config", args.config)
    spark.conf.set("spark.sql.catalog.chpart.chpart", args.chpart)
    spark.createDataFrame([(us,) for us in function_instants()], "us BIGINT").createOrReplaceTempView("instants")
    spark.createDataFrame([(n,) for n in FUNCTION_INTEGERS], "n BIGINT").createOrReplaceTempView("integers")
    instants = {}
    for f in TIME_FUNCTIONS:
        for zone in FUNCTION_ZONES:
            for of, arg in (("ts", "timestamp_micros(us)"), ("date", "to_date(timestamp_micros(us))")):
                v = f"chpart.chpart_{f.lower()}({arg}, '{zone}')"
                instants[f"{f}|{zone}|{of}"] = {
                    "toDate": f"CAST({v} AS STRING)", "toMonday": f"CAST({v} AS STRING)",
                    "toStartOfMonth": f"CAST({v} AS STRING)", "toStartOfDay": f"unix_seconds({v})",
                    "toStartOfHour": f"unix_seconds({v})"}.get(f, v)
    integers = {f"{f}|{d}": f"chpart.chpart_{f.lower()}(n, {d}L)"
                for f, d in (("intDiv", 7), ("modulo", 7), ("intDiv", 1000), ("modulo", 1000))}
    result["values"] = {**columns_by_key(spark, "instants", "us", instants),
                        **columns_by_key(spark, "integers", "n", integers)}


def columns_by_key(spark, view, key, expressions):
    """{name: [[key, str(value)], ...] in key order} for each of `expressions` ({name: SQL}),
    all evaluated by one query over `view`: a Spark job per expression took 0.85 s each."""
    names = list(expressions)
    columns = ", ".join(f"{expressions[name]} AS v{i}" for i, name in enumerate(names))
    rows = spark.sql(f"SELECT {key}, {columns} FROM {view} ORDER BY {key}").collect()
    return {name: [[r[key], str(r[f"v{i}"])] for r in rows] for i, name in enumerate(names)}


def scenario_catalog(args, spark, result):
    """The catalog registered by hand: df.writeTo("chpart.db.events").append() of 3 days, then
    SQL INSERT OVERWRITE chpart.db.events with new rows of day 1 only."""
    spark.conf.set("spark.sql.catalog.chpart", "chpart.spark.ChpartCatalog")
    spark.conf.set("spark.sql.catalog.chpart.config", args.config)
    spark.conf.set("spark.sql.catalog.chpart.chpart", args.chpart)
    base = events(spark, args.rows, partitions=3, days=3)
    result["base"] = day_checksums(base, range(3))
    base.writeTo("chpart." + args.table).option("load", "write-to").append()
    new = events(spark, args.rows // 3, partitions=2, days=1, first_day=1, first_id=10_000_000, amount_scale=3.0)
    result["new"] = day_checksums(new, [1])
    new.createOrReplaceTempView("new_rows")
    spark.sql(f"INSERT OVERWRITE chpart.{args.table} SELECT * FROM new_rows")
    result["missing_error"] = attempt(lambda: base.writeTo("chpart.db.nope").option("load", "nope").append())


SCENARIOS = {"catalog": scenario_catalog, "overwrite": scenario_overwrite, "overwrite-table": scenario_overwrite_table, "create": scenario_create, "existing": scenario_existing,
             "layout": scenario_layout, "functions": scenario_functions}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    p.add_argument("--jar", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--chpart", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    events_dir = os.path.join(args.work, "spark-events")
    os.makedirs(events_dir, exist_ok=True)
    builder = (spark_builder("local[2,4]", events_dir, f"chpart-{args.scenario}")
               .config("spark.jars", args.jar)
               .config("spark.local.dir", os.path.join(args.work, "spark-local")))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    result = {"scenario": args.scenario, "application_id": spark.sparkContext.applicationId}
    try:
        SCENARIOS[args.scenario](args, spark, result)
        result["ok"] = True
    except Exception:  # noqa: BLE001 - reported to the test with the traceback
        result["traceback"] = traceback.format_exc()
    finally:
        with open(args.out, "w") as f:
            json.dump(result, f)
        spark.stop()
    sys.exit(0 if result.get("ok") else 1)


if __name__ == "__main__":
    main()
