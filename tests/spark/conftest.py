"""Fixtures for the Spark end-to-end tests: a real ClickHouse 26.9 engine per test (started with
deploy/dev/clickhouse-server on free ports), a chpart config for it (local transport), the chpart
binary and a real local Spark session with its event log.

Nothing here skips: a missing Java, pyspark, chpart_spark or chpart binary is a test error that
names the command to fix it.
"""

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ports import free_port  # noqa: E402 (found through the line above when a job script imports this module)
INSTALL_HINT = "run `bash deploy/install.sh` from the repository root"

# Mutation testing (tests/spark/mutants/README.md): CHPART_TEST_MUTANT=<name> breaks the winner
# selection of chpart_spark in this driver process and in the drivers started from it
# (driver_job.py and failure_jobs/run_job.py import this module).
if os.environ.get("CHPART_TEST_MUTANT") or os.environ.get("TESTMUTANT_NAME"):
    import mutants

    mutants.activate_from_env()

# Spark's Python workers must run this interpreter (the venv with pyarrow and chpart_spark).
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def _fail(message):
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def chpart_bin():
    """The chpart binary: $TEST_CHPART_BIN, else `cargo build --bin chpart` (debug) is run."""
    path = os.environ.get("TEST_CHPART_BIN")
    if path:
        if not os.access(path, os.X_OK):
            _fail(f"TEST_CHPART_BIN={path} is not an executable file")
        return path
    cargo = shutil.which("cargo")
    if not cargo:
        _fail("the chpart binary is needed: set TEST_CHPART_BIN or install the Rust toolchain (cargo)")
    build = subprocess.run([cargo, "build", "--locked", "--bin", "chpart"], cwd=ROOT, capture_output=True, text=True)
    if build.returncode != 0:
        _fail(f"cargo build --bin chpart failed:\n{build.stderr[-4000:]}")
    path = ROOT / "target" / "debug" / "chpart"
    if not path.exists():
        _fail(f"cargo build did not produce {path}")
    return str(path)


@pytest.fixture(scope="session")
def connector_jar():
    """The JVM connector's jar (`format("chpart")`): $TEST_CHPART_JAR (deploy/test.sh builds it
    first), else built now by deploy/spark/build-connector.sh, so no test runs a stale jar (with
    the portable chpart inside: a cold build-portable.sh takes minutes)."""
    path = os.environ.get("TEST_CHPART_JAR")
    if path:
        if not os.path.isfile(path):
            _fail(f"TEST_CHPART_JAR={path} is not a file: run bash deploy/spark/build-connector.sh")
        return path
    if not shutil.which("javac"):
        _fail("javac is needed to build the JVM connector: install openjdk-17-jdk-headless (bash deploy/install.sh)")
    build = subprocess.run(["bash", str(ROOT / "deploy" / "spark" / "build-connector.sh")], capture_output=True,
                           text=True, timeout=1800)
    if build.returncode != 0:
        _fail(f"deploy/spark/build-connector.sh failed ({build.returncode}):\n{build.stdout}\n{build.stderr[-4000:]}")
    path = build.stdout.strip().splitlines()[-1]
    if not os.path.isfile(path):
        _fail(f"deploy/spark/build-connector.sh printed {path!r}, which is not a file")
    return path


def pyspark_jars():
    import pyspark

    return os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "jars")


def compile_jar(out, sources, classpath, name):
    """`sources` compiled by javac against `classpath` into the jar `out/name`."""
    if not shutil.which("javac") or not shutil.which("jar"):
        pytest.fail("javac and jar are needed: install openjdk-17-jdk-headless (bash deploy/install.sh)",
                    pytrace=False)
    classes = out / "classes"
    classes.mkdir()
    javac = subprocess.run(["javac", "--release", "17", "-Xlint:all,-path,-classfile", "-Werror", "-cp",
                            os.pathsep.join(classpath), "-d", str(classes), *sources],
                           capture_output=True, text=True, timeout=300)
    assert javac.returncode == 0, f"javac {sources} failed:\n{javac.stdout}\n{javac.stderr}"
    jar = out / name
    subprocess.run(["jar", "--create", "--file", str(jar), "-C", str(classes), "."], check=True, timeout=120)
    return str(jar)


# Both jars are the same for every test that uses them: compiled once per session.
@pytest.fixture(scope="session")
def test_classes(connector_jar, tmp_path_factory):
    """java/*.java (the test plugin and the test programs) compiled against pyspark's jars and
    the connector's jar, as one jar."""
    sources = sorted(str(p) for p in (ROOT / "tests" / "spark" / "java").glob("*.java"))
    return compile_jar(tmp_path_factory.mktemp("test-classes"), sources,
                       [os.path.join(pyspark_jars(), "*"), connector_jar], "chpart-test-classes.jar")


@pytest.fixture(scope="session")
def load_events_job(tmp_path_factory):
    """deploy/spark/examples/LoadEvents.java (the Java example) compiled against pyspark's jars
    into a job jar."""
    return compile_jar(tmp_path_factory.mktemp("load-events"),
                       [str(ROOT / "deploy" / "spark" / "examples" / "LoadEvents.java")],
                       [os.path.join(pyspark_jars(), "*")], "load-events.jar")


