"""End-to-end with real Spark (pyspark 4.3.0) into a `Distributed` table over three shards, each
a real ClickHouse 26.9 server on a loopback address of its own (cluster_fixture.py).

chpart_spark.write opens a cluster load (one sub-load `<load>.shard<N>` per shard); every task's
`chpart build` routes its rows to the shards inside clickhouse-local, publishes each shard's
parts on that shard's host and prints one cluster manifest, which is what Spark collects and
`chpart commit` takes. The failures are the ones Spark itself makes (failure_jobs/run_job.py),
so what is checked per shard is what a single server's test checks for its table.
"""

import json
import os

import pytest

import chpart_spark
from conftest import ROOT
from cluster_fixture import (CLUSTER, LOCAL_TABLE, SHARDING_KEY, TABLE, TWIN_LOCAL_TABLE, TWIN_TABLE,  # noqa: F401
                             three_shard_cluster)
from datasets import create_table_sql, day_id, events
from failure_jobs import eventlog, probe
from helpers import (assert_exactly_once, assert_winners_and_losers, check_connector_metrics, committed_winners,
                     load_status)
from scenarios import check_zombie_run, run_scenario, source_of


def assert_rows_where_clickhouse_routes_them(cluster, plan, source_rows):
    """Every row of every shard's local table is one the Distributed engine routes to that shard
    (the routing expression `chpart plan` reports, evaluated on the shard), the shards together
    hold the source's row count, and each shard equals its twin: the same rows inserted through
    the Distributed table itself (`insert_distributed_sync = 1`). Returns the rows per shard."""
    routing = plan["routing"]
    counts = {}
    for node in cluster.nodes:
        misplaced = int(node.scalar(f"SELECT count() FROM {LOCAL_TABLE} WHERE ({routing}) != {node.shard_num}"))
        assert misplaced == 0, f"shard {node.shard_num} holds {misplaced} rows routed elsewhere by {routing}"
        counts[node.shard_num] = int(node.scalar(f"SELECT count() FROM {LOCAL_TABLE}"))
    assert sum(counts.values()) == source_rows, counts
    # Weights 1/2/3 over 40 000 consecutive ids: every shard has rows, about 1/6, 2/6, 3/6.
    assert all(counts[n.shard_num] > 0 for n in cluster.nodes), counts
    cluster.entry.query(f"INSERT INTO {TWIN_TABLE} SELECT * FROM {TABLE} SETTINGS insert_distributed_sync = 1")
    for node in cluster.nodes:
        loaded = cluster.fingerprint(node.shard_num, LOCAL_TABLE)
        twin = cluster.fingerprint(node.shard_num, TWIN_LOCAL_TABLE)
        assert loaded == twin, f"shard {node.shard_num}: {loaded} loaded, {twin} where INSERT puts the same rows"
    return counts


def assert_cluster_gc_leaves_nothing(cluster, chpart, load, *more_loads):
    """After `chpart gc`: on every shard no detached part in `db`, no shadow table, no file under
    the host's staging root; `status` of the load(s) and of every sub-load has nothing left to
    remove. Returns gc's report."""
    loads = (load, *more_loads)
    subs = [cluster.sub_load(name, n.shard_num) for name in loads for n in cluster.nodes]
    report = chpart_spark.gc(cluster.config, chpart=chpart)
    assert {name for name, _ in report["removed"]} <= {*loads, *subs}, report
    for node in cluster.nodes:
        n = node.shard_num
        assert cluster.detached(n) == {}, f"left in detached/ on shard {n} after gc: {cluster.detached(n)}"
        assert cluster.shadow_tables(n) == [], f"shadow tables left on shard {n} after gc"
        assert cluster.staged_files(n) == [], f"staging files left on shard {n} after gc"
    for name in (*loads, *subs):
        entry = load_status(cluster.config, chpart, name)
        assert entry["gc_pending"] == [], entry
    return report


