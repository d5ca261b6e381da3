//! Why a commit did not finish.

use super::*;

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
    /// Overwrite: the two tables of the swap are not where chpart leaves them.
    #[error("load {load}: the swap of {table} cannot go on: the new table (the shadow) is {new}, the table begin found under that name is {old}; something other than chpart dropped or renamed one of them. Nothing was swapped by this run; inspect both before retrying")]
    ExchangeBroken {
        /// The load.
        load: LoadId,
        /// The target.
        table: TableRef,
        /// Where the new table is.
        new: String,
        /// Where the old table is.
        old: String,
    },
    /// Overwrite: the swap did not settle within the rounds (commits racing for it).
    #[error("load {load}: the swap of {table} with its shadow did not settle (other commits of the load keep claiming it); re-run commit")]
    ExchangeStuck {
        /// The load.
        load: LoadId,
        /// The target.
        table: TableRef,
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
            CommitError::Stuck { .. }
            | CommitError::ExchangeStuck { .. }
            | CommitError::PendingMutations { .. } => FailureKind::Retryable,
            CommitError::Reclaim { source, .. } if source.is_transient() => FailureKind::Retryable,
            CommitError::Shard { source, .. } => source.kind(),
            CommitError::Unreachable { source, .. } if source.is_transient() => {
                FailureKind::Retryable
            }
            _ => FailureKind::Permanent,
        }
    }
}
