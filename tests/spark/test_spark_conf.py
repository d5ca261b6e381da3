"""A load with no chpart config file anywhere (issue 22, "config without files on executors"):
on local-cluster[2,1,1024] (two executor JVMs, each with a working directory of its own) the
driver, started in an empty directory, gives chpart its config as Spark conf alone
(`spark.chpart.*`); the ClickHouse server requires a password, which is in a file shipped with
`spark.files` (--files) and named relatively (`spark.chpart.clickhouse.password_file = pw.txt`);
clickhouse-local is a relative command (`ch/clickhouse local`) in an archive shipped with
`spark.archives` (--archives clickhouse.tgz#ch). Through chpart_spark's Python tasks and through
the JVM connector (no `config` option), each with a task retry after publishing and with the
option `clickhouse.user` winning over the conf's (a user that does not exist), the tables hold
exactly the source rows; a password given as an option and an unknown `spark.chpart.*` key are
refused with the reason on both paths; the password is nowhere in Spark's event log.
"""

import json
import os
import shutil
import sys
import tarfile

from conftest import ClickHouse, ROOT, spark_conf
from datasets import create_table_sql
from failure_jobs import eventlog, probe
from helpers import assert_exactly_once, assert_gc_leaves_nothing, load_status
from scenarios import run_logged

HERE = os.path.dirname(os.path.abspath(__file__))
PASSWORD = "pw-conf-only-7f3a"
USER = "loader"
ROWS = 20_000


def password_server(base):
    """A server whose user `loader` needs PASSWORD (`default` stays open on loopback for the
    test's own queries and the engine's start-up)."""
    users = base / "users.xml"
    base.mkdir(parents=True)
    users.write_text(
        "<clickhouse><users>"
        "<default><password></password><networks><ip>127.0.0.1</ip></networks><profile>default</profile>"
        "<quota>default</quota><access_management>1</access_management></default>"
        f"<{USER}><password>{PASSWORD}</password><networks><ip>::/0</ip></networks><profile>default</profile>"
        f"<quota>default</quota><access_management>1</access_management></{USER}>"
        "</users><profiles><default/></profiles><quotas><default/></quotas></clickhouse>\n")
    extra = base / "extra.xml"
    extra.write_text(f"<clickhouse><user_directories><users_xml><path>{users}</path></users_xml>"
                     "</user_directories></clickhouse>\n")
    server = ClickHouse(base / "server")
    server.start(config_extra=extra)
    return server


def clickhouse_archive(path):
    """clickhouse.tgz holding `clickhouse`, a stand-in for ClickHouse's multi-tool binary: its
    `clickhouse local ...` runs the project's engine (deploy/dev/clickhouse-local, which must stay in
    the checkout: it runs the .venv's chdb)."""
    launcher = path.parent / "clickhouse"
    launcher.write_text("#!/bin/sh\n"
                        '[ "$1" = local ] || { echo "usage: clickhouse local ..." >&2; exit 2; }\n'
                        "shift\n"
                        f'exec {ROOT / "deploy" / "dev" / "clickhouse-local"} "$@"\n')
    launcher.chmod(0o755)
    with tarfile.open(path, "w:gz") as tar:
        tar.add(launcher, arcname="clickhouse")
    launcher.unlink()
    return path


def test_a_load_with_spark_conf_only_no_config_file_anywhere(chpart_bin, connector_jar, tmp_path):
    server = password_server(tmp_path / "clickhouse")
    try:
        run(server, chpart_bin, connector_jar, tmp_path)
    finally:
        server.stop()


