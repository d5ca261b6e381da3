//! Overwrite mode (`begin --mode overwrite`) against the real ClickHouse 26.9 engine: the load's
//! rows become the table's only rows, swapped in by one `EXCHANGE TABLES`, so readers see the
//! old table or the new one; killed anywhere, raced by a second commit, it swaps exactly once;
//! gc drops the old table and nothing else.

use std::sync::atomic::{AtomicBool, Ordering};

use chpart_testenv::clickhouse::shared;

use crate::build::Setup;
use crate::cli::text;
use crate::commit::{build_load, commit, expected_fingerprint, fingerprint_sql, winners_file};

/// Old rows in three months, one of which (December) no new row touches.
fn old_rows(s: &Setup) {
    s.db.server.q(&format!(
        "INSERT INTO {} SELECT toDateTime('2025-12-20 00:00:00', 'UTC') + toIntervalDay(number % 60), \
         900000 + number, 'old', NULL FROM numbers(3000)",
        s.table
    ));
}

/// Tables of the load besides the target in the test's database (the shadow, claims, the old
/// table), the detached parts of every table there, and staged files.
fn leftovers(s: &Setup) -> (String, String) {
    let ch = s.db.server;
    (
        ch.q(&format!(
            "SELECT name FROM system.tables WHERE database = '{}' AND name LIKE 'events\\\\_\\\\_chpart%' ORDER BY name",
            s.db.name
        )),
        ch.q(&format!(
            "SELECT table, name FROM system.detached_parts WHERE database = '{}' ORDER BY name",
            s.db.name
        )),
    )
}

#[test]
fn an_overwrite_swaps_the_whole_table_at_once_and_gc_drops_the_old_one() {
    let ch = shared();
    let s = Setup::new(ch, "overwrite_swap");
    old_rows(&s);
    let before = ch.q(&fingerprint_sql(&s.table));
    let built = build_load(&s, "ow-1", &["--mode", "overwrite"], 2, &["app-a", "app-b"]);
    let file = winners_file(&s, "w.jsonl", &[&built[0][1], &built[1][0]]);
    let want = expected_fingerprint(ch, &[0, 1]);
    // A reader polling the table while the commit runs sees the old table or the new one,
    // never an empty, half-filled or mixed one.
    let stop = AtomicBool::new(false);
    let seen = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut seen = Vec::new();
            loop {
                let done = stop.load(Ordering::SeqCst);
                seen.push(ch.q(&fingerprint_sql(&s.table)));
                if done {
                    return seen;
                }
            }
        });
        let out = commit(&s, "ow-1", &file, &["--json"], None);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (summary["mode"].as_str(), summary["rows"].as_u64()),
            (Some("overwrite"), Some(2000)),
            "{summary}"
        );
        stop.store(true, Ordering::SeqCst);
        reader.join().unwrap()
    });
    for f in &seen {
        assert!(
            f == &before || f == &want,
            "a reader saw {f:?}, neither the old table ({before:?}) nor the new ({want:?})"
        );
    }
    assert_eq!(seen.last(), Some(&want));
    assert!(
        seen.len() > 2,
        "the reader read during the commit: {}",
        seen.len()
    );
    assert_eq!(
        ch.q(&fingerprint_sql(&s.table)),
        want,
        "only the load's rows, December gone too"
    );
    // The new table merges (its merges were stopped while it was the shadow).
    ch.q(&format!("OPTIMIZE TABLE {} FINAL", s.table));
    assert_eq!(
        ch.q(&format!("SELECT uniqExact(partition_id) = count() FROM system.parts WHERE database = '{}' AND table = 'events' AND active", s.db.name)),
        "1\n",
        "one part per partition after OPTIMIZE FINAL"
    );
    // Before gc: the old table waits under a claim name; the losers' parts in detached/.
    let (tables, detached) = leftovers(&s);
    assert_eq!(tables.lines().count(), 1, "the old table: {tables}");
    assert!(!detached.is_empty(), "the losers' parts wait for gc");
    let status = s.run(&["status", "--load", "ow-1", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        status[0]["gc_pending"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["kind"] == "shadow_table"),
        "{status}"
    );
    let gc = s.run(&["gc"]);
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
    assert_eq!(leftovers(&s), (String::new(), String::new()));
    assert_eq!(ch.q(&fingerprint_sql(&s.table)), want, "gc changed no row");
    let again = commit(&s, "ow-1", &file, &[], None);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert_eq!(ch.q(&fingerprint_sql(&s.table)), want);
}

