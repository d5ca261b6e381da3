//! The randomized crash harness across shards: random schedules over a 3-shard cluster (weights
//! 1/2/3) of real servers. Each schedule begins a load of a Distributed table (partition or
//! part visibility; append, replace over old rows, or a whole-table overwrite; about half of
//! them over local tables on the JBOD storage policy of two more local disks), builds every
//! Spark partition with attempts of which some are SIGKILLed at a random moment, then drives the
//! cluster commit through random faults: commits SIGKILLed after a random delay (drawn from the
//! measured pace, as in `tests/crash.rs`), a second commit racing the first, gc in between, one
//! shard's server SIGKILLed and started again mid-commit. A last commit must exit 0; then every
//! shard's local table must equal its `insert_distributed_sync` twin (count and checksum), and gc
//! must leave nothing on any shard: no detached part, no table of the load, no staged file.
//!
//! CI runs `CRASH_CLUSTER_SCHEDULES` schedules (12 by default); the docs' table comes from a long
//! run outside CI. `CRASH_SEED` replays a run; `CRASH_REPORT` receives the summary as JSON.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use chpart_testenv::clickhouse::JBOD_POLICY;
use chpart_testenv::cluster::{Cluster, ClusterOptions};

use crate::build::{write_rows, COLUMNS};
use crate::cli::{chpart, text};
use crate::crash::{
    build_partition, env_u64, kill_after, last_step, print_report, run_schedules, Pace, Rng,
    Schedules,
};
use crate::disks::files_under;

const SPARK_PARTITIONS: u64 = 2;
const KEY: &str = "intHash64(id)";

#[derive(Default)]
struct Tally {
    schedules: u64,
    modes: BTreeMap<String, u64>,
    /// Schedules whose local tables are on the JBOD policy.
    jbod: u64,
    builds_killed: u64,
    commits_killed: u64,
    /// Commits killed, by the last step (and shard) they reported.
    kills_by_step: BTreeMap<String, u64>,
    racing_commits: u64,
    gc_between: u64,
    /// Servers SIGKILLed and started again mid-commit, by shard.
    restarts_by_shard: BTreeMap<u32, u64>,
    failures: Vec<String>,
    build_pace: Pace,
    commit_pace: Pace,
}

impl Schedules for Tally {
    fn count_schedule(&mut self) {
        self.schedules += 1;
    }
    fn record_failure(&mut self, failure: String) {
        self.failures.push(failure);
    }
}