def run(server, chpart_bin, connector_jar, tmp_path):
    server.query("CREATE DATABASE db")
    tables = {"python": "db.events_py", "connector": "db.events_jvm"}
    for table in tables.values():
        server.query(create_table_sql(table))
    ship = tmp_path / "ship"
    ship.mkdir()
    (ship / "pw.txt").write_text(PASSWORD + "\n")
    archive = clickhouse_archive(ship / "clickhouse.tgz")
    driver_cwd = tmp_path / "driver"
    driver_cwd.mkdir()
    events_dir = tmp_path / "spark-events"
    events_dir.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    probe_path, calls, probe_env = probe.install(str(tmp_path / "probe"), chpart_bin)
    conf = {
        "spark.local.dir": str(tmp_path / "spark-local"),
        "spark.files": str(ship / "pw.txt"),
        "spark.archives": f"{archive}#ch",
        "spark.chpart.clickhouse.url": server.url,
        # Wrong on purpose: each write gives clickhouse.user as an option, which wins over conf.
        "spark.chpart.clickhouse.user": "nobody",
        "spark.chpart.clickhouse.password_file": "pw.txt",
        "spark.chpart.transport.kind": "local",
        "spark.chpart.clickhouse_local.command": "ch/clickhouse local",
        "spark.chpart.staging.root": str(server.staging_root),
        "spark.chpart.clickhouse.request_timeout_secs": "120",
    }
    load = "conf-only"
    out = tmp_path / "result.json"
    argv = [sys.executable, os.path.join(HERE, "conf_job.py"), "--chpart", chpart_bin, "--probe", probe_path,
            "--probe-env", json.dumps(probe_env), "--jar", connector_jar, "--conf", json.dumps(conf),
            "--table-python", tables["python"], "--table-connector", tables["connector"], "--load", load, "--user", USER,
            "--event-dir", str(events_dir), "--work", str(work), "--out", str(out), "--rows", str(ROWS)]
    log = tmp_path / "driver.log"
    # No chpart setting from this process's environment: conf is the only source.
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("CHPART_")}
    try:
        cwd = os.getcwd()
        os.chdir(driver_cwd)
        try:
            returncode = run_logged(argv, log, 300, "the conf-only driver")
        finally:
            os.chdir(cwd)
    finally:
        os.environ.update(saved)
    result = json.loads(out.read_text()) if out.exists() else {}
    output = log.read_text()
    assert returncode == 0 and "error" not in result, \
        f"the driver failed (exit {returncode}): {result.get('error')}\n{output[-6000:]}"

    # Refusals: the reason and the safe alternatives; the value never echoed.
    for path in ("python", "connector"):
        message = result[f"{path}_password_option"]
        assert message and "option clickhouse.password looks like a secret" in message, (path, message)
        for alternative in ("--files", "clickhouse.password_file", "spark.executorEnv", "clickhouse.password_env",
                            "CHPART_CLICKHOUSE_PASSWORD"):
            assert alternative in message, (path, alternative, message)
        assert "not-a-place-for-it" not in message, (path, message)
        message = result[f"{path}_unknown_conf"]
        assert message and "clickhouse.urll is not a chpart setting" in message, (path, message)
        assert "url, user, password_file, password_env" in message, (path, message)
        assert "clickhouse.urll was given as spark conf spark.chpart.clickhouse.urll" in message, (path, message)
        assert "clickhouse.url was given" not in message, (path, message)

    # No config file was written anywhere the job could read one.
    assert not [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files if f.endswith(".toml")]
    assert os.listdir(driver_cwd) == [] or all(not f.endswith(".toml") for f in os.listdir(driver_cwd))

    app = result["application_id"]
    tasks = eventlog.tasks(str(events_dir), app)
    assert result["source_rows"] == ROWS

    # Python tasks: attempt 0 of partition 1 failed after publishing, a retry won; every build ran
    # in an executor's own working directory, which held the shipped files and no config.
    loser = json.loads((work / "fail-after-publish-py.json").read_text())
    builds = [json.loads((work / "builds" / f).read_text()) for f in sorted(os.listdir(work / "builds"))]
    assert all(b["password_file_here"] and b["clickhouse_here"] and not b["config_files_here"] for b in builds), builds
    assert all(b["cwd"] != str(driver_cwd) for b in builds), builds
    assert len({b["cwd"] for b in builds}) == 2, f"the builds ran in both executors' directories: {builds}"
    failed = {t["task_id"]: (t["partition"], t["attempt"]) for t in tasks if not t["success"]}
    jvm_loser = json.loads((work / "fail-after-publish-jvm.json").read_text())
    assert failed == {loser["task_attempt_id"]: (1, 0), jvm_loser["task_attempt_id"]: (1, 0)}, \
        eventlog.describe(tasks)
    [message] = [t["message"] for t in tasks if t["task_id"] == loser["task_attempt_id"]]
    assert "injected failure after publishing" in message, message
    summary = result["python"]
    by_partition = dict(map(tuple, summary["winners"]))
    assert sorted(by_partition) == [0, 1, 2, 3] and by_partition[1] != loser["attempt"], summary

    # The connector: the first build of partition 1 published, then failed (above); its retry won.
    [message] = [t["message"] for t in tasks if t["task_id"] == jvm_loser["task_attempt_id"]]
    assert "injected failure" in message and jvm_loser["parts"], (message, jvm_loser)

    # Exactly the source rows in each table; chpart's own view agrees. From here the test's chpart
    # runs get the config as CHPART_* variables (the password too: the third way to give it).
    env = {"CHPART_CLICKHOUSE_URL": server.url, "CHPART_CLICKHOUSE_USER": USER,
           "CHPART_CLICKHOUSE_PASSWORD": PASSWORD, "CHPART_TRANSPORT_KIND": "local",
           "CHPART_CLICKHOUSE_LOCAL_COMMAND": str(ROOT / "deploy" / "dev" / "clickhouse-local"),
           "CHPART_STAGING_ROOT": str(server.staging_root)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from chpart_spark.checksum import Checksum
        source = Checksum(result["source_rows"], int(result["source_sum"]))
        for path, table in tables.items():
            assert_exactly_once(server, table, source)
        py = load_status(None, chpart_bin, f"{load}-py")
        assert py["state"] == "committed" and loser["attempt"] in {a["attempt"] for a in py["attempts"]}, py
        jvm = load_status(None, chpart_bin, f"{load}-jvm")
        assert jvm["state"] == "committed" and jvm_loser["attempt"] in {a["attempt"] for a in jvm["attempts"]}, jvm
        assert_gc_leaves_nothing(server, None, chpart_bin, f"{load}-py")
        assert_gc_leaves_nothing(server, None, chpart_bin, f"{load}-jvm")
        for path, table in tables.items():
            assert_exactly_once(server, table, source)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    # The password is nowhere in what Spark recorded.
    for directory, _, files in os.walk(events_dir):
        for name in files:
            with open(os.path.join(directory, name), errors="replace") as f:
                assert PASSWORD not in f.read(), f"the password is in Spark's event log {name}"
    assert PASSWORD not in output
