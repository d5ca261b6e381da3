//! `chpart-bench cluster`: loads into a `Distributed` table over several shards (one 26.9
//! server per shard on its own loopback address), measured in one run beside ClickHouse's own
//! way of loading the same table.
//!
//! 1. **Load**: the same generated rows (`--tasks` Parquet files, one per task) loaded (a) by
//!    `INSERT INTO <distributed table> FORMAT Parquet SETTINGS insert_distributed_sync = 1` over
//!    HTTP to the entry server, file by file (the servers decode, route, forward, sort and
//!    compress), and (b) by chpart (`begin`, one `build` per file, `commit`): the wall time of
//!    each and the servers' CPU summed over every shard, per GB of uncompressed data in the
//!    shards' local tables. Both loads are checked: the same rows on every shard.
//!    `--no-load` skips this part.
//! 2. **Commit across shards**: a load of about `--parts` small parts (a partition key that cuts
//!    each hour into 100 partitions, one hour per build) committed into the N-shard table, and
//!    the same number of parts committed into a one-shard cluster: the shards commit in
//!    parallel, so the N-shard commit should take about the one-shard time, not N times it,
//!    and each shard's server should spend about 1/N of the one server's CPU on it (plus the
//!    commit's fixed cost per shard). Each server's CPU (user + system of its process, from
//!    /proc) is read right before and after the commit, net of its idle CPU measured before.
//!
//! Merges are stopped on every table, so neither way of loading gets background merges billed
//! to it and the parts counted are the parts attached; the parts and rows attached are checked
//! against the winners' manifests. Nothing here asserts a timing: the targets are printed as
//! PASS or MISS.
//!
//! Up to 7 shards, the nodes are on the loopback aliases ClickHouse counts as the machine
//! itself (each node is `is_local` for its own shard, as a production host is); more shards
//! take a private `127.a.b.0/24`, where every shard, the entry node's own included, is
//! reached over TCP (see `chpart_testenv::cluster::Addresses`).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use chpart_testenv::cluster::{self as testcluster, Addresses, Cluster};

use crate::chpart::{Chpart, ManifestSummary};
use crate::events;
use crate::gen::{generate, GenOptions};
use crate::http::{self, sql};

/// Partitions per hour of the small-parts loads (clickhouse-local refuses an insert block that
/// touches more than 100 partitions).
const PARTS_PER_BUILD: u32 = 100;
/// Rows per small part.
const ROWS_PER_PART: u64 = 200;
/// Shards of the loopback aliases ClickHouse counts as local; more take a private /24.
const SELF_LOCAL_NODES: u32 = 7;
/// The per-shard CPU target: each shard's net CPU during the N-shard commit at most this many
/// times the one server's CPU for the same parts divided by N. Each shard's work is 1/N of the
/// parts (ATTACH, checks) plus a fixed cost that does not shrink with N (about 0.1 CPU s per
/// shard: its ledger writes, observations, `CHECK TABLE` of its shadow), and the hash split
/// gives the shards a few per cent more or fewer parts than 1/N; twice 1/N covers both at the
/// sizes run here and still fails a shard that does a large share of the whole load (a shard
/// doing it all is N/2 times over).
const SHARD_CPU_FACTOR: f64 = 2.0;
/// The wall-time target: the N-shard commit at most this many times the one-shard commit of
/// the same parts (the shards commit in parallel, each 1/N of the parts).
const WALL_FACTOR: f64 = 1.0;
/// Seconds each server's idle CPU is sampled for, to net it out of the figures.
const IDLE_SAMPLE_SECS: u64 = 3;

/// What `chpart-bench cluster` is asked for.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Rows of the load benchmark.
    pub rows: u64,
    /// Shards of the cluster (one server each).
    pub shards: u32,
    /// Tasks (input files, builds) of the load benchmark.
    pub tasks: usize,
    /// About this many parts in the commit benchmark.
    pub parts: u32,
    /// Skip part 1 (the load through the Distributed engine vs chpart).
    pub no_load: bool,
    /// Seed of the generated rows.
    pub seed: u64,
    /// The hour the events fall in (seconds since the epoch).
    pub hour_start_secs: i64,
    /// The chpart binary.
    pub chpart: Option<PathBuf>,
    /// Where the benchmark's directory is made.
    pub work_dir: Option<PathBuf>,
}

/// A cluster with the benchmark's tables and a chpart config for it.
struct Bed {
    cluster: Cluster,
    config: PathBuf,
}

impl Bed {
    /// A cluster named `name` of `shards` servers of weight 1, each with `db.<local>` (partition
    /// key `partition_by`) and, on the first, `db.<dist>` over it sharded by `cityHash64(user_id)`.
    fn start(root: &Path, name: &str, shards: u32) -> anyhow::Result<Bed> {
        let weights = vec![1; shards as usize];
        let addresses = if shards <= SELF_LOCAL_NODES {
            Addresses::SelfLocal
        } else {
            Addresses::Private24
        };
        let cluster = Cluster::start_with(
            name,
            &weights,
            &testcluster::ClusterOptions {
                addresses,
                ..testcluster::ClusterOptions::default()
            },
        );
        let dir = root.join(name);
        fs::create_dir_all(&dir)?;
        let entry = &cluster.nodes[0].server;
        let mut config = format!(
            "[clickhouse]\nurl = \"{}\"\nrequest_timeout_secs = 600\n[transport]\nkind = \"local\"\n\
             [clickhouse_local]\ncommand = \"{}\"\nwork_dir = \"{}\"\n[staging]\nroot = \"{}\"\n\
             [ledger]\ndatabase = \"chpart\"\n",
            entry.url(),
            chpart_testenv::clickhouse_local().display(),
            dir.join("work").display(),
            entry.data_dir.join("chpart-staging").display()
        );
        for node in &cluster.nodes {
            write!(
                config,
                "[[hosts]]\nname = \"{}\"\nstaging_root = \"{}\"\n",
                node.address,
                node.data_dir().join("chpart-staging").display()
            )?;
            sql(&node.server, "CREATE DATABASE db")?;
        }
        let path = dir.join("chpart.toml");
        fs::write(&path, config)?;
        Ok(Bed {
            cluster,
            config: path,
        })
    }

    /// `db.<local>` on every shard (merges stopped) and `db.<dist>` over it on the first.
    fn table(&self, local: &str, dist: &str, partition_by: &str) -> anyhow::Result<()> {
        for node in &self.cluster.nodes {
            sql(
                &node.server,
                &events::ddl_partitioned(&format!("db.{local}"), partition_by),
            )?;
            sql(&node.server, &format!("SYSTEM STOP MERGES db.{local}"))?;
        }
        sql(
            &self.cluster.nodes[0].server,
            &format!(
                "CREATE TABLE db.{dist} AS db.{local} ENGINE = Distributed({}, db, {local}, cityHash64(user_id))",
                self.cluster.name
            ),
        )
        .map(drop)
    }

    /// The servers' CPU seconds, summed.
    fn cpu(&self) -> anyhow::Result<f64> {
        Ok(self.cpu_per_shard()?.iter().sum())
    }

    /// Each shard's server's CPU seconds so far (user + system of its process), in node order.
    fn cpu_per_shard(&self) -> anyhow::Result<Vec<f64>> {
        self.cluster
            .nodes
            .iter()
            .map(|n| {
                n.server
                    .cpu_seconds()
                    .context("a server's CPU time (/proc/<pid>/stat) is not readable")
            })
            .collect()
    }

    /// Each shard's server's memory in MB as its memory tracker counts it (`MemoryTracking`;
    /// this engine has no `system.asynchronous_metrics` to give the resident set), node order.
    fn tracked_mb(&self) -> anyhow::Result<Vec<f64>> {
        self.cluster
            .nodes
            .iter()
            .map(|n| {
                let text = sql(
                    &n.server,
                    "SELECT value FROM system.metrics WHERE metric = 'MemoryTracking'",
                )?;
                Ok(text.trim().parse::<f64>()? / 1e6)
            })
            .collect()
    }

    /// Per shard: rows and uncompressed bytes of `db.<local>`.
    fn shards(&self, local: &str) -> anyhow::Result<Vec<(u64, u64)>> {
        self.per_shard(local, "sum(rows), sum(data_uncompressed_bytes)")
    }

    /// Per shard: active parts and rows of `db.<local>`.
    fn parts(&self, local: &str) -> anyhow::Result<Vec<(u64, u64)>> {
        self.per_shard(local, "count(), sum(rows)")
    }

    /// Per shard: two numbers `columns` gives over the active parts of `db.<local>`.
    fn per_shard(&self, local: &str, columns: &str) -> anyhow::Result<Vec<(u64, u64)>> {
        self.cluster
            .nodes
            .iter()
            .map(|n| {
                let text = sql(
                    &n.server,
                    &format!(
                        "SELECT {columns} FROM system.parts \
                         WHERE database = 'db' AND table = '{local}' AND active"
                    ),
                )?;
                let mut fields = text.split_whitespace().map(str::parse::<u64>);
                match (fields.next(), fields.next()) {
                    (Some(Ok(a)), Some(Ok(b))) => Ok((a, b)),
                    _ => bail!("unexpected answer {text:?}"),
                }
            })
            .collect()
    }
}

/// What a chpart load's commit took and what its winners hold.
struct Commit {
    /// Wall seconds of `chpart commit`.
    secs: f64,
    /// Each shard's server's CPU seconds during the commit, gross (idle included), node order.
    cpu: Vec<f64>,
    /// Parts in the winners' manifests.
    parts: u64,
    /// Rows in them.
    rows: u64,
}

/// The median of `values` (the mean of the middle two for an even count); 0 if empty.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Each server's idle CPU rate (CPU s/s) over [`IDLE_SAMPLE_SECS`], for every bed at once.
fn idle_rates(beds: &[&Bed]) -> anyhow::Result<Vec<Vec<f64>>> {
    let before = beds
        .iter()
        .map(|b| b.cpu_per_shard())
        .collect::<anyhow::Result<Vec<_>>>()?;
    let t = Instant::now();
    std::thread::sleep(std::time::Duration::from_secs(IDLE_SAMPLE_SECS));
    let secs = t.elapsed().as_secs_f64();
    beds.iter()
        .zip(before)
        .map(|(b, before)| {
            Ok(b.cpu_per_shard()?
                .iter()
                .zip(before)
                .map(|(after, before)| (after - before) / secs)
                .collect())
        })
        .collect()
}

/// One chpart command, checked; its stdout.
fn chpart(chpart: &Chpart, args: &[&str], config: &Path) -> anyhow::Result<String> {
    Ok(chpart.run(config, args)?.stdout_text())
}

/// Begins `load` into `db.<dist>` of `bed`, builds one attempt per input and commits them;
/// returns the commit's wall time and each shard server's CPU during it.
fn load_with_chpart(
    bin: &Chpart,
    bed: &Bed,
    dist: &str,
    load: &str,
    inputs: &[PathBuf],
    winners: &Path,
) -> anyhow::Result<Commit> {
    let config = &bed.config;
    chpart(
        bin,
        &["begin", "--table", &format!("db.{dist}"), "--load", load],
        config,
    )?;
    let (mut lines, mut parts, mut rows) = (Vec::new(), 0, 0);
    for (p, input) in inputs.iter().enumerate() {
        let out = chpart(
            bin,
            &[
                "build",
                "--load",
                load,
                "--partition",
                &p.to_string(),
                "--attempt",
                &format!("bench.{p}"),
                "--input",
                &input.display().to_string(),
            ],
            config,
        )?;
        let manifest = ManifestSummary::parse(&out)?;
        parts += manifest.parts as u64;
        rows += manifest.rows;
        lines.push(manifest.line);
    }
    fs::write(winners, lines.join("\n") + "\n")?;
    let cpu = bed.cpu_per_shard()?;
    let started = Instant::now();
    chpart(
        bin,
        &[
            "commit",
            "--load",
            load,
            "--winners",
            &winners.display().to_string(),
            "--partitions",
            &inputs.len().to_string(),
        ],
        config,
    )?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = bed
        .cpu_per_shard()?
        .iter()
        .zip(cpu)
        .map(|(after, before)| after - before)
        .collect();
    Ok(Commit {
        secs,
        cpu,
        parts,
        rows,
    })
}

/// Runs the benchmark and prints its report.
pub fn run(options: &ClusterOptions) -> anyhow::Result<()> {
    let root = tempfile::Builder::new()
        .prefix("chpart-bench-cluster-")
        .tempdir_in(options.work_dir.clone().unwrap_or_else(std::env::temp_dir))?;
    let bin = Chpart::find(
        options.chpart.as_deref(),
        &["begin", "build", "commit", "plan"],
        "",
    )?;
    let shards = options.shards;
    let started = Instant::now();
    // Progress on stderr with the seconds since the start: how long each phase takes.
    let phase = |what: &str| eprintln!("[{:7.1} s] {what}", started.elapsed().as_secs_f64());
    phase(&format!(
        "starting a cluster of {shards} servers and one of 1"
    ));
    let bed = Bed::start(root.path(), "bench_n", shards)?;
    let one = Bed::start(root.path(), "bench_1", 1)?;
    let mut report = String::new();
    writeln!(
        report,
        "chpart-bench cluster: {shards} shards (one 26.9 server each, loopback {}), {} rows in {} task(s){}; {} parts in the commit benchmark",
        if shards <= SELF_LOCAL_NODES {
            "aliases the servers count as local"
        } else {
            "addresses of a private /24, every shard reached over TCP"
        },
        options.rows,
        options.tasks,
        if options.no_load { " (skipped: --no-load)" } else { "" },
        options.parts
    )?;
    writeln!(report, "{}", crate::measure::data_disk_line(root.path()))?;

    if !options.no_load {
        load_benchmark(options, &bin, &bed, root.path(), &mut report, &phase)?;
    }

    // 2. Commit of many parts over N shards vs one.
    let key = format!(
        "(toStartOfHour(ts), intDiv(toUnixTimestamp(ts) % 3600 * {PARTS_PER_BUILD}, 3600))"
    );
    bed.table("small_local", "small", &key)?;
    one.table("small_local", "small", &key)?;
    // The same parts both ways: each build makes 100 parts on every shard it reaches (all, at
    // this size), so the one-shard load gets `shards` times the builds (and rows: its parts
    // hold 200 rows, the N-shard load's about 200/N). Each shard then attaches 1/N of the
    // parts the one shard attaches.
    let builds_n = options.parts.div_ceil(PARTS_PER_BUILD * shards).max(1);
    let builds_1 = builds_n * shards;
    phase(&format!("generating {builds_1} inputs of one hour each"));
    let hourly: Vec<PathBuf> = (0..builds_1.max(builds_n))
        .map(|i| {
            let out = root.path().join("inputs").join(format!("hour-{i}.parquet"));
            generate(&GenOptions {
                rows: u64::from(PARTS_PER_BUILD) * ROWS_PER_PART,
                out,
                files: 1,
                seed: options.seed,
                hour_start_secs: options.hour_start_secs + i64::from(i) * 3600,
            })
            .map(|g| g.paths[0].clone())
        })
        .collect::<anyhow::Result<_>>()?;
    // Idle CPU of every server, both clusters, before either load: the builds below touch only
    // the entry servers' ledgers, and the commits are measured on their own.
    let idle = idle_rates(&[&bed, &one])?;
    phase(&format!(
        "building and committing about {} parts over {shards} shards ({builds_n} builds)",
        options.parts
    ));
    let n = load_with_chpart(
        &bin,
        &bed,
        "small",
        "bench-small-n",
        &hourly[..builds_n as usize],
        &root.path().join("winners-n.jsonl"),
    )?;
    phase(&format!(
        "committed over {shards} shards in {:.2} s; building and committing about {} parts into one shard ({builds_1} builds)",
        n.secs, options.parts
    ));
    let n_attached = bed.parts("small_local")?;
    let o = load_with_chpart(
        &bin,
        &one,
        "small",
        "bench-small-1",
        &hourly[..builds_1 as usize],
        &root.path().join("winners-1.jsonl"),
    )?;
    phase(&format!("committed into one shard in {:.2} s", o.secs));
    let o_attached = one.parts("small_local")?;
    // What was attached is what the winners hold, on both clusters.
    let total = |s: &[(u64, u64)]| s.iter().fold((0, 0), |(p, r), (a, b)| (p + a, r + b));
    let ((n_parts, n_rows), (one_parts, one_rows)) = (total(&n_attached), total(&o_attached));
    if (n_parts, n_rows) != (n.parts, n.rows) || (one_parts, one_rows) != (o.parts, o.rows) {
        bail!(
            "attached (parts, rows) differ from the winners': {shards} shards {:?} vs {:?}, one shard {:?} vs {:?}",
            (n_parts, n_rows),
            (n.parts, n.rows),
            (one_parts, one_rows),
            (o.parts, o.rows)
        );
    }
    // Each server's CPU during its commit, net of what it spends idle over as long.
    let net = |gross: &[f64], idle: &[f64], secs: f64| -> Vec<f64> {
        gross
            .iter()
            .zip(idle)
            .map(|(g, rate)| (g - rate * secs).max(0.0))
            .collect()
    };
    let n_cpu = net(&n.cpu, &idle[0], n.secs);
    let one_cpu = net(&o.cpu, &idle[1], o.secs)[0];
    // The entry node (the first) also holds the ledger; the others only their own parts.
    let others = &n_cpu[1..];
    let min_max = |v: &[f64]| {
        v.iter().fold((f64::INFINITY, 0.0_f64), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
    };
    let (lo, hi) = min_max(&n_cpu);
    let mem_n = bed.tracked_mb()?;
    let mem_1 = one.tracked_mb()?;

    writeln!(
        report,
        "\n2. commit of many small parts: {shards} shards vs one"
    )?;
    writeln!(
        report,
        "| cluster | parts (per shard min-max) | rows | builds | commit wall s | parts/s | server CPU s during the commit, net of idle: per shard min / median / max |"
    )?;
    writeln!(report, "| --- | --- | --- | --- | --- | --- | --- |")?;
    let per_shard_parts = n_attached.iter().map(|(p, _)| *p);
    writeln!(
        report,
        "| {shards} shards | {n_parts} ({}-{}) | {n_rows} | {builds_n} | {:.2} | {:.0} | {lo:.2} / {:.2} / {hi:.2} (entry shard, which holds the ledger: {:.2}) |",
        per_shard_parts.clone().min().unwrap_or(0),
        per_shard_parts.max().unwrap_or(0),
        n.secs,
        n_parts as f64 / n.secs,
        median(&n_cpu),
        n_cpu[0]
    )?;
    writeln!(
        report,
        "| 1 shard | {one_parts} | {one_rows} | {builds_1} | {:.2} | {:.0} | {one_cpu:.2} |",
        o.secs,
        one_parts as f64 / o.secs
    )?;
    writeln!(
        report,
        "idle CPU (s/s) per server, measured {IDLE_SAMPLE_SECS} s before the loads: {shards} shards {:.3}-{:.3}, one shard {:.3}; tracked memory per server after the commits (MemoryTracking): {shards} shards {:.0}-{:.0} MB, one shard {:.0} MB",
        min_max(&idle[0]).0,
        min_max(&idle[0]).1,
        idle[1][0],
        min_max(&mem_n).0,
        min_max(&mem_n).1,
        mem_1[0]
    )?;
    let verdict = |pass: bool| if pass { "PASS" } else { "MISS" };
    let ratio = n.secs / o.secs;
    writeln!(
        report,
        "commit wall time, {shards} shards / one shard: {ratio:.2}x ({}: target <= {WALL_FACTOR:.1}x, the shards commit in parallel, each 1/{shards} of the parts; {shards}x would be one shard after another)",
        verdict(ratio <= WALL_FACTOR)
    )?;
    let share = one_cpu / f64::from(shards);
    let target = SHARD_CPU_FACTOR * share;
    let others_max = min_max(others).1;
    if !others.is_empty() {
        writeln!(
            report,
            "server CPU per shard: one shard's {one_cpu:.2} s / {shards} = {share:.3} s; shards other than the entry: median {:.3} s = {:.2}x that, max {others_max:.3} s = {:.2}x ({}: target each <= {SHARD_CPU_FACTOR:.0}x, 1/{shards} of the work plus each shard's fixed cost)",
            median(others),
            median(others) / share,
            others_max / share,
            verdict(others_max <= target)
        )?;
    }
    writeln!(
        report,
        "entry shard (its own parts plus the ledger of the whole load): {:.3} s = {:.2}x one shard's / {shards} ({} against the same target); all {shards} shards together {:.2} s = {:.2}x the one shard's",
        n_cpu[0],
        n_cpu[0] / share,
        verdict(n_cpu[0] <= target),
        n_cpu.iter().sum::<f64>(),
        n_cpu.iter().sum::<f64>() / one_cpu.max(1e-9)
    )?;
    phase("done");
    println!("{report}");
    Ok(())
}

/// Part 1: the same rows loaded into the N-shard cluster by `INSERT INTO <dist>` and by chpart.
fn load_benchmark(
    options: &ClusterOptions,
    bin: &Chpart,
    bed: &Bed,
    root: &Path,
    report: &mut String,
    phase: &dyn Fn(&str),
) -> anyhow::Result<()> {
    phase(&format!("generating {} rows", options.rows));
    let inputs = generate(&GenOptions {
        rows: options.rows,
        out: root.join("inputs").join("events.parquet"),
        files: options.tasks,
        seed: options.seed,
        hour_start_secs: options.hour_start_secs,
    })?
    .paths;
    bed.table("ins_local", "ins", "toYYYYMMDD(ts)")?;
    bed.table("cp_local", "cp", "toYYYYMMDD(ts)")?;
    // The servers' own background (idle servers still use some CPU), to read the figures net.
    let idle_rate = idle_rates(&[bed])?[0].iter().sum::<f64>();
    phase(&format!(
        "loading {} rows by INSERT INTO a Distributed table",
        options.rows
    ));
    let (cpu, t) = (bed.cpu()?, Instant::now());
    for input in &inputs {
        http::post_file_to(
            bed.cluster.nodes[0].address,
            bed.cluster.nodes[0].server.http_port,
            "INSERT INTO db.ins SETTINGS insert_distributed_sync = 1 FORMAT Parquet",
            input,
        )?;
    }
    let (insert_secs, insert_cpu) = (t.elapsed().as_secs_f64(), bed.cpu()? - cpu);
    phase("loading the same rows with chpart");
    let (cpu, t) = (bed.cpu()?, Instant::now());
    let commit = load_with_chpart(
        bin,
        bed,
        "cp",
        "bench-load",
        &inputs,
        &root.join("winners-load.jsonl"),
    )?;
    let commit_secs = commit.secs;
    let (chpart_secs, chpart_cpu) = (t.elapsed().as_secs_f64(), bed.cpu()? - cpu);
    let inserted = bed.shards("ins_local")?;
    let loaded = bed.shards("cp_local")?;
    let rows_of = |s: &[(u64, u64)]| s.iter().map(|(r, _)| *r).collect::<Vec<u64>>();
    if rows_of(&inserted) != rows_of(&loaded) {
        bail!(
            "the loads differ: rows per shard by INSERT {:?}, by chpart {:?}",
            rows_of(&inserted),
            rows_of(&loaded)
        );
    }
    let gb = inserted.iter().map(|(_, b)| *b).sum::<u64>() as f64 / 1e9;
    writeln!(
        report,
        "\n1. load into the Distributed table (rows per shard {:?}, {gb:.3} GB uncompressed)",
        rows_of(&loaded)
    )?;
    let net = |cpu: f64, secs: f64| (cpu - idle_rate * secs).max(0.0);
    let (insert_net, chpart_net) = (net(insert_cpu, insert_secs), net(chpart_cpu, chpart_secs));
    writeln!(
        report,
        "| load | wall s | servers' CPU s (sum) | net of idle ({:.3} CPU s/s) | net CPU s per GB |",
        idle_rate
    )?;
    writeln!(report, "| --- | --- | --- | --- | --- |")?;
    writeln!(
        report,
        "| INSERT INTO dist (insert_distributed_sync = 1) | {insert_secs:.2} | {insert_cpu:.2} | {insert_net:.2} | {:.3} |",
        insert_net / gb
    )?;
    writeln!(
        report,
        "| chpart (begin, {} builds, commit {commit_secs:.2} s) | {chpart_secs:.2} | {chpart_cpu:.2} | {chpart_net:.2} | {:.3} |",
        inputs.len(),
        chpart_net / gb
    )?;
    writeln!(
        report,
        "wall time chpart / INSERT: {:.2} (the builds run one after another on this machine, as on one executor); servers' net CPU per GB INSERT / chpart: {:.1} (chpart's includes begin, the builds' ledger reads and the commit of every shard; the builds run outside the servers)",
        chpart_secs / insert_secs,
        insert_net / chpart_net.max(1e-9)
    )?;
    Ok(())
}
