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

use crate::ledger::{
    kind, Decision, DecisionBody, LoadSpec, LoadState, LoadView, Mode, Visibility, DECISION_ENTRY,
};
use crate::observe::{
    crash_point, reclaim, table_parts, verify_part, ActivePart, ClaimCheck, TableParts, Verify,
    VerifyError,
};
use crate::snapshot::TableSnapshot;
use crate::store::{Ledger, LedgerStoreError};
use crate::FailureKind;

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
    pub reach: &'a dyn crate::cluster::Reach,
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

/// Why a commit did not finish. Nothing is made visible before the checks pass; a failure after
/// the plan is recorded is resumed by running `commit` again.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// A shard of a cluster load failed; nothing of a later phase ran on any shard.
    #[error("shard {shard_num} ({host}): {source}")]
    Shard {
        /// The shard's number.
        shard_num: u32,
        /// Its host.
        host: String,
        /// What went wrong there.
        source: Box<CommitError>,
    },
    /// A host's filesystem could not be reached.
    #[error("cannot reach the filesystem of {host}: {source}")]
    Unreachable {
        /// The host.
        host: String,
        /// Why.
        source: Box<chpart_remote::RemoteError>,
    },
    /// The winners of a cluster load are not valid cluster manifests of it.
    #[error("load {load}: the winners cannot be committed:\n  {}", problems.join("\n  "))]
    ClusterWinners {
        /// The load.
        load: LoadId,
        /// Every problem, by line.
        problems: Vec<String>,
    },
    /// Another commit of the cluster load recorded other winners first.
    #[error("load {load}: a commit with other winners recorded its plan first (recorded: {recorded}; given: {given}); re-run with the recorded winners, or without --winners to finish it")]
    ClusterPlanConflict {
        /// The load.
        load: LoadId,
        /// The recorded winners.
        recorded: String,
        /// The given winners.
        given: String,
    },
    /// A shard's sub-load, which is committed through its cluster load.
    #[error("load {load} is shard {shard_num} of cluster load {parent}: commit {parent} instead")]
    ShardOfCluster {
        /// The sub-load.
        load: LoadId,
        /// Its shard.
        shard_num: u32,
        /// The cluster load.
        parent: LoadId,
    },
    /// The load was never begun.
    #[error("load {0} was never begun")]
    NotBegun(LoadId),
    /// The load was aborted.
    #[error("load {0} is aborted: it cannot be committed")]
    Aborted(LoadId),
    /// `--visibility` differs from the load's.
    #[error(
        "load {load} was begun with visibility {begun}; --visibility {asked} cannot change it"
    )]
    VisibilityMismatch {
        /// The load.
        load: LoadId,
        /// At begin.
        begun: Visibility,
        /// Asked now.
        asked: Visibility,
    },
    /// The winners are not acceptable.
    #[error(transparent)]
    Winners(Box<WinnersError>),
    /// The winners differ from the plan a previous commit recorded.
    #[error("load {load}: a commit with other winners is already recorded: {conflict}")]
    PlanConflict {
        /// The load.
        load: LoadId,
        /// The first difference.
        conflict: Box<PlanConflict>,
    },
    /// Resuming without winners needs a recorded plan.
    #[error("load {load}: no commit plan is recorded yet, so there is nothing to resume: the first commit of a load needs --winners (the manifests collect() returned)")]
    NoPlan {
        /// The load.
        load: LoadId,
    },
    /// A plan recorded before plans kept their manifests cannot be resumed without winners.
    #[error("load {load}: its commit plan was recorded by an older chpart without the winners' manifests: resume it with --winners (the same file the first commit was given)")]
    PlanWithoutManifests {
        /// The load.
        load: LoadId,
    },
    /// `--verify server` needs a shadow table: with part visibility an attached part is visible.
    #[error("load {load} has part visibility: parts attach straight into {table}, so the server cannot check them before they are visible; use --verify full (the default) or sizes")]
    VerifyNeedsShadow {
        /// The load.
        load: LoadId,
        /// The target.
        table: TableRef,
    },
    /// The server found an attached part whose files do not match its checksums, or the
    /// shadow holds parts other than the plan's.
    #[error("load {load}: {problem} in the shadow table {table}; nothing of the load was made visible. Inspect the attempt's part (it may have been changed after it was built); abort the load and load again")]
    PartCorrupt {
        /// The load.
        load: LoadId,
        /// The shadow table.
        table: TableRef,
        /// What is wrong, naming the part.
        problem: String,
    },
    /// The recorded plan cannot be read.
    #[error("load {load}: the recorded plan: {error}")]
    Plan {
        /// The load.
        load: LoadId,
        /// Why.
        error: Box<PlanError>,
    },
    /// A published part differs from its manifest.
    #[error(transparent)]
    Verify(Box<VerifyError>),
    /// A winning part is not in detached/ (never published, or removed).
    #[error("load {load}: part {part} of attempt {attempt} (partition {partition}) is not in {table}'s detached/")]
    NotPublished {
        /// The load.
        load: LoadId,
        /// The part.
        part: String,
        /// Its attempt.
        attempt: AttemptId,
        /// Its Spark partition.
        partition: u32,
        /// The publish table.
        table: TableRef,
    },
    /// The table changed since `begin`.
    #[error("load {load}: table {table} changed since the load began (fingerprint {was} then, {now} now): the parts were built for the old definition")]
    TableChanged {
        /// The load.
        load: LoadId,
        /// The table.
        table: TableRef,
        /// At begin.
        was: String,
        /// Now.
        now: String,
    },
    /// The table has unfinished mutations, which attached parts could miss.
    #[error("load {load}: table {table} has {count} unfinished mutation(s) (system.mutations); wait for them before committing")]
    PendingMutations {
        /// The load.
        load: LoadId,
        /// The table.
        table: TableRef,
        /// How many.
        count: u64,
    },
    /// A part vanished without being attached.
    #[error(transparent)]
    PartLost(Box<PartLost>),
    /// A partition is in a state chpart cannot explain.
    #[error(transparent)]
    PartitionBroken(Box<PartitionBroken>),
    /// Another open replace load of the table has planned some of this load's partitions.
    #[error("load {load}: load {other} is open in replace mode on {table} and has planned partition(s) {} too; each would replace the other's rows. Nothing was replaced: finish or abort {other} first, then re-run commit", .partitions.join(", "))]
    ReplaceOverlap {
        /// The load.
        load: LoadId,
        /// The target table.
        table: TableRef,
        /// The other load.
        other: LoadId,
        /// The partitions both plan.
        partitions: Vec<String>,
    },
    /// A replace load's target partition holds rows from elsewhere.
    #[error(transparent)]
    ForeignPart(Box<ForeignPart>),
    /// Another process holds a part for too long.
    #[error("load {load}: part {part} stays claimed (detached/attaching_{part}) by an ATTACH that is still running, or that no server restart ended, or that chpart did not send (no attach intent); re-run commit later")]
    Stuck {
        /// The load.
        load: LoadId,
        /// The part.
        part: String,
    },
    /// Taking back a crashed ATTACH's claim failed.
    #[error("load {load}: part {part}: renaming {path} back to its name (a claim left by an ATTACH that died with its server): {source}")]
    Reclaim {
        /// The load.
        load: LoadId,
        /// The part.
        part: String,
        /// The leftover's path.
        path: String,
        /// The error.
        source: Box<chpart_remote::RemoteError>,
    },
    /// The load's spec cannot be committed by this chpart.
    #[error("load {load}: {message}")]
    Unsupported {
        /// The load.
        load: LoadId,
        /// Why.
        message: String,
    },
    /// Rows do not add up.
    #[error(transparent)]
    Rows(Box<RowMismatch>),
    /// A server call failed.
    #[error(transparent)]
    Server(Box<ServerError>),
    /// The ledger failed.
    #[error(transparent)]
    Ledger(#[from] LedgerStoreError),
}

