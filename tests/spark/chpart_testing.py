"""TEST HOOKS and test oracles (TEST CODE, not part of the chpart_spark package): for the Spark
tests and the quickstart's demonstration (deploy/spark/examples/load_events.py, which
deploy/quickstart.sh runs with this file in --py-files), never for production jobs.

- `fail_first_attempt(partition, marker)`: an ``_after_build`` hook for `write()` that makes
  the first attempt of one partition fail *after* its `chpart build` published its parts, so
  Spark retries it and the retry wins (the published parts of the failed attempt are a loser's).
  A marker file created with O_EXCL makes it fire exactly once per marker, whatever Spark does.
- `task_attempts(event_log_dir)`: every task attempt Spark recorded in its event log
  (``spark.eventLog.enabled=true``, ``spark.eventLog.compress=false``), with its end reason:
  the oracle that a failure really happened.

Importing this module makes cloudpickle ship its functions to the executors by value, so the
Python workers need not import it (they find chpart_spark, not this file).
"""

import glob
import json
import os
import sys

from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class InjectedFailure(RuntimeError):
    """Raised by `fail_first_attempt` inside a task."""


def fail_first_attempt(partition, marker):
    """TEST HOOK for ``write(_after_build=...)``: attempt number 0 of Spark partition
    ``partition`` raises InjectedFailure after publishing, the first time only (the marker
    file, created with O_EXCL, records which attempt it was)."""

    def hook(ctx, manifest):
        if ctx.partitionId() != partition or ctx.attemptNumber() != 0:
            return
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            json.dump({"attempt": manifest["attempt"]["id"], "partition": partition,
                       "task_attempt_id": ctx.taskAttemptId(),
                       "parts": [p["name"] for p in manifest["parts"]]}, f)
        raise InjectedFailure(
            f"chpart_spark test hook: failing attempt {manifest['attempt']['id']} of partition {partition} "
            f"after it published {len(manifest['parts'])} part(s)")

    return hook


def task_attempts(event_log_dir, app_id=None):
    """Every SparkListenerTaskEnd in the event log(s) under ``event_log_dir`` (of ``app_id``
    if given; the log is complete once the SparkContext has stopped) as dicts: task_id, partition, attempt, stage, stage_attempt, speculative,
    reason ("Success" or the failure's class), failed (bool), message."""
    # Spark 4 writes rolling logs by default: <dir>/eventlog_v2_<app>/events_<n>_<app>; a plain
    # log is <dir>/<app>[.inprogress]. Either way the application id is in the file name.
    files = sorted(
        path for path in glob.glob(os.path.join(event_log_dir, "**", "*"), recursive=True)
        if os.path.isfile(path) and not os.path.basename(path).startswith((".", "appstatus"))
        and (app_id is None or app_id in os.path.basename(path))
    )
    out = []
    for path in files:
        with open(path, errors="replace") as f:
            for line in f:
                if '"SparkListenerTaskEnd"' not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line being written
                info = event.get("Task Info", {})
                reason = event.get("Task End Reason", {})
                out.append({
                    "task_id": info.get("Task ID"),
                    "partition": info.get("Partition ID", info.get("Index")),
                    "attempt": info.get("Attempt"),
                    "stage": event.get("Stage ID"),
                    "stage_attempt": event.get("Stage Attempt ID"),
                    "speculative": info.get("Speculative", False),
                    "reason": reason.get("Reason"),
                    "failed": reason.get("Reason") != "Success" or info.get("Failed", False),
                    "message": reason.get("Description") or reason.get("Full Stack Trace", "")[:500],
                })
    return out
