//! `chpart-bench`: generate the benchmark input, print its table, run the build benchmark.
//! Parses arguments and hands over to the library; see BENCH.md for what the figures mean.

use std::path::PathBuf;
use std::process::ExitCode;

use chpart_bench::build::{self, BuildOptions};
use chpart_bench::cluster::{self, ClusterOptions};
use chpart_bench::commit::{self, CommitOptions, Transport};
use chpart_bench::gen::{self, GenOptions};
use chpart_bench::ledger::{self, LedgerOptions};
use chpart_bench::{events, interrupt};
use clap::{Parser, Subcommand};

/// Benchmarks for chpart: the executor side (build) and the driver side (commit).
#[derive(Debug, Parser)]
#[command(name = "chpart-bench")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// Input shape shared by `gen` and `build`.
#[derive(Debug, clap::Args)]
struct Input {
    /// Files the rows are split into (consecutive ranges of one row stream).
    #[arg(long, default_value_t = 1)]
    files: usize,
    /// Seed of the row stream: the same seed, rows and hour give the same files.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The hour (UTC) the events fall in, as YYYY-MM-DDTHH.
    #[arg(long, default_value = "2026-11-30T09")]
    hour: String,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Write a deterministic hour of events as zstd Parquet (row groups of 1M rows), streamed
    /// batch by batch; several files are named <stem>.<i>.parquet.
    Gen {
        /// Rows in all files together.
        #[arg(long)]
        rows: u64,
        /// The output file.
        #[arg(long, value_name = "FILE.parquet")]
        out: PathBuf,
        #[command(flatten)]
        input: Input,
    },
    /// Print the CREATE TABLE statement the generated files match.
    Ddl {
        /// Table name, as table or db.table.
        #[arg(long, default_value = "db.events")]
        table: String,
    },
    /// The executor-side benchmark: raw clickhouse-local vs `chpart build` (local and SFTP
    /// transports, and fed an Arrow stream on stdin) vs scp, on one generated input, against a
    /// server and sshd it starts itself.
    Build {
        /// Rows in the generated input.
        #[arg(long)]
        rows: u64,
        #[command(flatten)]
        input: Input,
        /// Rounds; each variant's best round is reported (the machine is noisy).
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// Also measure merged builds (raw + OPTIMIZE FINAL, chpart build --merge).
        #[arg(long)]
        merge: bool,
        /// Skip the reference server-side INSERT over HTTP.
        #[arg(long)]
        no_server_insert: bool,
        /// Measure only the baselines that need no chpart (raw clickhouse-local, scp, server
        /// INSERT).
        #[arg(long)]
        raw_only: bool,
        /// Skip the (e) builds fed the rows as an Arrow IPC stream on stdin.
        #[arg(long)]
        no_stream: bool,
        /// The `spool_chunk_mib` of the second (e) build (the first runs with chpart's
        /// default), small enough to make several chunks.
        #[arg(long, value_name = "MIB", default_value_t = 256)]
        small_spool_mib: u64,
        /// Keep the benchmark's directory (input, raw builds, configs, chpart's work dir) instead
        /// of deleting it; the server's and sshd's directories are removed either way.
        #[arg(long)]
        keep: bool,
        /// The chpart binary [default: chpart next to chpart-bench].
        #[arg(long, value_name = "PATH")]
        chpart: Option<PathBuf>,
        /// Where the benchmark's directory is made [default: the system temp directory].
        #[arg(long, value_name = "DIR")]
        work_dir: Option<PathBuf>,
    },
    /// The driver-side benchmark: ATTACH rate of `chpart commit`, time to visible under a
    /// polling reader, and server CPU per GB against `INSERT ... FORMAT Parquet`, against a
    /// server and sshd it starts itself.
    Commit {
        /// Parts in the ATTACH-rate loads (builds of at most 100 parts each).
        #[arg(long, default_value_t = 1000)]
        parts: u32,
        /// Parts in the time-to-visible loads.
        #[arg(long, default_value_t = 100)]
        load_parts: u32,
        /// Rows loaded by INSERT and by chpart for the server-CPU-per-GB comparison.
        #[arg(long, default_value_t = 5_000_000)]
        rows: u64,
        /// Rows per small part (ATTACH-rate and time-to-visible loads), on average.
        #[arg(long, default_value_t = 100)]
        rows_per_part: u64,
        /// Seed of the row stream.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The first hour (UTC) of events, as YYYY-MM-DDTHH; small-part loads use one hour per
        /// build from there.
        #[arg(long, default_value = "2026-11-30T09")]
        hour: String,
        /// How chpart commit reaches the server's filesystem to verify parts.
        #[arg(long, value_enum, default_value = "sftp")]
        transport: Transport,
        /// Skip the `--visibility partition` loads.
        #[arg(long)]
        no_partition_visibility: bool,
        /// `[ssh] verify_connections` of the SFTP config (default: chpart's, 4): how many
        /// connections a commit reads waiting parts back over
        #[arg(long, value_name = "N")]
        verify_connections: Option<usize>,
        /// Skip the server-CPU-per-GB comparison.
        #[arg(long)]
        no_cpu: bool,
        /// Keep the benchmark's directory (inputs, configs, winners files).
        #[arg(long)]
        keep: bool,
        /// The chpart binary [default: chpart next to chpart-bench].
        #[arg(long, value_name = "PATH")]
        chpart: Option<PathBuf>,
        /// Where the benchmark's directory is made [default: the system temp directory].
        #[arg(long, value_name = "DIR")]
        work_dir: Option<PathBuf>,
    },
    /// Loads into a Distributed table over several shards (servers on loopback): chpart vs
    /// INSERT through the Distributed engine (wall time, the servers' CPU per GB summed over
    /// shards), and the commit of many parts over N shards vs one shard (wall time, each shard
    /// server's CPU).
    Cluster {
        /// Rows of the load comparison.
        #[arg(long, default_value_t = 2_000_000)]
        rows: u64,
        /// Shards (one server each).
        #[arg(long, default_value_t = 3)]
        shards: u32,
        /// Tasks (input files and builds) of the load comparison.
        #[arg(long, default_value_t = 4)]
        tasks: usize,
        /// About this many parts in the commit comparison.
        #[arg(long, default_value_t = 1000)]
        parts: u32,
        /// Skip the load comparison (INSERT through the Distributed engine vs chpart): only the
        /// commit comparison runs.
        #[arg(long)]
        no_load: bool,
        /// Seed of the row stream.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The first hour (UTC) of events, as YYYY-MM-DDTHH.
        #[arg(long, default_value = "2026-11-30T09")]
        hour: String,
        /// The chpart binary [default: chpart next to chpart-bench].
        #[arg(long, value_name = "PATH")]
        chpart: Option<PathBuf>,
        /// Where the benchmark's directory is made [default: the system temp directory].
        #[arg(long, value_name = "DIR")]
        work_dir: Option<PathBuf>,
    },
    /// What each command costs the ledger (statements, rows read, server CPU from
    /// system.query_log, and wall time) with years of hourly loads in it, beside the same
    /// commands on a ledger of a few days' loads: begin, build's fence reads, commit, status
    /// --load, gc, and status of every load.
    Ledger {
        /// Finished loads in the small ledger.
        #[arg(long, default_value_t = 100)]
        small: u64,
        /// Finished loads in the large ledger.
        #[arg(long, default_value_t = 100_000)]
        large: u64,
        /// Builds (Spark partitions) of the load every ledger entry is copied from.
        #[arg(long, default_value_t = 4)]
        tasks: usize,
        /// Rounds of each command on each ledger; medians are printed.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// The hour (UTC) of the generated events, as YYYY-MM-DDTHH.
        #[arg(long, default_value = "2026-11-30T09")]
        hour: String,
        /// The chpart binary [default: chpart next to chpart-bench].
        #[arg(long, value_name = "PATH")]
        chpart: Option<PathBuf>,
        /// Where the benchmark's directory is made [default: the system temp directory].
        #[arg(long, value_name = "DIR")]
        work_dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    interrupt::install();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chpart-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Cmd::Gen { rows, out, input } => {
            let report = gen::generate(&GenOptions {
                rows,
                out,
                files: input.files,
                seed: input.seed,
                hour_start_secs: gen::parse_hour(&input.hour)?,
            })?;
            for path in &report.paths {
                println!("{}", path.display());
            }
            eprintln!("{}", report.summary());
        }
        Cmd::Ddl { table } => {
            if !events::valid_table_name(&table) {
                anyhow::bail!("--table {table:?}: expected table or db.table of [A-Za-z0-9_]");
            }
            println!("{}", events::ddl(&table));
        }
        Cmd::Build {
            rows,
            input,
            repeat,
            merge,
            no_server_insert,
            raw_only,
            no_stream,
            small_spool_mib,
            keep,
            chpart,
            work_dir,
        } => build::run(&BuildOptions {
            rows,
            files: input.files,
            seed: input.seed,
            hour_start_secs: gen::parse_hour(&input.hour)?,
            repeat,
            merge,
            server_insert: !no_server_insert,
            raw_only,
            stream: !no_stream,
            small_spool_mib,
            keep,
            chpart,
            work_dir,
        })?,
        Cmd::Commit {
            parts,
            load_parts,
            rows,
            rows_per_part,
            seed,
            hour,
            transport,
            no_partition_visibility,
            verify_connections,
            no_cpu,
            keep,
            chpart,
            work_dir,
        } => commit::run(&CommitOptions {
            parts,
            load_parts,
            rows,
            rows_per_part,
            seed,
            hour_start_secs: gen::parse_hour(&hour)?,
            transport,
            no_partition_visibility,
            verify_connections,
            no_cpu,
            keep,
            chpart,
            work_dir,
        })?,
        Cmd::Cluster {
            rows,
            shards,
            tasks,
            parts,
            no_load,
            seed,
            hour,
            chpart,
            work_dir,
        } => cluster::run(&ClusterOptions {
            rows,
            shards,
            tasks,
            parts,
            no_load,
            seed,
            hour_start_secs: gen::parse_hour(&hour)?,
            chpart,
            work_dir,
        })?,
        Cmd::Ledger {
            small,
            large,
            tasks,
            rounds,
            hour,
            chpart,
            work_dir,
        } => ledger::run(&LedgerOptions {
            small,
            large,
            tasks,
            rounds,
            hour_start_secs: gen::parse_hour(&hour)?,
            chpart,
            work_dir,
        })?,
    }
    Ok(())
}
