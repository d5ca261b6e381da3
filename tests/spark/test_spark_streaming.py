"""Structured Streaming (README, "Structured Streaming"), through `chpart_spark.foreach_batch`
and through the connector's own sink `writeStream.format("chpart")`: a real streaming query over
Parquet files, killed and restarted from its checkpoint, loads every row exactly once."""

import json
import os
import sys

from datasets import create_table_sql, write_events_parquet
from failure_jobs import probe
from helpers import assert_exactly_once, assert_gc_leaves_nothing
from scenarios import TABLE, run_logged

import chpart_spark

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = 6
SINK_FILES = 3
ROWS = 12_000
TIMEOUT = 300


def stream_job(clickhouse, config, chpart, tmp_path, files, *flags):
    """The table, `files` Parquet files of the source rows and the work directory; returns
    (the source's checksum, the work directory, streaming_job.py's argv with `flags`)."""
    clickhouse.query("CREATE DATABASE db")
    clickhouse.query(create_table_sql(TABLE))
    source = write_events_parquet(tmp_path / "input", ROWS, files=files)
    work = tmp_path / "stream"
    work.mkdir()
    argv = [sys.executable, os.path.join(HERE, "streaming_job.py"), "--input", str(tmp_path / "input"), "--work",
            str(work), "--config", config, "--chpart", chpart, "--table", TABLE, *flags]
    return source, work, argv


def test_streaming_query_killed_and_restarted_mid_batch_loads_every_row_once(clickhouse, chpart_config, chpart_bin,
                                                                             tmp_path):
    """Six Parquet files, one micro-batch each (maxFilesPerTrigger 1, availableNow), sink
    foreach_batch (load `<query id>.<batch id>`). Run 1 is SIGKILLed right after batch 1's
    load was committed, before Spark recorded the batch; run 2 replays batch 1 (already
    committed: nothing done) and is SIGKILLed inside batch 3's task after its build published;
    run 3 replays batch 3 (the load is open: new attempts build and win) and finishes. The
    table holds every source row once; every batch is one committed load of the query's id."""
    source, work, argv = stream_job(clickhouse, chpart_config, chpart_bin, tmp_path, FILES,
                                    "--kill-after-commit", "1", "--kill-in-build", "3")
    codes = []
    for run in range(3):
        codes.append(run_logged(argv, tmp_path / f"stream-run-{run}.log", TIMEOUT, f"streaming run {run}"))
    logs = "\n".join((tmp_path / f"stream-run-{run}.log").read_text()[-3000:] for run in range(3))
    assert codes == [-9, -9, 0], (codes, logs)
    assert (work / "killed-after-commit").exists() and (work / "killed-in-build").exists()

    ids = [json.loads(line) for line in (work / "query-ids.jsonl").read_text().splitlines()]
    assert len(ids) == 3 and len({i["id"] for i in ids}) == 1 and len({i["run_id"] for i in ids}) == 3, ids
    query_id = ids[0]["id"]
    batches = [json.loads(line) for line in (work / "batches.jsonl").read_text().splitlines()]
    # Batch 1 twice (the replay did nothing), batch 3 once (its first run died before on_batch).
    assert [b["batch"] for b in batches] == [0, 1, 1, 2, 3, 4, 5], batches
    assert all(b["load"] == f"{query_id}.{b['batch']}" for b in batches), batches
    first, replay = batches[1]["summary"], batches[2]["summary"]
    assert not first["already_committed"] and replay["already_committed"], (first, replay)
    assert replay["application_id"] != first["application_id"], (first, replay)

    assert_exactly_once(clickhouse, TABLE, source)
    loads = {e["load"]: e for e in chpart_spark.status(chpart_config, chpart=chpart_bin)}
    assert sorted(loads) == sorted(f"{query_id}.{b}" for b in range(FILES)), sorted(loads)
    assert all(e["state"] == "committed" for e in loads.values()), loads
    assert sum(e["rows"] for e in loads.values()) == ROWS, loads
    # Batch 3's first attempt published, then its driver died: a loser; the replay's attempt won.
    batch3 = loads[f"{query_id}.3"]
    losers = [a for a in batch3["attempts"] if not a["won"]]
    assert losers and any(a["completed"] for a in losers), batch3
    for load in loads:
        assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, load)
    assert_exactly_once(clickhouse, TABLE, source)


