//! `abort`, `gc` and `status` against the real server: every kind of leftover goes, nothing of
//! an open load is touched, and late writers are fenced or collected.

use std::path::Path;

use chpart_core::{detached_part_name, AttemptId, LoadId, Manifest, PublishIntent, RemotePath};
use chpart_testenv::clickhouse::shared;

use crate::build::{rows_select, write_rows, Setup};
use crate::cli::text;

fn build(s: &Setup, load: &str, attempt: &str, partition: u32, input: &Path) -> Manifest {
    let out = s
        .build_cmd(load, attempt, partition)
        .arg("--input")
        .arg(input)
        .output()
        .unwrap();
    crate::build::manifest_of(out).unwrap_or_else(|o| panic!("build {attempt}: {}", text(&o)))
}

#[test]
fn abort_removes_everything_and_fences_late_writers() {
    let ch = shared();
    let s = Setup::new(ch, "abort_fences");
    assert_eq!(
        s.begin("ab-1", &["--visibility", "part"]).status.code(),
        Some(0)
    );
    let input = write_rows(s.dir.path(), "in.parquet", &rows_select(0, 500), "Parquet");
    let m = build(&s, "ab-1", "app-a.0", 0, &input);
    assert_eq!(s.detached("events").len(), m.parts.len());

    let out = s.run(&["abort", "--load", "ab-1", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        s.detached("events").is_empty(),
        "abort removes the load's parts from detached/"
    );
    assert!(
        !ch.data_dir.join("chpart-staging/ab-1").exists(),
        "abort removes the staging"
    );
    let again = s.run(&["abort", "--load", "ab-1"]);
    assert_eq!(
        again.status.code(),
        Some(0),
        "abort is idempotent: {}",
        text(&again)
    );

    // A late writer (a zombie still running) is fenced and leaves nothing.
    let late = s
        .build_cmd("ab-1", "app-z.0", 0)
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap();
    assert_eq!(late.status.code(), Some(5), "{}", text(&late));
    assert!(s.detached("events").is_empty());
    assert_eq!(
        ch.q(&format!("SELECT count() FROM {}", s.table)).trim(),
        "0"
    );

    // A committed load cannot be aborted.
    assert_eq!(
        s.begin("ab-2", &["--visibility", "part"]).status.code(),
        Some(0)
    );
    let m = build(&s, "ab-2", "app-b.0", 0, &input);
    let winners = s.dir.path().join("w.jsonl");
    std::fs::write(&winners, m.to_json_line()).unwrap();
    let out = s.run(&[
        "commit",
        "--load",
        "ab-2",
        "--winners",
        winners.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // begin of a really committed load (plan and attach entries in its ledger) exits 5.
    let out = s.begin("ab-2", &["--visibility", "part"]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    let out = s.run(&["abort", "--load", "ab-2"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("committed"), "{}", text(&out));
    assert_eq!(
        ch.q(&format!("SELECT count() FROM {}", s.table)).trim(),
        "500"
    );
}

#[test]
fn gc_removes_every_leftover_of_finished_loads_and_nothing_of_open_ones() {
    let ch = shared();
    let s = Setup::new(ch, "gc_leftovers");
    let inputs: Vec<_> = (0..2u32)
        .map(|p| {
            write_rows(
                s.dir.path(),
                &format!("p{p}.parquet"),
                &rows_select(u64::from(p) * 1000, 1000),
                "Parquet",
            )
        })
        .collect();

    // Load 1, part visibility: two attempts per partition publish into the target's detached/.
    assert_eq!(
        s.begin("gc-1", &["--visibility", "part"]).status.code(),
        Some(0)
    );
    let a: Vec<Manifest> = (0..2)
        .map(|p| build(&s, "gc-1", &format!("app-a.{p}"), p, &inputs[p as usize]))
        .collect();
    let b: Vec<Manifest> = (0..2)
        .map(|p| build(&s, "gc-1", &format!("app-b.{p}"), p, &inputs[p as usize]))
        .collect();
    // Load 2, partition visibility: published into its shadow table.
    assert_eq!(s.begin("gc-2", &[]).status.code(), Some(0));
    let c: Vec<Manifest> = (0..2)
        .map(|p| build(&s, "gc-2", &format!("app-c.{p}"), p, &inputs[p as usize]))
        .collect();
    let shadow = c[0].target.table.to_string();
    // Load 3 stays open: gc must not touch it.
    assert_eq!(
        s.begin("gc-3", &["--visibility", "part"]).status.code(),
        Some(0)
    );
    let open = build(&s, "gc-3", "app-d.0", 0, &inputs[0]);

    let commit = |load: &str, winners: &[&Manifest]| {
        let file = s.dir.path().join(format!("{load}.jsonl"));
        std::fs::write(
            &file,
            winners
                .iter()
                .map(|m| m.to_json_line())
                .collect::<Vec<_>>()
                .join("\n"),
        )
        .unwrap();
        let out = s.run(&[
            "commit",
            "--load",
            load,
            "--winners",
            file.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    };
    commit("gc-1", &[&a[0], &b[1]]);
    commit("gc-2", &[&c[0], &c[1]]);

    // A late writer of gc-1 that passed its fence check just before the commit and published
    // right after it: its intent names a part in detached/ that no manifest does.
    let late_attempt: AttemptId = "app-late.0".parse().unwrap();
    let load: LoadId = "gc-1".parse().unwrap();
    let late_name = detached_part_name(&load, &late_attempt, &a[0].parts[0].partition_id, 0);
    let data_path = Path::new(a[0].target.data_path.as_str());
    let late_dir = data_path.join("detached").join(late_name.to_string());
    let copy = std::process::Command::new("cp")
        .arg("-r")
        .arg(
            data_path
                .join("detached")
                .join(a[1].parts[0].name.to_string()),
        )
        .arg(&late_dir)
        .status()
        .unwrap();
    assert!(copy.success());
    let late_staging = ch.data_dir.join("chpart-staging/gc-1/app-late.0");
    std::fs::create_dir_all(&late_staging).unwrap();
    let intent = PublishIntent {
        load: load.clone(),
        attempt: late_attempt.clone(),
        detached: vec![RemotePath::new(late_dir.to_str().unwrap()).unwrap()],
    };
    std::fs::write(late_staging.join("publish-intent.json"), intent.to_json()).unwrap();

    // status names winners and losers and what gc will remove.
    let out = s.run(&["status", "--load", "gc-1", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let attempts = status[0]["attempts"].as_array().unwrap();
    let won = |id: &str| {
        attempts
            .iter()
            .find(|x| x["attempt"] == id)
            .map(|x| x["won"].as_bool().unwrap())
    };
    assert_eq!(
        (
            won("app-a.0"),
            won("app-b.1"),
            won("app-a.1"),
            won("app-b.0")
        ),
        (Some(true), Some(true), Some(false), Some(false))
    );
    assert_eq!(status[0]["state"], "committed");
    assert_eq!(status[0]["rows"], 2000);
    let pending = status[0]["gc_pending"].as_array().unwrap();
    assert!(
        pending.iter().any(|r| r["part"] == late_name.to_string()),
        "{pending:?}"
    );
    let text_status = s.run(&["status"]);
    assert!(
        text(&text_status).contains("WON") && text(&text_status).contains("lost"),
        "{}",
        text(&text_status)
    );

    let before = ch.q(&format!("SELECT count(), sum(id) FROM {}", s.table));
    let dry = s.run(&["gc", "--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry));
    assert!(late_dir.exists(), "--dry-run changes nothing");

    let out = s.run(&["gc", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Every losing and late part of gc-1 is gone from detached/; only the open load's remain.
    let mut left = s.detached("events");
    left.sort();
    let mut open_parts: Vec<String> = open.parts.iter().map(|p| p.name.to_string()).collect();
    open_parts.sort();
    assert_eq!(
        left, open_parts,
        "only the open load's parts stay in detached/"
    );
    assert!(!late_dir.exists());
    assert_eq!(
        ch.q(&format!("EXISTS TABLE {}", shadow)).trim(),
        "0",
        "gc-2's shadow table is dropped"
    );
    assert!(
        !ch.data_dir.join("chpart-staging/gc-1").exists()
            && !ch.data_dir.join("chpart-staging/gc-2").exists()
    );
    assert!(
        ch.data_dir
            .join("chpart-staging/gc-3/app-d.0/manifest.json")
            .exists(),
        "the open load's staging stays"
    );
    assert_eq!(
        ch.q(&format!("SELECT count(), sum(id) FROM {}", s.table)),
        before,
        "gc changes no visible row"
    );

    let again = s.run(&["gc", "--json"]);
    assert_eq!(again.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        report["removed"].as_array().unwrap().len(),
        0,
        "gc is idempotent: {report}"
    );

    // --older-than reports the open load; with --abort-stale it aborts it.
    let out = s.run(&["gc", "--older-than", "0s", "--abort-stale", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        report["aborted"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l == "gc-3"),
        "{report}"
    );
    assert!(s.detached("events").is_empty());
}

/// A publish intent that exists but does not parse stops gc with the file's path, and gc
/// removes nothing of its attempt: the intent is the only record of which parts in detached/
/// are the attempt's, so an unreadable one must never read as "none".
#[test]
fn gc_refuses_a_corrupt_publish_intent_and_keeps_its_attempt() {
    let ch = shared();
    let s = Setup::new(ch, "gc_corrupt_intent");
    assert_eq!(
        s.begin("corrupt-intent-1", &["--visibility", "part"])
            .status
            .code(),
        Some(0)
    );
    let input = write_rows(s.dir.path(), "in.parquet", &rows_select(0, 500), "Parquet");
    let won = build(&s, "corrupt-intent-1", "app-a.0", 0, &input);
    let lost = build(&s, "corrupt-intent-1", "app-b.0", 0, &input);
    let winners = s.dir.path().join("w.jsonl");
    std::fs::write(&winners, won.to_json_line()).unwrap();
    let out = s.run(&[
        "commit",
        "--load",
        "corrupt-intent-1",
        "--winners",
        winners.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    let staging = ch.data_dir.join("chpart-staging/corrupt-intent-1/app-b.0");
    let intent = staging.join("publish-intent.json");
    let original = std::fs::read(&intent).unwrap();
    std::fs::write(&intent, "garbage").unwrap();
    let lost_parts: Vec<String> = lost.parts.iter().map(|p| p.name.to_string()).collect();

    let out = s.run(&["gc"]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains(intent.to_str().unwrap()),
        "the error names the file: {}",
        text(&out)
    );
    let detached = s.detached("events");
    assert!(
        lost_parts.iter().all(|p| detached.contains(p)),
        "the attempt's parts stay in detached/: {detached:?}"
    );
    assert_eq!(
        std::fs::read(&intent).unwrap(),
        b"garbage",
        "the attempt's staging stays where it was"
    );

    // Repaired, the intent lets gc finish.
    std::fs::write(&intent, original).unwrap();
    let out = s.run(&["gc"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(s.detached("events").is_empty());
    assert!(!staging.exists());
}

/// `chpart ledger prune` through the binary: a committed load that gc recorded done loses its
/// entries but its tombstone, and stays committed for every command (`begin` exits 5, a late
/// build is fenced with 5, a re-run of `commit` prints its summary, `status` shows it); an
/// open load is never pruned; a load finished after the bound is not; what is written of a
/// pruned load later (a fenced build's note) is pruned by the next run.
#[test]
fn ledger_prune_keeps_a_pruned_load_committed_for_every_command() {
    let ch = shared();
    let s = Setup::new(ch, "ledger_prune");
    assert_eq!(s.begin("pr-1", &[]).status.code(), Some(0));
    assert_eq!(s.begin("pr-open", &[]).status.code(), Some(0));
    let input = write_rows(s.dir.path(), "in.parquet", &rows_select(0, 700), "Parquet");
    let m = build(&s, "pr-1", "app-a.0", 0, &input);
    let winners = s.dir.path().join("winners.jsonl");
    std::fs::write(&winners, m.to_json_line() + "\n").unwrap();
    let out = s.run(&[
        "commit",
        "--load",
        "pr-1",
        "--winners",
        winners.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    let prune = |bound: &str, dry: bool| -> serde_json::Value {
        let mut args = vec!["ledger", "prune", "--finished-before", bound, "--json"];
        if dry {
            args.push("--dry-run");
        }
        let out = crate::cli::chpart()
            .args(&args[..2])
            .arg("--config")
            .arg(&s.config)
            .args(&args[2..])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // Not before gc recorded it done.
    assert_eq!(prune("2100-01-01", true)["loads"], serde_json::json!([]));
    let gc = s.run(&["gc", "--json"]);
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
    let report: serde_json::Value = serde_json::from_slice(&gc.stdout).unwrap();
    assert_eq!(report["loads_done"], 1, "{report}");

    // Finished seconds ago: not before a bound of a day ago.
    assert_eq!(prune("1d", false)["loads"], serde_json::json!([]));
    let entries = |load: &str| {
        ch.q(&format!(
            "SELECT count() FROM `{}_ledger`.ledger WHERE load_id = '{load}'",
            s.db.name
        ))
        .trim()
        .parse::<u64>()
        .unwrap()
    };
    let before = entries("pr-1");
    let dry = prune("2100-01-01", true);
    assert_eq!(dry["loads"], serde_json::json!(["pr-1"]), "{dry}");
    assert_eq!(entries("pr-1"), before, "a dry run deletes nothing");
    let done = prune("2100-01-01T00:00:00Z", false);
    assert_eq!(done["loads"], serde_json::json!(["pr-1"]), "{done}");
    assert_eq!(entries("pr-1"), 3, "decision, commit, gc-done are kept");
    assert_eq!(entries("pr-open"), 1, "an open load is never pruned");
    let again = prune("2100-01-01", false);
    assert_eq!(
        (&again["loads"], &again["already_pruned"]),
        (&serde_json::json!([]), &serde_json::json!(1)),
        "{again}"
    );

    let begun = s.begin("pr-1", &[]);
    assert_eq!(begun.status.code(), Some(5), "{}", text(&begun));
    let late = s
        .build_cmd("pr-1", "app-late.0", 0)
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap();
    assert_eq!(late.status.code(), Some(5), "{}", text(&late));
    let again = s.run(&["commit", "--load", "pr-1", "--json"]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    let summary: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(summary["rows"], 700, "{summary}");
    let status = s.run(&["status", "--load", "pr-1", "--json"]);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(
        (&status[0]["state"], &status[0]["rows"]),
        (&serde_json::json!("committed"), &serde_json::json!(700)),
        "{status}"
    );
    assert!(status[0]["gc_done_at_unix_ms"].is_i64(), "{status}");
    let all = s.run(&["status"]);
    assert!(
        text(&all).contains("pr-1  committed") && text(&all).contains("pr-open  open"),
        "{}",
        text(&all)
    );
    assert_eq!(
        ch.q(&format!("SELECT count() FROM {}", s.table)).trim(),
        "700"
    );
    // The late build noted itself fenced (for the load's timeline); the next prune takes
    // that note too.
    assert_eq!(entries("pr-1"), 4);
    let late_note = prune("2100-01-01", false);
    assert_eq!(
        (&late_note["loads"], &late_note["entries"]),
        (&serde_json::json!(["pr-1"]), &serde_json::json!(1)),
        "{late_note}"
    );
    assert_eq!(entries("pr-1"), 3);
}
