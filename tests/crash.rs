//! The randomized crash harness: random kill schedules against the real engine. Each schedule
//! begins a load (partition or part visibility, append or replace), builds every Spark
//! partition with attempts of which some are SIGKILLed at a random moment, then drives the
//! commit through random faults: commits SIGKILLed after a random delay, a second commit
//! racing the first, gc in between, the ClickHouse server SIGKILLed and started again. A last
//! commit then must exit 0, and afterwards the table must hold exactly the source rows (count
//! and checksum against a twin loaded by INSERT) and gc must leave nothing (detached/,
//! staging, shadow tables).
//!
//! CI runs a slice of `CRASH_SCHEDULES` schedules (50 by default); the README's table comes
//! from `CRASH_SCHEDULES=1000`. `CRASH_SEED` replays a run (each schedule's seed is printed).
//! The summary (schedules, kills by step, failures) is printed at the end, and written as JSON
//! to `CRASH_REPORT` when set. Every failure it finds becomes a fixed test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use chpart_testenv::clickhouse::{ClickHouse, ServerOptions};

use crate::build::{rows_select, write_rows, COLUMNS};
use crate::cli::{chpart, local_config, text};

const SPARK_PARTITIONS: u64 = 2;

/// xorshift64*: the schedules' only source of randomness, so a seed replays a schedule.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub(crate) fn millis(&mut self, max: u64) -> Duration {
        Duration::from_millis(self.below(max))
    }
}

/// How long an uninterrupted run of one command takes on this machine: the median of the last
/// few runs that nothing stopped. Kill delays are drawn below it, so a kill lands inside the
/// command whatever the machine's speed (fixed windows of 1.2-1.5 s killed no commit at all in
/// 50 schedules once: a 2-part commit takes a tenth of that).
pub(crate) struct Pace {
    samples: Vec<Duration>,
    initial: Duration,
}

impl Pace {
    pub(crate) fn new(initial: Duration) -> Self {
        Self {
            samples: Vec::new(),
            initial,
        }
    }
    pub(crate) fn record(&mut self, took: Duration) {
        self.samples.push(took);
        if self.samples.len() > 9 {
            self.samples.remove(0);
        }
    }
    pub(crate) fn median(&self) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        s.get(s.len() / 2).copied().unwrap_or(self.initial)
    }
    /// A kill delay: uniform over 0..1.25x the median, so about four kills in five land
    /// inside the command and the rest let it finish.
    pub(crate) fn delay(&self, rng: &mut Rng) -> Duration {
        let max = (self.median().as_millis() as u64 * 5 / 4).max(1);
        rng.millis(max)
    }
}

/// The number in environment variable `name` (a run's size or seed), else `default()`.
pub(crate) fn env_u64(name: &str, default: impl FnOnce() -> u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|s| s.parse().unwrap_or_else(|_| panic!("{name} is a number")))
        .unwrap_or_else(default)
}

