"""End-to-end benchmark of one Spark job's load into ClickHouse: chpart vs row inserts over HTTP.

The same Spark job loads the same events in one run: through chpart, and by inserting rows over
HTTP the way a row-inserting connector does; in two shapes, and each table's merges counted until
it is at rest.

    cargo build --release
    .venv/bin/python crates/bench/e2e/e2e.py [--shapes hourly bulk] [--rows N] [--bulk-rows N]

What runs, in this order (README.md next to this file explains every figure):

1. Its own ClickHouse 26.9 server (deploy/dev/clickhouse-server serve --stop-on-stdin-eof, free
   loopback ports, a fresh temp dir, system.query_log on): it stops when this script ends,
   fails, is interrupted or killed, because it watches a pipe from this process. MergeTree
   tables of the DDL of deploy/spark/examples/load_events.py (web events, 10 columns,
   partitioned by day), one per shape and variant.
2. A local Spark session (local[2]) with the JVM connector's jar on its classpath (spark.jars:
   --jar, else built by deploy/spark/build-connector.sh; no jar is an error) and, per shape, a
   DataFrame of that example's generator (deterministic): "hourly", one hour of one day (one
   table partition) over the tasks; "bulk", the hour stretched over 24 days (24 table
   partitions), each task holding whole days.
   The source checksum runs first (it also warms the JVM and the Python workers); then "Spark
   alone": the same job handing its Arrow batches to Python and discarding them. After the
   first shape's warm-up, the idle server's CPU rate is measured (--idle-secs of no statement,
   every table's merges stopped); again at the end.
3. --repeat rounds (tables emptied in between, the order alternating), each of every variant:
   (a) `chpart_spark.write` as a user with the jar runs it (via="auto": the JVM connector, whose
   default layout has Spark cluster the rows by table partition before the build; local transport: tasks build parts with clickhouse-local and move
   them into the server's detached/; the driver attaches them); (a-py) the same through Python
   tasks (via="python", the job's own partitioning, no shuffle); for hourly also (a1), (a-py)
   with the rows in one task; (b) `df.mapInArrow` tasks POSTing `INSERT ... FORMAT ArrowStream`,
   one request per 10,000 rows (the defaults of ClickHouse's own Spark connector). For each: wall
   time, the server process's utime+stime over it and its split by statement (query_log), then
   (its merges stopped, so none lands in another load's figures) the table's uncompressed bytes.
   Then each table is brought to rest: every table partition with more than one part merged
   into one (OPTIMIZE ... PARTITION ... FINAL), its server CPU measured (and split by statement).
4. The last round's tables are checked against the source: count and order-independent
   checksum.
5. Every load's and merge's server CPU net of the idle server's: raw - the lower idle rate x its
   wall time, never below what query_log gives its statements (the load's marginal cost).
6. Each variant's fastest round: per shape a table, the targets of (a) with PASS/MISS, judged on
   the net figures (hourly >= 10x, bulk >= 25x less server CPU per GB than INSERT, merges
   counted; wall time >= 1.0x INSERT's; the executors' CPU per GB <= 1.2x the Python tasks'),
   the raw ratio beside each, and why a MISS missed, on stdout; the figures (raw and net) in
   docs/e2e-benchmark.json and a chart of the net figures in docs/e2e-benchmark.png.

Exit status: 0 when every table holds exactly the source rows (a missed target is reported, not
an error: timings on a shared machine are evidence, not a verdict), 1 when one does not, 2 when
the benchmark could not run.
"""

import argparse
import calendar
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "deploy" / "spark" / "examples"))

import chpart_spark  # noqa: E402
from chart import draw_chart  # noqa: E402  (beside this file)
from chpart_spark.writer import CONNECTOR_CLASS, connector_loaded  # noqa: E402

sys.dont_write_bytecode = True  # the benchmark writes nothing into the examples directory
from load_events import COLUMNS, DDL, hour_of_events  # noqa: E402  (the example job's table and generator)

sys.dont_write_bytecode = False

DATABASE = "bench"
CONNECTOR_BATCH_ROWS = 10_000  # spark.clickhouse.write.batchSize's default
TARGET_SPEEDUP = 1.0  # chpart at least as fast end to end
TARGET_CPU_RATIO = 20.0  # at least 20x less server CPU per uncompressed GB during the load (issue 1)
# The connector's executors: at most 1.2x the CPU per uncompressed GB of the Python tasks' (issue 24).
TARGET_EXECUTOR_CPU = 1.2
# The two shapes of issue 12 and their targets: server CPU per GB of INSERT / chpart, merges counted
# until the table is at rest (every table partition merged to one part).
SHAPES = {
    "hourly": {"what": "hourly load: one table partition (a day) spread over the Spark tasks",
               "hour": "2026-11-30T09", "days": None, "target_with_merges": 10.0},
    "bulk": {"what": "bulk reload of history: 24 days in one load, rows clustered by day (each task holds whole days)",
             "hour": "2026-11-01T00", "days": 24, "target_with_merges": 25.0},
}
# The chpart variants: how `chpart_spark.write` runs the job (its argument `via`) and what it is
# given. (a) is what a user with the connector's jar on the classpath gets by default: the JVM
# connector, whose default layout has Spark cluster the rows by table partition (a shuffle)
# before the build. (a-py) keeps the job's own
# partitioning (Python tasks, no shuffle). (a1) is (a-py) with the rows in one task.
CHPART_VIA = {"chpart": "auto", "chpart_py": "python", "chpart1": "python"}
VARIANT_TAGS = {"chpart": "(a)", "chpart_py": "(a-py)", "chpart1": "(a1)", "insert": "(b)"}
VARIANT_LABELS = {
    "chpart": "(a) chpart_spark.write, via the connector",
    "chpart_py": "(a-py) chpart_spark.write, Python tasks",
    "chpart1": "(a1) chpart, Python, each partition in 1 task",
    "insert": "(b) HTTP INSERT ArrowStream, {batch:,}-row POSTs",
}
CLK_TCK = os.sysconf("SC_CLK_TCK")
BUSY_CPUS = 0.2  # CPUs used on average by other processes during a load: above this, its timing is suspect

# Spark's own logging: errors only (the benchmark prints what matters), but the connector's
# build tasks' line on where their stream's time went.
LOG4J2 = """rootLogger.level = error
logger.chpart.name = chpart.spark.ChpartDataWriter
logger.chpart.level = info
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
"""


class BenchError(RuntimeError):
    """The benchmark could not run (as opposed to a result that misses a target)."""