struct Harness {
    cluster: Cluster,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Harness {
    fn run(&self, args: &[&str]) -> std::process::Output {
        crate::cli::run_with(&self.config, args)
    }

    fn spawn(&self, args: &[&str], events: Option<&Path>) -> Child {
        let mut cmd = chpart();
        cmd.arg(args[0])
            .arg("--config")
            .arg(&self.config)
            .args(&args[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(events) = events {
            cmd.arg("--events").arg(events);
        }
        cmd.spawn().unwrap()
    }

    fn entry(&self) -> &chpart_testenv::clickhouse::ClickHouse {
        &self.cluster.nodes[0].server
    }
}

/// The last step a killed commit reported, with its shard (`commit.attach@2`).
fn last_step_and_shard(events: &Path) -> String {
    let step = last_step(events);
    let shard = std::fs::read_to_string(events)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .rfind(|e| e["step"] != "retry")
        .and_then(|e| e["shard"].as_u64())
        .unwrap_or(0);
    if shard == 0 {
        step
    } else {
        format!("{step}@{shard}")
    }
}

/// Rows of Spark partition `p` of schedule `i`: ids spread over the shards, two months.
fn rows(i: u64, p: u64) -> String {
    format!(
        "SELECT toDateTime('2026-01-20 00:00:00', 'UTC') + toIntervalDay(number % 20) AS ts, \
         {i} * 100000 + {p} * 1000 + number AS id, concat('name-', toString(number)) AS name, \
         if(number % 3 = 0, NULL, number / 7) AS score FROM numbers(600)"
    )
}

fn fingerprint(table: &str) -> String {
    format!("SELECT count(), sum(cityHash64(ts, id, name, score)) FROM {table}")
}

fn schedule(h: &mut Harness, i: u64, seed: u64, tally: &mut Tally) -> Result<(), String> {
    let mut rng = Rng(seed | 1);
    let partition_visibility = rng.chance(60);
    let mode = match (partition_visibility, rng.below(3)) {
        (true, 1) => "replace",
        (true, 2) => "overwrite",
        _ => "append",
    };
    *tally.modes.entry(mode.to_owned()).or_default() += 1;
    // Drawn apart from the schedule's own draws, so a seed's other draws stay what they were.
    let jbod = Rng(seed.rotate_left(29) | 1).chance(50);
    tally.jbod += u64::from(jbod);
    let policy = if jbod {
        format!(" SETTINGS storage_policy = '{JBOD_POLICY}'")
    } else {
        String::new()
    };
    let (local, dist, twin_local, twin) = (
        format!("t{i}"),
        format!("d{i}"),
        format!("tw{i}"),
        format!("twd{i}"),
    );
    let name = h.cluster.name.clone();
    for node in &h.cluster.nodes {
        for t in [&local, &twin_local] {
            node.server.q(&format!(
                "CREATE TABLE db.{t} ({COLUMNS}) ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id{policy}"
            ));
        }
    }
    h.entry().q(&format!(
        "CREATE TABLE db.{dist} AS db.{local} ENGINE = Distributed({name}, db, {local}, {KEY})"
    ));
    h.entry().q(&format!(
        "CREATE TABLE db.{twin} AS db.{twin_local} ENGINE = Distributed({name}, db, {twin_local}, {KEY})"
    ));
    // Old rows: January (replaced by a replace load) and December (kept by it); an overwrite
    // replaces both.
    if mode != "append" {
        let old = |month: &str, from: u64| {
            format!(
                "SELECT toDateTime('{month}', 'UTC') + toIntervalDay(number % 10) AS ts, {from} + number AS id, \
                 'old' AS name, NULL AS score FROM numbers(300)"
            )
        };
        let (january, december) = (
            old("2026-01-02 00:00:00", 900_000),
            old("2025-12-02 00:00:00", 950_000),
        );
        for select in [&january, &december] {
            h.entry().q(&format!(
                "INSERT INTO db.{dist} {select} SETTINGS insert_distributed_sync = 1"
            ));
        }
        if mode == "replace" {
            h.entry().q(&format!(
                "INSERT INTO db.{twin} {december} SETTINGS insert_distributed_sync = 1"
            ));
        }
    }
    let load = format!("cc-{i}");
    let table = format!("db.{dist}");
    let visibility = if partition_visibility {
        "partition"
    } else {
        "part"
    };
    let out = h.run(&[
        "begin",
        "--table",
        &table,
        "--load",
        &load,
        "--mode",
        mode,
        "--visibility",
        visibility,
    ]);
    if out.status.code() != Some(0) {
        return Err(format!("begin: {}", text(&out)));
    }

    let mut winners = Vec::new();
    for p in 0..SPARK_PARTITIONS {
        let input = write_rows(
            h.dir.path(),
            &format!("{load}-{p}.parquet"),
            &rows(i, p),
            "Parquet",
        );
        h.entry().q(&format!(
            "INSERT INTO db.{twin} {} SETTINGS insert_distributed_sync = 1",
            rows(i, p)
        ));
        let spawn = |attempt: &str| {
            let partition = p.to_string();
            let args = [
                "build",
                "--load",
                &load,
                "--attempt",
                attempt,
                "--partition",
                &partition,
                "--input",
                input.to_str().unwrap(),
            ];
            h.spawn(&args, None)
        };
        let (pace, killed) = (&mut tally.build_pace, &mut tally.builds_killed);
        winners.push(build_partition(
            spawn,
            &format!("c{i}"),
            p,
            &mut rng,
            pace,
            killed,
        )?);
    }
    let file = h.dir.path().join(format!("{load}.jsonl"));
    std::fs::write(&file, winners.join("\n") + "\n").unwrap();
    let commit_args = [
        "commit",
        "--load",
        &load,
        "--winners",
        file.to_str().unwrap(),
    ];

    let rounds = rng.below(3);
    for round in 0..rounds {
        let events = h.dir.path().join(format!("{load}-{round}.events"));
        let started = Instant::now();
        let mut first = h.spawn(&commit_args, Some(&events));
        let racing = rng.chance(25).then(|| h.spawn(&commit_args, None));
        if racing.is_some() {
            tally.racing_commits += 1;
        }
        let restart = rng.chance(15).then(|| rng.below(3) as usize);
        let delay = tally.commit_pace.delay(&mut rng);
        if let Some(shard) = restart {
            std::thread::sleep(delay);
            let server = &mut h.cluster.nodes[shard].server;
            server.kill();
            server.start_again();
            *tally.restarts_by_shard.entry(shard as u32 + 1).or_default() += 1;
        } else if kill_after(&mut first, delay) {
            tally.commits_killed += 1;
            *tally
                .kills_by_step
                .entry(last_step_and_shard(&events))
                .or_default() += 1;
        } else if round == 0 && racing.is_none() {
            tally.commit_pace.record(started.elapsed());
        }
        for mut child in [Some(first), racing].into_iter().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if rng.chance(30) {
            tally.gc_between += 1;
            let out = h.run(&["gc"]);
            if out.status.code() != Some(0) {
                return Err(format!("gc between commits: {}", text(&out)));
            }
        }
    }
    let started = Instant::now();
    let out = h.run(&commit_args);
    if out.status.code() != Some(0) {
        return Err(format!("last commit: {}", text(&out)));
    }
    if rounds == 0 {
        tally.commit_pace.record(started.elapsed());
    }
    let check = |h: &Harness, when: &str| -> Result<(), String> {
        for node in &h.cluster.nodes {
            let (got, want) = (
                node.server.q(&fingerprint(&format!("db.{local}"))),
                node.server.q(&fingerprint(&format!("db.{twin_local}"))),
            );
            if got != want {
                return Err(format!(
                    "{when}: shard {}: {got:?}, its INSERT twin {want:?}",
                    node.shard_num
                ));
            }
        }
        Ok(())
    };
    check(h, "after the commit")?;
    let out = h.run(&["gc"]);
    if out.status.code() != Some(0) {
        return Err(format!("gc: {}", text(&out)));
    }
    for node in &h.cluster.nodes {
        let detached = node.server.q(&format!(
            "SELECT count() FROM system.detached_parts WHERE database = 'db' AND table LIKE 't{i}%'"
        ));
        let tables = node.server.q(&format!(
            "SELECT count() FROM system.tables WHERE database = 'db' AND name LIKE 't{i}\\\\_\\\\_chpart%'"
        ));
        let staged: usize = std::iter::once(node.data_dir())
            .chain(node.server.disks.iter().map(PathBuf::as_path))
            .map(|root| files_under(&root.join("chpart-staging")).len())
            .sum();
        if (detached.trim(), tables.trim(), staged) != ("0", "0", 0) {
            return Err(format!(
                "after gc: shard {}: {} in detached/, {} table(s) of the load, {staged} staged file(s)",
                node.shard_num,
                detached.trim(),
                tables.trim()
            ));
        }
    }
    check(h, "after gc")
}

#[test]
fn random_kill_schedules_across_shards_load_every_shard_exactly_once() {
    let schedules: u64 = env_u64("CRASH_CLUSTER_SCHEDULES", || 12);
    let base: u64 = env_u64("CRASH_SEED", chpart_core::retry::clock_seed);
    eprintln!("cluster crash harness: {schedules} schedule(s), CRASH_SEED={base}");
    let options = ClusterOptions {
        jbod: true,
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start_with("crash_cluster", &[1, 2, 3], &options);
    for node in &cluster.nodes {
        node.server.q("CREATE DATABASE db");
    }
    let dir = tempfile::tempdir().unwrap();
    let config = crate::distributed::cluster_config(&cluster, dir.path(), 20, None);
    let mut h = Harness {
        cluster,
        dir,
        config,
    };
    let mut tally = Tally::default();
    run_schedules(
        &mut tally,
        schedules,
        base,
        10,
        |i, seed, tally| schedule(&mut h, i, seed, tally),
        |tally, elapsed, last| report(tally, base, elapsed, last),
    );
    assert!(tally.failures.is_empty(), "{:#?}", tally.failures);
    assert!(
        tally.commits_killed > 0 && tally.builds_killed > 0 || schedules < 10,
        "the schedules killed nothing: the harness did not test recovery"
    );
}

fn report(tally: &Tally, seed: u64, elapsed: Duration, last: bool) {
    let report = serde_json::json!({
        "schedules": tally.schedules,
        "seed": seed,
        "seconds": elapsed.as_secs_f64().round(),
        "modes": tally.modes,
        "jbod_schedules": tally.jbod,
        "builds_killed": tally.builds_killed,
        "commits_killed": tally.commits_killed,
        "commit_kills_by_last_step_and_shard": tally.kills_by_step,
        "racing_commits": tally.racing_commits,
        "gc_between_commits": tally.gc_between,
        "server_restarts_by_shard": tally.restarts_by_shard,
        "median_build_ms": tally.build_pace.median().as_millis() as u64,
        "median_commit_ms": tally.commit_pace.median().as_millis() as u64,
        "failures": tally.failures,
    });
    let (schedules, failures) = (tally.schedules, tally.failures.len());
    print_report(
        "cluster crash harness",
        &report,
        schedules,
        failures,
        elapsed,
        last,
    );
}
