//! A model of one ClickHouse table pair (shadow and target) and the ledger, and a commit driver
//! made of nothing but the decisions under test: observe, decide, act, observe again.
//!
//! The model keeps the behaviours the decisions rely on: ATTACH PART claims
//! `detached/<name>` by renaming it to `attaching_<name>` (so it fails with "not found" for a
//! part already claimed) and finishes later or, when the server dies, never (the restarted
//! server keeps the `attaching_` leftover, which is not active; renaming it back makes the
//! ATTACH that holds it, if any, fail: it finds its directory gone); MOVE PARTITION
//! moves every active part of the partition at once; REPLACE PARTITION swaps the target's parts
//! for copies of the shadow's; a merge rewrites parts under new hashes. Ledger entries are
//! appended and read back as a set of ids, first plan body wins.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::hash_of;
use crate::commit::*;
use crate::ids::PartitionId;
use crate::names::{detached_part_name, PartName};

/// Which table to merge between a crash and the resume.
#[derive(Clone, Copy, Debug)]
pub(super) enum Merge {
    /// Nothing.
    Unmerged,
    /// The table parts are attached into (the shadow, or the target for part visibility).
    AttachTable,
    /// The target.
    Target,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Active {
    hash: String,
    partition_id: PartitionId,
    rows: u64,
    /// The highest block number the part covers: a part entering a table gets a fresh one
    /// from the table's counter, a merge keeps the highest of its sources'.
    max_block: u64,
}

#[derive(Debug)]
pub(super) struct World {
    visibility: Visibility,
    /// An ATTACH finishes as soon as it claimed the part (a lone commit); otherwise it stays in
    /// flight until `finish_oldest`.
    sync_attach: bool,
    detached: BTreeSet<PartName>,
    attaching: BTreeSet<PartName>,
    /// The server generation (restarts so far) in which each leftover was claimed.
    claimed_in: BTreeMap<PartName, u32>,
    /// Restarts of the server so far.
    server_generation: u32,
    in_flight: VecDeque<PartName>,
    /// What each published part holds: (partition, rows, hash).
    content: BTreeMap<PartName, Active>,
    shadow: Vec<Active>,
    target: Vec<Active>,
    attach_count: BTreeMap<PartName, u32>,
    ledger: Vec<String>,
    /// The target partition's highest block number when each `publish:<id>` intent was
    /// first written (the intent's body).
    intent_blocks: BTreeMap<PartitionId, u64>,
    /// The last block number handed out.
    blocks: u64,
    plan_body: Option<String>,
    merges: u32,
    /// A losing attempt's part, published next to the winners' and never to be attached.
    loser: PartName,
}

/// Rows the target holds before the load: one partition the load touches, one it does not.
const OLD_ROWS: [(&str, u64); 2] = [("202601", 1000), ("202603", 5)];

fn pid(s: &str) -> PartitionId {
    s.parse().unwrap()
}

impl World {
    /// Every planned part and a loser's part published in `detached/`, the target holding
    /// older rows, the ledger holding nothing of commit's.
    pub(super) fn new(plan: &CommitPlan) -> World {
        let loser = detached_part_name(&plan.load, &"app.2".parse().unwrap(), &pid("202601"), 0);
        let mut content: BTreeMap<PartName, Active> = plan
            .parts
            .iter()
            .map(|p| {
                let active = Active {
                    hash: p.hash_of_all_files.clone(),
                    partition_id: p.partition_id.clone(),
                    rows: p.rows,
                    max_block: 0,
                };
                (p.name.clone(), active)
            })
            .collect();
        content.insert(
            loser.clone(),
            Active {
                hash: hash_of(&loser),
                partition_id: pid("202601"),
                rows: 100,
                max_block: 0,
            },
        );
        World {
            visibility: plan.visibility,
            sync_attach: true,
            detached: content.keys().cloned().collect(),
            attaching: BTreeSet::new(),
            claimed_in: BTreeMap::new(),
            server_generation: 0,
            in_flight: VecDeque::new(),
            content,
            shadow: Vec::new(),
            target: OLD_ROWS
                .iter()
                .enumerate()
                .map(|(i, &(id, rows))| Active {
                    hash: format!("old-{id}"),
                    partition_id: pid(id),
                    rows,
                    max_block: i as u64 + 1,
                })
                .collect(),
            attach_count: BTreeMap::new(),
            ledger: vec!["open".into()],
            intent_blocks: BTreeMap::new(),
            blocks: OLD_ROWS.len() as u64,
            plan_body: None,
            merges: 0,
            loser,
        }
    }

