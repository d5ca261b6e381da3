"""What runs inside Spark tasks to force a failure deterministically (TEST CODE).

Every decision is made with marker files in a control directory shared by driver and tasks:
a claim file created with O_EXCL says "this is the first attempt of partition P" (whatever
Spark retries or speculates), and waits are for a marker file to appear, bounded by a timeout
so that a scenario that did not happen fails loudly instead of hanging. Functions here are
shipped to the executors by value (`ship_by_value()`), so tasks need not import this module.
"""

import glob
import json
import os
import time


def ship_by_value():
    """Make cloudpickle send this module's functions by value (executors cannot import it)."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def claim(path, record):
    """Creates `path` with O_EXCL; True for the one caller that created it."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    return True


def write_marker(path, record):
    """Writes `path` whole (temp file, then rename): a reader sees all of it or nothing."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def wait_for(predicate, timeout, what):
    """The first true value of `predicate()`, polled every 50 ms; TimeoutError after `timeout`
    seconds (the scenario did not happen as planned)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout}s for {what}")
        time.sleep(0.05)


def _task_record(ctx, **extra):
    return {"partition": ctx.partitionId(), "task_attempt_id": ctx.taskAttemptId(), "stage": ctx.stageId(),
            "attempt_number": ctx.attemptNumber(), "pid": os.getpid(), "time": time.time(), **extra}


# --- 1. stage retry with zombies -------------------------------------------------------------

def zombie_stragglers(ctrl_dir, zombies, shuffle_root, timeout):
    """A `mapInArrow` function for the stage that writes (after a shuffle).

    Every task first reads all of its shuffle input. The first attempt of each partition in
    `zombies` claims `<ctrl>/zombie-<p>.json` (with its task attempt id); once every zombie has
    read its input, the one of the smallest partition deletes every `shuffle_*` file under
    `shuffle_root` (spark.local.dir) and writes `deleted.json`. A zombie then passes its rows on
    at once: its chpart build gets its whole input and straggles in clickhouse-local
    (hold_local) until the test releases it, while its task waits for the build.

    Every other task of the first stage attempt passes its rows on only after the deletion, so
    the tasks that start later FetchFail and the stage is retried; the retry runs the zombies'
    partitions again while the zombies still run (the seed 002 case). A retry of a zombie's
    partition passes its rows on only once the zombie's build is held, so the job cannot end
    (and Spark cannot kill the zombie) before the zombie's build has all of its input."""

    def fn(batches):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        p = ctx.partitionId()
        held = list(batches)  # all of its shuffle input, before anything is deleted
        deleted = os.path.join(ctrl_dir, "deleted.json")
        if p in zombies and claim(os.path.join(ctrl_dir, f"zombie-{p}.json"),
                                  _task_record(ctx, rows=sum(b.num_rows for b in held))):
            write_marker(os.path.join(ctrl_dir, f"read-{p}"), _task_record(ctx))
            wait_for(lambda: all(os.path.exists(os.path.join(ctrl_dir, f"read-{q}")) for q in zombies), timeout,
                     "every zombie to read its input")
            if p == min(zombies):
                files = [f for f in glob.glob(os.path.join(shuffle_root, "**", "shuffle_*"), recursive=True)
                         if os.path.isfile(f)]
                for f in files:
                    os.unlink(f)
                write_marker(deleted, {"files": files, "time": time.time()})
        elif p in zombies:
            wait_for(lambda: os.path.exists(os.path.join(ctrl_dir, f"holding-{p}.json")), timeout,
                     f"the zombie of partition {p} to hold its build")
        else:
            wait_for(lambda: os.path.exists(deleted), timeout, "the shuffle files to be deleted")
        yield from held

    return fn


# --- 2. executor loss ------------------------------------------------------------------------

def wait_for_executor_loss(partition, ctrl_dir, timeout):
    """An ``_after_build`` hook: the first attempt of `partition` (claim `victim.json`, with the
    pid of its Python worker and the manifest's attempt and parts), after its build published,
    waits for the driver to SIGKILL its executor JVM; when the JVM dies its Python worker dies
    too. If that does not happen within `timeout` it raises, so the scenario fails loudly."""

    def hook(ctx, manifest):
        if ctx.partitionId() != partition:
            return
        record = _task_record(ctx, attempt=manifest["attempt"]["id"], parts=[p["name"] for p in manifest["parts"]])
        if not claim(os.path.join(ctrl_dir, "victim.json"), record):
            return
        time.sleep(timeout)
        raise TimeoutError(f"test fault: the executor of task attempt {ctx.taskAttemptId()} was not killed "
                           f"within {timeout}s")

    return hook


# --- 3. speculation --------------------------------------------------------------------------

