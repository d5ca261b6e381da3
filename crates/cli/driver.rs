//! `chpart commit` (and later abort, status, gc): wiring the driver side from config and args.

use std::io::Read;
use std::process::ExitCode;

use anyhow::Context;
use chpart_core::{LoadId, StagingLayout};
use chpart_protocol::commit::{commit, CommitEnv, CommitRequest};
use chpart_protocol::observe::Verify;
use chpart_protocol::store::Ledger;

use crate::args::{load_config, runtime, server_of, usage, CommitArgs, VerifyArg};
use crate::build::remote_fs;
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
    let winners = read_winners(&args.winners)?;
    let config = load_config(&args.config)?;
    let staging = StagingLayout::new(&config.staging_root)
        .context("staging.root")
        .map_err(usage)?;
    let rt = runtime()?;
    let ledger = Ledger::new(server_of(&config), &config.ledger_database);
    let fs = remote_fs(&config)?;
    let env = CommitEnv {
        ledger: &ledger,
        fs: fs.as_ref(),
        staging,
    };
    let request = CommitRequest {
        load: load.clone(),
        winners,
        verify: match args.verify {
            VerifyArg::Sizes => Verify::Sizes,
            VerifyArg::Full => Verify::Full,
        },
        expected_partitions: args.partitions,
        allow_missing: args.allow_missing_partitions,
        visibility: args.visibility.map(Into::into),
    };
    let outcome = rt.block_on(commit(&env, request)).map_err(|e| {
        let kind = e.kind();
        Failure::new(
            kind,
            anyhow::Error::new(e).context(format!("commit of load {load}")),
        )
    })?;
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
    if args.json {
        println!(
            "{}",
            serde_json::to_string(s).expect("a summary serializes")
        );
    }
    Ok(exit::ok())
}