def test_stage_retry_with_zombies_into_a_distributed_table(three_shard_cluster, chpart_bin, tmp_path):
    """The seed 002 scenario (test_spark_failures.py::test_stage_retry_with_zombies_that_publish_late)
    through chpart_spark.write into `db.events`, Distributed over three shards of weights 1, 2, 3
    with a signed key: the write stage is retried after a FetchFailed, the retries of partitions
    0 and 1 win while their zombies of stage attempt 0 still run; zombie 0 publishes on every
    shard after collect() returned and before the commit (a loser on every shard: never
    attached, removed by gc), zombie 1 reaches publish after the commit and is fenced (exit 5).
    Every shard then holds exactly the rows ClickHouse routes to it, and nothing else."""
    cluster = three_shard_cluster
    plan = cluster.plan(chpart_bin)
    assert (plan["engine"], plan["local"], plan["key_type"]) == ("Distributed", LOCAL_TABLE, "Int64"), plan
    assert [(h["shard_num"], h["weight"], h["host"]) for h in plan["hosts"]] == \
        [(n.shard_num, n.weight, n.address) for n in cluster.nodes], plan
    assert [[d["staging_root"] for d in h["disks"]] for h in plan["hosts"]] == \
        [[str(n.staging_root)] for n in cluster.nodes], plan
    load = "zombie-cluster-load"
    subs = {n.shard_num: cluster.sub_load(load, n.shard_num) for n in cluster.nodes}

    r = run_scenario(tmp_path, "zombie", cluster.config, chpart_bin, load, rows=40_000, table=TABLE)
    loser, fenced = check_zombie_run(r)

    # Exactly the source rows, read through the Distributed table ...
    source = source_of(r)
    assert r["summary"]["rows"] == source.rows and r["summary"]["table"] == TABLE, r["summary"]
    assert_exactly_once(cluster.entry, TABLE, source)
    # ... each on the shard ClickHouse routes it to.
    per_shard = assert_rows_where_clickhouse_routes_them(cluster, plan, source.rows)

    # status: the cluster load is committed with the write's winners on every shard, and lists
    # its attempts under its shards' sub-loads only.
    winners = r["summary"]["winners"]
    entry = load_status(cluster.config, chpart_bin, load)
    assert entry["state"] == "committed" and entry["attempts"] == [], entry
    assert sorted(map(tuple, entry["winners"])) == sorted(map(tuple, winners)), entry
    assert [(s["shard_num"], s["host"], s["load"], s["state"]) for s in entry["shards"]] == \
        [(n.shard_num, n.address, subs[n.shard_num], "committed") for n in cluster.nodes], entry
    for s in entry["shards"]:
        assert s["rows"] == per_shard[s["shard_num"]] and s["parts_attached"] == s["parts_planned"], entry

    # Per shard: the sub-load names the same winners and zombie 0 as a completed loser, whose
    # parts (per the manifest it staged on that shard's host) wait in detached/ until gc; the
    # fenced zombie 1 left no staging on any host.
    zombie0_rows, loser_parts = 0, {}
    for node in cluster.nodes:
        n = node.shard_num
        sub = load_status(cluster.config, chpart_bin, subs[n])
        assert_winners_and_losers(sub, winners, losers=[loser])
        assert sub["rows"] == per_shard[n], sub
        assert fenced not in {a["attempt"] for a in sub["attempts"]}, f"the fenced build left its staging: {sub}"
        assert sub["gc_pending"], f"the loser's parts on shard {n} are for gc to remove: {sub}"
        staged = cluster.staged_manifest(load, n, loser)
        assert (staged["load"], staged["attempt"]["id"], staged["target"]["host"]) == (subs[n], loser, node.address)
        names = [p["name"] for p in staged["parts"]]
        detached = cluster.detached(n)
        assert names and set(names) <= set(detached), \
            f"the parts of {loser} must wait in detached/ on shard {n} until gc: {names}, detached {detached}"
        zombie0_rows += staged["source_rows"]
        loser_parts[n] = len(names)
    # The loser built its whole partition (routed over the shards), as the zombie task read it.
    assert zombie0_rows == r["ctrl"]["zombie-0.json"]["rows"] > 0, (zombie0_rows, r["ctrl"]["zombie-0.json"])

    report = assert_cluster_gc_leaves_nothing(cluster, chpart_bin, load)
    print(f"rows per shard {per_shard}; loser {loser}: parts per shard {loser_parts}; "
          f"gc removed {[(name, len(items)) for name, items in report['removed']]}")
    assert_exactly_once(cluster.entry, TABLE, source)
    for node in cluster.nodes:
        assert int(node.scalar(f"SELECT count() FROM {LOCAL_TABLE}")) == per_shard[node.shard_num]


