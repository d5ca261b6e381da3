//! `status`: what the ledger, the staging directories and the servers say about each load, and
//! what gc would still remove of it (read only: the removing is the parent module's).

use std::collections::BTreeMap;

use chpart_core::{LoadId, StagingLayout};
use chpart_remote::RemoteFs;
use serde::{Deserialize, Serialize};

use super::{clean_finished_load, CleanupError, Removal};
use crate::ledger::{body_of, kind, Decision, Entry, LoadState, LoadView};
use crate::reach::Reach;
use crate::staging::{disks_of, staged_attempts, staged_attempts_on_disks, Places, TAKEN_PREFIX};
use crate::store::{Ledger, LedgerStoreError, LOADS_PER_STATEMENT};

/// One load as `status` shows it (and as gc records a load it finished: its `gc_done` entry's
/// body, without attempts and `gc_pending`, which are then empty).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadStatus {
    /// The load.
    pub load: String,
    /// `open`, `committed`, `aborted`.
    pub state: String,
    /// Who claimed the load (`commit`, `abort`), if anyone did yet.
    pub decision: Option<String>,
    /// Target table.
    pub table: Option<String>,
    /// Append or replace.
    pub mode: Option<String>,
    /// Partition or part.
    pub visibility: Option<String>,
    /// When `begin` ran (ms since the epoch).
    pub opened_at_unix_ms: Option<u64>,
    /// When it was committed or aborted (ms since the epoch, server clock).
    pub finished_at_unix_ms: Option<i64>,
    /// Seconds from begin to commit/abort.
    pub duration_secs: Option<f64>,
    /// ClickHouse partitions in the commit plan.
    pub partitions: Option<usize>,
    /// Parts in the commit plan.
    pub parts_planned: Option<usize>,
    /// Parts recorded attached.
    pub parts_attached: usize,
    /// Rows in the commit plan.
    pub rows: Option<u64>,
    /// Winning attempt per Spark partition.
    pub winners: Vec<(u32, String)>,
    /// Attempts found in staging, with whether each won.
    pub attempts: Vec<AttemptStatus>,
    /// What gc would still remove.
    pub gc_pending: Vec<Removal>,
    /// For a load into a Distributed table: each shard's sub-load and its state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardStatus>,
    /// When gc recorded that it removed everything the finished load left (ms since the
    /// epoch, server clock); `status` of every load then shows what gc recorded.
    #[serde(default)]
    pub gc_done_at_unix_ms: Option<i64>,
}

/// One shard of a cluster load as `status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardStatus {
    /// The shard's number.
    pub shard_num: u32,
    /// Its host.
    pub host: String,
    /// Its sub-load (shown on its own too).
    pub load: String,
    /// The sub-load's state.
    pub state: String,
    /// ClickHouse partitions in its plan.
    pub partitions: Option<usize>,
    /// Parts in its plan.
    pub parts_planned: Option<usize>,
    /// Parts recorded attached.
    pub parts_attached: usize,
    /// Partitions recorded published (partition visibility).
    pub partitions_published: usize,
    /// Rows in its plan.
    pub rows: Option<u64>,
}

/// One attempt as `status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttemptStatus {
    /// The attempt id.
    pub attempt: String,
    /// It wrote its manifest.
    pub completed: bool,
    /// It is a winner.
    pub won: bool,
    /// Parts it published (per its intent).
    pub parts: usize,
}

/// The status of every load in the ledger (or of one). One load's is read from its entries
/// alone (an index range). Every load's: the loads gc recorded done as it recorded them (one
/// `gc_done` entry each), the others from their entries; never every entry of every load.
pub async fn status(
    ledger: &Ledger,
    reach: &dyn Reach,
    fs: &dyn RemoteFs,
    staging: &StagingLayout,
    only: Option<&LoadId>,
) -> Result<Vec<LoadStatus>, CleanupError> {
    let places = Places::new(ledger, reach, fs, staging);
    if let Some(load) = only {
        let view = ledger.view(load, crate::KNOWN_KINDS).await?;
        if view.entries.is_empty() {
            return Ok(Vec::new());
        }
        return Ok(vec![load_status(&places, load, &view, true).await?]);
    }
    let mut out = BTreeMap::new();
    for e in ledger.gc_done_entries().await? {
        out.insert(e.load_id.clone(), recorded_status(&e)?);
    }
    let unsettled = ledger.unsettled_loads().await?;
    let rest: Vec<String> = unsettled
        .loads
        .into_iter()
        .filter(|l| !out.contains_key(l))
        .collect();
    // A few loads' entries in memory at a time (a first status of a large ledger gc has not
    // been through reads them all).
    for chunk in rest.chunks(LOADS_PER_STATEMENT) {
        for (load_id, view) in ledger.views(chunk).await? {
            let Ok(load) = load_id.parse::<LoadId>() else {
                continue;
            };
            out.insert(load_id, load_status(&places, &load, &view, true).await?);
        }
    }
    Ok(out.into_values().collect())
}

/// The status gc recorded in a `gc_done` entry.
fn recorded_status(e: &Entry) -> Result<LoadStatus, CleanupError> {
    let mut status: LoadStatus = body_of(e).map_err(LedgerStoreError::from)?;
    status.gc_done_at_unix_ms = Some(e.written_at_ms);
    Ok(status)
}

