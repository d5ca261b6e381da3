//! Scenario tables for the commit decisions, and a small model of the server and ledger in
//! which a driver made only of those decisions is killed at every step, or raced against a
//! second one.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::destination::DiskPlace;
use crate::fingerprint::TableFingerprint;
use crate::ids::{AttemptId, LoadId, PartitionId};
use crate::manifest::{count_txt_entry, FileEntry, Manifest, OtherDisk, PartEntry, Target};
use crate::names::{detached_part_name, PartName};
use crate::testutil::expect_row;
use crate::Attempt;

mod sim;

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

fn load() -> LoadId {
    "L".parse().unwrap()
}

fn fp(byte: &str) -> TableFingerprint {
    format!("sha256:{}", byte.repeat(32)).parse().unwrap()
}

fn expected() -> Expected {
    Expected {
        publish: "db.events_shadow".parse().unwrap(),
        fingerprint: fp("cd"),
        disks: vec![
            DiskPlace {
                disk: "default".into(),
                data_path: "/var/lib/clickhouse/store/abc/abcd".parse().unwrap(),
                staging_root: "/staging".parse().unwrap(),
            },
            DiskPlace {
                disk: "d2".into(),
                data_path: "/mnt/d2/store/abc/abcd".parse().unwrap(),
                staging_root: "/mnt/d2/staging".parse().unwrap(),
            },
        ],
        host: "ch-1".into(),
    }
}

/// A hash unique to a part name: 32 lowercase hex digits.
fn hash_of(name: &PartName) -> String {
    format!("{:032x}", name.min_block())
}

/// A valid manifest of `load` by `attempt` for Spark `partition`, with parts
/// (partition id, seq, rows), published as `expected()` says.
fn manifest(load: &str, partition: u32, attempt: &str, parts: &[(&str, u32, u64)]) -> Manifest {
    let (load, id): (LoadId, AttemptId) = (load.parse().unwrap(), attempt.parse().unwrap());
    let e = expected();
    let parts = parts
        .iter()
        .map(|&(pid, seq, rows)| {
            let partition_id: PartitionId = pid.parse().unwrap();
            let name = detached_part_name(&load, &id, &partition_id, seq);
            let file = |path: &str, size| FileEntry {
                path: path.into(),
                size,
                sha256: "ab".repeat(32),
            };
            PartEntry {
                hash_of_all_files: hash_of(&name),
                name,
                partition_id,
                seq,
                rows,
                bytes_on_disk: 10 + count_txt_entry(rows).size + rows,
                files: vec![
                    file("checksums.txt", 10),
                    count_txt_entry(rows),
                    file("data.bin", rows),
                ],
                disk: None,
            }
        })
        .collect();
    Manifest {
        target: Target {
            database: e.publish.database.clone(),
            table: e.publish.table.clone(),
            host: e.host.clone(),
            disk: "default".into(),
            data_path: e.disks[0].data_path.clone(),
            staging_dir: e.disks[0].staging().attempt(&load, &id).dir().clone(),
            other_disks: Vec::new(),
        },
        load,
        attempt: Attempt {
            id,
            partition,
            stage: Some(1),
            stage_attempt: Some(0),
            attempt_number: Some(0),
        },
        table_fingerprint: e.fingerprint,
        clickhouse_local_version: "26.9.2.1".into(),
        source_rows: 0,
        ttl_removed_rows: 0,
        created_at_unix_ms: 1_764_490_000_000,
        phases: Default::default(),
        parts,
    }
}

/// Partition 0: attempt app.1, parts in 202601 (100 rows) and 202602 (50 rows).
fn m0() -> Manifest {
    manifest("L", 0, "app.1", &[("202601", 0, 100), ("202602", 1, 50)])
}

/// Partition 1: attempt app.7, one part in 202601 (30 rows).
fn m1() -> Manifest {
    manifest("L", 1, "app.7", &[("202601", 0, 30)])
}

/// Partition 2: attempt app.9, no rows, no parts.
fn m2() -> Manifest {
    manifest("L", 2, "app.9", &[])
}

fn lines(manifests: &[Manifest]) -> Vec<(usize, String)> {
    manifests
        .iter()
        .enumerate()
        .map(|(i, m)| (i + 1, m.to_json_line()))
        .collect()
}

fn winners(manifests: &[Manifest]) -> Winners {
    validate_winners(&load(), &expected(), &lines(manifests), None, false).unwrap()
}

fn plan(visibility: Visibility, mode: Mode) -> CommitPlan {
    CommitPlan::from_winners(&winners(&[m0(), m1(), m2()]), visibility, mode)
}

// ---------------------------------------------------------------------------------------------
// 1. Winners
// ---------------------------------------------------------------------------------------------

#[test]
fn winners_table() {
    type Lines = Vec<(usize, String)>;
    let base = || lines(&[m0(), m1(), m2()]);
    let with = |edit: fn(&mut Manifest)| {
        let mut m = m1();
        edit(&mut m);
        lines(&[m0(), m, m2()])
    };
    let garbage = || {
        let mut l = base();
        l.push((4, "{\"format\":\"chpart-attempt-manifest\",\"vers".into()));
        l
    };
    // (name, lines, expected_partitions, allow_missing, Ok(partitions) or every problem, in
    // order, by a substring)
    type Row<'a> = (
        &'a str,
        Lines,
        Option<u32>,
        bool,
        Result<Vec<u32>, Vec<&'a str>>,
    );
    let rows: Vec<Row> = vec![
        ("three winners, one without rows", base(), None, false, Ok(vec![0, 1, 2])),
        ("partition count given", base(), Some(3), false, Ok(vec![0, 1, 2])),
        (
            "lines in any order",
            lines(&[m2(), m0(), m1()]),
            Some(3),
            false,
            Ok(vec![0, 1, 2]),
        ),
        (
            "unparsable line",
            garbage(),
            None,
            false,
            Err(vec!["line 4 (partition ?, attempt ?): manifest is not valid JSON: EOF"]),
        ),
        (
            "invalid manifest: reported once, not also as a missing partition",
            {
                let mut l = base();
                l[1].1 = l[1].1.replace(&hash_of(&m1().parts[0].name), "XYZ");
                l
            },
            None,
            false,
            Err(vec![
                "line 2 (partition 1, attempt app.7): manifest of load L attempt app.7: part 202601_",
            ]),
        ),
        (
            "manifest of another load",
            lines(&[m0(), manifest("M", 1, "app.7", &[("202601", 0, 30)]), m2()]),
            None,
            false,
            Err(vec![
                "line 2 (partition 1, attempt app.7): manifest of load M, not of this load; its part 202601_",
                "line 2 (partition 1, attempt app.7): staging_dir /staging/M/app.7 is not /staging/L/app.7",
            ]),
        ),
        (
            "forged manifest pointing at another table",
            with(|m| m.target.table = "events".parse().unwrap()),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): its part 202601_"]),
        ),
        (
            "forged manifest pointing at another table: names both tables",
            with(|m| m.target.table = "events".parse().unwrap()),
            None,
            false,
            Err(vec!["were published into db.events, but this load publishes into db.events_shadow; refusing a manifest that points at another table"]),
        ),
        (
            "built for another table definition",
            with(|m| m.table_fingerprint = fp("ee")),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): its part 202601_"]),
        ),
        (
            "fingerprint named",
            with(|m| m.table_fingerprint = fp("ee")),
            None,
            false,
            Err(vec!["built for table fingerprint sha256:eeee"]),
        ),
        (
            "another data path",
            with(|m| m.target.data_path = "/var/lib/clickhouse/store/fff/ffff".parse().unwrap()),
            None,
            false,
            Err(vec!["published under data path /var/lib/clickhouse/store/fff/ffff, but the publish table's is /var/lib/clickhouse/store/abc/abcd"]),
        ),
        (
            "another host",
            with(|m| m.target.host = "ch-2".into()),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): its part 202601_"]),
        ),
        (
            "host named",
            with(|m| m.target.host = "ch-2".into()),
            None,
            false,
            Err(vec!["published on host ch-2, but this load publishes on ch-1"]),
        ),
        (
            "staging dir under another root",
            with(|m| m.target.staging_dir = "/other/L/app.7".parse().unwrap()),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): staging_dir /other/L/app.7 is not /staging/L/app.7, this attempt's directory under the configured staging root"]),
        ),
        (
            "a part on the load's second disk",
            with(|m| {
                m.target.other_disks.push(OtherDisk {
                    disk: "d2".into(),
                    data_path: "/mnt/d2/store/abc/abcd".parse().unwrap(),
                    staging_dir: "/mnt/d2/staging/L/app.7".parse().unwrap(),
                });
                m.parts[0].disk = Some("d2".into());
            }),
            None,
            false,
            Ok(vec![0, 1, 2]),
        ),
        (
            "a second disk's staging under another root",
            with(|m| {
                m.target.other_disks.push(OtherDisk {
                    disk: "d2".into(),
                    data_path: "/mnt/d2/store/abc/abcd".parse().unwrap(),
                    staging_dir: "/staging/L/app.7".parse().unwrap(),
                });
            }),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): staging_dir /staging/L/app.7 is not /mnt/d2/staging/L/app.7"]),
        ),
        (
            "a disk the load does not publish to",
            with(|m| m.target.disk = "d9".into()),
            None,
            false,
            Err(vec!["published on disk d9, but this load publishes on default, d2"]),
        ),
        (
            "part without rows",
            with(|m| {
                m.parts[0].rows = 0;
                m.parts[0].files[1] = count_txt_entry(0);
                m.parts[0].files[2].size = 0;
                m.parts[0].bytes_on_disk = 11;
            }),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): part 202601_"]),
        ),
        (
            "rows edited in a winners line: one problem, the partition is not also missing",
            with(|m| m.parts[0].rows += 1),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): manifest of load L attempt app.7: part 202601_"]),
        ),
        (
            "two winners for one partition",
            lines(&[m0(), m1(), m2(), manifest("L", 1, "app.8", &[("202601", 0, 30)])]),
            None,
            false,
            Err(vec!["partition 1 has two winners: attempt app.7 (line 2) and attempt app.8 (line 4); collect() returns one per partition — pass exactly what it returned"]),
        ),
        (
            "one attempt for two partitions",
            lines(&[m0(), m1(), manifest("L", 2, "app.7", &[("202603", 0, 1)])]),
            None,
            false,
            Err(vec!["attempt app.7 is given as the winner of two partitions: partition 1 (line 2) and partition 2 (line 3)"]),
        ),
        (
            "the same manifest twice: two winners and every part twice",
            lines(&[m0(), m1(), m2(), m0()]),
            None,
            false,
            Err(vec![
                "partition 0 has two winners: attempt app.1 (line 1) and attempt app.1 (line 4)",
                "part 202601_",
                "part 202602_",
            ]),
        ),
        (
            "the same part in two manifests names both",
            lines(&[m0(), m1(), m2(), m1()]),
            None,
            false,
            Err(vec![
                "partition 1 has two winners",
                "is listed by two manifests: partition 1 attempt app.7 (line 2) and partition 1 attempt app.7 (line 4)",
            ]),
        ),
        (
            "a gap is a missing partition",
            lines(&[m0(), m2()]),
            None,
            false,
            Err(vec!["partition 1 has no winner (winners were given for partitions up to 2); its rows would be lost"]),
        ),
        ("a gap, allowed", lines(&[m0(), m2()]), None, true, Ok(vec![0, 2])),
        (
            "last partition missing",
            base(),
            Some(4),
            false,
            Err(vec!["partition 3 has no winner (the job has partitions 0..4)"]),
        ),
        ("last partition missing, allowed", base(), Some(4), true, Ok(vec![0, 1, 2])),
        (
            "partition beyond the count",
            base(),
            Some(2),
            false,
            Err(vec!["line 3 (partition 2, attempt app.9): partition 2 is outside 0..2"]),
        ),
        (
            "partition beyond the count, even when missing ones are allowed",
            base(),
            Some(2),
            true,
            Err(vec!["partition 2 is outside 0..2"]),
        ),
        ("nothing given", vec![], None, false, Err(vec!["no winners were given"])),
        ("nothing given for a job without partitions", vec![], Some(0), false, Ok(vec![])),
        ("nothing given, allowed", vec![], None, true, Ok(vec![])),
        (
            "every problem at once",
            {
                let mut l = garbage();
                let mut m = m1();
                m.target.host = "ch-2".into();
                l[1].1 = m.to_json_line();
                l.push((5, manifest("L", 0, "app.3", &[]).to_json_line()));
                l
            },
            Some(4),
            false,
            Err(vec![
                "line 2 (partition 1, attempt app.7): its part 202601_",
                "line 4 (partition ?, attempt ?)",
                "partition 0 has two winners: attempt app.1 (line 1) and attempt app.3 (line 5)",
                "partition 3 has no winner",
            ]),
        ),
    ];
    for (row, lines, count, allow_missing, want) in rows {
        let got = validate_winners(&load(), &expected(), &lines, count, allow_missing);
        match (got, want) {
            (Ok(w), Ok(partitions)) => {
                assert_eq!(w.load(), &load(), "{row}");
                assert_eq!(
                    w.manifests().keys().copied().collect::<Vec<_>>(),
                    partitions,
                    "{row}"
                );
                for (p, m) in w.manifests() {
                    assert_eq!(m.attempt.partition, *p, "{row}");
                }
            }
            (Err(e), Err(want)) => {
                let got: Vec<String> = e.problems.iter().map(ToString::to_string).collect();
                assert_eq!(got.len(), want.len(), "{row}: {got:#?}");
                for (g, w) in got.iter().zip(&want) {
                    assert!(g.contains(w), "{row}: {g:?} lacks {w:?}");
                }
                // The whole message lists every problem, one per line.
                let msg = e.to_string();
                assert_eq!(msg.lines().count(), want.len() + 1, "{row}: {msg}");
            }
            (Ok(w), Err(want)) => panic!(
                "{row}: accepted {:?}, expected {want:?}",
                w.manifests().keys()
            ),
            (Err(e), Ok(_)) => panic!("{row}: refused: {e}"),
        }
    }
}