#[test]
fn an_overwrite_commit_killed_at_any_step_swaps_exactly_once() {
    let ch = shared();
    let s = Setup::new(ch, "overwrite_crash");
    let points = [
        "after-plan",
        "after-decision",
        "before-attach:2",
        "after-attach:3",
        "before-exchange",
        "after-exchange",
        "before-commit",
    ];
    let want = expected_fingerprint(ch, &[0, 1]);
    for (i, point) in points.iter().enumerate() {
        ch.q(&format!("TRUNCATE TABLE {}", s.table));
        old_rows(&s);
        let before = ch.q(&fingerprint_sql(&s.table));
        let load = format!("owc-{i}");
        let built = build_load(&s, &load, &["--mode", "overwrite"], 2, &["app-a", "app-b"]);
        let file = winners_file(&s, &format!("w{i}.jsonl"), &[&built[0][1], &built[1][0]]);
        let out = commit(&s, &load, &file, &[], Some(point));
        assert_eq!(
            out.status.code(),
            None,
            "{point}: to be killed: {}",
            text(&out)
        );
        let now = ch.q(&fingerprint_sql(&s.table));
        assert!(
            now == before || now == want,
            "{point}: the table is {now:?}"
        );
        // Resumed from the ledger alone.
        let out = s.run(&["commit", "--load", &load]);
        assert_eq!(out.status.code(), Some(0), "{point}: {}", text(&out));
        assert_eq!(ch.q(&fingerprint_sql(&s.table)), want, "{point}");
        let gc = s.run(&["gc"]);
        assert_eq!(gc.status.code(), Some(0), "{point}: {}", text(&gc));
        assert_eq!(leftovers(&s), (String::new(), String::new()), "{point}");
        assert_eq!(ch.q(&fingerprint_sql(&s.table)), want, "{point}: after gc");
    }
}

#[test]
fn racing_overwrite_commits_swap_once() {
    let ch = shared();
    let s = Setup::new(ch, "overwrite_race");
    let want = expected_fingerprint(ch, &[0, 1]);
    for i in 0..4 {
        ch.q(&format!("TRUNCATE TABLE {}", s.table));
        old_rows(&s);
        let load = format!("owr-{i}");
        let built = build_load(&s, &load, &["--mode", "overwrite"], 2, &["app-a"]);
        let file = winners_file(&s, &format!("w{i}.jsonl"), &[&built[0][0], &built[1][0]]);
        let outs: Vec<_> = std::thread::scope(|scope| {
            let racers: Vec<_> = (0..3)
                .map(|_| scope.spawn(|| commit(&s, &load, &file, &[], None)))
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for out in &outs {
            assert_eq!(out.status.code(), Some(0), "race {i}: {}", text(out));
        }
        assert_eq!(ch.q(&fingerprint_sql(&s.table)), want, "race {i}");
        let gc = s.run(&["gc"]);
        assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
        assert_eq!(leftovers(&s), (String::new(), String::new()), "race {i}");
    }
}

#[test]
fn overwrite_is_refused_where_it_cannot_swap_or_another_load_owns_the_table() {
    let ch = shared();
    let s = Setup::new(ch, "overwrite_refused");
    let out = s.begin("owx-part", &["--mode", "overwrite", "--visibility", "part"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("overwrite mode swaps the whole table from a shadow table; it needs --visibility partition"), "{}", text(&out));
    let out = s.begin("owx-1", &["--mode", "overwrite"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for (load, mode) in [("owx-2", "overwrite"), ("owx-3", "replace")] {
        let out = s.begin(load, &["--mode", mode]);
        assert_eq!(out.status.code(), Some(4), "{}", text(&out));
        assert!(text(&out).contains("load owx-1 is open"), "{}", text(&out));
    }
    let abort = s.run(&["abort", "--load", "owx-1"]);
    assert_eq!(abort.status.code(), Some(0), "{}", text(&abort));
    assert_eq!(
        leftovers(&s),
        (String::new(), String::new()),
        "abort dropped the shadow"
    );
    // A database that cannot swap tables atomically.
    let ordinary = format!("{}_ord", s.db.name);
    ch.q_with(
        &["allow_deprecated_database_ordinary=1"],
        &format!("CREATE DATABASE {ordinary} ENGINE = Ordinary"),
    );
    ch.q(&format!("CREATE TABLE {ordinary}.events AS {}", s.table));
    let out = s.run(&[
        "begin",
        "--table",
        &format!("{ordinary}.events"),
        "--load",
        "owx-ord",
        "--mode",
        "overwrite",
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("only an Atomic database does atomically; database"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains("is of engine Ordinary"),
        "{}",
        text(&out)
    );
    ch.q(&format!("DROP DATABASE {ordinary} SYNC"));
}

/// `chpart load --mode overwrite`: a daily snapshot from files in one command, re-run as a
/// no-op, and the next day's snapshot replaces it whole.
#[test]
fn chpart_load_overwrites_the_table_with_a_snapshot() {
    let ch = shared();
    let s = Setup::new(ch, "overwrite_load");
    old_rows(&s);
    for (day, parts) in [("d1", vec![0u32, 1]), ("d2", vec![2])] {
        let files: Vec<std::path::PathBuf> = parts
            .iter()
            .map(|p| {
                crate::build::write_rows(
                    s.dir.path(),
                    &format!("{day}-{p}.parquet"),
                    &crate::commit::partition_select(*p),
                    "Parquet",
                )
            })
            .collect();
        for run in 0..2 {
            let mut args = vec![
                "load",
                "--table",
                &s.table,
                "--load",
                day,
                "--mode",
                "overwrite",
            ];
            for f in &files {
                args.extend(["--input", f.to_str().unwrap()]);
            }
            let out = s.run(&args);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{day} run {run}: {}",
                text(&out)
            );
            assert_eq!(
                ch.q(&fingerprint_sql(&s.table)),
                expected_fingerprint(ch, &parts),
                "{day} run {run}"
            );
        }
        assert_eq!(leftovers(&s), (String::new(), String::new()), "{day}");
    }
}
