//! The entry point: what each command does, for a load into one table on one server or into a
//! Distributed table over a cluster. The CLI calls these; they pick the single-table stages
//! ([`crate::begin`], [`crate::commit`], [`crate::cleanup`]) or the cluster layer
//! ([`crate::cluster`]) by what the ledger and the server say the table is.

use chpart_core::retry::{retry_async, Retry};
use chpart_core::{LoadId, StagingLayout};
use chpart_remote::RemoteFs;
use futures_util::future::BoxFuture;

use crate::begin::{BeginError, BeginOutcome, BeginRequest};
use crate::cleanup::{abort_on, AbortLoad, CleanupError, GcReport, Removal};
use crate::cluster::{begin_cluster, commit_cluster};
use crate::commit::{CommitEnv, CommitError, CommitOutcome, CommitRequest};
use crate::ledger::LoadSpec;
use crate::reach::Reach;
use crate::store::Ledger;

pub use crate::topology::{plan, HostPlan, PlanScope, Topology};

/// `begin` of any load: into a Distributed table ([`begin_cluster`]) or into one table on the
/// ledger's server ([`crate::begin::begin`]).
pub async fn begin_load(
    ledger: &Ledger,
    reach: &dyn Reach,
    req: &BeginRequest,
) -> Result<BeginOutcome, BeginError> {
    crate::events::Step::start(&req.load, "begin").end(begin_any(ledger, reach, req).await)
}

async fn begin_any(
    ledger: &Ledger,
    reach: &dyn Reach,
    req: &BeginRequest,
) -> Result<BeginOutcome, BeginError> {
    let (db, table) = (req.target.database.as_str(), req.target.table.as_str());
    match ledger.server().table_definition(db, table).await? {
        Some(seen) if seen.info.engine == "Distributed" => {
            begin_cluster(ledger, reach, req, &seen).await
        }
        seen => crate::begin::begin_seen(ledger, ledger.server(), req, seen).await,
    }
}

/// `commit` of any load: a cluster load ([`commit_cluster`]) or a load of one table
/// ([`crate::commit::commit`] with `env`). A shard's sub-load is committed through its cluster load only.
pub async fn commit_load(
    reach: &dyn Reach,
    env: &CommitEnv<'_>,
    req: CommitRequest,
) -> Result<CommitOutcome, CommitError> {
    let view = env.ledger.view(&req.load, crate::KNOWN_KINDS).await?;
    match view.spec.as_ref() {
        Some(spec) if spec.cluster.is_some() => commit_cluster(env.ledger, reach, req).await,
        Some(LoadSpec {
            shard_of: Some(of), ..
        }) => Err(CommitError::ShardOfCluster {
            load: req.load.clone(),
            shard_num: of.shard_num,
            parent: of.parent.clone(),
        }),
        _ => crate::commit::commit_viewed(env, req, view).await,
    }
}

/// [`commit_load`], run again after a retryable failure until `policy`'s deadline. A commit
/// resumes at any step (its plan, claims and progress are in the ledger, and every step starts
/// from a fresh observation of the servers), so running it again is how a MOVE whose answer
/// was lost, or a server that restarted mid-commit, is reconciled within one command: what
/// happened is read back, nothing is resent blindly. Other failures, and the last one after
/// the deadline, are returned.
pub async fn commit_load_retrying(
    reach: &dyn Reach,
    env: &CommitEnv<'_>,
    req: CommitRequest,
    policy: chpart_core::retry::RetryPolicy,
) -> Result<CommitOutcome, CommitError> {
    let log = |retry: Retry<'_, CommitError>| {
        let error = retry.error;
        tracing::warn!(
            "commit of load {}: resuming ({}) in {:.2} s after a retryable failure: {error}",
            req.load,
            retry.number,
            retry.wait.as_secs_f64()
        );
        tracing::info!(
            target: chpart_core::events::TARGET,
            load = req.load.as_str(),
            step = "retry",
            outcome = chpart_core::events::RETRYING,
            retry = retry.number,
            duration_ms = retry.wait.as_secs_f64() * 1e3,
            error = format!("commit: {error}"),
        );
    };
    let retryable = |e: &CommitError| e.kind() == crate::FailureKind::Retryable;
    retry_async(policy, retryable, log, tokio::time::sleep, || {
        commit_load(reach, env, req.clone())
    })
    .await
    .map_err(|failed| failed.error)
}