def say(message):
    print(f"[e2e {time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def read_stat(path):
    """(name, fields) of a /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat, fields[0] being
    field 3 (state): utime and stime (fields 14 and 15) are fields[11] and fields[12]. None when
    the process or thread is gone."""
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()


def process_cpu_seconds(pid):
    """utime + stime of a process (all its threads)."""
    _, fields = read_stat(f"/proc/{pid}/stat")
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu_seconds(pid):
    """{thread id: (name, utime + stime)} of each live thread of a process. ClickHouse names its
    threads by what they do (HTTPHandler, QueryPipelineEx, MergeMutate, SystemLogFlush, ...)
    and renames a pool's thread when it takes other work, so compare two readings per thread
    id, not per name."""
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = read_stat(f"/proc/{pid}/task/{tid}/stat")
        if stat is not None:
            name, fields = stat
            threads[tid] = (name, (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return threads


def cpu_by_thread_name(before, after):
    """The CPU each thread used between two readings of `thread_cpu_seconds`, summed by the
    thread's name at the second, largest first. A thread that exited in between takes its CPU
    out of this breakdown (not out of `process_cpu_seconds`)."""
    by_name = {}
    for tid, (name, cpu) in after.items():
        used = cpu - before.get(tid, (name, 0.0))[1]
        if used > 0:
            by_name[name] = by_name.get(name, 0.0) + used
    return sorted(by_name.items(), key=lambda t: -t[1])


def tree_cpu_seconds(root):
    """CPU seconds of `root` and every live descendant, each with the CPU of the children it has
    reaped (utime + stime + cutime + cstime): Spark's JVM and Python workers, chpart,
    clickhouse-local and the server are all descendants of this process."""
    stats = {}
    for entry in os.listdir("/proc"):
        stat = read_stat(f"/proc/{entry}/stat") if entry.isdigit() else None
        if stat is not None:
            fields = stat[1]
            stats[int(entry)] = (int(fields[1]), sum(int(v) for v in fields[11:15]))
    children = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0))[1]
        todo.extend(children.get(pid, ()))
    return total / CLK_TCK


def machine_cpu_seconds():
    """Busy CPU seconds of the whole machine since boot (every process, /proc/stat)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


class Server:
    """A ClickHouse 26.9 server (deploy/dev/clickhouse-server) on free loopback ports in `base`.

    Started with `serve --stop-on-stdin-eof`: closing our end of its stdin stops it cleanly, and
    if this process dies however it dies, the pipe closes and the server stops with it."""

    def __init__(self, base):
        self.data_dir = base / "data"
        self.run_dir = base / "run"
        self.http_port, self.tcp_port = free_ports(2)
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.proc = None
        self.pid = None

    def start(self, timeout=120):
        self.run_dir.mkdir(parents=True)
        # system.query_log (flushed every 7.5 s, the server's default, and on SYSTEM FLUSH LOGS):
        # the server's own CPU per statement, to show where a load's server CPU goes
        extra = self.run_dir.parent / "logs.xml"
        extra.write_text("<query_log><database>system</database><table>query_log</table>"
                         "<flush_interval_milliseconds>7500</flush_interval_milliseconds></query_log>\n")
        log = open(self.run_dir / "server.log", "ab")
        self.proc = subprocess.Popen(
            [str(ROOT / "deploy" / "dev" / "clickhouse-server"), "serve", "--data", str(self.data_dir), "--run-dir",
             str(self.run_dir), "--http-port", str(self.http_port), "--tcp-port", str(self.tcp_port),
             "--config-extra", str(extra), "--stop-on-stdin-eof"],
            stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"the ClickHouse server exited with status {self.proc.returncode}; "
                                 f"log {self.run_dir / 'server.log'}:\n{self.log_tail()}")
            if self.pid is None:
                try:  # the launcher's own pid file: the process whose CPU is measured
                    self.pid = int((self.run_dir / "server.pid").read_text().strip())
                except (OSError, ValueError):
                    pass
            if self.pid is not None and self.ping():
                return
            time.sleep(0.2)
        raise BenchError(f"the ClickHouse server did not answer /ping within {timeout}s:\n{self.log_tail()}")

    def ping(self):
        try:
            with urllib.request.urlopen(self.url + "/ping", timeout=1) as r:
                return r.read().strip() == b"Ok."
        except OSError:
            return False

    def log_tail(self, n=20):
        try:
            return "".join((self.run_dir / "server.log").read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return "(no log)"

    def stop(self, timeout=60):
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.stdin.close()  # EOF ends the server's blocking query: a clean shutdown
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def cpu(self):
        return process_cpu_seconds(self.pid)

    def thread_cpu(self):
        return thread_cpu_seconds(self.pid)

    def query(self, sql, timeout=300):
        request = urllib.request.Request(self.url + "/", data=sql.encode(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return r.read().decode()
        except urllib.error.HTTPError as e:
            raise BenchError(f"ClickHouse refused {sql[:200]!r}: {e.read().decode(errors='replace')}") from None

    def scalar(self, sql):
        return self.query(sql).strip()

    def parts(self, table):
        """(active parts, rows, uncompressed bytes, bytes on disk) of a table."""
        db, name = table.split(".")
        line = self.scalar(
            "SELECT count(), sum(rows), sum(data_uncompressed_bytes), sum(bytes_on_disk) FROM system.parts "
            f"WHERE database = '{db}' AND table = '{name}' AND active FORMAT TSV")
        return [int(v) for v in line.split("\t")]

    def partitions_with_parts(self, table):
        """{partition_id: active parts} of a table."""
        db, name = table.split(".")
        out = self.query("SELECT partition_id, count() FROM system.parts "
                         f"WHERE database = '{db}' AND table = '{name}' AND active GROUP BY partition_id FORMAT TSV")
        return {p: int(n) for p, n in (line.split("\t") for line in out.splitlines() if line)}

    def merge_to_rest(self, table):
        """Brings the table to rest: merges started again, every partition that has more than one
        active part merged into one (`OPTIMIZE TABLE ... PARTITION ID ... FINAL`), and no merge of
        the table left running. A partition that already is one part is left alone, whatever its
        level: a single part is what a merge would make of it. Returns the partitions merged."""
        db, name = table.split(".")
        self.query(f"SYSTEM START MERGES {table}")
        merged = {p: n for p, n in self.partitions_with_parts(table).items() if n > 1}
        for partition in sorted(merged):
            self.query(f"OPTIMIZE TABLE {table} PARTITION ID '{partition}' FINAL")
        while self.scalar(f"SELECT count() FROM system.merges WHERE database = '{db}' AND table = '{name}'") != "0":
            time.sleep(0.2)
        return merged


# The classes of statements a load sends, for the server-CPU breakdown (first match wins).
STATEMENT_CLASS = """multiIf(
    query ILIKE 'INSERT INTO bench.%', 'INSERT of the rows',
    query ILIKE '%ATTACH PART%', 'ATTACH PART',
    query ILIKE '%MOVE PARTITION%', 'MOVE PARTITION',
    query ILIKE 'CHECK TABLE%', 'CHECK TABLE (content check)',
    query ILIKE 'OPTIMIZE TABLE%', 'OPTIMIZE (merge to rest)',
    query ILIKE 'INSERT INTO%', 'ledger INSERT',
    query ILIKE '%`chpart`.%' OR query ILIKE '% chpart.%', 'ledger read',
    query ILIKE '%system.%', 'system tables (observations, table checks)',
    'other (DDL, STOP MERGES, ...)')"""
QUERY_CPU = "(ProfileEvents['UserTimeMicroseconds'] + ProfileEvents['SystemTimeMicroseconds']) / 1e6"


def finished_between(since, until):
    """FROM and WHERE of the statements that finished between two server times (now64(6)), in
    system.query_log, the benchmark's own reads of the clock left out."""
    return (f"FROM system.query_log WHERE type = 'QueryFinish' "
            f"AND event_time_microseconds BETWEEN '{since}' AND '{until}' AND query NOT ILIKE '%now64(6)%'")


def statement_breakdown(server, since, until):
    """[(class, statements, server CPU s)] of the statements that finished between two server
    times (now64(6)), from system.query_log (flushed first): the server's own CPU per statement."""
    server.query("SYSTEM FLUSH LOGS")
    out = server.query(
        f"SELECT {STATEMENT_CLASS} AS class, count(), sum({QUERY_CPU}) {finished_between(since, until)} "
        "GROUP BY class ORDER BY 3 DESC FORMAT TSV")
    return [(c, int(n), float(cpu)) for c, n, cpu in (line.split("\t") for line in out.splitlines() if line)]


def statement_detail(server, since, until, limit=40):
    """The same window's statements grouped by their normalized text and the client that sent
    them, the costliest first: [(class, statements, server CPU s, client, the first one's text,
    cut to 240 characters)]. The client is the first word of the HTTP User-Agent: chpart names
    its command there (`chpart-build/0.1.0`). Kept in the JSON, to see which of chpart's
    statements its server CPU goes to. Reads the log as statement_breakdown's flush left it:
    call it after that."""
    out = server.query(
        f"SELECT {STATEMENT_CLASS} AS class, count(), sum({QUERY_CPU}) AS cpu, "
        "splitByChar(' ', http_user_agent)[1] AS client, "
        "substring(replaceRegexpAll(any(query), '\\s+', ' '), 1, 240) "
        f"{finished_between(since, until)} GROUP BY normalized_query_hash, class, client ORDER BY cpu DESC "
        f"LIMIT {limit} FORMAT TSV")
    return [(c, int(n), float(cpu), who, q)
            for c, n, cpu, who, q in (line.split("\t", 4) for line in out.splitlines() if line)]


def measure_idle(server, secs):
    """The server's CPU rate (CPU s per wall s) with nothing running: every table's merges stopped
    (`SYSTEM STOP MERGES` without a table: the benchmark's, the ledger's and the system logs'), the
    logs flushed first, then `secs` of no statement at all. What the server uses then is its own
    background (asynchronous metrics, the system logs' periodic flushes, its schedulers), which
    runs during every window whether or not a load does, so it is not the load's cost. Merges
    are started again afterwards (the tables are empty or at rest when this runs)."""
    server.query("SYSTEM STOP MERGES")
    server.query("SYSTEM FLUSH LOGS")
    t, cpu = time.monotonic(), server.cpu()
    time.sleep(secs)
    wall, used = time.monotonic() - t, server.cpu() - cpu
    server.query("SYSTEM START MERGES")
    say(f"  server idle: {used:.2f} CPU s in {wall:.1f}s = {used / wall:.4f} CPU s per s")
    return {"wall_secs": wall, "cpu_secs": used, "cpu_per_sec": used / wall}


class Meter:
    """Over a block: wall time, the server's CPU, the machine's busy CPU, and the part of that
    used by processes outside this benchmark's process tree (other work on the machine)."""

    def __init__(self, server):
        self.server = server

    def __enter__(self):
        self.server_t0 = self.server.scalar("SELECT now64(6)")
        self.tree0 = tree_cpu_seconds(os.getpid())
        self.threads0 = self.server.thread_cpu()
        self.t0, self.cpu0, self.machine0 = time.monotonic(), self.server.cpu(), machine_cpu_seconds()
        return self

    def __exit__(self, *exc):
        self.wall = time.monotonic() - self.t0
        self.server_cpu = self.server.cpu() - self.cpu0
        # the server's CPU by thread name, largest first: where the CPU outside statements went
        self.server_threads = cpu_by_thread_name(self.threads0, self.server.thread_cpu())
        self.machine_cpu = machine_cpu_seconds() - self.machine0
        self.tree_cpu = tree_cpu_seconds(os.getpid()) - self.tree0
        self.others_cpu = max(0.0, self.machine_cpu - self.tree_cpu)
        self.server_t1 = self.server.scalar("SELECT now64(6)")
        return False


def make_insert_task(url, table, columns, batch_rows, timeout):
    """The function each Spark task of the INSERT variant runs (mapInArrow): what a
    row-inserting connector does, one `INSERT ... FORMAT ArrowStream` POST per `batch_rows`
    rows of the task's partition, in the partition's order; returns one row of counts."""
    query = f"INSERT INTO {table} ({', '.join(columns)}) FORMAT ArrowStream"
    endpoint = url + "/?" + urllib.parse.urlencode({"query": query})

    def task(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        rows = inserts = 0

        def post(part):
            nonlocal rows, inserts
            part = part.combine_chunks()  # one record batch per request
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, part.schema) as writer:
                writer.write_table(part)
            request = urllib.request.Request(endpoint, data=sink.getvalue().to_pybytes(), method="POST",
                                             headers={"Content-Type": "application/octet-stream"})
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    response.read()
            except urllib.error.HTTPError as e:
                raise RuntimeError(f"INSERT of {part.num_rows} rows failed: {e.read().decode(errors='replace')}") \
                    from None
            rows += part.num_rows
            inserts += 1

        pending = None
        for batch in batches:
            pending = pa.Table.from_batches([batch]) if pending is None else pa.concat_tables(
                [pending, pa.Table.from_batches([batch])])
            while pending.num_rows >= batch_rows:
                post(pending.slice(0, batch_rows))
                pending = pending.slice(batch_rows)
        if pending is not None and pending.num_rows:
            post(pending)
        yield pa.RecordBatch.from_pylist(
            [{"partition": TaskContext.get().partitionId(), "rows": rows, "inserts": inserts}],
            schema=pa.schema([("partition", pa.int32()), ("rows", pa.int64()), ("inserts", pa.int64())]))

    return task


def discard_task(batches):
    """Spark alone: receive the partition's Arrow batches in Python and drop them."""
    import pyarrow as pa

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pylist([{"rows": rows}], schema=pa.schema([("rows", pa.int64())]))


def connector_jar(jar):
    """The connector's jar: `jar` if given, else built by deploy/spark/build-connector.sh (javac
    against pyspark's jars, about 10 s), which prints its path. Without it (a) could not run the
    way a user with the jar runs it, so no jar is a BenchError, never a silent fallback."""
    if jar:
        if not Path(jar).is_file():
            raise BenchError(f"--jar {jar}: no such file")
        return str(Path(jar).resolve())
    script = ROOT / "deploy" / "spark" / "build-connector.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    path = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not Path(path).is_file():
        raise BenchError(f"{script} failed (exit {done.returncode}); it is needed for the connector variant:\n"
                         f"{done.stderr.strip()[-2000:]}")
    return path


def start_spark(base, partitions, jar):
    conf_dir = base / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "log4j2.properties").write_text(LOG4J2)
    os.environ["SPARK_CONF_DIR"] = str(conf_dir)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # pyspark 4.3 warns in every Python worker that pandas >= 3 is not fully supported.
    os.environ["PYTHONWARNINGS"] = "ignore:PySpark does not yet fully support pandas:FutureWarning"
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").appName("chpart-e2e-benchmark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={conf_dir / 'log4j2.properties'}")
        .config("spark.local.dir", str(base / "spark-local"))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.jars", jar)  # the connector, as a user with the jar runs chpart_spark.write
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    if not connector_loaded(spark):
        raise BenchError(f"{CONNECTOR_CLASS} is not loadable in the Spark session started with spark.jars={jar}")
    return spark


