//! Crash points and races, run against the model in `sim`.

use super::*;

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
