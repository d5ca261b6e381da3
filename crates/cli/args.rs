//! Subcommands and their arguments.

use std::path::PathBuf;

use chpart_protocol::ledger::{Mode, Visibility};
use clap::{Parser, Subcommand, ValueEnum};

use crate::exit::{self};

/// Exactly-once loads into ClickHouse: build native MergeTree parts in the batch job, publish
/// them into detached/ under attempt-scoped names, attach only the winners' parts.
#[derive(Debug, Parser)]
#[command(name = "chpart", version, after_help = exit::help())]
pub struct Cli {
    /// More log output on stderr (-v debug, -vv trace); CHPART_LOG takes a filter instead.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Append one JSON line per step to FILE (`-`: stderr): load, attempt, shard, part,
    /// partition, step, outcome, duration_ms, rows, bytes, parts, attempts, retry, error (see
    /// the README for the steps).
    #[arg(long, value_name = "FILE", global = true)]
    pub events: Option<PathBuf>,
    /// Write a Prometheus text file when the command ends (success, steps, seconds, rows,
    /// bytes, parts, attempts and retries per step), e.g. for node_exporter's textfile
    /// collector. Replaced atomically.
    #[arg(long, value_name = "FILE", global = true)]
    pub metrics_file: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The subcommand's name, for metrics.
    pub fn command_name(&self) -> &'static str {
        match &self.command {
            Command::Begin(_) => "begin",
            Command::Build(_) => "build",
            Command::Commit(_) => "commit",
            Command::Abort(_) => "abort",
            Command::Status(_) => "status",
            Command::Gc(_) => "gc",
            Command::Plan(_) => "plan",
            Command::Ledger(_) => "ledger",
            Command::Load(_) => "load",
            Command::Config(_) => "config",
        }
    }

    /// The load the command works on, if it names one.
    pub fn load(&self) -> Option<&str> {
        match &self.command {
            Command::Begin(a) => Some(&a.load),
            Command::Build(a) => Some(&a.load),
            Command::Commit(a) => Some(&a.load),
            Command::Abort(a) => Some(&a.load),
            Command::Load(a) => Some(&a.load),
            Command::Status(a) => a.load.as_deref(),
            Command::Gc(_) | Command::Plan(_) | Command::Ledger(_) | Command::Config(_) => None,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Open a load (once, on the driver, before the job): record it in the ledger and snapshot
    /// the target table's definition for the executors. For a Distributed table: check every
    /// shard, then open one sub-load per shard (`<load>.shard<N>`) and the cluster load.
    /// Re-running it for an open load with the same arguments is a no-op; for a finished load
    /// it exits with status 5.
    #[command(after_help = exit::help())]
    Begin(BeginArgs),
    /// Build one task attempt's rows into parts and publish them (on each executor). Reads
    /// Parquet files or an Arrow IPC stream on stdin, builds parts with clickhouse-local, uploads
    /// them into this attempt's staging dir, renames them into detached/ under attempt-scoped
    /// names and prints the attempt manifest as one JSON line on stdout, last. For a load into a
    /// Distributed table the rows are routed to the shards as ClickHouse routes them, each
    /// shard's parts are published on its host, and the line is the cluster manifest (every
    /// shard's). Progress and logs go to stderr.
    #[command(after_help = exit::help())]
    Build(BuildArgs),
    /// Attach exactly the winning attempts' parts (once, on the driver, after the job). The
    /// winners are the manifests the tasks printed and Spark's collect() returned, one per
    /// partition. Resumable: re-run it after any failure or crash; a committed load is a no-op.
    /// Exits 0 only when the load is committed.
    #[command(after_help = exit::help())]
    Commit(CommitArgs),
    /// Abort a load: record it aborted (every later build of it is fenced), then remove its
    /// parts from detached/, its shadow table and its staging. Refused for a committed load, or
    /// while a commit may already have made rows visible (re-run commit instead, or --force if
    /// it can never finish).
    #[command(after_help = exit::help())]
    Abort(AbortArgs),
    /// Show each load: state, mode, partitions, parts and rows, attempts seen and which won,
    /// what gc still has to remove, durations.
    #[command(after_help = exit::help())]
    Status(StatusArgs),
    /// Remove what no load will ever attach: losing and late attempts' parts and staging of
    /// committed or aborted loads, and their shadow tables. Never touches an open load.
    #[command(after_help = exit::help())]
    Gc(GcArgs),
    /// Show what a load of a table would use, writing nothing: for a Distributed table every
    /// shard (weight, host, HTTP endpoint, version), the sharding key, its type and the routing
    /// expression; for every host the disks parts would go to with their data paths and
    /// staging roots, and whether its server and filesystem answer. Exits 0 when a load could
    /// begin now, 3 when a host does not answer, 4 when the table cannot be loaded as it is.
    #[command(after_help = exit::help())]
    Plan(PlanArgs),
    /// Load Parquet files (or an Arrow stream on stdin) in one command, for any batch job:
    /// begin, build the inputs in parallel (attempt ids made here), commit, gc what the load
    /// left. Re-running the same command finishes a load interrupted at any point (killed
    /// during a build or the commit) and is a no-op for a committed load; a load id reused
    /// with other inputs is refused (exit 4). Into a Distributed table it loads every shard.
    #[command(after_help = exit::help())]
    Load(LoadArgs),
    /// Maintain the ledger: `prune` deletes the entries of loads finished long ago, keeping a
    /// tombstone of each.
    Ledger(LedgerArgs),
    /// Resolve the config from its sources (the file, `CHPART_CONFIG_TOML`, `CHPART_<SECTION>_<KEY>`
    /// variables), validate it (reading the password from its file or variable) and print it
    /// with every default filled in, as TOML or JSON. It never holds a secret: only where the
    /// password is (password_file, password_env). Relative paths stay relative. The Spark
    /// integrations run it once on the driver and hand its TOML to the tasks in
    /// CHPART_CONFIG_TOML.
    #[command(after_help = exit::help())]
    Config(ConfigArgs),
}

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The table a load would go into (`db.table`; a Distributed table or a MergeTree table).
    #[arg(long, value_name = "DB.TABLE")]
    pub table: String,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Only the table's keys: PARTITION BY and ORDER BY (for a Distributed table also its
    /// cluster, sharding key and local table, the keys from the first shard that answers). No
    /// filesystem is reached and no host is checked, so it says nothing of whether a load could
    /// begin. What the Spark connector asks on every write to lay out its rows.
    #[arg(long)]
    pub keys: bool,
}

