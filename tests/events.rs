//! What a load shows about itself: `--events` (one JSON line per step), `--metrics-file` (a
//! Prometheus text file) and the progress bar on a terminal, from a real build and commit.

use std::collections::BTreeMap;
use std::process::Command;

use chpart_testenv::clickhouse::shared;
use serde_json::Value;

use crate::build::{rows_select, write_rows, Setup};
use crate::cli::{chpart, text};

fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Steps by name, with how often each ended ok.
fn ok_steps(events: &[Value]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in events {
        if e["outcome"] == "ok" {
            *out.entry(e["step"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    out
}

#[test]
fn events_and_metrics_describe_every_step_of_a_load() {
    let ch = shared();
    let s = Setup::new(ch, "events_steps");
    let events = s.dir.path().join("events.jsonl");
    let metrics = s.dir.path().join("build.prom");
    let begun = crate::cli::run_with(
        &s.config,
        &[
            "begin",
            "--table",
            &s.table,
            "--load",
            "ev-1",
            "--events",
            events.to_str().unwrap(),
        ],
    );
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));
    // Two months of rows: two parts.
    let input = write_rows(
        s.dir.path(),
        "rows.parquet",
        &rows_select(0, 10_000),
        "Parquet",
    );
    let built = s
        .build_cmd("ev-1", "app-1.1", 0)
        .arg("--input")
        .arg(&input)
        .arg("--events")
        .arg(&events)
        .arg("--metrics-file")
        .arg(&metrics)
        .output()
        .unwrap();
    assert_eq!(built.status.code(), Some(0), "{}", text(&built));
    let manifest = String::from_utf8_lossy(&built.stdout).trim().to_owned();
    // Not a terminal: no progress bar, the manifest alone on stdout.
    assert!(!text(&built).contains('\r'), "{}", text(&built));
    assert_eq!(String::from_utf8_lossy(&built.stdout).lines().count(), 1);
    let winners = s.dir.path().join("winners.jsonl");
    std::fs::write(&winners, format!("{manifest}\n")).unwrap();
    let committed = s.run(&[
        "commit",
        "--load",
        "ev-1",
        "--winners",
        winners.to_str().unwrap(),
        "--events",
        events.to_str().unwrap(),
    ]);
    assert_eq!(committed.status.code(), Some(0), "{}", text(&committed));

    let all = lines(&events);
    let steps = ok_steps(&all);
    let expected: BTreeMap<String, usize> = [
        ("begin", 1),
        ("build", 1),
        ("build.read", 1),
        ("build.upload", 2),
        ("build.publish", 1),
        ("commit", 1),
        ("commit.plan", 1),
        ("commit.claim", 1),
        ("commit.attach", 1),
        ("commit.attach_part", 2),
        ("commit.publish", 1),
        ("commit.publish_partition", 2),
        ("commit.finish", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(steps, expected, "{all:#?}");
    for e in &all {
        assert_eq!(e["load"], "ev-1", "{e}");
        assert!(e["ts_ms"].as_u64().unwrap() > 1_700_000_000_000, "{e}");
        assert!(e["duration_ms"].as_f64().unwrap() >= 0.0, "{e}");
        let step = e["step"].as_str().unwrap();
        if step.starts_with("build") {
            assert_eq!(e["attempt"], "app-1.1", "{e}");
        }
        if step == "build.upload" || step == "commit.attach_part" {
            assert!(e["part"].as_str().unwrap().starts_with("20260"), "{e}");
        }
        if step == "commit.publish_partition" {
            assert!(
                ["202601", "202602"].contains(&e["partition"].as_str().unwrap()),
                "{e}"
            );
        }
        if step == "build" || step == "commit" {
            assert_eq!(e["rows"], 10_000, "{e}");
            assert_eq!(e["parts"], 2, "{e}");
            assert_eq!(e["attempts"], 1, "{e}");
        }
    }
    let uploaded: u64 = all
        .iter()
        .filter(|e| e["step"] == "build.upload")
        .map(|e| e["bytes"].as_u64().unwrap())
        .sum();
    let parts_of = |step: &str| {
        let mut parts: Vec<&str> = all
            .iter()
            .filter(|e| e["step"] == step)
            .map(|e| e["part"].as_str().unwrap())
            .collect();
        parts.sort();
        parts
    };
    assert_eq!(parts_of("build.upload"), parts_of("commit.attach_part"));
    let build = all.iter().find(|e| e["step"] == "build").unwrap();
    assert_eq!(build["bytes"].as_u64().unwrap(), uploaded, "{build}");

    // The metrics file of the build, in the Prometheus text format.
    let prom = std::fs::read_to_string(&metrics).unwrap();
    let labels = "load=\"ev-1\",command=\"build\"";
    for line in [
        format!("chpart_success{{{labels}}} 1"),
        format!("chpart_steps_total{{{labels},step=\"build.upload\",outcome=\"ok\"}} 2"),
        format!("chpart_rows_total{{{labels},step=\"build\"}} 10000"),
        format!("chpart_parts_total{{{labels},step=\"build\"}} 2"),
        format!("chpart_bytes_total{{{labels},step=\"build\"}} {uploaded}"),
    ] {
        assert!(
            prom.lines().any(|l| l == line),
            "{line} missing from:\n{prom}"
        );
    }
    for line in prom.lines().filter(|l| !l.starts_with('#')) {
        let (name, value) = line.rsplit_once(' ').unwrap();
        assert!(name.starts_with("chpart_") && name.ends_with('}'), "{line}");
        value
            .parse::<f64>()
            .unwrap_or_else(|e| panic!("{e}: {line}"));
    }

    // A failed command says so in its metrics, and its failed step in its events.
    let failed_events = s.dir.path().join("failed.jsonl");
    let failed_metrics = s.dir.path().join("failed.prom");
    let out = s.run(&[
        "commit",
        "--load",
        "ev-missing",
        "--winners",
        winners.to_str().unwrap(),
        "--events",
        failed_events.to_str().unwrap(),
        "--metrics-file",
        failed_metrics.to_str().unwrap(),
    ]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    let prom = std::fs::read_to_string(&failed_metrics).unwrap();
    assert!(
        prom.contains("chpart_success{load=\"ev-missing\",command=\"commit\"} 0"),
        "{prom}"
    );
    let failed = lines(&failed_events);
    let plan = failed.iter().find(|e| e["step"] == "commit.plan").unwrap();
    assert_eq!(plan["outcome"], "failed", "{plan}");
    assert!(
        plan["error"].as_str().unwrap().contains("ev-missing"),
        "{plan}"
    );
}

/// On a terminal the build shows a progress bar (parts uploaded) on stderr; `script` gives the
/// command a pseudo-terminal.
#[test]
fn a_build_on_a_terminal_shows_its_progress() {
    let ch = shared();
    let s = Setup::new(ch, "events_tty");
    let begun = s.begin("et-1", &[]);
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));
    let input = write_rows(
        s.dir.path(),
        "rows.parquet",
        &rows_select(0, 10_000),
        "Parquet",
    );
    let build = s.build_cmd("et-1", "app-1.1", 0);
    let mut argv: Vec<String> = vec![chpart().get_program().to_string_lossy().into_owned()];
    argv.extend(build.get_args().map(|a| a.to_string_lossy().into_owned()));
    argv.push("--input".into());
    argv.push(input.to_string_lossy().into_owned());
    let shell = argv
        .iter()
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &shell, "/dev/null"])
        .output()
        .expect("script (util-linux) runs a command on a pseudo-terminal");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("build: uploading parts"), "{shown}");
    assert!(
        shown.contains("\"attempt\""),
        "the manifest still comes: {shown}"
    );
}