    fn attach_table_mut(&mut self) -> &mut Vec<Active> {
        match self.visibility {
            Visibility::Part => &mut self.target,
            Visibility::Partition => &mut self.shadow,
        }
    }

    fn progress(&self) -> CommitProgress {
        CommitProgress::from_entry_ids(self.ledger.iter().map(String::as_str)).unwrap()
    }

    fn recorded_plan(&self) -> Option<CommitPlan> {
        self.plan_body
            .as_deref()
            .map(|body| CommitPlan::from_json(body).unwrap())
    }

    /// The facts about `part` as a commit sees them: the table observed now, the ledger as
    /// `progress` (a read made after this observation when `fresh`, an older one otherwise).
    fn part_facts(&self, progress: &CommitProgress, part: &PlannedPart, fresh: bool) -> PartFacts {
        PartFacts {
            recorded_attached: progress.attached.contains(&part.name),
            attach_intent: progress.attach_intents.contains(&part.name),
            in_detached: self.detached.contains(&part.name),
            attaching_leftover: self.attaching.contains(&part.name),
            ledger_read_after_observation: fresh,
            claim_predates_server_start: self
                .claimed_in
                .get(&part.name)
                .is_some_and(|g| *g < self.server_generation),
            // As the real commit reads it: any ATTACH on the table.
            attach_running: !self.in_flight.is_empty(),
        }
    }

    fn partition_facts(
        &self,
        progress: &CommitProgress,
        plan: &CommitPlan,
        id: &PartitionId,
    ) -> PartitionFacts {
        let hashes = |table: &[Active]| {
            let mut h: Vec<String> = table
                .iter()
                .filter(|a| &a.partition_id == id)
                .map(|a| a.hash.clone())
                .collect();
            h.sort();
            h
        };
        let (shadow, before) = (hashes(&self.shadow), self.intent_blocks.get(id));
        let target: Vec<&Active> = self
            .target
            .iter()
            .filter(|a| &a.partition_id == id)
            .collect();
        // Old: covers only blocks handed out before the intent (an old part or a merge of old
        // ones); everything else that is not a copy of the shadow's arrived since.
        let old = |a: &Active| before.is_some_and(|b| a.max_block <= *b);
        let unexplained: Vec<&&Active> = target
            .iter()
            .filter(|a| !shadow.contains(&a.hash) && !old(a))
            .collect();
        let planned_rows = plan.partition(id).unwrap().rows;
        PartitionFacts {
            recorded_published: progress.published.contains(id),
            shadow_rows: rows_by_partition(&self.shadow)
                .get(id.as_str())
                .copied()
                .unwrap_or(0),
            planned_rows,
            target_has_plan_hashes: hashes(&self.target) == shadow,
            publish_intent: progress.publish_intents.contains(id),
            target_foreign: !unexplained.is_empty(),
            target_merged_plan: unexplained.iter().all(|a| a.hash.starts_with("merged-"))
                && !target.iter().any(|a| !shadow.contains(&a.hash) && old(a))
                && target.iter().map(|a| a.rows).sum::<u64>() == planned_rows,
        }
    }

