//! `commit`: attach exactly the winning attempts' parts, resumably, and make them visible.
//!
//! ```text
//!  Planned:   winners (what collect() returned) ─► validate ─► verify in detached/
//!  Claimed:   (part visibility) ledger: plan ─► stop the shadow's merges
//!  Attached:  per batch: observe ─► decide_part ─► [attach: intents + the plan (partition
//!             visibility) or the decision (part visibility)] ─► ATTACH PART (outcome noted)
//!  Published: (partition visibility) check the shadow ─► per partition: observe ─►
//!             decide_partition ─► [publish: intents + the decision + noted outcomes] ─►
//!             MOVE / REPLACE (outcome noted)
//!  committed: ledger: noted outcomes + commit
//! ```
//!
//! `[...]` is one ledger INSERT: a commit writes the ledger once per phase (see `Progress`
//! and `record_once`).
//!
//! Each stage is a type only the stage before makes ([`commit`]), so no step can run before
//! the ones it depends on.
//!
//! Every decision is made by the pure functions of `chpart_core::commit` from the ledger and
//! a fresh observation of the server, never from memory of what this process sent: a commit
//! killed at any point (or two commits racing) re-observes and continues. ATTACH is never
//! re-sent after an unclear outcome; the server claims a detached part by renaming it, so a
//! part can be attached at most once, and the next observation tells what happened.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use chpart_core::commit::{
    commit_phase, decide_part, decide_partition, plan_matches, reconcile_hashes, reconcile_rows,
    replace_overlap, validate_winners, CommitEntry, CommitPhase, CommitPlan, CommitProgress,
    Expected, ForeignPart, PartFacts, PartLost, PartStep, PartitionBroken, PartitionFacts,
    PartitionStep, PlanConflict, PlanError, RowMismatch, Winners, WinnersError, PLAN_ENTRY,
};
use chpart_core::{
    AttemptId, LoadId, Manifest, PartEntry, PartName, PartitionId, RemotePath, StagingLayout,
    TableRef,
};
use chpart_remote::RemoteFs;
use chpart_server::{quote_str, quote_table, ClickHouseServer, ServerError, TableToCheck};

use crate::events::Step;
use serde::{Deserialize, Serialize};

use crate::hooks::crash_point;
use crate::ledger::{
    kind, Decision, DecisionBody, LoadSpec, LoadState, LoadView, Mode, Visibility, DECISION_ENTRY,
};
use crate::observe::{
    reclaim, table_parts, verify_part, ActivePart, ClaimCheck, TableParts, Verify, VerifyError,
};
use crate::snapshot::TableSnapshot;
use crate::store::{Ledger, LedgerStoreError};
use crate::FailureKind;

mod attach;
mod checks;
mod error;
mod exchange;
mod publish;
mod record;
mod verify;

use attach::*;
use checks::*;
pub use error::CommitError;
use exchange::exchange_table;
pub use exchange::is_load_table_name;
use publish::*;
use record::*;
use verify::*;

/// How many observe-decide rounds a commit waits for parts another process holds.
const MAX_ROUNDS: u32 = 60;
/// Parts whose intents (and then outcomes) go into one ledger INSERT.
const ATTACH_BATCH: usize = 256;
/// ATTACH statements in flight at once: the server claims each part by a rename, so they do
/// not interfere, and a few in flight hide the round trips.
const ATTACH_CONCURRENCY: usize = 4;
/// Pause between rounds.
const ROUND_PAUSE: Duration = Duration::from_millis(500);

/// One `commit` invocation.
#[derive(Debug, Clone)]
pub struct CommitRequest {
    /// The load.
    pub load: LoadId,
    /// The winning manifests as (line number, JSON text): exactly what the tasks printed and
    /// `collect()` returned. `None` resumes a load whose plan is recorded from the ledger
    /// alone (the plan holds the winners' manifests), on any machine.
    pub winners: Option<Vec<(usize, String)>>,
    /// How parts are compared with their manifests before anything becomes visible; `None`
    /// takes the default for the load's visibility ([`Verify::default_for`]).
    pub verify: Option<Verify>,
    /// Spark partitions 0..n must all have a winner.
    pub expected_partitions: Option<u32>,
    /// Accept a load with partitions missing.
    pub allow_missing: bool,
    /// If given, must equal the load's visibility (chosen at `begin`).
    pub visibility: Option<Visibility>,
    /// Stop once the plan is recorded, before the load is claimed and anything is attached:
    /// the first phase of a cluster commit, which makes nothing visible on any shard until
    /// every shard's winners are checked and planned.
    pub prepare_only: bool,
    /// A shard's sub-load of a replace load into a Distributed table: every ClickHouse
    /// partition the load's rows fall into on any shard. Those this shard's winners put no
    /// rows in are emptied on this shard ([`CommitPlan::emptied`]). `None` for any other load,
    /// and to resume a shard's commit with the recorded plan's.
    pub replaced_on_every_shard: Option<BTreeSet<PartitionId>>,
}

