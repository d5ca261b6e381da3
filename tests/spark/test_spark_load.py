"""End-to-end: real Spark (pyspark 4.3.0, local[2,4]) loads through chpart_spark.write into a
real ClickHouse 26.9 engine, with failures forced deterministically and checked against
Spark's event log, the table's contents and chpart's status."""

import json
import os
import re
import subprocess
import sys

import pytest

import chpart_spark
from chpart_testing import fail_first_attempt
from datasets import create_table_sql, day_id, events, spark_day_condition
from helpers import (assert_exactly_once, assert_gc_leaves_nothing, assert_winners_and_losers, failed_attempts,
                     load_status, read_marker, table_checksum)

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = "db.events"


def make_table(clickhouse):
    clickhouse.query("CREATE DATABASE db")
    clickhouse.query(create_table_sql(TABLE))


def test_task_retry_after_publish_loads_exactly_once(spark, clickhouse, chpart_config, chpart_bin, tmp_path):
    """(a) Attempt 0 of partition 1 fails after its chpart build published parts; Spark retries
    it, the retry wins, the loser's parts are never attached, gc removes them."""
    make_table(clickhouse)
    df = events(spark, rows=60_000, partitions=4)
    marker = str(tmp_path / "fail-p1.marker")

    summary = chpart_spark.write(df, table=TABLE, load_id="retry-load", config=chpart_config, chpart=chpart_bin,
                                 _after_build=fail_first_attempt(1, marker))
    source = chpart_spark.spark_checksum(df)
    app_id = spark.sparkContext.applicationId
    started = spark.sparkContext.startTime
    spark.stop()  # completes the event log

    # Spark really ran a failing attempt of partition 1 (the oracle: its event log) ...
    loser = read_marker(marker)
    failed = failed_attempts(spark.event_dir, app_id)
    assert [(a["partition"], a["attempt"], a["task_id"]) for a in failed] == [(1, 0, loser["task_attempt_id"])], failed
    assert "InjectedFailure" in failed[0]["message"], failed[0]
    assert loser["parts"], "the failed attempt had published parts"
    # ... and a retry won partition 1.
    assert summary["spark_partitions"] == 4
    winners = dict(summary["winners"])
    assert sorted(winners) == [0, 1, 2, 3]
    assert winners[1] != loser["attempt"]
    # Attempt ids: <applicationId>.<application attempt (here none: the driver's start time)>.
    # <nonce of this write()>.<taskAttemptId>, one prefix for the whole write.
    shape = re.compile(rf"^{re.escape(app_id)}\.s{started}\.([0-9a-f]{{12}})\.(\d+)$")
    ids = list(winners.values()) + [loser["attempt"]]
    assert all(shape.match(a) for a in ids), ids
    assert len({shape.match(a).group(1) for a in ids}) == 1, ids
    assert shape.match(loser["attempt"]).group(2) == str(loser["task_attempt_id"]), loser
    assert summary["rows"] == 60_000 and summary["application_id"] == app_id

    assert_exactly_once(clickhouse, TABLE, source)
    entry = load_status(chpart_config, chpart_bin, "retry-load")
    assert_winners_and_losers(entry, summary["winners"], losers=[loser["attempt"]])
    # Before gc the loser's parts still wait in the shadow table's detached/ ...
    waiting = {r["name"] for r in clickhouse.rows("SELECT name FROM system.detached_parts WHERE database = 'db'")}
    assert set(loser["parts"]) <= waiting, (loser["parts"], waiting)
    # ... gc removes them and everything else of the load.
    assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, "retry-load")
    assert_exactly_once(clickhouse, TABLE, source)


