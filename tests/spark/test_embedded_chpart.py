"""The chpart binary the connector jar and the chpart_spark wheel carry
(deploy/spark/build-portable.sh, build-connector.sh, build-wheel.sh), with real components only:

1. the jar's binary is the portable build: no GLIBC symbol above build-portable.sh's floor, no
   libssl/libcrypto/libssh2/libz needed, its sha256 and `--version` as recorded in the jar, and
   its version the driver's chpart's; it loads a file over SFTP through a real sshd;
2. extraction (the connector's EmbeddedChpart): 8 threads in each of two JVMs racing into one
   directory leave exactly one file, written at most once per JVM; a third JVM writes nothing;
3. an extracted binary changed on disk is refused, naming its path;
4. PySpark on local-cluster (two executor JVMs) with a PATH that holds no chpart, on the driver
   and the executors, no $CHPART_BIN, no chpart option: only the jar. The executor that ran the
   first attempt of partition 1 is halted right after that attempt's build published (a test
   plugin, java/KillAfterPublish.java); Spark runs the partition again and the load holds exactly
   the source rows (the event log is the oracle that the retry happened);
5. the wheel carries the same bytes, tagged for glibc 2.17, and chpart_spark finds and checks
   them with no chpart on PATH; a changed file is refused, naming its path.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from chpart_spark.checksum import Checksum
from conftest import ROOT, pyspark_jars, spark_conf
from datasets import create_table_sql
from failure_jobs import eventlog
from helpers import assert_exactly_once, assert_gc_leaves_nothing, load_status
from scenarios import TABLE, run_logged

HERE = os.path.dirname(os.path.abspath(__file__))
RESOURCE = "chpart/linux-x86_64/chpart"
# The PATH the driver and the executors run with: the system's tools (bash, java), no chpart.
SCRUBBED_PATH = "/usr/bin:/bin"
JOB_TIMEOUT = 300
ROWS = 40_000


def glibc_floor():
    """build-portable.sh's GLIBC_FLOOR (its one home)."""
    text = (ROOT / "deploy" / "spark" / "build-portable.sh").read_text()
    [floor] = re.findall(r'^GLIBC_FLOOR="([0-9.]+)"$', text, re.M)
    return floor


def version_tuple(v):
    return tuple(int(x) for x in v.split("."))


def embedded(jar):
    """The jar's binary, its recorded sha256 and version; fails if the jar carries none."""
    with zipfile.ZipFile(jar) as z:
        names = set(z.namelist())
        for name in (RESOURCE, RESOURCE + ".sha256", RESOURCE + ".version"):
            assert name in names, f"{jar} has no {name}: build it with deploy/spark/build-connector.sh"
        return (z.read(RESOURCE), z.read(RESOURCE + ".sha256").decode().strip(),
                z.read(RESOURCE + ".version").decode().strip())


def extract_from_jar(jar, path):
    data, sha, version = embedded(jar)
    path.write_bytes(data)
    path.chmod(0o755)
    return sha, version


def sha256_of(path):
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def scrubbed_env():
    """This environment without $CHPART_BIN and with a PATH that holds no chpart."""
    assert shutil.which("chpart", path=SCRUBBED_PATH) is None, f"{SCRUBBED_PATH} holds a chpart"
    env = {k: v for k, v in os.environ.items() if k != "CHPART_BIN"}
    env["PATH"] = SCRUBBED_PATH
    return env


