//! Step 2: the plan from the winners, its JSON, a recorded plan's checks and re-runs
//! ([`plan_matches`]); the overwrite exchange and emptied partitions.

use super::*;

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
    type Edit = fn(&mut Value);
    let rows: Vec<(&str, Edit, Result<(), &str>)> = vec![
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
