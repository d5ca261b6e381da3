//! `chpart commit`: attach exactly the winners, resumably.

use std::io::Read;
use std::process::ExitCode;

use anyhow::Context;
use chpart_core::retry::RetryPolicy;
use chpart_core::LoadId;
use chpart_protocol::api::commit_load_retrying;
use chpart_protocol::commit::{CommitEnv, CommitOutcome, CommitRequest, MoreConnections};

use crate::args::CommitArgs;
use crate::context::{driver_env, usage, DriverEnv};
use crate::exit::{self, Failure};

/// Non-empty lines of the winners file (or stdin), numbered from 1.
fn read_winners(path: &std::path::Path) -> Result<Vec<(usize, String)>, Failure> {
    let mut text = String::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("read --winners from stdin")
            .map_err(usage)?;
    } else {
        text = std::fs::read_to_string(path)
            .with_context(|| format!("read --winners {}", path.display()))
            .map_err(usage)?;
    }
    Ok(text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| (i + 1, line.to_owned()))
        .collect())
}

pub fn run_commit(args: CommitArgs) -> Result<ExitCode, Failure> {
    let load: LoadId = args.load.parse().context("--load").map_err(usage)?;
    let winners = args.winners.as_deref().map(read_winners).transpose()?;
    let driver = driver_env(&args.config)?;
    let request = CommitRequest {
        load: load.clone(),
        winners,
        verify: args.verify.into(),
        expected_partitions: args.partitions,
        allow_missing: args.allow_missing_partitions,
        visibility: args.visibility.map(Into::into),
        prepare_only: false,
        replaced_on_every_shard: None,
    };
    let outcome = commit(&driver, request)?;
    log_committed(&outcome);
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&outcome.summary).expect("a summary serializes")
        );
    }
    Ok(exit::ok())
}

/// Commits (or resumes the commit of) a load, retrying after retryable failures within the
/// config's deadline.
pub fn commit(driver: &DriverEnv, request: CommitRequest) -> Result<CommitOutcome, Failure> {
    let env = CommitEnv {
        ledger: &driver.ledger,
        server: driver.ledger.server(),
        fs: driver.fs.as_ref(),
        staging: driver.staging.clone(),
        more: Some(MoreConnections {
            reach: &driver.reach,
            host: &driver.host,
            total: driver.verify_connections,
        }),
    };
    let load = request.load.clone();
    driver
        .rt
        .block_on(commit_load_retrying(
            &driver.reach,
            &env,
            request,
            RetryPolicy::within(driver.retry_deadline),
        ))
        .map_err(|e| {
            let kind = e.kind();
            Failure::new(
                kind,
                anyhow::Error::new(e).context(format!("commit of load {load}")),
            )
        })
}

/// The log line of a commit's outcome.
pub fn log_committed(outcome: &CommitOutcome) {
    let s = &outcome.summary;
    if outcome.already_committed && outcome.attached_now == 0 {
        tracing::info!(
            "load {} is already committed (nothing to do): {} rows in {} part(s)",
            s.load,
            s.rows,
            s.parts
        );
    } else {
        tracing::info!(
            "load {} committed into {}: {} rows, {} part(s) ({} attached by this run), {} partition(s), {} winning attempt(s), {:.2}s",
            s.load,
            s.table,
            s.rows,
            s.parts,
            outcome.attached_now,
            s.partitions,
            s.winners.len(),
            outcome.seconds
        );
    }
}
