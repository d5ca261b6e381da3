"""Spark's event log (spark.eventLog.enabled=true, spark.eventLog.compress=false) as the
oracle that a failure really happened: every task attempt with its stage attempt, executor,
host, speculative flag, launch/finish times and end reason; stage attempts; job ends;
removed executors. Complete once the SparkContext has stopped."""

import glob
import json
import os


def events(event_dir, app_id):
    """Every event of application `app_id` under `event_dir` (rolling or plain logs)."""
    files = sorted(
        p for p in glob.glob(os.path.join(event_dir, "**", "*"), recursive=True)
        if os.path.isfile(p) and app_id in os.path.basename(p)
        and not os.path.basename(p).startswith((".", "appstatus"))
    )
    if not files:
        raise AssertionError(f"no event log of {app_id} under {event_dir}: {os.listdir(event_dir)}")
    out = []
    for path in files:
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out


def tasks(event_dir, app_id):
    """One dict per ended task attempt."""
    out = []
    for e in events(event_dir, app_id):
        if e.get("Event") != "SparkListenerTaskEnd":
            continue
        info = e.get("Task Info", {})
        reason = e.get("Task End Reason", {})
        out.append({
            "task_id": info.get("Task ID"),
            "partition": info.get("Partition ID", info.get("Index")),
            "attempt": info.get("Attempt"),
            "stage": e.get("Stage ID"),
            "stage_attempt": e.get("Stage Attempt ID"),
            "executor": info.get("Executor ID"),
            "host": info.get("Host"),
            "speculative": info.get("Speculative", False),
            "launch_ms": info.get("Launch Time"),
            "finish_ms": info.get("Finish Time"),
            "reason": reason.get("Reason"),
            "kill_reason": reason.get("Kill Reason"),
            "success": reason.get("Reason") == "Success" and not info.get("Failed", False),
            "message": (reason.get("Description") or reason.get("Message")
                        or reason.get("Full Stack Trace") or "")[:800],
        })
    return out


def stage_attempts(event_dir, app_id):
    """{stage id: sorted stage attempt ids} of submitted stages."""
    out = {}
    for e in events(event_dir, app_id):
        if e.get("Event") == "SparkListenerStageSubmitted":
            info = e["Stage Info"]
            out.setdefault(info["Stage ID"], set()).add(info["Stage Attempt ID"])
    return {k: sorted(v) for k, v in out.items()}


def job_ends(event_dir, app_id):
    """{job id: (completion time ms, result)}."""
    return {e["Job ID"]: (e.get("Completion Time"), e.get("Job Result", {}).get("Result"))
            for e in events(event_dir, app_id) if e.get("Event") == "SparkListenerJobEnd"}


def job_of_stage(event_dir, app_id, stage):
    for e in events(event_dir, app_id):
        if e.get("Event") == "SparkListenerJobStart" and stage in e.get("Stage IDs", []):
            return e["Job ID"]
    raise AssertionError(f"no job with stage {stage} in the event log of {app_id}")


def executors_removed(event_dir, app_id):
    """[(executor id, reason)] of SparkListenerExecutorRemoved."""
    return [(e.get("Executor ID"), e.get("Removed Reason", "")) for e in events(event_dir, app_id)
            if e.get("Event") == "SparkListenerExecutorRemoved"]


def executors_added(event_dir, app_id):
    """{executor id: host}."""
    return {e["Executor ID"]: e.get("Executor Info", {}).get("Host") for e in events(event_dir, app_id)
            if e.get("Event") == "SparkListenerExecutorAdded"}


def describe(rows):
    """A compact text of task rows for assertion messages."""
    return "\n".join(
        f"  tid={t['task_id']} stage={t['stage']}.{t['stage_attempt']} p={t['partition']} "
        f"att={t['attempt']} exec={t['executor']}@{t['host']} spec={t['speculative']} "
        f"{t['reason']} {t['kill_reason'] or ''} {t['message'][:160]!r}" for t in rows)


def applications(event_dir):
    """The application ids with an event log under `event_dir`."""
    names = [os.path.basename(p) for p in glob.glob(os.path.join(event_dir, "**", "*"), recursive=True)
             if os.path.isfile(p)]
    return sorted({n.split("_", 2)[2] if n.startswith("events_") else n.split(".")[0]
                   for n in names if n.startswith(("events_", "local-", "app-"))})


def custom_metrics(event_dir, app_id, class_prefix):
    """The SQL plan's DSv2 custom metrics whose class name starts with `class_prefix` (e.g.
    "chpart.spark."), as {metric description: {"driver": the value the driver posted (None if it
    posted none), "tasks": the sum of successful tasks' updates}}."""
    by_id = {}

    def walk(info):
        for m in info.get("metrics", []):
            if m.get("metricType", "").startswith("v2Custom_" + class_prefix):
                by_id[m["accumulatorId"]] = m["name"]
        for child in info.get("children", []):
            walk(child)

    evs = events(event_dir, app_id)
    for e in evs:
        if e.get("Event", "").endswith(("SparkListenerSQLExecutionStart", "SparkListenerSQLAdaptiveExecutionUpdate")):
            walk(e["sparkPlanInfo"])
    out = {name: {"driver": None, "tasks": 0} for name in by_id.values()}
    for e in evs:
        if e.get("Event", "").endswith("SparkListenerDriverAccumUpdates"):
            for acc_id, value in e["accumUpdates"]:
                if acc_id in by_id:
                    out[by_id[acc_id]]["driver"] = value
        elif e.get("Event") == "SparkListenerTaskEnd" and e.get("Task End Reason", {}).get("Reason") == "Success":
            for acc in e.get("Task Info", {}).get("Accumulables", []):
                if acc.get("ID") in by_id:
                    out[by_id[acc["ID"]]]["tasks"] += int(acc["Update"])
    return out
