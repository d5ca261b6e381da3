//! A month of hourly loads, simulated (issue 25 item 2): `chpart load` runs once per simulated
//! hour into a Distributed table over a 3-shard cluster of real servers, each shard reached
//! through a fault proxy, with faults drawn at random between and during loads: connections to a
//! shard cut mid-load, a shard's server SIGKILLed and started again mid-load, the load itself
//! SIGKILLed and finished by the scheduler's retry (the same command run again), and a late
//! writer building for an hour already committed (fenced). `chpart load` gc's after each load;
//! `chpart ledger prune` runs every simulated week.
//!
//! At the end: every shard equals its `insert_distributed_sync` twin of every hour's rows; no
//! staging file, table of a load, `detached/` entry, build work directory or open load is left;
//! loads finished before the last prune keep only their tombstone entries in the ledger. The
//! wall time and servers' CPU per load of the first and the last simulated day are printed
//! (compared, not asserted: timing belongs to benchmarks).
//!
//! CI runs `SOAK_HOURS` hours (36 by default: a weekly prune is forced at hour 24 so it runs); the
//! docs' figures come from `SOAK_HOURS=720` outside CI. `SOAK_SEED` replays a run.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use chpart_testenv::cluster::Cluster;
use chpart_testenv::proxy::FaultProxy;

use crate::build::{write_rows, COLUMNS};
use crate::cli::{chpart, text};
use crate::crash::{env_u64, kill_after, Pace, Rng};
use crate::disks::files_under;

const KEY: &str = "intHash64(id)";
const ROWS_PER_HOUR: u64 = 2_000;

/// One simulated hour's rows: its own hour of timestamps and ids.
fn hour_rows(hour: u64) -> String {
    format!(
        "SELECT toDateTime('2026-01-01 00:00:00', 'UTC') + toIntervalHour({hour}) + toIntervalSecond(number % 3600) AS ts, \
         {hour} * 1000000 + number AS id, concat('h', toString(number % 97)) AS name, \
         if(number % 5 = 0, NULL, number / 3) AS score FROM numbers({ROWS_PER_HOUR})"
    )
}

fn fingerprint(table: &str) -> String {
    format!("SELECT count(), sum(cityHash64(ts, id, name, score)) FROM {table}")
}

/// What happened over the run.
#[derive(Default)]
struct Tally {
    faults: BTreeMap<&'static str, u64>,
    reruns: u64,
    prunes: u64,
    /// Per load: (simulated hour, wall seconds, servers' CPU seconds) of its successful run.
    costs: Vec<(u64, f64, f64)>,
}