#[test]
fn winners_error_message_shape() {
    let err =
        validate_winners(&load(), &expected(), &lines(&[m0(), m2()]), Some(3), false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "refusing the winners of load L: 1 problem\n  - partition 1 has no winner (the job has \
         partitions 0..3); its rows would be lost — pass every manifest collect() returned, or \
         allow missing partitions"
    );
}

#[test]
fn part_lists_are_short() {
    let m = manifest(
        "L",
        0,
        "a",
        &[
            ("1", 0, 1),
            ("2", 1, 1),
            ("3", 2, 1),
            ("4", 3, 1),
            ("5", 4, 1),
        ],
    );
    let text = PartList::of(&m).to_string();
    assert!(text.starts_with("parts 1_"), "{text}");
    assert!(text.ends_with(" and 2 more"), "{text}");
    assert_eq!(PartList(vec![]).to_string(), "no parts");
}

// ---------------------------------------------------------------------------------------------
// 2. The plan
// ---------------------------------------------------------------------------------------------

#[test]
fn plan_from_winners() {
    let p = plan(Visibility::Partition, Mode::Append);
    let (a, b) = (m0(), m1());
    let got: Vec<(&str, u32, &str, u64)> = p
        .parts
        .iter()
        .map(|x| {
            (
                x.partition_id.as_str(),
                x.partition,
                x.attempt.as_str(),
                x.rows,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("202601", 0, "app.1", 100),
            ("202601", 1, "app.7", 30),
            ("202602", 0, "app.1", 50)
        ]
    );
    assert_eq!(p.parts[0].name, a.parts[0].name);
    assert_eq!(p.parts[1].name, b.parts[0].name);
    assert_eq!(p.parts[2].name, a.parts[1].name);
    assert_eq!(p.parts[2].bytes, 62);
    assert_eq!(p.parts[2].hash_of_all_files, a.parts[1].hash_of_all_files);
    let partitions: Vec<(&str, u64, u32)> = p
        .partitions
        .iter()
        .map(|x| (x.partition_id.as_str(), x.rows, x.parts))
        .collect();
    assert_eq!(partitions, [("202601", 130, 2), ("202602", 50, 1)]);
    assert_eq!(p.total_rows, 180);
    let winners: Vec<(u32, &str)> = p.winners.iter().map(|(n, a)| (*n, a.as_str())).collect();
    assert_eq!(winners, [(0, "app.1"), (1, "app.7"), (2, "app.9")]);
    assert_eq!(p.partition(&"202602".parse().unwrap()).unwrap().rows, 50);
    assert!(p.partition(&"202603".parse().unwrap()).is_none());
}

#[test]
fn plan_order_does_not_depend_on_line_order_and_seq_breaks_ties() {
    let many = manifest(
        "L",
        0,
        "a",
        &[("202601", 3, 1), ("202601", 1, 2), ("202601", 2, 3)],
    );
    let seqs: Vec<u64> =
        CommitPlan::from_winners(&winners(&[many]), Visibility::Part, Mode::Append)
            .parts
            .iter()
            .map(|p| p.rows)
            .collect();
    assert_eq!(seqs, [2, 3, 1], "ordered by seq 1, 2, 3");
    // Within a ClickHouse partition, the Spark partition comes before seq.
    let two = [
        manifest("L", 0, "a", &[("202601", 5, 1)]),
        manifest("L", 1, "b", &[("202601", 0, 2)]),
    ];
    let order: Vec<(u32, u64)> =
        CommitPlan::from_winners(&winners(&two), Visibility::Part, Mode::Append)
            .parts
            .iter()
            .map(|p| (p.partition, p.rows))
            .collect();
    assert_eq!(order, [(0, 1), (1, 2)]);
    let shuffled = CommitPlan::from_winners(
        &winners(&[m2(), m1(), m0()]),
        Visibility::Partition,
        Mode::Append,
    );
    assert_eq!(shuffled, plan(Visibility::Partition, Mode::Append));
}

#[test]
fn plan_json_round_trip_and_pinned_fingerprint() {
    let p = plan(Visibility::Partition, Mode::Replace);
    let json = p.to_json();
    assert!(
        json.starts_with(r#"{"load":"L","visibility":"partition","mode":"replace","parts":[{"partition":0,"attempt":"app.1","name":"202601_"#),
        "{json}"
    );
    assert!(
        json.contains(r#""winners":[[0,"app.1"],[1,"app.7"],[2,"app.9"]],"manifests":["{"#),
        "{json}"
    );
    assert_eq!(CommitPlan::from_json(&json).unwrap(), p);
    assert_eq!(p.fingerprint(), p.clone().fingerprint());
    assert_ne!(
        p.fingerprint(),
        plan(Visibility::Partition, Mode::Append).fingerprint()
    );
    // Pinned: the fingerprint of a recorded plan is compared across chpart runs, so a change to
    // the plan's JSON must be deliberate.
    assert_eq!(p.fingerprint(), PINNED_PLAN);
}

const PINNED_PLAN: &str = "sha256:6f9d524f680ebc835b30a14c5ed5270eba8a03bcfcf0661242de0971e3214fdb";

#[test]
fn recorded_plan_consistency_table() {
    type Edit = fn(&mut Value);
    let rows: Vec<(&str, Edit, Result<(), &str>)> = vec![
        ("as written", |_| {}, Ok(())),
        (
            "total changed",
            |v| v["total_rows"] = 181.into(),
            Err("recorded commit plan of load L is inconsistent: partitions or total_rows do not add up"),
        ),
        (
            "part rows changed, summary not",
            |v| v["parts"][0]["rows"] = 99.into(),
            Err("do not add up"),
        ),
        (
            "a part without rows",
            |v| {
                v["parts"][0]["rows"] = 0.into();
                v["partitions"][0]["rows"] = 30.into();
                v["total_rows"] = 80.into();
            },
            Err("part 202601_"),
        ),
        (
            "a part under another partition",
            |v| v["parts"][2]["partition_id"] = "202601".into(),
            Err("is listed under ClickHouse partition 202601"),
        ),
        (
            "parts out of order",
            |v| {
                let parts = v["parts"].as_array_mut().unwrap();
                parts.swap(0, 2);
            },
            Err("parts are not ordered"),
        ),
        (
            "a part twice",
            |v| {
                let parts = v["parts"].as_array_mut().unwrap();
                parts[1] = parts[0].clone();
                v["partitions"][0]["rows"] = 200.into();
                v["total_rows"] = 250.into();
            },
            Err("is listed twice"),
        ),
        (
            "winners out of order",
            |v| v["winners"].as_array_mut().unwrap().swap(0, 1),
            Err("winners are not sorted"),
        ),
        (
            "a part of a loser",
            |v| v["winners"][1][1] = "app.8".into(),
            Err("is of attempt app.7 for partition 1, which is not that partition's winner"),
        ),
        (
            "a manifest left out",
            |v| _ = v["manifests"].as_array_mut().unwrap().pop(),
            Err("its manifests are not those of its winners"),
        ),
        (
            "a manifest that does not read",
            |v| v["manifests"][1] = "{}".into(),
            Err("manifest 2 of the plan does not read"),
        ),
        (
            "recorded before plans kept their manifests",
            |v| _ = v.as_object_mut().unwrap().remove("manifests"),
            Ok(()),
        ),
        (
            "written by a newer chpart",
            |v| v["compression"] = "zstd".into(),
            Err("recorded commit plan is not readable: unknown field `compression`"),
        ),
        (
            "a bad id",
            |v| v["load"] = "a/b".into(),
            Err("load id \"a/b\" contains '/'"),
        ),
    ];
    for (row, edit, want) in rows {
        let mut v: Value =
            serde_json::from_str(&plan(Visibility::Part, Mode::Append).to_json()).unwrap();
        edit(&mut v);
        expect_row(row, CommitPlan::from_json(&v.to_string()), want);
    }
}

#[test]
fn plan_matches_table() {
    let recorded = plan(Visibility::Partition, Mode::Append);
    let from = |ms: &[Manifest]| {
        let w = validate_winners(&load(), &expected(), &lines(ms), None, true).unwrap();
        CommitPlan::from_winners(&w, Visibility::Partition, Mode::Append)
    };
    let rows: Vec<(&str, CommitPlan, Result<(), &str>)> = vec![
        ("same winners", from(&[m0(), m1(), m2()]), Ok(())),
        ("same winners in another order", from(&[m2(), m0(), m1()]), Ok(())),
        (
            "another winner for a partition",
            from(&[m0(), manifest("L", 1, "app.8", &[("202601", 0, 30)]), m2()]),
            Err("load L partition 1: the recorded plan's winner is attempt app.7, but this commit was given attempt app.8; a load commits one set of winners"),
        ),
        (
            "a partition left out",
            from(&[m0(), m1()]),
            Err("load L partition 2: the recorded plan's winner is attempt app.9, but this commit was given no winner"),
        ),
        (
            "a partition added",
            from(&[m0(), m1(), m2(), manifest("L", 3, "app.4", &[])]),
            Err("load L partition 3: the recorded plan has no winner, but this commit was given attempt app.4"),
        ),
        (
            "the first differing partition is named",
            from(&[manifest("L", 0, "app.5", &[]), manifest("L", 1, "app.6", &[])]),
            Err("load L partition 0:"),
        ),
        (
            "a manifest edited since",
            {
                let mut m = m0();
                m.parts[1].rows = 49;
                m.parts[1].files[1] = count_txt_entry(49);
                m.parts[1].files[2].size = 49;
                m.parts[1].bytes_on_disk = 61;
                from(&[m, m1(), m2()])
            },
            Err("load L partition 0 attempt app.1: part 202602_"),
        ),
        (
            "a manifest edited since: both versions named",
            {
                let mut m = m0();
                m.parts[1].hash_of_all_files = "f".repeat(32);
                from(&[m, m1(), m2()])
            },
            Err("was recorded with 50 rows, 62 bytes, hash "),
        ),
        (
            "a file's digest edited since, parts unchanged",
            {
                let mut m = m0();
                m.parts[1].files[0].sha256 = "0".repeat(64);
                from(&[m, m1(), m2()])
            },
            Err("load L partition 0: the manifest of attempt app.1 differs from the one recorded in the plan"),
        ),
        (
            "a part dropped from a manifest",
            {
                let mut m = m0();
                m.parts.pop();
                from(&[m, m1(), m2()])
            },
            Err("is in the recorded plan but not in this commit's manifests"),
        ),
        (
            "a part added to a manifest",
            {
                let mut m = m0();
                let more = manifest("L", 0, "app.1", &[("202603", 2, 5)]);
                m.parts.push(more.parts[0].clone());
                from(&[m, m1(), m2()])
            },
            Err("load L partition 0 attempt app.1: part 202603_"),
        ),
        (
            "another mode",
            CommitPlan { mode: Mode::Replace, ..recorded.clone() },
            Err("load L: the recorded plan has mode append, this commit asks for replace"),
        ),
        (
            "another visibility",
            CommitPlan { visibility: Visibility::Part, ..recorded.clone() },
            Err("the recorded plan has visibility partition, this commit asks for part"),
        ),
        (
            "another load",
            CommitPlan { load: "M".parse().unwrap(), ..recorded.clone() },
            Err("the recorded plan is of load L, this commit's is of load M"),
        ),
    ];
    for (row, new, want) in rows {
        let got = plan_matches(&recorded, &new);
        // Plans match exactly when their fingerprints do.
        assert_eq!(
            got.is_ok(),
            recorded.fingerprint() == new.fingerprint(),
            "{row}"
        );
        expect_row(row, got, want);
    }
}

#[test]
fn decide_exchange_table() {
    use ExchangeStep::{Broken, Claim, Exchange, RecordExchanged, Skip};
    use TableAt::{Mine, Missing, Other, Target};
    let f = |recorded_exchanged, new, old| ExchangeFacts {
        recorded_exchanged,
        new,
        old,
    };
    let rows = [
        (
            "not claimed yet: the shadow under its own name",
            f(false, Other, Target),
            Claim,
        ),
        ("claimed by this commit", f(false, Mine, Target), Exchange),
        (
            "claimed by another commit (racing, or dead after its RENAME): take it",
            f(false, Other, Target),
            Claim,
        ),
        (
            "swapped by this commit, not recorded",
            f(false, Target, Mine),
            RecordExchanged,
        ),
        (
            "swapped by another commit (the old rows under its claim name)",
            f(false, Target, Other),
            RecordExchanged,
        ),
        (
            "swapped, and this commit then renamed the old table to its claim name",
            f(false, Target, Mine),
            RecordExchanged,
        ),
        (
            "swapped, old table dropped by hand since",
            f(false, Target, Missing),
            RecordExchanged,
        ),
        ("recorded", f(true, Target, Other), Skip),
        (
            "recorded, tables moved since: not this load's",
            f(true, Other, Other),
            Skip,
        ),
        ("the shadow dropped", f(false, Missing, Target), Broken),
        (
            "the target dropped or renamed by someone else",
            f(false, Other, Missing),
            Broken,
        ),
        (
            "the target renamed by someone else, shadow claimed",
            f(false, Mine, Other),
            Broken,
        ),
        (
            "both under the target's name: impossible",
            f(false, Target, Target),
            Broken,
        ),
    ];
    for (row, facts, want) in rows {
        assert_eq!(decide_exchange(&facts), want, "{row}");
    }
    // Every combination: an EXCHANGE is sent only for this commit's claim against the old
    // table, so it never swaps back what another commit swapped.
    let all = [Target, Mine, Other, Missing];
    for new in all {
        for old in all {
            for recorded in [false, true] {
                let step = decide_exchange(&f(recorded, new, old));
                if step == Exchange {
                    assert_eq!((recorded, new, old), (false, Mine, Target));
                }
                if step == RecordExchanged {
                    assert_eq!(new, Target);
                }
            }
        }
    }
}

/// Overwrite: racing, dying and resumed commits never swap the old table back, and a commit
/// run alone afterwards always finishes. A model of names over the two tables (`N`, the new
/// one, and `O`, the old one, found by UUID): RENAME and EXCHANGE act on whatever is under a
/// name now and fail when a name is missing (or taken), and a commit acts on its last
/// observation, however stale, one step after making it. Every interleaving of three commits,
/// each of which may die at any point, is explored.
#[test]
fn exchange_races_never_swap_back() {
    use std::collections::HashSet;
    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    enum C {
        /// Observes next.
        Idle,
        /// Acts next on this decision (and where it saw the new table).
        Decided(ExchangeStep, String),
        Done,
        Dead,
    }
    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    struct W {
        names: BTreeMap<String, char>,
        recorded: bool,
        commits: Vec<C>,
    }
    fn claim(c: usize) -> String {
        format!("claim-{c}")
    }
    fn at(w: &W, table: char, c: usize) -> TableAt {
        match w
            .names
            .iter()
            .find(|(_, t)| **t == table)
            .map(|(n, _)| n.as_str())
        {
            Some("target") => TableAt::Target,
            Some(n) if n == claim(c) => TableAt::Mine,
            Some(_) => TableAt::Other,
            None => TableAt::Missing,
        }
    }
    fn name_of(w: &W, table: char) -> String {
        w.names
            .iter()
            .find(|(_, t)| **t == table)
            .unwrap()
            .0
            .clone()
    }
    /// The world after commit `c` takes its next step.
    fn step(w: &W, c: usize) -> W {
        let mut w = w.clone();
        match w.commits[c].clone() {
            C::Idle => {
                let facts = ExchangeFacts {
                    recorded_exchanged: w.recorded,
                    new: at(&w, 'N', c),
                    old: at(&w, 'O', c),
                };
                let decided = decide_exchange(&facts);
                assert_ne!(decided, ExchangeStep::Broken, "{facts:?} in {w:?}");
                w.commits[c] = C::Decided(decided, name_of(&w, 'N'));
            }
            C::Decided(decided, seen) => {
                w.commits[c] = C::Idle;
                match decided {
                    ExchangeStep::Skip => w.commits[c] = C::Done,
                    ExchangeStep::RecordExchanged => w.recorded = true,
                    ExchangeStep::Claim => {
                        if !w.names.contains_key(&claim(c)) {
                            if let Some(t) = w.names.remove(&seen) {
                                w.names.insert(claim(c), t);
                            }
                        }
                    }
                    ExchangeStep::Exchange => {
                        if let (Some(a), Some(b)) = (
                            w.names.get("target").copied(),
                            w.names.get(&claim(c)).copied(),
                        ) {
                            w.names.insert("target".into(), b);
                            w.names.insert(claim(c), a);
                        }
                    }
                    ExchangeStep::Broken => unreachable!(),
                }
            }
            C::Done | C::Dead => unreachable!(),
        }
        w
    }
    let start = W {
        names: [("shadow".to_owned(), 'N'), ("target".to_owned(), 'O')].into(),
        recorded: false,
        commits: vec![C::Idle; 3],
    };
    let mut seen = HashSet::new();
    let mut todo = vec![start];
    let mut finished = 0;
    while let Some(w) = todo.pop() {
        if !seen.insert(w.clone()) {
            continue;
        }
        let swapped = w.names.get("target") == Some(&'N');
        let mut next = Vec::new();
        for c in 0..w.commits.len() {
            if matches!(w.commits[c], C::Done | C::Dead) {
                continue;
            }
            next.push(step(&w, c));
            let mut dead = w.clone();
            dead.commits[c] = C::Dead;
            next.push(dead);
        }
        for n in &next {
            if swapped {
                assert_eq!(
                    n.names.get("target"),
                    Some(&'N'),
                    "swapped back: {w:?} -> {n:?}"
                );
            }
            assert!(
                !n.recorded || n.names.get("target") == Some(&'N'),
                "recorded unswapped: {n:?}"
            );
        }
        if next.is_empty() {
            // Every commit is done or dead: one more, alone, finishes within a few steps.
            finished += 1;
            let mut lone = w.clone();
            lone.commits.push(C::Idle);
            let c = lone.commits.len() - 1;
            for _ in 0..12 {
                if lone.commits[c] == C::Done {
                    break;
                }
                lone = step(&lone, c);
            }
            assert_eq!(
                lone.commits[c],
                C::Done,
                "a lone commit did not finish from {w:?}"
            );
            assert!(
                lone.recorded && lone.names.get("target") == Some(&'N'),
                "{lone:?}"
            );
        }
        todo.extend(next);
    }
    assert!(
        seen.len() > 1_000 && finished > 20,
        "{} states, {finished} ends",
        seen.len()
    );
}

#[test]
fn an_overwrite_commit_swaps_once_every_part_is_attached() {
    let p = plan(Visibility::Partition, Mode::Overwrite);
    let mut progress = CommitProgress::default();
    assert!(matches!(
        commit_phase(Some(&p), &progress),
        CommitPhase::AttachParts { .. }
    ));
    for part in &p.parts {
        progress.record(CommitEntry::Attached(part.name.clone()));
    }
    assert_eq!(
        commit_phase(Some(&p), &progress),
        CommitPhase::ExchangeTable
    );
    progress.record(CommitEntry::parse("exchanged").unwrap().unwrap());
    assert_eq!(
        commit_phase(Some(&p), &progress),
        CommitPhase::MarkCommitted
    );
    assert_eq!(CommitEntry::Exchanged.id(), "exchanged");
    // A load with no rows at all still swaps: the new table is empty.
    let empty = CommitPlan::from_winners(
        &winners(&[manifest("L", 0, "app.1", &[])]),
        Visibility::Partition,
        Mode::Overwrite,
    );
    assert_eq!(
        commit_phase(Some(&empty), &CommitProgress::default()),
        CommitPhase::ExchangeTable
    );
}

#[test]
fn emptied_partitions_table() {
    let ids = |list: &[&str]| -> BTreeSet<PartitionId> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    };
    // The load replaces 202601..202604 across its shards; this shard's winners put rows in
    // 202601 and 202602 only.
    let replace = plan(Visibility::Partition, Mode::Replace);
    let shard = replace
        .clone()
        .emptying(&ids(&["202601", "202602", "202603", "202604"]));
    let emptied: Vec<String> = shard.emptied.iter().map(ToString::to_string).collect();
    assert_eq!(emptied, ["202603", "202604"]);
    let publish: Vec<(String, u64)> = shard
        .to_publish()
        .iter()
        .map(|p| (p.partition_id.to_string(), p.rows))
        .collect();
    assert_eq!(
        publish,
        [
            ("202601".to_owned(), 130),
            ("202602".to_owned(), 50),
            ("202603".to_owned(), 0),
            ("202604".to_owned(), 0)
        ]
    );
    // A plan that empties nothing reads and fingerprints as before.
    assert!(!replace.to_json().contains("emptied"));
    assert_eq!(
        replace.clone().emptying(&ids(&["202601"])).fingerprint(),
        replace.fingerprint()
    );
    // Recorded: it reads back; edits that do not add up are refused.
    assert_eq!(CommitPlan::from_json(&shard.to_json()).unwrap(), shard);
    let rows: Vec<(&str, fn(&mut Value), Result<(), &str>)> = vec![
        ("as recorded", |_| {}, Ok(())),
        (
            "in append mode",
            |v| v["mode"] = "append".into(),
            Err("it empties partitions, which only replace mode with partition visibility does"),
        ),
        (
            "with part visibility",
            |v| v["visibility"] = "part".into(),
            Err("it empties partitions, which only replace mode"),
        ),
        (
            "out of order",
            |v| v["emptied"].as_array_mut().unwrap().swap(0, 1),
            Err("the partitions it empties are not sorted"),
        ),
        (
            "a partition with rows emptied too",
            |v| v["emptied"][0] = "202601".into(),
            Err("partition 202601 is both planned with rows and emptied"),
        ),
    ];
    for (row, edit, want) in rows {
        let mut v: Value = serde_json::from_str(&shard.to_json()).unwrap();
        edit(&mut v);
        expect_row(row, CommitPlan::from_json(&v.to_string()), want);
    }
    // A re-run computing other partitions to empty conflicts with the recorded plan.
    let other = replace.clone().emptying(&ids(&["202603"]));
    expect_row(
        "other partitions emptied",
        plan_matches(&shard, &other),
        Err("load L: the recorded plan empties partition(s) [202603, 202604], this commit would empty [202603]"),
    );
    assert_ne!(shard.fingerprint(), other.fingerprint());
    // The publish phase waits for the emptied partitions too.
    let mut progress = CommitProgress::default();
    for p in &shard.parts {
        progress.record(CommitEntry::Attached(p.name.clone()));
    }
    for id in ["202601", "202602", "202603"] {
        progress.record(CommitEntry::Published(id.parse().unwrap()));
    }
    assert_eq!(
        commit_phase(Some(&shard), &progress),
        CommitPhase::PublishPartitions {
            pending: vec!["202604".parse().unwrap()]
        }
    );
    progress.record(CommitEntry::Published("202604".parse().unwrap()));
    assert_eq!(
        commit_phase(Some(&shard), &progress),
        CommitPhase::MarkCommitted
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Ledger entries and decisions
// ---------------------------------------------------------------------------------------------

#[test]
fn entry_id_table() {
    let part = plan(Visibility::Part, Mode::Append).parts[0].name.clone();
    let pid: PartitionId = "202601".parse().unwrap();
    type Row<'a> = (&'a str, String, Result<Option<CommitEntry>, &'a str>);
    let rows: Vec<Row> = vec![
        ("plan", "plan".into(), Ok(Some(CommitEntry::Plan))),
        ("commit", "commit".into(), Ok(Some(CommitEntry::Commit))),
        ("attach intent", format!("attach:{part}"), Ok(Some(CommitEntry::AttachIntent(part.clone())))),
        ("attached", format!("attached:{part}"), Ok(Some(CommitEntry::Attached(part.clone())))),
        ("publish intent", "publish:202601".into(), Ok(Some(CommitEntry::PublishIntent(pid.clone())))),
        ("published", "published:202601".into(), Ok(Some(CommitEntry::Published(pid.clone())))),
        ("begin's entry", "open".into(), Ok(None)),
        ("similar word", "commits".into(), Ok(None)),
        ("no colon", "attached".into(), Ok(None)),
        (
            "bad part name",
            "attach:202601_1_1".into(),
            Err("ledger entry id \"attach:202601_1_1\" has a commit prefix but no part name: part name"),
        ),
        ("attaching prefix", "attached:attaching_all_1_1_0".into(), Err("detach reason \"attaching\"")),
        ("bad partition id", "published:2026_01".into(), Err("no partition id: partition id \"2026_01\"")),
        ("empty partition id", "publish:".into(), Err("partition id is empty")),
    ];
    for (row, id, want) in rows {
        let got = CommitEntry::parse(&id);
        match want {
            Ok(want) => {
                let entry = got.unwrap_or_else(|e| panic!("{row}: {e}"));
                assert_eq!(entry, want, "{row}");
                if let Some(entry) = entry {
                    assert_eq!(entry.id(), id, "{row}: round trip");
                }
            }
            Err(want) => _ = expect_row(row, got, Err(want)),
        }
    }
}

#[test]
fn progress_from_entry_ids() {
    let p = plan(Visibility::Partition, Mode::Append);
    let (a, b) = (&p.parts[0].name, &p.parts[1].name);
    let ids = [
        "open".to_string(),
        "plan".into(),
        format!("attach:{a}"),
        format!("attached:{a}"),
        format!("attach:{b}"),
        format!("attached:{a}"),
        "publish:202601".into(),
    ];
    let progress = CommitProgress::from_entry_ids(ids.iter().map(String::as_str)).unwrap();
    assert_eq!(progress.attach_intents, [a.clone(), b.clone()].into());
    assert_eq!(progress.attached, [a.clone()].into());
    assert_eq!(progress.publish_intents, ["202601".parse().unwrap()].into());
    assert!(progress.published.is_empty() && !progress.committed);
    let err = CommitProgress::from_entry_ids(["plan", "attached:x"]).unwrap_err();
    assert!(err.to_string().contains("\"attached:x\""), "{err}");
}

#[test]
fn decide_part_table() {
    use PartStep::*;
    // A leftover's two extra facts: (claim predates the server's start, an ATTACH is running).
    const NO_LEFTOVER: (bool, bool) = (false, false);
    const LIVE: (bool, bool) = (false, true);
    const CRASHED: (bool, bool) = (true, false);
    let f = |recorded_attached,
             attach_intent,
             in_detached,
             attaching_leftover,
             fresh,
             (claim_predates_server_start, attach_running): (bool, bool)| PartFacts {
        recorded_attached,
        attach_intent,
        in_detached,
        attaching_leftover,
        ledger_read_after_observation: fresh,
        claim_predates_server_start,
        attach_running,
    };
    // (situation, facts: recorded, intent, in detached, attaching_ leftover, ledger read after
    // the observation, (leftover older than the server, ATTACH running))
    let rows = [
        (
            "not started",
            f(false, false, true, false, false, NO_LEFTOVER),
            Attach,
        ),
        (
            "intent written, ATTACH not sent",
            f(false, true, true, false, false, NO_LEFTOVER),
            Attach,
        ),
        (
            "ATTACH failed before claiming it",
            f(false, true, true, false, true, NO_LEFTOVER),
            Attach,
        ),
        (
            "ATTACH in flight",
            f(false, true, false, true, false, LIVE),
            Wait,
        ),
        (
            "ATTACH in flight, claimed an instant ago (the rename kept the old mtime)",
            f(false, true, false, true, false, (true, true)),
            Wait,
        ),
        (
            "a leftover made after the server started, no ATTACH running: not a restart's",
            f(false, true, false, true, false, (false, false)),
            Wait,
        ),
        (
            "server killed inside ATTACH and restarted: take the claim back",
            f(false, true, false, true, false, CRASHED),
            Reclaim,
        ),
        (
            "server killed inside ATTACH, ledger read after the observation",
            f(false, true, false, true, true, CRASHED),
            Reclaim,
        ),
        (
            "a crashed claim chpart never intended (someone's ATTACH PARTITION): not ours",
            f(false, false, false, true, true, CRASHED),
            Wait,
        ),
        (
            "a crashed claim and a copy re-published in detached/",
            f(false, true, true, true, false, CRASHED),
            Wait,
        ),
        (
            "attached (then perhaps merged or moved), not recorded",
            f(false, true, false, false, false, NO_LEFTOVER),
            RecordAttached,
        ),
        (
            "recorded",
            f(true, true, false, false, false, NO_LEFTOVER),
            Skip,
        ),
        (
            "recorded, then moved away",
            f(true, true, false, false, true, NO_LEFTOVER),
            Skip,
        ),
        (
            "gone, ledger read before the observation: a concurrent commit may have attached it",
            f(false, false, false, false, false, NO_LEFTOVER),
            ReadLedger,
        ),
        (
            "a concurrent commit attached, moved and merged it after our ledger read",
            f(false, false, false, false, false, NO_LEFTOVER),
            ReadLedger,
        ),
        (
            "gone, and a ledger read after the observation has no intent: removed by someone",
            f(false, false, false, false, true, NO_LEFTOVER),
            Lost,
        ),
        (
            "a copy re-published while another ATTACH holds one",
            f(false, true, true, true, false, LIVE),
            Wait,
        ),
    ];
    for (row, facts, want) in rows {
        assert_eq!(decide_part(&facts), want, "{row}");
    }
    // Every combination: ATTACH is sent only for a part sitting in detached/ that no ATTACH
    // holds and that is not recorded; a part is recorded attached only once it left detached/
    // without a leftover and with an intent; it is lost only by a ledger read made after the
    // observation; a leftover is taken back only when it is this load's claim, older than the
    // server and no ATTACH runs.
    for bits in 0..128u8 {
        let bit = |i: u8| bits & (1 << i) != 0;
        let facts = f(bit(0), bit(1), bit(2), bit(3), bit(4), (bit(5), bit(6)));
        let step = decide_part(&facts);
        assert_eq!(step == Skip, facts.recorded_attached, "{facts:?}");
        if step == Attach {
            assert!(
                facts.in_detached && !facts.attaching_leftover && !facts.recorded_attached,
                "{facts:?}"
            );
        }
        if step == RecordAttached {
            assert!(!facts.in_detached && !facts.attaching_leftover, "{facts:?}");
            assert!(facts.attach_intent, "{facts:?}");
        }
        if step == Wait || step == Reclaim {
            assert!(
                facts.attaching_leftover && !facts.recorded_attached,
                "{facts:?}"
            );
        }
        assert_eq!(
            step == Reclaim,
            facts.attaching_leftover
                && !facts.recorded_attached
                && facts.attach_intent
                && !facts.in_detached
                && facts.claim_predates_server_start
                && !facts.attach_running,
            "{facts:?}"
        );
        if step == Lost || step == ReadLedger {
            assert!(
                !facts.in_detached && !facts.attaching_leftover && !facts.attach_intent,
                "{facts:?}"
            );
            assert_eq!(
                step == Lost,
                facts.ledger_read_after_observation,
                "{facts:?}"
            );
        }
    }
}

#[test]
fn error_types_stay_small() {
    // Callers return these in `Result`s; clippy's large-error lint fires above 128 bytes.
    let sizes = [
        ("WinnersError", std::mem::size_of::<WinnersError>()),
        ("PlanError", std::mem::size_of::<PlanError>()),
        ("PlanConflict", std::mem::size_of::<PlanConflict>()),
        ("EntryIdError", std::mem::size_of::<EntryIdError>()),
        ("PartLost", std::mem::size_of::<PartLost>()),
        ("PartitionBroken", std::mem::size_of::<PartitionBroken>()),
        ("RowMismatch", std::mem::size_of::<RowMismatch>()),
    ];
    for (name, size) in sizes {
        assert!(size <= 128, "{name} is {size} bytes");
    }
}

#[test]
fn part_lost_message() {
    let p = plan(Visibility::Part, Mode::Append);
    let msg = PartLost::new(&p, &p.parts[1]).to_string();
    let want = format!(
        "load L partition 1 attempt app.7: part {} (hash {}) is lost: it is not in detached/",
        p.parts[1].name, p.parts[1].hash_of_all_files
    );
    assert!(msg.starts_with(&want), "{msg}");
    assert!(msg.contains("records no attach of it"), "{msg}");
}

#[test]
fn decide_partition_table() {
    use Mode::{Append, Replace as ReplaceMode};
    use PartitionStep::{Broken, Foreign, Move, RecordPublished, Replace, Skip};
    let f = |recorded_published, shadow_rows, target_has_plan_hashes| PartitionFacts {
        recorded_published,
        shadow_rows,
        planned_rows: 100,
        target_has_plan_hashes,
        ..PartitionFacts::default()
    };
    // Replace mode after the intent: (target holds a part neither old nor the shadow's, all such
    // parts are merges of exactly the planned rows).
    let after_intent =
        |facts: PartitionFacts, (target_foreign, target_merged_plan)| PartitionFacts {
            publish_intent: true,
            target_foreign,
            target_merged_plan,
            ..facts
        };
    const EXPLAINED: (bool, bool) = (false, false);
    const ARRIVED: (bool, bool) = (true, false);
    const MERGED: (bool, bool) = (true, true);
    // (situation, mode, facts: recorded, shadow rows of 100 planned, target hashes = shadow's)
    let rows = [
        ("append: not moved yet", Append, f(false, 100, false), Move),
        (
            "append: intent written, MOVE not sent",
            Append,
            f(false, 100, false),
            Move,
        ),
        (
            "append: moved, not recorded",
            Append,
            f(false, 0, false),
            RecordPublished,
        ),
        (
            "append: a second MOVE moved nothing",
            Append,
            f(false, 0, false),
            RecordPublished,
        ),
        ("append: recorded", Append, f(true, 0, false), Skip),
        (
            "append: part of it gone",
            Append,
            f(false, 40, false),
            Broken,
        ),
        (
            "append: more than planned",
            Append,
            f(false, 101, false),
            Broken,
        ),
        (
            "replace: not replaced yet",
            ReplaceMode,
            f(false, 100, false),
            Replace,
        ),
        (
            "replace: replaced, not recorded",
            ReplaceMode,
            f(false, 100, true),
            RecordPublished,
        ),
        (
            "replace: crashed inside REPLACE (old and new parts)",
            ReplaceMode,
            f(false, 100, false),
            Replace,
        ),
        (
            "replace: REPLACE sent, the target merged its copies since",
            ReplaceMode,
            after_intent(f(false, 100, false), MERGED),
            RecordPublished,
        ),
        (
            "replace: crashed inside REPLACE, old and new parts both active",
            ReplaceMode,
            after_intent(f(false, 100, false), EXPLAINED),
            Replace,
        ),
        (
            "replace: intent written, REPLACE not sent: the old parts are still there",
            ReplaceMode,
            after_intent(f(false, 100, false), EXPLAINED),
            Replace,
        ),
        (
            "replace: replaced, then another process inserted into the partition",
            ReplaceMode,
            after_intent(f(false, 100, false), ARRIVED),
            Foreign,
        ),
        (
            "replace: replaced, rows inserted since and merged with the copies",
            ReplaceMode,
            after_intent(f(false, 100, false), ARRIVED),
            Foreign,
        ),
        (
            "replace: intent written, rows arrived before the REPLACE was sent (cannot tell)",
            ReplaceMode,
            after_intent(f(false, 100, false), ARRIVED),
            Foreign,
        ),
        (
            "replace: rows inserted before this load's first intent: REPLACE owns the partition",
            ReplaceMode,
            PartitionFacts {
                target_foreign: true,
                ..f(false, 100, false)
            },
            Replace,
        ),
        (
            "replace: replaced and recorded, rows inserted since: not this load's any more",
            ReplaceMode,
            after_intent(f(true, 100, false), ARRIVED),
            Skip,
        ),
        ("replace: recorded", ReplaceMode, f(true, 100, true), Skip),
        (
            "replace: shadow emptied (would wipe the partition)",
            ReplaceMode,
            f(false, 0, false),
            Broken,
        ),
        (
            "replace: shadow partly gone",
            ReplaceMode,
            f(false, 60, true),
            Broken,
        ),
        (
            "replace: more than planned",
            ReplaceMode,
            f(false, 130, false),
            Broken,
        ),
    ];
    for (row, mode, facts, want) in rows {
        assert_eq!(decide_partition(mode, &facts), want, "{row}");
    }
    // A partition the plan empties (a shard of a Distributed replace load whose winners put
    // no rows in it): planned 0 rows, so the shadow holds none, and it is published when the
    // target partition holds no active part ("target hashes = shadow's").
    let e = |recorded_published, shadow_rows, target_empty| PartitionFacts {
        planned_rows: 0,
        ..f(recorded_published, shadow_rows, target_empty)
    };
    let emptied = [
        (
            "emptied: old rows on this shard",
            e(false, 0, false),
            Replace,
        ),
        (
            "emptied: REPLACE from nothing went through, not recorded",
            e(false, 0, true),
            RecordPublished,
        ),
        (
            "emptied: nothing there before the intent: nothing to replace",
            e(false, 0, true),
            RecordPublished,
        ),
        (
            "emptied: intent written, REPLACE not sent: the old parts are still there",
            after_intent(e(false, 0, false), EXPLAINED),
            Replace,
        ),
        (
            "emptied: emptied, then another process inserted into the partition",
            after_intent(e(false, 0, false), ARRIVED),
            Foreign,
        ),
        ("emptied: recorded", e(true, 0, true), Skip),
        (
            "emptied: recorded, rows inserted since",
            after_intent(e(true, 0, false), ARRIVED),
            Skip,
        ),
        (
            "emptied: the shadow holds rows of it (not this load's)",
            e(false, 7, false),
            Broken,
        ),
    ];
    for (row, facts, want) in emptied {
        assert_eq!(decide_partition(ReplaceMode, &facts), want, "{row}");
    }
    // Every combination: a REPLACE after the intent never meets an unexplained part.
    for bits in 0..32u8 {
        let bit = |i: u8| bits & (1 << i) != 0;
        let facts = PartitionFacts {
            recorded_published: bit(0),
            shadow_rows: 100,
            planned_rows: 100,
            target_has_plan_hashes: bit(1),
            publish_intent: bit(2),
            target_foreign: bit(3),
            target_merged_plan: bit(4),
        };
        if decide_partition(ReplaceMode, &facts) == Replace {
            assert!(!(facts.publish_intent && facts.target_foreign), "{facts:?}");
        }
    }
}

#[test]
fn replace_overlap_table() {
    let ids =
        |s: &[&str]| -> BTreeSet<PartitionId> { s.iter().map(|p| p.parse().unwrap()).collect() };
    let other = |load: &str, planned: Option<&[&str]>| OpenReplaceLoad {
        load: load.parse().unwrap(),
        planned: planned.map(ids),
        whole_table: false,
    };
    let overwrite = |load: &str, planned: Option<&[&str]>| OpenReplaceLoad {
        whole_table: true,
        ..other(load, planned)
    };
    let mine = ids(&["202601", "202602"]);
    // (situation, other open replace loads of the table, the conflict)
    type Row<'a> = (
        &'a str,
        Vec<OpenReplaceLoad>,
        Option<(&'a str, Vec<&'a str>)>,
    );
    let rows: Vec<Row> = vec![
        ("no other load", vec![], None),
        ("another load not planned yet", vec![other("b", None)], None),
        (
            "another load replaces other partitions",
            vec![other("b", Some(&["202603"]))],
            None,
        ),
        (
            "another load replaces one of them",
            vec![other("b", Some(&["202602", "202603"]))],
            Some(("b", vec!["202602"])),
        ),
        (
            "the first overlapping load is named",
            vec![
                other("b", Some(&["202604"])),
                other("c", Some(&["202601", "202602"])),
                other("d", Some(&["202601"])),
            ],
            Some(("c", vec!["202601", "202602"])),
        ),
    ];
    for (row, others, want) in rows {
        let want = want.map(|(l, p)| (l.parse().unwrap(), ids(&p).into_iter().collect()));
        assert_eq!(replace_overlap(&mine, false, &others), want, "{row}");
    }
    // An overwrite replaces every partition: it overlaps any planned load, and any planned
    // load overlaps it (no partitions named: all of them).
    let whole: Vec<Row> = vec![
        (
            "an overwrite not planned yet",
            vec![overwrite("b", None)],
            None,
        ),
        (
            "a planned overwrite with other partitions",
            vec![overwrite("b", Some(&["202609"]))],
            Some(("b", vec![])),
        ),
        (
            "a planned overwrite of no rows at all",
            vec![overwrite("b", Some(&[]))],
            Some(("b", vec![])),
        ),
    ];
    for (row, others, want) in whole {
        let want = want.map(|(l, p)| (l.parse().unwrap(), ids(&p).into_iter().collect()));
        assert_eq!(replace_overlap(&mine, false, &others), want, "{row}");
    }
    let planned_replace = [other("b", Some(&["202612"]))];
    assert_eq!(
        replace_overlap(&mine, true, &planned_replace),
        Some(("b".parse().unwrap(), vec![])),
        "this overwrite against a planned replace of other partitions"
    );
    assert_eq!(
        replace_overlap(&mine, true, &[other("b", None)]),
        None,
        "this overwrite against a replace not planned yet"
    );
}

#[test]
#[should_panic(expected = "an appended partition always has rows")]
fn decide_partition_refuses_an_appended_partition_without_rows() {
    decide_partition(Mode::Append, &PartitionFacts::default());
}

#[test]
fn partition_broken_message() {
    let p = plan(Visibility::Partition, Mode::Append);
    let id: PartitionId = "202601".parse().unwrap();
    let facts = PartitionFacts {
        shadow_rows: 30,
        planned_rows: 130,
        ..PartitionFacts::default()
    };
    let msg = PartitionBroken::new(&p, &id, &facts).to_string();
    assert!(
        msg.starts_with("load L partition 202601 (append mode): the shadow table holds 30 rows of it, but the plan put 130 there and a MOVE leaves all or none"),
        "{msg}"
    );
}

#[test]
fn reconcile_hashes_table() {
    let p = plan(Visibility::Partition, Mode::Append);
    let planned = |id: &str| -> Vec<String> {
        let mut h: Vec<String> = p
            .parts
            .iter()
            .filter(|x| x.partition_id.as_str() == id)
            .map(|x| x.hash_of_all_files.clone())
            .collect();
        h.sort();
        h
    };
    let first_of_202601 = p
        .parts
        .iter()
        .find(|x| x.partition_id.as_str() == "202601")
        .unwrap();
    type Row = (
        &'static str,
        Vec<(&'static str, Vec<String>)>,
        Result<(), String>,
    );
    let rows: Vec<Row> = vec![
        (
            "exactly the planned parts",
            vec![("202601", planned("202601")), ("202602", planned("202602"))],
            Ok(()),
        ),
        (
            "a part's checksums.txt changed",
            vec![
                ("202601", {
                    let mut h = planned("202601");
                    h.retain(|x| x != &first_of_202601.hash_of_all_files);
                    h.push("f".repeat(32));
                    h
                }),
                ("202602", planned("202602")),
            ],
            Err(format!(
                "partition 202601: no attached part has the hash {} of part {}",
                first_of_202601.hash_of_all_files, first_of_202601.name
            )),
        ),
        (
            "a part the plan does not have",
            vec![
                ("202601", {
                    let mut h = planned("202601");
                    h.push("e".repeat(32));
                    h
                }),
                ("202602", planned("202602")),
            ],
            Err(format!(
                "partition 202601: an attached part has hash {}, which no planned part has",
                "e".repeat(32)
            )),
        ),
        (
            "a partition with nothing attached",
            vec![("202601", planned("202601"))],
            Err("partition 202602: no attached part has the hash".into()),
        ),
    ];
    for (row, attached, want) in rows {
        let attached: BTreeMap<PartitionId, Vec<String>> = attached
            .into_iter()
            .map(|(id, h)| (id.parse().unwrap(), h))
            .collect();
        let got = reconcile_hashes(&p, &attached).map_err(|e| e.to_string());
        match (&got, &want) {
            (Ok(()), Ok(())) => {}
            (Err(g), Err(w)) => assert!(g.starts_with(w.as_str()), "{row}: {g}"),
            _ => panic!("{row}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn reconcile_rows_table() {
    let p = plan(Visibility::Partition, Mode::Append);
    type Row<'a> = (&'a str, Vec<(&'a str, u64)>, Result<(), &'a str>);
    let rows: Vec<Row> = vec![
        ("exact", vec![("202601", 130), ("202602", 50)], Ok(())),
        (
            "a part's rows missing",
            vec![("202601", 100), ("202602", 50)],
            Err("load L: rows attached differ from the plan in 1 partition\n  - partition 202601: the winners' parts hold 130 rows, 100 are attached"),
        ),
        (
            "a partition not attached at all",
            vec![("202601", 130)],
            Err("partition 202602: the winners' parts hold 50 rows, 0 are attached"),
        ),
        (
            "rows in an unplanned partition",
            vec![("202601", 130), ("202602", 50), ("202603", 7)],
            Err("partition 202603: the winners' parts hold 0 rows, 7 are attached"),
        ),
        (
            "every difference listed",
            vec![("202601", 131), ("202602", 49)],
            Err("in 2 partitions\n  - partition 202601: the winners' parts hold 130 rows, 131 are attached\n  - partition 202602: the winners' parts hold 50 rows, 49"),
        ),
    ];
    for (row, attached, want) in rows {
        let attached: BTreeMap<PartitionId, u64> = attached
            .into_iter()
            .map(|(id, n)| (id.parse().unwrap(), n))
            .collect();
        expect_row(row, reconcile_rows(&p, &attached), want);
    }
    let empty = CommitPlan::from_winners(
        &winners(&[manifest("L", 0, "app.9", &[])]),
        Visibility::Part,
        Mode::Append,
    );
    assert!(reconcile_rows(&empty, &BTreeMap::new()).is_ok());
}

#[test]
fn phase_of_a_plan_without_parts() {
    let empty = CommitPlan::from_winners(
        &winners(&[manifest("L", 0, "app.9", &[])]),
        Visibility::Partition,
        Mode::Append,
    );
    let progress = CommitProgress::default();
    assert_eq!(
        commit_phase(Some(&empty), &progress),
        CommitPhase::MarkCommitted
    );
    assert_eq!(commit_phase(None, &progress), CommitPhase::NeedsPlan);
}

#[test]
fn phase_ignores_entries_outside_the_plan() {
    let p = plan(Visibility::Part, Mode::Append);
    let stray = detached_part_name(
        &load(),
        &"app.2".parse().unwrap(),
        &"202601".parse().unwrap(),
        0,
    );
    let mut progress = CommitProgress::default();
    progress.record(CommitEntry::Attached(stray));
    assert_eq!(
        commit_phase(Some(&p), &progress),
        CommitPhase::AttachParts {
            pending: p.parts.iter().map(|x| x.name.clone()).collect()
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Crash points and races, run against the model in `sim`
// ---------------------------------------------------------------------------------------------

/// Kills a commit right after each step it takes, resumes it, and checks where the resumed
/// commit says it is, what it does first, and that it ends committed exactly once.
#[test]
fn crash_point_table() {
    use sim::Merge::{self, *};
    use Mode::{Append, Replace};
    use Visibility::{Part, Partition};
    // (crash point, visibility, mode, killed right after this step (None: before the first),
    //  merges between the crash and the resume, expected phase on resume, first step on resume)
    type Row<'a> = (
        &'a str,
        Visibility,
        Mode,
        Option<&'a str>,
        Merge,
        &'a str,
        &'a str,
    );
    let rows: Vec<Row> = vec![
        (
            "killed before the plan entry",
            Partition,
            Append,
            None,
            Unmerged,
            "NeedsPlan",
            "plan",
        ),
        (
            "after the plan entry",
            Partition,
            Append,
            Some("plan"),
            Unmerged,
            "AttachParts(3)",
            "intent part 0",
        ),
        (
            "after an attach: intent, before the ATTACH",
            Partition,
            Append,
            Some("intent part 0"),
            Unmerged,
            "AttachParts(3)",
            "ATTACH part 0",
        ),
        (
            "after the ATTACH, before attached:",
            Partition,
            Append,
            Some("ATTACH part 0"),
            Unmerged,
            "AttachParts(3)",
            "attached part 0",
        ),
        (
            "after the ATTACH, before attached:, part merged since",
            Partition,
            Append,
            Some("ATTACH part 0"),
            AttachTable,
            "AttachParts(3)",
            "attached part 0",
        ),
        (
            "between parts",
            Partition,
            Append,
            Some("attached part 0"),
            Unmerged,
            "AttachParts(2)",
            "intent part 1",
        ),
        (
            "after the second part's ATTACH",
            Partition,
            Append,
            Some("ATTACH part 1"),
            AttachTable,
            "AttachParts(2)",
            "attached part 1",
        ),
        (
            "after all parts attached",
            Partition,
            Append,
            Some("attached part 2"),
            Unmerged,
            "PublishPartitions(2)",
            "intent 202601",
        ),
        (
            "after a publish: intent, before the MOVE",
            Partition,
            Append,
            Some("intent 202601"),
            Unmerged,
            "PublishPartitions(2)",
            "MOVE 202601",
        ),
        (
            "after the MOVE, before published:",
            Partition,
            Append,
            Some("MOVE 202601"),
            Unmerged,
            "PublishPartitions(2)",
            "published 202601",
        ),
        (
            "between partitions",
            Partition,
            Append,
            Some("published 202601"),
            Unmerged,
            "PublishPartitions(1)",
            "intent 202602",
        ),
        (
            "after all published, before commit",
            Partition,
            Append,
            Some("published 202602"),
            Unmerged,
            "MarkCommitted",
            "commit",
        ),
        (
            "after commit: a re-run is a no-op",
            Partition,
            Append,
            Some("commit"),
            Unmerged,
            "Done",
            "nothing",
        ),
        (
            "replace: after the plan entry",
            Partition,
            Replace,
            Some("plan"),
            Unmerged,
            "AttachParts(3)",
            "intent part 0",
        ),
        (
            "replace: after all parts attached",
            Partition,
            Replace,
            Some("attached part 2"),
            AttachTable,
            "PublishPartitions(2)",
            "intent 202601",
        ),
        (
            "replace: after a publish: intent, before the REPLACE",
            Partition,
            Replace,
            Some("intent 202601"),
            Unmerged,
            "PublishPartitions(2)",
            "REPLACE 202601",
        ),
        (
            "replace: after the REPLACE, before published:",
            Partition,
            Replace,
            Some("REPLACE 202601"),
            Unmerged,
            "PublishPartitions(2)",
            "published 202601",
        ),
        (
            "replace: after the REPLACE, target merged since: the merge is recorded published",
            Partition,
            Replace,
            Some("REPLACE 202601"),
            Target,
            "PublishPartitions(2)",
            "published 202601",
        ),
        (
            "replace: after the intent, old parts merged before the REPLACE: REPLACE",
            Partition,
            Replace,
            Some("intent 202601"),
            Target,
            "PublishPartitions(2)",
            "REPLACE 202601",
        ),
        (
            "replace: after all published, before commit",
            Partition,
            Replace,
            Some("published 202602"),
            Unmerged,
            "MarkCommitted",
            "commit",
        ),
        (
            "replace: after commit",
            Partition,
            Replace,
            Some("commit"),
            Unmerged,
            "Done",
            "nothing",
        ),
        (
            "part visibility: killed before the plan entry",
            Part,
            Append,
            None,
            Unmerged,
            "NeedsPlan",
            "plan",
        ),
        (
            "part visibility: after an attach: intent",
            Part,
            Append,
            Some("intent part 0"),
            Unmerged,
            "AttachParts(3)",
            "ATTACH part 0",
        ),
        (
            "part visibility: after the ATTACH, before attached:",
            Part,
            Append,
            Some("ATTACH part 0"),
            Unmerged,
            "AttachParts(3)",
            "attached part 0",
        ),
        (
            "part visibility: after the ATTACH, merged with older rows",
            Part,
            Append,
            Some("ATTACH part 0"),
            AttachTable,
            "AttachParts(3)",
            "attached part 0",
        ),
        (
            "part visibility: between parts",
            Part,
            Append,
            Some("attached part 1"),
            Unmerged,
            "AttachParts(1)",
            "intent part 2",
        ),
        (
            "part visibility: after all parts attached, before commit",
            Part,
            Append,
            Some("attached part 2"),
            Unmerged,
            "MarkCommitted",
            "commit",
        ),
        (
            "part visibility: after commit",
            Part,
            Append,
            Some("commit"),
            Unmerged,
            "Done",
            "nothing",
        ),
    ];
    for (row, visibility, mode, crash_after, merge, want_phase, want_first) in rows {
        let plan = plan(visibility, mode);
        // A clean run, to find the step to crash after.
        let mut clean = sim::World::new(&plan);
        let steps = sim::run(&mut clean, &plan, usize::MAX);
        sim::assert_committed(&clean, &plan, row);
        let budget = match crash_after {
            None => 0,
            Some(step) => {
                1 + steps
                    .iter()
                    .position(|s| s == step)
                    .unwrap_or_else(|| panic!("{row}: no step {step:?} in {steps:?}"))
            }
        };
        let mut world = sim::World::new(&plan);
        let done = sim::run(&mut world, &plan, budget);
        assert_eq!(done, steps[..budget], "{row}: steps before the crash");
        world.merge(merge);
        assert_eq!(sim::phase(&world), want_phase, "{row}: phase on resume");
        assert_eq!(
            sim::describe(&plan, &sim::next(&world, &plan)),
            want_first,
            "{row}: first step on resume"
        );
        let resumed = sim::run(&mut world, &plan, usize::MAX);
        sim::assert_committed(&world, &plan, row);
        assert!(
            !resumed
                .iter()
                .any(|s| done.contains(s) && s.starts_with("ATTACH")),
            "{row}: an ATTACH was sent again on resume: {done:?} then {resumed:?}"
        );
        // A third run finds nothing to do.
        assert_eq!(
            sim::run(&mut world, &plan, usize::MAX),
            Vec::<String>::new(),
            "{row}"
        );
    }
}

/// Two commits racing on one part. The server claims a detached part when an ATTACH starts
/// (renaming it to `attaching_<name>`) and finishes it later; each commit observes, decides with
/// `decide_part`, and acts only on its own last decision.
#[test]
fn concurrent_attach_table() {
    use sim::Race::*;
    use PartStep::*;
    // (race, steps, times the part ends up attached, attaching_ leftover at the end)
    let rows: Vec<(&str, Vec<sim::Race>, u32, bool)> = vec![
        (
            "B observes after A's ATTACH finished",
            vec![
                Observe('A', Attach),
                Intent('A'),
                Send('A', true),
                Finish,
                Observe('B', RecordAttached),
                Record('B'),
                Observe('A', Skip),
            ],
            1,
            false,
        ),
        (
            "B observes while A's ATTACH holds the part",
            vec![
                Observe('A', Attach),
                Intent('A'),
                Send('A', true),
                Observe('B', Wait),
                Finish,
                Observe('B', RecordAttached),
                Record('B'),
            ],
            1,
            false,
        ),
        (
            "both see it in detached/, A claims first, B's ATTACH finds nothing",
            vec![
                Observe('A', Attach),
                Observe('B', Attach),
                Intent('A'),
                Intent('B'),
                Send('A', true),
                Send('B', false),
                Observe('B', Wait),
                Finish,
                Observe('B', RecordAttached),
                Observe('A', RecordAttached),
                Record('A'),
            ],
            1,
            false,
        ),
        (
            "both see it, A finishes before B sends, B's ATTACH finds nothing",
            vec![
                Observe('A', Attach),
                Observe('B', Attach),
                Intent('B'),
                Send('A', true),
                Finish,
                Send('B', false),
                Observe('B', RecordAttached),
                Record('B'),
            ],
            1,
            false,
        ),
        (
            "A's ATTACH times out but went through: A observes instead of re-sending",
            vec![
                Observe('A', Attach),
                Intent('A'),
                Send('A', true),
                Finish,
                Observe('A', RecordAttached),
                Record('A'),
            ],
            1,
            false,
        ),
        (
            "A's ATTACH times out while still running: A waits",
            vec![
                Observe('A', Attach),
                Intent('A'),
                Send('A', true),
                Observe('A', Wait),
                Observe('A', Wait),
                Finish,
                Observe('A', RecordAttached),
            ],
            1,
            false,
        ),
        (
            "while A's ATTACH runs, nobody touches its claim",
            vec![
                Observe('A', Attach),
                Intent('A'),
                Send('A', true),
                Observe('A', Wait),
                Observe('B', Wait),
                Observe('A', Wait),
            ],
            0,
            true,
        ),
        (
            "the server died inside A's ATTACH: after the restart both take it back, one wins",
            vec![
                Observe('A', Attach),
                Intent('A'),
                Send('A', true),
                RestartServer,
                Observe('A', Reclaim),
                Observe('B', Reclaim),
                TakeBack('B', true),
                TakeBack('A', false),
                Observe('A', Attach),
                Send('A', true),
                Observe('B', Wait),
                Finish,
                Observe('B', RecordAttached),
                Record('B'),
            ],
            1,
            false,
        ),
        (
            "a stale Reclaim lands on B's new claim: B's ATTACH fails, the part is attached once",
            vec![
                Observe('A', Attach),
                Intent('A'),
                Send('A', true),
                RestartServer,
                Observe('A', Reclaim),
                Observe('B', Reclaim),
                TakeBack('B', true),
                Observe('B', Attach),
                Send('B', true),
                TakeBack('A', true),
                Observe('A', Attach),
                Send('A', true),
                Finish,
                Observe('B', RecordAttached),
                Record('B'),
            ],
            1,
            false,
        ),
        (
            "A died after its intent, B attaches",
            vec![
                Observe('A', Attach),
                Intent('A'),
                Observe('B', Attach),
                Send('B', true),
                Finish,
                Observe('B', RecordAttached),
                Record('B'),
            ],
            1,
            false,
        ),
        (
            "A attached and the part merged before B observes",
            vec![
                Observe('A', Attach),
                Intent('A'),
                Send('A', true),
                Finish,
                MergeAll,
                Observe('B', RecordAttached),
                Record('B'),
            ],
            1,
            false,
        ),
        (
            "B read the ledger, then A attached it, moved it and it merged: B reads again",
            vec![
                Read('B'),
                Observe('A', Attach),
                Intent('A'),
                Send('A', true),
                Finish,
                MergeAll,
                ObserveOld('B', ReadLedger),
                Observe('B', RecordAttached),
                Record('B'),
            ],
            1,
            false,
        ),
        (
            "B read the ledger after A recorded it attached: B skips it",
            vec![
                Observe('A', Attach),
                Intent('A'),
                Send('A', true),
                Finish,
                Observe('A', RecordAttached),
                Record('A'),
                Read('B'),
                ObserveOld('B', Skip),
            ],
            1,
            false,
        ),
        (
            "A recorded it, B comes late",
            vec![
                Observe('A', Attach),
                Intent('A'),
                Send('A', true),
                Finish,
                Observe('A', RecordAttached),
                Record('A'),
                Observe('B', Skip),
            ],
            1,
            false,
        ),
    ];
    for (row, steps, attached, leftover) in rows {
        let plan = plan(Visibility::Partition, Mode::Append);
        let world = sim::race(&plan, &steps, row);
        let part = &plan.parts[0].name;
        assert_eq!(world.attached_count(part), attached, "{row}");
        assert_eq!(world.has_leftover(part), leftover, "{row}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Two commits of one load interleaved at random, each acting on decisions that may be
    /// stale by the time it acts, with ATTACHes that finish whenever the server gets to them,
    /// merges and server restarts (killing ATTACHes in flight) at any time: every planned part is attached exactly once, no loser's part
    /// ever, and the target ends with exactly the planned rows.
    #[test]
    fn racing_commits_attach_each_part_once(
        visibility in prop::sample::select(vec![Visibility::Partition, Visibility::Part]),
        mode in prop::sample::select(vec![Mode::Append, Mode::Replace]),
        schedule in prop::collection::vec(0u8..11, 0..160),
    ) {
        let plan = plan(visibility, mode);
        sim::race_randomly(&plan, &schedule);
    }
}
