//! Tables on several disks (a storage policy with a JBOD volume of two local disks): every part
//! is staged and published on the disk it will live on, names never repeat across disks, and
//! commit, abort and gc see every disk. Against the real ClickHouse 26.9 engine.

use std::collections::BTreeSet;
use std::path::Path;

use chpart_core::Manifest;
use chpart_testenv::clickhouse::{ClickHouse, ServerOptions, JBOD_POLICY};

use crate::build::{Setup, COLUMNS};
use crate::cli::text;
use crate::commit::{build_load, commit, expected_fingerprint, fingerprint_sql, winners_file};

fn jbod_server() -> ClickHouse {
    ClickHouse::start_with(ServerOptions {
        jbod: true,
        ..ServerOptions::default()
    })
}

/// A test's own table under the JBOD policy.
fn jbod_setup<'a>(server: &'a ClickHouse, name: &str) -> Setup<'a> {
    policy_setup(server, name, JBOD_POLICY)
}

/// A test's own table `events` under the storage `policy`. Its merges are stopped, so the
/// parts the load brings stay as they came and can be counted per disk.
pub(crate) fn policy_setup<'a>(server: &'a ClickHouse, name: &str, policy: &str) -> Setup<'a> {
    let s = Setup::with_tables(
        server,
        name,
        COLUMNS,
        &format!(
            "ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id \
             SETTINGS storage_policy = '{policy}'"
        ),
        &["events"],
    );
    server.q(&format!("SYSTEM STOP MERGES {}", s.table));
    s
}