def extract_concurrently(connector_jar, test_classes, directory, threads=8):
    """java ExtractConcurrently <dir> <threads>: a started process."""
    cp = os.pathsep.join([test_classes, connector_jar, os.path.join(pyspark_jars(), "*")])
    return subprocess.Popen(["java", "-cp", cp, "chpart.spark.ExtractConcurrently", str(directory), str(threads)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_jar_carries_a_portable_chpart_of_the_drivers_version(connector_jar, chpart_bin, tmp_path):
    """(1) The binary in the jar: glibc floor, no OpenSSL/libssh2/zlib to find on the host, the
    recorded sha256 and version, and the version of the chpart the tests run on the driver."""
    binary = tmp_path / "chpart"
    sha, version = extract_from_jar(connector_jar, binary)
    assert sha256_of(binary) == sha
    floor = glibc_floor()
    symbols = subprocess.run(["objdump", "-T", str(binary)], capture_output=True, text=True, check=True).stdout
    versions = sorted({v for v in re.findall(r"GLIBC_([0-9][0-9.]*)", symbols)}, key=version_tuple)
    assert versions and version_tuple(versions[-1]) <= version_tuple(floor), \
        f"the jar's chpart needs GLIBC_{versions[-1]}, above the floor {floor}"
    dynamic = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", dynamic)
    assert needed and not [n for n in needed if n.startswith(("libssl", "libcrypto", "libssh2", "libz."))], needed
    ran = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, env=scrubbed_env())
    assert ran.returncode == 0 and ran.stdout.strip() == version, (ran.stdout, ran.stderr, version)
    driver = subprocess.run([chpart_bin, "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert driver.stdout.strip() == version, (driver.stdout, version)


def test_concurrent_extraction_in_one_jvm_and_across_jvms_leaves_one_file(connector_jar, test_classes, tmp_path):
    """(2) Two JVMs, 8 threads each, released together into one directory: every call gets the
    same path, each JVM wrote the file at most once, and the directory holds exactly that file
    (no temp file left), executable, with the recorded sha256. A third JVM finds and checks it
    and writes nothing."""
    _, sha, version = embedded(connector_jar)
    directory = tmp_path / "local-dir"
    procs = [extract_concurrently(connector_jar, test_classes, directory) for _ in range(2)]
    outputs = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    expected = directory / f"chpart-{sha[:16]}"
    extractions = 0
    for out, err, code in outputs:
        assert code == 0, f"ExtractConcurrently failed ({code}):\n{out}\n{err}"
        lines = out.split("\n")
        assert lines[0] == str(expected), out
        m = re.fullmatch(r"8 calls, ([01]) extractions", lines[1])
        assert m, out
        extractions += int(m.group(1))
    assert 1 <= extractions <= 2, outputs
    assert sorted(os.listdir(directory)) == [expected.name], os.listdir(directory)
    assert sha256_of(expected) == sha and os.access(expected, os.X_OK)
    ran = subprocess.run([str(expected), "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert ran.stdout.strip() == version
    out, err = extract_concurrently(connector_jar, test_classes, directory).communicate(timeout=120)
    assert out.split("\n")[:2] == [str(expected), "8 calls, 0 extractions"], (out, err)


def test_a_changed_extracted_binary_is_refused_naming_its_path(connector_jar, test_classes, tmp_path):
    """(3) The extracted file changed on disk (a byte appended): the next JVM refuses to run it,
    naming the file and both digests, and leaves it for the operator to delete."""
    _, sha, _ = embedded(connector_jar)
    directory = tmp_path / "local-dir"
    out, err = extract_concurrently(connector_jar, test_classes, directory, threads=1).communicate(timeout=120)
    extracted = directory / f"chpart-{sha[:16]}"
    assert out.split("\n")[0] == str(extracted), (out, err)
    extracted.chmod(0o755)
    with open(extracted, "ab") as f:
        f.write(b"\0")
    proc = extract_concurrently(connector_jar, test_classes, directory, threads=4)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    assert f"{extracted} on host " in err and f"the jar recorded {sha}" in err, err
    assert "changed after it was extracted; delete it" in err, err
    assert extracted.exists()


def test_connector_with_no_chpart_on_any_path_loads_exactly_once_under_a_retry_after_publish(
        clickhouse, chpart_config, chpart_bin, connector_jar, test_classes, tmp_path):
    """(4) PySpark on local-cluster[2,1,1024], the driver and both executors with a PATH that
    holds no chpart and no $CHPART_BIN, df.write.format("chpart") without option chpart: every
    chpart run (status, begin, the builds, commit) is the jar's binary, extracted into each JVM's
    Spark local directory. The executor running the first attempt of partition 1 is halted after
    that attempt published; its partition is run again on the other executor."""
    clickhouse.query("CREATE DATABASE db")
    clickhouse.query(create_table_sql(TABLE))
    _, sha, _ = embedded(connector_jar)
    load = "embedded-load"
    events_dir, local_dir, marker = tmp_path / "spark-events", tmp_path / "spark-local", tmp_path / "killed.json"
    events_dir.mkdir()
    local_dir.mkdir()
    out = tmp_path / "embedded-job.json"
    argv = [sys.executable, os.path.join(HERE, "embedded_job.py"), "--via", "connector", "--config", chpart_config,
            "--table", TABLE,
            "--load", load, "--rows", str(ROWS), "--event-dir", str(events_dir), "--local-dir", str(local_dir),
            "--jars", f"{connector_jar},{test_classes}", "--marker", str(marker),
            "--executor-path", SCRUBBED_PATH, "--out", str(out)]
    log = tmp_path / "embedded-job.log"
    code = run_logged(argv, log, JOB_TIMEOUT, "the embedded-chpart job", env=scrubbed_env())
    result = json.loads(out.read_text()) if out.exists() else {}
    assert code == 0 and result.get("error") is None, \
        f"the job failed (exit {code}):\n{result.get('error')}\n{log.read_text()[-6000:]}"

    # The event log: the first attempt of partition 1 was lost with its executor, after the
    # plugin saw it succeed (its build had published), and a retry won the partition.
    app, events = result["application_id"], result["event_dir"]
    victim = json.loads(marker.read_text())
    tasks = eventlog.tasks(events, app)
    why = eventlog.describe(tasks)
    [lost] = [t for t in tasks if t["task_id"] == victim["task_attempt_id"]]
    assert (lost["partition"], lost["attempt"], lost["success"], lost["reason"]) == \
        (1, 0, False, "ExecutorLostFailure"), why
    write_stage = [t for t in tasks if t["stage"] == lost["stage"]]
    [won1] = [t for t in write_stage if t["partition"] == 1 and t["success"]]
    assert won1["attempt"] >= 1 and won1["executor"] != lost["executor"], why
    assert sorted(t["partition"] for t in write_stage if t["success"]) == [0, 1, 2, 3], why

    # chpart: the lost attempt published and lost; the table holds exactly the source rows.
    entry = load_status(chpart_config, chpart_bin, load)
    assert entry["state"] == "committed", entry
    attempts = {a["attempt"]: a for a in entry["attempts"]}
    [loser] = [a for a in attempts if a.endswith(f".{victim['task_attempt_id']}")]
    assert attempts[loser]["completed"] is True and attempts[loser]["won"] is False, entry
    winners = dict(map(tuple, entry["winners"]))
    assert sorted(winners) == [0, 1, 2, 3] and winners[1].endswith(f".{won1['task_id']}"), entry
    source = Checksum(result["source_rows"], int(result["source_sum"]))
    assert source.rows == ROWS
    assert_exactly_once(clickhouse, TABLE, source)
    # The jar's binary, extracted into the Spark local directory (listed by the driver before it
    # stopped: Spark removes these directories with their JVMs).
    copies = result["extracted"]
    assert copies and set(copies.values()) == {sha}, copies
    assert {os.path.basename(p) for p in copies} == {f"chpart-{sha[:16]}"}, copies
    assert [p for p in copies if "/executor-" in p] and [p for p in copies if "/executor-" not in p], \
        f"the driver and the executors each extract their own copy: {copies}"
    assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, load)
    assert_exactly_once(clickhouse, TABLE, source)


@pytest.fixture(scope="module")
def wheel_install(connector_jar, tmp_path_factory):
    """deploy/spark/build-wheel.sh carrying the jar's binary (CHPART_EMBED: the same bytes), then
    `pip install --target` of that wheel: (the install directory, the wheel's path)."""
    base = tmp_path_factory.mktemp("wheel")
    binary = base / "chpart"
    extract_from_jar(connector_jar, binary)
    build = subprocess.run(["bash", str(ROOT / "deploy" / "spark" / "build-wheel.sh")], capture_output=True,
                           text=True, timeout=600, env={**os.environ, "CHPART_EMBED": str(binary),
                                                        "OUT_DIR": str(base / "dist")})
    assert build.returncode == 0, f"build-wheel.sh failed ({build.returncode}):\n{build.stdout}\n{build.stderr}"
    wheel = build.stdout.strip().splitlines()[-1]
    target = base / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                          "--target", str(target), wheel], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, f"pip install {wheel} failed:\n{pip.stdout}\n{pip.stderr}"
    return target, wheel


def wheel_python(target, code):
    """`code` run by this interpreter with chpart_spark from the wheel's install directory, no
    chpart on PATH and no $CHPART_BIN."""
    env = {**scrubbed_env(), "PYTHONPATH": str(target)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_the_wheel_carries_the_jars_binary_and_chpart_spark_finds_and_checks_it(connector_jar, wheel_install,
                                                                                 tmp_path):
    """(5) The wheel is tagged for build-portable.sh's glibc floor and carries the jar's bytes;
    installed, chpart_spark resolves its own binary when no chpart is named and none is on PATH,
    and refuses it, naming the path, once the file is changed."""
    target, wheel = wheel_install
    _, sha, version = embedded(connector_jar)
    floor = glibc_floor().replace(".", "_")
    assert os.path.basename(wheel) == f"chpart_spark-0.1.0-py3-none-manylinux_{floor}_x86_64.whl", wheel
    binary = target / "chpart_spark" / "bin" / "chpart"
    assert sha256_of(binary) == sha and os.access(binary, os.X_OK)
    found = wheel_python(target, "from chpart_spark import _cli\n"
                                 "print(_cli.resolve_binary()); print(_cli.checked_package_binary(%r))" % sha)
    assert found.returncode == 0 and found.stdout.split() == [str(binary)] * 2, (found.stdout, found.stderr)
    ran = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert ran.stdout.strip() == version

    changed = tmp_path / "site"
    shutil.copytree(target, changed)
    with open(changed / "chpart_spark" / "bin" / "chpart", "ab") as f:
        f.write(b"\0")
    refused = wheel_python(changed, "from chpart_spark import _cli\n_cli.checked_package_binary()")
    assert refused.returncode != 0, refused.stdout
    assert f"{changed / 'chpart_spark' / 'bin' / 'chpart'} on host " in refused.stderr, refused.stderr
    assert f"the wheel recorded {sha}: the file was changed after it was installed" in refused.stderr, refused.stderr


def test_pyspark_with_the_wheel_only_loads_exactly_once_under_a_retry_after_publish(
        clickhouse, chpart_config, chpart_bin, connector_jar, wheel_install, tmp_path):
    """(5) PySpark on local-cluster[2,1,1024], chpart_spark imported from the wheel's install on
    the driver and in the executors' Python workers, no chpart on any PATH, no $CHPART_BIN, no
    chpart argument: chpart_spark.write(via="python") runs the wheel's binary (each task checks
    its install's against the driver's sha256). The first attempt of partition 1 fails after it
    published; the retry wins and the table holds exactly the source rows."""
    clickhouse.query("CREATE DATABASE db")
    clickhouse.query(create_table_sql(TABLE))
    target, _ = wheel_install
    load = "wheel-load"
    events_dir, local_dir, marker = tmp_path / "spark-events", tmp_path / "spark-local", tmp_path / "failed.json"
    events_dir.mkdir()
    local_dir.mkdir()
    out = tmp_path / "wheel-job.json"
    argv = [sys.executable, os.path.join(HERE, "embedded_job.py"), "--via", "wheel", "--wheel-dir", str(target),
            "--config", chpart_config, "--table", TABLE, "--load", load, "--rows", str(ROWS), "--event-dir",
            str(events_dir), "--local-dir", str(local_dir), "--marker", str(marker), "--executor-path",
            SCRUBBED_PATH, "--out", str(out)]
    log = tmp_path / "wheel-job.log"
    code = run_logged(argv, log, JOB_TIMEOUT, "the wheel job", env={**scrubbed_env(), "PYTHONPATH": str(target)})
    result = json.loads(out.read_text()) if out.exists() else {}
    assert code == 0 and result.get("error") is None, \
        f"the job failed (exit {code}):\n{result.get('error')}\n{log.read_text()[-6000:]}"
    assert result["chpart_spark"].startswith(str(target)), result["chpart_spark"]
    assert result["driver_binary"] == str(target / "chpart_spark" / "bin" / "chpart"), result

    app, events = result["application_id"], result["event_dir"]
    failed = json.loads(marker.read_text())
    tasks = eventlog.tasks(events, app)
    why = eventlog.describe(tasks)
    [lost] = [t for t in tasks if t["task_id"] == failed["task_attempt_id"]]
    assert (lost["partition"], lost["attempt"], lost["success"]) == (1, 0, False), why
    assert "InjectedFailure" in lost["message"] or "after it published" in lost["message"], why
    winners = dict(map(tuple, result["summary"]["winners"]))
    assert sorted(winners) == [0, 1, 2, 3] and winners[1] != failed["attempt"], result["summary"]
    entry = load_status(chpart_config, chpart_bin, load)
    attempts = {a["attempt"]: a for a in entry["attempts"]}
    assert attempts[failed["attempt"]]["completed"] is True and attempts[failed["attempt"]]["won"] is False, entry
    source = Checksum(result["source_rows"], int(result["source_sum"]))
    assert source.rows == ROWS
    assert_exactly_once(clickhouse, TABLE, source)
    assert_gc_leaves_nothing(clickhouse, chpart_config, chpart_bin, load)
    assert_exactly_once(clickhouse, TABLE, source)


def test_the_jars_binary_loads_over_sftp(clickhouse, connector_jar, tmp_path):
    """(1) The jar's binary over SFTP (its OpenSSL and libssh2 are the ones linked in): begin, a
    build of a Parquet file uploaded through a real OpenSSH sshd (deploy/dev/sshd.sh, host key
    checked against known_hosts), commit; exactly the file's rows are loaded."""
    from ports import free_port
    from datasets import write_events_parquet

    clickhouse.query("CREATE DATABASE db")
    clickhouse.query(create_table_sql(TABLE))
    binary = tmp_path / "chpart"
    extract_from_jar(connector_jar, binary)
    sshd_dir, port = tmp_path / "sshd", free_port()
    sshd = ROOT / "deploy" / "dev" / "sshd.sh"
    started = subprocess.run(["bash", str(sshd), "start", "--dir", str(sshd_dir), "--port", str(port)],
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, f"deploy/dev/sshd.sh start failed:\n{started.stdout}\n{started.stderr}"
    try:
        work = tmp_path / "work"
        work.mkdir()
        config = tmp_path / "chpart-sftp.toml"
        config.write_text(
            "[clickhouse]\n"
            f'url = "{clickhouse.url}"\n'
            "[transport]\n"
            'kind = "sftp"\n'
            "[ssh]\n"
            'host = "127.0.0.1"\n'
            f"port = {port}\n"
            f'user = "{os.environ.get("USER") or "root"}"\n'
            f'identity_file = "{sshd_dir / "client_key"}"\n'
            f'known_hosts = "{sshd_dir / "known_hosts"}"\n'
            "[clickhouse_local]\n"
            f'command = "{ROOT / "deploy" / "dev" / "clickhouse-local"}"\n'
            f'work_dir = "{work}"\n'
            "[staging]\n"
            f'root = "{clickhouse.staging_root}"\n'
            "[ledger]\n"
            'database = "chpart"\n')
        source = write_events_parquet(tmp_path / "input", 20_000, files=1)
        env = scrubbed_env()

        def chpart(*args, stdin=None):
            run = subprocess.run([str(binary), *args, "--config", str(config)], capture_output=True, text=True,
                                 timeout=300, env=env, input=stdin)
            assert run.returncode == 0, f"chpart {args} failed ({run.returncode}):\n{run.stdout}\n{run.stderr}"
            return run.stdout

        chpart("begin", "--table", TABLE, "--load", "sftp-load")
        manifest = chpart("build", "--load", "sftp-load", "--partition", "0", "--attempt", "sftp-load.a0",
                          "--input", str(tmp_path / "input" / "part-0.parquet")).strip().splitlines()[-1]
        assert json.loads(manifest)["parts"], manifest
        chpart("commit", "--load", "sftp-load", "--winners", "-", "--partitions", "1", stdin=manifest + "\n")
        assert_exactly_once(clickhouse, TABLE, source)
        logins = (sshd_dir / "sshd.log").read_text().count("Accepted publickey")
        assert logins >= 1, f"the build never logged in over SSH:\n{(sshd_dir / 'sshd.log').read_text()[-3000:]}"
    finally:
        subprocess.run(["bash", str(sshd), "stop", "--dir", str(sshd_dir)], capture_output=True, timeout=60)


def test_spark_submit_java_job_on_a_standalone_cluster_with_the_jar_and_conf_only(connector_jar, test_classes,
                                                                                  load_events_job, tmp_path):
    """(6) The Java example (deploy/spark/examples/LoadEvents.java) by spark-submit on the
    standalone cluster of two Workers (127.0.0.2, 127.0.0.3; one core each), as it runs in
    production: the driver and every executor with a PATH that holds no chpart and no config file
    anywhere; only `--jars chpart-spark.jar` (its chpart extracted on each JVM), `spark.chpart.*`
    conf, the ClickHouse password in a file shipped with `--files` (the server requires it), and
    clickhouse-local in an archive shipped with `--archives` (`ch/clickhouse local`). The executor
    that ran the first attempt of partition 1 of the write is halted right after it published
    (java/KillAfterPublish.java, armed by conf); Spark runs the partition again on the other
    Worker (with no external shuffle service the lost executor's shuffle output goes too, so
    Spark also retries the write stage after a FetchFailed). The table holds exactly the source
    rows; gc leaves nothing; the password is nowhere in Spark's event log or the job's output."""
    from failure_jobs.cluster import StandaloneCluster
    from test_spark_conf import PASSWORD, USER, clickhouse_archive, password_server
    from datasets import write_events_parquet

    server = password_server(tmp_path / "clickhouse")
    cluster = None
    try:
        server.query("CREATE DATABASE db")
        server.query(create_table_sql(TABLE))
        ship = tmp_path / "ship"
        ship.mkdir()
        (ship / "pw.txt").write_text(PASSWORD + "\n")
        archive = clickhouse_archive(ship / "clickhouse.tgz")
        # One input file: the read stage has one task (partition 0), so partition 1 is the write's.
        source = write_events_parquet(tmp_path / "input", ROWS, files=1)
        events_dir, marker, driver_cwd = tmp_path / "spark-events", tmp_path / "killed.json", tmp_path / "driver"
        events_dir.mkdir()
        driver_cwd.mkdir()
        # The Workers (and so their executors) start with the scrubbed environment too.
        saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("CHPART_")}
        saved_path = os.environ["PATH"]
        os.environ["PATH"] = SCRUBBED_PATH
        try:
            cluster = StandaloneCluster(tmp_path / "cluster").start()
        finally:
            os.environ["PATH"] = saved_path
            os.environ.update(saved)
        conf = {
            **spark_conf(events_dir),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            "spark.executor.memory": "1g",
            "spark.executorEnv.PATH": SCRUBBED_PATH,
            "spark.plugins": "chpart.testing.KillAfterPublish",
            "spark.chparttest.kill_marker": str(marker),
            "spark.chparttest.kill_partition": "1",
            "spark.chpart.clickhouse.url": server.url,
            "spark.chpart.clickhouse.user": USER,
            "spark.chpart.clickhouse.password_file": "pw.txt",
            "spark.chpart.transport.kind": "local",
            "spark.chpart.clickhouse_local.command": "ch/clickhouse local",
            "spark.chpart.staging.root": str(server.staging_root),
            "spark.chpart.clickhouse.request_timeout_secs": "120",
        }
        load = "submit-standalone"
        argv = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", cluster.url,
                "--deploy-mode", "client", "--jars", f"{connector_jar},{test_classes}",
                "--files", str(ship / "pw.txt"), "--archives", f"{archive}#ch", "--class", "LoadEvents"]
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        argv += [load_events_job, "--input", str(tmp_path / "input"), "--table", TABLE, "--load", load,
                 "--partitions", "4", "--option", "layout=none"]
        log = tmp_path / "java-job.log"
        cwd = os.getcwd()
        os.chdir(driver_cwd)
        try:
            code = run_logged(argv, log, JOB_TIMEOUT, "the spark-submit Java job", env=scrubbed_env())
        finally:
            os.chdir(cwd)
        output = log.read_text()
        assert code == 0 and f"LoadEvents: load {load} committed into {TABLE}" in output, \
            f"the Java job failed (exit {code}):\n{output[-6000:]}\n{cluster.logs()}"

        # The event log: attempt 0 of partition 1 was lost with its executor after it published,
        # and a retry on the other Worker won the partition.
        [app] = eventlog.applications(str(events_dir))
        victim = json.loads(marker.read_text())
        tasks = eventlog.tasks(str(events_dir), app)
        why = eventlog.describe(tasks)
        [lost] = [t for t in tasks if t["task_id"] == victim["task_attempt_id"]]
        assert (lost["partition"], lost["attempt"], lost["success"], lost["reason"]) == \
            (1, 0, False, "ExecutorLostFailure"), why
        write_stage = [t for t in tasks if t["stage"] == lost["stage"]]
        [won1] = [t for t in write_stage if t["partition"] == 1 and t["success"]]
        assert won1["executor"] != lost["executor"], why
        assert sorted(t["partition"] for t in write_stage if t["success"]) == [0, 1, 2, 3], why

        # No config file anywhere the job could read one.
        assert not [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files if f.endswith(".toml")]
        # chpart's view and the table: the test's own chpart gets the config as CHPART_* variables.
        env = {"CHPART_CLICKHOUSE_URL": server.url, "CHPART_CLICKHOUSE_USER": USER,
               "CHPART_CLICKHOUSE_PASSWORD": PASSWORD, "CHPART_TRANSPORT_KIND": "local",
               "CHPART_CLICKHOUSE_LOCAL_COMMAND": str(ROOT / "deploy" / "dev" / "clickhouse-local"),
               "CHPART_STAGING_ROOT": str(server.staging_root)}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            chpart = extract_for_test(connector_jar, tmp_path / "chpart")
            entry = load_status(None, chpart, load)
            assert entry["state"] == "committed", entry
            attempts = {a["attempt"]: a for a in entry["attempts"]}
            [loser] = [a for a in attempts if a.endswith(f".{victim['task_attempt_id']}")]
            assert attempts[loser]["completed"] is True and attempts[loser]["won"] is False, entry
            assert_exactly_once(server, TABLE, source)
            assert_gc_leaves_nothing(server, None, chpart, load)
            assert_exactly_once(server, TABLE, source)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        for directory, _, files in os.walk(events_dir):
            for name in files:
                with open(os.path.join(directory, name), errors="replace") as f:
                    assert PASSWORD not in f.read(), f"the password is in Spark's event log {name}"
        assert PASSWORD not in output
    finally:
        if cluster is not None:
            cluster.stop()
        server.stop()


def extract_for_test(jar, path):
    """The jar's chpart, extracted to `path` (executable) for the test's own status and gc."""
    extract_from_jar(jar, path)
    path.chmod(0o755)
    return str(path)
