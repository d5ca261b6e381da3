"""Running a failure scenario's driver (failure_jobs/run_job.py) and checking, from Spark's
event log and the chpart probe, that the scenario really happened as planned. Shared by
test_spark_failures.py (one server) and test_spark_cluster.py (a Distributed table over three
shards): what Spark did does not depend on where the rows go."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import chpart_spark
from failure_jobs import eventlog, probe

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = "db.events"
DRIVER_TIMEOUT = 240  # a scenario's whole driver; the markers it waits on time out after 90 s


def run_logged(argv, log, timeout, what, env=None):
    """Runs `argv` in its own process group (with environment `env`, default this one's), its
    stdout and stderr into the file `log`; returns its exit code. If it runs over `timeout`
    seconds the whole group is killed and the test fails with the end of its output."""
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"{what} ran over {timeout}s; its output:\n{log.read_text()[-6000:]}", pytrace=False)


def run_scenario(tmp_path, scenario, config, chpart, load, rows, master=None, table=TABLE, jar=None, partitions=4,
                 extra_args=()):
    """Runs failure_jobs/run_job.py for `scenario` in its own process group (killed as a whole
    if it overruns) and returns its JSON result; fails with the driver's output if the driver
    did not finish its load. `jar`: the JVM connector, for the connector scenarios;
    `extra_args`: more of run_job.py's arguments."""
    out = tmp_path / f"{scenario}.json"
    argv = [sys.executable, os.path.join(HERE, "failure_jobs", "run_job.py"), "--scenario", scenario,
            "--config", config, "--chpart", chpart, "--table", table, "--load", load, "--rows", str(rows),
            "--work", str(tmp_path / scenario), "--out", str(out)]
    if master:
        argv += ["--master", master]
    if jar:
        argv += ["--jar", jar]
    argv += list(extra_args)
    log = tmp_path / f"{scenario}.log"
    started = time.monotonic()
    returncode = run_logged(argv, log, DRIVER_TIMEOUT, f"the {scenario} driver")
    result = json.loads(out.read_text()) if out.exists() else {}
    if returncode != 0 or "summary" not in result:
        detail = result.get("traceback") or result.get("message") or ""
        pytest.fail(f"the {scenario} driver failed (exit {returncode}): {detail}\n"
                    f"its output:\n{log.read_text()[-6000:]}", pytrace=False)
    result["driver_seconds"] = round(time.monotonic() - started, 1)
    print(f"{scenario}: driver {result['driver_seconds']}s, steps {result.get('marks')}")
    assert result["source_rows"] == rows and result["summary"]["spark_partitions"] == partitions, result["summary"]
    return result


def source_of(result):
    return chpart_spark.Checksum(result["source_rows"], int(result["source_sum"]))


def attempt_of(result, task_id):
    """chpart_spark's attempt id of a Spark task attempt: the write's prefix
    (`<applicationId>.<application attempt>.<nonce>`, the same for every attempt of one write,
    read off the winners) and the task attempt id."""
    prefixes = {attempt.rsplit(".", 1)[0] for _, attempt in result["summary"]["winners"]}
    assert len(prefixes) == 1, f"the winners of one write have one attempt prefix: {prefixes}"
    prefix = prefixes.pop()
    assert prefix.startswith(result["application_id"] + "."), (prefix, result["application_id"])
    return f"{prefix}.{task_id}"


def check_zombie_run(r):
    """The zombie scenario (seed 002) happened as planned; returns (the late loser's attempt:
    zombie 0, which published after collect() returned and before the commit; the fenced
    attempt: zombie 1, whose build reached publish after the commit and exited 5).

    - Spark's event log: the write stage was retried after a FetchFailed (only stage attempt 0
      FetchFailed); for partitions 0 and 1, stage attempt 1 ran the partition while its
      attempt-0 zombie still ran, and won it (the winners are those retries); the zombies
      ended, unsuccessfully, only after the job had ended (collect() returned).
    - The probe: each zombie's chpart build started while the job ran; zombie 0's ended
      successfully after the job and before the commit; zombie 1's started before the commit,
      ended after it, with exit 5."""
    app, events = r["application_id"], r["event_dir"]
    tasks = eventlog.tasks(events, app)
    ctrl = r["ctrl"]
    zombie = {p: ctrl[f"zombie-{p}.json"] for p in (0, 1)}
    stage = zombie[0]["stage"]
    assert zombie[1]["stage"] == stage and zombie[0]["attempt_number"] == zombie[1]["attempt_number"] == 0
    why = f"the event log's tasks:\n{eventlog.describe(tasks)}"

    # The event log: the write stage really was retried after a FetchFailed ...
    assert eventlog.stage_attempts(events, app)[stage] == [0, 1], why
    fetch_failed = [t for t in tasks if t["stage"] == stage and t["reason"] == "FetchFailed"]
    assert fetch_failed and all(t["stage_attempt"] == 0 for t in fetch_failed), why
    job_end_ms, job_result = eventlog.job_ends(events, app)[eventlog.job_of_stage(events, app, stage)]
    assert job_result == "JobSucceeded"
    winners = dict(r["summary"]["winners"])
    assert sorted(winners) == [0, 1, 2, 3]
    builds = {b["attempt"]: b for b in probe.builds(r["calls"])}
    for p in (0, 1):
        [z] = [t for t in tasks if t["task_id"] == zombie[p]["task_attempt_id"]]
        assert (z["stage"], z["stage_attempt"], z["partition"]) == (stage, 0, p), why
        # ... stage attempt 1 ran partition p while its attempt-0 zombie was still running,
        # and won it; the zombie ended only after the job had ended (collect() returned).
        [retry] = [t for t in tasks if t["stage"] == stage and t["stage_attempt"] == 1 and t["partition"] == p]
        assert retry["success"] and z["launch_ms"] < retry["launch_ms"] < z["finish_ms"], why
        assert winners[p] == attempt_of(r, retry["task_id"]), (winners, why)
        assert not z["success"] and z["finish_ms"] > job_end_ms, why
        assert ctrl.get(f"holding-{p}.json", {}).get("attempt") == attempt_of(r, z["task_id"]), ctrl
        # its chpart build started while the job ran (it passed the first fence then)
        assert builds[attempt_of(r, z["task_id"])]["start"] * 1000 < job_end_ms

    # The probe: zombie 0's build published after the job ended, right before the commit ...
    late0 = builds[attempt_of(r, zombie[0]["task_attempt_id"])]
    [(commit_start, commit_end, commit_rc)] = probe.command_times(r["calls"], "commit")
    assert commit_rc == 0
    before_commit = [c for c in probe.calls(r["calls"]) if c["event"] == "before_commit"]
    assert late0["rc"] == 0 and late0["end"] * 1000 > job_end_ms, late0
    assert before_commit and late0["end"] <= before_commit[0]["time"], (late0, before_commit)
    # ... zombie 1's build started before the commit and was fenced after it.
    late1 = builds[attempt_of(r, zombie[1]["task_attempt_id"])]
    assert late1["start"] < commit_start and late1["end"] > commit_end, (late1, commit_start, commit_end)
    assert late1["rc"] == 5, f"the build that reached publish after the commit must be fenced (exit 5): {late1}"
    return attempt_of(r, zombie[0]["task_attempt_id"]), attempt_of(r, zombie[1]["task_attempt_id"])
