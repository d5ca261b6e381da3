//! `chpart commit` end to end: only winners become visible, exactly once, whatever happens to
//! the driver; against the real ClickHouse 26.9 engine.

use std::path::PathBuf;
use std::process::{Output, Stdio};

use chpart_core::Manifest;
use chpart_testenv::clickhouse::{shared, ClickHouse};

use crate::build::{rows_select, write_rows, Setup};
use crate::cli::{chpart, text};

/// Rows of Spark partition `p` (1000 each, spread over two months).
pub(crate) fn partition_select(p: u32) -> String {
    rows_select(u64::from(p) * 1000, 1000)
}

/// count() and an order-independent checksum over all columns.
pub(crate) fn fingerprint_sql(from: &str) -> String {
    format!("SELECT count(), sum(cityHash64(ts, id, name, score)) FROM {from}")
}

/// A load with `partitions` Spark partitions, each built by the given attempts (all complete
/// and published); returns the manifests per partition, in attempt order.
pub(crate) fn build_load(
    s: &Setup,
    load: &str,
    begin: &[&str],
    partitions: u32,
    attempts: &[&str],
) -> Vec<Vec<Manifest>> {
    let out = s.begin(load, begin);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    (0..partitions)
        .map(|p| {
            let input = write_rows(
                s.dir.path(),
                &format!("{load}-p{p}.parquet"),
                &partition_select(p),
                "Parquet",
            );
            attempts
                .iter()
                .map(|a| {
                    let attempt = format!("{a}.{p}");
                    let out = s
                        .build_cmd(load, &attempt, p)
                        .arg("--input")
                        .arg(&input)
                        .output()
                        .unwrap();
                    crate::build::manifest_of(out)
                        .unwrap_or_else(|o| panic!("build {attempt}: {}", text(&o)))
                })
                .collect()
        })
        .collect()
}