/// The spec of the open load `load` (`begin` again with the same `begin_args`, which include
/// `--json`), the disks it publishes to, and its publish table's name (without the database).
pub(crate) fn open_spec(
    s: &Setup,
    load: &str,
    begin_args: &[&str],
) -> (serde_json::Value, Vec<String>, String) {
    let out = s.begin(load, begin_args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let spec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let disks = spec["publish_disks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["disk"].as_str().unwrap().to_owned())
        .collect();
    let publish = spec["publish"].as_str().unwrap();
    let publish = publish.rsplit('.').next().unwrap().to_owned();
    (spec, disks, publish)
}

/// Commits a load of three Spark partitions built by two attempts each (`build_load`) as
/// Spark's collect() accepted them: attempt b in partitions 0 and 2, a in 1. Checks that
/// exactly the 3000 rows of the source are visible.
pub(crate) fn commit_mixed_winners(s: &Setup, load: &str, built: &[Vec<Manifest>]) {
    let winners = [&built[0][1], &built[1][0], &built[2][1]];
    let file = winners_file(s, "winners.jsonl", &winners);
    let out = commit(s, load, &file, &["--partitions", "3", "--json"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["rows"], 3000, "{summary}");
    let ch = s.db.server;
    assert_eq!(
        ch.q(&fingerprint_sql(&s.table)),
        expected_fingerprint(ch, &[0, 1, 2]),
        "every row of the winners once, none of the losers"
    );
}

/// Every file under `dir` (recursively; none if it does not exist), for "nothing left" checks.
pub(crate) fn files_under(dir: &Path) -> Vec<String> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| e.path().display().to_string())
        .collect()
}

/// Nothing staged on any of the server's JBOD disks.
fn assert_no_staging(ch: &ClickHouse) {
    for root in &ch.disks {
        let left = files_under(&root.join("chpart-staging"));
        assert!(
            left.is_empty(),
            "staging left on {}: {left:?}",
            root.display()
        );
    }
}

/// The disks the manifests' parts were published on.
fn disks_used(manifests: &[&Manifest]) -> BTreeSet<String> {
    manifests
        .iter()
        .flat_map(|m| {
            m.parts
                .iter()
                .map(|p| p.disk.clone().unwrap_or_else(|| m.target.disk.clone()))
        })
        .collect()
}

/// Active parts of `db.table` per disk, and the entries of its `detached/` on every disk.
fn parts_by_disk(ch: &ClickHouse, db: &str, table: &str) -> (String, String) {
    (
        ch.q(&format!(
            "SELECT disk_name, count() FROM system.parts WHERE database = '{db}' AND table = '{table}' AND active GROUP BY disk_name ORDER BY disk_name"
        )),
        ch.q(&format!(
            "SELECT disk, name FROM system.detached_parts WHERE database = '{db}' AND table = '{table}' ORDER BY disk, name"
        )),
    )
}

fn loads_on_two_disks_exactly_once(visibility: &str) {
    let ch = jbod_server();
    let s = jbod_setup(&ch, &format!("jbod_{visibility}"));
    let load = format!("jbod-{visibility}");
    let begin = ["--visibility", visibility, "--json"];
    // Three Spark partitions of 1000 rows over two months each (two parts per attempt), each
    // built by two attempts: a loser and the winner, both published.
    let built = build_load(&s, &load, &begin, 3, &["app-a", "app-b"]);
    let (spec, disks, publish) = open_spec(&s, &load, &begin);
    assert_eq!(disks, ["d1", "d2"], "{spec}");
    // Each attempt spread its two parts over both disks, each staged on its own disk's
    // filesystem under <disk path>/chpart-staging.
    for m in built.iter().flatten() {
        assert_eq!(disks_used(&[m]).len(), 2, "{}", m.to_json_line());
        for (disk, data_path, staging_dir) in m.disks() {
            let root = &ch.disks[if disk == "d1" { 0 } else { 1 }];
            assert!(data_path.as_str().starts_with(root.to_str().unwrap()));
            assert!(
                staging_dir
                    .as_str()
                    .starts_with(root.join("chpart-staging").to_str().unwrap()),
                "{staging_dir}"
            );
        }
    }
    let (_, detached) = parts_by_disk(&ch, &s.db.name, &publish);
    let names: Vec<&str> = detached
        .lines()
        .map(|l| l.split('\t').nth(1).unwrap())
        .collect();
    assert_eq!(names.len(), 12, "{detached}");
    let unique: BTreeSet<&&str> = names.iter().collect();
    assert_eq!(
        unique.len(),
        names.len(),
        "a name is on one disk only: {detached}"
    );

    commit_mixed_winners(&s, &load, &built);
    let (active, _) = parts_by_disk(&ch, &s.db.name, "events");
    assert_eq!(
        active, "d1\t3\nd2\t3\n",
        "the winners' parts stayed on their disks"
    );

    // gc removes the losers' parts from both disks' detached/ (part visibility) or the shadow
    // (partition visibility), and the staging on both disks.
    let out = s.run(&["gc", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let (_, detached) = parts_by_disk(&ch, &s.db.name, "events");
    assert_eq!(detached, "", "nothing left in detached/ on any disk");
    assert_no_staging(&ch);
    let status = s.run(&["status", "--load", &load, "--json"]);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status[0]["gc_pending"], serde_json::json!([]), "{status}");
    assert_eq!(
        ch.q(&fingerprint_sql(&s.table)),
        expected_fingerprint(&ch, &[0, 1, 2])
    );
}

#[test]
fn a_jbod_table_loads_exactly_once_with_part_visibility() {
    loads_on_two_disks_exactly_once("part");
}

#[test]
fn a_jbod_table_loads_exactly_once_with_partition_visibility() {
    loads_on_two_disks_exactly_once("partition");
}

#[test]
fn abort_removes_the_load_from_every_disk() {
    let ch = jbod_server();
    let s = jbod_setup(&ch, "jbod_abort");
    let built = build_load(&s, "jbod-ab", &["--visibility", "part"], 2, &["app-a"]);
    let all: Vec<&Manifest> = built.iter().flatten().collect();
    assert_eq!(disks_used(&all).len(), 2);
    let out = s.run(&["abort", "--load", "jbod-ab", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let (active, detached) = parts_by_disk(&ch, &s.db.name, "events");
    assert_eq!((active.as_str(), detached.as_str()), ("", ""));
    assert_no_staging(&ch);
}

#[test]
fn a_staging_root_configured_for_a_disk_is_used_for_that_disk() {
    let ch = jbod_server();
    let s = jbod_setup(&ch, "jbod_roots");
    let root = ch.disks[1].join("own-staging");
    let mut config = std::fs::read_to_string(&s.config).unwrap();
    config.push_str(&format!(
        "[staging.disk_roots]\nd2 = \"{}\"\n",
        root.display()
    ));
    std::fs::write(&s.config, config).unwrap();
    let built = build_load(&s, "jbod-roots", &["--visibility", "part"], 1, &["app-a"]);
    let m = &built[0][0];
    let staging: Vec<(&str, String)> = m
        .disks()
        .map(|(disk, _, dir)| (disk, dir.to_string()))
        .collect();
    assert_eq!(staging.len(), 2, "{}", m.to_json_line());
    for (disk, dir) in staging {
        let want = if disk == "d2" {
            root.clone()
        } else {
            ch.disks[0].join("chpart-staging")
        };
        assert!(dir.starts_with(want.to_str().unwrap()), "{disk}: {dir}");
    }
    let file = winners_file(&s, "w.jsonl", &[m]);
    let out = commit(&s, "jbod-roots", &file, &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = s.run(&["gc"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(files_under(&root).is_empty());
}