def test_replace_reload_of_existing_partitions(spark, clickhouse, chpart_config, chpart_bin, tmp_path):
    """(b) A historical reload in replace mode: the reloaded day's old rows are replaced exactly
    (with a losing attempt in the reload), the other days are untouched, and re-running an
    already committed load changes nothing."""
    make_table(clickhouse)
    first = events(spark, rows=45_000, partitions=3, days=3)
    s1 = chpart_spark.write(first, table=TABLE, load_id="history-v1", config=chpart_config, chpart=chpart_bin)
    assert s1["rows"] == 45_000 and s1["partitions"] == 3  # three days
    # No test hook, no via: without the connector's jar in this session, "auto" runs Python tasks;
    # insisting on the connector is refused before anything runs.
    assert s1["via"] == "python", s1
    with pytest.raises(ValueError, match="chpart.spark.ChpartDataSource is not loadable"):
        chpart_spark.write(first, table=TABLE, load_id="history-v1-jar", config=chpart_config, chpart=chpart_bin,
                           via="connector")
    reloaded_day = day_id(1)
    others = f"toYYYYMMDD(ts) != {reloaded_day}"
    before_others = table_checksum(clickhouse, TABLE, others)
    before_day = table_checksum(clickhouse, TABLE, f"toYYYYMMDD(ts) = {reloaded_day}")
    assert before_day.rows == 15_000

    # The corrected day 1: other ids, other amounts, fewer rows; partition 0 fails once after publishing.
    fix = events(spark, rows=9_000, partitions=3, days=1, first_day=1, first_id=1_000_000, amount_scale=3.0)
    marker = str(tmp_path / "fail-p0.marker")
    s2 = chpart_spark.write(fix, table=TABLE, load_id="history-v2-day1", config=chpart_config, chpart=chpart_bin,
                            mode="replace", _after_build=fail_first_attempt(0, marker))
    assert s2["mode"] == "replace" and s2["rows"] == 9_000 and s2["partitions"] == 1 and s2["via"] == "python"
    # Two writes of one application never share an attempt id prefix (the per-write nonce).
    prefixes = lambda summary: {a.rsplit(".", 1)[0] for _, a in summary["winners"]}  # noqa: E731
    assert len(prefixes(s1)) == 1 and len(prefixes(s2)) == 1 and prefixes(s1) != prefixes(s2), (s1, s2)
    fix_source = chpart_spark.spark_checksum(fix)

    # Re-running the first (committed) load is a no-op that reports it.
    again = chpart_spark.write(first, table=TABLE, load_id="history-v1", config=chpart_config, chpart=chpart_bin)
    assert again["already_committed"] is True and again["rows"] == 45_000 and again["via"] is None
    first_others = chpart_spark.spark_checksum(first.where(f"NOT ({spark_day_condition(1)})"))
    app_id = spark.sparkContext.applicationId
    spark.stop()

    loser = read_marker(marker)
    failed = failed_attempts(spark.event_dir, app_id)
    assert [(a["partition"], a["attempt"], a["task_id"]) for a in failed] == [(0, 0, loser["task_attempt_id"])], failed

    # The reloaded day holds exactly the new rows, the others exactly what they held.
    assert_exactly_once(clickhouse, TABLE, fix_source, where=f"toYYYYMMDD(ts) = {reloaded_day}")
    assert table_checksum(clickhouse, TABLE, others) == before_others
    assert before_others == first_others
    assert int(clickhouse.scalar(f"SELECT count() FROM {TABLE}")) == 30_000 + 9_000
    assert int(clickhouse.scalar(f"SELECT count() FROM {TABLE} WHERE id >= 1000000")) == 9_000

    entry = load_status(chpart_config, chpart_bin, "history-v2-day1")
    assert entry["mode"] == "replace"
    assert_winners_and_losers(entry, s2["winners"], losers=[loser["attempt"]])
    assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, "history-v2-day1")
    assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, "history-v1")
    assert_exactly_once(clickhouse, TABLE, fix_source, where=f"toYYYYMMDD(ts) = {reloaded_day}")


def run_driver(tmp_path, config, chpart, load, winners, rows, crash_at=None, marker=None, name="driver"):
    """Runs tests/spark/driver_job.py (a whole Spark driver) as its own process."""
    out = tmp_path / f"{name}.json"
    argv = [sys.executable, os.path.join(HERE, "driver_job.py"), "--config", config, "--chpart", chpart,
            "--table", TABLE, "--load", load, "--winners", str(winners), "--rows", str(rows),
            "--event-dir", str(tmp_path / f"{name}-events"), "--out", str(out)]
    if crash_at:
        argv += ["--crash-at", crash_at]
    if marker:
        argv += ["--fail-first-attempt-of", "1", "--marker", marker]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.exists(), f"the driver wrote no result (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-5000:]}"
    return proc, json.loads(out.read_text())