    /// The server finishes an ATTACH that claimed `name`.
    fn finish(&mut self, name: &PartName) {
        assert!(self.attaching.remove(name), "nothing claimed {name}");
        let active = self.fresh(self.content[name].clone());
        self.attach_table_mut().push(active);
        *self.attach_count.entry(name.clone()).or_default() += 1;
    }

    /// `active` with the next block number, as it enters a table.
    fn fresh(&mut self, active: Active) -> Active {
        self.blocks += 1;
        Active {
            max_block: self.blocks,
            ..active
        }
    }

    /// The server is killed and restarted: every ATTACH in flight dies where it is, leaving
    /// its `attaching_` leftover.
    pub(super) fn restart_server(&mut self) {
        self.in_flight.clear();
        self.server_generation += 1;
    }

    /// The server finishes the oldest ATTACH in flight, if any.
    pub(super) fn finish_oldest(&mut self) -> bool {
        match self.in_flight.pop_front() {
            Some(name) => {
                self.finish(&name);
                true
            }
            None => false,
        }
    }

    /// Rewrites every partition of a table as one part under a new hash.
    pub(super) fn merge(&mut self, which: Merge) {
        let merges = &mut self.merges;
        let table = match which {
            Merge::Unmerged => return,
            Merge::AttachTable if self.visibility == Visibility::Partition => &mut self.shadow,
            Merge::AttachTable | Merge::Target => &mut self.target,
        };
        let max_block = |table: &[Active], id: &str| {
            table
                .iter()
                .filter(|a| a.partition_id.as_str() == id)
                .map(|a| a.max_block)
                .max()
                .unwrap_or(0)
        };
        *table = rows_by_partition(table)
            .into_iter()
            .map(|(id, rows)| {
                *merges += 1;
                Active {
                    hash: format!("merged-{merges}"),
                    partition_id: pid(&id),
                    rows,
                    max_block: max_block(table, &id),
                }
            })
            .collect();
    }

    /// How many times `name` was attached.
    pub(super) fn attached_count(&self, name: &PartName) -> u32 {
        self.attach_count.get(name).copied().unwrap_or(0)
    }

    /// Whether `detached/attaching_<name>` exists.
    pub(super) fn has_leftover(&self, name: &PartName) -> bool {
        self.attaching.contains(name)
    }

    fn check_never_twice(&self) {
        for (name, n) in &self.attach_count {
            assert!(*n <= 1, "{name} attached {n} times: {self:#?}");
        }
        assert_eq!(
            self.attached_count(&self.loser),
            0,
            "a loser's part was attached"
        );
    }
}

/// Active rows per partition (partitions with rows only).
fn rows_by_partition(table: &[Active]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for a in table.iter().filter(|a| a.rows > 0) {
        *out.entry(a.partition_id.to_string()).or_default() += a.rows;
    }
    out
}

/// One thing a commit does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Act {
    /// Write the `plan` entry with this commit's plan as its body.
    WritePlan,
    /// Write an entry.
    Write(CommitEntry),
    /// Send ATTACH PART.
    Attach(PartName),
    /// Send MOVE PARTITION.
    Move(PartitionId),
    /// Send REPLACE PARTITION.
    Replace(PartitionId),
    /// Rename `attaching_<part>` back to `<part>`.
    Reclaim(PartName),
    /// Everything pending is held by an ATTACH in flight.
    Wait,
    /// Committed.
    Nothing,
}

/// What a commit given `plan` does next, decided from a fresh observation of `world` only.
pub(super) fn next(world: &World, plan: &CommitPlan) -> Act {
    next_with(world, plan, None)
}