def stop_before_first_commit(tmp_path, chpart_bin, node):
    """A chpart stand-in that runs the real chpart, but stops `node`'s server before the first
    `chpart commit` (once, marked by a directory created atomically)."""
    path = tmp_path / "chpart-stop-before-commit"
    marker = tmp_path / "stopped-before-commit"
    path.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = commit ] && mkdir "{marker}" 2>/dev/null; then\n'
        f'  "{ROOT / "deploy" / "dev" / "clickhouse-server"}" stop --run-dir "{node.run_dir}" >&2\n'
        "fi\n"
        f'exec "{chpart_bin}" "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_rerun_after_a_shard_was_down_at_commit_resumes_the_recorded_plan(three_shard_cluster, spark, chpart_bin,
                                                                          tmp_path, monkeypatch):
    """write() whose commit finds shard 3 down: the commit records the cluster plan (the
    winners), prepares shards 1 and 2, stops at shard 3 with nothing visible anywhere, and
    write() raises CommitError (retryable, retried, still down). Shard 3 comes back and the same
    write() is run again: it must finish the recorded plan from the ledger (no Spark job: a new
    job's winners would conflict with the recorded ones), exactly once, every row where
    ClickHouse routes it."""
    cluster = three_shard_cluster
    plan = cluster.plan(chpart_bin)
    down = cluster.node(3)
    load = "shard-down-load"
    df = events(spark, rows=20_000, partitions=4)
    source = chpart_spark.spark_checksum(df)

    # Each `chpart commit` retries the down shard until its retry deadline (30 s by default) and
    # write() runs it three times: a deadline of 1 s keeps the same steps (a few retries, then
    # the deadline) and saves about 85 s.
    monkeypatch.setenv("CHPART_RETRY_DEADLINE_SECS", "1")
    with pytest.raises(chpart_spark.CommitError) as failed:
        chpart_spark.write(df, table=TABLE, load_id=load, config=cluster.config,
                           chpart=stop_before_first_commit(tmp_path, chpart_bin, down))
    monkeypatch.delenv("CHPART_RETRY_DEADLINE_SECS")
    assert failed.value.exit_code == 3 and "shard 3" in str(failed.value), failed.value
    with open(failed.value.winners_path) as f:
        collected = sorted((json.loads(line)["attempt"]["partition"], json.loads(line)["attempt"]["id"])
                           for line in f if line.strip())
    os.unlink(failed.value.winners_path)  # kept by write() for a manual resume; not needed
    assert [p for p, _ in collected] == [0, 1, 2, 3], collected
    for node in cluster.nodes[:2]:
        assert node.scalar(f"SELECT count() FROM {LOCAL_TABLE}") == "0", f"rows visible on shard {node.shard_num}"
    # What a re-run sees: the cluster plan's winners are recorded, shard 3 has no plan yet.
    entry = load_status(cluster.config, chpart_bin, load)
    assert entry["state"] == "open" and entry["decision"] is None, entry
    assert sorted(map(tuple, entry["winners"])) == collected, entry
    assert [s["parts_planned"] is not None for s in entry["shards"]] == [True, True, False], entry

    down.restart()
    summary = chpart_spark.write(df, table=TABLE, load_id=load, config=cluster.config, chpart=chpart_bin)
    assert summary["resumed"] is True and summary["seconds"]["job"] == 0.0, summary
    assert sorted(map(tuple, summary["winners"])) == collected, summary
    assert summary["rows"] == source.rows, summary
    assert_exactly_once(cluster.entry, TABLE, source)
    assert_rows_where_clickhouse_routes_them(cluster, plan, source.rows)
    assert_cluster_gc_leaves_nothing(cluster, chpart_bin, load)
    assert_exactly_once(cluster.entry, TABLE, source)


