//! `chpart ledger ...`: maintenance of the ledger itself (`prune`: its retention).

use std::process::ExitCode;

use chpart_protocol::retention;
use chpart_protocol::store::{now_unix_ms, Ledger};

use crate::args::{load_config, parse_duration_ms, runtime, server_of, ConfigArg};
use crate::exit::{self, Failure};

#[derive(Debug, clap::Args)]
pub struct LedgerArgs {
    #[command(subcommand)]
    pub command: LedgerCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum LedgerCommand {
    /// Delete the ledger entries of loads that finished (committed or aborted) before a bound
    /// and that gc has recorded done, keeping a tombstone of each (its decision, its commit or
    /// abort entry and gc's summary): a pruned load still fences late builds, refuses `begin`
    /// (exit 5), answers a re-run of its commit and shows in `status`. Open loads and loads gc
    /// has not finished are never pruned. Run `chpart gc` first; safe to run again.
    #[command(after_help = exit::help())]
    Prune(PruneArgs),
}

#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Prune loads finished before this: an age (90d, 12h, 30m, 45s: that long before now, on
    /// this machine's clock) or a UTC time (2026-01-01 or 2026-01-01T00:00:00Z), compared with
    /// the server's write times.
    #[arg(long, value_name = "AGE|TIME", value_parser = parse_before)]
    pub finished_before: Before,
    /// List what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The bound of `--finished-before`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Before {
    /// This many milliseconds before now.
    Ago(u64),
    /// This time, in ms since the epoch (UTC).
    At(i64),
}

impl Before {
    fn unix_ms(self, now_ms: u64) -> i64 {
        match self {
            Before::Ago(ms) => i64::try_from(now_ms.saturating_sub(ms)).unwrap_or(i64::MAX),
            Before::At(ms) => ms,
        }
    }
}

/// `90d`-style ages ([`parse_duration_ms`]) or UTC times `YYYY-MM-DD[THH:MM:SSZ]`.
pub fn parse_before(text: &str) -> Result<Before, String> {
    let text = text.trim();
    if text.len() >= 10 && text.as_bytes()[4] == b'-' {
        return chpart_core::time::parse_utc_ms(text)
            .map(Before::At)
            .ok_or_else(|| {
                format!("{text:?} is not a UTC time like 2026-01-01 or 2026-01-01T00:00:00Z")
            });
    }
    parse_duration_ms(text)
        .map(Before::Ago)
        .map_err(|e| format!("{e}, or a UTC time like 2026-01-01 or 2026-01-01T00:00:00Z"))
}

pub fn run_ledger(args: LedgerArgs) -> Result<ExitCode, Failure> {
    match args.command {
        LedgerCommand::Prune(args) => run_prune(args),
    }
}

fn run_prune(args: PruneArgs) -> Result<ExitCode, Failure> {
    let config = load_config(&args.config)?;
    let ledger = Ledger::new(server_of(&config), &config.ledger_database);
    let before = args.finished_before.unix_ms(now_unix_ms());
    let report = runtime()?
        .block_on(retention::prune(&ledger, before, args.dry_run))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_parse_as_ages_or_utc_times() {
        let rows: &[(&str, Result<Before, ()>)] = &[
            ("90d", Ok(Before::Ago(90 * 86_400_000))),
            ("12h", Ok(Before::Ago(12 * 3_600_000))),
            ("45", Ok(Before::Ago(45_000))),
            ("1970-01-01", Ok(Before::At(0))),
            ("2026-01-01", Ok(Before::At(1_767_225_600_000))),
            ("2024-02-29T23:59:59Z", Ok(Before::At(1_709_251_199_000))),
            ("2026-12-01T09:00:00Z", Ok(Before::At(1_796_115_600_000))),
            ("2025-02-29", Err(())),
            ("2026-13-01", Err(())),
            ("2026-01-01T25:00:00Z", Err(())),
            ("2026-01-01T09:00:00", Err(())),
            ("2026-1-1x", Err(())),
            ("ninety days", Err(())),
            ("10y", Err(())),
        ];
        for (text, want) in rows {
            let got = parse_before(text);
            match want {
                Ok(want) => assert_eq!(got.as_ref(), Ok(want), "{text}"),
                Err(()) => assert!(got.is_err(), "{text}: {got:?}"),
            }
        }
        assert_eq!(Before::Ago(1000).unix_ms(5000), 4000);
        assert_eq!(Before::At(7).unix_ms(5000), 7);
    }
}