def test_streaming_through_the_connector_replays_a_committed_batch_as_a_no_op(clickhouse, chpart_config,
                                                                             chpart_bin, connector_jar, tmp_path):
    """The same stream with foreach_batch(connector=True) (format("chpart"), option load
    `<query id>.<batch id>`): run 1 is SIGKILLed right after batch 1's load committed, before
    Spark recorded the batch; run 2 replays batch 1, which the connector finds committed and
    builds nothing for, then loads the rest. Every row once, one committed load per batch."""
    source, work, argv = stream_job(clickhouse, chpart_config, chpart_bin, tmp_path, FILES,
                                    "--kill-after-commit", "1", "--jar", connector_jar)
    codes = [run_logged(argv, tmp_path / f"stream-run-{run}.log", TIMEOUT, f"streaming run {run}") for run in range(2)]
    logs = "\n".join((tmp_path / f"stream-run-{run}.log").read_text()[-3000:] for run in range(2))
    assert codes == [-9, 0], (codes, logs)
    ids = [json.loads(line) for line in (work / "query-ids.jsonl").read_text().splitlines()]
    assert len(ids) == 2 and len({i["id"] for i in ids}) == 1, ids
    query_id = ids[0]["id"]
    batches = [json.loads(line) for line in (work / "batches.jsonl").read_text().splitlines()]
    assert [b["batch"] for b in batches] == [0, 1, 1, 2, 3, 4, 5], batches
    assert all(b["load"] == f"{query_id}.{b['batch']}" for b in batches), batches

    assert_exactly_once(clickhouse, TABLE, source)
    loads = {e["load"]: e for e in chpart_spark.status(chpart_config, chpart=chpart_bin)}
    assert sorted(loads) == sorted(f"{query_id}.{b}" for b in range(FILES)), sorted(loads)
    assert all(e["state"] == "committed" for e in loads.values()), loads
    # Batch 1 was built once: the replay found it committed and no task built anything.
    assert len(loads[f"{query_id}.1"]["attempts"]) == 1, loads[f"{query_id}.1"]
    for load in loads:
        assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, load)
    assert_exactly_once(clickhouse, TABLE, source)