def test_connector_task_retry_into_a_distributed_table(three_shard_cluster, chpart_bin, connector_jar, tmp_path):
    """The JVM connector, df.write.format("chpart") from PySpark, into `db.events` Distributed
    over three shards: every task's build prints the cluster manifest, which the connector
    hands to `chpart commit` unchanged. The first attempt of partition 1 fails after it
    published on every shard (a loser on every shard, removed by gc) and its retry wins. Every
    shard holds exactly the rows ClickHouse routes to it. A second load whose rows every build
    refuses fails with chpart's message and is aborted on every shard."""
    cluster = three_shard_cluster
    plan = cluster.plan(chpart_bin)
    load = "connector-cluster-load"
    r = run_scenario(tmp_path, "connector-retry", cluster.config, chpart_bin, load, rows=40_000, table=TABLE,
                     jar=connector_jar)
    loser = r["ctrl"]["fail-after-publish.json"]["attempt"]
    tasks = eventlog.tasks(r["event_dir"], r["application_id"])
    [write_stage] = {t["stage"] for t in tasks if t["task_id"] == r["ctrl"]["fail-after-publish.json"]["task_attempt_id"]}
    failed = [t for t in tasks if t["stage"] == write_stage and not t["success"]]
    assert [(t["partition"], t["attempt"]) for t in failed] == [(1, 0)], eventlog.describe(tasks)
    assert "exited with code 3 (retryable failure)" in failed[0]["message"], failed[0]

    # The connector's winners are the cluster load's, and the retry won partition 1.
    winners = committed_winners((tmp_path / "connector-retry.log").read_text(), load)
    entry = load_status(cluster.config, chpart_bin, load)
    assert entry["state"] == "committed" and sorted(map(tuple, entry["winners"])) == sorted(map(tuple, winners)), entry
    assert sorted(dict(winners)) == [0, 1, 2, 3] and loser not in dict(winners).values(), (winners, loser)

    source = source_of(r)
    assert_exactly_once(cluster.entry, TABLE, source)
    per_shard = assert_rows_where_clickhouse_routes_them(cluster, plan, source.rows)
    # Per shard: the sub-load has the same winners and the failed attempt as a completed loser,
    # whose parts wait in detached/ until gc.
    for node in cluster.nodes:
        n = node.shard_num
        sub = load_status(cluster.config, chpart_bin, cluster.sub_load(load, n))
        assert_winners_and_losers(sub, winners, losers=[loser])
        assert sub["rows"] == per_shard[n], sub
        names = [p["name"] for p in cluster.staged_manifest(load, n, loser)["parts"]]
        assert names and set(names) <= set(cluster.detached(n)), (n, names, cluster.detached(n))
    check_connector_metrics(r, source.rows, entry)

    bad = r["permanent"]
    assert bad["error"] and "exited with code 4 (permanent failure)" in bad["error"], bad["error"]
    assert bad["state"] == "aborted" and bad["table_rows"] == source.rows, bad
    assert_cluster_gc_leaves_nothing(cluster, chpart_bin, load)
    assert_cluster_gc_leaves_nothing(cluster, chpart_bin, f"{load}-bad")
    assert_exactly_once(cluster.entry, TABLE, source)


def parts_per_partition_and_shard(cluster, local_table):
    """{(table partition, shard): active parts} over every shard's local table."""
    database, name = local_table.split(".")
    return {(r["partition_id"], node.shard_num): int(r["parts"]) for node in cluster.nodes for r in node.rows(
        f"SELECT partition_id, count() AS parts FROM system.parts WHERE database = '{database}' AND table = '{name}' "
        "AND active GROUP BY partition_id")}


