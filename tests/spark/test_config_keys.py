"""How chpart_spark builds a write's config without files, as scenario tables: the keys of Spark
conf `spark.chpart.*` and of write() options (`merge_config_keys`, pure), refused when they look
like secrets; and, with the real chpart binary (`chpart config`), the precedence config file <
conf < options < CHPART_<SECTION>_<KEY>, a document that keeps relative paths and holds no
secret, and an unknown key named with where it was given. No Spark session is needed."""

import os
import tomllib

import pytest

from chpart_spark import _cli, writer

FILE = """
[clickhouse]
url = "http://from-file:8123"
user = "file_user"
[transport]
kind = "local"
[clickhouse_local]
command = "clickhouse-local"
[staging]
root = "/staging"
[ledger]
database = "file_db"
"""

# (case, conf, options, expected keys, or the refusal's words)
CASES = [
    ("conf only", {"spark.chpart.clickhouse.url": "http://c:8123", "spark.app.name": "x"}, None,
     {"clickhouse.url": "http://c:8123"}),
    ("an option wins over the conf", {"spark.chpart.clickhouse.url": "http://c:8123"},
     {"clickhouse.url": "http://o:8123"}, {"clickhouse.url": "http://o:8123"}),
    ("values become text", {}, {"clickhouse.request_timeout_secs": 7}, {"clickhouse.request_timeout_secs": "7"}),
    ("a password as conf", {"spark.chpart.clickhouse.password": "x"}, None,
     "spark conf spark.chpart.clickhouse.password looks like a secret and is refused"),
    ("a password as an option", {}, {"clickhouse.password": "x"},
     "option clickhouse.password looks like a secret and is refused"),
    ("a private key", {}, {"ssh.private_key": "x"}, "option ssh.private_key looks like a secret"),
    ("an access key in conf", {"spark.chpart.s3.secret_access_key": "x"}, None, "looks like a secret"),
    ("password_file is a path, not a secret", {"spark.chpart.clickhouse.password_file": "pw.txt"},
     {"clickhouse.password_env": "CH_PW"}, {"clickhouse.password_file": "pw.txt", "clickhouse.password_env": "CH_PW"}),
]


@pytest.mark.parametrize("case, conf, options, expected", CASES, ids=[c[0] for c in CASES])
def test_conf_and_options_become_config_keys_or_are_refused(case, conf, options, expected):
    if isinstance(expected, dict):
        keys, origins = writer.merge_config_keys(conf, options)
        assert keys == expected, case
        assert set(origins) == set(keys), case
    else:
        with pytest.raises(ValueError) as refused:
            writer.merge_config_keys(conf, options)
        message = str(refused.value)
        assert expected in message, message
        for alternative in ("--files", "clickhouse.password_file", "spark.executorEnv", "CHPART_CLICKHOUSE_PASSWORD"):
            assert alternative in message, (alternative, message)
        assert "'x'" not in message and '"x"' not in message, message


def resolved(chpart_bin, tmp_path, conf, options, env=None, file=True):
    path = tmp_path / "chpart.toml"
    path.write_text(FILE)
    keys, origins = writer.merge_config_keys(conf, options)
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("CHPART_")}
    os.environ.update(env or {})
    try:
        doc = _cli.resolve_config(chpart_bin, str(path) if file else None, keys, origins)
    finally:
        for k in env or {}:
            os.environ.pop(k, None)
        os.environ.update(saved)
    return doc


def test_file_then_conf_then_options_then_variables(chpart_bin, tmp_path):
    # (case, conf, options, environment, expected url, user, ledger database)
    rows = [
        ("file alone", {}, None, {}, "http://from-file:8123", "file_user", "file_db"),
        ("conf over the file", {"spark.chpart.clickhouse.url": "http://conf:8123",
                                "spark.chpart.clickhouse.user": "conf_user"}, None, {},
         "http://conf:8123", "conf_user", "file_db"),
        ("an option over the conf", {"spark.chpart.clickhouse.url": "http://conf:8123",
                                     "spark.chpart.clickhouse.user": "conf_user"},
         {"clickhouse.url": "http://option:8123"}, {}, "http://option:8123", "conf_user", "file_db"),
        ("a variable over everything", {"spark.chpart.ledger.database": "conf_db"}, {"ledger.database": "opt_db"},
         {"CHPART_LEDGER_DATABASE": "env_db"}, "http://from-file:8123", "file_user", "env_db"),
    ]
    for case, conf, options, env, url, user, database in rows:
        doc = tomllib.loads(resolved(chpart_bin, tmp_path, conf, options, env).toml)
        assert (doc["clickhouse"]["url"], doc["clickhouse"]["user"], doc["ledger"]["database"]) == \
            (url, user, database), case


def test_the_handed_document_keeps_relative_paths_and_holds_no_secret(chpart_bin, tmp_path):
    (tmp_path / "pw.txt").write_text("s3cret-of-the-test\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        doc = resolved(chpart_bin, tmp_path, {"spark.chpart.clickhouse.password_file": "pw.txt",
                                              "spark.chpart.clickhouse_local.command": "ch/clickhouse local"},
                       None, file=True)
    finally:
        os.chdir(cwd)
    assert "s3cret" not in doc.toml
    parsed = tomllib.loads(doc.toml)
    assert parsed["clickhouse"]["password_file"] == "pw.txt"
    assert parsed["clickhouse_local"]["command"] == "ch/clickhouse local"
    assert doc.driver_dir == str(tmp_path)


def test_an_unknown_key_is_named_with_where_it_was_given_and_the_valid_keys(chpart_bin, tmp_path):
    with pytest.raises(_cli.ChpartError) as refused:
        resolved(chpart_bin, tmp_path, {"spark.chpart.staging.roott": "/x"}, {"clickhouse.url": "http://o:8123"},
                 file=False)
    message = str(refused.value)
    assert "staging.roott is not a chpart setting (the valid keys here are: root, disk_roots)" in message, message
    assert "staging.roott was given as spark conf spark.chpart.staging.roott" in message, message
    assert "clickhouse.url was given" not in message, message
