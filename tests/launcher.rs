//! Smoke tests of the ClickHouse server launcher itself (deploy/dev/clickhouse-server), so that a
//! chdb upgrade that breaks the undocumented way it listens fails here, loudly.

use std::process::Command;

use chpart_testenv::clickhouse::ClickHouse;
use chpart_testenv::{deploy_script, free_port, scratch_dir};

#[test]
fn harness_server_starts_pings_stops_and_keeps_data_across_restart() {
    let server = ClickHouse::start(None);
    assert!(server.ping());
    assert_eq!(server.q("SELECT version()").trim(), "26.9.2.1");
    server.q("CREATE DATABASE keep");
    server.q("CREATE TABLE keep.t (x UInt64) ENGINE = MergeTree ORDER BY x");
    server.q("INSERT INTO keep.t SELECT number FROM numbers(1000)");
    let old_port = server.http_port;
    let server = server.restart();
    assert_ne!(server.http_port, old_port, "restart uses fresh ports");
    assert_eq!(
        server.q("SELECT count(), sum(x) FROM keep.t").trim(),
        "1000\t499500"
    );
}

#[test]
fn daemon_start_status_stop_commands() {
    let dir = scratch_dir("launcher");
    let (data, run) = (dir.path().join("data"), dir.path().join("run"));
    let (http, tcp) = (free_port(), free_port());
    let script = deploy_script("clickhouse-server");
    let run_cmd = |args: &[&str]| {
        let out = Command::new(&script)
            .args(args)
            .output()
            .expect("run deploy/dev/clickhouse-server");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (data_s, run_s) = (data.to_str().unwrap(), run.to_str().unwrap());
    let (http_s, tcp_s) = (http.to_string(), tcp.to_string());
    let start = [
        "start",
        "--data",
        data_s,
        "--run-dir",
        run_s,
        "--http-port",
        &http_s,
        "--tcp-port",
        &tcp_s,
    ];

    let (code, text) = run_cmd(&start);
    assert_eq!(code, Some(0), "start failed: {text}");
    let (code, text) = run_cmd(&["status", "--run-dir", run_s]);
    assert_eq!(code, Some(0), "status while running: {text}");
    assert!(text.contains("running"), "{text}");

    // A second server on the same ports must not start (it would answer for the first one).
    let other = scratch_dir("launcher-other");
    let other_run = other.path().join("run");
    let (code, text) = run_cmd(&[
        "start",
        "--data",
        other.path().join("data").to_str().unwrap(),
        "--run-dir",
        other_run.to_str().unwrap(),
        "--http-port",
        &http_s,
        "--tcp-port",
        &tcp_s,
    ]);
    assert_ne!(
        code,
        Some(0),
        "second start on used ports succeeded: {text}"
    );
    assert!(text.contains("already in use"), "{text}");

    let (code, text) = run_cmd(&["stop", "--run-dir", run_s]);
    assert_eq!(code, Some(0), "stop: {text}");
    assert!(text.contains("stopped"), "{text}");
    let (code, text) = run_cmd(&["status", "--run-dir", run_s]);
    assert_eq!(code, Some(3), "status after stop: {text}");
    let (code, text) = run_cmd(&["stop", "--run-dir", run_s]);
    assert_eq!(code, Some(0), "stop is idempotent: {text}");
}
