//! `chpart gc`: remove what no load will attach.

use std::process::ExitCode;

use crate::args::GcArgs;
use crate::commands::describe;
use crate::context::{cleanup_failure, driver_env, DriverEnv};
use crate::exit::{self, Failure};

pub fn run_gc(args: GcArgs) -> Result<ExitCode, Failure> {
    let env = driver_env(&args.config)?;
    let report = gc(&env, args.older_than, args.abort_stale, args.dry_run)?;
    if args.json {
        println!("{}", serde_json::to_string(&report).expect("serializes"));
    }
    Ok(exit::ok())
}

/// Runs gc, logging what it removed (or, with `dry_run`, would remove) and the stale open loads.
pub fn gc(
    env: &DriverEnv,
    older_than: Option<u64>,
    abort_stale: bool,
    dry_run: bool,
) -> Result<chpart_protocol::cleanup::GcReport, Failure> {
    let report = env
        .rt
        .block_on(chpart_protocol::api::gc(
            &env.ledger,
            &env.reach,
            env.fs.as_ref(),
            &env.staging,
            older_than,
            abort_stale,
            dry_run,
        ))
        .map_err(cleanup_failure)?;
    let verb = if dry_run { "would remove" } else { "removed" };
    for (load, removed) in &report.removed {
        for r in removed {
            tracing::info!("load {load}: {verb} {}", describe(r));
        }
    }
    for load in &report.stale_open {
        let what = if report.aborted.contains(load) {
            "aborted"
        } else {
            "left open (use --abort-stale to abort)"
        };
        tracing::warn!("load {load} is open and older than --older-than: {what}");
    }
    let total: usize = report.removed.iter().map(|(_, r)| r.len()).sum();
    tracing::info!(
        "gc {verb} {total} item(s) of {} finished load(s)",
        report.removed.len()
    );
    Ok(report)
}