#[derive(Debug, clap::Args)]
pub struct AbortArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The load to abort.
    #[arg(long, value_name = "LOAD_ID")]
    pub load: String,
    /// Also end a load that a commit already claimed, for a commit that can never finish
    /// (e.g. a planned part was removed by hand). Rows that commit already made visible stay
    /// visible; stop any running commit of the load first.
    #[arg(long)]
    pub force: bool,
    /// Print what was removed as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Only this load.
    #[arg(long, value_name = "LOAD_ID")]
    pub load: Option<String>,
    /// One JSON array on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also draw the load (--load) on a time axis into FILE (SVG): every attempt's build,
    /// upload and publish, which won, lost, wrote no manifest (failed or fenced) or is being
    /// collected by gc, and the commit's steps in the ledger. Attempts that lost are known
    /// until gc removes what they left: draw it before gc to see them.
    #[arg(long, value_name = "FILE.svg", requires = "load")]
    pub timeline: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct GcArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Report open loads begun longer ago than this (e.g. 90s, 30m, 6h, 2d).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
    pub older_than: Option<u64>,
    /// With --older-than: abort those stale open loads (unless a commit already made rows visible).
    #[arg(long, requires = "older_than")]
    pub abort_stale: bool,
    /// List what would be removed; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `90s`, `30m`, `6h`, `2d` (or plain seconds) as milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let (number, unit) = text.trim().split_at(
        text.trim()
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.trim().len()),
    );
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 90s, 30m, 6h or 2d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use s, m, h or d)"
            ))
        }
    };
    Ok(secs * 1000)
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum VerifyArg {
    /// `server` with partition visibility, `full` with part visibility.
    Auto,
    /// Every file present with its manifest size (metadata only): no content check.
    Sizes,
    /// Sizes on the host, then CHECK TABLE of the shadow and every part's hash before any
    /// partition is published (partition visibility only).
    Server,
    /// Every file's sha256 recomputed on the host before ATTACH (reads all bytes back).
    Full,
}

