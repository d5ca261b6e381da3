"""A recording stand-in for the chpart binary (TEST INSTRUMENTATION).

`install(directory, real_chpart)` writes an executable `chpart-probe` that tests pass to
`chpart_spark.write(chpart=...)`. Every run of it runs the real chpart with the same argv,
stdin, stdout and stderr, and records one JSON file per event in the calls directory
(`TESTPROBE_DIR`): `start` (command, load, partition, attempt, pid, time) and `end` (plus the
exit code; negative = killed by that signal). A build killed together with its probe records
only its start. This is the oracle for what each attempt's `chpart build` did and when, e.g.
that a zombie's late build ended fenced (exit 5) after the commit.

Semantics kept: with `--die-with-parent` the probe sets PR_SET_PDEATHSIG(SIGKILL) on itself
first, so the chain Python worker -> probe -> chpart still dies with the worker; the exit code
(or the killing signal) is passed on. chpart's environment gets `TESTPROBE_ATTEMPT` (the
attempt id), which hold_local reads.

`TESTPROBE_BEFORE_COMMIT` (JSON) makes `chpart commit` wait for an action first, which is how a
test puts a zombie's publish after `collect()` returned and before the commit, without sleeps:
``{"release": path, "claim": path, "timeout": seconds}`` creates the file `release`, reads the
zombie's claim file `claim` (JSON with `task_attempt_id`) and waits until the build of that
task attempt has ended. A timeout makes the commit fail with exit 2 (loudly).

`TESTPROBE_FAIL_AFTER_PUBLISH` (JSON ``{"partition": P, "marker": path}``) makes the first
build of Spark partition P that publishes (P null: the first build of any partition that
publishes at least one part, for a write whose layout decides which tasks get rows) fail
*after* it published: the real build exits 0,
then the probe claims `marker` (O_EXCL, so once per marker whatever Spark retries), writes the
attempt, task attempt id and published parts into it, prints the injected failure on stderr and
exits 3 (retryable) without passing the manifest on. For runners whose task cannot fail after
its build on its own (the JVM connector: the build runs inside the DataWriter's commit), this is
"an attempt that fails after publishing".

`TESTPROBE_KILL_AFTER` (JSON list of ``{"command": C, "load_suffix": S, "marker": path, "pgid": G}``)
SIGKILLs the process group G right after a run of `chpart C` whose load ends with S exited 0,
once per marker (O_EXCL): e.g. the driver of a streaming query right after a batch's `commit`
(before Spark records the batch), or from inside a task right after its `build` published. The
probe's own output is not passed on (the group dies with it).
"""

import ctypes
import glob
import json
import os
import signal
import subprocess
import sys
import time

ENV_REAL = "TESTPROBE_REAL"
ENV_DIR = "TESTPROBE_DIR"
ENV_BEFORE_COMMIT = "TESTPROBE_BEFORE_COMMIT"
ENV_ATTEMPT = "TESTPROBE_ATTEMPT"
ENV_FAIL_AFTER_PUBLISH = "TESTPROBE_FAIL_AFTER_PUBLISH"
ENV_KILL_AFTER = "TESTPROBE_KILL_AFTER"
PR_SET_PDEATHSIG = 1


