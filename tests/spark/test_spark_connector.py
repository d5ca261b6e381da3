"""The JVM connector (`format("chpart")`, deploy/spark/connector) under real Spark 4.3 against a
real ClickHouse 26.9 engine, from each way a Spark user reaches it:

1. a Java job (deploy/spark/examples/LoadEvents.java, compiled here by javac) run through
   `spark-submit --jars chpart-spark.jar`,
2. PySpark: `df.write.format("chpart")...save()`,
3. Spark SQL: `CREATE TABLE ... USING chpart OPTIONS (...)`, then `INSERT INTO ... SELECT`,

each while the first attempt of partition 1 fails after its build published (the probe,
failure_jobs/probe.py, exits 3 after the real build exited 0), and

4. the seed 002 stage retry with zombies, where the zombies race the retries for Spark's commit
   coordinator (failure_jobs/faults.py: connector_zombie_stragglers).

Each test checks that the failure happened (Spark's event log), that the table holds exactly the
source rows (count and an order-independent checksum over every column), that the connector's
own log names the winners `chpart status` has, that the write's metrics are in the event log,
and that `chpart gc` leaves nothing of the load.
"""

import json
import os
import re
import sys

from conftest import spark_conf
from datasets import create_table_sql, write_events_parquet
from failure_jobs import eventlog, probe
from helpers import (assert_exactly_once, assert_gc_leaves_nothing, assert_winners_and_losers,
                     check_connector_metrics, commit_denied, committed_winners, load_status)
from scenarios import TABLE, attempt_of, run_logged, run_scenario, source_of

JOB_TIMEOUT = 240
ROWS = 40_000


def make_table(clickhouse):
    clickhouse.query("CREATE DATABASE db")
    clickhouse.query(create_table_sql(TABLE))


def check_retry_after_publish(clickhouse, config, chpart, load, r, source, driver_log):
    """The first attempt of partition 1 published and then failed; its retry won; exactly the
    source rows are loaded; gc removes the loser's parts."""
    app, events = r["application_id"], r["event_dir"]
    loser = r["ctrl"]["fail-after-publish.json"]
    # Spark's event log: in the write's stage, attempt 0 of partition 1 failed with chpart's
    # message and exit class ...
    tasks = eventlog.tasks(events, app)
    [stage] = {t["stage"] for t in tasks if t["task_id"] == loser["task_attempt_id"]}
    failed = [t for t in tasks if t["stage"] == stage and not t["success"]]
    assert [(a["partition"], a["attempt"], a["task_id"]) for a in failed] == [(1, 0, loser["task_attempt_id"])], \
        eventlog.describe(tasks)
    message = failed[0]["message"]
    assert f"chpart build (load {load}, partition 1, attempt {loser['attempt']}" in message, message
    assert "exited with code 3 (retryable failure)" in message and "injected failure" in message, message
    # ... and a retry won partition 1. The connector logged the winners `chpart status` has.
    winners = committed_winners(driver_log, load)
    assert sorted(map(tuple, winners)) == sorted(map(tuple, r["summary"]["winners"])), (winners, r["summary"])
    by_partition = dict(winners)
    assert sorted(by_partition) == [0, 1, 2, 3] and by_partition[1] != loser["attempt"], winners
    # Attempt ids: <applicationId>.s<driver start>.<12 hex of the write's query id>.<taskAttemptId>.
    shape = re.compile(rf"^{re.escape(app)}\.s\d+\.([0-9a-f]{{12}})\.(\d+)$")
    ids = list(by_partition.values()) + [loser["attempt"]]
    assert all(shape.match(a) for a in ids) and len({shape.match(a).group(1) for a in ids}) == 1, ids

    assert_exactly_once(clickhouse, TABLE, source)
    entry = load_status(config, chpart, load)
    assert_winners_and_losers(entry, winners, losers=[loser["attempt"]])
    waiting = {x["name"] for x in clickhouse.rows("SELECT name FROM system.detached_parts WHERE database = 'db'")}
    assert loser["parts"] and set(loser["parts"]) <= waiting, (loser, waiting)
    check_connector_metrics(r, source.rows, entry)
    assert_gc_leaves_nothing(clickhouse, config, chpart, load)
    assert_exactly_once(clickhouse, TABLE, source)


