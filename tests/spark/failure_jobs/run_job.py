"""The Spark driver of one failure scenario, run by tests/spark/test_spark_failures.py as its
own process (so a scenario that goes wrong cannot leave a SparkContext, executors or zombie
tasks in the test process). It computes the source's checksum, loads the test dataset with
chpart_spark.write through the recording chpart probe while forcing the scenario's failure,
and writes what happened as JSON to --out (exit 0 when write() returned, 1 when anything
raised). The test then checks that result, the event log, the table, `chpart status` and
`chpart gc`.

Scenarios:
  zombie         stage retry after FetchFailed with two zombie attempts that publish late
                 (one after collect() returned and before the commit, one after the commit)
  executor-loss  an executor JVM is SIGKILLed while a write task runs (local-cluster[2,1,1024])
  speculation    a straggler and its speculative copy on a standalone cluster of two hosts

Through the JVM connector (`--jar chpart-spark.jar`; the probe is the connector's `chpart`
option, its environment goes in `env.*` options):
  connector-retry   df.write.format("chpart"): the first attempt of partition 1 fails after its
                    build published (probe.ENV_FAIL_AFTER_PUBLISH), Spark retries it
  connector-sql     the same through Spark SQL: CREATE TABLE ... USING chpart OPTIONS (...),
                    then INSERT INTO ... SELECT
  connector-resume  a commit killed twice, resumed from the winners file, then from the ledger
  connector-zombie  stage retry after FetchFailed with zombies racing the retries for Spark's
                    commit coordinator (faults.connector_zombie_stragglers)
  write-auto        chpart_spark.write as callers write it (no `via`) with the jar loaded: it
                    takes the connector, with its default layout; the first build that publishes
                    a part fails after publishing. --layout-none-table T: the same rows again
                    through format("chpart") with layout=none into T

The scenarios above the connector's place their faults on chpart_spark.write's Python tasks
(hooks, mapInArrow stages): they pass via="python", so a jar on the classpath cannot move them.
"""

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback

FAILURE_JOBS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(FAILURE_JOBS))
os.environ["PYSPARK_PYTHON"] = sys.executable

import chpart_spark  # noqa: E402
from conftest import spark_builder  # noqa: E402
from datasets import events  # noqa: E402
from failure_jobs import faults, hold_local, probe  # noqa: E402
from failure_jobs.faults import wait_for  # noqa: E402

WAIT = 90  # seconds any wait for a marker may take before the scenario fails loudly