def write_chpart_config(path, server, work_dir):
    """chpart's config for a server on this machine: local transport, staging next to the data."""
    path.write_text(
        "[clickhouse]\n"
        f'url = "{server.url}"\n'
        "request_timeout_secs = 300\n"
        "[transport]\n"
        'kind = "local"\n'
        "[clickhouse_local]\n"
        f'command = "{ROOT / "deploy" / "dev" / "clickhouse-local"}"\n'
        f'work_dir = "{work_dir}"\n'
        "[staging]\n"
        f'root = "{server.data_dir / "chpart-staging"}"\n'
        "[ledger]\n"
        'database = "chpart"\n')


def variant_figures(meter, server, table, rows, extra):
    """The figures of one load, taken as soon as it returned. The table's merges are stopped first:
    ClickHouse schedules merges when it likes (its selector backs off up to 60 s), and a merge of
    this table must not land in the next load's measurement."""
    server.query(f"SYSTEM STOP MERGES {table}")
    parts, table_rows, uncompressed, on_disk = server.parts(table)
    return {
        "table": table,
        "wall_secs": meter.wall,
        "rows": rows,
        "rows_per_sec": rows / meter.wall,
        "server_cpu_secs": meter.server_cpu,
        "uncompressed_bytes": uncompressed,
        "bytes_on_disk": on_disk,
        "server_cpu_secs_per_gb": meter.server_cpu / (uncompressed / 1e9),
        "server_threads_cpu_secs": meter.server_threads,
        "machine_cpu_secs": meter.machine_cpu,
        "other_processes_cpu_secs": meter.others_cpu,
        # this script's process tree: Spark (driver, executors, Python workers), chpart, clickhouse-local,
        # the server: the load's whole work, executors' side included
        "benchmark_cpu_secs": meter.tree_cpu,
        # the same without the server: Spark, the Python workers, chpart and clickhouse-local (or
        # the INSERT tasks' HTTP clients), i.e. what the executors spent
        "executor_cpu_secs": meter.tree_cpu - meter.server_cpu,
        "executor_cpu_secs_per_gb": (meter.tree_cpu - meter.server_cpu) / (uncompressed / 1e9),
        "parts_after_load": parts,
        "table_rows_after_load": table_rows,
        **extra,
    }