#[derive(Debug, clap::Args)]
pub struct CommitArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The load id given to `chpart begin`.
    #[arg(long, value_name = "LOAD_ID")]
    pub load: String,
    /// The winning manifests as JSON lines (a file, or - for stdin). Needed by the first
    /// commit of a load; without it, a commit whose plan is recorded resumes from the ledger
    /// alone (on any machine with the same config).
    #[arg(long, value_name = "FILE|-")]
    pub winners: Option<PathBuf>,
    /// Must equal the load's visibility (chosen at `begin`); a safety check for scripts.
    #[arg(long, value_enum)]
    pub visibility: Option<VisibilityArg>,
    /// How parts are compared with their manifests before anything becomes visible.
    #[arg(long, value_enum, default_value = "auto")]
    pub verify: VerifyArg,
    /// The job's number of partitions: 0..N must each have a winner (else a gap in the
    /// partition numbers seen counts as missing).
    #[arg(long, value_name = "N")]
    pub partitions: Option<u32>,
    /// Commit even if some partitions have no winner.
    #[arg(long)]
    pub allow_missing_partitions: bool,
    /// Print the committed load's summary as one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ConfigArg {
    /// The chpart config file (TOML; see deploy/chpart.example.toml). Optional: the config is
    /// this file, then the TOML document in CHPART_CONFIG_TOML merged over it, then
    /// `CHPART_<SECTION>_<KEY>` variables (later sources win).
    #[arg(long, env = "CHPART_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print the config as one JSON object (sections of keys) instead of TOML.
    #[arg(long, conflicts_with = "toml")]
    pub json: bool,
    /// Print the config as TOML (the default): what CHPART_CONFIG_TOML takes.
    #[arg(long)]
    pub toml: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// Add the load's rows to the table.
    Append,
    /// Replace every partition the load touches, atomically for readers (historical reloads).
    Replace,
    /// Replace the whole table at once: the load's rows become its only rows, swapped in by
    /// EXCHANGE TABLES (an Atomic database; a daily snapshot of a dimension table).
    Overwrite,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Append => Mode::Append,
            ModeArg::Replace => Mode::Replace,
            ModeArg::Overwrite => Mode::Overwrite,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum VisibilityArg {
    /// Each partition of the load appears at once (parts go through a shadow table).
    Partition,
    /// Each part appears as it is attached; the load as a whole is not atomic.
    Part,
}