def mark(result, name):
    """Seconds since the driver started, per step (the test prints them)."""
    result.setdefault("marks", {})[name] = round(time.time() - result["started"], 2)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def running_tasks(spark):
    """Tasks Spark's status store counts as running, over all executors (zombies included)."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return sum(info.numRunningTasks() for info in infos)


def task_ended(spark, stage, task_id, stage_attempt=0):
    """Whether Spark's status store has the end of task attempt `task_id` of `stage` (stage
    attempt `stage_attempt`)."""
    tasks = spark.sparkContext._jsc.sc().statusStore().taskList(stage, stage_attempt, 100_000)
    for i in range(tasks.size()):
        task = tasks.apply(i)
        if task.taskId() == task_id:
            return task.status() != "RUNNING"
    return False


def wait_for_executors(spark, count):
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    wait_for(lambda: len(tracker.getExecutorInfos()) > count, WAIT, f"{count} executors (and the driver) to register")
    return sorted(info.host() for info in tracker.getExecutorInfos())


def clickhouse_local_command(config):
    """The `[clickhouse_local] command` of the chpart config (what hold_local runs)."""
    import tomllib

    with open(config, "rb") as f:
        return tomllib.load(f)["clickhouse_local"]["command"]


def scenario_zombie(args, spark, df, ctrl, result):
    """Partitions 0 and 1 get zombies in the write stage's attempt 0 (faults.zombie_stragglers):
    their builds have their whole input and straggle in clickhouse-local (hold_local) while
    stage attempt 1 runs their partitions again and wins. Zombie 0 is released by the probe
    right before `chpart commit`, after collect() returned: it publishes while the load is open
    and must be a loser that commit ignores and gc removes. Zombie 1 is released after write()
    returned: its build started before the commit (it passed the first fence) and must be
    fenced (exit 5) when it is about to publish.

    Spark kills the zombie tasks when the job ends, but a Python task that waits for its
    subprocess is only destroyed spark.python.task.killTimeout later (2 s by default; the
    --die-with-parent chain then kills the build): that is the window in which a real zombie
    keeps writing after collect() returned. Here both late builds end within about 1.5 s of the
    job's end, inside the default window, but the timeout is raised (SESSION_CONF) so that they
    never race the kill."""
    from pyspark.sql import functions as F

    zombies = [0, 1]
    staged = df.repartition(4, F.col("id")).mapInArrow(
        faults.zombie_stragglers(ctrl, zombies, args.local_dir, WAIT), df.schema)
    env = dict(args.probe_env)
    env.update(hold_local.install(os.path.join(args.work, "hold"), clickhouse_local_command(args.config), ctrl, WAIT))
    env[probe.ENV_BEFORE_COMMIT] = json.dumps(
        {"release": os.path.join(ctrl, "release-0"), "claim": os.path.join(ctrl, "zombie-0.json"), "timeout": WAIT})
    result["summary"] = chpart_spark.write(staged, table=args.table, load_id=args.load, config=args.config,
                                           chpart=args.probe, extra_env=env, via="python", mode=args.mode)
    mark(result, "write")
    # The load is committed; now the second zombie's build goes on.
    zombie1 = read_json(os.path.join(ctrl, "zombie-1.json"))
    faults.write_marker(os.path.join(ctrl, "release-1"), {"released": "after the commit", "time": time.time()})
    suffix = f".{zombie1['task_attempt_id']}"
    wait_for(lambda: any(b["attempt"].endswith(suffix) and b["end"] for b in probe.builds(args.calls)), WAIT,
             "the second zombie's build to end")
    # The zombie tasks end once their Python workers return: the event log must record them.
    wait_for(lambda: running_tasks(spark) == 0, WAIT, "the zombie tasks to end")


def executor_jvms(app_id, driver_port):
    """{pid: executor id} of this application's executor JVMs: the processes whose command line
    (/proc/<pid>/cmdline, what `ps -ww` shows) runs CoarseGrainedExecutorBackend with --app-id
    `app_id` and a --driver-url on `driver_port`. The port tells two applications apart when their
    local clusters (tests run in parallel) both name theirs app-<the same second>-0000."""
    jvms = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = [w.decode(errors="replace") for w in f.read().split(b"\0")]
        except OSError:
            continue
        if not (any("CoarseGrainedExecutorBackend" in w for w in words) and app_id in words
                and "--driver-url" in words):
            continue
        if words[words.index("--driver-url") + 1].endswith(f":{driver_port}"):
            jvms[int(pid)] = words[words.index("--executor-id") + 1] if "--executor-id" in words else None
    return jvms


def parent_pid(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def process_gone(pid):
    """The process has exited (it no longer exists, or is a zombie not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def kill_executor_of_victim(ctrl, spark, record, stop):
    """Waits for the victim task (faults.wait_for_executor_loss), finds the executor JVM that
    runs it (the ancestor of its Python worker among the app's CoarseGrainedExecutorBackend
    processes) and SIGKILLs it. Gives up when `stop` is set (write() ended first)."""
    victim = wait_for(lambda: stop.is_set() or read_json(os.path.join(ctrl, "victim.json")), WAIT, "the victim task")
    if victim is True:
        raise RuntimeError("write() ended before the victim task showed up")
    app_id = spark.sparkContext.applicationId
    jvms = executor_jvms(app_id, spark.sparkContext.getConf().get("spark.driver.port"))
    record["executor_jvms"] = {str(k): v for k, v in jvms.items()}
    pid = victim["pid"]
    while pid > 1 and pid not in jvms:
        pid = parent_pid(pid)
    if pid not in jvms:
        raise RuntimeError(f"no executor JVM of {app_id} is an ancestor of the victim's Python worker "
                           f"{victim['pid']}: {jvms}")
    os.kill(pid, signal.SIGKILL)
    record.update(pid=pid, executor_id=jvms[pid], time=time.time())
    wait_for(lambda: process_gone(pid), WAIT, f"executor JVM {pid} to die")


def scenario_executor_loss(args, spark, df, ctrl, result):
    """local-cluster[2,1,1024]: two executor JVMs of one core. The first attempt of partition 1
    publishes its parts, then waits in its task (faults.wait_for_executor_loss) while a driver
    thread SIGKILLs the executor JVM running it. Spark loses the executor and the task with it
    and runs partition 1 again elsewhere; the killed attempt's parts are a loser's."""
    killed, failures, stop = {}, [], threading.Event()

    def killer():
        try:
            kill_executor_of_victim(ctrl, spark, killed, stop)
        except BaseException as e:  # reported (the test fails on it), never swallowed
            failures.append(f"{type(e).__name__}: {e}")

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        result["summary"] = chpart_spark.write(df, table=args.table, load_id=args.load, config=args.config,
                                               chpart=args.probe, extra_env=args.probe_env, via="python",
                                               _after_build=faults.wait_for_executor_loss(1, ctrl, WAIT))
        mark(result, "write")
    finally:
        stop.set()
        thread.join(WAIT)
        result.update(killed=killed, killer_failures=failures)


def scenario_speculation(args, spark, df, ctrl, result):
    """A standalone cluster (--master spark://...) with one single-core executor on each of two
    hosts. The first attempt of partition 0 publishes, then straggles
    (faults.straggle_until_speculated); Spark's speculation starts a copy on the other host,
    the copy wins, and Spark kills the straggler."""
    result["summary"] = chpart_spark.write(df, table=args.table, load_id=args.load, config=args.config,
                                           chpart=args.probe, extra_env=args.probe_env, via="python",
                                           _after_build=faults.straggle_until_speculated(0, ctrl, WAIT))
    mark(result, "write")
    # The killed straggler's end must be in the event log: wait until Spark's status store has
    # it (fed by the same listener bus; spark.stop() then drains it into the event log). An
    # executor's count of running tasks can drop before that event is posted.
    straggler = read_json(os.path.join(ctrl, "straggler.json"))
    if straggler is None:
        raise RuntimeError("no straggler.json: the first attempt of partition 0 never straggled")
    wait_for(lambda: task_ended(spark, straggler["stage"], straggler["task_attempt_id"]), WAIT,
             f"the end of the straggler (task {straggler['task_attempt_id']}) to be reported")
    wait_for(lambda: running_tasks(spark) == 0, WAIT, "every other attempt to end")


def connector_write(df, args, env, load=None, **options):
    """`df.write.format("chpart")` in append mode (overwrite with --mode replace), with the probe
    as chpart and `env` as the connector's env.* options (added to every chpart run's
    environment). layout=none: the failures are placed on the job's own partitioning, which the
    layout's shuffle would deal anew (test_spark_modes.py tests the layout)."""
    spark_mode = "overwrite" if args.mode == "replace" else "append"
    writer = (df.write.format("chpart").mode(spark_mode).option("table", args.table).option("config", args.config)
              .option("chpart", args.probe).option("load", load or args.load).option("layout", "none"))
    for key, value in {**options, **{f"env.{k}": v for k, v in env.items()}}.items():
        writer = writer.option(key, value)
    writer.save()


def connector_run(df, args, env, load=None, **options):
    """`connector_write`, reporting instead of raising: the error's text (None if it succeeded),
    the load's state afterwards, the builds the probe saw start during the write, and the rows
    in the target table."""
    load = load or args.load
    before = time.time()
    try:
        connector_write(df, args, env, load, **options)
        error = None
    except Exception as e:  # the test checks the message
        error = f"{type(e).__name__}: {e}"[-12000:]
    [entry] = chpart_spark.status(args.config, load_id=load, chpart=args.chpart)
    return {"error": error, "state": entry["state"], "table_rows": table_rows(args),
            "builds": [b for b in probe.builds(args.calls) if b["start"] >= before]}


def table_rows(args):
    """Rows in the target table now (the config's server)."""
    import tomllib
    import urllib.request

    with open(args.config, "rb") as f:
        url = tomllib.load(f)["clickhouse"]["url"]
    request = urllib.request.Request(url.rstrip("/") + "/", data=f"SELECT count() FROM {args.table}".encode())
    with urllib.request.urlopen(request, timeout=60) as response:
        return int(response.read().decode().strip())


def connector_summary(args):
    """What the connector committed, from `chpart status` (a DataSource returns nothing to its
    caller): the load's state, rows and winners, and how many partitions won."""
    [entry] = chpart_spark.status(args.config, load_id=args.load, chpart=args.chpart)
    return {"load": entry["load"], "state": entry["state"], "rows": entry["rows"], "winners": entry["winners"],
            "spark_partitions": len(entry["winners"])}


def fail_after_publish_env(args, ctrl, partition=1):
    """The probe's environment, plus: the first build of `partition` fails after publishing
    (None: the first build of any partition that publishes a part)."""
    env = dict(args.probe_env)
    env[probe.ENV_FAIL_AFTER_PUBLISH] = json.dumps({"partition": partition,
                                                   "marker": os.path.join(ctrl, "fail-after-publish.json")})
    return env


def scenario_connector_retry(args, spark, df, ctrl, result):
    """df.write.format("chpart") where the first attempt of partition 1 fails after its build
    published (the probe exits 3 after the real build exited 0): the task fails with chpart's
    message, Spark retries it and the retry wins; the failed attempt's parts are a loser's."""
    connector_write(df, args, fail_after_publish_env(args, ctrl))
    mark(result, "write")
    result["summary"] = connector_summary(args)
    # A permanent failure, in another load: every build refuses the rows (id as a string), Spark
    # retries each task, the job fails with chpart's message and the load is aborted.
    from pyspark.sql import functions as F

    bad = df.withColumn("id", F.concat(F.lit("x"), F.col("id").cast("string")))
    result["permanent"] = connector_run(bad, args, args.probe_env, load=f"{args.load}-bad")
    mark(result, "permanent failure")


def scenario_connector_resume(args, spark, df, ctrl, result):
    """A commit killed, then resumed by re-running the same write (the same load id), through
    the connector (CHPART_TEST_CRASH_AT given as an env.* option, on the first two runs only):
    1. the commit dies after recording its plan: the write fails, the winners file is kept;
    2. with that file: the tasks build nothing, the commit resumes from it and dies after its
       first ATTACH;
    3. the file lost (the driver's host): the commit resumes from the ledger's plan alone;
    4. the load is committed: nothing runs."""
    winners = os.path.join(args.work, "winners", f"{args.load}.jsonl")
    runs = result.setdefault("runs", [])
    for crash in ("after-plan", "after-attach:1", None, None):
        env = dict(args.probe_env)
        if crash:
            env["CHPART_TEST_CRASH_AT"] = crash
        if crash is None and os.path.exists(winners):
            os.unlink(winners)
        run = connector_run(df, args, env, winners_path=winners)
        run.update(crash=crash, winners_file=os.path.exists(winners))
        runs.append(run)
        mark(result, f"run {len(runs)}")
    result["summary"] = connector_summary(args)


def sql_string(value):
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def scenario_connector_overwrite(args, spark, df, ctrl, result):
    """df.write.format("chpart").mode("overwrite") (run with --mode replace) where the first
    attempt of partition 1 fails after its build published, as in connector-retry: Spark
    retries it and the retry wins; the load replaces the table partitions the rows fall into."""
    connector_write(df, args, fail_after_publish_env(args, ctrl))
    mark(result, "write")
    result["summary"] = connector_summary(args)


def scenario_connector_sql(args, spark, df, ctrl, result):
    """Spark SQL: a table of the session catalog backed by the connector (the columns given,
    the chpart options as OPTIONS), loaded by INSERT INTO ... SELECT, with the same failure as
    connector-retry."""
    df.createOrReplaceTempView("source_events")
    options = {"table": args.table, "config": args.config, "chpart": args.probe, "load": args.load,
               "layout": "none"}  # as in connector_write
    options.update({f"env.{k}": v for k, v in fail_after_publish_env(args, ctrl).items()})
    spark.sql("CREATE TABLE chpart_events (id BIGINT, ts TIMESTAMP, user STRING, kind STRING, amount DOUBLE, "
              "flag BOOLEAN) USING chpart OPTIONS ("
              + ", ".join(f"`{k}` {sql_string(v)}" for k, v in options.items()) + ")")
    spark.sql("INSERT INTO chpart_events SELECT id, ts, user, kind, amount, flag FROM source_events")
    mark(result, "write")
    result["summary"] = connector_summary(args)


def scenario_connector_zombie(args, spark, df, ctrl, result):
    """local[4,4], six write tasks (faults.connector_zombie_stragglers): the write stage is
    retried after FetchFailed while the zombies of partitions 0 and 1 (stage attempt 0) run.
    Zombie 0 asks Spark's commit coordinator first and straggles in clickhouse-local; the first
    retry of partition 0 is then denied. The retry of partition 1 wins it; zombie 1 asks after
    and is denied. Once the status store has both denied attempts' ends, a driver thread
    releases zombie 0, which publishes and wins partition 0 from the old stage attempt, and
    once its task has ended, tells the attempts of partition 0 Spark launched meanwhile.

    Four cores: zombie 0, zombie 1 and a relaunch of partition 0 may all wait at once (Spark
    launches a failed task again first), and the retry of partition 1 needs a core of its own."""
    from pyspark.sql import functions as F

    staged = df.repartition(6, F.col("id")).mapInArrow(
        faults.connector_zombie_stragglers(ctrl, args.local_dir, args.calls, WAIT), df.schema)
    env = dict(args.probe_env)
    env.update(hold_local.install(os.path.join(args.work, "hold"), clickhouse_local_command(args.config), ctrl, WAIT))
    stop, failures = threading.Event(), []

    def ended(record, stage_attempt):
        try:
            return task_ended(spark, record["stage"], record["task_attempt_id"], stage_attempt)
        except Exception:  # the stage attempt is not in the status store yet
            return False

    def release_zombie_0():
        try:
            records = {}
            for name in ("zombie-0.json", "zombie-1.json", "retry-0.json"):
                records[name] = wait_for(lambda: stop.is_set() or read_json(os.path.join(ctrl, name)), WAIT, name)
                if records[name] is True:
                    return
            wait_for(lambda: stop.is_set() or (ended(records["retry-0.json"], 1) and ended(records["zombie-1.json"], 0)),
                     WAIT, "the first retry of partition 0 and zombie 1 to be denied")
            faults.write_marker(os.path.join(ctrl, "release-0"), {"released": "after the denials", "time": time.time()})
            wait_for(lambda: stop.is_set() or ended(records["zombie-0.json"], 0), WAIT, "zombie 0's task to end")
            faults.write_marker(os.path.join(ctrl, "zombie-0-ended.json"), {"time": time.time()})
        except BaseException as e:  # reported (the test fails on it), never swallowed
            failures.append(f"{type(e).__name__}: {e}")

    thread = threading.Thread(target=release_zombie_0, daemon=True)
    thread.start()
    try:
        connector_write(staged, args, env)
        mark(result, "write")
    finally:
        stop.set()
        thread.join(WAIT)
        result["releaser_failures"] = failures
    result["summary"] = connector_summary(args)
    # Attempts Spark still runs (a relaunch of partition 0) are killed now the job is over: the
    # event log must record their ends.
    wait_for(lambda: running_tasks(spark) == 0, WAIT, "every task to end")


def scenario_write_auto(args, spark, df, ctrl, result):
    """chpart_spark.write(df, ...) as a caller writes it (no `via`) in a session whose classpath
    has the connector's jar: it must write through df.write.format("chpart") (its log line says
    so and why), with the connector's default layout: the rows clustered by the table's
    partition key (PARTITION BY toYYYYMMDD(ts): by chpart_toyyyymmdd(ts)) into the write's 4
    tasks, so which task gets rows is the layout's choice; the first build that publishes a
    part fails after publishing (the probe: a connector task cannot fail after its build on its
    own), Spark retries it and the retry wins.

    --layout-none-table T: then the same rows through chpart_spark.write(..., layout="none") into T
    (load `<load>-layout-none`): each of the 4 input tasks builds for the days it holds; after
    that write, clearing the connector's hand-over entry fails (the real ChpartHandoff, its
    `forget` of the load raising as a py4j call does once the gateway is gone), which must not
    replace the write's outcome."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("chpart_spark: %(message)s"))
    logging.getLogger("chpart_spark").addHandler(handler)
    logging.getLogger("chpart_spark").setLevel(logging.INFO)
    result["summary"] = chpart_spark.write(df, table=args.table, load_id=args.load, config=args.config,
                                           chpart=args.probe, extra_env=fail_after_publish_env(args, ctrl, None))
    mark(result, "write")
    if args.layout_none_table:
        real_handoff = chpart_spark.writer._connector_handoff
        chpart_spark.writer._connector_handoff = lambda session: FailingForget(real_handoff(session))
        try:
            result["layout_none_summary"] = chpart_spark.write(
                df, table=args.layout_none_table, load_id=f"{args.load}-layout-none", config=args.config,
                chpart=args.probe, extra_env=args.probe_env, layout="none")
        finally:
            chpart_spark.writer._connector_handoff = real_handoff
        mark(result, "layout=none write")


class FailingForget:
    """The connector's ChpartHandoff (a py4j class), whose `forget` of a load raises."""

    def __init__(self, handoff):
        assert handoff is not None, "the connector's ChpartHandoff is not in this session's JVM"
        self._handoff = handoff

    def __getattr__(self, name):
        return getattr(self._handoff, name)

    def forget(self, load):
        raise RuntimeError(f"An error occurred while calling ChpartHandoff.forget({load}): the gateway is gone "
                           "(injected by the test)")


# Per scenario: (default master, executors to wait for, session settings, the scenario).
SCENARIOS = {
    "zombie": ("local[3,4]", 0, {"spark.python.task.killTimeout": "600s"}, scenario_zombie),
    "executor-loss": ("local-cluster[2,1,1024]", 2, {}, scenario_executor_loss),
    # A speculative copy never runs on its original's host: both executors (hosts) must be up.
    "speculation": (None, 2, {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.executor.memory": "1g",
        "spark.speculation": "true",
        "spark.speculation.interval": "100ms",
        "spark.speculation.multiplier": "2",
        "spark.speculation.quantile": "0.5",
        "spark.speculation.minTaskRuntime": "3s",
        # Judge stragglers by run time only, not by their rate of processed records.
        "spark.speculation.efficiency.enabled": "false",
    }, scenario_speculation),
    "connector-retry": ("local[2,4]", 0, {}, scenario_connector_retry),
    "connector-sql": ("local[2,4]", 0, {}, scenario_connector_sql),
    "connector-overwrite": ("local[2,4]", 0, {}, scenario_connector_overwrite),
    "connector-resume": ("local[2,4]", 0, {}, scenario_connector_resume),
    "connector-zombie": ("local[4,4]", 0, {}, scenario_connector_zombie),
    # Adaptive execution would coalesce the layout's small shuffle into fewer tasks: kept at
    # spark.sql.shuffle.partitions (4), so the rows really are spread over several write tasks.
    "write-auto": ("local[2,4]", 0, {"spark.sql.adaptive.coalescePartitions.enabled": "false"},
                   scenario_write_auto),
}


def run(args, result):
    master, executors, conf, scenario = SCENARIOS[args.scenario]
    ctrl = os.path.join(args.work, "ctrl")
    os.makedirs(ctrl)
    os.makedirs(args.local_dir)
    builder = spark_builder(args.master or master, args.event_dir, f"chpart-{args.scenario}")
    builder = builder.config("spark.local.dir", args.local_dir)
    builder = builder.config("spark.sql.warehouse.dir", os.path.join(args.work, "warehouse"))
    if args.jar:
        builder = builder.config("spark.jars", args.jar)  # the JVM connector
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if args.jar:
        # The connector logs its load, winners and commit summary on the driver (the test reads them).
        jvm = spark.sparkContext._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel("chpart.spark", jvm.org.apache.logging.log4j.Level.INFO)
    result["application_id"] = spark.sparkContext.applicationId
    mark(result, "session")
    try:
        if executors:
            result["executors"] = wait_for_executors(spark, executors)
        faults.ship_by_value()
        df = events(spark, rows=args.rows, partitions=4)
        source = chpart_spark.spark_checksum(df)
        result.update(source_rows=source.rows, source_sum=str(source.total))
        mark(result, "source checksum")
        scenario(args, spark, df, ctrl, result)
    finally:
        result["ctrl"] = {name: read_json(os.path.join(ctrl, name)) for name in sorted(os.listdir(ctrl))}
        spark.stop()  # completes the event log
        mark(result, "stop")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    for name in ("--config", "--chpart", "--table", "--load", "--work", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--master")
    p.add_argument("--jar", help="the JVM connector's jar (deploy/spark/build-connector.sh)")
    p.add_argument("--layout-none-table", help="write-auto: also write the rows with write(layout=\"none\") into this table")
    p.add_argument("--mode", choices=["append", "replace"], default="append",
                   help="zombie: chpart_spark.write's mode; connector scenarios: replace is mode(\"overwrite\")")
    args = p.parse_args()
    args.work = os.path.abspath(args.work)
    args.event_dir = os.path.join(args.work, "spark-events")
    args.local_dir = os.path.join(args.work, "spark-local")
    os.makedirs(args.event_dir, exist_ok=True)
    args.probe, args.calls, args.probe_env = probe.install(os.path.join(args.work, "probe"), args.chpart)
    result = {"event_dir": args.event_dir, "calls": args.calls, "started": time.time()}
    code = 0
    try:
        run(args, result)
    except Exception as e:
        result.update(error=type(e).__name__, message=str(e)[-6000:], traceback=traceback.format_exc()[-6000:])
        code = 1
    finally:
        with open(args.out, "w") as f:
            json.dump(result, f, default=str)
    return code


if __name__ == "__main__":
    sys.exit(main())