/// As [`next`], but the commit decides its parts from `old_read`, a ledger read it made some
/// time before this observation (as the real commit does within an attach round), until a
/// decision asks it to read the ledger again.
pub(super) fn next_with(
    world: &World,
    plan: &CommitPlan,
    old_read: Option<&CommitProgress>,
) -> Act {
    let progress = world.progress();
    let recorded = world.recorded_plan();
    if let Some(r) = &recorded {
        if let Err(e) = plan_matches(r, plan) {
            panic!("{e}");
        }
    }
    let phase = commit_phase(recorded.as_ref(), &progress);
    let Some(recorded) = recorded else {
        return match phase {
            CommitPhase::NeedsPlan => Act::WritePlan,
            CommitPhase::Done => Act::Nothing,
            other => panic!("{other:?} without a plan"),
        };
    };
    match phase {
        CommitPhase::NeedsPlan => unreachable!("a plan is recorded"),
        CommitPhase::Done => Act::Nothing,
        CommitPhase::MarkCommitted => Act::Write(CommitEntry::Commit),
        CommitPhase::AttachParts { pending } => {
            for name in pending {
                let part = recorded.parts.iter().find(|p| p.name == name).unwrap();
                let mut facts = match old_read {
                    Some(old) => world.part_facts(old, part, false),
                    None => world.part_facts(&progress, part, true),
                };
                let mut step = decide_part(&facts);
                if step == PartStep::ReadLedger {
                    facts = world.part_facts(&progress, part, true);
                    step = decide_part(&facts);
                }
                match step {
                    PartStep::Skip | PartStep::Wait => {}
                    PartStep::Reclaim => return Act::Reclaim(name),
                    PartStep::RecordAttached => return Act::Write(CommitEntry::Attached(name)),
                    PartStep::Attach if facts.attach_intent => return Act::Attach(name),
                    PartStep::Attach => return Act::Write(CommitEntry::AttachIntent(name)),
                    PartStep::ReadLedger => unreachable!("decided from a fresh read"),
                    PartStep::Lost => panic!("{}", PartLost::new(&recorded, part)),
                }
            }
            Act::Wait
        }
        CommitPhase::ExchangeTable => {
            unreachable!("overwrite loads are modelled by tests::exchange_races_never_swap_back")
        }
        CommitPhase::PublishPartitions { pending } => {
            if progress.publish_intents.is_empty() {
                // Nothing moved yet: the shadow holds exactly the load's rows.
                let shadow: BTreeMap<PartitionId, u64> = rows_by_partition(&world.shadow)
                    .into_iter()
                    .map(|(id, rows)| (pid(&id), rows))
                    .collect();
                if let Err(e) = reconcile_rows(&recorded, &shadow) {
                    panic!("{e}");
                }
            }
            for id in pending {
                let facts = world.partition_facts(&progress, &recorded, &id);
                let intent = progress.publish_intents.contains(&id);
                match decide_partition(recorded.mode, &facts) {
                    PartitionStep::Skip => {}
                    PartitionStep::RecordPublished => {
                        return Act::Write(CommitEntry::Published(id))
                    }
                    PartitionStep::Move | PartitionStep::Replace if !intent => {
                        return Act::Write(CommitEntry::PublishIntent(id))
                    }
                    PartitionStep::Move => return Act::Move(id),
                    PartitionStep::Replace => return Act::Replace(id),
                    PartitionStep::Broken => {
                        panic!("{}", PartitionBroken::new(&recorded, &id, &facts))
                    }
                    PartitionStep::Foreign => panic!("{id}: a foreign part in the target"),
                }
            }
            Act::Wait
        }
    }
}