def test_streaming_sink_killed_after_commit_and_in_build_loads_every_row_once(clickhouse, chpart_config, chpart_bin,
                                                                             connector_jar, tmp_path):
    """The same stream into the connector's DSv2 sink, `writeStream.format("chpart")` (each
    micro-batch the load `<query id>.<batch id>`), chpart behind the recording probe, which
    places the kills. Run 1 is SIGKILLed right after batch 1's `chpart commit` exited 0, before
    Spark recorded the batch; run 2 replays batch 1 (committed: no build, no begin, no commit)
    and is SIGKILLed from inside batch 2's task after its build published; run 3 replays batch
    2 (open: begun and built again, the new attempts win) and finishes. Three files (batches)
    rather than six keep the test short: five batch runs in all."""
    source, work, argv = stream_job(clickhouse, chpart_config, chpart_bin, tmp_path, SINK_FILES, "--jar", connector_jar,
                                    "--dsv2", "--kill-after-commit", "1", "--kill-in-build", "2")
    codes = [run_logged(argv, tmp_path / f"sink-run-{run}.log", TIMEOUT, f"streaming run {run}") for run in range(3)]
    logs = "\n".join((tmp_path / f"sink-run-{run}.log").read_text()[-3000:] for run in range(3))
    assert codes == [-9, -9, 0], (codes, logs)
    ids = [json.loads(line) for line in (work / "query-ids.jsonl").read_text().splitlines()]
    assert len(ids) == 3 and len({i["id"] for i in ids}) == 1 and len({i["run_id"] for i in ids}) == 3, ids
    query_id = ids[0]["id"]

    calls = probe.calls(str(work / "calls"))
    kills = {c["command"]: c for c in calls if c["event"] == "kill"}
    assert kills["commit"]["load"] == f"{query_id}.1" and kills["build"]["load"] == f"{query_id}.2", kills

    def started(command, batch):
        return [c for c in calls if c["event"] == "start" and c["command"] == command
                and c["load"] == f"{query_id}.{batch}"]

    # Batch 1's replay (run 2) only asked the ledger: one begin, one commit, every build in run 1.
    assert len(started("status", 1)) == 2 and len(started("begin", 1)) == 1, calls
    assert len(started("commit", 1)) == 1, calls
    builds1 = started("build", 1)
    assert builds1 and all(b["time"] < kills["commit"]["time"] for b in builds1), builds1
    # Batch 2's replay (run 3) found its load open: begun again, committed once, by run 3.
    assert len(started("begin", 2)) == 2 and len(started("commit", 2)) == 1, calls
    assert started("commit", 2)[0]["time"] > kills["build"]["time"], calls

    assert_exactly_once(clickhouse, TABLE, source)
    loads = {e["load"]: e for e in chpart_spark.status(chpart_config, chpart=chpart_bin)}
    assert sorted(loads) == sorted(f"{query_id}.{b}" for b in range(SINK_FILES)), sorted(loads)
    assert all(e["state"] == "committed" for e in loads.values()), loads
    assert sum(e["rows"] for e in loads.values()) == ROWS, loads
    assert len(loads[f"{query_id}.1"]["attempts"]) == len(builds1), loads[f"{query_id}.1"]
    # Batch 2's build that published before the kill is a loser; run 3's attempts won.
    batch2 = loads[f"{query_id}.2"]
    losers = [a for a in batch2["attempts"] if not a["won"]]
    assert any(a["completed"] for a in losers), batch2
    for load in loads:
        assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, load)
    assert_exactly_once(clickhouse, TABLE, source)


def test_streaming_sink_refuses_what_it_cannot_load_once_and_writes_through_to_table(clickhouse, chpart_config,
                                                                                    chpart_bin, connector_jar,
                                                                                    tmp_path):
    """One driver (streaming_job.py --refusals): output mode complete (refused by the sink: it
    would replace the whole table), update (refused by Spark: the sink takes no updates as
    appends) and continuous processing (refused by the sink's writer factory; with the default
    layout by Spark, which has no shuffle in continuous mode) each fail naming the reason, and
    none of them begins a load. Then the stream through `toTable("chpart.db.events")` of a
    registered ChpartCatalog loads every file once, each batch the load `<query id>.<batch id>`."""
    source, work, argv = stream_job(clickhouse, chpart_config, chpart_bin, tmp_path, SINK_FILES, "--jar", connector_jar,
                                    "--refusals")
    code = run_logged(argv, tmp_path / "refusals.log", TIMEOUT, "the refusals driver")
    assert code == 0, (tmp_path / "refusals.log").read_text()[-6000:]
    result = json.loads((work / "refusals.json").read_text())
    assert "output mode complete is not supported" in result["complete"], result["complete"]
    assert "does not support Update mode" in result["update"], result["update"]
    assert "continuous processing (trigger(continuous=...)) is not supported" in result["continuous"], result
    assert "cannot request distribution and ordering in continuous execution" in result["continuous_layout"], result

    query_id = result["to_table_query_id"]
    loads = {e["load"]: e for e in chpart_spark.status(chpart_config, chpart=chpart_bin)}
    assert sorted(loads) == sorted(f"{query_id}.{b}" for b in range(SINK_FILES)), sorted(loads)
    assert all(e["state"] == "committed" for e in loads.values()), loads
    assert_exactly_once(clickhouse, TABLE, source)
