//! Exit codes, documented in the README and in `chpart --help`. Spark (or any runner) decides
//! from them whether retrying a task can help.

use std::process::ExitCode;

use chpart_protocol::FailureKind;

/// Success.
pub const OK: u8 = 0;
/// Usage or configuration error (clap uses 2 for usage errors too).
pub const USAGE: u8 = 2;
/// Retryable failure: network, server busy, timeouts. Retrying the task may succeed.
pub const RETRYABLE: u8 = 3;
/// Permanent failure: bad input, schema mismatch, refused request. Retrying cannot help.
pub const PERMANENT: u8 = 4;
/// The load is no longer open (committed or aborted): this attempt was fenced off.
pub const FENCED: u8 = 5;

/// The text for `--help`.
pub const HELP: &str =
    "Exit codes: 0 done; 2 usage or config error; 3 retryable failure (network, server busy); \
4 permanent failure (bad input, schema mismatch, refused request); 5 load no longer open (fenced).";

/// An error with what it means for the caller.
pub struct Failure {
    pub kind: FailureKind,
    pub error: anyhow::Error,
}

impl Failure {
    pub fn new(kind: FailureKind, error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            kind,
            error: error.into(),
        }
    }
}

pub trait ExitCodeOf {
    fn exit_code(self) -> ExitCode;
}

impl ExitCodeOf for FailureKind {
    fn exit_code(self) -> ExitCode {
        ExitCode::from(match self {
            FailureKind::Usage => USAGE,
            FailureKind::Retryable => RETRYABLE,
            FailureKind::Permanent => PERMANENT,
            FailureKind::Fenced => FENCED,
        })
    }
}

pub fn ok() -> ExitCode {
    ExitCode::from(OK)
}
