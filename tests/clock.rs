//! A driver (and executor) whose clock is 10 minutes off the server's, through the debug
//! binary's `CHPART_TEST_CLOCK_SKEW_SECS` (which shifts chpart's own clock, nothing else): every
//! age the protocol decides on (`gc --older-than`, `ledger prune --finished-before`) is measured
//! on the ledger server's clock, the fences never read a clock, and the load is exactly once.

use std::process::Output;
use std::time::Duration;

use chpart_testenv::clickhouse::shared;
use chpart_testenv::write_rows;

use crate::build::{rows_select, Setup};
use crate::cli::{chpart, text};

/// `chpart <command> --config <config> <args>` with chpart's clock `skew_secs` off; the
/// command is `args[0]`, or `args[0] args[1]` for `ledger prune`.
fn skewed(s: &Setup, skew_secs: i64, args: &[&str]) -> Output {
    let words = if args[0] == "ledger" { 2 } else { 1 };
    chpart()
        .args(&args[..words])
        .arg("--config")
        .arg(&s.config)
        .args(&args[words..])
        .env("CHPART_TEST_CLOCK_SKEW_SECS", skew_secs.to_string())
        .output()
        .unwrap()
}

/// The JSON a command printed on stdout, once it exited 0.
fn json_of(out: &Output) -> serde_json::Value {
    assert_eq!(out.status.code(), Some(0), "{}", text(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

/// Whether `load` is among the loads of a report's `field`.
fn lists(report: &serde_json::Value, field: &str, load: &str) -> bool {
    report[field]
        .as_array()
        .unwrap_or_else(|| panic!("no {field} in {report}"))
        .iter()
        .any(|l| l == load)
}

/// One load begun, built, committed, fenced, collected and pruned by a chpart whose clock is
/// `skew` seconds off the server's, with gc and prune run by one `-skew` off (20 minutes
/// between the two, in either direction).
/// The load's rows are ids `from..from + 5000`.
fn load_with_skew(s: &Setup, skew: i64, from: u64) {
    let ch = s.db.server;
    let load = format!("sk{}", if skew < 0 { "m" } else { "p" });
    let begun = skewed(s, skew, &["begin", "--table", &s.table, "--load", &load]);
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));

    // `begin` recorded when the load opened on the server's clock, not its own.
    let status = json_of(&skewed(s, skew, &["status", "--load", &load, "--json"]));
    let opened = status[0]["opened_at_unix_ms"].as_i64().unwrap();
    let server_now: i64 = ch
        .q("SELECT toUnixTimestamp64Milli(now64(3))")
        .trim()
        .parse()
        .unwrap();
    assert!(
        (server_now - opened).abs() < 60_000,
        "opened_at {opened} is not the server's clock ({server_now}), skew {skew} s"
    );

    // Just begun, by the server's clock: not stale for a gc 20 minutes off `begin`, even with
    // --abort-stale.
    let gc = json_of(&skewed(
        s,
        -skew,
        &["gc", "--older-than", "5m", "--abort-stale", "--json"],
    ));
    assert!(
        !lists(&gc, "stale_open", &load) && !lists(&gc, "aborted", &load),
        "a load begun a moment ago was taken for stale (skew {skew} s): {gc}"
    );
    // Older than 1 s by the server's clock: stale, whichever way chpart's clock is off.
    std::thread::sleep(Duration::from_millis(2_100));
    let gc = json_of(&skewed(
        s,
        -skew,
        &["gc", "--older-than", "1s", "--dry-run", "--json"],
    ));
    assert!(
        lists(&gc, "stale_open", &load),
        "a load begun 2 s ago was not stale for --older-than 1s (skew {skew} s): {gc}"
    );

    // The executor's clock is off too: the build, its fence and the commit do not care.
    let input = write_rows(
        s.dir.path(),
        &format!("{load}.parquet"),
        &rows_select(from, 5_000),
        "Parquet",
    );
    let build = |attempt: &str, skew: i64| {
        s.build_cmd(&load, attempt, 0)
            .arg("--input")
            .arg(&input)
            .env("CHPART_TEST_CLOCK_SKEW_SECS", skew.to_string())
            .output()
            .unwrap()
    };
    let built = build("app-k.0", skew);
    assert_eq!(built.status.code(), Some(0), "{}", text(&built));
    let line = String::from_utf8_lossy(&built.stdout).trim().to_owned();
    let winners = s.dir.path().join(format!("{load}.jsonl"));
    std::fs::write(&winners, line + "\n").unwrap();
    let committed = skewed(
        s,
        skew,
        &[
            "commit",
            "--load",
            &load,
            "--winners",
            winners.to_str().unwrap(),
        ],
    );
    assert_eq!(committed.status.code(), Some(0), "{}", text(&committed));
    let late = build("app-late.0", -skew);
    assert_eq!(late.status.code(), Some(5), "fenced: {}", text(&late));

    let gc = json_of(&skewed(s, -skew, &["gc", "--json"]));
    assert!(gc["loads_done"].as_u64().unwrap() >= 1, "{gc}");
    assert_eq!(s.detached("events"), Vec::<String>::new());
    let staged = s.db.server.data_dir.join("chpart-staging").join(&load);
    assert!(
        !staged.exists() || std::fs::read_dir(&staged).unwrap().next().is_none(),
        "staging of {load} left behind"
    );

    // Retention: finished seconds ago by the server's clock, so kept by a 5-minute bound
    // and pruned by a 1-second one, whichever way chpart's clock is off.
    let keep = json_of(&skewed(
        s,
        skew,
        &["ledger", "prune", "--finished-before", "5m", "--json"],
    ));
    assert!(
        !lists(&keep, "loads", &load),
        "a load finished a moment ago was pruned by --finished-before 5m (skew {skew} s): {keep}"
    );
    std::thread::sleep(Duration::from_millis(2_100));
    let pruned = json_of(&skewed(
        s,
        -skew,
        &["ledger", "prune", "--finished-before", "1s", "--json"],
    ));
    assert!(
        lists(&pruned, "loads", &load),
        "a load finished 2 s ago was not pruned by --finished-before 1s (skew {skew} s): {pruned}"
    );
    // Pruned, it still fences: a begin of its id is refused.
    let again = skewed(s, skew, &["begin", "--table", &s.table, "--load", &load]);
    assert_eq!(again.status.code(), Some(5), "{}", text(&again));
}

#[test]
fn a_clock_ten_minutes_off_the_servers_changes_no_age_and_the_load_is_exactly_once() {
    let ch = shared();
    let s = Setup::new(ch, "clock_skew");
    load_with_skew(&s, 600, 0);
    load_with_skew(&s, -600, 5_000);
    // Both loads' rows, each once.
    assert_eq!(
        ch.q(&format!("SELECT count(), uniqExact(id) FROM {}", s.table)),
        "10000\t10000\n"
    );
}
