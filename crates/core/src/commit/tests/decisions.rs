//! Step 3: entry ids, progress, and the per-part and per-partition decisions, with the
//! reconcile checks.

use super::*;

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