/// The load's status from its entries; with `probe`, also its attempts in staging and what gc
/// would still remove (filesystems and servers), else those are empty.
pub(super) async fn load_status(
    places: &Places<'_>,
    load: &LoadId,
    view: &LoadView,
    probe: bool,
) -> Result<LoadStatus, CleanupError> {
    if let (None, Some(done)) = (&view.spec, view.gc_done()) {
        // Pruned (`chpart ledger prune`): what gc recorded is all there is.
        return recorded_status(done);
    }
    let plan = view.plan().map_err(LedgerStoreError::from)?;
    let progress = view.progress().map_err(LedgerStoreError::from)?;
    let finished_at = view
        .entries
        .iter()
        .find(|e| {
            e.kind == kind::LOAD_COMMITTED
                || e.kind == kind::LOAD_ABORTED
                || e.kind == kind::LOAD_ABANDONED
        })
        .map(|e| e.written_at_ms);
    let winners: Vec<(u32, String)> = plan
        .as_ref()
        .map(|p| p.winners.iter().map(|(n, a)| (*n, a.to_string())).collect())
        .unwrap_or_default();
    let staged = match &view.spec {
        _ if !probe => Vec::new(),
        Some(spec) if spec.cluster.is_some() => Vec::new(), // its shards' sub-loads have them
        Some(spec) => {
            let (_, fs, staging) = places.of(spec)?;
            let disks = disks_of(spec, &staging)?;
            tokio::task::block_in_place(|| staged_attempts_on_disks(fs.get(), &disks, load))?
        }
        None => tokio::task::block_in_place(|| staged_attempts(places.fs, places.staging, load))?,
    };
    let attempts = staged
        .iter()
        .filter(|a| !a.attempt.starts_with(TAKEN_PREFIX)) // being removed by gc
        .map(|a| AttemptStatus {
            attempt: a.attempt.clone(),
            completed: a.has_manifest,
            won: winners.iter().any(|(_, w)| *w == a.attempt),
            parts: a.parts.len(),
        })
        .collect();
    let gc_pending = match (&view.state, &view.spec) {
        (LoadState::Committed | LoadState::Aborted, Some(spec)) if probe => {
            let (server, fs, staging) = places.of(spec)?;
            clean_finished_load(server.as_ref(), fs.get(), &staging, spec, true).await?
        }
        _ => Vec::new(),
    };
    // A cluster load's plan and progress are its shards' sub-loads'.
    let mut shards = Vec::new();
    let mut gc_pending = gc_pending;
    if let Some(cluster) = view.spec.as_ref().and_then(|s| s.cluster.as_ref()) {
        for shard in &cluster.shards {
            let sub = places.ledger.view(&shard.load, crate::KNOWN_KINDS).await?;
            // What gc still has to remove of a cluster load is its shards'.
            if let (LoadState::Committed | LoadState::Aborted, Some(spec), true) =
                (&sub.state, &sub.spec, probe)
            {
                let (server, fs, staging) = places.of(spec)?;
                gc_pending.extend(
                    clean_finished_load(server.as_ref(), fs.get(), &staging, spec, true).await?,
                );
            }
            let plan = sub.plan().map_err(LedgerStoreError::from)?;
            let progress = sub.progress().map_err(LedgerStoreError::from)?;
            shards.push(ShardStatus {
                shard_num: shard.shard_num,
                host: shard.host.clone(),
                load: shard.load.to_string(),
                state: sub.state.as_str().to_owned(),
                partitions: plan.as_ref().map(|p| p.partitions.len()),
                parts_planned: plan.as_ref().map(|p| p.parts.len()),
                parts_attached: progress.attached.len(),
                partitions_published: progress.published.len(),
                rows: plan.as_ref().map(|p| p.total_rows),
            });
        }
    }
    let cluster_plan: Option<crate::shards::ClusterPlan> = view
        .body_of_kind(kind::CLUSTER_PLANNED)
        .map_err(LedgerStoreError::from)?;
    let sum = |f: fn(&ShardStatus) -> Option<u64>| -> Option<u64> {
        shards
            .iter()
            .map(f)
            .collect::<Option<Vec<u64>>>()
            .map(|v| v.iter().sum())
    };
    let (partitions, parts_planned, rows, parts_attached) = if shards.is_empty() {
        (
            plan.as_ref().map(|p| p.partitions.len()),
            plan.as_ref().map(|p| p.parts.len()),
            plan.as_ref().map(|p| p.total_rows),
            progress.attached.len(),
        )
    } else {
        (
            sum(|s| s.partitions.map(|n| n as u64)).map(|n| n as usize),
            sum(|s| s.parts_planned.map(|n| n as u64)).map(|n| n as usize),
            sum(|s| s.rows),
            shards.iter().map(|s| s.parts_attached).sum(),
        )
    };
    let winners = match &cluster_plan {
        Some(plan) => plan
            .winners
            .iter()
            .map(|(n, a)| (*n, a.to_string()))
            .collect(),
        None => winners,
    };
    let spec = view.spec.as_ref();
    Ok(LoadStatus {
        load: load.to_string(),
        state: view.state.as_str().to_owned(),
        decision: view.decision.map(|d| match d {
            Decision::Commit => "commit".to_owned(),
            Decision::Abort => "abort".to_owned(),
        }),
        table: spec.map(|s| s.target.to_string()),
        mode: spec.map(|s| s.mode.to_string()),
        visibility: spec.map(|s| s.visibility.to_string()),
        opened_at_unix_ms: spec.map(|s| s.opened_at_unix_ms),
        finished_at_unix_ms: finished_at,
        duration_secs: spec
            .zip(finished_at)
            .map(|(s, f)| (f as f64 - s.opened_at_unix_ms as f64) / 1000.0),
        partitions,
        parts_planned,
        parts_attached,
        rows,
        winners,
        attempts,
        gc_pending,
        shards,
        gc_done_at_unix_ms: view.gc_done().map(|e| e.written_at_ms),
    })
}
