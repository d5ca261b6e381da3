"""Assertions shared by the Spark end-to-end tests."""

import json
import os
import re

import chpart_spark
from chpart_testing import task_attempts
from datasets import COLUMNS
from failure_jobs import eventlog


def table_checksum(clickhouse, table, where=""):
    query = f"SELECT {', '.join(COLUMNS)} FROM {table}" + (f" WHERE {where}" if where else "")
    return chpart_spark.clickhouse_checksum(clickhouse.url, query)


def assert_exactly_once(clickhouse, table, source, where=""):
    """The table (or its rows matching `where`) holds exactly the source rows: same count,
    same order-independent checksum over every column."""
    count = int(clickhouse.scalar(f"SELECT count() FROM {table}" + (f" WHERE {where}" if where else "")))
    loaded = table_checksum(clickhouse, table, where)
    assert count == source.rows, f"{table} {where}: {count} rows, the source has {source.rows}"
    assert loaded == source, f"{table} {where}: checksum {loaded} != source {source}"


def load_status(config, chpart, load):
    [entry] = chpart_spark.status(config, load_id=load, chpart=chpart)
    return entry


def assert_winners_and_losers(entry, summary_winners, losers):
    """`chpart status` names the winning attempts (exactly the commit's) and every losing one."""
    assert entry["state"] == "committed", entry
    assert sorted(map(tuple, entry["winners"])) == sorted(map(tuple, summary_winners)), entry
    attempts = {a["attempt"]: a for a in entry["attempts"]}
    for _, winner in summary_winners:
        assert attempts[winner]["won"] is True, (winner, entry)
        assert attempts[winner]["completed"] is True, (winner, entry)
    for loser in losers:
        assert loser in attempts, f"status does not name the losing attempt {loser}: {entry}"
        assert attempts[loser]["won"] is False, (loser, entry)
        assert attempts[loser]["completed"] is True, f"the loser published before failing: {entry}"


def assert_gc_leaves_nothing(clickhouse, config, chpart, load, database="db"):
    """After `chpart gc`: no detached part in the database (target and shadow tables), no shadow
    table, nothing under the load's staging directory, and status has nothing left to remove."""
    report = chpart_spark.gc(config, chpart=chpart)
    assert any(name == load for name, _ in report["removed"]) or report["removed"] == [], report
    detached = clickhouse.rows(
        f"SELECT table, name, reason FROM system.detached_parts WHERE database = '{database}'")
    assert detached == [], f"left in detached/ after gc: {detached}"
    shadows = clickhouse.rows(
        f"SELECT name FROM system.tables WHERE database = '{database}' AND name LIKE '%\\_\\_chpart\\_%'")
    assert shadows == [], f"shadow tables left after gc: {shadows}"
    staging = os.path.join(str(clickhouse.staging_root), load)
    left = [os.path.join(d, f) for d, _, files in os.walk(staging) for f in files]
    assert left == [], f"staging files left after gc: {left}"
    entry = load_status(config, chpart, load)
    assert entry["gc_pending"] == [], entry
    return report


def failed_attempts(event_dir, app_id):
    """Spark's own record (the event log) of the task attempts that failed."""
    return [a for a in task_attempts(event_dir, app_id) if a["failed"]]


def read_marker(path):
    with open(path) as f:
        return json.load(f)


def committed_winners(driver_log, load):
    """The winners the connector logged on the driver when it committed `load`."""
    pattern = re.compile(rf"chpart load {re.escape(load)} committed into \S+: (\d+) rows .* winners (\[.*\]); commit")
    found = [m for m in map(pattern.search, driver_log.splitlines()) if m]
    assert len(found) == 1, f"the driver log must name the committed load once:\n{driver_log[-4000:]}"
    return json.loads(found[0].group(2))


def commit_denied(task, partition):
    """Whether Spark's commit coordinator denied this task attempt. Spark 4.3's DSv2 writer
    reports a denial as an ExceptionFailure ("Commit denied for partition ..."), not as
    TaskCommitDenied like the Hadoop writers: it counts towards spark.task.maxFailures."""
    return task["reason"] == "ExceptionFailure" and task["message"].startswith(f"Commit denied for partition {partition} ")


def check_connector_metrics(r, rows, entry):
    """The write node's DSv2 metrics in the event log: per task the rows streamed (successful
    attempts: each row once), after the commit the winners' rows, parts, bytes and times."""
    metrics = eventlog.custom_metrics(r["event_dir"], r["application_id"], "chpart.spark.")
    value = lambda name: metrics[name]["driver"]  # noqa: E731
    assert metrics["rows streamed to chpart build (every task attempt)"]["tasks"] == rows, metrics
    assert metrics["Arrow bytes streamed to chpart build (every task attempt)"]["tasks"] > rows, metrics
    assert value("rows loaded (winning attempts' parts)") == rows, metrics
    assert value("parts loaded (winning attempts)") == entry["parts_planned"], (metrics, entry)
    assert value("bytes on disk loaded (winning attempts' parts)") > 0, metrics
    for timing in ("build", "upload", "publish"):
        assert value(f"chpart {timing} time, winning attempts (total)") > 0, metrics
    assert value("chpart commit time") > 0, metrics
