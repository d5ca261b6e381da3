//! The `chpart` binary as users and batch runners call it: arguments, config, exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use chpart_testenv::clickhouse::{shared, ClickHouse, TestDb};

/// The chpart binary cargo built for these tests.
pub fn chpart() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_chpart"));
    // The test process's own environment must not leak overrides into the runs under test.
    for (key, _) in std::env::vars() {
        if key.starts_with("CHPART_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// A config for `server` with the local transport, staging under the server's data dir, a
/// ledger database of the test's own, and transient faults retried for 3 s (tests of a host
/// that is down wait that long, not the default 30 s).
pub fn local_config(dir: &Path, server: &ClickHouse, ledger_db: &str) -> PathBuf {
    let path = dir.join("chpart.toml");
    let text = format!(
        "[clickhouse]\nurl = \"{url}\"\nrequest_timeout_secs = 60\n\
         [transport]\nkind = \"local\"\n\
         [clickhouse_local]\ncommand = \"{local}\"\nwork_dir = \"{work}\"\n\
         [staging]\nroot = \"{staging}\"\n\
         [ledger]\ndatabase = \"{ledger_db}\"\n\
         [retry]\ndeadline_secs = 3\n",
        url = server.url(),
        local = chpart_testenv::clickhouse_local().display(),
        work = dir.join("work").display(),
        staging = server.data_dir.join("chpart-staging").display(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `chpart <args[0]> --config <config> <args[1..]>` to its end.
pub fn run_with(config: &Path, args: &[&str]) -> Output {
    chpart()
        .arg(args[0])
        .arg("--config")
        .arg(config)
        .args(&args[1..])
        .output()
        .unwrap()
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn begin_exit_codes() {
    let ch = shared();
    let db = TestDb::new(ch, "cli_begin");
    ch.q(&format!("CREATE TABLE `{}`.events (ts DateTime, id UInt64) ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id", db.name));
    let dir = tempfile::tempdir().unwrap();
    let ledger_db = format!("{}_ledger", db.name);
    let config = local_config(dir.path(), ch, &ledger_db);
    let table = format!("{}.events", db.name);
    let begin = |load: &str, extra: &[&str]| {
        chpart()
            .args(["begin", "--config"])
            .arg(&config)
            .args(["--table", &table, "--load", load])
            .args(extra)
            .output()
            .unwrap()
    };

    let out = begin("cli-load-1", &["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let spec: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("--json prints the spec");
    assert_eq!(spec["load"], "cli-load-1");
    assert_eq!(spec["mode"], "append");
    assert!(text(&out).contains("opened"), "{}", text(&out));

    let out = begin("cli-load-1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("already open"), "{}", text(&out));
    assert!(out.stdout.is_empty(), "without --json stdout stays empty");

    let out = begin("cli-load-1", &["--mode", "replace"]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "conflicting request: {}",
        text(&out)
    );

    ch.q(&format!(
        "INSERT INTO `{ledger_db}`.ledger (load_id, entry_id, kind, writer, body) VALUES ('cli-load-1', 'commit', 'load_committed', 't', '{{}}')"
    ));
    let out = begin("cli-load-1", &[]);
    assert_eq!(out.status.code(), Some(5), "finished load: {}", text(&out));
    assert!(text(&out).contains("already committed"), "{}", text(&out));

    let out = begin("bad/load", &[]);
    assert_eq!(out.status.code(), Some(2), "bad load id: {}", text(&out));
    assert!(text(&out).contains("--load"), "{}", text(&out));

    let out = chpart()
        .args([
            "begin",
            "--config",
            "/nonexistent/chpart.toml",
            "--table",
            "a.b",
            "--load",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "missing config: {}", text(&out));
    assert!(
        text(&out).contains("/nonexistent/chpart.toml"),
        "{}",
        text(&out)
    );

    let out = begin("cli-load-2", &[]).status.code();
    assert_eq!(out, Some(0));
    let closed = chpart_testenv::ClosedPort::new();
    let err = chpart()
        .args(["begin", "--config"])
        .arg(&config)
        .args(["--table", &table, "--load", "cli-load-3"])
        .env(
            "CHPART_CLICKHOUSE_URL",
            format!("http://127.0.0.1:{}", closed.port),
        )
        .env("CHPART_CLICKHOUSE_REQUEST_TIMEOUT_SECS", "5")
        .env("CHPART_RETRY_DEADLINE_SECS", "1")
        .output()
        .unwrap();
    assert_eq!(
        err.status.code(),
        Some(3),
        "unreachable server is retryable: {}",
        text(&err)
    );
    assert!(
        text(&err).contains("gave up after"),
        "retried within the deadline: {}",
        text(&err)
    );
    let message = text(&err);
    let refused = message.lines().find(|l| l.contains("error:")).unwrap();
    let causes: Vec<&str> = refused.split(": ").filter(|c| c.len() > 12).collect();
    for cause in &causes {
        assert_eq!(
            refused.matches(cause).count(),
            1,
            "{cause:?} is said more than once: {refused}"
        );
    }
}

/// `plan` of a MergeTree table: the whole picture (its host ready, the keys), and with `--keys`
/// the keys alone; either way nothing is written (no ledger database).
#[test]
fn plan_of_a_table_and_its_keys_alone() {
    let ch = shared();
    let db = TestDb::new(ch, "cli_plan");
    ch.q(&format!("CREATE TABLE `{}`.events (ts DateTime, id UInt64) ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id", db.name));
    let dir = tempfile::tempdir().unwrap();
    let ledger_db = format!("{}_ledger", db.name);
    let config = local_config(dir.path(), ch, &ledger_db);
    let table = format!("{}.events", db.name);
    let plan = |extra: &[&str]| {
        let mut args = vec!["plan", "--table", &table, "--json"];
        args.extend(extra);
        let out = run_with(&config, &args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let full = plan(&[]);
    assert_eq!(full["partition_key"], "toYYYYMM(ts)", "{full}");
    assert_eq!(full["sorting_key"], "id", "{full}");
    assert_eq!(full["hosts"][0]["filesystem_reachable"], true, "{full}");
    let keys = plan(&["--keys"]);
    assert_eq!(keys["partition_key"], "toYYYYMM(ts)", "{keys}");
    assert_eq!(keys["sorting_key"], "id", "{keys}");
    assert_eq!(keys["hosts"], serde_json::json!([]), "{keys}");
    // With the columns and the server's zone, from the same statement (the connector
    // evaluates a key of functions with them).
    let columns = serde_json::json!([
        {"name": "ts", "type": "DateTime"},
        {"name": "id", "type": "UInt64"}
    ]);
    assert_eq!(keys["columns"], columns, "{keys}");
    assert_eq!(full["columns"], columns, "{full}");
    let zone = ch.q("SELECT timezone()");
    assert_eq!(keys["timezone"], zone.trim(), "{keys}");
    assert_eq!(full["timezone"], zone.trim(), "{full}");
    assert_eq!(
        ch.q(&format!(
            "SELECT count() FROM system.databases WHERE name = '{ledger_db}'"
        )),
        "0\n"
    );
    let missing = run_with(
        &config,
        &["plan", "--table", &format!("{}.nope", db.name), "--keys"],
    );
    assert_eq!(missing.status.code(), Some(4), "{}", text(&missing));
}

#[test]
fn a_build_with_no_config_file_runs_on_the_document_the_driver_resolved() {
    // As on a Spark executor: the driver resolves the config once (`chpart config`, a file plus
    // an override), and every other run gets only that document in CHPART_CONFIG_TOML, in a
    // working directory of its own where `clickhouse_local.command` is relative, with arguments.
    let ch = shared();
    let s = crate::build::Setup::new(ch, "cli_no_file");
    let driver = chpart()
        .args(["config", "--toml", "--config"])
        .arg(&s.config)
        .env("CHPART_CLICKHOUSE_LOCAL_COMMAND", "ch/clickhouse local")
        .output()
        .unwrap();
    assert_eq!(driver.status.code(), Some(0), "{}", text(&driver));
    let document = String::from_utf8(driver.stdout).unwrap();
    assert!(
        document.contains("command = \"ch/clickhouse local\""),
        "{document}"
    );
    let json = chpart()
        .args(["config", "--json"])
        .env("CHPART_CONFIG_TOML", &document)
        .output()
        .unwrap();
    assert_eq!(json.status.code(), Some(0), "{}", text(&json));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["clickhouse"]["url"], ch.url().as_str());
    assert_eq!(json["clickhouse"]["user"], "default");

    // The executor's working directory holds `ch/clickhouse`, as `--archives x.tgz#ch` leaves it:
    // a launcher that takes `local` first, as the `clickhouse` multi-tool does.
    let executor = s.dir.path().join("executor");
    std::fs::create_dir_all(executor.join("ch")).unwrap();
    let launcher = executor.join("ch/clickhouse");
    std::fs::write(
        &launcher,
        format!(
            "#!/bin/sh\n[ \"$1\" = local ] || {{ echo \"usage: clickhouse local ...\" >&2; exit 2; }}\nshift\nexec {} \"$@\"\n",
            chpart_testenv::clickhouse_local().display()
        ),
    )
    .unwrap();
    chpart_testenv::set_mode(&launcher, 0o755);
    let with_document = |args: &[&str]| {
        let mut cmd = chpart();
        cmd.args(args)
            .env("CHPART_CONFIG_TOML", &document)
            .current_dir(&executor);
        cmd
    };

    let begun = with_document(&["begin", "--table", &s.table, "--load", "nf-1"])
        .output()
        .unwrap();
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));
    let input = crate::build::write_rows(
        s.dir.path(),
        "in.parquet",
        &crate::build::rows_select(0, 300),
        "Parquet",
    );
    let built = with_document(&[
        "build",
        "--load",
        "nf-1",
        "--attempt",
        "app-nf.1",
        "--partition",
        "0",
        "--input",
    ])
    .arg(&input)
    .output()
    .unwrap();
    assert_eq!(built.status.code(), Some(0), "{}", text(&built));
    // In another working directory the relative command is not there: the build fails naming it and this host.
    let elsewhere = chpart()
        .args([
            "build",
            "--load",
            "nf-1",
            "--attempt",
            "app-nf.2",
            "--partition",
            "0",
            "--input",
        ])
        .arg(&input)
        .env("CHPART_CONFIG_TOML", &document)
        .current_dir(s.dir.path())
        .output()
        .unwrap();
    let message = text(&elsewhere);
    assert_ne!(elsewhere.status.code(), Some(0), "{message}");
    assert!(
        message.contains("ch/clickhouse was not found")
            && message.contains(&format!("on host {}", hostname())),
        "{message}"
    );

    let winners = s.dir.path().join("winners.jsonl");
    std::fs::write(&winners, &built.stdout).unwrap();
    let committed = with_document(&["commit", "--load", "nf-1", "--partitions", "1", "--winners"])
        .arg(&winners)
        .output()
        .unwrap();
    assert_eq!(committed.status.code(), Some(0), "{}", text(&committed));
    assert_eq!(
        ch.q(&format!("SELECT count(), sum(id) FROM {}", s.table))
            .trim(),
        "300\t44850"
    );
}

/// This machine's host name, as `hostname` prints it.
pub fn hostname() -> String {
    let out = Command::new("hostname").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}
