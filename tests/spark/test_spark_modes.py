"""Save modes of the JVM connector (`format("chpart")`) under real Spark 4.3 against a real
ClickHouse 26.9 engine (README, "Save modes"):

- overwrite replaces exactly the table partitions the rows fall into, each atomically, while a
  reader polls the table: every read sees, per partition, the old rows or the new ones, never a
  mix, and the partition the write has no rows for is never touched;
- errorifexists creates the missing table from the options and the Spark schema (the type
  mapping), then loads exactly once; once the table exists the same write is refused;
- errorifexists (also Spark's default mode) on an existing table is refused before anything is
  written, and ignore writes nothing.

Each scenario's driver is tests/spark/modes_job.py, in a process of its own (the jar must be on
the JVM's classpath from its start).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import chpart_spark
from datasets import create_table_sql, day_id
from helpers import assert_exactly_once, assert_gc_leaves_nothing, load_status
from scenarios import TABLE, run_logged

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = 30_000
DRIVER_TIMEOUT = 300


def start_driver(tmp_path, scenario, config, chpart, jar, rows=ROWS):
    work = tmp_path / scenario
    work.mkdir()
    out = work / "result.json"
    argv = [sys.executable, os.path.join(HERE, "modes_job.py"), "--scenario", scenario, "--jar", jar,
            "--config", config, "--chpart", chpart, "--table", TABLE, "--rows", str(rows), "--work", str(work),
            "--out", str(out)]
    return work, out, argv


def result_of(work, out, returncode):
    log = (work / "driver.log").read_text()
    result = json.loads(out.read_text()) if out.exists() else {}
    if returncode != 0 or not result.get("ok"):
        pytest.fail(f"the driver failed (exit {returncode}): {result.get('traceback')}\n{log[-6000:]}",
                    pytrace=False)
    return result, log


def run_driver(tmp_path, scenario, config, chpart, jar):
    work, out, argv = start_driver(tmp_path, scenario, config, chpart, jar)
    returncode = run_logged(argv, work / "driver.log", DRIVER_TIMEOUT, f"the {scenario} driver")
    return result_of(work, out, returncode)


def checksum(c):
    return chpart_spark.Checksum(c["rows"], int(c["sum"]))


def day_where(day):
    return f"toYYYYMMDD(ts) = {day_id(day)}"


SNAPSHOT = (f"SELECT toYYYYMMDD(ts) AS d, count(), sum(cityHash64(id, user, amount)) FROM {TABLE} "
            "GROUP BY d ORDER BY d FORMAT TabSeparated")


def snapshot(clickhouse):
    """One read of the table: per partition (toYYYYMMDD), its rows and a hash sum."""
    return {line.split("\t")[0]: tuple(line.split("\t")[1:])
            for line in clickhouse.query(SNAPSHOT).splitlines() if line.strip()}


def test_overwrite_replaces_exactly_the_partitions_written_while_a_reader_polls(clickhouse, chpart_config,
                                                                                 chpart_bin, connector_jar,
                                                                                 tmp_path):
    """Three days appended (load base); then mode("overwrite") of new rows for days 0 and 1
    (load replace) while a thread reads the table as fast as it can. Every read: day 2 exactly
    as before; days 0 and 1 each exactly old or exactly new. After: days 0, 1 hold exactly the
    new source rows, day 2 the old ones."""
    clickhouse.query("CREATE DATABASE db")
    clickhouse.query(create_table_sql(TABLE))
    work, out, argv = start_driver(tmp_path, "overwrite", chpart_config, chpart_bin, connector_jar)
    log = open(work / "driver.log", "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + DRIVER_TIMEOUT
        while not (work / "base-loaded").exists():
            assert proc.poll() is None, f"the driver ended before the base load:\n{(work / 'driver.log').read_text()[-6000:]}"
            assert time.monotonic() < deadline, "the base load took too long"
            time.sleep(0.1)
        old = snapshot(clickhouse)
        assert sorted(old) == [day_id(d) for d in range(3)], old

        reads, stop = [], threading.Event()

        def reader():
            while not stop.is_set():
                reads.append((time.time(), snapshot(clickhouse)))

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        (work / "go").touch()
        returncode = proc.wait(max(1, deadline - time.monotonic()))
        time.sleep(0.5)  # a few reads after the end too
        stop.set()
        thread.join(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    result, _ = result_of(work, out, returncode)

    new = snapshot(clickhouse)
    assert new[day_id(2)] == old[day_id(2)] and new[day_id(0)] != old[day_id(0)] and new[day_id(1)] != old[day_id(1)], \
        (old, new)
    started, ended = result["replace_seconds"]
    during = [s for t, s in reads if started <= t <= ended]
    assert len(reads) >= 20 and len(during) >= 5, f"too few reads to judge: {len(reads)} ({len(during)} during)"
    seen = set()
    for t, s in reads:
        assert sorted(s) == [day_id(d) for d in range(3)], f"a read at {t} misses a partition: {s}"
        assert s[day_id(2)] == old[day_id(2)], f"a read at {t} saw the untouched day 2 change: {s} vs {old}"
        for d in (0, 1):
            state = s[day_id(d)]
            assert state in (old[day_id(d)], new[day_id(d)]), \
                f"a read at {t} saw day {d} neither old nor new (a mix): {state}; old {old}, new {new}"
            seen.add((d, "old" if state == old[day_id(d)] else "new"))
    assert {(0, "new"), (1, "new")} <= seen, seen
    print(f"overwrite: {len(reads)} reads, {len(during)} during the replace write, states seen {sorted(seen)}")

    # Exactly the sources: new rows in days 0 and 1, the base's in day 2.
    for d in (0, 1):
        assert_exactly_once(clickhouse, TABLE, checksum(result["new"][str(d)]), where=day_where(d))
    assert_exactly_once(clickhouse, TABLE, checksum(result["base"]["2"]), where=day_where(2))
    entry = load_status(chpart_config, chpart_bin, "replace")
    assert entry["state"] == "committed" and entry["mode"] == "replace", entry
    for load in ("base", "replace"):
        assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, load)
    assert snapshot(clickhouse) == new


def test_overwrite_table_swaps_the_whole_table_while_a_reader_polls(clickhouse, chpart_config, chpart_bin,
                                                                     connector_jar, tmp_path):
    """Three days appended (load base); then, while a thread reads the table as fast as it can,
    mode("overwrite") with option overwrite=table of two days of new rows (load snapshot:
    chpart's overwrite mode, EXCHANGE TABLES). Every read until then is exactly the old table or
    exactly the new one: never a mix, an empty table or day 2 without days 0 and 1. Then the
    base rows by mode("overwrite") without the option (load partitions, the default
    overwrite=partitions: chpart's replace mode of the three days). gc leaves no table of any
    load behind."""
    clickhouse.query("CREATE DATABASE db")
    clickhouse.query(create_table_sql(TABLE))
    work, out, argv = start_driver(tmp_path, "overwrite-table", chpart_config, chpart_bin, connector_jar)
    log = open(work / "driver.log", "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + DRIVER_TIMEOUT
        while not (work / "base-loaded").exists():
            assert proc.poll() is None, f"the driver ended before the base load:\n{(work / 'driver.log').read_text()[-6000:]}"
            assert time.monotonic() < deadline, "the base load took too long"
            time.sleep(0.1)
        old = snapshot(clickhouse)
        assert sorted(old) == [day_id(d) for d in range(3)], old
        reads, stop = [], threading.Event()

        def reader():
            while not stop.is_set():
                reads.append((time.time(), snapshot(clickhouse)))

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        (work / "go").touch()
        returncode = proc.wait(max(1, deadline - time.monotonic()))
        stop.set()
        thread.join(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    result, _ = result_of(work, out, returncode)
    new = {day_id(d): None for d in range(2)}
    started, ended = result["snapshot_seconds"]
    judged = [(t, s) for t, s in reads if t < result["partitions_started"]]
    during = [s for t, s in judged if started <= t <= ended]
    assert len(judged) >= 20 and len(during) >= 5, f"too few reads to judge: {len(judged)} ({len(during)} during)"
    states = set()
    for t, s in judged:
        if s == old:
            states.add("old")
            continue
        assert sorted(s) == sorted(new), f"a read at {t} saw neither the old table nor the new one: {s}"
        for d in range(2):
            assert s[day_id(d)][0] == str(result["new"][str(d)]["rows"]), f"a read at {t}: day {d} is not the snapshot's: {s}"
        states.add("new")
    assert states == {"old", "new"}, states
    print(f"overwrite=table: {len(judged)} reads ({len(during)} during the snapshot write), states seen {sorted(states)}")
    for load, mode in (("snapshot", "overwrite"), ("partitions", "replace")):
        entry = load_status(chpart_config, chpart_bin, load)
        assert entry["state"] == "committed" and entry["mode"] == mode, (load, entry)
    for d in range(3):
        assert_exactly_once(clickhouse, TABLE, checksum(result["base"][str(d)]), where=day_where(d))
    for load in ("base", "snapshot", "partitions"):
        assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, load)
    tables = clickhouse.query("SELECT name FROM system.tables WHERE database = 'db' ORDER BY name").split()
    assert tables == ["events"], f"gc left tables of the loads: {tables}"


def test_errorifexists_creates_the_table_then_loads_exactly_once(clickhouse, chpart_config, chpart_bin,
                                                               connector_jar, tmp_path):
    """mode("errorifexists") into db.events, which does not exist: the connector creates it
    (engine, ORDER BY, PARTITION BY, SETTINGS from the options; column types from the Spark
    schema by the README's mapping), loads the rows exactly once; the same write again is
    refused by Spark (the table exists) and begins no load; mode("ignore") into another
    missing table creates and loads it too."""
    # The tests' servers keep no query log; this one does, for the connector's User-Agent below.
    query_log = tmp_path / "query-log.xml"
    query_log.write_text("<query_log><database>system</database><table>query_log</table></query_log>\n")
    clickhouse.stop()
    clickhouse.start(config_extra=query_log)
    clickhouse.query("CREATE DATABASE db")
    result, log = run_driver(tmp_path, "create", chpart_config, chpart_bin, connector_jar)
    assert result["error"] is None, result["error"]
    columns = {r["name"]: r["type"] for r in clickhouse.rows(
        "SELECT name, type FROM system.columns WHERE database = 'db' AND table = 'events' ORDER BY position")}
    # The README's mapping: bigint, timestamp, string, double, boolean, int, date, decimal(p,s);
    # a column Spark calls nullable is Nullable(...), the key columns are not.
    mapped = {"id": "Int64", "ts": "DateTime64(6, 'UTC')", "user": "String", "kind": "String", "amount": "Float64",
              "flag": "Bool", "n": "Int32", "day": "Date32", "price": "Decimal(12, 2)", "note": "String"}
    nullable = result["nullable"]
    assert not (nullable["id"] or nullable["ts"] or nullable["kind"]) and nullable["amount"] and nullable["note"], \
        result["schema"]
    expected = {name: f"Nullable({t})" if nullable[name] else t for name, t in mapped.items()}
    assert columns == expected, (columns, result["schema"])
    [table] = clickhouse.rows("SELECT engine, partition_key, sorting_key, engine_full FROM system.tables "
                              "WHERE database = 'db' AND name = 'events'")
    assert (table["engine"], table["partition_key"], table["sorting_key"]) == ("MergeTree", "toYYYYMMDD(ts)", "kind, id"), table
    assert "index_granularity = 4096" in table["engine_full"], table
    source = checksum(result["source"])
    names = ", ".join(columns)
    loaded = chpart_spark.clickhouse_checksum(clickhouse.url, f"SELECT {names} FROM {TABLE}")
    assert loaded == source, (loaded, source)
    assert int(clickhouse.scalar(f"SELECT count() FROM {TABLE}")) == ROWS
    entry = load_status(chpart_config, chpart_bin, "create")
    assert entry["state"] == "committed" and entry["rows"] == ROWS, entry
    # The connector's own catalog statements name it in the server's query log, as chpart's
    # commands do (docs/operations.md): chpart-spark/<the version of the chpart the jar carries>.
    version = subprocess.run([chpart_bin, "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
    clickhouse.query("SYSTEM FLUSH LOGS")
    agents = {(r["kind"], r["agent"]) for r in clickhouse.rows(
        "SELECT splitByChar(' ', query)[1] AS kind, http_user_agent AS agent FROM system.query_log "
        "WHERE type = 'QueryFinish' AND (query LIKE 'EXISTS TABLE `db`.`events`%' "
        "OR query LIKE 'CREATE TABLE `db`.`events`%')")}
    assert agents == {("EXISTS", f"chpart-spark/{version}"), ("CREATE", f"chpart-spark/{version}")}, agents

    again = result["again_error"]
    assert again and "TABLE_OR_VIEW_ALREADY_EXISTS" in again, again
    assert "create-again" not in {e["load"] for e in chpart_spark.status(chpart_config, chpart=chpart_bin)}
    assert loaded == chpart_spark.clickhouse_checksum(clickhouse.url, f"SELECT {names} FROM {TABLE}")
    # mode("ignore") into a missing table creates and loads it the same way.
    assert result["ignore_error"] is None, result["ignore_error"]
    ignored = clickhouse.rows("SELECT name, type FROM system.columns WHERE database = 'db' AND table = 'events_ignore' "
                              "ORDER BY position")
    assert {r["name"]: r["type"] for r in ignored} == expected, ignored
    assert chpart_spark.clickhouse_checksum(clickhouse.url, f"SELECT {names} FROM {TABLE}_ignore") == source
    for load in ("create", "create-ignore"):
        assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, load)


def test_errorifexists_refuses_and_ignore_skips_an_existing_table(clickhouse, chpart_config, chpart_bin,
                                                                   connector_jar, tmp_path):
    """db.events exists with rows INSERTed by ClickHouse: mode("errorifexists") and Spark's
    default mode are refused before anything runs (no chpart load begins, no part is built),
    mode("ignore") writes nothing; the table is as it was."""
    clickhouse.query("CREATE DATABASE db")
    clickhouse.query(create_table_sql(TABLE))
    clickhouse.query(f"INSERT INTO {TABLE} SELECT number, toDateTime64('2026-01-01 00:00:00', 6, 'UTC') + number, "
                     "'u', 'view', number / 2, number % 2 FROM numbers(1000)")
    before = snapshot(clickhouse)
    result, log = run_driver(tmp_path, "existing", chpart_config, chpart_bin, connector_jar)
    for key in ("errorifexists_error", "default_mode_error"):
        assert result[key] and "TABLE_OR_VIEW_ALREADY_EXISTS" in result[key], (key, result[key])
    assert result["ignore_error"] is None, result["ignore_error"]
    assert snapshot(clickhouse) == before
    # Nothing of chpart ran: no load in the ledger, nothing detached, no staging.
    loads = chpart_spark.status(chpart_config, chpart=chpart_bin)
    assert loads == [], loads
    assert clickhouse.rows("SELECT name FROM system.detached_parts WHERE database = 'db'") == []
    staging = clickhouse.staging_root
    assert not staging.exists() or list(staging.iterdir()) == [], list(staging.iterdir())
    assert "chpart build" not in log and "opened on" not in log, log[-3000:]


def winners_partitions(clickhouse, config, chpart, load):
    """Per winning attempt of `load`: the table partition of each part it built (its manifest,
    still in staging until gc)."""
    entry = load_status(config, chpart, load)
    out = {}
    for _, attempt in entry["winners"]:
        path = clickhouse.staging_root / load / attempt / "manifest.json"
        manifest = json.loads(path.read_text())
        out[attempt] = [p["partition_id"] for p in manifest["parts"]]
    return out


def parts_per_partition(clickhouse, table):
    return {r["partition_id"]: int(r["parts"]) for r in clickhouse.rows(
        f"SELECT partition_id, count() AS parts FROM system.parts WHERE database = 'db' AND table = '{table}' "
        "AND active GROUP BY partition_id ORDER BY partition_id")}


def test_layout_clusters_each_table_partition_into_one_task(clickhouse, chpart_config, chpart_bin, connector_jar,
                                                            tmp_path):
    """Rows of 3 days dealt round-robin over 4 Spark tasks (every task holds every day), merges
    stopped so that the parts are the ones the tasks built:

    - PARTITION BY toYYYYMMDD(ts), df.write.format("chpart"): Spark clusters by the connector's
      chpart_toyyyymmdd(ts, 'UTC') (resolved in the chpart catalog): 1 part per partition;
      the same with layout=none: 4 per partition (one per task);
    - PARTITION BY kind (a plain column): clustered by kind, 1 part per partition;
    - PARTITION BY toStartOfHour(ts) with ts DateTime64(6, 'Asia/Kolkata') (hours start at :30
      UTC), df.writeTo through a registered catalog: 1 part per partition (73 hours);
    - SQL INSERT INTO a session-catalog table USING chpart (PARTITION BY toYYYYMMDD(ts)): Spark
      resolves functions in the session catalog there, which has none of chpart's, so the write
      keeps the range layout over ts: at most 2 parts per partition, and the log says why;
    - option target_part_bytes=1: adaptive execution splits each day over the 4 map outputs,
      each task builds one part of it: more than 1 and at most 4 parts per partition; refused
      with layout=none and when not a positive number, naming the option.

    Every table holds exactly the source rows."""
    clickhouse.query("CREATE DATABASE db")
    for table in (TABLE, TABLE + "_plain", TABLE + "_sql", TABLE + "_split"):
        clickhouse.query(create_table_sql(table))
    clickhouse.query(create_table_sql(TABLE + "_by_kind").replace("PARTITION BY toYYYYMMDD(ts) ORDER BY (kind, id)",
                                                                 "PARTITION BY kind ORDER BY (ts, id)"))
    clickhouse.query(create_table_sql(TABLE + "_hourly").replace("PARTITION BY toYYYYMMDD(ts)",
                                                                "PARTITION BY toStartOfHour(ts)")
                     .replace("DateTime64(6, 'UTC')", "DateTime64(6, 'Asia/Kolkata')"))
    for suffix in ("", "_plain", "_sql", "_by_kind", "_hourly", "_split"):
        clickhouse.query(f"SYSTEM STOP MERGES {TABLE}{suffix}")
    result, log = run_driver(tmp_path, "layout", chpart_config, chpart_bin, connector_jar)
    source = checksum(result["source"])
    for suffix in ("", "_plain", "_sql", "_by_kind", "_hourly", "_split"):
        assert_exactly_once(clickhouse, TABLE + suffix, source)

    days = [day_id(d) for d in range(3)]
    measured = {}
    for load, table in (("clustered", "events"), ("plain", "events_plain"), ("by-kind", "events_by_kind"),
                        ("hourly", "events_hourly"), ("sql", "events_sql"), ("split", "events_split")):
        tasks = winners_partitions(clickhouse, chpart_config, chpart_bin, load)
        per_partition = parts_per_partition(clickhouse, table)
        # Merges are stopped: the table's parts are exactly the ones the winning tasks built.
        assert sum(per_partition.values()) == sum(len(p) for p in tasks.values()), (load, per_partition, tasks)
        for attempt, partitions in tasks.items():
            assert len(partitions) == len(set(partitions)), f"{load}: {attempt} built two parts of one partition"
        measured[load] = per_partition
    assert sorted(measured["clustered"]) == days and sorted(measured["plain"]) == days, measured
    assert measured["plain"] == {d: 4 for d in days}, measured["plain"]
    assert measured["clustered"] == {d: 1 for d in days}, measured["clustered"]
    assert len(measured["by-kind"]) == 4 and set(measured["by-kind"].values()) == {1}, measured["by-kind"]
    # 3 days from 00:00 UTC are 73 hours in Asia/Kolkata (UTC+5:30): each hour in one task.
    assert len(measured["hourly"]) == 73 and set(measured["hourly"].values()) == {1}, measured["hourly"]
    assert sorted(measured["sql"]) == days and all(n <= 2 for n in measured["sql"].values()), measured["sql"]
    assert sorted(measured["split"]) == days and all(1 < n <= 4 for n in measured["split"].values()), measured["split"]
    assert "option target_part_bytes needs layout=table" in (result["target_with_none_error"] or ""), result
    assert 'option target_part_bytes must be a positive number of bytes; got "1GB"' in (
        result["target_not_a_number_error"] or ""), result
    assert "clustered by partition key toYYYYMMDD(ts) as [chpart_toyyyymmdd(ts, 'UTC')]" in log, log[-4000:]
    assert "clustered by partition key toStartOfHour(ts) as [chpart_tostartofhour(ts, 'Asia/Kolkata')]" in log
    assert "not clustered by: the table is not one of a chpart catalog" in log, log[-4000:]
    print("layout: parts per table partition: " + ", ".join(
        f"{load} {sorted(set(p.values()))} over {len(p)} partitions" for load, p in measured.items()))
    for load in ("clustered", "plain", "by-kind", "hourly", "sql", "split"):
        assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, load)


def test_partition_functions_compute_what_clickhouse_computes(clickhouse, chpart_config, chpart_bin, connector_jar,
                                                               tmp_path):
    """A scenario table: the connector's partition-key functions (what the layout clusters by),
    evaluated by Spark SQL through the chpart catalog over instants at day, month, year and DST
    boundaries in 4 time zones (and before the epoch), the dates of those instants, and
    integers around multiples of the divisor, equal ClickHouse's own functions of the same
    values, row by row."""
    result, _ = run_driver(tmp_path, "functions", chpart_config, chpart_bin, connector_jar)
    mismatches = []
    for key, rows in result["values"].items():
        parts = key.split("|")
        if len(parts) == 2:
            f, d = parts
            expr = f"{f}(x, {d})"
        else:
            f, zone, of = parts
            if f == "toStartOfHour" and of == "date":
                continue  # ClickHouse has no toStartOfHour of a Date: no table has that key
            # Spark's to_date of a TIMESTAMP is its day in the session's zone (UTC): a Date32 here.
            arg = (f"fromUnixTimestamp64Micro(x, '{zone}')" if of == "ts"
                   else "toDate32(fromUnixTimestamp64Micro(x, 'UTC'))")
            expr = f"{f}({arg}, '{zone}')" if of == "ts" or f in ("toStartOfDay", "toStartOfHour") else f"{f}({arg})"
            if f in ("toStartOfDay", "toStartOfHour"):
                expr = f"intDiv(toUnixTimestamp64Micro(toDateTime64({expr}, 6, '{zone}')), 1000000)"
        xs = ", ".join(f"toInt64({x})" for x, _ in rows)
        got = dict(line.split("\t") for line in clickhouse.query(
            f"SELECT x, {expr} FROM (SELECT arrayJoin([{xs}]) AS x) FORMAT TabSeparated").splitlines())
        for x, spark_value in rows:
            if got[str(x)] != spark_value:
                mismatches.append((key, x, spark_value, got[str(x)]))
    checked = sum(len(rows) for key, rows in result["values"].items() if not key.startswith("toStartOfHour|")
                  or key.endswith("|ts"))
    assert not mismatches, (f"{len(mismatches)} of {checked} differ, in {sorted({m[0] for m in mismatches})}: "
                            f"{mismatches[:10]}")
    print(f"partition functions: {checked} values equal ClickHouse's")


def test_a_registered_catalog_takes_write_to_and_sql_insert_overwrite(clickhouse, chpart_config, chpart_bin,
                                                                     connector_jar, tmp_path):
    """spark.sql.catalog.chpart = chpart.spark.ChpartCatalog (with its config): df.writeTo(
    "chpart.db.events").append() loads 3 days; SQL INSERT OVERWRITE chpart.db.events with rows
    of day 1 replaces day 1 only (chpart's replace mode) and keeps days 0 and 2; a table that
    does not exist is Spark's TABLE_OR_VIEW_NOT_FOUND."""
    clickhouse.query("CREATE DATABASE db")
    clickhouse.query(create_table_sql(TABLE))
    result, _ = run_driver(tmp_path, "catalog", chpart_config, chpart_bin, connector_jar)
    for d in (0, 2):
        assert_exactly_once(clickhouse, TABLE, checksum(result["base"][str(d)]), where=day_where(d))
    assert_exactly_once(clickhouse, TABLE, checksum(result["new"]["1"]), where=day_where(1))
    loads = {e["load"]: e for e in chpart_spark.status(chpart_config, chpart=chpart_bin)}
    assert loads["write-to"]["state"] == "committed" and loads["write-to"]["mode"] == "append", loads
    [replace] = [e for name, e in loads.items() if name != "write-to"]
    assert replace["state"] == "committed" and replace["mode"] == "replace", replace
    assert result["missing_error"] and "TABLE_OR_VIEW_NOT_FOUND" in result["missing_error"], result["missing_error"]
    for load in loads:
        assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, load)