/// `status --timeline`: the winner, a loser (a retry's complete attempt), an attempt killed
/// before its manifest, and the commit's steps, on one time axis; after gc, the winner alone.
#[test]
fn a_timeline_shows_winners_losers_and_the_commit() {
    let ch = shared();
    let s = Setup::new(ch, "events_timeline");
    let begun = s.begin("tl-1", &[]);
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));
    let input = write_rows(
        s.dir.path(),
        "rows.parquet",
        &rows_select(0, 5_000),
        "Parquet",
    );
    let build = |attempt: &str| {
        let out = s
            .build_cmd("tl-1", attempt, 0)
            .arg("--input")
            .arg(&input)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let _lost = build("app-1.1");
    let won = build("app-1.2");
    // What a build killed after claiming its staging leaves: a directory, no manifest.
    let staging = ch
        .data_dir
        .join("chpart-staging")
        .join("tl-1")
        .join("app-1.3");
    std::fs::create_dir_all(&staging).unwrap();
    let winners = s.dir.path().join("winners.jsonl");
    std::fs::write(&winners, format!("{won}\n")).unwrap();
    let committed = s.run(&[
        "commit",
        "--load",
        "tl-1",
        "--winners",
        winners.to_str().unwrap(),
    ]);
    assert_eq!(committed.status.code(), Some(0), "{}", text(&committed));
    // A late writer: fenced, and noted in the ledger.
    let late = s
        .build_cmd("tl-1", "app-1.4", 0)
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap();
    assert_eq!(late.status.code(), Some(5), "{}", text(&late));

    let picture = s.dir.path().join("tl-1.svg");
    let out = s.run(&[
        "status",
        "--load",
        "tl-1",
        "--timeline",
        picture.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let svg = std::fs::read_to_string(&picture).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
        "{svg}"
    );
    for (attempt, fate) in [
        ("app-1.2", "won"),
        ("app-1.1", "lost"),
        ("app-1.3", "no manifest"),
        ("app-1.4", "fenced"),
    ] {
        let row = svg
            .lines()
            .position(|l| l.contains(&format!("{attempt}</text>")))
            .unwrap_or_else(|| panic!("no lane for {attempt}: {svg}"));
        assert!(
            svg.lines().nth(row + 1).unwrap().contains(fate),
            "{attempt}: {svg}"
        );
    }
    for mark in [
        "begin",
        "plan",
        "decided: commit",
        "partition 202601 visible",
        "committed",
    ] {
        assert!(
            svg.contains(&format!(">{mark}</text>")),
            "{mark} missing: {svg}"
        );
    }

    let gc = s.run(&["gc"]);
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
    let out = s.run(&[
        "status",
        "--load",
        "tl-1",
        "--timeline",
        picture.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let svg = std::fs::read_to_string(&picture).unwrap();
    assert!(
        svg.contains("app-1.2</text>") && svg.contains("app-1.4</text>"),
        "{svg}"
    );
    assert!(
        !svg.contains("app-1.1</text>") && !svg.contains("app-1.3</text>"),
        "{svg}"
    );

    let unknown = s.run(&[
        "status",
        "--load",
        "tl-nope",
        "--timeline",
        picture.to_str().unwrap(),
    ]);
    assert_eq!(unknown.status.code(), Some(4), "{}", text(&unknown));
    assert!(text(&unknown).contains("tl-nope"), "{}", text(&unknown));
}