/// What `commit` works with.
pub struct CommitEnv<'a> {
    /// The ledger.
    pub ledger: &'a Ledger,
    /// The server of the load's tables (the ledger's, or a shard's for a shard's sub-load).
    pub server: &'a dyn ClickHouseServer,
    /// The server's filesystem (for verification).
    pub fs: &'a dyn RemoteFs,
    /// The configured staging root.
    pub staging: StagingLayout,
    /// How to open more connections to `fs`'s host, to verify many waiting parts in parallel
    /// (`None`: every part is verified over `fs`).
    pub more: Option<MoreConnections<'a>>,
}

/// Further connections to the filesystem of one host, opened only when a commit has enough
/// parts to verify for parallel work to pay for the connections (see [`PARALLEL_VERIFY_MIN`]).
#[derive(Clone, Copy)]
pub struct MoreConnections<'a> {
    /// Opens them (its guarantee: connections to `host` only, host key verified).
    pub reach: &'a dyn crate::reach::Reach,
    /// The host of `CommitEnv::fs`.
    pub host: &'a str,
    /// Connections to verify over in all, `fs` included (1: no more are opened).
    pub total: usize,
}

/// Parts to verify below which a commit verifies over its one connection: a new SSH connection
/// costs a handshake, worth it only when it takes many parts' round trips off the others.
pub const PARALLEL_VERIFY_MIN: usize = 16;

/// What a committed load holds; printed by `commit` and recorded in the `commit` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CommitSummary {
    /// The load.
    pub load: LoadId,
    /// The target table.
    pub table: TableRef,
    /// Append or replace.
    pub mode: Mode,
    /// Partition or part visibility.
    pub visibility: Visibility,
    /// ClickHouse partitions the load touched.
    pub partitions: usize,
    /// Parts attached.
    pub parts: usize,
    /// Rows attached.
    pub rows: u64,
    /// The winning attempt of each Spark partition.
    pub winners: Vec<(u32, AttemptId)>,
}

/// The result of `commit`.
#[derive(Debug, Clone)]
pub struct CommitOutcome {
    /// The load's summary.
    pub summary: CommitSummary,
    /// Whether the load was already committed (this run changed nothing).
    pub already_committed: bool,
    /// Parts this run attached itself (the rest were attached by an earlier or a concurrent run).
    pub attached_now: usize,
    /// Seconds this run took.
    pub seconds: f64,
}

/// Commits `req.load` with exactly `req.winners`, or finishes a commit that was interrupted.
///
/// A chain of stages, each a type that only the one before makes:
/// `Planned` (winners checked, plan the load's) ─► `Claimed` (the load is this commit's
/// where the next step is visible) ─► `Attached` (every planned part recorded attached) ─►
/// `Published` (every partition in the target) ─► committed. Each stage decides from the
/// ledger and a fresh observation, so a stage another run already finished is passed through.
pub async fn commit(env: &CommitEnv<'_>, req: CommitRequest) -> Result<CommitOutcome, CommitError> {
    let view = env.ledger.view(&req.load, crate::KNOWN_KINDS).await?;
    commit_viewed(env, req, view).await
}