pub(crate) fn winners_file(s: &Setup, name: &str, manifests: &[&Manifest]) -> PathBuf {
    let path = s.dir.path().join(name);
    let lines: Vec<String> = manifests.iter().map(|m| m.to_json_line()).collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

pub(crate) fn commit(
    s: &Setup,
    load: &str,
    winners: &PathBuf,
    extra: &[&str],
    crash_at: Option<&str>,
) -> Output {
    let mut cmd = chpart();
    cmd.args(["commit", "--config"])
        .arg(&s.config)
        .args(["--load", load, "--winners"])
        .arg(winners)
        .args(extra);
    if let Some(point) = crash_at {
        cmd.env("CHPART_TEST_CRASH_AT", point);
    }
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

pub(crate) fn expected_fingerprint(ch: &ClickHouse, partitions: &[u32]) -> String {
    let union: Vec<String> = partitions.iter().map(|p| partition_select(*p)).collect();
    ch.q(&fingerprint_sql(&format!(
        "({})",
        union.join(" UNION ALL ")
    )))
}

#[test]
fn only_the_winners_are_attached_and_visible_once() {
    let ch = shared();
    let s = Setup::new(ch, "commit_winners");
    // Three partitions, each built by two attempts (a retry and a zombie): both publish.
    let built = build_load(&s, "cw-1", &[], 3, &["app-a", "app-b"]);
    // Spark's collect() returned: partition 0 and 2 from attempt a, partition 1 from b.
    let winners = [&built[0][0], &built[1][1], &built[2][0]];
    let file = winners_file(&s, "winners.jsonl", &winners);
    let out = commit(&s, "cw-1", &file, &["--partitions", "3", "--json"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["rows"], 3000);
    assert_eq!(
        ch.q(&fingerprint_sql(&s.table)),
        expected_fingerprint(ch, &[0, 1, 2]),
        "exactly the source rows"
    );

    // Re-running is a no-op that still succeeds.
    let out = commit(&s, "cw-1", &file, &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("already committed"), "{}", text(&out));
    assert_eq!(
        ch.q(&fingerprint_sql(&s.table)),
        expected_fingerprint(ch, &[0, 1, 2])
    );

    // The losers' parts were never attached: they are still in the shadow's detached/.
    let shadow = built[0][0].target.table.as_str();
    let left = s.detached(shadow);
    for loser in [&built[0][1], &built[1][0], &built[2][1]] {
        for part in &loser.parts {
            assert!(
                left.contains(&part.name.to_string()),
                "loser part {} gone",
                part.name
            );
        }
    }
    // A build after the commit is fenced.
    let input = write_rows(
        s.dir.path(),
        "late.parquet",
        &partition_select(0),
        "Parquet",
    );
    let late = s
        .build_cmd("cw-1", "app-z.0", 0)
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap();
    assert_eq!(late.status.code(), Some(5), "{}", text(&late));
}

/// Changes one byte (at `at(len)`, xor `mask`) of `data.bin` of the first part `manifest`
/// published in `detached/`: its size stays, so only a content check can tell.
fn flip_byte(manifest: &Manifest, at: impl Fn(usize) -> usize, mask: u8) {
    let path = std::path::Path::new(manifest.target.data_path.as_str())
        .join("detached")
        .join(manifest.parts[0].name.to_string())
        .join("data.bin");
    let mut bytes = std::fs::read(&path).unwrap();
    let i = at(bytes.len());
    bytes[i] ^= mask;
    std::fs::write(&path, bytes).unwrap();
}

#[test]
fn bad_winners_are_refused_before_anything_is_attached() {
    let ch = shared();
    let s = Setup::new(ch, "commit_refusals");
    let built = build_load(
        &s,
        "cr-1",
        &["--visibility", "part"],
        2,
        &["app-a", "app-b"],
    );
    let other = Setup::new(ch, "commit_refusals_other");
    let foreign = build_load(&other, "cr-other", &["--visibility", "part"], 1, &["app-x"]);

    // A forged manifest: attempt b's manifest with attempt a's part names.
    let mut forged = built[0][1].clone();
    forged.parts = built[0][0].parts.clone();
    let forged_line = forged.to_json_line();
    // A winners line whose rows were edited (the load would report rows the table lacks).
    let mut more_rows = built[1][0].clone();
    more_rows.parts[0].rows += 1;
    let more_rows_line = more_rows.to_json_line();

    let cases: Vec<(&str, Vec<String>, Vec<&str>, &str)> = vec![
        (
            "two winners for one partition",
            vec![
                built[0][0].to_json_line(),
                built[0][1].to_json_line(),
                built[1][0].to_json_line(),
            ],
            vec![],
            "two winners",
        ),
        (
            "a missing partition",
            vec![built[0][0].to_json_line()],
            vec!["--partitions", "2"],
            "partition 1",
        ),
        (
            "a manifest of another load",
            vec![built[0][0].to_json_line(), foreign[0][0].to_json_line()],
            vec![],
            "cr-other",
        ),
        (
            "a forged manifest naming another attempt's parts",
            vec![forged_line, built[1][0].to_json_line()],
            vec![],
            "app-b.0",
        ),
        (
            "rows edited in a winners line",
            vec![built[0][0].to_json_line(), more_rows_line],
            vec![],
            "but its count.txt",
        ),
        (
            "not a manifest",
            vec!["{\"hello\": 1}".into(), built[1][0].to_json_line()],
            vec![],
            "line 1",
        ),
    ];
    for (case, lines, extra, want) in cases {
        let file = s.dir.path().join("bad.jsonl");
        std::fs::write(&file, lines.join("\n")).unwrap();
        let out = commit(&s, "cr-1", &file, &extra, None);
        assert_eq!(out.status.code(), Some(4), "{case}: {}", text(&out));
        assert!(
            text(&out).contains(want),
            "{case}: message lacks {want:?}: {}",
            text(&out)
        );
        assert_eq!(
            ch.q(&format!("SELECT count() FROM {}", s.table)).trim(),
            "0",
            "{case}: rows became visible"
        );
    }

    // A part changed after upload (same size): sizes pass, the default for part visibility
    // (--verify full) refuses it.
    flip_byte(&built[1][0], |len| len - 1, 0xff);
    let file = winners_file(&s, "w.jsonl", &[&built[0][0], &built[1][0]]);
    let out = commit(&s, "cr-1", &file, &[], None);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("data.bin") && text(&out).contains("changed after upload"),
        "{}",
        text(&out)
    );
    assert_eq!(
        ch.q(&format!("SELECT count() FROM {}", s.table)).trim(),
        "0"
    );
}

/// Partition visibility checks content by default: a byte flipped in a waiting part (sizes
/// unchanged, so ATTACH itself would accept it and every later query of the table would fail
/// with `Code: 40`) is found by the server's CHECK TABLE of the shadow before anything is
/// visible; a resumed commit checks again.
#[test]
fn a_changed_part_is_refused_before_anything_is_visible() {
    let ch = shared();
    let s = Setup::new(ch, "commit_check_table");
    let load = "check-1";
    let built = build_load(&s, load, &[], 2, &["app-a"]);
    flip_byte(&built[1][0], |len| len / 2, 0x01);
    let file = winners_file(&s, "w.jsonl", &[&built[0][0], &built[1][0]]);
    for run in 0..2 {
        let out = commit(&s, load, &file, &[], None);
        assert_eq!(out.status.code(), Some(4), "run {run}: {}", text(&out));
        assert!(
            text(&out).contains("CHECK TABLE fails part") && text(&out).contains("Checksum"),
            "run {run}: {}",
            text(&out)
        );
        assert_eq!(
            ch.q(&format!("SELECT count() FROM {}", s.table)).trim(),
            "0",
            "run {run}: rows became visible"
        );
    }
}

/// A server restart lifts the shadow's stopped merges: a commit killed with every part in the
/// shadow, whose shadow then merged, still finishes exactly once (the merged partition is
/// checked by its rows and CHECK TABLE, its parts' hashes being gone).
#[test]
fn a_shadow_merged_after_a_crash_still_commits_exactly_once() {
    let ch = shared();
    let s = Setup::new(ch, "commit_shadow_merged");
    let load = "merged-1";
    let built = build_load(&s, load, &[], 2, &["app-a", "app-b"]);
    let file = winners_file(&s, "w.jsonl", &[&built[0][0], &built[1][1]]);
    let out = commit(&s, load, &file, &[], Some("after-attach:4"));
    assert_eq!(out.status.code(), None, "to be killed: {}", text(&out));
    let shadow = ch.q(&format!(
        "SELECT name FROM system.tables WHERE database = '{}' AND name LIKE 'events\\_\\_chpart\\_%'",
        s.db.name
    ));
    let shadow = format!("`{}`.`{}`", s.db.name, shadow.trim());
    ch.q(&format!("SYSTEM START MERGES {shadow}"));
    ch.q(&format!("OPTIMIZE TABLE {shadow} FINAL"));
    let merged = ch.q(&format!(
        "SELECT count() FROM system.parts WHERE active AND level > 0 AND database = '{}' AND table = '{}'",
        s.db.name,
        shadow.rsplit('.').next().unwrap().trim_matches('`')
    ));
    assert_ne!(merged.trim(), "0", "the shadow did not merge");
    let out = commit(&s, load, &file, &[], None);
    assert_eq!(out.status.code(), Some(0), "resume: {}", text(&out));
    assert_eq!(
        ch.q(&fingerprint_sql(&s.table)),
        expected_fingerprint(ch, &[0, 1]),
        "not exactly once"
    );
}

#[test]
fn a_commit_killed_at_any_step_resumes_exactly_once() {
    let ch = shared();
    let points: &[(&str, &[&str])] = &[
        ("after-plan", &[]),
        ("before-attach:1", &[]),
        ("after-decision", &[]),
        ("after-attach:1", &[]),
        ("after-attach:3", &[]),
        ("before-publish:1", &[]),
        ("after-publish:1", &[]),
        ("before-commit", &[]),
        ("after-decision", &["--visibility", "part"]),
        ("before-attach:2", &["--visibility", "part"]),
        ("after-attach:2", &["--visibility", "part"]),
        ("before-commit", &["--visibility", "part"]),
    ];
    for (i, (point, begin)) in points.iter().enumerate() {
        let s = Setup::new(ch, &format!("commit_crash_{i}"));
        let load = format!("cc-{i}");
        let built = build_load(&s, &load, begin, 2, &["app-a", "app-b"]);
        let file = winners_file(&s, "w.jsonl", &[&built[0][1], &built[1][0]]);
        let out = commit(&s, &load, &file, &["--partitions", "2"], Some(point));
        assert_eq!(
            out.status.code(),
            None,
            "{point}: the commit was to be killed: {}",
            text(&out)
        );
        let out = commit(&s, &load, &file, &["--partitions", "2"], None);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{point} {begin:?}: resume failed: {}",
            text(&out)
        );
        assert_eq!(
            ch.q(&fingerprint_sql(&s.table)),
            expected_fingerprint(ch, &[0, 1]),
            "{point} {begin:?}: not exactly once"
        );
        let again = commit(&s, &load, &file, &["--partitions", "2"], None);
        assert_eq!(again.status.code(), Some(0));
        assert_eq!(
            ch.q(&fingerprint_sql(&s.table)),
            expected_fingerprint(ch, &[0, 1]),
            "{point}: third run changed rows"
        );
    }
}

/// The partitions of a load are moved by one `ALTER` of several `MOVE PARTITION` commands, which
/// the server runs one after the other: a server or connection lost inside it leaves some
/// partitions moved and the others still in the shadow. That state, made here by a commit
/// killed just before its `ALTER` and the first partition's MOVE done by hand, resumes exactly
/// once.
#[test]
fn a_move_alter_cut_after_its_first_partition_resumes_exactly_once() {
    let ch = shared();
    let s = Setup::new(ch, "commit_half_moved");
    let load = "hm-1";
    let built = build_load(&s, load, &[], 2, &["app-a"]);
    let file = winners_file(&s, "w.jsonl", &[&built[0][0], &built[1][0]]);
    let out = commit(
        &s,
        load,
        &file,
        &["--partitions", "2"],
        Some("before-publish"),
    );
    assert_eq!(out.status.code(), None, "to be killed: {}", text(&out));
    let shadow = ch
        .q(&format!(
            "SELECT name FROM system.tables WHERE database = '{}' AND name LIKE 'events__chpart_%'",
            s.db.name
        ))
        .trim()
        .to_owned();
    let partitions = ch.q(&format!(
        "SELECT DISTINCT partition_id FROM system.parts WHERE database = '{}' AND table = '{shadow}' \
         AND active ORDER BY partition_id",
        s.db.name
    ));
    let partitions: Vec<&str> = partitions.lines().collect();
    assert!(partitions.len() >= 2, "the shadow holds {partitions:?}");
    ch.q(&format!(
        "ALTER TABLE `{db}`.`{shadow}` MOVE PARTITION ID '{}' TO TABLE `{db}`.events",
        partitions[0],
        db = s.db.name
    ));
    let out = commit(&s, load, &file, &["--partitions", "2"], None);
    assert_eq!(out.status.code(), Some(0), "resume failed: {}", text(&out));
    assert_eq!(
        ch.q(&fingerprint_sql(&s.table)),
        expected_fingerprint(ch, &[0, 1]),
        "not exactly once"
    );
}

#[test]
fn two_concurrent_commits_attach_each_part_once() {
    let ch = shared();
    for (i, begin) in [&[][..], &["--visibility", "part"][..]].iter().enumerate() {
        let s = Setup::new(ch, &format!("commit_race_{i}"));
        let load = format!("cx-{i}");
        let built = build_load(&s, &load, begin, 3, &["app-a"]);
        let file = winners_file(&s, "w.jsonl", &[&built[0][0], &built[1][0], &built[2][0]]);
        let spawn = || {
            let mut cmd = chpart();
            cmd.args(["commit", "--config"])
                .arg(&s.config)
                .args(["--load", &load, "--winners"])
                .arg(&file);
            cmd.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn(), spawn());
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        assert_eq!(a.status.code(), Some(0), "first: {}", text(&a));
        assert_eq!(b.status.code(), Some(0), "second: {}", text(&b));
        assert_eq!(
            ch.q(&fingerprint_sql(&s.table)),
            expected_fingerprint(ch, &[0, 1, 2]),
            "{begin:?}"
        );
    }
}

/// Two drivers commit one load with *different* winners at once (a zombie driver and its
/// replacement): the server keeps one plan, the other commit exits 4 before anything of it
/// becomes visible, and the rows are exactly once. Several rounds, both visibilities.
#[test]
fn two_commits_with_other_winners_settle_on_one_plan() {
    let ch = shared();
    for (i, begin) in [&[][..], &["--visibility", "part"][..]].iter().enumerate() {
        for round in 0..3 {
            let s = Setup::new(ch, &format!("commit_plan_race_{i}_{round}"));
            let load = format!("cp-{i}-{round}");
            let built = build_load(&s, &load, begin, 2, &["app-a", "app-b"]);
            let a = winners_file(&s, "a.jsonl", &[&built[0][0], &built[1][0]]);
            let b = winners_file(&s, "b.jsonl", &[&built[0][1], &built[1][0]]);
            let spawn = |file: &PathBuf| {
                let mut cmd = chpart();
                cmd.args(["commit", "--config"])
                    .arg(&s.config)
                    .args(["--load", &load, "--json", "--winners"])
                    .arg(file);
                cmd.stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            };
            let (pa, pb) = (spawn(&a), spawn(&b));
            let (oa, ob) = (
                pa.wait_with_output().unwrap(),
                pb.wait_with_output().unwrap(),
            );
            let codes = (oa.status.code(), ob.status.code());
            let (won, lost, winner) = match codes {
                (Some(0), Some(4)) => (&oa, &ob, &built[0][0]),
                (Some(4), Some(0)) => (&ob, &oa, &built[0][1]),
                _ => panic!(
                    "{begin:?} round {round}: exactly one commit must win: {}\n---\n{}",
                    text(&oa),
                    text(&ob)
                ),
            };
            assert!(
                text(lost).contains("a commit with other winners is already recorded"),
                "{}",
                text(lost)
            );
            let summary: serde_json::Value =
                serde_json::from_slice(&won.stdout).expect("the winner's summary");
            assert_eq!(
                summary["winners"][0][1].as_str(),
                Some(winner.attempt.id.as_str()),
                "{begin:?} round {round}: the committed plan is the winner's"
            );
            assert_eq!(
                ch.q(&fingerprint_sql(&s.table)),
                expected_fingerprint(ch, &[0, 1]),
                "{begin:?} round {round}: not exactly once"
            );
            // The loser's winners stay refused; the winner's finish as a no-op.
            let loser_file = if std::ptr::eq(winner, &built[0][0]) {
                &b
            } else {
                &a
            };
            let again = commit(&s, &load, loser_file, &[], None);
            assert_eq!(
                again.status.code(),
                Some(0),
                "a committed load: {}",
                text(&again)
            );
        }
    }
}

/// The plan holds everything a commit needs: killed after claiming the load, with the
/// winners file gone (the driver's host lost), `chpart commit --load L` without `--winners`
/// from another working directory finishes it exactly once. Without a plan there is nothing
/// to resume from.
#[test]
fn a_commit_resumes_from_the_ledger_alone() {
    let ch = shared();
    for (i, (point, begin)) in [
        ("after-decision", &[][..]),
        ("after-attach:1", &["--visibility", "part"][..]),
    ]
    .iter()
    .enumerate()
    {
        let s = Setup::new(ch, &format!("commit_resume_ledger_{i}"));
        let load = format!("resume-{i}");
        let built = build_load(&s, &load, begin, 2, &["app-a", "app-b"]);
        let file = winners_file(&s, "w.jsonl", &[&built[0][1], &built[1][0]]);

        let mut no_plan = chpart();
        no_plan
            .args(["commit", "--config"])
            .arg(&s.config)
            .args(["--load", &load]);
        let out = no_plan.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            text(&out).contains("no commit plan is recorded yet"),
            "{}",
            text(&out)
        );

        let out = commit(&s, &load, &file, &["--partitions", "2"], Some(point));
        assert_eq!(
            out.status.code(),
            None,
            "{point}: to be killed: {}",
            text(&out)
        );
        std::fs::remove_file(&file).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let mut resume = chpart();
        resume
            .current_dir(elsewhere.path())
            .args(["commit", "--json", "--config"])
            .arg(&s.config)
            .args(["--load", &load]);
        let out = resume.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{point}: resume: {}",
            text(&out)
        );
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            summary["winners"][0][1].as_str(),
            Some(built[0][1].attempt.id.as_str()),
            "{point}: the recorded winners"
        );
        assert_eq!(
            ch.q(&fingerprint_sql(&s.table)),
            expected_fingerprint(ch, &[0, 1]),
            "{point}: not exactly once"
        );
    }
}