#[test]
fn a_month_of_hourly_loads_under_faults_leaks_nothing() {
    let hours: u64 = env_u64("SOAK_HOURS", || 36);
    let seed: u64 = env_u64("SOAK_SEED", chpart_core::retry::clock_seed);
    eprintln!("soak: {hours} hourly loads, SOAK_SEED={seed}");
    let mut rng = Rng(seed | 1);
    let mut cluster = Cluster::start("soak", &[1, 2, 3]);
    let name = cluster.name.clone();
    for node in &cluster.nodes {
        node.server.q("CREATE DATABASE db");
        for t in ["events_local", "twin_local"] {
            node.server.q(&format!(
                "CREATE TABLE db.{t} ({COLUMNS}) ENGINE = MergeTree PARTITION BY toYYYYMMDD(ts) ORDER BY id"
            ));
        }
    }
    let entry = &cluster.nodes[0].server;
    entry.q(&format!(
        "CREATE TABLE db.events AS db.events_local ENGINE = Distributed({name}, db, events_local, {KEY})"
    ));
    entry.q(&format!(
        "CREATE TABLE db.twin AS db.twin_local ENGINE = Distributed({name}, db, twin_local, {KEY})"
    ));
    // Every shard's HTTP through a proxy of its own.
    let proxies: Vec<FaultProxy> = cluster
        .nodes
        .iter()
        .map(|n| {
            let addr: SocketAddr = n
                .server
                .url()
                .trim_start_matches("http://")
                .parse()
                .unwrap();
            FaultProxy::start(addr)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let work_dir = dir.path().join("work");
    let urls: Vec<String> = proxies
        .iter()
        .map(|p| format!("http://127.0.0.1:{}", p.port))
        .collect();
    let config = crate::distributed::cluster_config(&cluster, dir.path(), 30, Some(&urls));
    let run = |args: &[&str]| -> Output { crate::cli::run_with(&config, args) };

    let mut tally = Tally::default();
    let mut pace = Pace::new(Duration::from_secs(3));
    let mut last_prune_hour: Option<u64> = None;
    let started = Instant::now();
    for hour in 0..hours {
        let load = format!("hour-{hour:04}");
        let input = write_rows(
            dir.path(),
            &format!("{load}.parquet"),
            &hour_rows(hour),
            "Parquet",
        );
        cluster.nodes[0].server.q(&format!(
            "INSERT INTO db.twin {} SETTINGS insert_distributed_sync = 1",
            hour_rows(hour)
        ));
        let args = [
            "load",
            "--table",
            "db.events",
            "--load",
            &load,
            "--input",
            input.to_str().unwrap(),
            "--jobs",
            "1",
            "--json",
        ];
        // The last hour runs clean, so a killed build's work directory is collected by a build.
        let fault = if hour + 1 == hours {
            100
        } else {
            rng.below(100)
        };
        let shard = rng.below(3) as usize;
        let delay = pace.delay(&mut rng);
        let cpu_before: f64 = cluster
            .nodes
            .iter()
            .filter_map(|n| n.server.cpu_seconds())
            .sum();
        let t0 = Instant::now();
        let first = match fault {
            0..=5 => {
                *tally
                    .faults
                    .entry("connections to a shard cut mid-load")
                    .or_default() += 1;
                proxies[shard].cut_after_bytes(2048 + rng.below(30_000));
                run(&args)
            }
            6..=9 => {
                *tally
                    .faults
                    .entry("a shard's server killed and restarted mid-load")
                    .or_default() += 1;
                let child = spawn(&config, &args);
                std::thread::sleep(delay);
                let server = &mut cluster.nodes[shard].server;
                server.kill();
                server.start_again();
                child.wait_with_output().unwrap()
            }
            10..=15 => {
                *tally
                    .faults
                    .entry("the load killed (finished by the next run)")
                    .or_default() += 1;
                let mut child = spawn(&config, &args);
                kill_after(&mut child, delay);
                child.wait_with_output().unwrap()
            }
            _ => run(&args),
        };
        let out = if first.status.code() == Some(0) {
            first
        } else {
            // The scheduler retries the hour: the same command finishes what is left.
            tally.reruns += 1;
            let again = run(&args);
            assert_eq!(
                again.status.code(),
                Some(0),
                "hour {hour}: the re-run failed: {}\nfirst run: {}",
                text(&again),
                text(&first)
            );
            again
        };
        let took = t0.elapsed();
        let cpu: f64 = cluster
            .nodes
            .iter()
            .filter_map(|n| n.server.cpu_seconds())
            .sum::<f64>()
            - cpu_before;
        if fault >= 16 {
            pace.record(took);
            tally.costs.push((hour, took.as_secs_f64(), cpu));
        }
        let summary: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap())
                .unwrap();
        assert_eq!(summary["rows"], ROWS_PER_HOUR, "hour {hour}: {summary}");
        // A late writer: a build for the hour before, committed long ago, must be fenced.
        if hour > 0 && rng.chance(4) {
            *tally
                .faults
                .entry("a late writer for a committed hour")
                .or_default() += 1;
            let previous = format!("hour-{:04}", hour - 1);
            let late = chpart()
                .args(["build", "--config"])
                .arg(&config)
                .args([
                    "--load",
                    &previous,
                    "--attempt",
                    &format!("late-{hour}.0"),
                    "--partition",
                    "0",
                    "--input",
                ])
                .arg(dir.path().join(format!("{previous}.parquet")))
                .output()
                .unwrap();
            assert_eq!(
                late.status.code(),
                Some(5),
                "hour {hour}: the late writer: {}",
                text(&late)
            );
        }
        // A simulated week: prune what gc finished (forced once at hour 24 in short runs).
        if (hour + 1) % 168 == 0 || (hours < 168 && hour == 24) {
            let out = chpart()
                .args(["ledger", "prune", "--config"])
                .arg(&config)
                .args(["--finished-before", "1s", "--json"])
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(0), "prune: {}", text(&out));
            tally.prunes += 1;
            last_prune_hour = Some(hour);
        }
        std::fs::remove_file(&input).unwrap();
    }
    eprintln!(
        "soak: {hours} loads in {:.0} s",
        started.elapsed().as_secs_f64()
    );

    // Rows: every shard as its twin.
    for node in &cluster.nodes {
        assert_eq!(
            node.server.q(&fingerprint("db.events_local")),
            node.server.q(&fingerprint("db.twin_local")),
            "shard {}",
            node.shard_num
        );
    }
    // Nothing left: detached entries, tables of loads, staged files, work directories, open loads.
    for node in &cluster.nodes {
        assert_eq!(
            node.server
                .q("SELECT count() FROM system.detached_parts WHERE database = 'db'"),
            "0\n",
            "shard {}",
            node.shard_num
        );
        let made = if node.shard_num == 1 {
            "events\nevents_local\ntwin\ntwin_local\n"
        } else {
            "events_local\ntwin_local\n"
        };
        assert_eq!(
            node.server
                .q("SELECT name FROM system.tables WHERE database = 'db' ORDER BY name"),
            made,
            "shard {}: only the tables the test made",
            node.shard_num
        );
        let staged = files_under(&node.data_dir().join("chpart-staging"));
        assert_eq!(
            staged,
            Vec::<String>::new(),
            "shard {}: staged files",
            node.shard_num
        );
    }
    let work_files = files_under(&work_dir);
    assert_eq!(
        work_files,
        Vec::<String>::new(),
        "build work directories left"
    );
    let status = run(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let open: Vec<&serde_json::Value> = status
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["state"] != "committed")
        .collect();
    assert!(open.is_empty(), "loads not committed: {open:?}");
    // The ledger: loads before the last prune keep their tombstones only.
    if let Some(pruned) = last_prune_hour {
        let kinds = cluster.nodes[0].server.q(&format!(
            "SELECT DISTINCT kind FROM chpart_ledger.ledger WHERE load_id LIKE 'hour-%' AND load_id < 'hour-{pruned:04}' ORDER BY kind"
        ));
        for kind in kinds.lines() {
            assert!(
                chpart_protocol::ledger::TOMBSTONE_KINDS.contains(&kind),
                "a pruned load kept an entry of kind {kind}"
            );
        }
    }
    // Cost per load, first simulated day against the last (clean hours only).
    let day = |from: u64, to: u64| {
        let v: Vec<&(u64, f64, f64)> = tally
            .costs
            .iter()
            .filter(|c| c.0 >= from && c.0 < to)
            .collect();
        let n = v.len().max(1) as f64;
        (
            v.iter().map(|c| c.1).sum::<f64>() / n,
            v.iter().map(|c| c.2).sum::<f64>() / n,
            v.len(),
        )
    };
    let span = 24.min(hours / 2).max(1);
    let (first, last) = (day(0, span), day(hours - span, hours));
    let report = serde_json::json!({
        "hours": hours,
        "seed": seed,
        "seconds": started.elapsed().as_secs_f64().round(),
        "faults": tally.faults,
        "reruns": tally.reruns,
        "prunes": tally.prunes,
        "first_hours": {"loads": first.2, "wall_s": first.0, "server_cpu_s": first.1},
        "last_hours": {"loads": last.2, "wall_s": last.0, "server_cpu_s": last.1},
        "wall_ratio_last_over_first": last.0 / first.0,
        "cpu_ratio_last_over_first": last.1 / first.1,
    });
    eprintln!("soak: {report:#}");
    if let Ok(path) = std::env::var("SOAK_REPORT") {
        std::fs::write(path, format!("{report:#}\n")).unwrap();
    }
    assert!(
        tally.faults.values().sum::<u64>() > 0 || hours < 20,
        "no fault was drawn"
    );
}

fn spawn(config: &std::path::Path, args: &[&str]) -> std::process::Child {
    chpart()
        .arg(args[0])
        .arg("--config")
        .arg(config)
        .args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}