impl From<ServerError> for CommitError {
    fn from(e: ServerError) -> Self {
        CommitError::Server(Box::new(e))
    }
}

impl CommitError {
    /// What the failure means for the caller.
    pub fn kind(&self) -> FailureKind {
        match self {
            CommitError::Aborted(_) => FailureKind::Fenced,
            CommitError::VisibilityMismatch { .. }
            | CommitError::VerifyNeedsShadow { .. }
            | CommitError::NoPlan { .. }
            | CommitError::ShardOfCluster { .. }
            | CommitError::PlanWithoutManifests { .. } => FailureKind::Usage,
            CommitError::Server(e) => crate::server_failure(e),
            CommitError::Ledger(e) => e.kind(),
            CommitError::Stuck { .. } | CommitError::PendingMutations { .. } => {
                FailureKind::Retryable
            }
            CommitError::Reclaim { source, .. } if source.is_transient() => FailureKind::Retryable,
            CommitError::Shard { source, .. } => source.kind(),
            CommitError::Unreachable { source, .. } if source.is_transient() => {
                FailureKind::Retryable
            }
            _ => FailureKind::Permanent,
        }
    }
}

fn recorded_plan(view: &LoadView) -> Result<Option<CommitPlan>, CommitError> {
    view.plan().map_err(|e| CommitError::Ledger(e.into()))
}

fn progress_of(view: &LoadView) -> Result<CommitProgress, CommitError> {
    view.progress().map_err(|e| CommitError::Ledger(e.into()))
}

fn committed_summary(view: &LoadView) -> Result<Option<CommitSummary>, CommitError> {
    view.body_of_kind(kind::LOAD_COMMITTED)
        .map_err(|e| CommitError::Ledger(e.into()))
}

fn summary_of(spec: &LoadSpec, plan: &CommitPlan) -> CommitSummary {
    CommitSummary {
        load: spec.load.clone(),
        table: spec.target.clone(),
        mode: spec.mode,
        visibility: spec.visibility,
        partitions: plan.partitions.len(),
        parts: plan.parts.len(),
        rows: plan.total_rows,
        winners: plan.winners.clone(),
    }
}

/// Each table still has the definition the parts were built for, and no mutation is pending
/// (two queries for all of them; a third reads the columns of a table whose `CREATE` statement
/// is no longer the snapshot's, since the definition may differ and the shape still match).
async fn check_tables(
    env: &CommitEnv<'_>,
    load: &LoadId,
    tables: &[(&TableRef, &TableSnapshot)],
) -> Result<(), CommitError> {
    let to_check: Vec<TableToCheck<'_>> = tables
        .iter()
        .map(|(t, snapshot)| TableToCheck {
            database: t.database.as_str(),
            table: t.table.as_str(),
            known_definition: Some(snapshot.create_table_query.as_str()),
        })
        .collect();
    let checks = env.server.check_tables(&to_check).await?;
    for ((table, snapshot), check) in tables.iter().zip(checks) {
        let changed = |now: String| CommitError::TableChanged {
            load: load.clone(),
            table: (*table).clone(),
            was: snapshot.fingerprint.to_string(),
            now,
        };
        let info = check
            .info
            .ok_or_else(|| changed("(table dropped)".into()))?;
        // Columns unread: the definition is the snapshot's, columns included.
        if let Some(columns) = &check.columns {
            let now = TableSnapshot::from_server(&info, columns);
            if now.fingerprint != snapshot.fingerprint {
                return Err(changed(now.fingerprint.to_string()));
            }
        }
        if check.pending_mutations > 0 {
            return Err(CommitError::PendingMutations {
                load: load.clone(),
                table: (*table).clone(),
                count: check.pending_mutations,
            });
        }
    }
    Ok(())
}

/// What a commit knows of its load's progress: the ledger as last read, plus the facts this
/// run established and has not written yet (attach outcomes, partitions found published, the
/// last MOVEs). The next ledger INSERT of the run carries them, so a commit writes the ledger
/// once per phase, not once per step. Losing them to a crash loses nothing: each one's intent
/// is recorded, and the next run decides it again from the server.
#[derive(Debug, Clone, Default)]
struct Progress {
    /// Recorded, or established by this run.
    known: CommitProgress,
    /// Established by this run, not yet written.
    unrecorded: Vec<CommitEntry>,
}

