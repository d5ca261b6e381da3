//! chpart's load protocol, generic over the ClickHouse server and the remote filesystem.
//!
//! ```text
//!  driver: begin ──► ledger: load_opened(spec) ─┐
//!                                                │  executors read the spec
//!  executor (per task attempt): build ──► parts ──► staging/<load>/<attempt>/ ──► fence? ──► detached/
//!                                                                      └─► manifest (last)
//!  driver: commit(winning manifests) ──► ledger: plan, attach steps, load_committed
//! ```
//!
//! - [`ledger`]: the entries, the load spec and the pure replay that derives a load's state.
//! - [`store`]: the ledger table in ClickHouse.
//! - [`snapshot`]: what `begin` records about the target table.
//! - [`begin`]: opening a load.
//! - [`build`]: one task attempt, from rows to published parts and a manifest.
//! - [`cluster`]: loads into a Distributed table: a sub-load per shard, routing, commit across shards.
//! - [`cleanup`]: abort, gc and status; [`retention`]: pruning the ledger of long-finished loads.

#![warn(missing_docs)]

pub mod begin;
pub mod build;
pub mod cleanup;
pub mod cluster;
pub mod commit;
pub mod events;
pub mod ledger;
pub mod observe;
pub mod retention;
pub mod snapshot;
pub mod store;
pub mod timeline;

/// What a failure means for whoever runs chpart (and so its exit status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The command line or the configuration is wrong.
    Usage,
    /// A transient fault (network, server busy): running the same command again may succeed.
    Retryable,
    /// Running it again cannot succeed: bad input, schema mismatch, refused request.
    Permanent,
    /// The load is no longer open (committed or aborted): this attempt must stop.
    Fenced,
}

pub(crate) fn server_failure(e: &chpart_server::ServerError) -> FailureKind {
    match e.class(true) {
        chpart_server::ErrorClass::Transient => FailureKind::Retryable,
        _ => FailureKind::Permanent,
    }
}

impl store::LedgerStoreError {
    /// The failure kind.
    pub fn kind(&self) -> FailureKind {
        self.server_error()
            .map_or(FailureKind::Permanent, server_failure)
    }
}

impl begin::BeginError {
    /// The failure kind.
    pub fn kind(&self) -> FailureKind {
        match self {
            begin::BeginError::NotOpen { .. } => FailureKind::Fenced,
            begin::BeginError::Shard { source, .. } => source.kind(),
            begin::BeginError::ShardUnreachable { .. } => FailureKind::Retryable,
            begin::BeginError::Server(e) => server_failure(e),
            begin::BeginError::Ledger(e) => e.kind(),
            _ => FailureKind::Permanent,
        }
    }
}

pub use ledger::KNOWN_KINDS;