def merge_figures(server, variant):
    """What it costs the server to bring the loaded table to rest: one part per table partition,
    the state every table of a shape ends in (see `Server.merge_to_rest`)."""
    with Meter(server) as m:
        merged = server.merge_to_rest(variant["table"])
    gb = variant["uncompressed_bytes"] / 1e9
    variant.update({
        "merge_secs": m.wall,
        "merge_server_cpu_secs": m.server_cpu,
        "merge_statements": statement_breakdown(server, m.server_t0, m.server_t1),
        "merge_server_cpu_secs_per_gb": m.server_cpu / gb,
        "partitions_merged": len(merged),
        "parts_merged": sum(merged.values()),
        "parts_after_merge": server.parts(variant["table"])[0],
        "partitions": len(server.partitions_with_parts(variant["table"])),
        "server_cpu_secs_per_gb_with_merge": (variant["server_cpu_secs"] + m.server_cpu) / gb,
    })


def days_of_events(spark, start_hour, rows, partitions, days):
    """The example's `rows` events, their hour stretched over `days` days from `start_hour`: the
    same deterministic rows, with timestamps still rising with the row number. Spark's range
    gives each task a contiguous range of row numbers, so each task holds a contiguous run of
    days: the rows are clustered by table partition, as a reload that reads its history day by
    day, or repartitions by range on the partition key, hands them to the writer. When `days`
    divides `rows` and the number of tasks divides `days` (6M rows, 24 days, 4 tasks), every day
    lies in one task; otherwise the days at task boundaries are split between two tasks, so two
    parts, which the merges to rest then count."""
    from pyspark.sql import functions as F

    start_ms = calendar.timegm(time.strptime(start_hour + ":00:00", "%Y-%m-%dT%H:%M:%S")) * 1000
    df = hour_of_events(spark, start_hour, rows, partitions)
    return df.withColumn("event_time", F.timestamp_millis(
        F.lit(start_ms) + (F.unix_millis(F.col("event_time")) - F.lit(start_ms)) * F.lit(24 * days)))


def shape_frames(spark, shape, args):
    """(the shape's DataFrame, {variant: DataFrame it loads}) in variant order."""
    spec = SHAPES[shape]
    if spec["days"] is None:
        df = hour_of_events(spark, spec["hour"], args.rows, args.partitions)
        # (a1): the same rows in one task, so the Python tasks make one part of its one table
        # partition (through the connector, coalesce(1) would be undone by the layout's shuffle)
        return df, {"chpart": df, "chpart_py": df, "chpart1": df.coalesce(1), "insert": df}
    df = days_of_events(spark, spec["hour"], args.bulk_rows, args.partitions, spec["days"])
    return df, {"chpart": df, "chpart_py": df, "insert": df}


