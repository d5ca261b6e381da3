//! `chpart ledger prune`: the ledger's retention. Years of hourly loads leave every load's
//! entries behind (its spec, its plan with the winners' manifests, an intent and an outcome
//! per part and partition); no command needs them once gc has removed everything the load left
//! and recorded it done. Pruning deletes those entries of loads finished before a bound and
//! keeps a tombstone of each: the entries of [`TOMBSTONE_KINDS`], which settle its state by
//! replay exactly as all of its entries did (a unit test of `ledger` holds that), and gc's
//! summary of it. So a pruned load still fences a late build, refuses `begin` with exit 5 (its
//! id cannot be reused by mistake: a re-run of an old job would load its rows twice),
//! answers a re-run of its commit with its summary, and shows in `status`.
//!
//! Only loads gc recorded done are pruned (gc records only finished loads, after removing
//! everything they left), and each one's tombstone entries are replayed again first: an open
//! load is never pruned. gc's checkpoints older than the bound go too, all but the newest.

use serde::Serialize;

use crate::cleanup::LoadStatus;
use crate::ledger::{body_of, replay, TOMBSTONE_KINDS};
use crate::store::{Bodies, Ledger, LedgerStoreError};

/// What one prune did (or, with dry run, would do).
#[derive(Debug, Clone, Serialize)]
pub struct PruneReport {
    /// The bound: loads that finished before it (ms since the epoch).
    pub finished_before_unix_ms: i64,
    /// Loads whose entries were deleted (each keeps its tombstone).
    pub loads: Vec<String>,
    /// Entries deleted.
    pub entries: usize,
    /// Loads finished before the bound that were pruned before (only a tombstone is left).
    pub already_pruned: usize,
    /// gc checkpoints deleted.
    pub checkpoints: usize,
    /// Nothing was deleted: this is what would be.
    pub dry_run: bool,
}

/// Deletes the entries of every load that finished before `finished_before_unix_ms` (the
/// server's clock) and that gc recorded done, but its tombstone; with `dry_run` only reports.
/// Idempotent.
pub async fn prune(
    ledger: &Ledger,
    finished_before_unix_ms: i64,
    dry_run: bool,
) -> Result<PruneReport, LedgerStoreError> {
    let mut report = PruneReport {
        finished_before_unix_ms,
        loads: Vec::new(),
        entries: 0,
        already_pruned: 0,
        checkpoints: 0,
        dry_run,
    };
    // When each load finished is in gc's summary of it (the write time of its commit or
    // abort entry); one decided aborted without that entry finished before gc recorded it.
    let mut candidates = Vec::new();
    for done in ledger.gc_done_entries().await? {
        let status: LoadStatus = body_of(&done)?;
        let finished = status.finished_at_unix_ms.unwrap_or(done.written_at_ms);
        if finished < finished_before_unix_ms && candidates.last() != Some(&done.load_id) {
            candidates.push(done.load_id);
        }
    }
    for (load, entries) in ledger
        .entries_of(&candidates, Bodies::OfKinds(TOMBSTONE_KINDS))
        .await?
    {
        let (kept, pruned): (Vec<_>, Vec<_>) = entries
            .into_iter()
            .partition(|e| TOMBSTONE_KINDS.contains(&e.kind.as_str()));
        // What stays must still say the load is finished (never prune an open load).
        let state = replay(kept, crate::KNOWN_KINDS)?.state;
        if !matches!(
            state,
            crate::ledger::LoadState::Committed | crate::ledger::LoadState::Aborted
        ) {
            tracing::warn!(
                "load {load}: recorded done by gc but its entries do not say it finished ({}); not pruned",
                state.as_str()
            );
            continue;
        }
        if pruned.is_empty() {
            report.already_pruned += 1;
            continue;
        }
        report.entries += pruned.len();
        report.loads.push(load);
    }
    if !dry_run {
        ledger
            .delete_entries(&report.loads, TOMBSTONE_KINDS)
            .await?;
    }
    report.checkpoints = ledger
        .delete_gc_checkpoints(finished_before_unix_ms, dry_run)
        .await?;
    Ok(report)
}