/// Does `act`; false when an ATTACH found nothing to claim (the server's "not found").
pub(super) fn apply(world: &mut World, plan: &CommitPlan, act: Act) -> bool {
    match act {
        Act::WritePlan => {
            world.ledger.push(PLAN_ENTRY.into());
            world.plan_body.get_or_insert_with(|| plan.to_json());
        }
        Act::Write(entry) => {
            if let CommitEntry::PublishIntent(id) = &entry {
                let max = world
                    .target
                    .iter()
                    .filter(|a| &a.partition_id == id)
                    .map(|a| a.max_block)
                    .max()
                    .unwrap_or(0);
                world.intent_blocks.entry(id.clone()).or_insert(max);
            }
            world.ledger.push(entry.id())
        }
        Act::Attach(name) => {
            if !world.detached.remove(&name) {
                return false;
            }
            world.attaching.insert(name.clone());
            world
                .claimed_in
                .insert(name.clone(), world.server_generation);
            if world.sync_attach {
                world.finish(&name);
            } else {
                world.in_flight.push_back(name);
            }
        }
        Act::Reclaim(name) => {
            if !world.attaching.remove(&name) {
                return false; // taken back or finished by someone else meanwhile
            }
            // A stale decision may take back a claim a live ATTACH made since: that ATTACH
            // then fails (its directory is gone) and attaches nothing.
            world.in_flight.retain(|n| n != &name);
            world.claimed_in.remove(&name);
            world.detached.insert(name);
        }
        Act::Move(id) => {
            let (moved, kept) = world
                .shadow
                .drain(..)
                .partition(|a: &Active| a.partition_id == id);
            world.shadow = kept;
            for active in moved {
                let active = world.fresh(active);
                world.target.push(active);
            }
        }
        Act::Replace(id) => {
            world.target.retain(|a| a.partition_id != id);
            let copies: Vec<Active> = world
                .shadow
                .iter()
                .filter(|a| a.partition_id == id)
                .cloned()
                .collect();
            for active in copies {
                let active = world.fresh(active);
                world.target.push(active);
            }
        }
        Act::Wait | Act::Nothing => {}
    }
    world.check_never_twice();
    true
}

/// `act` for scenario tables, naming parts by their index in the plan.
pub(super) fn describe(plan: &CommitPlan, act: &Act) -> String {
    let index = |name: &PartName| plan.parts.iter().position(|p| &p.name == name).unwrap();
    match act {
        Act::WritePlan | Act::Write(CommitEntry::Plan) => "plan".into(),
        Act::Write(CommitEntry::AttachIntent(n)) => format!("intent part {}", index(n)),
        Act::Write(CommitEntry::Attached(n)) => format!("attached part {}", index(n)),
        Act::Write(CommitEntry::PublishIntent(id)) => format!("intent {id}"),
        Act::Write(CommitEntry::Published(id)) => format!("published {id}"),
        Act::Write(CommitEntry::Commit) => "commit".into(),
        Act::Write(CommitEntry::Exchanged) => "exchanged".into(),
        Act::Attach(n) => format!("ATTACH part {}", index(n)),
        Act::Reclaim(n) => format!("reclaim part {}", index(n)),
        Act::Move(id) => format!("MOVE {id}"),
        Act::Replace(id) => format!("REPLACE {id}"),
        Act::Wait => "wait".into(),
        Act::Nothing => "nothing".into(),
    }
}

/// Runs a lone commit for at most `budget` steps (killing it there) or until it is done;
/// returns the steps taken.
pub(super) fn run(world: &mut World, plan: &CommitPlan, budget: usize) -> Vec<String> {
    let mut steps = Vec::new();
    while steps.len() < budget {
        let act = next(world, plan);
        match act {
            Act::Nothing => break,
            Act::Wait => panic!("a lone commit never waits: {world:#?}"),
            _ => {}
        }
        steps.push(describe(plan, &act));
        assert!(
            apply(world, plan, act),
            "a lone commit's ATTACH found nothing"
        );
        assert!(steps.len() < 100, "no end: {steps:?}");
    }
    steps
}

/// The phase a commit resumed now would be in, for scenario tables.
pub(super) fn phase(world: &World) -> String {
    match commit_phase(world.recorded_plan().as_ref(), &world.progress()) {
        CommitPhase::NeedsPlan => "NeedsPlan".into(),
        CommitPhase::AttachParts { pending } => format!("AttachParts({})", pending.len()),
        CommitPhase::PublishPartitions { pending } => {
            format!("PublishPartitions({})", pending.len())
        }
        CommitPhase::ExchangeTable => "ExchangeTable".into(),
        CommitPhase::MarkCommitted => "MarkCommitted".into(),
        CommitPhase::Done => "Done".into(),
    }
}

