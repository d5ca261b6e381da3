"""End-to-end failure scenarios with real Spark (pyspark 4.3.0) loading a real ClickHouse 26.9
engine through chpart_spark.write, where Spark itself runs an attempt that must not count:

1. a stage retry after FetchFailed with zombie attempts of the old stage attempt that keep
   writing after collect() returned (the production post-mortem of seed 002),
2. an executor JVM SIGKILLed while a write task runs (local-cluster),
3. a speculative copy beating its straggler on a standalone cluster of two hosts.

Each scenario's driver runs as its own process (failure_jobs/run_job.py) with the recording
chpart probe (failure_jobs/probe.py). Each test checks that the failure really happened in
Spark's event log (so it cannot pass without it), that the table holds exactly the source rows
(count and an order-independent checksum over every column, Spark vs ClickHouse), that
`chpart status` names the winning and losing attempts, and that after `chpart gc` nothing of
the load is left in detached/ or staging.
"""

import json
import os
import subprocess

import pytest

from datasets import create_table_sql
from failure_jobs import eventlog
from failure_jobs.cluster import StandaloneCluster
from helpers import assert_exactly_once, assert_gc_leaves_nothing, assert_winners_and_losers, load_status
from scenarios import TABLE, attempt_of, check_zombie_run, run_scenario, source_of


def make_table(clickhouse):
    clickhouse.query("CREATE DATABASE db")
    clickhouse.query(create_table_sql(TABLE))


def staged_manifest(clickhouse, load, attempt):
    with open(os.path.join(str(clickhouse.staging_root), load, attempt, "manifest.json")) as f:
        return json.loads(f.read())


def detached_names(clickhouse):
    return {r["name"] for r in clickhouse.rows("SELECT name FROM system.detached_parts WHERE database = 'db'")}


def assert_loaded_with_loser(clickhouse, config, chpart, load, r, loser, loser_parts):
    """The table holds exactly the source rows; `chpart status` names the winners and the
    losing attempt `loser`, whose parts wait in detached/ until gc, which then leaves nothing of
    the load. Returns the status entry from before gc."""
    source = source_of(r)
    assert r["summary"]["rows"] == source.rows
    assert_exactly_once(clickhouse, TABLE, source)
    entry = load_status(config, chpart, load)
    assert_winners_and_losers(entry, r["summary"]["winners"], losers=[loser])
    assert loser_parts and set(loser_parts) <= detached_names(clickhouse), \
        f"the parts of {loser} must wait in detached/ until gc: {loser_parts}"
    assert_gc_leaves_nothing(clickhouse, config, chpart, load)
    assert_exactly_once(clickhouse, TABLE, source)
    return entry


def test_stage_retry_with_zombies_that_publish_late(clickhouse, chpart_config, chpart_bin, tmp_path):
    """(1, seed 002) A two-stage job (repartition, then the write). In the write stage's attempt
    0 the zombies of partitions 0 and 1 read their shuffle input, the first deletes every shuffle
    file, and partition 3 then FetchFails: Spark retries the map stage and runs the write stage
    again as attempt 1, which runs partitions 0 and 1 again while their zombies still run, and
    wins them. Both zombies keep writing after collect() returned: zombie 0 publishes before the
    commit (a loser: never attached, removed by gc), zombie 1 after it (fenced: exit 5, nothing
    published)."""
    make_table(clickhouse)
    load = "zombie-load"
    r = run_scenario(tmp_path, "zombie", chpart_config, chpart_bin, load, rows=40_000)
    loser, fenced = check_zombie_run(r)

    # The load on a time axis, before gc: the winners, the late loser, the fenced zombie (its
    # build noted the fence in the ledger) and the commit's steps.
    picture = tmp_path / "timeline.svg"
    subprocess.run([chpart_bin, "status", "--config", str(chpart_config), "--load", load,
                    "--timeline", str(picture)], check=True, capture_output=True)
    svg = picture.read_text()
    for winner in dict(r["summary"]["winners"]).values():
        assert f"<title>{winner}: won</title>" in svg, svg
    assert f"<title>{loser}: lost</title>" in svg, svg
    assert f"<title>{fenced}: wrote late: fenced</title>" in svg, svg
    assert ">committed</text>" in svg, svg

    late_parts = [p["name"] for p in staged_manifest(clickhouse, load, loser)["parts"]]
    entry = assert_loaded_with_loser(clickhouse, chpart_config, chpart_bin, load, r, loser, late_parts)
    assert fenced not in {a["attempt"] for a in entry["attempts"]}, f"the fenced build left its staging: {entry}"


