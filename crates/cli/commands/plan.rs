//! `chpart plan`: what a load of a table would use, writing nothing.

use std::process::ExitCode;

use anyhow::Context;
use chpart_core::TableRef;
use chpart_protocol::FailureKind;

use crate::args::PlanArgs;
use crate::context::{load_config, runtime, server_of, usage, ConfigReach};
use crate::exit::{self, Failure};

pub fn run_plan(args: PlanArgs) -> Result<ExitCode, Failure> {
    let table: TableRef = args.table.parse().context("--table").map_err(usage)?;
    let config = load_config(&args.config)?;
    let server = server_of(&config);
    let host_name = config.clickhouse.host_name.clone();
    let reach = ConfigReach::new(config);
    let topology = runtime()?
        .block_on(chpart_protocol::api::plan(
            server.as_ref(),
            &reach,
            &table,
            &host_name,
            if args.keys {
                chpart_protocol::api::PlanScope::Keys
            } else {
                chpart_protocol::api::PlanScope::Full
            },
        ))
        .map_err(|e| Failure::new(e.kind(), e))?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&topology).expect("a topology serializes")
        );
    } else {
        println!("{} ({})", topology.table, topology.engine);
        if let (Some(cluster), Some(local)) = (&topology.cluster, &topology.local) {
            println!(
                "  cluster {cluster}, local table {local}, sharding key {} ({})",
                topology.sharding_key.as_deref().unwrap_or("none"),
                topology.key_type.as_deref().unwrap_or("?")
            );
            if let Some(routing) = &topology.routing {
                println!("  shard of a row: {routing}");
            }
        }
        if let (Some(partition), Some(sorting)) = (&topology.partition_key, &topology.sorting_key) {
            println!("  PARTITION BY {partition}, ORDER BY {sorting}");
        }
        for h in &topology.hosts {
            println!(
                "  shard {} weight {}: {} at {} ({}), filesystem {}",
                h.shard_num,
                h.weight,
                h.host,
                h.url,
                h.version
                    .as_deref()
                    .map_or("server not reachable".to_owned(), |v| format!(
                        "ClickHouse {v}"
                    )),
                if h.filesystem_reachable {
                    "reachable"
                } else {
                    "NOT reachable"
                }
            );
            for d in &h.disks {
                println!(
                    "    disk {}: data {}, staging {}",
                    d.disk, d.data_path, d.staging_root
                );
            }
            for p in &h.problems {
                println!("    PROBLEM: {p}");
            }
        }
        for p in &topology.problems {
            println!("  PROBLEM: {p}");
        }
        if topology.ready() && !args.keys {
            println!("  ready: a load can begin");
        }
    }
    if args.keys {
        // Only the keys were asked for: no host was checked, so nothing is said of a load.
        return match topology.partition_key {
            Some(_) => Ok(exit::ok()),
            None => Err(Failure::new(
                FailureKind::Retryable,
                anyhow::anyhow!(
                    "{}: no shard answered with its keys (see above)",
                    topology.table
                ),
            )),
        };
    }
    if topology.ready() {
        Ok(exit::ok())
    } else if topology
        .hosts
        .iter()
        .any(|h| h.version.is_none() || !h.filesystem_reachable)
    {
        Err(Failure::new(
            FailureKind::Retryable,
            anyhow::anyhow!("{}: a host does not answer (see above)", topology.table),
        ))
    } else {
        Err(Failure::new(
            FailureKind::Permanent,
            anyhow::anyhow!("{}: cannot be loaded as it is (see above)", topology.table),
        ))
    }
}
