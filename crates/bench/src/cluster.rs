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
//! 2. **Commit across shards**: a load of about `--parts` small parts (a partition key that cuts
//!    each hour into 100 partitions, one hour per build) committed into the N-shard table, and
//!    the same number of parts committed into a one-shard cluster: the shards commit in
//!    parallel, so the N-shard commit should take about the one-shard time, not N times it.
//!
//! Merges are stopped on every table, so neither way of loading gets background merges billed
//! to it and the parts counted are the parts attached. Nothing here asserts a timing.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use chpart_testenv::cluster::Cluster;

use crate::chpart::Chpart;
use crate::events;
use crate::gen::{generate, GenOptions};
use crate::http::{self, sql};

/// Partitions per hour of the small-parts loads (clickhouse-local refuses an insert block that
/// touches more than 100 partitions).
const PARTS_PER_BUILD: u32 = 100;
/// Rows per small part.
const ROWS_PER_PART: u64 = 200;

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
        let cluster = Cluster::start(name, &weights);
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
        self.cluster
            .nodes
            .iter()
            .map(|n| {
                n.server
                    .cpu_seconds()
                    .context("a server's CPU time (/proc/<pid>/stat) is not readable")
            })
            .sum()
    }

    /// Per shard: rows and uncompressed bytes of `db.<local>`.
    fn shards(&self, local: &str) -> anyhow::Result<Vec<(u64, u64)>> {
        self.cluster
            .nodes
            .iter()
            .map(|n| {
                let text = sql(
                    &n.server,
                    &format!(
                        "SELECT sum(rows), sum(data_uncompressed_bytes) FROM system.parts \
                         WHERE database = 'db' AND table = '{local}' AND active"
                    ),
                )?;
                let mut fields = text.split_whitespace().map(str::parse::<u64>);
                match (fields.next(), fields.next()) {
                    (Some(Ok(rows)), Some(Ok(bytes))) => Ok((rows, bytes)),
                    _ => bail!("unexpected answer {text:?}"),
                }
            })
            .collect()
    }
}

/// One chpart command, checked; its stdout.
fn chpart(chpart: &Chpart, args: &[&str], config: &Path) -> anyhow::Result<String> {
    Ok(chpart.run(config, args)?.stdout_text())
}

/// Begins `load` into `db.<dist>`, builds one attempt per input and commits them; returns the
/// commit's wall seconds.
fn load_with_chpart(
    bin: &Chpart,
    config: &Path,
    dist: &str,
    load: &str,
    inputs: &[PathBuf],
    winners: &Path,
) -> anyhow::Result<f64> {
    chpart(
        bin,
        &["begin", "--table", &format!("db.{dist}"), "--load", load],
        config,
    )?;
    let mut lines = Vec::new();
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
        lines.push(out.lines().last().unwrap_or_default().to_owned());
    }
    fs::write(winners, lines.join("\n") + "\n")?;
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
    Ok(started.elapsed().as_secs_f64())
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
    eprintln!("starting a cluster of {shards} servers and one of 1");
    let bed = Bed::start(root.path(), "bench_n", shards)?;
    let one = Bed::start(root.path(), "bench_1", 1)?;
    let mut report = String::new();
    writeln!(
        report,
        "chpart-bench cluster: {shards} shards (one 26.9 server each, loopback), {} rows in {} task(s); {} parts in the commit benchmark",
        options.rows, options.tasks, options.parts
    )?;

    // 1. Load: INSERT through the Distributed engine vs chpart.
    let inputs = generate(&GenOptions {
        rows: options.rows,
        out: root.path().join("inputs").join("events.parquet"),
        files: options.tasks,
        seed: options.seed,
        hour_start_secs: options.hour_start_secs,
    })?
    .paths;
    bed.table("ins_local", "ins", "toYYYYMMDD(ts)")?;
    bed.table("cp_local", "cp", "toYYYYMMDD(ts)")?;
    // The servers' own background (idle servers still use some CPU), to read the figures net.
    let (cpu, t) = (bed.cpu()?, Instant::now());
    std::thread::sleep(std::time::Duration::from_secs(3));
    let idle_rate = (bed.cpu()? - cpu) / t.elapsed().as_secs_f64();
    eprintln!(
        "loading {} rows by INSERT INTO a Distributed table",
        options.rows
    );
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
    eprintln!("loading the same rows with chpart");
    let (cpu, t) = (bed.cpu()?, Instant::now());
    let commit_secs = load_with_chpart(
        &bin,
        &bed.config,
        "cp",
        "bench-load",
        &inputs,
        &root.path().join("winners-load.jsonl"),
    )?;
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

    // 2. Commit of many parts over N shards vs one.
    let key = format!(
        "(toStartOfHour(ts), intDiv(toUnixTimestamp(ts) % 3600 * {PARTS_PER_BUILD}, 3600))"
    );
    bed.table("small_local", "small", &key)?;
    one.table("small_local", "small", &key)?;
    // The same parts both ways: each build makes 100 parts on every shard it reaches (all, at
    // this size), so the one-shard load gets `shards` times the builds.
    let builds_n = options.parts.div_ceil(PARTS_PER_BUILD * shards).max(1);
    let builds_1 = builds_n * shards;
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
    eprintln!(
        "committing about {} parts over {shards} shards",
        options.parts
    );
    let n_secs = load_with_chpart(
        &bin,
        &bed.config,
        "small",
        "bench-small-n",
        &hourly[..builds_n as usize],
        &root.path().join("winners-n.jsonl"),
    )?;
    let n_parts: u64 = bed
        .cluster
        .nodes
        .iter()
        .map(|n| {
            sql(&n.server, "SELECT count() FROM system.parts WHERE database = 'db' AND table = 'small_local' AND active")
                .map(|t| t.trim().parse::<u64>().unwrap_or(0))
        })
        .sum::<anyhow::Result<u64>>()?;
    eprintln!("committing about {} parts into one shard", options.parts);
    let one_secs = load_with_chpart(
        &bin,
        &one.config,
        "small",
        "bench-small-1",
        &hourly[..builds_1 as usize],
        &root.path().join("winners-1.jsonl"),
    )?;
    let one_parts: u64 = sql(
        &one.cluster.nodes[0].server,
        "SELECT count() FROM system.parts WHERE database = 'db' AND table = 'small_local' AND active",
    )?
    .trim()
    .parse()?;
    writeln!(report, "\n2. commit time of many small parts")?;
    writeln!(
        report,
        "| cluster | parts | builds | commit wall s | parts/s |"
    )?;
    writeln!(report, "| --- | --- | --- | --- | --- |")?;
    writeln!(
        report,
        "| {shards} shards | {n_parts} | {builds_n} | {n_secs:.2} | {:.0} |",
        n_parts as f64 / n_secs
    )?;
    writeln!(
        report,
        "| 1 shard | {one_parts} | {builds_1} | {one_secs:.2} | {:.0} |",
        one_parts as f64 / one_secs
    )?;
    let ratio = n_secs / one_secs;
    writeln!(
        report,
        "{shards}-shard commit / one-shard commit of about the same parts: {ratio:.2}x ({}: target close to 1x, not {shards}x; PASS if <= 1.5x)",
        if ratio <= 1.5 { "PASS" } else { "MISS" }
    )?;
    println!("{report}");
    Ok(())
}