/// Schedule `i`'s seed in a run of seed `base`: printed with a failure, so one schedule replays.
pub(crate) fn schedule_seed(base: u64, i: u64) -> u64 {
    base.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// What a crash harness's schedule loop counts in its tally (crash.rs, crash_cluster.rs).
pub(crate) trait Schedules {
    /// One more schedule was run.
    fn count_schedule(&mut self);
    /// A schedule failed: one line naming its number, seed and error.
    fn record_failure(&mut self, failure: String);
}

/// A crash harness's run: schedule `i` from seed `schedule_seed(base, i)`; a failure is
/// printed and recorded and the run goes on; every `report_every` schedules and after the last
/// one, `report(tally, elapsed, last)` prints the summary so far.
pub(crate) fn run_schedules<T: Schedules>(
    tally: &mut T,
    schedules: u64,
    base: u64,
    report_every: u64,
    mut schedule: impl FnMut(u64, u64, &mut T) -> Result<(), String>,
    report: impl Fn(&T, Duration, bool),
) {
    let started = Instant::now();
    for i in 0..schedules {
        let seed = schedule_seed(base, i);
        tally.count_schedule();
        if let Err(e) = schedule(i, seed, tally) {
            eprintln!("schedule {i} (seed {seed}) FAILED: {e}");
            tally.record_failure(format!("schedule {i} seed {seed}: {e}"));
        }
        if (i + 1) % report_every == 0 || i + 1 == schedules {
            report(tally, started.elapsed(), i + 1 == schedules);
        }
    }
}

/// Prints a crash harness's summary so far (all of it at the end, else one line) and writes it
/// as JSON to `CRASH_REPORT` when set.
pub(crate) fn print_report(
    harness: &str,
    report: &serde_json::Value,
    schedules: u64,
    failures: usize,
    elapsed: Duration,
    last: bool,
) {
    if last {
        eprintln!("{harness}: {report:#}");
    } else {
        eprintln!(
            "{harness}: {} schedules in {:.0} s, {} failure(s)",
            schedules,
            elapsed.as_secs_f64(),
            failures
        );
    }
    if let Ok(path) = std::env::var("CRASH_REPORT") {
        std::fs::write(path, format!("{report:#}\n")).unwrap();
    }
}

/// What one run of the harness saw.
#[derive(Default)]
struct Tally {
    schedules: u64,
    builds_killed: u64,
    commits_killed: u64,
    /// Commits killed, by the last step they reported before the kill.
    kills_by_step: BTreeMap<String, u64>,
    racing_commits: u64,
    overwrites: u64,
    gc_between: u64,
    server_restarts: u64,
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

impl Default for Pace {
    fn default() -> Self {
        Pace::new(Duration::from_millis(500))
    }
}

struct Harness {
    ch: ClickHouse,
    dir: tempfile::TempDir,
    config: PathBuf,
    /// Each Spark partition's rows (the same for every schedule; each has its own table).
    inputs: Vec<PathBuf>,
}

impl Harness {
    fn ch(&self) -> &ClickHouse {
        &self.ch
    }

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
}

/// The end of one build attempt of a crash schedule (crash.rs, crash_cluster.rs): a `killable`
/// one is SIGKILLed after a delay drawn from the builds' pace; `Ok(None)` when that kill landed,
/// else the build's stdout (an error naming `attempt` if it failed). Only builds no kill
/// threatened are timed for the pace.
pub(crate) fn finish_build(
    mut child: Child,
    started: Instant,
    killable: bool,
    rng: &mut Rng,
    pace: &mut Pace,
    builds_killed: &mut u64,
    attempt: &str,
) -> Result<Option<Vec<u8>>, String> {
    if killable {
        let delay = pace.delay(rng);
        if kill_after(&mut child, delay) {
            *builds_killed += 1;
            return Ok(None);
        }
    }
    let out = child.wait_with_output().unwrap();
    if out.status.code() != Some(0) {
        return Err(format!("build {attempt}: {}", text(&out)));
    }
    if !killable {
        pace.record(started.elapsed());
    }
    Ok(Some(out.stdout))
}

/// The attempts of Spark partition `p` in a crash schedule (crash.rs, crash_cluster.rs): `b`,
/// after `a` in half the schedules (SIGKILLed at a random moment in half of those), each named
/// `<prefix>-<a|b>.<p>` and started by `spawn` (a `build` of the partition's input as that
/// attempt). Returns the manifest line of an attempt that completed, chosen at random.
pub(crate) fn build_partition(
    mut spawn: impl FnMut(&str) -> Child,
    prefix: &str,
    p: u64,
    rng: &mut Rng,
    pace: &mut Pace,
    builds_killed: &mut u64,
) -> Result<String, String> {
    let mut completed = Vec::new();
    // Attempt `a` in half the schedules: a build is the costliest step here.
    let attempts: &[&str] = if rng.chance(50) { &["a", "b"] } else { &["b"] };
    for a in attempts {
        let attempt = format!("{prefix}-{a}.{p}");
        let started = Instant::now();
        let child = spawn(&attempt);
        let killable = *a == "a" && rng.chance(50);
        let Some(stdout) =
            finish_build(child, started, killable, rng, pace, builds_killed, &attempt)?
        else {
            continue;
        };
        // `build` prints its manifest as one line.
        let line = String::from_utf8_lossy(&stdout);
        completed.push(line.trim().lines().last().unwrap_or("").to_owned());
    }
    let pick = rng.below(completed.len() as u64) as usize;
    Ok(completed.swap_remove(pick))
}

/// Waits up to `delay` for `child`; kills it (SIGKILL) if it still runs. Whether it was killed.
pub fn kill_after(child: &mut Child, delay: Duration) -> bool {
    let until = Instant::now() + delay;
    while Instant::now() < until {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if child.try_wait().unwrap().is_some() {
        return false;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    true
}

/// The last step a command reported in its events file (`start` if none).
pub(crate) fn last_step(events: &Path) -> String {
    std::fs::read_to_string(events)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .rfind(|e| e["step"] != "retry")
        .map(|e| e["step"].as_str().unwrap_or("?").to_owned())
        .unwrap_or_else(|| "start".to_owned())
}

fn fingerprint(ch: &ClickHouse, table: &str) -> String {
    ch.q(&format!(
        "SELECT count(), sum(cityHash64(ts, id, name, score)) FROM {table}"
    ))
}

/// One schedule; `Err` says what went wrong.
fn schedule(h: &mut Harness, i: u64, seed: u64, tally: &mut Tally) -> Result<(), String> {
    let mut rng = Rng(seed | 1);
    let partition_visibility = rng.chance(50);
    let replace = partition_visibility && rng.chance(40);
    // Overwrite: the whole table swapped; its old rows all go.
    let overwrite = partition_visibility && !replace && rng.chance(35);
    let (table, twin, load) = (
        format!("crash.t{i}"),
        format!("crash.twin{i}"),
        format!("crash-{i}"),
    );
    for t in [&table, &twin] {
        h.ch().q(&format!(
            "CREATE TABLE {t} ({COLUMNS}) ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id"
        ));
    }
    // Replace: old rows in a partition the load replaces (January) and one it leaves (December).
    if overwrite {
        h.ch().q(&format!(
            "INSERT INTO {table} SELECT toDateTime('2025-11-20 00:00:00', 'UTC') + toIntervalDay(number % 90) AS ts, \
             800000 + number AS id, 'old' AS name, NULL AS score FROM numbers(300)"
        ));
    }
    if replace {
        let old =
            "SELECT toDateTime('2025-12-20 00:00:00', 'UTC') + toIntervalDay(number % 40) AS ts, \
                   900000 + number AS id, 'old' AS name, NULL AS score FROM numbers(300)";
        h.ch().q(&format!("INSERT INTO {table} {old}"));
        h.ch().q(&format!(
            "INSERT INTO {twin} SELECT * FROM ({old}) WHERE toYYYYMM(ts) = 202512"
        ));
    }
    let mut begin = vec!["begin", "--table", &table, "--load", &load];
    begin.extend([
        "--visibility",
        if partition_visibility {
            "partition"
        } else {
            "part"
        },
    ]);
    if replace {
        begin.extend(["--mode", "replace"]);
    }
    if overwrite {
        begin.extend(["--mode", "overwrite"]);
        tally.overwrites += 1;
    }
    let out = h.run(&begin);
    if out.status.code() != Some(0) {
        return Err(format!("begin: {}", text(&out)));
    }

    // Builds: per Spark partition, attempt `a` (SIGKILLed at a random moment in a third of the
    // schedules) and attempt `b`; the winner is one that completed, chosen at random.
    let mut winners = Vec::new();
    for p in 0..SPARK_PARTITIONS {
        let input = &h.inputs[p as usize];
        h.ch().q(&format!(
            "INSERT INTO {twin} {}",
            rows_select(p * 1000, 1000)
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
            &format!("x{i}"),
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

    // Faults around the commit: up to two killed commits, a racing pair, gc, a server restart.
    // A commit's duration is measured when it is the load's first and nothing disturbed it
    // (no racer, no restart, no kill): that is the pace kill delays are drawn from.
    let rounds = rng.below(3);
    for round in 0..rounds {
        let events = h.dir.path().join(format!("{load}-{round}.events"));
        let started = Instant::now();
        let mut first = h.spawn(&commit_args, Some(&events));
        let racing = rng.chance(25).then(|| h.spawn(&commit_args, None));
        if racing.is_some() {
            tally.racing_commits += 1;
        }
        let restart = rng.chance(15);
        let delay = tally.commit_pace.delay(&mut rng);
        if restart {
            std::thread::sleep(delay);
            h.ch.kill();
            h.ch.start_again();
            tally.server_restarts += 1;
        } else if kill_after(&mut first, delay) {
            tally.commits_killed += 1;
            *tally.kills_by_step.entry(last_step(&events)).or_default() += 1;
        } else if round == 0 && racing.is_none() {
            tally.commit_pace.record(started.elapsed());
        }
        for mut child in [Some(first), racing].into_iter().flatten() {
            // Whatever these ended with, the last commit below must finish the load.
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
    let (got, want) = (fingerprint(h.ch(), &table), fingerprint(h.ch(), &twin));
    if got != want {
        return Err(format!("rows: {got:?}, expected {want:?}"));
    }
    let out = h.run(&["gc"]);
    if out.status.code() != Some(0) {
        return Err(format!("gc: {}", text(&out)));
    }
    let left = h.ch().q(&format!(
        "SELECT count() FROM system.detached_parts WHERE database = 'crash' AND table LIKE 't{i}%'"
    ));
    // Shadow tables, and an overwrite's claimed or swapped-out tables (named after the shadow).
    let shadows = h.ch().q(&format!(
        "SELECT count() FROM system.tables WHERE database = 'crash' AND name LIKE 't{i}\\\\_\\\\_chpart%'"
    ));
    let staging = h.ch.data_dir.join("chpart-staging").join(&load);
    let staged = std::fs::read_dir(&staging).map(|d| d.count()).unwrap_or(0);
    if (left.trim(), shadows.trim(), staged) != ("0", "0", 0) {
        return Err(format!(
            "after gc: {} in detached/, {} shadow table(s), {staged} staging entries",
            left.trim(),
            shadows.trim()
        ));
    }
    if fingerprint(h.ch(), &table) != want {
        return Err("rows changed after gc".into());
    }
    Ok(())
}

#[test]
fn random_kill_schedules_load_every_row_exactly_once_and_leave_nothing() {
    let schedules: u64 = env_u64("CRASH_SCHEDULES", || 50);
    let base: u64 = env_u64("CRASH_SEED", chpart_core::retry::clock_seed);
    eprintln!("crash harness: {schedules} schedule(s), CRASH_SEED={base}");
    let ports = (chpart_testenv::free_port(), chpart_testenv::free_port());
    let ch = ClickHouse::start_with(ServerOptions {
        ports: Some(ports),
        ..Default::default()
    });
    ch.q("CREATE DATABASE crash");
    let dir = tempfile::tempdir().unwrap();
    let config = local_config(dir.path(), &ch, "crash_ledger");
    let inputs = (0..SPARK_PARTITIONS)
        .map(|p| {
            write_rows(
                dir.path(),
                &format!("rows-{p}.parquet"),
                &rows_select(p * 1000, 1000),
                "Parquet",
            )
        })
        .collect();
    let mut h = Harness {
        ch,
        dir,
        config,
        inputs,
    };
    let mut tally = Tally::default();
    // Every 25 schedules the summary so far is printed and written, so a long run that is
    // stopped early still leaves its figures.
    run_schedules(
        &mut tally,
        schedules,
        base,
        25,
        |i, seed, tally| schedule(&mut h, i, seed, tally),
        |tally, elapsed, last| report(tally, base, elapsed, last),
    );
    assert!(tally.failures.is_empty(), "{:#?}", tally.failures);
    assert!(
        tally.commits_killed > 0 && tally.builds_killed > 0 || schedules < 10,
        "the schedules killed nothing: the harness did not test recovery"
    );
}

/// Prints the summary so far (one line, or all of it at the end) and writes it as JSON to
/// `CRASH_REPORT` when set.
fn report(tally: &Tally, seed: u64, elapsed: Duration, last: bool) {
    let report = serde_json::json!({
        "schedules": tally.schedules,
        "seed": seed,
        "seconds": elapsed.as_secs_f64().round(),
        "builds_killed": tally.builds_killed,
        "commits_killed": tally.commits_killed,
        "commit_kills_by_last_step": tally.kills_by_step,
        "racing_commits": tally.racing_commits,
        "overwrite_loads": tally.overwrites,
        "gc_between_commits": tally.gc_between,
        "server_restarts": tally.server_restarts,
        "median_build_ms": tally.build_pace.median().as_millis() as u64,
        "median_commit_ms": tally.commit_pace.median().as_millis() as u64,
        "failures": tally.failures,
    });
    let (schedules, failures) = (tally.schedules, tally.failures.len());
    print_report("crash harness", &report, schedules, failures, elapsed, last);
}
