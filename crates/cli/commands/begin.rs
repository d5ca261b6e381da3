//! `chpart begin`: open a load.

use std::process::ExitCode;

use anyhow::Context;
use chpart_core::{LoadId, TableRef};
use chpart_protocol::api::begin_load;
use chpart_protocol::begin::{BeginOutcome, BeginRequest};
use chpart_protocol::store::Ledger;

use crate::args::BeginArgs;
use crate::context::{
    load_config, local_version, runtime, server_of, staging_roots, usage, ConfigReach,
};
use crate::exit::{self, Failure};

pub fn run_begin(args: BeginArgs) -> Result<ExitCode, Failure> {
    let load: LoadId = args.load.parse().context("--load").map_err(usage)?;
    let target: TableRef = args.table.parse().context("--table").map_err(usage)?;
    let config = load_config(&args.config)?;
    let request = BeginRequest {
        load,
        target,
        mode: args.mode.into(),
        visibility: args.visibility.into(),
        host: config.clickhouse.host_name.clone(),
        allow_materialized_views: args.allow_materialized_views,
        clickhouse_local_version: local_version(&config),
        staging: staging_roots(&config)?,
        shard_of: None,
        inputs: None,
    };
    let ledger = Ledger::new(server_of(&config), &config.ledger_database);
    let reach = ConfigReach::new(config.clone());
    let outcome = runtime()?
        .block_on(begin_load(&ledger, &reach, &request))
        .map_err(|e| Failure::new(e.kind(), e))?;
    let spec = outcome.spec();
    if args.json {
        println!(
            "{}",
            serde_json::to_string(spec).expect("a LoadSpec serializes")
        );
    }
    let what = match outcome {
        BeginOutcome::Opened(_) => "opened",
        BeginOutcome::AlreadyOpen(_) => "already open (no change)",
    };
    let disks = spec
        .publish_disks
        .iter()
        .map(|d| {
            format!(
                "disk {} at {}, staging {}",
                d.disk, d.data_path, d.staging_root
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    tracing::info!(
        "load {} {what}: table {}, mode {}, visibility {}, executors publish into {} ({disks})",
        spec.load,
        spec.target,
        spec.mode,
        spec.visibility,
        spec.publish,
    );
    Ok(exit::ok())
}
