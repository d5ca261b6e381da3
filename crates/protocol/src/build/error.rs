//! Why an attempt failed, and which failures another try may not hit.

use super::*;

/// Why an attempt failed. Each names the load and attempt (via the CLI's context) and the file,
/// column, part or path at fault.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The load is committed or aborted.
    #[error("load {load} is {state}: this attempt is fenced off and published nothing")]
    Fenced {
        /// The load.
        load: LoadId,
        /// Its state.
        state: &'static str,
    },
    /// The load was never begun.
    #[error("load {load} was never begun: run `chpart begin` on the driver before the job")]
    NotBegun {
        /// The load.
        load: LoadId,
    },
    /// The load's table cannot be built for.
    #[error("load {load}: {message}")]
    Unsupported {
        /// The load.
        load: LoadId,
        /// Why.
        message: String,
    },
    /// Building the attempt's parts with clickhouse-local failed (bad input, clickhouse-local
    /// failed or is newer than the server or in another time zone, rows that do not add up).
    #[error(transparent)]
    Local(#[from] LocalError),
    /// Anything else in the build (digests, work dir).
    #[error("building parts: {0}")]
    Build(String),
    /// The server's filesystem failed.
    #[error("{op}: {source}")]
    Remote {
        /// What was being done.
        op: String,
        /// The transport's error.
        source: Box<RemoteError>,
    },
    /// A shard of a cluster load failed; what the attempt published on every shard is undone.
    #[error("shard {shard_num} ({host}): {source}")]
    Shard {
        /// The shard's number.
        shard_num: u32,
        /// Its host.
        host: String,
        /// What went wrong there.
        source: Box<BuildError>,
    },
    /// Another build holds this attempt's staging directory: the attempt id was used twice.
    #[error("attempt {attempt} of load {load} already has a staging directory {path}: another build with this attempt id ran or is running, and attempt ids must never repeat; this build published nothing and left that directory alone")]
    AttemptTaken {
        /// The load.
        load: LoadId,
        /// The repeated attempt id.
        attempt: AttemptId,
        /// Its staging directory.
        path: RemotePath,
    },
    /// Published parts would not be owned by the server's user.
    #[error("published part {path} would be owned by uid {owner}, but {detached} belongs to uid {server_uid} (the ClickHouse server's user), which could not attach it: log in over SSH as the server's user (ssh.user in the config), or run the local transport as that user")]
    Ownership {
        /// The staged part.
        path: String,
        /// Its owner.
        owner: u32,
        /// detached/.
        detached: String,
        /// detached/'s owner.
        server_uid: u32,
    },
    /// The ledger failed.
    #[error(transparent)]
    Ledger(#[from] LedgerStoreError),
}

impl BuildError {
    /// What the failure means for the caller.
    pub fn kind(&self) -> FailureKind {
        match self {
            BuildError::Fenced { .. } => FailureKind::Fenced,
            BuildError::Shard { source, .. } => source.kind(),
            BuildError::Ledger(e) => e.kind(),
            BuildError::Remote { source, .. } if source.is_transient() => FailureKind::Retryable,
            BuildError::Local(LocalError::Run(RunError::NotFound { .. })) => FailureKind::Usage,
            BuildError::Local(LocalError::Run(RunError::TimedOut { .. })) => FailureKind::Retryable,
            BuildError::Local(LocalError::Run(RunError::Failed { stderr_tail, .. }))
                if run_failure_is_transient(stderr_tail) =>
            {
                FailureKind::Retryable
            }
            _ => FailureKind::Permanent,
        }
    }
}

/// clickhouse-local failures that another try may not hit: out of disk space or memory.
pub(super) fn run_failure_is_transient(stderr: &str) -> bool {
    chpart_server::parse_exception(stderr).is_some_and(|(code, _, _)| {
        use chpart_server::code::{MEMORY_LIMIT_EXCEEDED, NOT_ENOUGH_SPACE, SYSTEM_ERROR};
        matches!(
            code,
            MEMORY_LIMIT_EXCEEDED | NOT_ENOUGH_SPACE | SYSTEM_ERROR
        )
    })
}

pub(super) fn remote(op: impl Into<String>) -> impl FnOnce(RemoteError) -> BuildError {
    let op = op.into();
    move |source| BuildError::Remote {
        op,
        source: Box::new(source),
    }
}

pub(super) fn build_err(e: impl std::fmt::Display) -> BuildError {
    BuildError::Build(e.to_string())
}