@pytest.fixture(scope="session", autouse=True)
def environment():
    """Java 17, pyspark 4.3.0, chpart_spark (from deploy/spark) and the engine must be there."""
    java = shutil.which("java") or "/usr/bin/java"
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        _fail(f"Java is needed for Spark ({e}); install openjdk-17-jre-headless")
    if out.returncode != 0:
        _fail(f"`java -version` failed: {out.stderr}")
    try:
        import pyspark
    except ImportError:
        _fail(f"pyspark is not installed in {sys.executable}: {INSTALL_HINT}")
    if pyspark.__version__ != "4.3.0":
        _fail(f"pyspark {pyspark.__version__} found, 4.3.0 expected: {INSTALL_HINT}")
    try:
        import chpart_spark
    except ImportError:
        _fail(f"chpart_spark is not installed in {sys.executable}: {INSTALL_HINT}")
    where = Path(chpart_spark.__file__).resolve()
    if ROOT / "deploy" / "spark" not in where.parents:
        _fail(f"chpart_spark is imported from {where}, not from this checkout's deploy/spark: {INSTALL_HINT}")
    if not (ROOT / ".venv" / "bin" / "python").exists():
        _fail(f"the ClickHouse engine (.venv with chdb-core) is missing: {INSTALL_HINT}")


class ClickHouse:
    """A ClickHouse 26.9 engine (chdb) serving HTTP on 127.0.0.1 for one test."""

    def __init__(self, base):
        self.data_dir = base / "data"
        self.run_dir = base / "run"
        self.http_port = free_port()
        self.tcp_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.staging_root = self.data_dir / "chpart-staging"

    def start(self, config_extra=None):
        """`config_extra`: an XML fragment for config.xml (deploy/dev/chdb_server.py --config-extra)."""
        extra = ["--config-extra", str(config_extra)] if config_extra else []
        out = subprocess.run(
            [str(ROOT / "deploy" / "dev" / "clickhouse-server"), "start", "--data", str(self.data_dir), "--run-dir",
             str(self.run_dir), "--http-port", str(self.http_port), "--tcp-port", str(self.tcp_port), *extra],
            capture_output=True, text=True, timeout=120,
        )
        if out.returncode != 0:
            _fail(f"deploy/dev/clickhouse-server start failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")

    def stop(self):
        subprocess.run([str(ROOT / "deploy" / "dev" / "clickhouse-server"), "stop", "--run-dir", str(self.run_dir)],
                       capture_output=True, text=True, timeout=120)

    def query(self, sql):
        request = urllib.request.Request(self.url + "/", data=sql.encode(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                return r.read().decode()
        except urllib.error.HTTPError as e:
            raise AssertionError(f"ClickHouse error for {sql!r}: {e.read().decode(errors='replace')}") from None

    def rows(self, sql):
        """Result rows as dicts (JSONEachRow)."""
        text = self.query(sql + " FORMAT JSONEachRow")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def scalar(self, sql):
        return self.query(sql).strip()


@pytest.fixture
def clickhouse(tmp_path):
    server = ClickHouse(tmp_path / "clickhouse")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def write_config(path, server, work_dir):
    """A chpart config for a server on this machine: local transport, staging next to the data."""
    path.write_text(
        "[clickhouse]\n"
        f'url = "{server.url}"\n'
        "request_timeout_secs = 120\n"
        "[transport]\n"
        'kind = "local"\n'
        "[clickhouse_local]\n"
        # the chdb-backed clickhouse-local (chpart spools Arrow streams itself)
        f'command = "{ROOT / "deploy" / "dev" / "clickhouse-local"}"\n'
        f'work_dir = "{work_dir}"\n'
        "[staging]\n"
        f'root = "{server.staging_root}"\n'
        "[ledger]\n"
        'database = "chpart"\n'
    )
    return path


@pytest.fixture
def chpart_config(tmp_path, clickhouse):
    work = tmp_path / "work"
    work.mkdir()
    return str(write_config(tmp_path / "chpart.toml", clickhouse, work))


JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_conf(event_dir):
    """The settings of every test's Spark session (`spark_builder`, and the Java job's
    `spark-submit --conf`)."""
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "1g",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "4",
        # A zone other than UTC: the loaded instants must not depend on it.
        "spark.sql.session.timeZone": "America/New_York",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.compress": "false",
        "spark.eventLog.dir": f"file://{event_dir}",
        # The tests' JVMs live for seconds over small data: the optimizing compiler and the
        # parallel collector's threads cost more CPU than they save on 2 cores (test_spark_load.py:
        # 122 -> 99 s, the machine's CPU 188 -> 126 s). What Spark runs is the same.
        "spark.driver.extraJavaOptions": JVM_OPTIONS,
        "spark.executor.extraJavaOptions": JVM_OPTIONS,
    }


def spark_builder(master, event_dir, app_name):
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in spark_conf(event_dir).items():
        builder = builder.config(key, value)
    return builder


@pytest.fixture
def spark(tmp_path, request):
    """A local Spark session (local[2,4]: 2 threads, a task may fail 3 times) whose event log
    goes to `spark.event_dir`; stopped (which completes the event log) at teardown."""
    event_dir = tmp_path / "spark-events"
    event_dir.mkdir()
    session = spark_builder("local[2,4]", event_dir, request.node.name).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.event_dir = str(event_dir)
    try:
        yield session
    finally:
        session.stop()
