//! `chpart status`: each load, its attempts and what gc still has to remove.

use std::process::ExitCode;

use anyhow::Context;
use chpart_core::LoadId;

use crate::args::StatusArgs;
use crate::commands::describe;
use crate::context::{cleanup_failure, driver_env, usage};
use crate::exit::{self, Failure};

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