impl Progress {
    fn of(view: &LoadView) -> Result<Progress, CommitError> {
        Ok(Progress {
            known: progress_of(view)?,
            unrecorded: Vec::new(),
        })
    }

    /// The ledger as `view` shows it, plus what this run has not written yet.
    fn refresh(&mut self, view: &LoadView) -> Result<(), CommitError> {
        let mut known = progress_of(view)?;
        for entry in &self.unrecorded {
            known.record(entry.clone());
        }
        self.known = known;
        Ok(())
    }

    /// A fact this run established, written by its next ledger INSERT.
    fn note(&mut self, entry: CommitEntry) {
        self.known.record(entry.clone());
        self.unrecorded.push(entry);
    }

    /// `entries` (with their bodies) after every unrecorded fact, as ledger rows; the facts
    /// count as written from here on (a failed INSERT ends the run).
    fn rows_with_unrecorded(
        &mut self,
        entries: Vec<(CommitEntry, String)>,
    ) -> Vec<(String, &'static str, String)> {
        std::mem::take(&mut self.unrecorded)
            .into_iter()
            .map(|e| (e, "{}".to_owned()))
            .chain(entries)
            .map(|(e, body)| (e.id(), entry_kind(&e), body))
            .collect()
    }
}

/// The ledger kind of a commit entry.
fn entry_kind(entry: &CommitEntry) -> &'static str {
    match entry {
        CommitEntry::Plan => kind::COMMIT_PLANNED,
        CommitEntry::AttachIntent(_) => kind::ATTACH_INTENT,
        CommitEntry::Attached(_) => kind::PART_ATTACHED,
        CommitEntry::PublishIntent(_) => kind::PUBLISH_INTENT,
        CommitEntry::Published(_) => kind::PARTITION_PUBLISHED,
        CommitEntry::Commit => kind::LOAD_COMMITTED,
    }
}

/// Whether `progress` holds `entry`.
fn holds(progress: &CommitProgress, entry: &CommitEntry) -> bool {
    match entry {
        CommitEntry::Plan => true,
        CommitEntry::AttachIntent(p) => progress.attach_intents.contains(p),
        CommitEntry::Attached(p) => progress.attached.contains(p),
        CommitEntry::PublishIntent(p) => progress.publish_intents.contains(p),
        CommitEntry::Published(p) => progress.published.contains(p),
        CommitEntry::Commit => progress.committed,
    }
}

/// Writes `entries` and every fact `progress` has not written yet, in one ledger INSERT.
async fn record(
    env: &CommitEnv<'_>,
    load: &LoadId,
    progress: &mut Progress,
    entries: Vec<(CommitEntry, String)>,
) -> Result<(), CommitError> {
    for (entry, _) in &entries {
        progress.known.record(entry.clone());
    }
    let rows = progress.rows_with_unrecorded(entries);
    if !rows.is_empty() {
        env.ledger.append_many(load, &rows).await?;
    }
    Ok(())
}