impl From<VisibilityArg> for Visibility {
    fn from(v: VisibilityArg) -> Visibility {
        match v {
            VisibilityArg::Partition => Visibility::Partition,
            VisibilityArg::Part => Visibility::Part,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct BeginArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Target table as DATABASE.TABLE.
    #[arg(long, value_name = "DB.TABLE")]
    pub table: String,
    /// The load id: unique per load, [A-Za-z0-9._-], e.g. events-2026-11-30T09.
    #[arg(long, value_name = "LOAD_ID")]
    pub load: String,
    /// Append rows, or replace the partitions the load touches.
    #[arg(long, value_enum, default_value = "append")]
    pub mode: ModeArg,
    /// How the load becomes visible at commit.
    #[arg(long, value_enum, default_value = "partition")]
    pub visibility: VisibilityArg,
    /// Load a table that materialized views read from. They run on INSERT only, so they never
    /// see the rows chpart attaches: without this flag such a table is refused.
    #[arg(long)]
    pub allow_materialized_views: bool,
    /// Print the load's spec as one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The load id given to `chpart begin`.
    #[arg(long, value_name = "LOAD_ID")]
    pub load: String,
    /// The partition (task) number this attempt computes.
    #[arg(long, value_name = "N")]
    pub partition: u32,
    /// A unique id of this attempt (chpart_spark: `<applicationId>.<application attempt>.<nonce>.<taskAttemptId>`).
    /// Two attempts must never share one: it scopes every path and part name the attempt writes,
    /// and a build whose attempt's staging directory exists already is refused (exit 4).
    #[arg(long, value_name = "ATTEMPT_ID")]
    pub attempt: String,
    /// Stage id, for the record.
    #[arg(long, value_name = "S")]
    pub stage: Option<u32>,
    /// Stage attempt number, for the record.
    #[arg(long, value_name = "SA")]
    pub stage_attempt: Option<u32>,
    /// Task attempt number within the stage attempt, for the record.
    #[arg(long, value_name = "A")]
    pub attempt_number: Option<u32>,
    /// Parquet input files, or `-` for an Arrow IPC stream on stdin.
    #[arg(long, value_name = "PATH", num_args = 1.., required = true)]
    pub input: Vec<PathBuf>,
    /// Die when the parent process dies (PR_SET_PDEATHSIG), e.g. when Spark kills the task.
    #[arg(long)]
    pub die_with_parent: bool,
    /// Merge each partition into one part before shipping (costs a merge).
    #[arg(long)]
    pub merge: bool,
}

#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Target table as DATABASE.TABLE (a MergeTree-family table, or a Distributed table over
    /// them: every shard is loaded).
    #[arg(long, value_name = "DB.TABLE")]
    pub table: String,
    /// The load id: names this set of inputs, e.g. events-2026-11-30T09 ([A-Za-z0-9._-]).
    #[arg(long, value_name = "LOAD_ID")]
    pub load: String,
    /// A Parquet file, a directory (every *.parquet under it; hidden and _-prefixed names
    /// skipped), or - alone for an Arrow IPC stream on stdin. Repeat for more.
    #[arg(long, value_name = "PATH", num_args = 1.., required = true)]
    pub input: Vec<PathBuf>,
    /// Append rows, or replace the partitions the load touches.
    #[arg(long, value_enum, default_value = "append")]
    pub mode: ModeArg,
    /// How the load becomes visible at commit.
    #[arg(long, value_enum, default_value = "partition")]
    pub visibility: VisibilityArg,
    /// How parts are compared with their manifests before anything becomes visible.
    #[arg(long, value_enum, default_value = "auto")]
    pub verify: VerifyArg,
    /// Builds run at once (default: this machine's cores). The first run splits the files into
    /// this many builds, more where one would read over 1 GiB, never more than there are
    /// files; a re-run keeps that split.
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Where the builds' manifests are kept until the commit, so that a re-run on this machine
    /// does not build them again. Default: `<clickhouse_local.work_dir>/chpart-load`.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Merge each build's rows of a partition into one part before shipping (costs a merge).
    #[arg(long)]
    pub merge: bool,
    /// Load a table that materialized views read from (they will not see these rows).
    #[arg(long)]
    pub allow_materialized_views: bool,
    /// Print the summary as one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
}

impl From<VerifyArg> for Option<chpart_protocol::observe::Verify> {
    fn from(v: VerifyArg) -> Self {
        use chpart_protocol::observe::Verify;
        match v {
            VerifyArg::Auto => None,
            VerifyArg::Sizes => Some(Verify::Sizes),
            VerifyArg::Server => Some(Verify::Server),
            VerifyArg::Full => Some(Verify::Full),
        }
    }
}

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
    pub fn unix_ms(self, now_ms: u64) -> i64 {
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