def test_executor_killed_while_writing(clickhouse, chpart_config, chpart_bin, tmp_path):
    """(2) local-cluster[2,1,1024]: while the first attempt of partition 1 runs (its build has
    published), its executor JVM is SIGKILLed. Spark loses the executor, runs partition 1 again
    on the other one, and that attempt wins; the killed attempt's parts are a loser's."""
    make_table(clickhouse)
    load = "executor-loss-load"
    r = run_scenario(tmp_path, "executor-loss", chpart_config, chpart_bin, load, rows=40_000)
    app, events = r["application_id"], r["event_dir"]
    assert r["killer_failures"] == [], r["killer_failures"]
    victim, killed = r["ctrl"]["victim.json"], r["killed"]
    assert len(r["killed"]["executor_jvms"]) == 2, killed
    tasks = eventlog.tasks(events, app)
    why = f"the event log's tasks:\n{eventlog.describe(tasks)}"

    # The event log: the victim's task was lost with its executor, which Spark removed ...
    [lost] = [t for t in tasks if t["task_id"] == victim["task_attempt_id"]]
    assert lost["reason"] == "ExecutorLostFailure" and lost["partition"] == 1, why
    assert lost["executor"] == killed["executor_id"], (killed, why)
    removed = dict(eventlog.executors_removed(events, app))
    assert killed["executor_id"] in removed, removed
    # ... and partition 1 ran again, elsewhere, and won.
    retries = [t for t in tasks if t["partition"] == 1 and t["stage"] == lost["stage"] and t["success"]]
    assert len(retries) == 1 and retries[0]["executor"] != killed["executor_id"], why
    winners = dict(r["summary"]["winners"])
    assert winners[1] == attempt_of(r, retries[0]["task_id"]) and sorted(winners) == [0, 1, 2, 3]
    assert [t for t in tasks if not t["success"]] == [lost], why
    assert not os.path.exists(f"/proc/{victim['pid']}"), "the victim's Python worker died with its executor"

    assert_loaded_with_loser(clickhouse, chpart_config, chpart_bin, load, r, victim["attempt"], victim["parts"])


@pytest.fixture
def standalone_cluster(tmp_path):
    """A standalone Spark cluster: Master on 127.0.0.1, Workers on 127.0.0.2 and 127.0.0.3
    (free ports, logs and dirs under tmp_path); every process killed at teardown."""
    cluster = StandaloneCluster(tmp_path / "cluster")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_speculative_copy_beats_straggler(standalone_cluster, clickhouse, chpart_config, chpart_bin, tmp_path):
    """(3) Speculation on a standalone cluster of two hosts: the first attempt of partition 0
    publishes, then straggles; Spark starts a speculative copy on the other host, the copy
    wins, and Spark kills the straggler, whose parts are a loser's."""
    make_table(clickhouse)
    load = "speculation-load"
    r = run_scenario(tmp_path, "speculation", chpart_config, chpart_bin, load, rows=40_000,
                     master=standalone_cluster.url)
    app, events = r["application_id"], r["event_dir"]
    straggler, copy = r["ctrl"]["straggler.json"], r["ctrl"]["copy.json"]
    tasks = eventlog.tasks(events, app)
    why = f"the event log's tasks:\n{eventlog.describe(tasks)}"
    assert set(eventlog.executors_added(events, app).values()) == {"127.0.0.2", "127.0.0.3"}

    # The event log: a speculative copy of partition 0 ran on the other host and succeeded ...
    [original] = [t for t in tasks if t["task_id"] == straggler["task_attempt_id"]]
    tasks = [t for t in tasks if t["stage"] == original["stage"]]  # the write stage
    [speculative] = [t for t in tasks if t["partition"] == 0 and t["speculative"]]
    assert speculative["task_id"] == copy["task_attempt_id"] and speculative["success"], why
    assert speculative["host"] != original["host"], why
    assert original["launch_ms"] < speculative["launch_ms"] < original["finish_ms"], why
    # ... and the straggler was killed, not failed. (On a loaded machine Spark may speculate
    # on other partitions too; whichever attempt loses there is killed as well.)
    assert original["reason"] == "TaskKilled" and original["partition"] == 0 and not original["speculative"], why
    assert [t for t in tasks if t["partition"] == 0] in ([original, speculative], [speculative, original]), why
    assert all(t["reason"] == "TaskKilled" for t in tasks if not t["success"]), why
    winners = dict(r["summary"]["winners"])
    assert winners[0] == copy["attempt"] == attempt_of(r, speculative["task_id"]) and sorted(winners) == [0, 1, 2, 3]

    assert_loaded_with_loser(clickhouse, chpart_config, chpart_bin, load, r, straggler["attempt"],
                             straggler["parts"])
