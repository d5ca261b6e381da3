//! `chpart ledger ...`: maintenance of the ledger itself (`prune`: its retention).

use std::process::ExitCode;

use chpart_protocol::retention;
use chpart_protocol::store::Ledger;

use crate::args::{LedgerArgs, LedgerCommand, PruneArgs};
use crate::context::{load_config, runtime, server_of};
use crate::exit::{self, Failure};

pub fn run_ledger(args: LedgerArgs) -> Result<ExitCode, Failure> {
    match args.command {
        LedgerCommand::Prune(args) => run_prune(args),
    }
}

fn run_prune(args: PruneArgs) -> Result<ExitCode, Failure> {
    let config = load_config(&args.config)?;
    let ledger = Ledger::new(server_of(&config), &config.ledger_database);
    // `--finished-before 90d` is 90 days before now on the ledger server's clock, the clock
    // every finish time was recorded with (this machine's may be minutes off it).
    let report = runtime()?
        .block_on(async {
            let now_ms = ledger.server_now_ms().await?;
            let before = args.finished_before.unix_ms(now_ms);
            retention::prune(&ledger, before, args.dry_run).await
        })
        .map_err(|e| Failure::new(e.kind(), e))?;
    let verb = if args.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    tracing::info!(
        "ledger {}: {verb} {} entries of {} load(s) finished before {} ms since the epoch (tombstones kept; {} load(s) pruned before), and {} gc checkpoint(s)",
        config.ledger_database,
        report.entries,
        report.loads.len(),
        report.finished_before_unix_ms,
        report.already_pruned,
        report.checkpoints
    );
    if args.json {
        println!("{}", serde_json::to_string(&report).expect("serializes"));
    }
    Ok(exit::ok())
}