/// [`commit`] from `view`, the load's ledger as read just before (by a caller that had to read
/// it anyway, e.g. to tell a cluster load from a table's): one ledger read fewer.
pub(crate) async fn commit_viewed(
    env: &CommitEnv<'_>,
    req: CommitRequest,
    view: LoadView,
) -> Result<CommitOutcome, CommitError> {
    let started = Instant::now();
    let whole = Step::start(&req.load, "commit");
    let step = Step::start(&req.load, "commit.plan");
    let planned = match Planned::open(env, &req, view).await {
        Ok(Opened::Committed(summary)) => {
            step.ok();
            whole.counts(summary.rows, 0, summary.parts as u64, 0).ok();
            return Ok(outcome(summary, true, 0, started));
        }
        Ok(Opened::Planned(planned)) => planned,
        Err(e) => return whole.end(step.end(Err(e))),
    };
    let mut planned = planned;
    if req.prepare_only && !planned.plan_recorded {
        if let Err(e) = planned.record_plan(env, Vec::new()).await {
            return whole.end(step.end(Err(e)));
        }
    }
    let summary = planned.summary();
    let spec = planned.spec.clone();
    let counted = |step: Step| {
        step.shard(spec.shard_of.as_ref().map(|of| of.shard_num))
            .counts(
                summary.rows,
                0,
                summary.parts as u64,
                summary.winners.len() as u64,
            )
    };
    counted(step).ok();
    if req.prepare_only {
        return Ok(outcome(summary, false, 0, started));
    }
    let result = async {
        let claimed = step_of(&spec, "commit.claim").end(planned.claim(env).await)?;
        let attached = step_of(&spec, "commit.attach").end(claimed.attach(env).await)?;
        let published = step_of(&spec, "commit.publish").end(attached.publish(env).await)?;
        step_of(&spec, "commit.finish").end(published.finish(env, started).await)
    }
    .await;
    counted(whole).end(result)
}

/// A step of the commit of `spec`'s load (on its shard, for a cluster's sub-load).
fn step_of(spec: &LoadSpec, step: &'static str) -> Step {
    Step::start(&spec.load, step).shard(spec.shard_of.as_ref().map(|of| of.shard_num))
}