def run_shape(shape, spark, server, config, chpart, args, idle):
    """One shape: source checksum, Spark alone, --repeat rounds of every variant, verification.
    `idle` is the run's record of the idle server: without a "start" yet (the first shape), the
    idle server is measured after the warm-up, before the first load."""
    spec = SHAPES[shape]
    rows = args.rows if spec["days"] is None else args.bulk_rows
    df, frames = shape_frames(spark, shape, args)
    tables = {name: f"{DATABASE}.{shape}_{name}" for name in frames}
    for table in tables.values():
        server.query(DDL.format(table=table))
    out = {"what": spec["what"], "rows": rows, "spark_partitions": args.partitions, "days": spec["days"] or 1,
           "first_hour": spec["hour"], "tables": tables, "target_with_merges": spec["target_with_merges"]}
    say(f"shape {shape}: {spec['what']}; {rows:,} events from {spec['hour']}:00 UTC over {spec['days'] or 1} "
        f"day(s), {args.partitions} Spark partitions")
    t = time.monotonic()
    source = chpart_spark.spark_checksum(df)  # also warms the JVM and the Python workers
    say(f"  source: {source.rows:,} rows, checksum {source.hex} ({time.monotonic() - t:.1f}s, warm-up)")
    if source.rows != rows:
        raise BenchError(f"the generator made {source.rows} rows, not {rows}")
    with Meter(server) as m:
        n = sum(r.rows for r in df.mapInArrow(discard_task, "rows LONG").collect())
    out["spark_alone"] = {"wall_secs": m.wall, "rows": n, "machine_cpu_secs": m.machine_cpu,
                          "server_cpu_secs": m.server_cpu, "other_processes_cpu_secs": m.others_cpu}
    say(f"  Spark alone (generate, hand the Arrow batches to Python, discard): {m.wall:.1f}s")
    if "start" not in idle:
        idle["start"] = measure_idle(server, args.idle_secs)

    names = list(frames)
    if args.first == "insert":
        names = names[::-1]
    rounds = []
    for number in range(args.repeat):
        order = names if number % 2 == 0 else names[::-1]
        say(f"  round {number + 1} of {args.repeat}: {' then '.join(order)}")
        if number:
            for table in tables.values():
                server.query(f"TRUNCATE TABLE {table} SYNC")
        rounds.append(one_round(order, frames, tables, rows, server, config, chpart, args))
    out["rounds"] = rounds
    # each variant's fastest round, with every figure of that round
    out["variants"] = {name: min((r["variants"][name] for r in rounds), key=lambda f: f["wall_secs"])
                       for name in names}
    say(f"  verifying every table of {shape} against the source (count + checksum)")
    out["source"] = {"rows": source.rows, "checksum": source.hex}
    verify = {}
    for name, table in tables.items():
        count = int(server.scalar(f"SELECT count() FROM {table}"))
        loaded = chpart_spark.clickhouse_checksum(server.url, f"SELECT {', '.join(COLUMNS)} FROM {table}")
        verify[name] = {"count": count, "checksum": loaded.hex, "equal": count == source.rows and loaded == source}
    out["verify"] = verify
    return out


def run(args, base):
    chpart = Path(args.chpart)
    if not os.access(chpart, os.X_OK):
        raise BenchError(f"{chpart} not found: run `cargo build --release` first")
    result = {
        "benchmark": "chpart end-to-end: chpart_spark.write vs Spark tasks inserting over HTTP, merges counted "
                     "until the tables are at rest (one part per table partition)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                    "load_average_at_start": os.getloadavg()},
        "chpart_version": subprocess.run([str(chpart), "--version"], capture_output=True, text=True).stdout.strip(),
        "params": {"rows": args.rows, "bulk_rows": args.bulk_rows, "partitions": args.partitions,
                   "spark_master": "local[2]", "insert_format": "ArrowStream",
                   "insert_batch_rows": args.insert_batch_rows, "repeat": args.repeat, "first": args.first,
                   "shapes": args.shapes},
        "shapes": {},
    }

    server = Server(base / "clickhouse")
    say(f"starting ClickHouse (deploy/dev/clickhouse-server) on 127.0.0.1:{server.http_port}, data in {base}")
    try:
        server.start()
        result["server_version"] = server.scalar("SELECT version()")
        server.query(f"CREATE DATABASE {DATABASE}")
        config = base / "chpart.toml"
        (base / "work").mkdir()
        write_chpart_config(config, server, base / "work")

        jar = connector_jar(args.jar)
        result["connector_jar"] = jar
        say(f"starting Spark (local[2]), {args.partitions} partitions, the connector on its classpath: {jar}")
        spark = start_spark(base, args.partitions, jar)
        try:
            idle = result["server_idle"] = {}
            for shape in args.shapes:
                result["shapes"][shape] = run_shape(shape, spark, server, config, chpart, args, idle)
            idle["end"] = measure_idle(server, args.idle_secs)  # every table at rest
        finally:
            spark.stop()
    finally:
        server.stop()
        say("server stopped")
    return result