def straggle_until_speculated(partition, ctrl_dir, timeout):
    """An ``_after_build`` hook: the first attempt of `partition` (claim `straggler.json`)
    straggles after its build published: it waits for its speculative copy (any later attempt
    of the partition, which writes `copy.json` from this hook after its own build published)
    and then for Spark to kill it when the copy's success is reported. If no copy comes within
    `timeout`, it raises: the scenario did not happen, the test must fail."""

    def hook(ctx, manifest):
        if ctx.partitionId() != partition:
            return
        record = _task_record(ctx, attempt=manifest["attempt"]["id"], parts=[p["name"] for p in manifest["parts"]])
        if claim(os.path.join(ctrl_dir, "straggler.json"), record):
            wait_for(lambda: os.path.exists(os.path.join(ctrl_dir, "copy.json")), timeout,
                     f"a speculative copy of partition {partition}")
            time.sleep(timeout)  # Spark kills this attempt once the copy's success is reported
            return
        write_marker(os.path.join(ctrl_dir, "copy.json"), record)

    return hook


# --- 4. stage retry with zombies, through the JVM connector ---------------------------------

def _ended_builds(calls_dir):
    """(attempt, partition, rc) of every `chpart build` the probe saw end (probe.py's records,
    read here because executors cannot import the probe)."""
    out = []
    for path in glob.glob(os.path.join(calls_dir, "*-end.json")):
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError):
            continue
        if r.get("command") == "build":
            out.append((r.get("attempt") or "", r.get("partition"), r.get("rc")))
    return out


def connector_zombie_stragglers(ctrl_dir, shuffle_root, calls_dir, timeout):
    """A `mapInArrow` function for the stage that writes through the JVM connector (after a
    shuffle), in the same stage as the DataWriters it feeds. The connector's DataWriter ends its
    build's input, and so lets it publish, only in commit(), which Spark runs after its commit
    coordinator allowed the attempt to commit (the first attempt of a partition to ask wins, in
    any stage attempt). So the zombies here race the retries for that permission:

    - the first attempts of partitions 0 and 1 (stage attempt 0) claim `zombie-<p>.json` and
      read all of their shuffle input; then zombie 0 deletes every `shuffle_*` file under
      `shuffle_root` (`deleted.json`), so tasks that start later FetchFail and the stage is
      retried while both zombies run;
    - zombie 0 passes its rows on at once: it asks first, is allowed, and its build straggles in
      clickhouse-local (hold_local, `holding-0.json`) until the driver writes `release-0`;
    - the first retry of partition 0 (stage attempt 1, claims `retry-0.json`) passes its rows on
      once zombie 0's build is held: it asks second and is denied; Spark launches partition 0
      again, and those attempts wait for zombie 0's task to have ended (`zombie-0-ended.json`,
      written by the driver), then are denied or killed with the finished stage;
    - the retry of partition 1 passes its rows on at once and wins; zombie 1 passes its rows on
      only once that retry's build has published: it asks after the winner and is denied;
    - the other partitions' attempts read their input, then pass it on after the deletion (with
      six partitions on four cores, the first attempts of partitions 4 and 5 start only after
      it and FetchFail).

    Zombie 0 thus wins partition 0 from the old stage attempt, and zombie 1 wants to publish
    after its partition was won: neither heuristic nor timing decides, Spark's coordinator does.
    Every wait is bounded by `timeout` (the scenario did not happen: the task fails loudly)."""

    def fn(batches):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        p = ctx.partitionId()
        ctrl = lambda name: os.path.join(ctrl_dir, name)  # noqa: E731
        if p in (0, 1) and claim(ctrl(f"zombie-{p}.json"), _task_record(ctx)):
            held = list(batches)  # all of its shuffle input, before anything is deleted
            write_marker(ctrl(f"read-{p}"), _task_record(ctx, rows=sum(b.num_rows for b in held)))
            wait_for(lambda: all(os.path.exists(ctrl(f"read-{q}")) for q in (0, 1)), timeout,
                     "both zombies to read their input")
            if p == 0:
                files = [f for f in glob.glob(os.path.join(shuffle_root, "**", "shuffle_*"), recursive=True)
                         if os.path.isfile(f)]
                for f in files:
                    os.unlink(f)
                write_marker(ctrl("deleted.json"), {"files": files, "time": time.time()})
            else:
                own = f".{ctx.taskAttemptId()}"
                wait_for(lambda: any(part == "1" and rc == 0 and not attempt.endswith(own)
                                     for attempt, part, rc in _ended_builds(calls_dir)),
                         timeout, "the retry of partition 1 to publish")
                write_marker(ctrl("zombie-1-asks.json"), _task_record(ctx))
            yield from held
            return
        if p == 0:
            if claim(ctrl("retry-0.json"), _task_record(ctx)):
                wait_for(lambda: os.path.exists(ctrl("holding-0.json")), timeout, "zombie 0 to hold its build")
            else:
                # Spark launches partition 0 again at once after a denial; a denied commit is an
                # ExceptionFailure that counts towards spark.task.maxFailures, so relaunches wait
                # until zombie 0's task has ended (the driver writes `zombie-0-ended.json`) rather
                # than be denied over and over while zombie 0 is reported.
                wait_for(lambda: os.path.exists(ctrl("zombie-0-ended.json")), timeout, "zombie 0's task to end")
        elif p != 1:
            held = list(batches)
            wait_for(lambda: os.path.exists(ctrl("deleted.json")), timeout, "the shuffle files to be deleted")
            yield from held
            return
        yield from batches

    return fn