fn outcome(
    summary: CommitSummary,
    already_committed: bool,
    attached_now: usize,
    started: Instant,
) -> CommitOutcome {
    CommitOutcome {
        summary,
        already_committed,
        attached_now,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// What opening a commit found: the load committed already, or a plan to carry out.
enum Opened {
    Committed(CommitSummary),
    Planned(Box<Planned>),
}

/// Stage 1: the winners are checked against the load, its tables and what waits in
/// `detached/`, and the plan is the load's, recorded once by the server (this commit's, or
/// an earlier run's with the same winners). Nothing is visible yet.
struct Planned {
    spec: LoadSpec,
    plan: CommitPlan,
    /// The plan is in the ledger (this commit's or an earlier run's). A new plan is written
    /// by the first ledger INSERT the commit needs anyway: with the first attach intents
    /// (partition visibility), alone before the decision (part visibility), or alone for
    /// `--prepare-only`.
    plan_recorded: bool,
    progress: Progress,
    verify: Verify,
    /// The load's decision is this commit's (won by this run or an earlier one).
    decided: bool,
    /// Where each planned part waits: the data path of the disk its manifest names.
    data_paths: HashMap<PartName, RemotePath>,
    /// The publish table as observed while the waiting parts were verified, for the first
    /// attach round (taken by it).
    observed: Option<TableParts>,
}

/// Stage 2: where the next step is visible, the load is this commit's (with part visibility
/// the first ATTACH is visible, so the decision is won here; with partition visibility the
/// parts go into the shadow first, and the decision is won before the first MOVE). The
/// shadow's merges are stopped.
struct Claimed(Box<Planned>);

/// Stage 3: every planned part is recorded attached (into the shadow or the target), and, for
/// partition visibility, the shadow as this run last checked it.
struct Attached {
    planned: Box<Planned>,
    attached_now: usize,
    observed_shadow: Option<TableParts>,
}

/// Stage 4: every partition is in the target (partition visibility); the facts not written
/// yet (the last round's moves) go into the commit's own INSERT.
struct Published {
    planned: Box<Planned>,
    attached_now: usize,
}

impl Planned {
    fn summary(&self) -> CommitSummary {
        summary_of(&self.spec, &self.plan)
    }

    fn phase(&self) -> CommitPhase {
        commit_phase(Some(&self.plan), &self.progress.known)
    }

    /// Writes the plan, with `riders` (the first attach intents) in the same INSERT, and
    /// goes on only if the plan the server kept is this commit's (another driver may commit
    /// other winners).
    async fn record_plan(
        &mut self,
        env: &CommitEnv<'_>,
        riders: Vec<(CommitEntry, String)>,
    ) -> Result<(), CommitError> {
        let load = self.spec.load.clone();
        let mine = self.plan.clone();
        let conflict = |recorded: &CommitPlan| {
            plan_matches(recorded, &mine).map_err(|c| CommitError::PlanConflict {
                load: load.clone(),
                conflict: Box::new(c),
            })
        };
        let fact = (PLAN_ENTRY, kind::COMMIT_PLANNED, mine.to_json());
        let recorded = record_once(
            env,
            &load,
            &mut self.progress,
            fact,
            riders,
            "after-plan",
            |v| {
                let recorded = recorded_plan(v)?;
                recorded.as_ref().map_or(Ok(()), conflict)?;
                Ok(recorded)
            },
        )
        .await?;
        if let Some(recorded) = recorded {
            self.plan = recorded;
        }
        self.plan_recorded = true;
        Ok(())
    }

    /// Claims the load for this commit (see [`crate::ledger`]), with `riders` (the intents of
    /// the first step it allows) in the same INSERT: fails with `Aborted` if an abort claimed
    /// it first; then no abort can remove anything of it any more.
    async fn decide(
        &mut self,
        env: &CommitEnv<'_>,
        riders: Vec<(CommitEntry, String)>,
    ) -> Result<(), CommitError> {
        let load = self.spec.load.clone();
        let fact = (
            DECISION_ENTRY,
            kind::DECIDED,
            DecisionBody::json(Decision::Commit),
        );
        record_once(
            env,
            &load,
            &mut self.progress,
            fact,
            riders,
            "after-decision",
            |v| match v.decision {
                Some(Decision::Commit) => Ok(()),
                _ => Err(CommitError::Aborted(load.clone())),
            },
        )
        .await?;
        self.decided = true;
        Ok(())
    }

    /// Records the attach intents of `parts` before their ATTACHes: with the plan if it is
    /// not recorded yet, with the decision if the first ATTACH is visible (part visibility),
    /// else on their own (each with the facts not written yet).
    async fn record_attach_intents(
        &mut self,
        env: &CommitEnv<'_>,
        parts: &[PartName],
    ) -> Result<(), CommitError> {
        let intents = parts
            .iter()
            .map(|p| (CommitEntry::AttachIntent(p.clone()), "{}".to_owned()))
            .collect();
        if !self.plan_recorded {
            self.record_plan(env, intents).await
        } else if self.spec.visibility == Visibility::Part && !self.decided {
            self.decide(env, intents).await
        } else {
            let load = self.spec.load.clone();
            record(env, &load, &mut self.progress, intents).await
        }
    }

    /// Opens the commit: the load's state, the winners (given, or the recorded plan's), the
    /// tables and the waiting parts checked, the plan recorded or matched.
    async fn open(
        env: &CommitEnv<'_>,
        req: &CommitRequest,
        view: LoadView,
    ) -> Result<Opened, CommitError> {
        let load = req.load.clone();
        let spec = match (&view.state, &view.spec) {
            (LoadState::Unknown, _) | (LoadState::Open, None) => {
                return Err(CommitError::NotBegun(load))
            }
            (LoadState::Aborted, _) => return Err(CommitError::Aborted(load)),
            (LoadState::Committed, spec) => {
                // A load pruned by `chpart ledger prune` keeps its commit entry, not its spec.
                let summary = match (committed_summary(&view)?, spec) {
                    (Some(summary), _) => summary,
                    (None, Some(spec)) => CommitSummary {
                        load: load.clone(),
                        table: spec.target.clone(),
                        mode: spec.mode,
                        visibility: spec.visibility,
                        partitions: 0,
                        parts: 0,
                        rows: 0,
                        winners: Vec::new(),
                    },
                    (None, None) => return Err(CommitError::NotBegun(load)),
                };
                return Ok(Opened::Committed(summary));
            }
            (LoadState::Open, Some(spec)) => spec.clone(),
        };
        if let Some(asked) = req.visibility {
            if asked != spec.visibility {
                return Err(CommitError::VisibilityMismatch {
                    load,
                    begun: spec.visibility,
                    asked,
                });
            }
        }
        let verify = req.verify.unwrap_or(Verify::default_for(spec.visibility));
        if verify == Verify::Server && spec.visibility == Visibility::Part {
            return Err(CommitError::VerifyNeedsShadow {
                load,
                table: spec.target.clone(),
            });
        }
        let destination = spec
            .destination(&env.staging)
            .map_err(|e| CommitError::Unsupported {
                load: load.clone(),
                message: format!("publish table data path: {e}"),
            })?;
        let expected = Expected {
            publish: spec.publish.clone(),
            fingerprint: spec.publish_snapshot.fingerprint.clone(),
            disks: destination.disks.clone(),
            host: spec.host.clone(),
        };
        // The recorded plan, read once: it may hold thousands of parts.
        let recorded = recorded_plan(&view)?;
        let winners = match &req.winners {
            Some(lines) => validate_winners(
                &load,
                &expected,
                lines,
                req.expected_partitions,
                req.allow_missing,
            ),
            // Resumed from the ledger: the plan's manifests are validated again (against this
            // load, its tables and this config's staging) but need not cover every partition:
            // the first commit checked that, and they are the plan whatever is asked now.
            None => {
                let lines = recorded
                    .as_ref()
                    .ok_or_else(|| CommitError::NoPlan { load: load.clone() })?
                    .winner_lines()
                    .ok_or_else(|| CommitError::PlanWithoutManifests { load: load.clone() })?;
                validate_winners(&load, &expected, &lines, None, true)
            }
        }
        .map_err(|e| CommitError::Winners(Box::new(e)))?;
        let mut new_plan = CommitPlan::from_winners(&winners, spec.visibility, spec.mode);
        match &req.replaced_on_every_shard {
            Some(all) if spec.mode == Mode::Replace && spec.shard_of.is_some() => {
                new_plan = new_plan.emptying(all)
            }
            Some(_) => {
                return Err(CommitError::Unsupported {
                    load,
                    message: "only a shard's sub-load of a replace load into a Distributed table empties partitions".into(),
                })
            }
            None => {
                if let Some(recorded) = &recorded {
                    new_plan.emptied = recorded.emptied.clone();
                }
            }
        }

        // Nothing becomes visible unless the tables are as the parts expect and every part
        // still waiting in detached/ is exactly what its manifest says.
        let progress = Progress::of(&view)?;
        // Overwrite with every part attached: a commit may have claimed the shadow (renamed
        // it) or swapped it in; the swap finds it by UUID and stops if it is gone.
        let swapping = spec.mode == Mode::Overwrite
            && matches!(
                commit_phase(recorded.as_ref(), &progress.known),
                CommitPhase::ExchangeTable | CommitPhase::MarkCommitted
            );
        let mut tables = Vec::new();
        if !swapping {
            tables.push((&spec.publish, &spec.publish_snapshot));
        }
        if spec.publish != spec.target {
            tables.push((&spec.target, &spec.target_snapshot));
        }
        check_tables(env, &load, &tables).await?;
        let observed = verify_waiting_parts(env, &spec, &winners, &progress.known, verify).await?;
        let data_paths: HashMap<PartName, RemotePath> = winners
            .manifests()
            .values()
            .flat_map(|m| {
                m.parts
                    .iter()
                    .map(|p| (p.name.clone(), m.data_path_of(p).clone()))
            })
            .collect();

        // One plan per load: the server keeps the first plan written and a commit goes on only
        // if that is its own. A new plan is written by the commit's first ledger INSERT
        // (`Planned::record_plan`), before anything of the load is attached.
        let (plan, plan_recorded) = match recorded {
            Some(recorded) => {
                plan_matches(&recorded, &new_plan).map_err(|c| CommitError::PlanConflict {
                    load: load.clone(),
                    conflict: Box::new(c),
                })?;
                (recorded, true)
            }
            None => (new_plan, false),
        };
        Ok(Opened::Planned(Box::new(Planned {
            decided: view.decision == Some(Decision::Commit),
            spec,
            plan,
            plan_recorded,
            progress,
            verify,
            data_paths,
            // The first attach round decides from this observation instead of making its own
            // (it precedes every ledger read the round decides from, the order the rounds
            // need); unless it shows a claim left by an ATTACH, which is judged from a fresh
            // look at the server.
            observed: Some(observed).filter(|o| o.attaching.is_empty()),
        })))
    }

    /// Stage 2 (see `Claimed`).
    async fn claim(mut self: Box<Self>, env: &CommitEnv<'_>) -> Result<Claimed, CommitError> {
        if self.spec.visibility == Visibility::Part && !self.plan_recorded {
            // The decision has a token of its own: the plan goes first, alone. The decision
            // is written with the first attach intents, before the first ATTACH.
            self.record_plan(env, Vec::new()).await?;
        }
        if self.spec.publish != self.spec.target {
            // Again on every run: a server restart since `begin` lets the shadow merge.
            match crate::begin::stop_merges(env.server, &self.spec.publish).await {
                // Overwrite: a racing commit claimed the shadow (renamed it) or swapped it in
                // already, once every part was attached; the swap finds it by UUID (and stops
                // if it is gone).
                Err(e)
                    if self.spec.mode == Mode::Overwrite
                        && e.code() == Some(chpart_server::code::UNKNOWN_TABLE) => {}
                result => result?,
            }
        }
        Ok(Claimed(self))
    }
}

impl Claimed {
    /// Stage 3: attaches every planned part not yet attached, round after round, each decided
    /// from a fresh observation; then reconciles what the ledger and the shadow say.
    async fn attach(self, env: &CommitEnv<'_>) -> Result<Attached, CommitError> {
        let mut p = self.0;
        let mut attached_now = 0;
        let mut observed_shadow = None;
        while let CommitPhase::AttachParts { .. } = p.phase() {
            let first = p.observed.take();
            attached_now += attach_parts(env, &mut p, first).await?;
            observed_shadow = reconcile_attached(env, &mut p).await?;
        }
        // Nothing was left to attach: the plan and (part visibility) the decision alone.
        if !p.plan_recorded {
            p.record_plan(env, Vec::new()).await?;
        }
        if p.spec.visibility == Visibility::Part && !p.decided {
            p.decide(env, Vec::new()).await?;
        }
        Ok(Attached {
            planned: p,
            attached_now,
            observed_shadow,
        })
    }
}

impl Attached {
    /// Stage 4: with partition visibility, every partition not yet published goes into the
    /// target at once (MOVE, or REPLACE in replace mode), once the shadow is checked and the
    /// load's decision is this commit's.
    async fn publish(self, env: &CommitEnv<'_>) -> Result<Published, CommitError> {
        let Attached {
            planned: mut p,
            attached_now,
            mut observed_shadow,
        } = self;
        if p.phase() == CommitPhase::ExchangeTable {
            let (db, shadow) = (
                p.spec.publish.database.as_str(),
                p.spec.publish.table.as_str(),
            );
            if observed_shadow.is_none() && env.server.table_info(db, shadow).await?.is_some() {
                // Resumed with every part attached, the shadow not claimed yet: it is checked
                // by this run too before it becomes the table.
                observed_shadow = reconcile_attached(env, &mut p).await?;
            }
            check_replace_overlap(env, &p.spec, &p.plan, &p.progress.known).await?;
            exchange_table(env, &mut p).await?;
        }
        while let CommitPhase::PublishPartitions { .. } = p.phase() {
            let Some(observed) = observed_shadow.take() else {
                // Resumed with every part attached: what waits in the shadow is checked by
                // this run too before any of it becomes visible.
                observed_shadow = reconcile_attached(env, &mut p).await?;
                continue;
            };
            if p.spec.mode == Mode::Replace {
                check_replace_overlap(env, &p.spec, &p.plan, &p.progress.known).await?;
            }
            publish_partitions(env, &mut p, Some(observed)).await?;
        }
        Ok(Published {
            planned: p,
            attached_now,
        })
    }
}

impl Published {
    /// The last stage: the `commit` entry (with the last round's `published:` entries in the
    /// same INSERT), unless a concurrent commit recorded it already.
    async fn finish(
        self,
        env: &CommitEnv<'_>,
        started: Instant,
    ) -> Result<CommitOutcome, CommitError> {
        let Published {
            planned: mut p,
            attached_now,
        } = self;
        let summary = p.summary();
        match p.phase() {
            CommitPhase::Done => Ok(outcome(summary, true, attached_now, started)),
            CommitPhase::MarkCommitted => {
                crash_point("before-commit");
                let body = serde_json::to_string(&summary).expect("a summary serializes");
                let load = &p.spec.load;
                record(
                    env,
                    load,
                    &mut p.progress,
                    vec![(CommitEntry::Commit, body)],
                )
                .await?;
                // Once this commit won the decision no abort can end the load; a ledger
                // without decisions is read back to see which terminal entry came first.
                if !p.decided {
                    let view = env.ledger.view(load, crate::KNOWN_KINDS).await?;
                    if view.state != LoadState::Committed {
                        return Err(CommitError::Aborted(load.clone()));
                    }
                }
                Ok(outcome(summary, false, attached_now, started))
            }
            phase => unreachable!("the ledger's progress only grows: {phase:?} after publishing"),
        }
    }
}