def one_round(order, frames, tables, rows, server, config, chpart, args):
    """Every variant's load in `order` into its (empty) table, its merges stopped after it; then
    each table brought to rest (one part per table partition)."""
    figures = {"order": list(order), "variants": {}}
    for name in order:
        table, df = tables[name], frames[name]
        if name.startswith("chpart"):
            say(f"    {VARIANT_LABELS[name]} -> {table}")
            load_id = f"e2e-{name}-{time.strftime('%Y%m%dT%H%M%S')}"
            with Meter(server) as m:
                summary = chpart_spark.write(df, table=table, load_id=load_id, config=str(config), chpart=str(chpart),
                                             via=CHPART_VIA[name])
            expected = "connector" if CHPART_VIA[name] == "auto" else CHPART_VIA[name]
            if summary["via"] != expected:
                raise BenchError(f"{name}: chpart_spark.write ran its job via {summary['via']!r}, not {expected!r}")
            # Which tasks built parts: through the connector, the layout's shuffle may leave tasks
            # empty (the hourly shape's one day lands in one task). Asked after the meter stopped.
            (load,) = chpart_spark.status(str(config), load_id, chpart=str(chpart))
            extra = {"load_id": load_id, "via": summary["via"], "phases_secs": summary["seconds"],
                     "parts_attached": summary["parts"], "spark_tasks": summary["spark_partitions"],
                     "tasks_with_parts": sum(1 for a in load["attempts"] if a["won"] and a["parts"])}
            loaded = summary["rows"]
        else:
            say(f"    (b) Spark tasks POST INSERT ... FORMAT ArrowStream, {args.insert_batch_rows:,} rows per "
                f"request -> {table}")
            task = make_insert_task(server.url, table, COLUMNS, args.insert_batch_rows, timeout=300)
            with Meter(server) as m:
                out = df.mapInArrow(task, "partition INT, rows LONG, inserts LONG").collect()
            extra = {"inserts": sum(r.inserts for r in out), "spark_tasks": len(out)}
            loaded = sum(r.rows for r in out)
        say(f"      {m.wall:.1f}s, server CPU {m.server_cpu:.2f}s")
        extra["statements"] = statement_breakdown(server, m.server_t0, m.server_t1)
        extra["statement_detail"] = statement_detail(server, m.server_t0, m.server_t1)
        figures["variants"][name] = variant_figures(m, server, table, loaded, extra)
        if figures["variants"][name]["table_rows_after_load"] != rows:
            raise BenchError(f"{table} holds {figures['variants'][name]['table_rows_after_load']} rows after the "
                             f"load, the source has {rows}")
    for name in order:
        say(f"    bringing {tables[name]} to rest (OPTIMIZE ... PARTITION ... FINAL where a partition has > 1 part)")
        merge_figures(server, figures["variants"][name])
        f = figures["variants"][name]
        say(f"      {f['parts_after_load']} -> {f['parts_after_merge']} part(s), {f['partitions_merged']} partition(s) "
            f"merged, server CPU {f['merge_server_cpu_secs']:.2f}s")
    return figures


def statements_cpu(statements):
    return sum(cpu for _, _, cpu in statements)


def net_of_idle(result):
    """Every load's and merge's server CPU net of the idle server's: raw - rate x the window's wall
    time, never below what query_log attributes to the window's statements (their CPU is the
    window's own, whatever the rate). The rate is the lower of the two idle measurements (after
    the warm-up, at the end): the conservative one for chpart, whose raw figures are several
    times the idle background over its wall time, while INSERT's are a hundred times it or more.
    Subtracting less never credits chpart with more than surely is background; a measurement
    that came out higher may hold a one-off (a late log flush) or grow with the tables and parts
    the server watches."""
    idle = result["server_idle"]
    rate = idle["cpu_per_sec"] = min(idle["start"]["cpu_per_sec"], idle["end"]["cpu_per_sec"])
    idle["rule"] = "the lower of the two measurements (conservative for chpart)"
    for r in result["shapes"].values():
        s = r["spark_alone"]
        s["server_cpu_secs_net"] = max(0.0, s["server_cpu_secs"] - rate * s["wall_secs"])
        for rd in r["rounds"]:  # r["variants"] holds some of these same dicts
            for f in rd["variants"].values():
                gb = f["uncompressed_bytes"] / 1e9
                f["idle_cpu_secs"] = rate * f["wall_secs"]
                f["server_cpu_secs_net"] = max(f["server_cpu_secs"] - f["idle_cpu_secs"],
                                               statements_cpu(f["statements"]))
                f["server_cpu_secs_per_gb_net"] = f["server_cpu_secs_net"] / gb
                f["merge_idle_cpu_secs"] = rate * f["merge_secs"]
                f["merge_server_cpu_secs_net"] = max(f["merge_server_cpu_secs"] - f["merge_idle_cpu_secs"],
                                                     statements_cpu(f["merge_statements"]))
                f["merge_server_cpu_secs_per_gb_net"] = f["merge_server_cpu_secs_net"] / gb
                f["server_cpu_secs_per_gb_with_merge_net"] = (f["server_cpu_secs_net"]
                                                              + f["merge_server_cpu_secs_net"]) / gb


def add_targets(result):
    for shape, r in result["shapes"].items():
        v = r["variants"]
        b = v["insert"]
        targets = {}
        for name in (n for n in v if n != "insert"):
            a = v[name]
            ratio = lambda key: b[key] / a[key]  # noqa: E731
            with_merges = ratio("server_cpu_secs_per_gb_with_merge_net")
            during = ratio("server_cpu_secs_per_gb_net")
            speedup = b["wall_secs"] / a["wall_secs"]
            goal = r["target_with_merges"]
            targets[name] = {
                "cpu_ratio_with_merges": {"value": with_merges, "raw_value": ratio("server_cpu_secs_per_gb_with_merge"),
                                          "target": goal, "pass": with_merges >= goal,
                                          "meaning": "INSERT's server CPU s per uncompressed GB / chpart's, load plus "
                                                     "the merges until the table is at rest, each net of the idle "
                                                     "server's CPU over its wall time (the load's marginal cost); "
                                                     "raw_value: the same without subtracting idle"},
                "cpu_ratio_during_load": {"value": during, "raw_value": ratio("server_cpu_secs_per_gb"),
                                          "target": TARGET_CPU_RATIO, "pass": during >= TARGET_CPU_RATIO,
                                          "meaning": "the same, during the load only"},
                "speedup": {"value": speedup, "target": TARGET_SPEEDUP, "pass": speedup >= TARGET_SPEEDUP,
                            "meaning": "INSERT variant's wall time / chpart's"},
                "why": None if with_merges >= goal else miss_reason(a, b, goal),
            }
            if "chpart_py" in v and name != "chpart_py":
                executor = a["executor_cpu_secs_per_gb"] / v["chpart_py"]["executor_cpu_secs_per_gb"]
                targets[name]["executor_cpu_vs_python"] = {
                    "value": executor, "target": TARGET_EXECUTOR_CPU, "pass": executor <= TARGET_EXECUTOR_CPU,
                    "meaning": "the benchmark's processes but the server (Spark, Python workers, chpart, "
                               "clickhouse-local), CPU s per uncompressed GB, over (a-py)'s"}
        r["targets"] = targets