def test_write_through_the_connector_one_part_per_partition_per_shard(three_shard_cluster, chpart_bin, connector_jar,
                                                                      tmp_path):
    """chpart_spark.write(df, ...) without `via`, in a session with the connector's jar, into
    `db.events` Distributed over three shards, merges stopped on every shard: it writes through
    df.write.format("chpart") with the connector's default layout. The first build that
    publishes a part fails after publishing; Spark retries it and the retry wins (a loser on
    every shard, removed by gc). Every row exactly once, where ClickHouse routes it.

    Parts: the layout clusters the rows by the table's partition key (toYYYYMMDD(ts)), so each
    day is in one task, and that task's build routes the day's rows to the shards inside
    clickhouse-local, one part per shard: exactly one part per (day, shard). The same rows with
    write(..., layout="none") (the connector's option: the source's 4 tasks of consecutive ids,
    each day spread over 2 of them) get 2."""
    cluster = three_shard_cluster
    plan = cluster.plan(chpart_bin)
    none_table, none_local = TABLE + "_none", LOCAL_TABLE + "_none"
    for node in cluster.nodes:
        node.query(create_table_sql(none_local))
    cluster.entry.query(f"CREATE TABLE {none_table} AS {none_local} "
                        f"ENGINE = Distributed({CLUSTER}, db, {none_local.split('.')[1]}, {SHARDING_KEY})")
    for node in cluster.nodes:
        for local in (LOCAL_TABLE, none_local):
            node.query(f"SYSTEM STOP MERGES {local}")
    load = "write-auto-cluster-load"
    r = run_scenario(tmp_path, "write-auto", cluster.config, chpart_bin, load, rows=40_000, table=TABLE,
                     jar=connector_jar, extra_args=["--layout-none-table", none_table])

    # The connector's path: write() says so and why, and the connector committed the load (its
    # driver log names the commit with exactly the winners write() reports).
    summary, log = r["summary"], (tmp_path / "write-auto.log").read_text()
    assert summary["via"] == "connector" and summary["table"] == TABLE, summary
    assert (f'load {load}: through the JVM connector, df.write.format("chpart"): the JVM connector '
            "(chpart.spark.ChpartDataSource) is on this session's classpath") in log, log[-4000:]
    winners = committed_winners(log, load)
    assert sorted(map(tuple, summary["winners"])) == sorted(map(tuple, winners)), (summary, winners)
    # One `chpart status` per write, write()'s own before it: the connector plans from that one
    # (handed over in the JVM) and hands its commit's summary back, so neither reads it again.
    statuses = [c for c in probe.calls(r["calls"])
                if c["command"] == "status" and c["event"] == "start" and c["load"] == load]
    assert len(statuses) == 1, statuses
    assert "clustered by partition key toYYYYMMDD(ts) as [chpart_toyyyymmdd(ts, 'UTC')]" in log, log[-4000:]

    # Spark's event log: the write stage's one failed attempt is the probe's, after it published.
    failure = r["ctrl"]["fail-after-publish.json"]
    loser = failure["attempt"]
    tasks = eventlog.tasks(r["event_dir"], r["application_id"])
    [write_stage] = {t["stage"] for t in tasks if t["task_id"] == failure["task_attempt_id"]}
    failed = [t for t in tasks if t["stage"] == write_stage and not t["success"]]
    assert [(t["partition"], t["attempt"]) for t in failed] == [(failure["partition"], 0)], eventlog.describe(tasks)
    assert "exited with code 3 (retryable failure)" in failed[0]["message"], failed[0]
    assert loser not in dict(winners).values() and failure["parts"], (winners, failure)

    source = source_of(r)
    assert summary["rows"] == source.rows, summary
    assert_exactly_once(cluster.entry, TABLE, source)
    per_shard = assert_rows_where_clickhouse_routes_them(cluster, plan, source.rows)
    for node in cluster.nodes:
        sub = load_status(cluster.config, chpart_bin, cluster.sub_load(load, node.shard_num))
        assert_winners_and_losers(sub, winners, losers=[loser])
        assert sub["rows"] == per_shard[node.shard_num], sub
        # The loser's parts on this shard wait in detached/ until gc, never attached.
        names = [p["name"] for p in cluster.staged_manifest(load, node.shard_num, loser)["parts"]]
        assert set(names) <= set(cluster.detached(node.shard_num)), (node.shard_num, names)

    days = [day_id(d) for d in range(3)]
    every = {(day, node.shard_num) for day in days for node in cluster.nodes}
    clustered = parts_per_partition_and_shard(cluster, LOCAL_TABLE)
    assert clustered == {key: 1 for key in every}, f"parts per (partition, shard), layout=table: {clustered}"
    none_summary = r["layout_none_summary"]
    assert none_summary["via"] == "connector" and none_summary["rows"] == source.rows, none_summary
    # Its hand-over entry could not be cleared (forget raised, injected): a warning, not an error.
    assert (f"chpart: could not clear the connector's hand-over entry of load {load}-layout-none: An error "
            "occurred while calling ChpartHandoff.forget") in log, log[-4000:]
    assert_exactly_once(cluster.entry, none_table, source)
    unclustered = parts_per_partition_and_shard(cluster, none_local)
    assert unclustered == {key: 2 for key in every}, f"parts per (partition, shard), layout=none: {unclustered}"
    print(f"parts per (partition, shard): layout=table {sorted(clustered.items())}; "
          f"layout=none {sorted(unclustered.items())}; rows per shard {per_shard}; write tasks "
          f"{summary['spark_partitions']}; loser {loser} (partition {failure['partition']}, "
          f"{len(failure['parts'])} parts)")

    assert_cluster_gc_leaves_nothing(cluster, chpart_bin, load, f"{load}-layout-none")
    assert_exactly_once(cluster.entry, TABLE, source)
    assert_exactly_once(cluster.entry, none_table, source)