/// Aborts `load`: records it aborted (fencing every executor), then removes its parts from
/// detached/, its shadow table and its staging.
pub async fn abort(
    ledger: &Ledger,
    reach: &dyn Reach,
    fs: &dyn RemoteFs,
    staging: &StagingLayout,
    load: &LoadId,
) -> Result<Vec<Removal>, CleanupError> {
    abort_with(ledger, reach, fs, staging, load, false).await
}

/// gc of every finished load ([`crate::cleanup::gc`]); with `abort_stale`, open loads older
/// than `older_than_ms` are aborted as [`abort`] does (on every shard of a cluster load).
pub async fn gc(
    ledger: &Ledger,
    reach: &dyn Reach,
    fs: &dyn RemoteFs,
    staging: &StagingLayout,
    older_than_ms: Option<u64>,
    abort_stale: bool,
    dry_run: bool,
) -> Result<GcReport, CleanupError> {
    let aborter = Aborter {
        ledger,
        reach,
        fs,
        staging,
    };
    let aborter: Option<&dyn AbortLoad> = abort_stale.then_some(&aborter);
    crate::cleanup::gc(ledger, reach, fs, staging, older_than_ms, aborter, dry_run).await
}

/// [`abort`] for gc's stale loads.
struct Aborter<'a> {
    ledger: &'a Ledger,
    reach: &'a dyn Reach,
    fs: &'a dyn RemoteFs,
    staging: &'a StagingLayout,
}

impl AbortLoad for Aborter<'_> {
    fn abort<'a>(&'a self, load: &'a LoadId) -> BoxFuture<'a, Result<Vec<Removal>, CleanupError>> {
        Box::pin(abort(self.ledger, self.reach, self.fs, self.staging, load))
    }
}

/// [`abort`], or with `force` also a load a commit claimed (`abort --force`: for a commit
/// that can never finish, e.g. a planned part was deleted by hand). A forced abort ends the
/// load with a `load_abandoned` entry; rows the commit already made visible stay visible, and
/// a commit still running must be stopped first. A committed load is never aborted.
pub async fn abort_with(
    ledger: &Ledger,
    reach: &dyn Reach,
    fs: &dyn RemoteFs,
    staging: &StagingLayout,
    load: &LoadId,
    force: bool,
) -> Result<Vec<Removal>, CleanupError> {
    let step = crate::events::Step::start(load, "abort");
    match abort_load(ledger, reach, fs, staging, load, force).await {
        Ok(removed) => {
            step.counts(0, 0, removed.len() as u64, 0).ok();
            Ok(removed)
        }
        Err(e) => step.end(Err(e)),
    }
}

async fn abort_load(
    ledger: &Ledger,
    reach: &dyn Reach,
    fs: &dyn RemoteFs,
    staging: &StagingLayout,
    load: &LoadId,
    force: bool,
) -> Result<Vec<Removal>, CleanupError> {
    let view = ledger.view(load, crate::KNOWN_KINDS).await?;
    match view.spec.as_ref() {
        Some(spec) if spec.cluster.is_some() => {
            let per_shard = crate::cluster::abort_cluster(ledger, reach, spec, force).await?;
            return Ok(per_shard.into_iter().flat_map(|(_, r)| r).collect());
        }
        Some(LoadSpec {
            shard_of: Some(of), ..
        }) => {
            return Err(CleanupError::ShardOfCluster {
                load: load.clone(),
                shard_num: of.shard_num,
                parent: of.parent.clone(),
            })
        }
        _ => {}
    }
    abort_on(ledger, ledger.server(), fs, staging, load, force).await
}