def miss_reason(a, b, goal):
    """Where chpart's server CPU (net of idle) went, when the ratio with merges misses its target."""
    total = a["server_cpu_secs_per_gb_with_merge_net"]
    merge = a["merge_server_cpu_secs_per_gb_net"]
    insert = b["server_cpu_secs_per_gb_with_merge_net"]
    text = (f"chpart's {total:.2f} CPU s/GB net of idle are {a['server_cpu_secs_per_gb_net']:.2f} for the load and "
            f"{merge:.2f} ({100 * merge / total:.0f}%) for merging {a['parts_merged']} parts in "
            f"{a['partitions_merged']} of {a['partitions']} table partition(s) into one each")
    if a["partitions_merged"]:
        text += (f": {a['parts_merged'] / a['partitions_merged']:.1f} parts per merged partition (one per task that "
                 f"held its rows), and a merge rewrites the whole partition once, so chpart can be at most "
                 f"{insert / max(merge, 1e-9):.1f}x below INSERT's {insert:.2f} CPU s/GB while its tasks split a "
                 f"partition")
    gb = a["uncompressed_bytes"] / 1e9
    top = ", ".join(f"{c} {cpu / gb:.2f}" for c, _, cpu in a["statements"][:4])
    outside = outside_net(a) / gb
    threads = ", ".join(f"{name} {cpu:.2f}" for name, cpu in a.get("server_threads_cpu_secs", [])[:6])
    return text + (f" (target {goal:.0f}x needs chpart at <= {insert / goal:.2f}); chpart's load in CPU s/GB by "
                   f"statement: {top}; outside statements, net of idle, {outside:.2f}; the server's threads "
                   f"during the load, CPU s (statements included, idle not subtracted): {threads}")


def tradeoff_text(a, py):
    """(a), the connector's layout, against (a-py), the job's own partitioning: what the layout's
    shuffle costs on the executors against the merges it saves the server."""
    return (f"layout: (a) clustered by table partition, {a['parts_after_load']} part(s) built by "
            f"{a['tasks_with_parts']} of {a['spark_tasks']} task(s), against (a-py)'s {py['parts_after_load']} part(s) "
            f"from {py['tasks_with_parts']} task(s): server CPU to rest, net of idle, "
            f"{a['merge_server_cpu_secs_net']:.2f}s against {py['merge_server_cpu_secs_net']:.2f}s; the benchmark's processes (Spark with the layout's shuffle, "
            f"chpart build, the server) {a['benchmark_cpu_secs']:.1f} CPU s against {py['benchmark_cpu_secs']:.1f}, "
            f"wall {a['wall_secs']:.1f}s against {py['wall_secs']:.1f}s. The trade-off is tasks per table partition "
            f"against merges: the shuffle is paid on the executors, a merge on the server")


def outside_net(f):
    """The load's server CPU outside any statement, net of the idle server's: what the load's
    background caused (the ledger's merges, flushing the load's query_log rows, (b)'s merges)."""
    return f["server_cpu_secs_net"] - statements_cpu(f["statements"])


def breakdown_text(f):
    """The load's server CPU per statement class, and the rest, raw and net of idle."""
    items = [f"{c} {cpu:.2f}s ({n})" for c, n, cpu in f["statements"]]
    rest = f["server_cpu_secs"] - statements_cpu(f["statements"])
    return ", ".join(items + [f"outside statements {rest:.2f}s raw, of which the idle server's {f['idle_cpu_secs']:.2f}s "
                              f"({f['wall_secs']:.1f}s wall): net {outside_net(f):.2f}s (merges, log flushes)"]) + (
        "; by server thread (statements included, idle not subtracted): "
        + ", ".join(f"{name} {cpu:.2f}s" for name, cpu in f.get("server_threads_cpu_secs", [])[:8]))


def merged_of(f):
    """"parts merged/partitions merged" of a variant, e.g. "8/1p"."""
    return f"{f['parts_merged']}/{f['partitions_merged']}p"