/// Writes the load's one `fact` (its plan or its decision: `(entry id, kind, body)`, sent with
/// that fact's deduplication token, see [`Ledger::append_once_with`]) with `riders` and every
/// fact `progress` has not written yet in one INSERT, then reads the load back: `accept`
/// judges the view (whose plan or decision the server kept) and its answer is returned; once
/// accepted, riders the view lacks (the server kept another writer's block) are written on
/// their own, so each is durable before this returns, as its step needs (an intent before its
/// ATTACH or MOVE).
async fn record_once<T>(
    env: &CommitEnv<'_>,
    load: &LoadId,
    progress: &mut Progress,
    fact: (&str, &'static str, String),
    riders: Vec<(CommitEntry, String)>,
    crash_after: &str,
    accept: impl FnOnce(&LoadView) -> Result<T, CommitError>,
) -> Result<T, CommitError> {
    let (entry_id, fact_kind, body) = fact;
    let carried: Vec<(CommitEntry, String)> = progress
        .unrecorded
        .iter()
        .map(|e| (e.clone(), "{}".to_owned()))
        .chain(riders.iter().cloned())
        .collect();
    let mut rows = vec![(entry_id.to_owned(), fact_kind, body)];
    rows.extend(progress.rows_with_unrecorded(riders));
    env.ledger.append_once_with(load, entry_id, &rows).await?;
    crash_point(crash_after);
    let view = env.ledger.view(load, crate::KNOWN_KINDS).await?;
    let accepted = accept(&view)?;
    // What the ledger holds now, and then everything carried (written, by now, one way or
    // the other: nothing is left unrecorded).
    let mut known = progress_of(&view)?;
    let missing: Vec<(String, &str, String)> = carried
        .iter()
        .filter(|(e, _)| !holds(&known, e))
        .map(|(e, body)| (e.id(), entry_kind(e), body.clone()))
        .collect();
    if !missing.is_empty() {
        env.ledger.append_many(load, &missing).await?;
    }
    for (entry, _) in carried {
        known.record(entry);
    }
    progress.known = known;
    Ok(accepted)
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
                let recorded = recorded_plan(&view)?
                    .ok_or_else(|| CommitError::NoPlan { load: load.clone() })?;
                let lines = recorded
                    .winner_lines()
                    .ok_or_else(|| CommitError::PlanWithoutManifests { load: load.clone() })?;
                validate_winners(&load, &expected, &lines, None, true)
            }
        }
        .map_err(|e| CommitError::Winners(Box::new(e)))?;
        let new_plan = CommitPlan::from_winners(&winners, spec.visibility, spec.mode);

        // Nothing becomes visible unless the tables are as the parts expect and every part
        // still waiting in detached/ is exactly what its manifest says.
        let mut tables = vec![(&spec.publish, &spec.publish_snapshot)];
        if spec.publish != spec.target {
            tables.push((&spec.target, &spec.target_snapshot));
        }
        check_tables(env, &load, &tables).await?;
        let progress = Progress::of(&view)?;
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
        let (plan, plan_recorded) = match recorded_plan(&view)? {
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
            crate::begin::stop_merges(env.server, &self.spec.publish).await?;
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

/// Checks every winning part that is still waiting in detached/ against its manifest.
///
/// A winning part found neither in `detached/` nor held by an ATTACH is only "not published"
/// if a ledger read made after this observation records no attach of it: `progress` may be
/// older than a concurrent commit that attached it meanwhile.
async fn verify_waiting_parts(
    env: &CommitEnv<'_>,
    spec: &LoadSpec,
    winners: &Winners,
    progress: &CommitProgress,
    verify: Verify,
) -> Result<TableParts, CommitError> {
    let observed = table_parts(env.server, &spec.publish).await?;
    // The parts waiting in detached/ are read first, all at once (over several connections
    // when there are many), then judged in the manifests' order as before: the first problem
    // in that order is the one reported, however the reads were spread.
    let waiting: Vec<(&Manifest, &PartEntry)> = winners
        .manifests()
        .values()
        .flat_map(|m| m.parts.iter().map(move |part| (m, part)))
        .filter(|(_, part)| {
            !progress.attached.contains(&part.name)
                && !progress.attach_intents.contains(&part.name)
                && observed.detached.contains(&part.name.to_string())
        })
        .collect();
    let mut verified: HashMap<&PartName, Result<(), VerifyError>> =
        tokio::task::block_in_place(|| verify_parts(env, &waiting, verify));
    let mut fresh: Option<CommitProgress> = None;
    for manifest in winners.manifests().values() {
        for part in &manifest.parts {
            let name = part.name.to_string();
            let handled = |p: &CommitProgress| {
                p.attached.contains(&part.name) || p.attach_intents.contains(&part.name)
            };
            let not_published = || CommitError::NotPublished {
                load: spec.load.clone(),
                part: name.clone(),
                attempt: manifest.attempt.id.clone(),
                partition: manifest.attempt.partition,
                table: spec.publish.clone(),
            };
            if handled(progress) {
                continue;
            }
            if !observed.detached.contains(&name) {
                if observed.attaching.contains(&name) {
                    continue; // an ATTACH holds it: decided later
                }
                if fresh.is_none() {
                    fresh = Some(progress_of(
                        &env.ledger.view(&spec.load, crate::KNOWN_KINDS).await?,
                    )?);
                }
                if fresh.as_ref().is_some_and(handled) {
                    continue; // a concurrent commit attached it: decided later
                }
                return Err(not_published());
            }
            // Read above with every part waiting in detached/ (the same test as here); read
            // now should a part ever be judged that the reads above did not take.
            let result = verified.remove(&part.name).unwrap_or_else(|| {
                tokio::task::block_in_place(|| {
                    verify_part(
                        env.fs,
                        manifest.data_path_of(part),
                        manifest.attempt.id.as_str(),
                        part,
                        verify,
                    )
                })
            });
            match result {
                Ok(()) => {}
                // Gone while it was being read: a concurrent commit's ATTACH took it (it
                // recorded its intent first). Decided like a part found gone, from a ledger
                // read made after it went.
                Err(VerifyError::Remote { source, .. })
                    if matches!(*source, chpart_remote::RemoteError::NotFound { .. }) =>
                {
                    let read =
                        progress_of(&env.ledger.view(&spec.load, crate::KNOWN_KINDS).await?)?;
                    let taken = handled(&read);
                    fresh = Some(read);
                    if !taken {
                        return Err(not_published());
                    }
                }
                Err(e) => return Err(CommitError::Verify(Box::new(e))),
            }
        }
    }
    Ok(observed)
}

/// Verifies each of `parts` (waiting in detached/) against its manifest entry: over `env.fs`
/// alone for a few parts, else over up to `MoreConnections::total` connections at once, each
/// taking the next part not yet taken. A connection that cannot be opened leaves the work to
/// the others (a warning says so). Reads stop early once one part has a problem other than
/// being gone.
fn verify_parts<'p>(
    env: &CommitEnv<'_>,
    parts: &[(&Manifest, &'p PartEntry)],
    verify: Verify,
) -> HashMap<&'p PartName, Result<(), VerifyError>> {
    let one = |fs: &dyn RemoteFs, (manifest, part): (&Manifest, &PartEntry)| {
        verify_part(
            fs,
            manifest.data_path_of(part),
            manifest.attempt.id.as_str(),
            part,
            verify,
        )
    };
    let more = match env.more {
        Some(more) if more.total > 1 && parts.len() >= PARALLEL_VERIFY_MIN => {
            let wanted = (more.total - 1).min(parts.len() - 1);
            match more.reach.connect(more.host, wanted) {
                Ok(connections) => connections,
                Err(e) => {
                    tracing::warn!(
                        "verifying {} parts over one connection: opening {wanted} more to {} failed: {e}",
                        parts.len(),
                        more.host
                    );
                    Vec::new()
                }
            }
        }
        _ => Vec::new(),
    };
    let connections: Vec<&dyn RemoteFs> = std::iter::once(env.fs)
        .chain(more.iter().map(|c| c.as_ref()))
        .collect();
    read_in_turn(&connections, parts, one)
}

/// Reads `parts` over `connections`, each taking the next part not yet taken (in `parts`'
/// order) until none is left or one part has a problem other than being gone. Every part
/// before that one was taken first and is read whole, so the judging, in that order, reaches
/// the problem before any part left unread. One connection reads on the calling thread.
fn read_in_turn<'p>(
    connections: &[&dyn RemoteFs],
    parts: &[(&Manifest, &'p PartEntry)],
    one: impl Fn(&dyn RemoteFs, (&Manifest, &PartEntry)) -> Result<(), VerifyError> + Sync,
) -> HashMap<&'p PartName, Result<(), VerifyError>> {
    use std::sync::atomic::Ordering::SeqCst;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let results = std::sync::Mutex::new(HashMap::new());
    let worker = |fs: &dyn RemoteFs| {
        while !stop.load(SeqCst) {
            let Some(&(manifest, part)) = parts.get(next.fetch_add(1, SeqCst)) else {
                break;
            };
            let result = one(fs, (manifest, part));
            if matches!(&result, Err(e) if !is_gone(e)) {
                stop.store(true, SeqCst);
            }
            results
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(&part.name, result);
        }
    };
    match connections {
        [fs] => worker(*fs),
        _ => std::thread::scope(|scope| {
            for &fs in connections {
                let worker = &worker;
                scope.spawn(move || worker(fs));
            }
        }),
    }
    results.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// The part went away while it was read (a concurrent commit's ATTACH took it).
fn is_gone(e: &VerifyError) -> bool {
    matches!(e, VerifyError::Remote { source, .. }
        if matches!(**source, chpart_remote::RemoteError::NotFound { .. }))
}

/// Attaches every planned part not yet attached; returns how many this call attached itself.
///
/// Each round observes the table once (the first round may take `first`, an observation made
/// before the ledger reads it decides from), decides every part, records the intents of a batch in
/// one ledger INSERT (with the plan or the decision when one is due, and with the outcomes of the
/// batch before), and sends that batch's ATTACHes a few at a time. Their outcomes are noted and
/// written by the commit's next INSERT: a part still costs one ATTACH, but the ledger costs one
/// write per batch, not per part. A crash anywhere in between leaves intents whose parts are
/// either still in detached/ (attached on resume) or gone without a leftover (recorded as
/// attached on resume); a server killed inside an ATTACH leaves `attaching_<part>`, taken back
/// once nothing holds it.
async fn attach_parts(
    env: &CommitEnv<'_>,
    p: &mut Planned,
    mut first: Option<TableParts>,
) -> Result<usize, CommitError> {
    let server = env.server;
    let (spec, plan) = (p.spec.clone(), p.plan.clone());
    let (spec, plan) = (&spec, &plan);
    let mut attached = 0;
    // Parts whose ATTACH failed in the previous round, with the error: decided from this
    // round's observation (see `after_failed_attach`).
    let mut failed: Vec<(chpart_core::PartName, ServerError)> = Vec::new();
    for round in 0..MAX_ROUNDS {
        let observed = match first.take() {
            Some(observed) => observed,
            None => table_parts(server, &spec.publish).await?,
        };
        for (part, error) in failed.drain(..) {
            let name = part.to_string();
            let left = !observed.detached.contains(&name) || observed.attaching.contains(&name);
            if after_failed_attach(left, error.class(false)) == AfterFailedAttach::Fail {
                return Err(error.into());
            }
            tracing::warn!(
                "ATTACH PART {part}: {error}; deciding again from what the server shows"
            );
        }
        // A leftover is judged by what the server says after this observation (see
        // `claim_crashed`); asked only when there is one to judge.
        let leftover = plan.parts.iter().any(|part| {
            !p.progress.known.attached.contains(&part.name)
                && observed.attaching.contains(&part.name.to_string())
        });
        let claims = match leftover {
            true => Some(ClaimCheck::read(server, &spec.publish).await?),
            false => None,
        };
        // Decide from the ledger as last read; a part that looks lost is decided again from
        // a ledger read made after this observation.
        let mut fresh = false;
        let steps = loop {
            let steps: Vec<(&chpart_core::commit::PlannedPart, PartStep)> = plan
                .parts
                .iter()
                .map(|part| {
                    let name = part.name.to_string();
                    let progress = &p.progress.known;
                    let facts = PartFacts {
                        recorded_attached: progress.attached.contains(&part.name),
                        attach_intent: progress.attach_intents.contains(&part.name),
                        in_detached: observed.detached.contains(&name),
                        attaching_leftover: observed.attaching.contains(&name),
                        ledger_read_after_observation: fresh,
                        claim_predates_server_start: claims.is_some_and(|c| {
                            observed
                                .attaching_modified
                                .get(&name)
                                .is_some_and(|m| c.predates_server_start(*m))
                        }),
                        attach_running: claims.is_some_and(|c| c.attach_running),
                    };
                    (part, decide_part(&facts))
                })
                .collect();
            if fresh || !steps.iter().any(|(_, s)| *s == PartStep::ReadLedger) {
                break steps;
            }
            p.progress
                .refresh(&env.ledger.view(&spec.load, crate::KNOWN_KINDS).await?)?;
            fresh = true;
        };
        let mut waiting = None;
        let mut vanished = Vec::new();
        let mut to_attach = Vec::new();
        let mut to_reclaim = Vec::new();
        for (part, step) in steps {
            match step {
                PartStep::Skip => {}
                PartStep::RecordAttached => vanished.push(CommitEntry::Attached(part.name.clone())),
                PartStep::Attach => to_attach.push(part.name.clone()),
                PartStep::Wait => waiting = Some(part.name.to_string()),
                PartStep::Reclaim => to_reclaim.push(part.name.clone()),
                PartStep::ReadLedger => unreachable!("decided again from a fresh ledger read"),
                PartStep::Lost => {
                    return Err(CommitError::PartLost(Box::new(PartLost::new(plan, part))))
                }
            }
        }
        for entry in vanished {
            p.progress.note(entry);
        }
        for part in &to_reclaim {
            let data_path = p
                .data_paths
                .get(part)
                .ok_or_else(|| CommitError::Unsupported {
                    load: spec.load.clone(),
                    message: format!("planned part {part} is in no winning manifest"),
                })?;
            let taken =
                tokio::task::block_in_place(|| reclaim(env.fs, data_path, part)).map_err(|e| {
                    CommitError::Reclaim {
                        load: spec.load.clone(),
                        part: part.to_string(),
                        path: chpart_core::attaching_part_path(data_path, part).to_string(),
                        source: Box::new(e),
                    }
                })?;
            if taken {
                tracing::warn!(
                    "part {part}: took back detached/attaching_{part}, claimed by an ATTACH that died with the server (restarted since); attaching it again"
                );
            }
        }
        for batch in to_attach.chunks(ATTACH_BATCH) {
            p.record_attach_intents(env, batch).await?;
            let (done, errors) = attach_batch(server, spec, batch).await;
            attached += done.len();
            for part in done {
                p.progress.note(CommitEntry::Attached(part));
            }
            if let Some((part, _)) = errors.first() {
                waiting = Some(part.to_string());
            }
            failed.extend(errors);
        }
        // Parts taken back are attached by the next round, at once.
        let reclaimed = to_reclaim.first().map(ToString::to_string);
        match waiting.or(reclaimed.clone()) {
            None => return Ok(attached),
            Some(part) if round + 1 == MAX_ROUNDS => {
                return Err(CommitError::Stuck {
                    load: spec.load.clone(),
                    part,
                })
            }
            Some(_) if reclaimed.is_some() => {}
            Some(_) => tokio::time::sleep(ROUND_PAUSE).await,
        }
    }
    unreachable!("the loop returns by its last round")
}

/// Sends `ATTACH PART` for each part, [`ATTACH_CONCURRENCY`] at a time (no new ones after the
/// first error). Returns the parts attached and the parts whose ATTACH failed, with the error.
/// A failed ATTACH is never resent blindly: its outcome is decided by the next observation
/// ([`after_failed_attach`]).
async fn attach_batch(
    server: &dyn ClickHouseServer,
    spec: &LoadSpec,
    batch: &[chpart_core::PartName],
) -> (
    Vec<chpart_core::PartName>,
    Vec<(chpart_core::PartName, ServerError)>,
) {
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    let mut pending = batch.iter();
    // Concurrent in this task (no spawn): the requests are I/O, and `server` is borrowed.
    let mut running = futures_util::stream::FuturesUnordered::new();
    loop {
        while running.len() < ATTACH_CONCURRENCY && failed.is_empty() {
            let Some(part) = pending.next() else { break };
            crash_point("before-attach");
            let (db, name) = (&spec.publish.database, &spec.publish.table);
            running.push(async move {
                let step = step_of(spec, "commit.attach_part").part(part);
                let result = server
                    .attach_part(db.as_str(), name.as_str(), &part.to_string())
                    .await;
                (part.clone(), step.end(result))
            });
        }
        let Some((part, result)) = futures_util::StreamExt::next(&mut running).await else {
            break;
        };
        match result {
            Ok(()) => {
                crash_point("after-attach");
                done.push(part);
            }
            Err(e) => failed.push((part, e)),
        }
    }
    (done, failed)
}

/// What a failed ATTACH means, once the table has been observed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterFailedAttach {
    /// Decide the part again from the observation: it may have been attached (by this ATTACH,
    /// which the answer did not confirm, or by a concurrent commit), be held by an ATTACH in
    /// flight, or still wait in `detached/` after a transient fault.
    DecideAgain,
    /// The server refused this part itself: report the error.
    Fail,
}

/// A failed ATTACH whose part has left `detached/` (claimed: `attaching_<part>`, or gone) was
/// racing another ATTACH of it (`Code: 233 ... not found`, or `Code: 1001 ... rename: No such
/// file or directory` when two claims cross) or may have succeeded without the answer getting
/// back: the observation decides, whatever the error. A part still waiting in `detached/` was
/// not claimed by anyone: a transient fault or an unknown outcome (the connection broke before
/// the server got to it) means trying again; any other error is the server refusing the part.
fn after_failed_attach(left_detached: bool, class: chpart_server::ErrorClass) -> AfterFailedAttach {
    use chpart_server::ErrorClass::{Permanent, Transient, Unknown};
    match (left_detached, class) {
        (true, _) | (false, Transient | Unknown) => AfterFailedAttach::DecideAgain,
        (false, Permanent) => AfterFailedAttach::Fail,
    }
}

/// After attaching into a shadow table: its rows per partition are exactly the plan's (the
/// shadow holds nothing else). With part visibility the target holds other rows too; there each
/// part was checked before its ATTACH, so once this run knows every part attached there is
/// nothing to observe.
///
/// The table is observed first, and the check uses this run's progress: the ledger as last
/// read plus what it attached. A concurrent commit records its `publish:` intent before it
/// moves a partition out of the shadow, so a partition moved before this observation can make
/// that progress look short of rows; then the ledger is read (after the observation) and the
/// check made again, excluding it. Returns the observation, for the first publish round.
async fn reconcile_attached(
    env: &CommitEnv<'_>,
    p: &mut Planned,
) -> Result<Option<TableParts>, CommitError> {
    let all_attached = |known: &CommitProgress| {
        p.plan
            .parts
            .iter()
            .all(|part| known.attached.contains(&part.name))
    };
    if p.spec.visibility == Visibility::Part && all_attached(&p.progress.known) {
        return Ok(None);
    }
    let observed = table_parts(env.server, &p.spec.publish).await?;
    // Decided from this run's progress; when that falls short (a part not known attached, or
    // a shadow that does not add up), once more from a ledger read made after the observation.
    let mut fresh = false;
    let pending = loop {
        if all_attached(&p.progress.known) {
            if p.spec.visibility == Visibility::Part {
                return Ok(Some(observed));
            }
            match check_shadow(&p.spec, &p.plan, &p.progress.known, &observed) {
                Ok(pending) => break pending,
                Err(e) if fresh => return Err(e),
                Err(_) => {}
            }
        } else if fresh {
            return Ok(Some(observed));
        }
        let view = env.ledger.view(&p.spec.load, crate::KNOWN_KINDS).await?;
        p.progress.refresh(&view)?;
        fresh = true;
    };
    if p.verify == Verify::Server && pending {
        // ... and every file of every part matches its `checksums.txt`.
        let (db, table) = (
            p.spec.publish.database.as_str(),
            p.spec.publish.table.as_str(),
        );
        let checks = env.server.check_parts(db, table).await?;
        if let Some(bad) = checks.iter().find(|c| !c.is_passed) {
            return Err(CommitError::PartCorrupt {
                load: p.spec.load.clone(),
                table: p.spec.publish.clone(),
                problem: format!(
                    "the server's CHECK TABLE fails part {}: {}",
                    bad.part_path, bad.message
                ),
            });
        }
    }
    Ok(Some(observed))
}

/// The shadow's partitions that `progress` shows neither published nor intended are exactly
/// the plan's, by rows and by each part's hash; returns whether there is any such partition.
fn check_shadow(
    spec: &LoadSpec,
    plan: &CommitPlan,
    progress: &CommitProgress,
    observed: &TableParts,
) -> Result<bool, CommitError> {
    let rows: BTreeMap<PartitionId, u64> = plan
        .partitions
        .iter()
        .filter(|p| {
            !progress.published.contains(&p.partition_id)
                && !progress.publish_intents.contains(&p.partition_id)
        })
        .map(|p| {
            (
                p.partition_id.clone(),
                observed
                    .rows_by_partition
                    .get(p.partition_id.as_str())
                    .copied()
                    .unwrap_or(0),
            )
        })
        .collect();
    let pending = CommitPlan {
        partitions: plan
            .partitions
            .iter()
            .filter(|p| rows.contains_key(&p.partition_id))
            .cloned()
            .collect(),
        ..plan.clone()
    };
    reconcile_rows(&pending, &rows).map_err(|e| CommitError::Rows(Box::new(e)))?;
    // The shadow's parts are exactly the plan's: each one's `checksums.txt` is the builder's.
    // Merges of the shadow are stopped until its partitions are published, but a server
    // restart lifts that until the next commit run stops them again: a partition merged
    // meanwhile has lost its parts' identity (the rows above and the server's CHECK TABLE
    // still hold for it).
    let (merged, unmerged): (Vec<_>, Vec<_>) = pending
        .partitions
        .iter()
        .cloned()
        .partition(|p| observed.merged_partitions.contains(p.partition_id.as_str()));
    for p in &merged {
        tracing::warn!(
            "load {}: partition {} of the shadow {} was merged by the server (merges restart with the server); its parts are checked by rows and CHECK TABLE, not by their hashes",
            spec.load,
            p.partition_id,
            spec.publish
        );
    }
    let observed_hashes: BTreeMap<PartitionId, Vec<String>> = unmerged
        .iter()
        .map(|p| {
            let pid = p.partition_id.as_str();
            let hashes = observed.hashes_by_partition.get(pid).cloned();
            (p.partition_id.clone(), hashes.unwrap_or_default())
        })
        .collect();
    let unmerged_plan = CommitPlan {
        partitions: unmerged,
        ..pending.clone()
    };
    reconcile_hashes(&unmerged_plan, &observed_hashes).map_err(|e| CommitError::PartCorrupt {
        load: spec.load.clone(),
        table: spec.publish.clone(),
        problem: e.to_string(),
    })?;
    Ok(!pending.partitions.is_empty())
}

/// Replace mode, before this load's first REPLACE of any partition: no other open replace load
/// of the table has planned one of its partitions (`begin` allows one open replace load per
/// table, but two begins racing both pass). Partitions already intended were checked before.
async fn check_replace_overlap(
    env: &CommitEnv<'_>,
    spec: &LoadSpec,
    plan: &CommitPlan,
    progress: &CommitProgress,
) -> Result<(), CommitError> {
    let mine: BTreeSet<PartitionId> = plan
        .partitions
        .iter()
        .map(|p| p.partition_id.clone())
        .filter(|id| !progress.publish_intents.contains(id))
        .collect();
    if mine.is_empty() {
        return Ok(());
    }
    let others = crate::begin::open_replace_loads(env.ledger, &spec.target, &spec.load).await?;
    match replace_overlap(&mine, &others) {
        None => Ok(()),
        Some((other, partitions)) => Err(CommitError::ReplaceOverlap {
            load: spec.load.clone(),
            table: spec.target.clone(),
            other,
            partitions: partitions.iter().map(ToString::to_string).collect(),
        }),
    }
}

/// Marks a MOVE among the publish statements (a REPLACE carries the target's highest block).
const MOVE: u64 = u64::MAX;

/// The recorded `publish:<id>` intents of a load, with the target's highest block number each
/// recorded (`None` for an intent without it: every part not a copy counts as arrived since).
fn replace_intents(view: &LoadView) -> Result<BTreeMap<PartitionId, Option<u64>>, CommitError> {
    let mut out = BTreeMap::new();
    for e in &view.entries {
        if let Ok(Some(CommitEntry::PublishIntent(id))) = CommitEntry::parse(&e.entry_id) {
            let body: serde_json::Value =
                crate::ledger::body_of(e).map_err(|err| CommitError::Ledger(err.into()))?;
            out.insert(id, body.get("target_max_block").and_then(|b| b.as_u64()));
        }
    }
    Ok(out)
}

/// What of a replace load's target partition cannot be explained by its REPLACE.
struct Arrived<'a> {
    /// The first part that is neither a copy of the shadow's nor covers only blocks handed
    /// out before the intent (see `PartitionFacts::target_foreign`).
    first: Option<&'a ActivePart>,
    /// Every such part is a merge, no old part is left and the rows are the plan's.
    merged_plan: bool,
}