def write_launcher(path, module):
    """An executable `path` that runs `<module>.main(argv)` of this directory with this
    interpreter (-S: stdlib only, fast to start)."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(path, "w") as f:
        f.write(f"#!{sys.executable} -S\n"
                "import sys\n"
                f"sys.path.insert(0, {here!r})\n"
                f"import {module}\n"
                f"sys.exit({module}.main(sys.argv[1:]))\n")
    os.chmod(path, 0o755)
    return path


def install(directory, real_chpart):
    """Writes `<directory>/chpart-probe` and returns (its path, the calls directory, the
    environment it needs)."""
    calls = os.path.join(directory, "calls")
    os.makedirs(calls, exist_ok=True)
    path = write_launcher(os.path.join(directory, "chpart-probe"), "probe")
    return path, calls, {ENV_REAL: os.path.abspath(real_chpart), ENV_DIR: calls}


def _arg(argv, name):
    for i, a in enumerate(argv[:-1]):
        if a == name:
            return argv[i + 1]
    return None


def _record(calls_dir, record):
    name = f"{time.time_ns()}-{os.getpid()}-{record['event']}.json"
    tmp = os.path.join(calls_dir, "." + name)
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(calls_dir, name))


def calls(calls_dir):
    """Every recorded event, in time order."""
    out = []
    for path in sorted(glob.glob(os.path.join(calls_dir, "*.json"))):
        with open(path) as f:
            out.append(json.load(f))
    out.sort(key=lambda r: r["time"])
    return out


def builds(calls_dir):
    """One dict per `chpart build` run: attempt, partition, start, end (None if it never
    ended: killed with its probe), rc."""
    by_pid = {}
    for r in calls(calls_dir):
        if r["command"] != "build":
            continue
        b = by_pid.setdefault(r["pid"], {"attempt": r["attempt"], "partition": r["partition"], "start": None,
                                         "end": None, "rc": None, "pid": r["pid"]})
        if r["event"] == "start":
            b["start"] = r["time"]
        elif r["event"] == "end":
            b["end"], b["rc"] = r["time"], r["rc"]
    return sorted(by_pid.values(), key=lambda b: b["start"] or 0)


def command_times(calls_dir, command):
    """(start, end, rc) of each run of a driver command (begin, commit, ...)."""
    starts, out = {}, []
    for r in calls(calls_dir):
        if r["command"] != command:
            continue
        if r["event"] == "start":
            starts[r["pid"]] = r["time"]
        elif r["event"] == "end":
            out.append((starts.get(r["pid"]), r["time"], r["rc"]))
    return out


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"chpart-probe: waited {timeout}s for {what}")


def _before_commit(calls_dir, action):
    """Release a zombie and wait until its build ended; returns what was seen."""
    with open(action["release"], "w") as f:
        f.write("released before commit\n")
    timeout = float(action.get("timeout", 60))

    def claim():
        try:
            with open(action["claim"]) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    tid = _wait_for(claim, timeout, f"the claim file {action['claim']}")["task_attempt_id"]
    suffix = f".{tid}"

    def ended():
        done = [b for b in builds(calls_dir) if (b["attempt"] or "").endswith(suffix) and b["end"] is not None]
        return done[0] if done else None

    return _wait_for(ended, timeout, f"the build of task attempt {tid} to end")


def _fail_after_publish(fail, base, out):
    """Claims the marker for this build (True for the first build to get here that qualifies:
    with no partition named, one that published a part) and records it."""
    lines = [line for line in out.decode().splitlines() if line.strip()]
    manifest = json.loads(lines[-1])
    # An attempt manifest, or a Distributed table's cluster manifest (every shard's).
    shards = [s["manifest"] for s in manifest["shards"]] if "shards" in manifest else [manifest]
    parts = [p["name"] for m in shards for p in m["parts"]]
    if fail["partition"] is None and not parts:
        return False
    try:
        fd = os.open(fail["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump({"attempt": base["attempt"], "partition": int(base["partition"]),
                   "task_attempt_id": int(base["attempt"].rsplit(".", 1)[1]),
                   "parts": parts, "pid": os.getpid(), "time": time.time()}, f)
    print(f"chpart-probe: injected failure: attempt {base['attempt']} of partition {base['partition']} "
          f"published {len(parts)} part(s), then fails (TESTPROBE_FAIL_AFTER_PUBLISH)", file=sys.stderr)
    return True


def _kill_after(base, calls_dir):
    """The first TESTPROBE_KILL_AFTER entry this successful run matches and claims: its process
    group is SIGKILLed (this probe with it)."""
    for action in json.loads(os.environ.get(ENV_KILL_AFTER) or "[]"):
        if action["command"] != base["command"] or not (base["load"] or "").endswith(action["load_suffix"]):
            continue
        try:
            os.close(os.open(action["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            continue
        _record(calls_dir, {**base, "event": "kill", "time": time.time(), "rc": 0, "pgid": action["pgid"]})
        print(f"chpart-probe: {base['command']} of load {base['load']} exited 0; SIGKILL to process group "
              f"{action['pgid']} (TESTPROBE_KILL_AFTER)", file=sys.stderr, flush=True)
        os.killpg(int(action["pgid"]), signal.SIGKILL)


def main(argv):
    if "--die-with-parent" in argv:
        parent = os.getppid()
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
    real = os.environ[ENV_REAL]
    calls_dir = os.environ[ENV_DIR]
    command = argv[0] if argv else ""
    base = {"pid": os.getpid(), "command": command, "load": _arg(argv, "--load"),
            "attempt": _arg(argv, "--attempt"), "partition": _arg(argv, "--partition")}
    _record(calls_dir, {**base, "event": "start", "time": time.time()})
    if command == "commit" and os.environ.get(ENV_BEFORE_COMMIT):
        try:
            seen = _before_commit(calls_dir, json.loads(os.environ[ENV_BEFORE_COMMIT]))
        except Exception as e:  # fail the commit loudly: the scenario did not happen as planned
            print(f"chpart-probe: the action before commit failed: {e}", file=sys.stderr)
            _record(calls_dir, {**base, "event": "end", "time": time.time(), "rc": 2, "before_commit_error": str(e)})
            return 2
        _record(calls_dir, {**base, "event": "before_commit", "time": time.time(), "seen": seen})
    env = dict(os.environ)
    if base["attempt"]:
        env[ENV_ATTEMPT] = base["attempt"]  # for hold_local (a zombie's clickhouse-local)
    fail = None
    if command == "build" and os.environ.get(ENV_FAIL_AFTER_PUBLISH):
        fail = json.loads(os.environ[ENV_FAIL_AFTER_PUBLISH])
        if fail["partition"] is not None and str(fail["partition"]) != base["partition"]:
            fail = None
    proc = subprocess.Popen([real] + list(argv), env=env, stdout=subprocess.PIPE if fail else None)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: proc.send_signal(s))
    out = proc.communicate()[0] if fail else None
    rc = proc.wait()
    if rc == 0:
        _kill_after(base, calls_dir)
    if fail and rc == 0 and _fail_after_publish(fail, base, out):
        _record(calls_dir, {**base, "event": "end", "time": time.time(), "rc": 3, "injected": True})
        return 3
    if out is not None:
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
    _record(calls_dir, {**base, "event": "end", "time": time.time(), "rc": rc})
    if rc < 0:
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc
