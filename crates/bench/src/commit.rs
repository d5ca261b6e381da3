//! `chpart-bench commit`: the driver side of chpart, measured in one run on its own server.
//!
//! Three figures, each from real `chpart begin`, `chpart build` and `chpart commit` runs:
//!
//! 1. **ATTACH rate**: a load of about `--parts` small parts, committed with `--visibility part`
//!    (each part attached straight into the target; over SFTP and, for comparison, with the
//!    local transport) and with `--visibility partition` (parts attached into the load's shadow
//!    table, then one `MOVE PARTITION` per partition): the wall time of the whole
//!    `chpart commit` command and parts per second. A commit that fails is reported, and the
//!    same number of parts is then committed as one load per build, so that a rate is still
//!    measured.
//! 2. **Time to visible**: a load of `--load-parts` parts, committed while another thread polls
//!    `SELECT count()` on the target in a tight loop: when the first rows and when all rows
//!    became visible, counted from the start of `chpart commit`; beside it, a load of the same
//!    size committed with no reader. The poller also checks that readers never see more rows
//!    than the load has, nor fewer than they saw before.
//! 3. **Server CPU per GB**: the same `--rows` generated rows loaded (a) by
//!    `INSERT ... FORMAT Parquet` over HTTP, as row-inserting connectors do, and (b) by chpart;
//!    the server process's utime+stime around each step, per GB of uncompressed column data.
//!    chpart's build runs clickhouse-local outside the server, so the figure judged is the
//!    commit's; begin, build and the merges of the commit's ledger entries are shown beside it.
//!    This one runs first, on the fresh server.
//!
//! Small parts come from a table that cuts each hour into `P` partitions
//! (`intDiv(seconds into the hour * P, 3600)`) and from inputs that each hold one hour of
//! events: one build then makes one part per partition, `P` parts. `P` is at most 100, because
//! clickhouse-local refuses an insert block that touches more partitions than
//! `max_partitions_per_insert_block` (100 by default), so a load of 1000 parts is 10 builds of
//! 100 parts each, the shape of a 10-task Spark job whose tasks each write 100 partitions.
//! Merges are stopped on every target and shadow table, so the parts counted are the parts
//! attached, and neither way of loading gets background merges billed to it.
//!
//! Builds use the local transport (they are set-up here, not measured; the parts they leave in
//! `detached/` are the same whatever the transport); commits use `--transport` (SFTP by
//! default, as a driver that is not on the ClickHouse host). Every load is checked: the rows
//! and parts the commit reports, the rows and active parts in the target, nothing left in
//! `detached/`, an empty shadow table. Nothing here asserts a timing.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chpart_testenv::clickhouse::ClickHouse;
use chpart_testenv::sshd::Sshd;

use crate::chpart::{Chpart, Configs};
use crate::gen::{generate, GenOptions};
use crate::http::sql;
use crate::local::{quote, DATABASE};
use crate::measure::{self, Measured};
use crate::{events, interrupt};

mod cpu;
mod report;
use report::{report, secs_or_dash};

/// The most partitions one build may touch: clickhouse-local's default
/// `max_partitions_per_insert_block`, beyond which it refuses the insert.
pub const MAX_PARTITIONS_PER_BUILD: u32 = 100;

/// Pause between two polls of the time-to-visible reader (each poll is one HTTP query).
const POLL_PAUSE: Duration = Duration::from_millis(1);
/// The idle window that measures the server's background CPU.
const IDLE_WINDOW: Duration = Duration::from_secs(2);
/// The server counts as quiet once it has run no merge for this long ...
const QUIET_FOR: Duration = Duration::from_millis(500);
/// ... checked this often ...
const QUIET_POLL: Duration = Duration::from_millis(50);
/// ... waiting at most this long.
const QUIET_LIMIT: Duration = Duration::from_secs(60);
/// chpart's ledger table (`[ledger] database` of the benchmark's configs).
const LEDGER: &str = "chpart.ledger";

/// How `chpart commit` reaches the server's filesystem (to verify the parts before attaching).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Over SFTP through the run's loopback sshd, as a driver on another host does.
    Sftp,
    /// Plain filesystem calls (the driver runs on the ClickHouse host).
    Local,
}

impl Transport {
    fn label(self) -> &'static str {
        match self {
            Transport::Sftp => "SFTP (loopback sshd)",
            Transport::Local => "the local transport",
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct CommitOptions {
    /// Parts in the ATTACH-rate loads (rounded up to whole builds of equal size).
    pub parts: u32,
    /// Parts in the time-to-visible loads.
    pub load_parts: u32,
    /// Rows of the CPU-per-GB comparison.
    pub rows: u64,
    /// Rows per small part, on average.
    pub rows_per_part: u64,
    /// Generator seed.
    pub seed: u64,
    /// Start of the first input hour, Unix seconds.
    pub hour_start_secs: i64,
    /// How `chpart commit` reaches the server's filesystem.
    pub transport: Transport,
    /// Skip the `--visibility partition` variants.
    pub no_partition_visibility: bool,
    /// `[ssh] verify_connections` of the SFTP config, when not chpart's default.
    pub verify_connections: Option<usize>,
    /// Skip the CPU-per-GB comparison.
    pub no_cpu: bool,
    /// Keep the benchmark's directory (inputs, configs, winners files).
    pub keep: bool,
    /// The chpart binary; default: `chpart` next to this executable.
    pub chpart: Option<PathBuf>,
    /// Parent of the benchmark's directory; default: the system temp directory.
    pub work_dir: Option<PathBuf>,
}

/// How a load of many small parts is cut: `builds` builds (Spark partitions), each of one
/// hour, each making `per_build` parts (one per ClickHouse partition of that hour).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Builds, i.e. Spark partitions and winning manifests.
    pub builds: u32,
    /// Parts per build, i.e. ClickHouse partitions per hour.
    pub per_build: u32,
}

impl Shape {
    /// The fewest builds of at most [`MAX_PARTITIONS_PER_BUILD`] parts that make at least
    /// `parts` parts, with the parts spread evenly over them.
    pub fn for_parts(parts: u32) -> anyhow::Result<Shape> {
        if parts == 0 {
            bail!("a load needs at least one part");
        }
        let builds = parts.div_ceil(MAX_PARTITIONS_PER_BUILD);
        Ok(Shape {
            builds,
            per_build: parts.div_ceil(builds),
        })
    }

    /// Parts of the whole load.
    pub fn parts(&self) -> u32 {
        self.builds * self.per_build
    }

    /// The partition key that cuts each hour into `per_build` partitions of equal length.
    pub fn partition_key(&self) -> String {
        format!(
            "(toStartOfHour(ts), intDiv(toUnixTimestamp(ts) % 3600 * {}, 3600))",
            self.per_build
        )
    }
}

/// One way of committing: the load's visibility and the commit's transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Variant {
    /// `part` or `partition`.
    visibility: &'static str,
    transport: Transport,
}

impl Variant {
    fn label(&self) -> String {
        let how = match self.visibility {
            "part" => "ATTACH PART into the target",
            _ => "shadow + MOVE PARTITION",
        };
        let transport = match self.transport {
            Transport::Sftp => "SFTP",
            Transport::Local => "local",
        };
        format!("--visibility {} ({how}), {transport}", self.visibility)
    }

    /// A table name part: `part_sftp`.
    fn slug(&self) -> String {
        format!("{}_{:?}", self.visibility, self.transport).to_lowercase()
    }
}

/// One measured `chpart commit`, or several in a row (see [`Attach`]), added up.
#[derive(Clone, Debug)]
struct CommitRun {
    variant: Variant,
    /// Commits (loads) added up here.
    loads: u32,
    parts: usize,
    rows: u64,
    /// Wall time of the whole command (process start, config, verification, ledger, attach).
    secs: f64,
    /// The time chpart logs for its commit (from reading the ledger to the commit entry).
    logged_secs: Option<f64>,
    server_cpu: Option<f64>,
    /// CPU of the loopback sshd serving the commit's SFTP sessions (None over the local
    /// transport, or when not readable).
    sshd_cpu: Option<f64>,
    /// Entries the loads have in the ledger after the commit (each one an INSERT).
    ledger_entries: u64,
    /// Size of the largest load's commit plan (a ledger entry's body).
    plan_bytes: u64,
    visible: Option<Seen>,
}

impl CommitRun {
    fn parts_per_sec(&self) -> f64 {
        self.parts as f64 / self.secs
    }

    /// `self` and `other` (a commit of another load) as one figure.
    fn add(self, other: CommitRun) -> CommitRun {
        CommitRun {
            variant: self.variant,
            loads: self.loads + other.loads,
            parts: self.parts + other.parts,
            rows: self.rows + other.rows,
            secs: self.secs + other.secs,
            logged_secs: self.logged_secs.zip(other.logged_secs).map(|(a, b)| a + b),
            server_cpu: self.server_cpu.zip(other.server_cpu).map(|(a, b)| a + b),
            sshd_cpu: self.sshd_cpu.zip(other.sshd_cpu).map(|(a, b)| a + b),
            ledger_entries: self.ledger_entries + other.ledger_entries,
            plan_bytes: self.plan_bytes.max(other.plan_bytes),
            visible: None,
        }
    }
}

/// `chpart commit` exited with a failure: a finding to report, not a reason to stop the run.
#[derive(Debug)]
struct CommitFailed {
    parts: usize,
    message: String,
}

impl std::fmt::Display for CommitFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "chpart commit of {} parts failed: {}",
            self.parts, self.message
        )
    }
}

impl std::error::Error for CommitFailed {}

/// The ATTACH rate of one variant: the load of `--parts` parts in one commit, and, if that
/// commit fails, the same number of parts as several loads of one build each.
#[derive(Clone, Debug)]
struct Attach {
    variant: Variant,
    one_load: Result<CommitRun, String>,
    split: Option<CommitRun>,
}

/// What the polling reader saw while a commit ran; times count from the commit's start.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    /// When a poll first returned rows.
    pub first_rows: Option<Duration>,
    /// When a poll first returned every row of the load.
    pub all_rows: Option<Duration>,
    /// Polls made.
    pub polls: u64,
    /// Their total round-trip time.
    pub poll_time: Duration,
    /// The distinct counts seen (how gradually the load appeared).
    pub counts: BTreeSet<u64>,
    /// The first thing a reader must never see: more rows than the load, or fewer than before.
    pub anomaly: Option<String>,
    last: u64,
}

impl Seen {
    /// Records a poll answered at `at` with `count` rows, of `expected`.
    pub fn observe(&mut self, at: Duration, took: Duration, count: u64, expected: u64) {
        self.polls += 1;
        self.poll_time += took;
        self.counts.insert(count);
        if count > 0 && self.first_rows.is_none() {
            self.first_rows = Some(at);
        }
        if count == expected && self.all_rows.is_none() {
            self.all_rows = Some(at);
        }
        if self.anomaly.is_none() {
            if count > expected {
                self.anomaly = Some(format!(
                    "a reader saw {count} rows at {:.3} s, more than the load's {expected}",
                    at.as_secs_f64()
                ));
            } else if count < self.last {
                self.anomaly = Some(format!(
                    "a reader saw {count} rows at {:.3} s after having seen {}",
                    at.as_secs_f64(),
                    self.last
                ));
            }
        }
        self.last = self.last.max(count);
    }

    fn mean_poll_ms(&self) -> f64 {
        self.poll_time.as_secs_f64() * 1e3 / self.polls.max(1) as f64
    }
}

/// One way of loading the CPU-per-GB rows, and what the server spent on it.
#[derive(Clone, Debug, Default)]
struct CpuRow {
    secs: f64,
    server_cpu: f64,
    uncompressed: u64,
}

impl CpuRow {
    fn per_gb(&self) -> f64 {
        self.server_cpu / (self.uncompressed as f64 / 1e9)
    }
}

/// The CPU-per-GB comparison.
#[derive(Clone, Debug, Default)]
struct CpuResults {
    rows: u64,
    input: String,
    insert: CpuRow,
    begin: CpuRow,
    build: CpuRow,
    commit: CpuRow,
    /// From the end of the commit until the server's merges (of the ledger entries the
    /// commit wrote) are done.
    settle: CpuRow,
    /// One `CHECK TABLE` of the committed parts, alone: what the commit's default content
    /// check (`--verify server`, CHECK TABLE of the shadow before MOVE) costs of its row (b).
    check: CpuRow,
    /// The host's sshd during (b) (over SFTP; None over the local transport).
    commit_sshd_cpu: Option<f64>,
    /// (b') The same rows committed with `--verify full` (every byte read back over SFTP and
    /// hashed by chpart) instead of the server's check, and what the host's sshd spent
    /// serving that (over SFTP only).
    full: Option<(CpuRow, Option<f64>)>,
    chpart_parts: usize,
    /// Server CPU seconds per second while nothing ran.
    idle_rate: f64,
    /// Mean server CPU seconds of a commit of a [`SMALL_ROWS`]-row load: what every commit
    /// costs whatever its size.
    fixed_commit_cpu: f64,
}

impl CpuResults {
    /// chpart's whole part of the load: begin, the builds (their ledger reads), the commit,
    /// the ledger's merges after it.
    fn whole(&self) -> CpuRow {
        let all = [&self.begin, &self.build, &self.commit, &self.settle];
        CpuRow {
            secs: all.iter().map(|r| r.secs).sum(),
            server_cpu: all.iter().map(|r| r.server_cpu).sum(),
            uncompressed: self.commit.uncompressed,
        }
    }
}

/// How long a finished commit's SFTP sessions may take to end on the host.
const SESSIONS_END: Duration = Duration::from_secs(10);

/// Rows of the small loads that measure a commit's fixed cost.
const SMALL_ROWS: u64 = 1000;
/// How many small loads are committed (the server's CPU clock ticks at 10 ms).
const SMALL_LOADS: u32 = 5;

/// Everything the report prints.
#[derive(Clone, Debug, Default)]
struct Results {
    transport: Option<Transport>,
    attach_shape: Option<Shape>,
    load_shape: Option<Shape>,
    rows_per_part: u64,
    /// (1): the first is the headline (`--visibility part` over `--transport`).
    attach: Vec<Attach>,
    /// (2), with the reader's observations.
    visible: Vec<CommitRun>,
    /// (2) again without the reader, as a reference for what the reader costs the commit.
    visible_alone: Vec<CommitRun>,
    cpu: Option<CpuResults>,
    /// Where the server keeps its data (see [`crate::measure::data_disk_line`]).
    data_disk: String,
    /// `[ssh] verify_connections` when set by `--verify-connections`.
    verify_connections: Option<usize>,
}

/// Runs the commit benchmark and prints its report.
pub fn run(options: &CommitOptions) -> anyhow::Result<()> {
    let attach_shape = Shape::for_parts(options.parts).context("--parts")?;
    let load_shape = Shape::for_parts(options.load_parts).context("--load-parts")?;
    if options.rows_per_part == 0 {
        bail!("--rows-per-part must be at least 1");
    }
    if !options.no_cpu && options.rows == 0 {
        bail!("--rows must be at least 1");
    }
    let chpart = Chpart::find(options.chpart.as_deref(), &["begin", "build", "commit"], "")?;

    let mut builder = tempfile::Builder::new();
    builder.prefix("chpart-bench-commit-");
    let dir = match &options.work_dir {
        Some(parent) => builder.tempdir_in(parent),
        None => builder.tempdir(),
    }
    .context("create the benchmark's directory")?;
    let root = dir.path().to_path_buf();
    println!("chpart-bench commit: working in {}", root.display());

    println!("starting ClickHouse 26.9 (chdb) and sshd on 127.0.0.1 ...");
    let server = ClickHouse::start(None);
    let sshd = Sshd::start(&[]);
    sql(&server, &format!("CREATE DATABASE {DATABASE}"))?;
    let staging = server.data_dir.join("chpart-staging");
    fs::create_dir_all(&staging)?;
    let configs = Configs::write(
        &root,
        &server,
        &sshd,
        &chpart_testenv::clickhouse_local(),
        &staging,
    )?;
    if let Some(n) = options.verify_connections {
        // `[ssh]` is the SFTP config's last section.
        let mut sftp = fs::OpenOptions::new().append(true).open(&configs.sftp)?;
        std::io::Write::write_all(&mut sftp, format!("verify_connections = {n}\n").as_bytes())?;
    }
    let bench = Bench {
        root: &root,
        server: &server,
        sshd: &sshd,
        chpart: &chpart,
        configs: &configs,
        options,
    };

    let data_disk = crate::measure::data_disk_line(&server.data_dir);
    println!("{data_disk}");
    let mut results = Results {
        data_disk,
        verify_connections: options.verify_connections,
        transport: Some(options.transport),
        attach_shape: Some(attach_shape),
        load_shape: Some(load_shape),
        rows_per_part: options.rows_per_part,
        ..Results::default()
    };
    // The CPU comparison first, on the fresh server: the ledger entries of the small-part loads
    // leave the server merging for a while.
    if !options.no_cpu {
        println!(
            "(3) server CPU per GB: {} rows by HTTP INSERT and by chpart ...",
            options.rows
        );
        let cpu = bench.cpu_per_gb()?;
        println!(
            "    INSERT {:.2} CPU s, chpart commit {:.3} CPU s",
            cpu.insert.server_cpu, cpu.commit.server_cpu
        );
        results.cpu = Some(cpu);
    }
    let part = Variant {
        visibility: "part",
        transport: options.transport,
    };
    let partition = Variant {
        visibility: "partition",
        ..part
    };
    let mut attach_variants = vec![part];
    if options.transport == Transport::Sftp {
        // How much of the commit is verifying the parts over SFTP.
        attach_variants.push(Variant {
            transport: Transport::Local,
            ..part
        });
    }
    let mut visible_variants = vec![part];
    if !options.no_partition_visibility {
        attach_variants.push(partition);
        visible_variants.push(partition);
    }
    for variant in attach_variants {
        println!(
            "(1) ATTACH rate, {}: {} builds of {} parts ...",
            variant.label(),
            attach_shape.builds,
            attach_shape.per_build
        );
        let name = format!("attach_{}", variant.slug());
        let load = bench.prepare(&name, variant, attach_shape)?;
        let one_load = match bench.commit(&load, false) {
            Ok(run) => {
                println!(
                    "    {} parts in {:.2} s: {:.0} parts/s",
                    run.parts,
                    run.secs,
                    run.parts_per_sec()
                );
                Ok(run)
            }
            Err(e) => match e.downcast::<CommitFailed>() {
                Ok(failed) => {
                    println!("    {failed}");
                    Err(failed.message)
                }
                Err(e) => return Err(e),
            },
        };
        let split = match (&one_load, attach_shape.builds) {
            (Err(_), builds) if builds > 1 => {
                println!(
                    "    the same {} parts as {builds} loads of {} parts (one build each) ...",
                    attach_shape.parts(),
                    attach_shape.per_build
                );
                let one_build = Shape {
                    builds: 1,
                    ..attach_shape
                };
                let mut total: Option<CommitRun> = None;
                for index in 0..builds {
                    let load = bench.prepare(&format!("{name}_{index}"), variant, one_build)?;
                    let run = bench.commit(&load, false)?;
                    total = Some(match total {
                        Some(total) => total.add(run),
                        None => run,
                    });
                }
                total
            }
            _ => None,
        };
        if let Some(run) = &split {
            println!(
                "    {} parts in {} commits, {:.2} s: {:.0} parts/s",
                run.parts,
                run.loads,
                run.secs,
                run.parts_per_sec()
            );
        }
        results.attach.push(Attach {
            variant,
            one_load,
            split,
        });
    }
    for variant in visible_variants {
        println!(
            "(2) time to visible, {}: {} parts ...",
            variant.label(),
            load_shape.parts()
        );
        let name = format!("visible_{}", variant.slug());
        let load = bench.prepare(&format!("{name}_alone"), variant, load_shape)?;
        let alone = bench.commit(&load, false)?;
        let load = bench.prepare(&name, variant, load_shape)?;
        let run = bench.commit(&load, true)?;
        if let Some(seen) = &run.visible {
            println!(
                "    commit {:.3} s without a reader; with it {:.3} s, all rows visible at {}",
                alone.secs,
                run.secs,
                secs_or_dash(seen.all_rows)
            );
        }
        results.visible_alone.push(alone);
        results.visible.push(run);
    }

    print!("{}", report(&results));
    if options.keep {
        let kept = dir.keep();
        println!(
            "kept {} (the server and sshd directories are removed on exit)",
            kept.display()
        );
    }
    Ok(())
}

/// Runs a query that answers one number.
fn number(server: &ClickHouse, query: &str) -> anyhow::Result<u64> {
    let text = sql(server, query)?;
    text.trim()
        .parse()
        .with_context(|| format!("{query}: answered {text:?}"))
}

/// A load begun and built, waiting for its commit.
struct Prepared {
    variant: Variant,
    table: String,
    load: String,
    shadow: Option<String>,
    winners: PathBuf,
    builds: u32,
    parts: usize,
    rows: u64,
    /// `--verify` of its commit; chpart's default (`auto`) when None.
    verify: Option<&'static str>,
}

/// What the steps share.
struct Bench<'a> {
    root: &'a Path,
    server: &'a ClickHouse,
    sshd: &'a Sshd,
    chpart: &'a Chpart,
    configs: &'a Configs,
    options: &'a CommitOptions,
}

impl Bench<'_> {
    fn config(&self, transport: Transport) -> &Path {
        match transport {
            Transport::Sftp => &self.configs.sftp,
            Transport::Local => &self.configs.local,
        }
    }

    /// The input of build `index` of a load of `shape`: one hour of `per_build * rows_per_part`
    /// events, made once and shared by every load of that shape.
    fn small_input(&self, shape: Shape, index: u32) -> anyhow::Result<PathBuf> {
        let path = self
            .root
            .join("inputs")
            .join(format!("hourly-p{}-{index}.parquet", shape.per_build));
        if !path.exists() {
            generate(&GenOptions {
                rows: u64::from(shape.per_build) * self.options.rows_per_part,
                out: path.clone(),
                files: 1,
                seed: self.options.seed,
                hour_start_secs: self.options.hour_start_secs + i64::from(index) * 3600,
            })?;
        }
        Ok(path)
    }

    /// Stops merges on the table (see the module comment).
    fn stop_merges(&self, table: &str) -> anyhow::Result<()> {
        sql(self.server, &format!("SYSTEM STOP MERGES {table}")).map(drop)
    }

    /// Waits until the server has run no merge for [`QUIET_FOR`] (at most [`QUIET_LIMIT`]), so
    /// that what earlier steps left it doing (merging the ledger's small parts) is not billed
    /// to the next one.
    fn wait_quiet(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut quiet_since = Instant::now();
        while started.elapsed() < QUIET_LIMIT {
            if interrupt::requested() {
                bail!("interrupted");
            }
            if number(self.server, "SELECT count() FROM system.merges")? > 0 {
                quiet_since = Instant::now();
            } else if quiet_since.elapsed() >= QUIET_FOR {
                return Ok(());
            }
            std::thread::sleep(QUIET_POLL);
        }
        eprintln!(
            "chpart-bench: the server still merges after {} s; measuring anyway",
            QUIET_LIMIT.as_secs()
        );
        Ok(())
    }

    /// Creates the target `db.<name>` and begins a load into it with the variant's visibility;
    /// returns the load id and the shadow table (partition visibility), merges stopped on both.
    fn begin(
        &self,
        table: &str,
        variant: Variant,
    ) -> anyhow::Result<(String, Option<String>, Measured)> {
        let (db, name) = table.split_once('.').expect("db.table");
        let load = format!("bench-{}", name.replace('_', "-"));
        let run = self
            .chpart
            .begin(&self.configs.local, table, &load, Some(variant.visibility))?;
        let shadow = if variant.visibility == "partition" {
            let found = sql(
                self.server,
                &format!(
                    "SELECT name FROM system.tables WHERE database = '{db}' \
                     AND startsWith(name, '{name}__chpart_')"
                ),
            )?;
            let shadows: Vec<&str> = found.lines().filter(|l| !l.is_empty()).collect();
            let [shadow] = shadows[..] else {
                bail!("expected one shadow table of {table} after chpart begin, found {shadows:?}");
            };
            let shadow = format!("{db}.{shadow}");
            self.stop_merges(&shadow)?;
            Some(shadow)
        } else {
            None
        };
        Ok((load, shadow, run))
    }

    /// Creates the target `db.<name>`, begins a load into it and builds it as `shape.builds`
    /// attempts; returns it with its winners file written.
    fn prepare(&self, name: &str, variant: Variant, shape: Shape) -> anyhow::Result<Prepared> {
        let table = format!("{DATABASE}.{name}");
        sql(
            self.server,
            &events::ddl_partitioned(&table, &shape.partition_key()),
        )?;
        self.stop_merges(&table)?;
        let (load, shadow, _) = self.begin(&table, variant)?;
        let mut winners = String::new();
        let (mut parts, mut rows, mut input_rows) = (0, 0, 0);
        for index in 0..shape.builds {
            if interrupt::requested() {
                bail!("interrupted");
            }
            let input = self.small_input(shape, index)?;
            input_rows += u64::from(shape.per_build) * self.options.rows_per_part;
            let attempt = format!("bench.{index}");
            let (_, manifest) =
                self.chpart
                    .build(&self.configs.local, &load, index, &attempt, &[input], false)?;
            parts += manifest.parts;
            rows += manifest.rows;
            winners.push_str(&manifest.line);
            winners.push('\n');
        }
        if rows != input_rows {
            bail!("the builds of {load} report {rows} rows from inputs of {input_rows}");
        }
        let path = self.root.join(format!("winners-{name}.jsonl"));
        fs::write(&path, winners)?;
        Ok(Prepared {
            variant,
            table,
            load,
            shadow,
            winners: path,
            builds: shape.builds,
            parts,
            rows,
            verify: None,
        })
    }

    /// Runs `chpart commit` of `load`, with a polling reader if `poll`, and checks the result.
    fn commit(&self, load: &Prepared, poll: bool) -> anyhow::Result<CommitRun> {
        let mut cmd = self.chpart.commit_command(
            self.config(load.variant.transport),
            &load.load,
            &load.winners,
            load.builds,
            load.variant.visibility,
        );
        if let Some(verify) = load.verify {
            cmd.args(["--verify", verify]);
        }
        let count_query = format!("SELECT count() FROM {}", load.table);
        self.wait_quiet()?;
        let sftp = load.variant.transport == Transport::Sftp;
        if sftp && !self.sshd.wait_sessions_ended(SESSIONS_END) {
            bail!("sshd still serves an earlier session after {SESSIONS_END:?}");
        }
        let sshd_cpu = self.sshd.cpu_seconds();
        let cpu = self.server.cpu_seconds();
        let (run, seen) = if poll {
            let stop = AtomicBool::new(false);
            let (run, seen) = std::thread::scope(|scope| {
                let started = Instant::now();
                let (stop, count_query) = (&stop, &count_query);
                let reader = scope
                    .spawn(move || poll_count(self.server, count_query, load.rows, started, stop));
                let run = measure::run(&mut cmd);
                stop.store(true, Ordering::SeqCst);
                (run, reader.join().expect("the reader does not panic"))
            });
            (run?, Some(seen?))
        } else {
            (measure::run(&mut cmd)?, None)
        };
        let server_cpu = cpu.zip(self.server.cpu_seconds()).map(|(a, b)| b - a);
        // The sessions' CPU reaches the daemon's counters when they are reaped.
        let sshd_cpu = if sftp && self.sshd.wait_sessions_ended(SESSIONS_END) {
            sshd_cpu.zip(self.sshd.cpu_seconds()).map(|(a, b)| b - a)
        } else {
            None
        };
        if !run.status.success() {
            return Err(CommitFailed {
                parts: load.parts,
                message: format!(
                    "{}: {}",
                    run.status,
                    shorten_error(measure::tail(&run.stderr, 1).trim())
                ),
            }
            .into());
        }
        self.check_committed(load, &run)?;
        if let Some(anomaly) = seen.as_ref().and_then(|s| s.anomaly.clone()) {
            bail!("load {}: {anomaly}", load.load);
        }
        let ledger_entries = number(
            self.server,
            &format!(
                "SELECT count() FROM {LEDGER} WHERE load_id = {}",
                quote(&load.load)
            ),
        )?;
        let plan_bytes = number(
            self.server,
            &format!(
                "SELECT max(length(body)) FROM {LEDGER} WHERE load_id = {} AND entry_id = 'plan'",
                quote(&load.load)
            ),
        )?;
        Ok(CommitRun {
            variant: load.variant,
            loads: 1,
            plan_bytes,
            parts: load.parts,
            rows: load.rows,
            secs: run.wall.as_secs_f64(),
            logged_secs: logged_commit_secs(&String::from_utf8_lossy(&run.stderr)),
            server_cpu,
            sshd_cpu,
            ledger_entries,
            visible: seen,
        })
    }

    /// A benchmark of a wrong result is worthless: the commit must report, and the target must
    /// hold, exactly the load's rows and parts, with nothing left behind.
    fn check_committed(&self, load: &Prepared, run: &Measured) -> anyhow::Result<()> {
        let stdout = run.stdout_text();
        let line = stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .context("chpart commit printed no summary")?;
        let summary: serde_json::Value =
            serde_json::from_str(line).context("chpart commit's summary is not JSON")?;
        let (parts, rows) = (summary["parts"].as_u64(), summary["rows"].as_u64());
        if parts != Some(load.parts as u64) || rows != Some(load.rows) {
            bail!(
                "chpart commit of {} reports {parts:?} parts and {rows:?} rows, the builds made {} \
                 and {}",
                load.load,
                load.parts,
                load.rows
            );
        }
        let (db, name) = load.table.split_once('.').expect("db.table");
        let counted = number(self.server, &format!("SELECT count() FROM {}", load.table))?;
        let active = number(
            self.server,
            &format!(
                "SELECT count() FROM system.parts WHERE database = '{db}' AND table = '{name}' \
                 AND active"
            ),
        )?;
        let mut tables = vec![quote(name)];
        let mut in_shadow = 0;
        if let Some(shadow) = &load.shadow {
            let (_, shadow_name) = shadow.split_once('.').expect("db.table");
            tables.push(quote(shadow_name));
            let exists = number(
                self.server,
                &format!(
                    "SELECT count() FROM system.tables WHERE database = '{db}' AND name = {}",
                    quote(shadow_name)
                ),
            )?;
            if exists > 0 {
                in_shadow = number(self.server, &format!("SELECT count() FROM {shadow}"))?;
            }
        }
        let detached = number(
            self.server,
            &format!(
                "SELECT count() FROM system.detached_parts WHERE database = '{db}' \
                 AND table IN ({})",
                tables.join(", ")
            ),
        )?;
        if counted != load.rows || active != load.parts as u64 || detached != 0 || in_shadow != 0 {
            bail!(
                "after committing {}: {} holds {counted} rows in {active} active parts (expected \
                 {} rows in {} parts), {detached} part(s) left in detached/, {in_shadow} rows \
                 left in the shadow table",
                load.load,
                load.table,
                load.rows,
                load.parts
            );
        }
        Ok(())
    }
}

/// Polls `query` (a count) until `stop` is set, then once more; what it saw, timed from
/// `started`.
fn poll_count(
    server: &ClickHouse,
    query: &str,
    expected: u64,
    started: Instant,
    stop: &AtomicBool,
) -> anyhow::Result<Seen> {
    let mut seen = Seen::default();
    loop {
        let last = stop.load(Ordering::SeqCst);
        let sent = Instant::now();
        let count = number(server, query)?;
        seen.observe(started.elapsed(), sent.elapsed(), count, expected);
        if last {
            return Ok(seen);
        }
        std::thread::sleep(POLL_PAUSE);
    }
}

/// The seconds `chpart commit` logs for itself: the last line of the form
/// `load L committed into T: ..., 1.23s`.
fn logged_commit_secs(log: &str) -> Option<f64> {
    let line = log.lines().rev().find(|l| l.contains(" committed into "))?;
    line.trim()
        .rsplit_once(", ")?
        .1
        .strip_suffix('s')?
        .parse()
        .ok()
}

/// chpart's error line without the SQL it quotes (`(while running: ...)`) and without the
/// repetition of its last cause (`...: X: X`), so that the report shows the reason.
fn shorten_error(line: &str) -> String {
    const MARK: &str = " (while running: ";
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find(MARK) {
        out.push_str(&rest[..start]);
        let mut depth = 1;
        let mut end = rest.len();
        for (i, c) in rest[start + MARK.len()..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = start + MARK.len() + i + 1;
                break;
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    for (i, _) in out.match_indices(": ") {
        let tail = &out[i + 2..];
        let head = &out[..i];
        if !tail.is_empty() && (head == tail || head.ends_with(&format!(": {tail}"))) {
            return out[..i].to_owned();
        }
    }
    out
}

#[cfg(test)]
mod tests;