/// The load's state as `chpart status --json` reports it.
fn state_of(s: &Setup, load: &str) -> String {
    let out = chpart()
        .args(["status", "--config"])
        .arg(&s.config)
        .args(["--load", load, "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    status[0]["state"].as_str().unwrap().to_owned()
}

fn abort(s: &Setup, load: &str) -> Output {
    chpart()
        .args(["abort", "--config"])
        .arg(&s.config)
        .args(["--load", load])
        .output()
        .unwrap()
}

/// A load of two Spark partitions, one attempt each (`begin` args as given): its winners file.
fn one_attempt_load(s: &Setup, load: &str, begin: &[&str]) -> PathBuf {
    let built = build_load(s, load, begin, 2, &["app-a"]);
    winners_file(s, &format!("{load}.jsonl"), &[&built[0][0], &built[1][0]])
}

#[test]
fn commit_and_abort_settle_each_load_one_way() {
    let ch = shared();
    for (i, begin) in [&[][..], &["--visibility", "part"][..]].iter().enumerate() {
        let s = Setup::new(ch, &format!("commit_abort_{i}"));
        let all = expected_fingerprint(ch, &[0, 1]);
        let none = ch.q(&fingerprint_sql(&s.table));

        // A commit that claimed the load and was killed before its first visible step: abort
        // refuses (the commit may be making rows visible), and the commit finishes on re-run.
        let load = format!("ca-{i}-claimed");
        let file = one_attempt_load(&s, &load, begin);
        let out = commit(&s, &load, &file, &[], Some("after-decision"));
        assert_ne!(out.status.code(), Some(0), "{}", text(&out));
        let refused = abort(&s, &load);
        assert_ne!(refused.status.code(), Some(0), "{}", text(&refused));
        assert!(
            text(&refused).contains("commit"),
            "abort names the commit in progress: {}",
            text(&refused)
        );
        let out = commit(&s, &load, &file, &[], None);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert_eq!(ch.q(&fingerprint_sql(&s.table)), all, "{begin:?}");
        assert_eq!(state_of(&s, &load), "committed");
        ch.q(&format!("TRUNCATE TABLE {}", s.table));

        // A claimed load whose commit is given up: `abort --force` ends it; the commit is then
        // fenced (exit 5), and nothing of the load was visible (it was killed before its first
        // visible step).
        let load = format!("ca-{i}-forced");
        let file = one_attempt_load(&s, &load, begin);
        let out = commit(&s, &load, &file, &[], Some("after-decision"));
        assert_ne!(out.status.code(), Some(0), "{}", text(&out));
        let refused = abort(&s, &load);
        assert!(
            text(&refused).contains("abort --force"),
            "the refusal says how to force: {}",
            text(&refused)
        );
        let forced = chpart()
            .args(["abort", "--config"])
            .arg(&s.config)
            .args(["--load", &load, "--force"])
            .output()
            .unwrap();
        assert_eq!(forced.status.code(), Some(0), "{}", text(&forced));
        assert_eq!(state_of(&s, &load), "aborted");
        let out = commit(&s, &load, &file, &[], None);
        assert_eq!(out.status.code(), Some(5), "{}", text(&out));
        assert_eq!(ch.q(&fingerprint_sql(&s.table)), none, "{begin:?}");

        // An abort first: the commit fails before anything becomes visible.
        let load = format!("ca-{i}-aborted");
        let file = one_attempt_load(&s, &load, begin);
        let out = abort(&s, &load);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let out = commit(&s, &load, &file, &[], None);
        assert_eq!(out.status.code(), Some(5), "{}", text(&out));
        assert_eq!(ch.q(&fingerprint_sql(&s.table)), none, "{begin:?}");

        // Racing: each load ends committed with all its rows or aborted with none, and both
        // processes agree on which.
        for round in 0..4 {
            let load = format!("ca-{i}-race-{round}");
            let file = one_attempt_load(&s, &load, begin);
            let mut committer = chpart();
            committer
                .args(["commit", "--config"])
                .arg(&s.config)
                .args(["--load", &load, "--winners"])
                .arg(&file)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let committer = committer.spawn().unwrap();
            let aborted = abort(&s, &load);
            let committed = committer.wait_with_output().unwrap();
            let state = state_of(&s, &load);
            let seen = ch.q(&fingerprint_sql(&s.table));
            match state.as_str() {
                "committed" => {
                    assert_eq!(committed.status.code(), Some(0), "{}", text(&committed));
                    assert_ne!(aborted.status.code(), Some(0), "{}", text(&aborted));
                    assert_eq!(seen, all, "{load}: committed with every row");
                }
                "aborted" => {
                    assert_ne!(committed.status.code(), Some(0), "{}", text(&committed));
                    assert_eq!(aborted.status.code(), Some(0), "{}", text(&aborted));
                    assert_eq!(seen, none, "{load}: aborted with no row visible");
                }
                other => panic!(
                    "{load} ended {other}: commit {} / abort {}",
                    text(&committed),
                    text(&aborted)
                ),
            }
            ch.q(&format!("TRUNCATE TABLE {}", s.table));
        }
    }
}

#[test]
fn replace_mode_swaps_partitions_and_readers_never_see_a_mix() {
    let ch = shared();
    let s = Setup::new(ch, "commit_replace");
    // The table already holds old data for January and February 2026 (and March, untouched).
    ch.q(&format!(
        "INSERT INTO {} SELECT toDateTime('2026-01-20 00:00:00', 'UTC') + toIntervalDay(number % 40), 900000 + number, 'old', NULL FROM numbers(4000)",
        s.table
    ));
    let march_before = ch.q(&format!(
        "SELECT count() FROM {} WHERE toYYYYMM(ts) = 202603",
        s.table
    ));
    let built = build_load(&s, "rp-1", &["--mode", "replace"], 2, &["app-a"]);
    let file = winners_file(&s, "w.jsonl", &[&built[0][0], &built[1][0]]);

    // A reader polls the partitions while the commit runs: each one is always either all old
    // or all new, never empty or mixed.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (stop, table, url) = (stop.clone(), s.table.clone(), ch.http_port);
        std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            let mut polls = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || polls < 3 {
                polls += 1;
                let sql = format!(
                    "SELECT toYYYYMM(ts) AS m, countIf(name = 'old') > 0, countIf(name != 'old') > 0 FROM {table} \
                     WHERE m IN (202601, 202602) GROUP BY m ORDER BY m FORMAT TSV"
                );
                let out = std::process::Command::new("curl")
                    .args([
                        "-s",
                        "--data-binary",
                        &sql,
                        &format!("http://127.0.0.1:{url}/"),
                    ])
                    .output()
                    .unwrap();
                let body = String::from_utf8_lossy(&out.stdout).into_owned();
                assert_eq!(
                    body.lines().count(),
                    2,
                    "a partition was empty at some point: {body:?}"
                );
                for line in body.lines() {
                    assert!(
                        !line.ends_with("1\t1"),
                        "old and new rows mixed in one partition: {line}"
                    );
                    seen.insert(line.to_owned());
                }
            }
            seen
        })
    };
    let out = commit(&s, "rp-1", &file, &[], None);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = reader.join().expect("the reader's invariant held");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!seen.is_empty());
    assert_eq!(
        ch.q(&fingerprint_sql(&format!(
            "{} WHERE toYYYYMM(ts) IN (202601, 202602)",
            s.table
        ))),
        ch.q(&fingerprint_sql(&format!(
            "({}) WHERE toYYYYMM(ts) IN (202601, 202602)",
            [partition_select(0), partition_select(1)].join(" UNION ALL ")
        ))),
        "January and February hold exactly the reload"
    );
    assert_eq!(
        ch.q(&format!(
            "SELECT count() FROM {} WHERE toYYYYMM(ts) = 202603",
            s.table
        )),
        march_before,
        "March untouched"
    );
}