# Old rows for the replace tests: days 0-2 (the days the source's rows fall into: replaced) and
# day 5 (kept), through the Distributed table, so every shard holds some of each.
OLD_REPLACED = ("SELECT 5000000 + number AS id, toDateTime64('2026-01-01 00:00:00', 6, 'UTC') + "
                "toIntervalSecond(number * 86) AS ts, 'old' AS user, 'view' AS kind, NULL AS amount, "
                "false AS flag FROM numbers(3000)")
OLD_KEPT = ("SELECT 6000000 + number AS id, toDateTime64('2026-01-06 00:00:00', 6, 'UTC') + "
            "toIntervalSecond(number * 80) AS ts, 'old' AS user, 'buy' AS kind, 1.5 AS amount, "
            "true AS flag FROM numbers(1000)")
SOURCE_DAYS = "ts < '2026-01-04 00:00:00'"


def insert_old_rows(cluster):
    """The old rows into `db.events`; returns the kept day's fingerprint per shard."""
    for select in (OLD_REPLACED, OLD_KEPT):
        cluster.entry.query(f"INSERT INTO {TABLE} {select} SETTINGS insert_distributed_sync = 1")
    kept = {n.shard_num: n.scalar(f"SELECT count(), sum(cityHash64(*)) FROM {LOCAL_TABLE} WHERE NOT ({SOURCE_DAYS})")
            for n in cluster.nodes}
    assert all(int(v.split()[0]) > 0 for v in kept.values()), kept
    return kept