def print_report(result):
    p = result["params"]
    mark = lambda ok: "PASS" if ok else "MISS"  # noqa: E731
    print()
    idle = result["server_idle"]
    print(f"chpart end to end, merges counted: {p['partitions']} Spark partitions, {p['spark_master']}, ClickHouse "
          f"{result['server_version']}, {result['machine']['cpus']} CPUs, best of {p['repeat']} round(s)")
    print(f"server idle (no statement, every table's merges stopped): {idle['start']['cpu_per_sec']:.4f} CPU s per s "
          f"after the warm-up ({idle['start']['cpu_secs']:.2f} s in {idle['start']['wall_secs']:.1f} s), "
          f"{idle['end']['cpu_per_sec']:.4f} at the end ({idle['end']['cpu_secs']:.2f} s in "
          f"{idle['end']['wall_secs']:.1f} s). Server CPU figures are net of idle: raw - {idle['cpu_per_sec']:.4f} "
          f"(the lower rate, conservative for chpart) x the window's wall time, never below its statements' own "
          f"CPU (query_log): the load's marginal cost, on which PASS/MISS is judged; raw figures in parentheses")
    for shape, r in result["shapes"].items():
        v = r["variants"]
        print()
        print(f"== {shape}: {r['what']}: {r['rows']:,} events over {r['days']} day(s) ({r['days']} table "
              f"partition(s)), {r['spark_partitions']} tasks")
        net_raw = lambda key: f"{f[key + '_net']:.2f} ({f[key]:.2f})"  # noqa: E731
        header = (f"{'load':<46}{'wall s':>7}{'rows/s':>10}{'GB':>7}{'parts':>6}{'load s/GB':>14}{'merge s/GB':>14}"
                  f"{'total s/GB':>14}{'merged':>12}{'machine CPU s':>14}{'others':>7}")
        print("server CPU s/GB: net of idle (raw)")
        print(header)
        print("-" * len(header))
        for name, f in v.items():
            label = VARIANT_LABELS[name].format(batch=p["insert_batch_rows"])
            print(f"{label:<46}{f['wall_secs']:>7.1f}{f['rows_per_sec']:>10,.0f}{f['uncompressed_bytes'] / 1e9:>7.3f}"
                  f"{f['parts_after_load']:>6}{net_raw('server_cpu_secs_per_gb'):>14}"
                  f"{net_raw('merge_server_cpu_secs_per_gb'):>14}{net_raw('server_cpu_secs_per_gb_with_merge'):>14}"
                  f"{merged_of(f):>12}"
                  f"{f['machine_cpu_secs']:>14.1f}{f['other_processes_cpu_secs']:>7.1f}")
        s = r["spark_alone"]
        print(f"{'(s) Spark alone: generate + Arrow to Python':<46}{s['wall_secs']:>7.1f}"
              f"{s['rows'] / s['wall_secs']:>10,.0f}{'':>67}{s['machine_cpu_secs']:>14.1f}"
              f"{s['other_processes_cpu_secs']:>7.1f}")
        print(f"(s) the server during Spark alone (no load): {s['server_cpu_secs']:.2f} CPU s in {s['wall_secs']:.1f} s "
              f"= {s['server_cpu_secs'] / s['wall_secs']:.4f} CPU s per s, net of idle {s['server_cpu_secs_net']:.2f} s "
              f"(a check of the idle rate while the machine is busy)")
        for name, f in v.items():
            if name.startswith("chpart"):
                ph = f["phases_secs"]
                if f["via"] == "connector":
                    how = (f"df.write.format(\"chpart\").save() {ph['write']:.1f}s (begin, the Spark job with the "
                           f"layout's shuffle and chpart build, commit)")
                else:
                    how = (f"begin {ph['begin']:.2f}s, Spark job with chpart build {ph['job']:.1f}s, commit "
                           f"{ph['commit']:.2f}s")
                print(f"{name} via {f['via']}: {how}; {f['parts_attached']} part(s) attached, built by "
                      f"{f['tasks_with_parts']} of {f['spark_tasks']} task(s)")
        print(f"insert: {v['insert']['inserts']} INSERT requests from {v['insert']['spark_tasks']} tasks")
        if "chpart_py" in v:
            print(tradeoff_text(v["chpart"], v["chpart_py"]))
        for name, f in v.items():
            print(f"{name}: the load's server CPU by statement (query_log): " + breakdown_text(f))
        for name, f in v.items():
            print(f"{name}: at rest in {f['merge_secs']:.1f}s: {f['parts_after_load']} -> {f['parts_after_merge']} "
                  f"part(s) in {f['partitions']} partition(s), server CPU net of idle {f['merge_server_cpu_secs_net']:.2f}s "
                  f"(raw {f['merge_server_cpu_secs']:.2f}s, statements {statements_cpu(f['merge_statements']):.2f}s); "
                  f"load: net {f['server_cpu_secs_net']:.2f}s (raw {f['server_cpu_secs']:.2f}s)")
        busy = [f"round {i + 1} {name} ({f['other_processes_cpu_secs']:.1f} CPU s in {f['wall_secs']:.1f} s)"
                for i, rd in enumerate(r["rounds"]) for name, f in rd["variants"].items()
                if f["other_processes_cpu_secs"] > BUSY_CPUS * f["wall_secs"]]
        if busy:
            print("NOTE: processes outside the benchmark used the CPUs during " + ", ".join(busy)
                  + ": wall times are suspect (server CPU figures are the server's own)")
        src = r["source"]
        print(f"source (Spark) {src['rows']:>12,} rows  checksum {src['checksum']}")
        for name, table in r["tables"].items():
            c = r["verify"][name]
            print(f"{table:<24}{c['count']:>12,} rows  checksum {c['checksum']}  "
                  f"{'identical' if c['equal'] else 'DIFFERENT'}")
        print("targets:")
        for name, t in r["targets"].items():
            tag = VARIANT_TAGS[name]
            c = t["cpu_ratio_with_merges"]
            primary = name == "chpart"
            print(f"  {shape} {tag}: server CPU per GB with merges until at rest, net of idle, (b) / {tag} = "
                  f"{c['value']:.1f}x (>= {c['target']:.0f}x)  "
                  + (mark(c["pass"]) if primary else
                     f"{'meets' if c['pass'] else 'misses'} it (alternative, not the shape's figure)")
                  + f"  (raw: {c['raw_value']:.1f}x)")
            if t["why"] and primary:
                print(f"    MISS: {t['why']}")
            d = t["cpu_ratio_during_load"]
            sp = t["speedup"]
            print(f"    during the load only, net of idle: {d['value']:.1f}x (raw {d['raw_value']:.1f}x) "
                  f"(>= {d['target']:.0f}x) {mark(d['pass'])}; wall (b) / {tag} = {sp['value']:.2f}x "
                  f"(>= {sp['target']:.1f}x) {mark(sp['pass'])}")
            e = t.get("executor_cpu_vs_python")
            if e:
                print(f"    executors' CPU per GB, {tag} / (a-py) = {e['value']:.2f}x (<= {e['target']:.1f}x) "
                      f"{mark(e['pass'])}: {v[name]['executor_cpu_secs_per_gb']:.1f} against "
                      f"{v['chpart_py']['executor_cpu_secs_per_gb']:.1f} CPU s/GB")


def rounded(value):
    """The result with floats cut to 4 decimals, for a readable JSON file."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rows", type=int, default=4_000_000, help="events of the hourly shape (one day partition)")
    p.add_argument("--bulk-rows", type=int, default=6_000_000, help="events of the bulk shape (24 day partitions)")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES), help="which shapes to run")
    p.add_argument("--partitions", type=int, default=4, help="Spark partitions (= tasks of each load)")
    p.add_argument("--insert-batch-rows", type=int, default=CONNECTOR_BATCH_ROWS,
                   help="rows per INSERT request of the HTTP variant")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of both loads; the order alternates, each variant's fastest round is reported")
    p.add_argument("--first", default="chpart", choices=["chpart", "insert"], help="which load runs first in round 1")
    p.add_argument("--chpart", default=str(ROOT / "target" / "release" / "chpart"), help="the chpart binary")
    p.add_argument("--jar", help="the connector's jar (default: built by deploy/spark/build-connector.sh)")
    p.add_argument("--out-dir", default=str(ROOT / "docs"), help="where e2e-benchmark.json and .png go")
    p.add_argument("--idle-secs", type=float, default=15,
                   help="how long the idle server's CPU is sampled, after the warm-up and at the end")
    p.add_argument("--work-dir", help="where the temp directory is made (default: the system's)")
    p.add_argument("--keep", action="store_true", help="keep the temp directory (server data, logs)")
    args = p.parse_args()
    if args.rows < 1 or args.bulk_rows < 1 or args.partitions < 1 or args.repeat < 1 or args.insert_batch_rows < 1:
        p.error("--rows, --partitions, --repeat and --insert-batch-rows must be at least 1")
    try:
        import matplotlib  # noqa: F401  (checked now, not after the run)
    except ImportError:
        print(f"e2e: matplotlib is needed for the chart: {sys.executable} -m pip install matplotlib", file=sys.stderr)
        return 2

    # SIGTERM unwinds like Ctrl-C, so Spark and the server are stopped and the temp dir removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = Path(tempfile.mkdtemp(prefix="chpart-e2e-", dir=args.work_dir))
    started = time.monotonic()
    try:
        result = run(args, base)
    except BenchError as e:
        print(f"e2e: {e}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    result["benchmark_secs"] = time.monotonic() - started
    net_of_idle(result)
    add_targets(result)
    print_report(result)

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e-benchmark.json").write_text(json.dumps(rounded(result), indent=1) + "\n")
    draw_chart(result, out / "e2e-benchmark.png", VARIANT_TAGS)
    print(f"\nwrote {out / 'e2e-benchmark.json'} and {out / 'e2e-benchmark.png'} "
          f"(whole run {result['benchmark_secs']:.0f}s)")
    if not all(c["equal"] for r in result["shapes"].values() for c in r["verify"].values()):
        print("e2e: a table does not hold exactly the source rows", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
