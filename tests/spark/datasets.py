"""Deterministic test datasets and the target table they load into (shared by the tests and
the driver script the tests run as a subprocess)."""

import datetime

# 2026-01-01T00:00:00Z in microseconds: the first day of the dataset.
BASE_US = int(datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc).timestamp()) * 1_000_000
DAY_US = 86_400 * 1_000_000

COLUMNS = ["id", "ts", "user", "kind", "amount", "flag"]


def create_table_sql(table):
    return (
        f"CREATE TABLE {table} (id Int64, ts DateTime64(6, 'UTC'), user String, "
        "kind LowCardinality(String), amount Nullable(Float64), flag Bool) "
        "ENGINE = MergeTree PARTITION BY toYYYYMMDD(ts) ORDER BY (kind, id)"
    )


def events(spark, rows, partitions=4, days=3, first_id=0, amount_scale=1.0, first_day=0):
    """`rows` events spread evenly over `days` days from 2026-01-01 + `first_day` (UTC), with
    microsecond timestamps, strings, a low-cardinality string, a nullable double and a bool."""
    from pyspark.sql import functions as F

    step_us = days * DAY_US // max(rows, 1)
    rel = F.col("id") - F.lit(first_id)
    kinds = F.array(*[F.lit(k) for k in ("view", "click", "cart", "buy")])
    return (
        spark.range(first_id, first_id + rows, 1, partitions)
        .withColumn("ts", F.timestamp_micros(F.lit(BASE_US + first_day * DAY_US) + rel * F.lit(step_us) + rel % 1000))
        .withColumn("user", F.concat(F.lit("user-"), ((F.col("id") * 7919) % 5003).cast("string")))
        .withColumn("kind", F.element_at(kinds, (F.col("id") % 4 + 1).cast("int")))
        .withColumn("amount", F.when(F.col("id") % 7 == 0, F.lit(None).cast("double"))
                    .otherwise((F.col("id") % 10007) / F.lit(100.0) * F.lit(amount_scale) + F.lit(0.005)))
        .withColumn("flag", F.col("id") % 3 == 0)
        .select(*COLUMNS)
    )


def day_id(day):
    """The ClickHouse partition id (toYYYYMMDD) of dataset day `day` (0-based)."""
    return (datetime.date(2026, 1, 1) + datetime.timedelta(days=day)).strftime("%Y%m%d")


def spark_day_condition(day):
    """A Spark SQL condition true for rows on dataset day `day` in UTC (whatever the session
    time zone)."""
    start = BASE_US + day * DAY_US
    return f"unix_micros(ts) >= {start} AND unix_micros(ts) < {start + DAY_US}"


def events_arrow(rows, days=3, first_id=0):
    """The same kind of events as `events()` (same columns, types and value formulas), made by
    pyarrow without Spark: the input of jobs that read Parquet (the Java job)."""
    import numpy as np
    import pyarrow as pa

    ids = np.arange(first_id, first_id + rows, dtype=np.int64)
    rel = ids - first_id
    step_us = days * DAY_US // max(rows, 1)
    ts = BASE_US + rel * step_us + rel % 1000
    kinds = np.array(["view", "click", "cart", "buy"], dtype=object)
    amount = (ids % 10007) / 100.0 + 0.005
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        "user": pa.array([f"user-{u}" for u in (ids * 7919) % 5003], pa.string()),
        "kind": pa.array(kinds[ids % 4], pa.string()),
        "amount": pa.array(amount, pa.float64(), mask=(ids % 7 == 0)),
        "flag": pa.array(ids % 3 == 0, pa.bool_()),
    })


def write_events_parquet(directory, rows, files=2):
    """`events_arrow(rows)` as `files` Parquet files in `directory`; returns the rows' checksum."""
    import os

    import pyarrow.parquet as pq

    from chpart_spark import batches_checksum

    table = events_arrow(rows)
    os.makedirs(directory, exist_ok=True)
    per_file = -(-rows // files)
    for i in range(files):
        pq.write_table(table.slice(i * per_file, per_file), os.path.join(directory, f"part-{i}.parquet"))
    return batches_checksum(table.to_batches())
