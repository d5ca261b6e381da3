"""A `clickhouse-local` stand-in that makes chosen builds straggle (TEST INSTRUMENTATION).

`install(directory, real_local, ctrl_dir)` writes an executable `clickhouse-local-hold` and
returns the environment that points chpart at it (`CHPART_CLICKHOUSE_LOCAL_COMMAND`) and tells
it the control directory. It runs the real clickhouse-local (`exec`, so chpart's parent-death
signal and timeout still apply to it). One run is held first: the one that builds the parts
(its query inserts the input chpart spooled) for a zombie's attempt, i.e. the attempt
(`TESTPROBE_ATTEMPT`, set by the probe) whose task attempt id a claim file
`<ctrl>/zombie-<p>.json` names. It writes `<ctrl>/holding-<p>.json`, waits for
`<ctrl>/release-<p>` (bounded by `TESTPROBE_HOLD_TIMEOUT`, default 90 s, after which the
build fails with exit 3) and writes `<ctrl>/held-<p>.json`.

So a zombie's `chpart build` has passed its first fence and received its whole input (its Spark
task is only waiting for the build to finish, as a slow build's task does), and does its
build, upload, second fence and publish at a point the test chooses.
"""

import glob
import json
import os
import sys
import time

ENV_REAL = "TESTPROBE_LOCAL_REAL"
ENV_CTRL = "TESTPROBE_CTRL"
ENV_TIMEOUT = "TESTPROBE_HOLD_TIMEOUT"
ENV_ATTEMPT = "TESTPROBE_ATTEMPT"  # set by the probe (probe.ENV_ATTEMPT)


def install(directory, real_local, ctrl_dir, timeout=90):
    """Writes `<directory>/clickhouse-local-hold`; returns the environment for chpart."""
    from failure_jobs.probe import write_launcher  # driver side only (the launcher needs none)

    os.makedirs(directory, exist_ok=True)
    path = write_launcher(os.path.join(directory, "clickhouse-local-hold"), "hold_local")
    return {"CHPART_CLICKHOUSE_LOCAL_COMMAND": path, ENV_REAL: os.path.abspath(real_local), ENV_CTRL: ctrl_dir,
            ENV_TIMEOUT: str(timeout)}


def _write(path, record):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def _zombie_partition(ctrl, attempt):
    tid = attempt.rsplit(".", 1)[-1]
    for path in glob.glob(os.path.join(ctrl, "zombie-*.json")):
        try:
            with open(path) as f:
                claim = json.load(f)
        except (OSError, ValueError):
            continue
        if str(claim.get("task_attempt_id")) == tid:
            return claim["partition"]
    return None


def main(argv):
    real = os.environ[ENV_REAL]
    ctrl = os.environ.get(ENV_CTRL)
    attempt = os.environ.get(ENV_ATTEMPT)
    # The run that builds the parts (its query inserts the spooled input); not `--version`.
    builds_parts = any("INSERT INTO" in a for a in argv)
    if ctrl and attempt and builds_parts:
        p = _zombie_partition(ctrl, attempt)
        if p is not None:
            try:
                fd = os.open(os.path.join(ctrl, f"holding-{p}.json"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                fd = None
            if fd is not None:
                with os.fdopen(fd, "w") as f:
                    json.dump({"partition": p, "attempt": attempt, "pid": os.getpid(), "time": time.time()}, f)
                release = os.path.join(ctrl, f"release-{p}")
                deadline = time.monotonic() + float(os.environ.get(ENV_TIMEOUT, "90"))
                while not os.path.exists(release):
                    if time.monotonic() > deadline:
                        print(f"clickhouse-local-hold: {release} did not appear", file=sys.stderr)
                        return 3
                    time.sleep(0.05)
                _write(os.path.join(ctrl, f"held-{p}.json"),
                       {"partition": p, "attempt": attempt, "pid": os.getpid(), "time": time.time()})
    os.execv(real, [real] + list(argv))