def test_java_job_with_a_task_retry_after_publish_loads_exactly_once(clickhouse, chpart_config, chpart_bin,
                                                                     connector_jar, load_events_job, tmp_path):
    """(1) The Java example, compiled by javac, run by spark-submit --jars chpart-spark.jar on
    local[2,4]: it reads Parquet, repartitions it into 4 tasks and saves it with
    format("chpart"); the first attempt of partition 1 fails after publishing."""
    make_table(clickhouse)
    load = "java-load"
    source = write_events_parquet(tmp_path / "input", ROWS)
    probe_path, calls, probe_env = probe.install(str(tmp_path / "probe"), chpart_bin)
    ctrl = tmp_path / "ctrl"
    ctrl.mkdir()
    env = dict(probe_env)
    env[probe.ENV_FAIL_AFTER_PUBLISH] = json.dumps({"partition": 1, "marker": str(ctrl / "fail-after-publish.json")})
    events_dir = tmp_path / "spark-events"
    events_dir.mkdir()
    local_dir = tmp_path / "spark-local"
    local_dir.mkdir()
    conf = {**spark_conf(events_dir), "spark.local.dir": str(local_dir)}
    argv = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[2,4]",
            "--jars", connector_jar, "--class", "LoadEvents"]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    argv += [load_events_job, "--input", str(tmp_path / "input"), "--table", TABLE, "--config", chpart_config,
             "--load", load, "--partitions", "4", "--chpart", probe_path, "--option", "layout=none"]
    for key, value in env.items():
        argv += ["--option", f"env.{key}={value}"]

    log = tmp_path / "java-job.log"
    returncode = run_logged(argv, log, JOB_TIMEOUT, "the Java job")
    output = log.read_text()
    assert returncode == 0 and f"LoadEvents: load {load} committed into {TABLE}" in output, \
        f"the Java job failed (exit {returncode}):\n{output[-6000:]}"

    [app] = eventlog.applications(str(events_dir))
    entry = load_status(chpart_config, chpart_bin, load)
    r = {"application_id": app, "event_dir": str(events_dir), "summary": {"winners": entry["winners"]},
         "ctrl": {"fail-after-publish.json": json.loads((ctrl / "fail-after-publish.json").read_text())}}
    check_retry_after_publish(clickhouse, chpart_config, chpart_bin, load, r, source, output)


def test_pyspark_format_chpart_with_a_task_retry_after_publish_loads_exactly_once(clickhouse, chpart_config,
                                                                                  chpart_bin, connector_jar,
                                                                                  tmp_path):
    """(2) PySpark on local[2,4]: df.write.format("chpart").mode("append")...save(), the
    probe's environment given as env.* options; the first attempt of partition 1 fails after
    publishing."""
    make_table(clickhouse)
    load = "pyspark-load"
    r = run_scenario(tmp_path, "connector-retry", chpart_config, chpart_bin, load, rows=ROWS, jar=connector_jar)
    driver_log = (tmp_path / "connector-retry.log").read_text()
    check_retry_after_publish(clickhouse, chpart_config, chpart_bin, load, r, source_of(r), driver_log)

    # Then, in the same session, another load whose rows every build refuses (id as a string):
    # the job fails with chpart's message and exit class, and the load is aborted.
    bad = r["permanent"]
    assert bad["error"] and f"chpart build (load {load}-bad, partition " in bad["error"], bad
    assert "exited with code 4 (permanent failure)" in bad["error"], bad["error"][-3000:]
    assert "`id`" in bad["error"] and "Int64" in bad["error"], bad["error"][-3000:]
    assert bad["state"] == "aborted" and bad["table_rows"] == ROWS, bad
    assert any(b["rc"] == 4 for b in bad["builds"]) and all(b["rc"] in (4, None) for b in bad["builds"]), bad
    assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, f"{load}-bad")
    assert_exactly_once(clickhouse, TABLE, source_of(r))


def test_spark_sql_insert_into_a_chpart_table_with_a_task_retry_after_publish_loads_exactly_once(
        clickhouse, chpart_config, chpart_bin, connector_jar, tmp_path):
    """(3) Spark SQL on local[2,4]: CREATE TABLE chpart_events (columns) USING chpart OPTIONS
    (table, config, chpart, load, env.*), then INSERT INTO chpart_events SELECT ...; the first
    attempt of partition 1 fails after publishing."""
    make_table(clickhouse)
    load = "sql-load"
    r = run_scenario(tmp_path, "connector-sql", chpart_config, chpart_bin, load, rows=ROWS, jar=connector_jar)
    driver_log = (tmp_path / "connector-sql.log").read_text()
    check_retry_after_publish(clickhouse, chpart_config, chpart_bin, load, r, source_of(r), driver_log)


def test_a_killed_commit_is_finished_by_running_the_write_again(clickhouse, chpart_config, chpart_bin,
                                                                  connector_jar, tmp_path):
    """PySpark df.write.format("chpart") with option load (the unit of exactly-once) and
    winners_path, four times: the commit killed after recording its plan (the write fails, the
    winners file is kept, nothing is visible); again, resumed from that file without building
    (killed after its first ATTACH, still nothing visible); the file lost, resumed from the
    ledger alone; once more, already committed: nothing runs. Exactly the source rows."""
    make_table(clickhouse)
    load = "resume-load"
    r = run_scenario(tmp_path, "connector-resume", chpart_config, chpart_bin, load, rows=ROWS, jar=connector_jar)
    first, second, third, fourth = r["runs"]
    for run, point in ((first, "after-plan"), (second, "after-attach:1")):
        assert run["error"] and f"chpart commit (load {load}) exited with code -6 (killed by signal 6)" in run["error"], \
            run["error"] and run["error"][-3000:]
        assert f"CHPART_TEST_CRASH_AT={point}" in run["error"] and "The winners are kept in" in run["error"], \
            run["error"][-3000:]
        # not aborted (it is resumable): open, the winners file kept, nothing visible
        assert run["state"] == "open" and run["winners_file"] and run["table_rows"] == 0, run
    assert len(first["builds"]) == 4 and all(b["rc"] == 0 for b in first["builds"]), first["builds"]
    assert second["builds"] == [] and third["builds"] == [] and fourth["builds"] == [], r["runs"]
    assert third["error"] is None and third["state"] == "committed" and not third["winners_file"], third
    assert fourth["error"] is None and fourth["state"] == "committed" and fourth["table_rows"] == ROWS, fourth

    driver_log = (tmp_path / "connector-resume.log").read_text()
    assert f"chpart load {load}: resuming the commit from" in driver_log, driver_log[-3000:]
    assert f"chpart load {load}: an earlier commit recorded its plan; resuming it from the ledger" in driver_log
    assert f"chpart load {load} is already committed ({ROWS} rows): nothing to do" in driver_log
    entry = load_status(chpart_config, chpart_bin, load)
    winners = sorted(map(tuple, entry["winners"]))
    assert [a for _, a in winners] == sorted(b["attempt"] for b in first["builds"]), (winners, first["builds"])
    source = source_of(r)
    assert_exactly_once(clickhouse, TABLE, source)
    assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, load)
    assert_exactly_once(clickhouse, TABLE, source)


def test_stage_retry_with_zombies_through_the_connector(clickhouse, chpart_config, chpart_bin, connector_jar,
                                                        tmp_path):
    """(4, seed 002) A two-stage job (repartition into 6, then the write) on local[4,4]: the
    write stage is retried after FetchFailed while the zombies of partitions 0 and 1 (stage
    attempt 0) still run. Spark's commit coordinator lets one attempt per partition end its
    build's input: zombie 0, which asked first, wins partition 0 from the old stage attempt
    (the first retry of partition 0 is denied); zombie 1 asks after the retry of partition 1
    won, and is denied: its build is killed before its input ends and publishes nothing. Other
    attempts of partition 0 that Spark launches after the denial are denied too, or killed
    when the stage ends.
    Exactly the source rows are loaded, and gc leaves nothing."""
    make_table(clickhouse)
    load = "zombie-connector-load"
    r = run_scenario(tmp_path, "connector-zombie", chpart_config, chpart_bin, load, rows=ROWS, jar=connector_jar,
                     partitions=6)
    assert r["releaser_failures"] == [], r["releaser_failures"]
    app, events = r["application_id"], r["event_dir"]
    ctrl = r["ctrl"]
    zombie = {p: ctrl[f"zombie-{p}.json"] for p in (0, 1)}
    first_retry = ctrl["retry-0.json"]
    stage = zombie[0]["stage"]
    tasks = eventlog.tasks(events, app)
    why = f"the event log's tasks:\n{eventlog.describe(tasks)}"

    # The event log: the write stage was retried after a FetchFailed in its first attempt ...
    assert eventlog.stage_attempts(events, app)[stage] == [0, 1], why
    fetch_failed = [t for t in tasks if t["stage"] == stage and t["reason"] == "FetchFailed"]
    assert fetch_failed and all(t["stage_attempt"] == 0 for t in fetch_failed), why
    task = {t["task_id"]: t for t in tasks}
    z0, z1, denied0 = (task[zombie[0]["task_attempt_id"]], task[zombie[1]["task_attempt_id"]],
                       task[first_retry["task_attempt_id"]])
    # ... zombie 0 (stage attempt 0) ran while the retry of its partition was launched and denied,
    # and won partition 0 ...
    assert (z0["stage_attempt"], z0["partition"], z0["success"]) == (0, 0, True), why
    assert (denied0["stage_attempt"], denied0["partition"]) == (1, 0) and commit_denied(denied0, 0), why
    assert z0["launch_ms"] < denied0["launch_ms"] < denied0["finish_ms"] < z0["finish_ms"], why
    assert [t for t in tasks if t["stage"] == stage and t["partition"] == 0 and t["success"]] == [z0], why
    # ... and the retry of partition 1 (stage attempt 1) won it while zombie 1 still ran; zombie 1
    # asked only after that retry's build had published, and was denied.
    [won1] = [t for t in tasks if t["stage"] == stage and t["partition"] == 1 and t["success"]]
    assert won1["stage_attempt"] == 1 and z1["launch_ms"] < won1["launch_ms"] < z1["finish_ms"], why
    assert (z1["stage_attempt"], z1["partition"]) == (0, 1) and commit_denied(z1, 1), why
    winners = dict(r["summary"]["winners"])
    assert sorted(winners) == [0, 1, 2, 3, 4, 5], winners
    assert winners[0] == attempt_of(r, z0["task_id"]) and winners[1] == attempt_of(r, won1["task_id"]), winners
    assert ctrl["holding-0.json"]["attempt"] == winners[0], ctrl

    # The probe: every attempt Spark did not accept had its build started and never published:
    # denied or killed, each build was killed before the end of its input (no end recorded, or
    # not exit 0), and chpart status lists none of them as completed.
    builds = probe.builds(r["calls"])
    [won1_build] = [b for b in builds if b["attempt"] == attempt_of(r, won1["task_id"])]
    assert won1_build["rc"] == 0 and won1_build["end"] < ctrl["zombie-1-asks.json"]["time"], (won1_build, ctrl)
    denied = [t for t in tasks if t["stage"] == stage and not t["success"] and t["reason"] != "FetchFailed"]
    assert {denied0["task_id"], z1["task_id"]} <= {t["task_id"] for t in denied}, why
    started = {b["attempt"]: b for b in builds}
    for t in denied:
        b = started.get(attempt_of(r, t["task_id"]))
        assert b is None or b["rc"] != 0, (t, b)
    for t in (denied0, z1):
        assert attempt_of(r, t["task_id"]) in started, f"the denied attempt {t['task_id']} started a build: {builds}"
    entry = load_status(chpart_config, chpart_bin, load)
    assert entry["state"] == "committed", entry
    winning = set(winners.values())
    assert all(not a["completed"] for a in entry["attempts"] if a["attempt"] not in winning), entry
    assert sorted(map(tuple, committed_winners((tmp_path / "connector-zombie.log").read_text(), load))) == \
        sorted(map(tuple, entry["winners"]))

    source = source_of(r)
    assert_exactly_once(clickhouse, TABLE, source)
    check_connector_metrics(r, source.rows, entry)
    assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, load)
    assert_exactly_once(clickhouse, TABLE, source)