/// The load is committed exactly once: recorded, every planned part attached once and gone from
/// `detached/`, the loser's part untouched, and the target holding the planned rows on top of
/// (append) or instead of (replace) the old ones.
pub(super) fn assert_committed(world: &World, plan: &CommitPlan, row: &str) {
    assert!(world.progress().committed, "{row}: not committed");
    for p in &plan.parts {
        assert_eq!(world.attached_count(&p.name), 1, "{row}: part {}", p.name);
        assert!(
            !world.detached.contains(&p.name) && !world.attaching.contains(&p.name),
            "{row}: part {} still detached",
            p.name
        );
    }
    assert_eq!(
        world.attached_count(&world.loser),
        0,
        "{row}: loser attached"
    );
    assert!(world.detached.contains(&world.loser), "{row}: loser gone");
    let replace = plan.visibility == Visibility::Partition && plan.mode == Mode::Replace;
    let mut want: BTreeMap<String, u64> = OLD_ROWS
        .iter()
        .map(|&(id, rows)| (id.to_string(), rows))
        .collect();
    for p in &plan.partitions {
        let rows = want.entry(p.partition_id.to_string()).or_default();
        *rows = if replace { p.rows } else { *rows + p.rows };
    }
    assert_eq!(rows_by_partition(&world.target), want, "{row}: target rows");
    let shadow_want: BTreeMap<String, u64> = if replace {
        plan.partitions
            .iter()
            .map(|p| (p.partition_id.to_string(), p.rows))
            .collect()
    } else {
        BTreeMap::new()
    };
    assert_eq!(
        rows_by_partition(&world.shadow),
        shadow_want,
        "{row}: shadow rows"
    );
}

/// One step of a race on the plan's first part between commits named by a letter.
#[derive(Clone, Copy, Debug)]
pub(super) enum Race {
    /// The commit observes the part, then reads the ledger, and must decide this.
    Observe(char, PartStep),
    /// The commit reads the ledger (and keeps that read for [`Race::ObserveOld`]).
    Read(char),
    /// The commit observes the part and must decide this from its last [`Race::Read`], made
    /// before the observation.
    ObserveOld(char, PartStep),
    /// The commit writes `attach:<part>` (after deciding Attach).
    Intent(char),
    /// The commit sends ATTACH (after deciding Attach); the server finds the part or not.
    Send(char, bool),
    /// The server finishes the ATTACH in flight.
    Finish,
    /// The commit writes `attached:<part>` (after deciding RecordAttached).
    Record(char),
    /// The server merges every table.
    MergeAll,
    /// The server is killed (ATTACHes in flight die) and restarted.
    RestartServer,
    /// The commit renames the leftover back (after deciding Reclaim); it is there or not.
    TakeBack(char, bool),
}