fn arrived_since_intent<'a>(
    target: &'a [ActivePart],
    shadow_hashes: &[String],
    intent_max_block: Option<u64>,
    planned_rows: u64,
) -> Arrived<'a> {
    let copy = |p: &ActivePart| shadow_hashes.contains(&p.hash);
    let old = |p: &ActivePart| intent_max_block.is_some_and(|m| p.max_block <= m);
    let mut arrived = target.iter().filter(|p| !copy(p) && !old(p)).peekable();
    let first = arrived.peek().copied();
    let merges_only = arrived.all(|p| p.level > 0);
    Arrived {
        first,
        merged_plan: merges_only
            && !target.iter().any(|p| !copy(p) && old(p))
            && target.iter().map(|p| p.rows).sum::<u64>() == planned_rows,
    }
}

/// Moves (append) or swaps in (replace) each partition from the shadow into the target.
///
/// `observed` is reconcile's observation of the shadow, used for the first round instead of
/// observing again. The first round's intents go with the load's decision when this commit
/// has not won it yet (nothing is visible before). The `published:` entries of partitions
/// moved are noted in `p.progress` and written by the commit's next INSERT (a crash before
/// that leaves their `publish:` intents, and resume confirms them by observing the shadow).
async fn publish_partitions(
    env: &CommitEnv<'_>,
    p: &mut Planned,
    mut observed: Option<TableParts>,
) -> Result<(), CommitError> {
    let server = env.server;
    let (spec, plan) = (p.spec.clone(), p.plan.clone());
    let (spec, plan) = (&spec, &plan);
    let shadow = quote_table(spec.publish.database.as_str(), spec.publish.table.as_str());
    let target = quote_table(spec.target.database.as_str(), spec.target.table.as_str());
    for round in 0..MAX_ROUNDS {
        let in_shadow = match observed.take() {
            Some(observed) => observed,
            None => table_parts(server, &spec.publish).await?,
        };
        let in_target = match spec.mode {
            Mode::Replace => Some(table_parts(server, &spec.target).await?),
            Mode::Append => None,
        };
        // Replace: the intents (and the blocks the target had handed out when each was
        // recorded), read after the observation, so an intent missing here means no REPLACE
        // of that partition had been sent before it.
        let intents = match spec.mode {
            Mode::Replace => {
                replace_intents(&env.ledger.view(&spec.load, crate::KNOWN_KINDS).await?)?
            }
            Mode::Append => BTreeMap::new(),
        };
        let mut confirmed = Vec::new();
        let mut statements = Vec::new();
        for partition in &plan.partitions {
            let pid = partition.partition_id.as_str();
            let shadow_hashes = in_shadow.hashes_by_partition.get(pid);
            let target_parts = in_target
                .as_ref()
                .and_then(|t| t.parts_by_partition.get(pid))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let intent = intents.get(&partition.partition_id);
            let arrived = arrived_since_intent(
                target_parts,
                shadow_hashes.map(Vec::as_slice).unwrap_or_default(),
                intent.copied().flatten(),
                partition.rows,
            );
            let facts = PartitionFacts {
                recorded_published: p.progress.known.published.contains(&partition.partition_id),
                shadow_rows: in_shadow.rows_by_partition.get(pid).copied().unwrap_or(0),
                planned_rows: partition.rows,
                target_has_plan_hashes: in_target.as_ref().is_some_and(|t| {
                    shadow_hashes.is_some() && t.hashes_by_partition.get(pid) == shadow_hashes
                }),
                publish_intent: intent.is_some(),
                target_foreign: arrived.first.is_some(),
                target_merged_plan: arrived.merged_plan,
            };
            let id = partition.partition_id.clone();
            // Replace: the blocks the target partition has handed out so far, for the intent.
            let max_block = target_parts.iter().map(|p| p.max_block).max().unwrap_or(0);
            match decide_partition(spec.mode, &facts) {
                PartitionStep::Skip => {}
                PartitionStep::RecordPublished => confirmed.push(CommitEntry::Published(id)),
                PartitionStep::Move => statements.push((
                    id,
                    MOVE,
                    format!(
                        "ALTER TABLE {shadow} MOVE PARTITION ID {} TO TABLE {target}",
                        quote_str(pid)
                    ),
                )),
                PartitionStep::Replace => statements.push((
                    id,
                    max_block,
                    format!(
                        "ALTER TABLE {target} REPLACE PARTITION ID {} FROM {shadow}",
                        quote_str(pid)
                    ),
                )),
                PartitionStep::Foreign => {
                    let part = arrived.first.expect("decided from a foreign part");
                    return Err(CommitError::ForeignPart(Box::new(ForeignPart {
                        load: spec.load.clone(),
                        partition_id: partition.partition_id.clone(),
                        part: part.name.clone(),
                        hash: part.hash.clone(),
                        rows: part.rows,
                    })));
                }
                PartitionStep::Broken => {
                    return Err(CommitError::PartitionBroken(Box::new(
                        PartitionBroken::new(plan, &partition.partition_id, &facts),
                    )))
                }
            }
        }
        for entry in confirmed {
            p.progress.note(entry);
        }
        let again = !statements.is_empty();
        // A replace intent's body holds the target partition's highest block number so far:
        // whatever covers a higher one and is not a copy of the shadow's arrived since.
        let intents: Vec<(CommitEntry, String)> = statements
            .iter()
            .map(|(id, max_block, _)| {
                let body = match *max_block {
                    MOVE => "{}".to_owned(),
                    max => serde_json::json!({ "target_max_block": max }).to_string(),
                };
                (CommitEntry::PublishIntent(id.clone()), body)
            })
            .collect();
        if !p.decided {
            p.decide(env, intents).await?;
        } else if !intents.is_empty() {
            record(env, &spec.load, &mut p.progress, intents).await?;
        }
        let mut unconfirmed = false;
        for (id, max_block, sql) in statements {
            let is_move = max_block == MOVE;
            crash_point("before-publish");
            let step = step_of(spec, "commit.publish_partition").partition(&id);
            step.end(server.execute(&sql).await)?;
            crash_point("after-publish");
            // A MOVE that returned has moved the partition; a REPLACE is confirmed by the next
            // observation (target hashes equal to the shadow's), since upstream it is not
            // crash-atomic.
            if is_move {
                p.progress.note(CommitEntry::Published(id));
            } else {
                unconfirmed = true;
            }
        }
        if !again || !unconfirmed {
            // Every partition is published now: no need to observe again.
            return Ok(());
        }
        if round + 1 == MAX_ROUNDS {
            break;
        }
    }
    Err(CommitError::Stuck {
        load: spec.load.clone(),
        part: "(a partition that does not settle)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chpart_server::ErrorClass::{Permanent, Transient, Unknown};

    #[test]
    fn after_failed_attach_table() {
        use AfterFailedAttach::*;
        // (situation, part left detached/ by the next observation, error class, decision)
        let rows = [
            (
                "a concurrent ATTACH claimed it first (233 not found)",
                true,
                Permanent,
                DecideAgain,
            ),
            (
                "two claims crossed (1001 rename: no such file)",
                true,
                Permanent,
                DecideAgain,
            ),
            (
                "timed out, but the server attached it",
                true,
                Unknown,
                DecideAgain,
            ),
            (
                "connection broke before the server got it",
                false,
                Unknown,
                DecideAgain,
            ),
            (
                "server busy (too many parts)",
                false,
                Transient,
                DecideAgain,
            ),
            (
                "the server refuses the part (bad checksums)",
                false,
                Permanent,
                Fail,
            ),
        ];
        for (row, left, class, want) in rows {
            assert_eq!(after_failed_attach(left, class), want, "{row}");
        }
    }
}