def test_driver_killed_during_commit_then_rerun(clickhouse, chpart_config, chpart_bin, tmp_path):
    """(c) The driver's commit dies after its first ATTACH (CHPART_TEST_CRASH_AT=after-attach:1,
    given only through write(extra_env=...)): nothing is visible, the winners file is kept.
    Then the driver's host is lost with that file: re-running the job resumes the commit from
    the ledger alone (the plan holds the winners' manifests), without a new Spark job, exactly
    once; running it once more changes nothing."""
    make_table(clickhouse)
    winners = tmp_path / "winners" / "crash-load.jsonl"
    marker = str(tmp_path / "fail-p1.marker")

    proc, crashed = run_driver(tmp_path, chpart_config, chpart_bin, "crash-load", winners, 40_000,
                               crash_at="after-attach:1", marker=marker, name="first")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert crashed["error"] == "CommitError", crashed
    assert crashed["exit_code"] == -6, crashed  # SIGABRT: the crash hook aborts like kill -9
    assert "CHPART_TEST_CRASH_AT=after-attach:1" in crashed["message"], crashed["message"]
    assert crashed["winners_path"] == str(winners) and winners.exists()
    lines = [json.loads(line) for line in winners.read_text().splitlines() if line.strip()]
    assert sorted(m["attempt"]["partition"] for m in lines) == [0, 1, 2, 3]
    failed = failed_attempts(crashed["event_dir"], crashed["application_id"])
    loser = read_marker(marker)
    assert [(a["partition"], a["attempt"], a["task_id"]) for a in failed] == [(1, 0, loser["task_attempt_id"])]

    # Killed right after its first ATTACH returned (others may have been in flight), before
    # recording it: the load is open, attached parts sit in the shadow table (the re-run must
    # find them there rather than attach them again), and nothing is visible in the target.
    entry = load_status(chpart_config, chpart_bin, "crash-load")
    assert entry["state"] == "open", entry
    in_shadow = int(clickhouse.scalar(
        "SELECT count() FROM system.parts WHERE database = 'db' AND table LIKE 'events\\_\\_chpart\\_%' AND active"))
    assert 1 <= in_shadow <= sum(len(m["parts"]) for m in lines), in_shadow
    assert int(clickhouse.scalar(f"SELECT count() FROM {TABLE}")) == 0

    # The driver's host is lost, and the winners file with it: re-running the job finishes the
    # commit from the ledger's plan alone, without a Spark job (which would bring other winners).
    winners.unlink()
    source = chpart_spark.Checksum(crashed["source_rows"], int(crashed["source_sum"]))
    proc, rerun = run_driver(tmp_path, chpart_config, chpart_bin, "crash-load", winners, 40_000, name="rerun")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = rerun["summary"]
    assert summary["resumed"] is True and summary["rows"] == 40_000, rerun
    assert rerun["jobs"] == 0, "the resumed run must not run a Spark job"
    assert sorted(p for p, _ in summary["winners"]) == [0, 1, 2, 3], summary
    assert_exactly_once(clickhouse, TABLE, source)

    # Once more: the load is committed, nothing changes.
    proc, again = run_driver(tmp_path, chpart_config, chpart_bin, "crash-load", winners, 40_000, name="again")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert again["summary"]["already_committed"] is True and again["jobs"] == 0, again
    assert_exactly_once(clickhouse, TABLE, source)

    entry = load_status(chpart_config, chpart_bin, "crash-load")
    assert_winners_and_losers(entry, summary["winners"], losers=[loser["attempt"]])
    assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, "crash-load")
    assert_exactly_once(clickhouse, TABLE, source)


def test_permanent_failure_fails_the_job_with_chpart_message_and_aborts(spark, clickhouse, chpart_config,
                                                                       chpart_bin):
    """A schema mismatch: every attempt's chpart build exits 4; the job fails with chpart's exit
    code and stderr in its message, the load is aborted and nothing is left behind."""
    make_table(clickhouse)
    from pyspark.sql import functions as F

    bad = events(spark, rows=2_000, partitions=2).withColumn("id", F.concat(F.lit("x"), F.col("id").cast("string")))
    with pytest.raises(Exception) as failure:
        chpart_spark.write(bad, table=TABLE, load_id="bad-load", config=chpart_config, chpart=chpart_bin)
    message = str(failure.value)
    assert "chpart build" in message and "exited with code 4 (permanent failure)" in message, message[:3000]
    assert "`id`" in message and "Int64" in message, message[:3000]
    [entry] = chpart_spark.status(chpart_config, load_id="bad-load", chpart=chpart_bin)
    assert entry["state"] == "aborted", entry
    # The load is closed for good: running it again is refused by `chpart begin` (exit 5).
    with pytest.raises(chpart_spark.ChpartError) as fenced:
        chpart_spark.write(bad, table=TABLE, load_id="bad-load", config=chpart_config, chpart=chpart_bin)
    assert fenced.value.exit_code == 5, fenced.value
    assert int(clickhouse.scalar(f"SELECT count() FROM {TABLE}")) == 0
    assert clickhouse.rows("SELECT name FROM system.detached_parts WHERE database = 'db'") == []
    assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, "bad-load")