def assert_replaced_on_every_shard(cluster, plan, source, kept):
    """The source's days hold exactly the source rows (read through the Distributed table), no
    old row of them is left on any shard, the kept day is unchanged on every shard, and every
    row is on the shard ClickHouse routes it to (each shard equal to an INSERT twin)."""
    assert_exactly_once(cluster.entry, TABLE, source, where=SOURCE_DAYS)
    for node in cluster.nodes:
        n = node.shard_num
        old = int(node.scalar(f"SELECT count() FROM {LOCAL_TABLE} WHERE {SOURCE_DAYS} AND user = 'old'"))
        assert old == 0, f"shard {n}: {old} old rows left in the replaced days"
        now = node.scalar(f"SELECT count(), sum(cityHash64(*)) FROM {LOCAL_TABLE} WHERE NOT ({SOURCE_DAYS})")
        assert now == kept[n], f"shard {n}: the kept day changed: {now} != {kept[n]}"
    assert_rows_where_clickhouse_routes_them(cluster, plan, source.rows + 1000)


def test_replace_with_stage_retry_and_zombies_into_a_distributed_table(three_shard_cluster, chpart_bin, tmp_path):
    """A reload of history into `db.events` (Distributed over three shards): old rows in the
    source's three days and in a day the source does not touch, then the seed 002 scenario
    through chpart_spark.write(mode="replace"): the write stage retried after a FetchFailed,
    zombie 0 publishing between collect() and the commit (a loser on every shard), zombie 1
    fenced after it. The source's days hold exactly the source rows on every shard, the other
    day is untouched, and gc leaves nothing."""
    cluster = three_shard_cluster
    plan = cluster.plan(chpart_bin)
    kept = insert_old_rows(cluster)
    load = "zombie-cluster-replace"
    r = run_scenario(tmp_path, "zombie", cluster.config, chpart_bin, load, rows=40_000, table=TABLE,
                     extra_args=["--mode", "replace"])
    loser, fenced = check_zombie_run(r)
    source = source_of(r)
    assert r["summary"]["rows"] == source.rows and r["summary"]["mode"] == "replace", r["summary"]
    assert_replaced_on_every_shard(cluster, plan, source, kept)
    entry = load_status(cluster.config, chpart_bin, load)
    assert entry["state"] == "committed" and entry["mode"] == "replace", entry
    for node in cluster.nodes:
        sub = load_status(cluster.config, chpart_bin, cluster.sub_load(load, node.shard_num))
        assert_winners_and_losers(sub, r["summary"]["winners"], losers=[loser])
        assert fenced not in {a["attempt"] for a in sub["attempts"]}, sub
    assert_cluster_gc_leaves_nothing(cluster, chpart_bin, load)
    assert_exactly_once(cluster.entry, TABLE, source, where=SOURCE_DAYS)


def test_connector_overwrite_into_a_distributed_table(three_shard_cluster, chpart_bin, connector_jar, tmp_path):
    """df.write.format("chpart").mode("overwrite") into `db.events` (Distributed over three
    shards) over old rows: the first attempt of partition 1 fails after it published on every
    shard, Spark retries it and the retry wins. The days the rows fall into are replaced on
    every shard, the other day is kept, and gc leaves nothing."""
    cluster = three_shard_cluster
    plan = cluster.plan(chpart_bin)
    kept = insert_old_rows(cluster)
    load = "connector-cluster-overwrite"
    r = run_scenario(tmp_path, "connector-overwrite", cluster.config, chpart_bin, load, rows=40_000, table=TABLE,
                     jar=connector_jar, extra_args=["--mode", "replace"])
    loser = r["ctrl"]["fail-after-publish.json"]["attempt"]
    winners = committed_winners((tmp_path / "connector-overwrite.log").read_text(), load)
    entry = load_status(cluster.config, chpart_bin, load)
    assert entry["state"] == "committed" and entry["mode"] == "replace", entry
    assert sorted(dict(winners)) == [0, 1, 2, 3] and loser not in dict(winners).values(), (winners, loser)
    source = source_of(r)
    assert_replaced_on_every_shard(cluster, plan, source, kept)
    for node in cluster.nodes:
        sub = load_status(cluster.config, chpart_bin, cluster.sub_load(load, node.shard_num))
        assert_winners_and_losers(sub, winners, losers=[loser])
    assert_cluster_gc_leaves_nothing(cluster, chpart_bin, load)
