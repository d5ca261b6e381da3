//! `chpart abort`: end a load and remove what it left.

use std::process::ExitCode;

use anyhow::Context;
use chpart_core::LoadId;

use crate::args::AbortArgs;
use crate::commands::describe;
use crate::context::{cleanup_failure, driver_env, usage};
use crate::exit::{self, Failure};

pub fn run_abort(args: AbortArgs) -> Result<ExitCode, Failure> {
    let load: LoadId = args.load.parse().context("--load").map_err(usage)?;
    let env = driver_env(&args.config)?;
    let removed = env
        .rt
        .block_on(chpart_protocol::api::abort_with(
            &env.ledger,
            &env.reach,
            env.fs.as_ref(),
            &env.staging,
            &load,
            args.force,
        ))
        .map_err(cleanup_failure)?;
    tracing::info!("load {load} aborted; removed {} item(s)", removed.len());
    for r in &removed {
        tracing::info!("  removed {}", describe(r));
    }
    if args.json {
        println!("{}", serde_json::to_string(&removed).expect("serializes"));
    }
    Ok(exit::ok())
}
