//! `chpart commit` (and later abort, status, gc): wiring the driver side from config and args.

use std::io::Read;
use std::process::ExitCode;

use anyhow::Context;
use chpart_core::retry::RetryPolicy;
use chpart_core::{LoadId, StagingLayout};
use chpart_protocol::api::commit_load_retrying;
use chpart_protocol::commit::{CommitEnv, CommitOutcome, CommitRequest, MoreConnections};
use chpart_protocol::store::Ledger;

use chpart_protocol::cleanup::Removal;

use crate::args::{
    load_config, runtime, server_of, usage, AbortArgs, CommitArgs, GcArgs, StatusArgs,
};
use crate::build::{remote_fs, ConfigReach};
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

/// The ledger, the server's filesystem and the staging layout of a config.
pub struct DriverEnv {
    pub rt: tokio::runtime::Runtime,
    pub ledger: Ledger,
    pub fs: std::sync::Arc<dyn chpart_remote::RemoteFs>,
    pub staging: StagingLayout,
    pub reach: ConfigReach,
    /// The configured server's host name, whose filesystem `fs` is.
    host: String,
    /// Connections `commit` verifies over (`fs` and more from `reach`).
    verify_connections: usize,
    retry_deadline: std::time::Duration,
}

fn driver_env(config: &crate::args::ConfigArg) -> Result<DriverEnv, Failure> {
    driver_env_of(load_config(config)?)
}

pub fn driver_env_of(config: chpart_config::Config) -> Result<DriverEnv, Failure> {
    let staging = StagingLayout::new(&config.staging_root)
        .context("staging.root")
        .map_err(usage)?;
    Ok(DriverEnv {
        retry_deadline: config.retry_deadline,
        rt: runtime()?,
        ledger: Ledger::new(server_of(&config), &config.ledger_database),
        fs: remote_fs(&config)?,
        staging,
        host: config.clickhouse.host_name.clone(),
        verify_connections: match &config.transport {
            chpart_config::Transport::Sftp(ssh) => ssh.verify_connections,
            // Local files: listing and hashing them is no round trip.
            chpart_config::Transport::Local => 1,
        },
        reach: ConfigReach::new(config),
    })
}

fn cleanup_failure(e: chpart_protocol::cleanup::CleanupError) -> Failure {
    let kind = e.kind();
    Failure::new(kind, e)
}

fn describe(r: &Removal) -> String {
    match r {
        Removal::DetachedPart {
            table,
            part,
            attempt,
        } => format!("detached part {part} of attempt {attempt} in {table}"),
        Removal::ShadowTable { table } => format!("shadow table {table}"),
        Removal::Staging { path } => format!("staging {path}"),
    }
}

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

pub fn run_status(args: StatusArgs) -> Result<ExitCode, Failure> {
    let only: Option<LoadId> = args
        .load
        .as_deref()
        .map(str::parse)
        .transpose()
        .context("--load")
        .map_err(usage)?;
    let env = driver_env(&args.config)?;
    if let (Some(path), Some(load)) = (&args.timeline, &only) {
        let timeline = env
            .rt
            .block_on(chpart_protocol::timeline::timeline(
                &env.ledger,
                &env.reach,
                env.fs.as_ref(),
                &env.staging,
                load,
            ))
            .map_err(cleanup_failure)?
            .ok_or_else(|| {
                Failure::new(
                    chpart_protocol::FailureKind::Permanent,
                    anyhow::anyhow!("load {load} is not in the ledger: no timeline to draw"),
                )
            })?;
        std::fs::write(path, crate::timeline::svg(&timeline))
            .with_context(|| format!("--timeline {}", path.display()))
            .map_err(usage)?;
        tracing::info!(
            "timeline of load {load}: {} attempt(s), {} ledger mark(s) in {}",
            timeline.lanes.len(),
            timeline.marks.len(),
            path.display()
        );
    }
    let loads = env
        .rt
        .block_on(chpart_protocol::cleanup::status(
            &env.ledger,
            &env.reach,
            env.fs.as_ref(),
            &env.staging,
            only.as_ref(),
        ))
        .map_err(cleanup_failure)?;
    if args.json {
        println!("{}", serde_json::to_string(&loads).expect("serializes"));
        return Ok(exit::ok());
    }
    if loads.is_empty() {
        println!(
            "no loads{}",
            only.map(|l| format!(" named {l}")).unwrap_or_default()
        );
    }
    for l in &loads {
        let state = match (l.state.as_str(), l.decision.as_deref(), l.parts_planned) {
            ("open", Some("commit"), _) => {
                "open (a commit claimed it: finish it with `chpart commit --load` alone)"
            }
            // A plan is recorded (a cluster load's winners come from its plan only).
            ("open", _, Some(_)) => "open (planned: finish it with `chpart commit --load` alone)",
            ("open", _, None) if !l.winners.is_empty() => {
                "open (planned: finish it with `chpart commit --load` alone)"
            }
            (state, _, _) => state,
        };
        println!(
            "{}  {}  table {}  mode {}  visibility {}{}",
            l.load,
            state,
            l.table.as_deref().unwrap_or("?"),
            l.mode.as_deref().unwrap_or("?"),
            l.visibility.as_deref().unwrap_or("?"),
            l.duration_secs
                .map(|d| format!("  {d:.1}s from begin to finish"))
                .unwrap_or_default()
        );
        if let (Some(parts), Some(rows)) = (l.parts_planned, l.rows) {
            println!(
                "  plan: {} partition(s), {parts} part(s), {rows} rows; {} part(s) attached",
                l.partitions.unwrap_or(0),
                l.parts_attached
            );
        }
        for a in &l.attempts {
            println!(
                "  attempt {}: {}, {} part(s) published{}",
                a.attempt,
                if a.completed {
                    "completed"
                } else {
                    "incomplete"
                },
                a.parts,
                if a.won {
                    ", WON"
                } else if l.winners.is_empty() {
                    ""
                } else {
                    ", lost"
                }
            );
        }
        for shard in &l.shards {
            let plan = match (shard.parts_planned, shard.rows) {
                (Some(parts), Some(rows)) => format!(
                    ": {parts} part(s), {rows} rows planned; {} attached, {} partition(s) published",
                    shard.parts_attached, shard.partitions_published
                ),
                _ => String::new(),
            };
            println!(
                "  shard {} ({}): load {} {}{plan}",
                shard.shard_num, shard.host, shard.load, shard.state
            );
        }
        for r in &l.gc_pending {
            println!("  gc pending: {}", describe(r));
        }
    }
    Ok(exit::ok())
}

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