/// Plays a race on the plan's first part; each commit acts only on its own latest decision,
/// and only after an intent is recorded.
pub(super) fn race(plan: &CommitPlan, steps: &[Race], row: &str) -> World {
    let mut world = World::new(plan);
    world.sync_attach = false;
    apply(&mut world, plan, Act::WritePlan);
    let part = &plan.parts[0];
    let mut last: BTreeMap<char, PartStep> = BTreeMap::new();
    let mut reads: BTreeMap<char, CommitProgress> = BTreeMap::new();
    for (i, step) in steps.iter().enumerate() {
        let at = format!("{row}: step {i} {step:?}");
        let decided = |last: &BTreeMap<char, PartStep>, who: char, want: PartStep| {
            assert_eq!(
                last.get(&who),
                Some(&want),
                "{at}: acts without deciding so"
            );
        };
        match *step {
            Race::Observe(who, want) => {
                let got = decide_part(&world.part_facts(&world.progress(), part, true));
                assert_eq!(got, want, "{at}");
                last.insert(who, got);
            }
            Race::Read(who) => _ = reads.insert(who, world.progress()),
            Race::ObserveOld(who, want) => {
                let old = reads.get(&who).expect("a Read before ObserveOld");
                let got = decide_part(&world.part_facts(old, part, false));
                assert_eq!(got, want, "{at}");
                last.insert(who, got);
            }
            Race::Intent(who) => {
                decided(&last, who, PartStep::Attach);
                apply(
                    &mut world,
                    plan,
                    Act::Write(CommitEntry::AttachIntent(part.name.clone())),
                );
            }
            Race::Send(who, found) => {
                decided(&last, who, PartStep::Attach);
                assert!(
                    world.progress().attach_intents.contains(&part.name),
                    "{at}: ATTACH before any intent"
                );
                let got = apply(&mut world, plan, Act::Attach(part.name.clone()));
                assert_eq!(got, found, "{at}: found");
                // After sending, whatever the answer, a commit must observe again.
                last.remove(&who);
            }
            Race::Finish => assert!(world.finish_oldest(), "{at}: no ATTACH in flight"),
            Race::Record(who) => {
                decided(&last, who, PartStep::RecordAttached);
                apply(
                    &mut world,
                    plan,
                    Act::Write(CommitEntry::Attached(part.name.clone())),
                );
            }
            Race::MergeAll => {
                world.merge(Merge::AttachTable);
                world.merge(Merge::Target);
            }
            Race::RestartServer => world.restart_server(),
            Race::TakeBack(who, found) => {
                decided(&last, who, PartStep::Reclaim);
                let got = apply(&mut world, plan, Act::Reclaim(part.name.clone()));
                assert_eq!(got, found, "{at}: found");
                last.remove(&who);
            }
        }
        world.check_never_twice();
    }
    world
}

/// Two whole commits interleaved by `schedule`, each acting on its previous decision (which may
/// be stale by then), with the server finishing ATTACHes and merging whenever the schedule
/// says; then run to the end. The load must end committed exactly once.
pub(super) fn race_randomly(plan: &CommitPlan, schedule: &[u8]) {
    let mut world = World::new(plan);
    world.sync_attach = false;
    let mut decided: [Option<Act>; 2] = [None, None];
    // Each commit's last ledger read, which it decides its parts from until it reads again.
    let mut reads: [Option<CommitProgress>; 2] = [None, None];
    let step = |world: &mut World, decided: &mut Option<Act>, read: &mut Option<CommitProgress>| {
        match decided.take() {
            Some(act) => {
                // A commit knows what it wrote itself, whenever it last read the ledger.
                if let (Act::Write(entry), Some(read)) = (&act, read.as_mut()) {
                    read.record(entry.clone());
                }
                // A "not found" from the server needs no handling: the next decision observes.
                apply(world, plan, act);
            }
            None => {
                *decided = Some(next_with(world, plan, read.as_ref()))
                    .filter(|a| !matches!(a, Act::Nothing | Act::Wait));
            }
        }
    };
    for &choice in schedule {
        match choice {
            0..=2 => step(&mut world, &mut decided[0], &mut reads[0]),
            3..=5 => step(&mut world, &mut decided[1], &mut reads[1]),
            6 => _ = world.finish_oldest(),
            7 => {
                world.merge(Merge::AttachTable);
                world.merge(Merge::Target);
            }
            8 => reads[0] = Some(world.progress()),
            9 => reads[1] = Some(world.progress()),
            _ => world.restart_server(),
        }
    }
    for i in 0.. {
        assert!(i < 1000, "no end: {world:#?}");
        while world.finish_oldest() {}
        step(&mut world, &mut decided[i % 2], &mut reads[i % 2]);
        if decided.iter().all(Option::is_none) && next(&world, plan) == Act::Nothing {
            break;
        }
    }
    assert_committed(&world, plan, "race");
}
