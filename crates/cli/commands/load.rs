//! `chpart load`: the whole load in one command, for batch jobs that are not Spark (an Airflow
//! task, a cron job, a script with Parquet files for an hour).
//!
//! ```text
//!  inputs ─► files, sizes, sha256 ─► ledger: committed? (same inputs: nothing to do)
//!     ─► begin (records the inputs and how many builds they are split into)
//!     ─► builds in parallel (one attempt each, ids made here) ─► state dir: each build's line
//!     ─► commit (the builds' lines are the winners; a recorded plan resumes alone) ─► gc
//! ```
//!
//! Re-running the same command finishes a load that was interrupted anywhere: the ledger says
//! whether it began, planned or committed; the state directory says which builds finished (a
//! build whose line is not there runs again under a new attempt id, and what the interrupted one
//! left is a loser's, which gc removes). The inputs are recorded at `begin` by content (sizes and
//! sha256, not paths), so a load id reused for other data is refused. The protocol is the same
//! as Spark's: this process plays the driver and every task.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{anyhow, Context};
use chpart_core::{Attempt, AttemptId, LoadId, TableRef};
use chpart_protocol::api::begin_load;
use chpart_protocol::begin::{check_inputs, BeginError, BeginRequest};
use chpart_protocol::build::{build, BuildRequest, Input};
use chpart_protocol::commit::CommitRequest;
use chpart_protocol::events::Step;
use chpart_protocol::hooks::crash_point;
use chpart_protocol::ledger::{LoadInputs, LoadState, Mode, STDIN_DIGEST};
use chpart_protocol::FailureKind;
use serde::Serialize;

use crate::args::LoadArgs;
use crate::commands::{commit, gc};
use crate::context::{load_config, usage, DriverEnv, Executor};
use crate::exit::{self, Failure};

/// Input bytes one build takes at most, unless fewer builds than `--jobs` would result: a
/// build is one clickhouse-local run, one attempt and at least one part per table partition it
/// touches (one, with `merge_split_partitions` on), so fewer builds mean fewer parts for the
/// server to merge, and more builds mean more cores busy and less to redo after a kill.
pub const BUILD_INPUT_BYTES: u64 = 1 << 30;

/// One input file.
#[derive(Debug, Clone)]
struct InputFile {
    path: PathBuf,
    bytes: u64,
    sha256: String,
}

/// What the load reads.
enum Sources {
    /// Parquet files, in a content order (sha256, then size): paths decide nothing.
    Files(Vec<InputFile>),
    /// An Arrow IPC stream on stdin: one build.
    Stdin,
}

/// The summary `--json` prints (and the last log line says).
#[derive(Debug, Serialize)]
struct LoadSummary {
    load: String,
    table: String,
    state: &'static str,
    /// The load was committed before this run: nothing was done but gc.
    already_committed: bool,
    rows: u64,
    parts: usize,
    partitions: usize,
    inputs: LoadInputs,
    /// Builds this run ran, and builds an earlier run of the command had finished.
    built_now: usize,
    built_before: usize,
    gc_removed: usize,
    seconds: f64,
}

pub fn run_load(args: LoadArgs) -> Result<ExitCode, Failure> {
    let started = Instant::now();
    let load: LoadId = args.load.parse().context("--load").map_err(usage)?;
    let target: TableRef = args.table.parse().context("--table").map_err(usage)?;
    let jobs = args.jobs.unwrap_or_else(default_jobs).max(1);
    let config = load_config(&args.config)?;
    let state_dir = args
        .state_dir
        .clone()
        .unwrap_or_else(|| config.clickhouse_local.work_dir.join("chpart-load"))
        .join(load.as_str());
    let sources = resolve(&args.input, jobs)?;
    let inputs = sources.inputs(jobs);
    let driver = crate::context::driver_env_of(config.clone())?;
    let read_view = || {
        driver
            .rt
            .block_on(driver.ledger.view(&load, chpart_protocol::KNOWN_KINDS))
            .map_err(|e| Failure::new(e.kind(), e))
    };
    let mut view = read_view()?;
    let mut read_again = false;
    let mode: Mode = args.mode.into();
    let mut built_now = 0;
    let mut built_before = 0;
    loop {
        match (&view.state, &view.spec) {
            (LoadState::Aborted, _) => {
                return Err(Failure::new(
                    FailureKind::Fenced,
                    anyhow!("load {load} was aborted: nothing of it will be attached; load the inputs under a new load id"),
                ))
            }
            (LoadState::Committed, Some(spec)) => {
                check_inputs(&load, spec.inputs.as_ref(), Some(&inputs))
                    .map_err(|e| Failure::new(e.kind(), e))?;
                tracing::info!("load {load} is already committed with these inputs: nothing to load");
                break;
            }
            _ => {
                let request = BeginRequest {
                    load: load.clone(),
                    target: target.clone(),
                    mode,
                    visibility: args.visibility.into(),
                    host: config.clickhouse.host_name.clone(),
                    allow_materialized_views: args.allow_materialized_views,
                    clickhouse_local_version: crate::context::local_version(&config),
                    staging: crate::context::staging_roots(&config)?,
                    shard_of: None,
                    inputs: Some(inputs.clone()),
                };
                crash_point("load-before-begin");
                let spec = match driver
                    .rt
                    .block_on(begin_load(&driver.ledger, &driver.reach, &request))
                {
                    Ok(begun) => begun.spec().clone(),
                    // Finished since this run read the ledger: by a request of an earlier run
                    // that the server carried out after that run was killed (the commit's last
                    // write), or by another run. Read it again: committed with these inputs is
                    // reported as such, aborted refused.
                    Err(BeginError::NotOpen { .. }) if !read_again => {
                        read_again = true;
                        view = read_view()?;
                        continue;
                    }
                    Err(e) => return Err(Failure::new(e.kind(), e)),
                };
                // A re-run follows the split the first run chose and recorded.
                let builds = spec.inputs.as_ref().map_or(inputs.builds, |i| i.builds);
                if view.planned() {
                    tracing::info!("load {load}: its commit plan is recorded; resuming the commit");
                    break;
                } else {
                    let done = run_builds(
                        &load,
                        &sources,
                        builds,
                        jobs,
                        &state_dir,
                        config.clone(),
                        args.merge,
                    );
                    let done = match done {
                        Ok(done) => done,
                        Err(failure) => {
                            return Err(abort_if_permanent(&driver, &load, &state_dir, failure))
                        }
                    };
                    built_now = done.built_now;
                    built_before = done.lines.len() - done.built_now;
                    let winners = done
                        .lines
                        .into_iter()
                        .enumerate()
                        .map(|(i, line)| (i + 1, line))
                        .collect();
                    return finish(
                        &driver,
                        &args,
                        Finish {
                            load,
                            inputs: spec.inputs.unwrap_or(inputs),
                            winners: Some((winners, builds)),
                            built_now,
                            built_before,
                            state_dir,
                            started,
                        },
                    );
                }
            }
        }
    }
    let inputs = view
        .spec
        .as_ref()
        .and_then(|s| s.inputs.clone())
        .unwrap_or(inputs);
    finish(
        &driver,
        &args,
        Finish {
            load,
            inputs,
            winners: None,
            built_now,
            built_before,
            state_dir,
            started,
        },
    )
}

/// What [`finish`] commits and reports.
struct Finish {
    load: LoadId,
    inputs: LoadInputs,
    /// The builds' lines (numbered from 1) and how many builds there are; `None`: resume from
    /// the recorded plan (or report a committed load).
    winners: Option<(Vec<(usize, String)>, u32)>,
    built_now: usize,
    built_before: usize,
    state_dir: PathBuf,
    started: Instant,
}

/// Commits, removes what the load left (gc) and its state directory, prints the summary.
fn finish(driver: &DriverEnv, args: &LoadArgs, f: Finish) -> Result<ExitCode, Failure> {
    let (winners, partitions) = match f.winners {
        Some((lines, builds)) => (Some(lines), Some(builds)),
        None => (None, None),
    };
    crash_point("load-before-commit");
    let outcome = commit::commit(
        driver,
        CommitRequest {
            load: f.load.clone(),
            winners,
            verify: args.verify.into(),
            expected_partitions: partitions,
            allow_missing: false,
            visibility: Some(args.visibility.into()),
            prepare_only: false,
            replaced_on_every_shard: None,
        },
    )?;
    commit::log_committed(&outcome);
    crash_point("load-before-gc");
    let report = gc::gc(driver, None, false, false)?;
    let gc_removed = report.removed.iter().map(|(_, r)| r.len()).sum();
    remove_state(&f.load, &f.state_dir);
    let s = &outcome.summary;
    let summary = LoadSummary {
        load: f.load.to_string(),
        table: s.table.to_string(),
        state: "committed",
        already_committed: outcome.already_committed && f.built_now == 0,
        rows: s.rows,
        parts: s.parts,
        partitions: s.partitions,
        inputs: f.inputs,
        built_now: f.built_now,
        built_before: f.built_before,
        gc_removed,
        seconds: f.started.elapsed().as_secs_f64(),
    };
    tracing::info!(
        "load {} done: {} rows in {} part(s) of {}, from {}; {} build(s) run now, {} finished before; gc removed {} item(s); {:.1}s",
        summary.load,
        summary.rows,
        summary.parts,
        summary.table,
        summary.inputs.describe(),
        summary.built_now,
        summary.built_before,
        summary.gc_removed,
        summary.seconds
    );
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&summary).expect("a summary serializes")
        );
    }
    Ok(exit::ok())
}

/// A build failed for good (bad input, a refused table): nothing of the load can be attached
/// by re-running, so it is aborted here and what it published removed. Other failures leave
/// the load open for the re-run.
fn abort_if_permanent(
    driver: &DriverEnv,
    load: &LoadId,
    state_dir: &Path,
    failure: Failure,
) -> Failure {
    if failure.kind != FailureKind::Permanent {
        return failure;
    }
    let aborted = driver.rt.block_on(chpart_protocol::api::abort_with(
        &driver.ledger,
        &driver.reach,
        driver.fs.as_ref(),
        &driver.staging,
        load,
        false,
    ));
    let note = match aborted {
        Ok(removed) => {
            remove_state(load, state_dir);
            format!(
            "load {load} aborted, nothing attached, {} item(s) it left removed; load the fixed inputs under a new load id",
            removed.len()
        )
        }
        Err(e) => format!("load {load} left open, nothing attached (aborting it failed: {e}); `chpart abort --load {load}` ends it"),
    };
    Failure::new(failure.kind, failure.error.context(note))
}

/// Removes a finished load's state directory (a failure is only logged: nothing reads it again).
fn remove_state(load: &LoadId, state_dir: &Path) {
    match std::fs::remove_dir_all(state_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(
            "load {load}: cannot remove its state directory {}: {e}",
            state_dir.display()
        ),
    }
}

fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The inputs named on the command line: `-` alone (an Arrow stream on stdin), or files and
/// directories (every `*.parquet` under them, hidden and `_`-prefixed names skipped, as Spark
/// and Hive leave `_SUCCESS`, `_temporary/` and `.crc` files beside the data). Each file once.
fn resolve(given: &[PathBuf], jobs: usize) -> Result<Sources, Failure> {
    if given.iter().any(|p| p.as_os_str() == "-") {
        if given.len() > 1 {
            return Err(usage(anyhow!(
                "--input - (an Arrow stream on stdin) cannot be combined with other inputs"
            )));
        }
        return Ok(Sources::Stdin);
    }
    let mut paths: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    for input in given {
        let meta = std::fs::metadata(input)
            .with_context(|| format!("--input {}", input.display()))
            .map_err(usage)?;
        if meta.is_file() {
            let canonical = std::fs::canonicalize(input)
                .with_context(|| format!("--input {}", input.display()))
                .map_err(usage)?;
            paths.entry(canonical).or_insert_with(|| input.clone());
            continue;
        }
        let before = paths.len();
        let walk = walkdir::WalkDir::new(input)
            .follow_links(true)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| e.depth() == 0 || !is_hidden(e.file_name()));
        for entry in walk {
            let entry = entry
                .with_context(|| format!("--input {}", input.display()))
                .map_err(usage)?;
            let name = entry.file_name().to_string_lossy();
            if entry.file_type().is_file() && name.to_ascii_lowercase().ends_with(".parquet") {
                let canonical = std::fs::canonicalize(entry.path())
                    .with_context(|| format!("--input {}", entry.path().display()))
                    .map_err(usage)?;
                paths
                    .entry(canonical)
                    .or_insert_with(|| entry.path().to_owned());
            }
        }
        if paths.len() == before {
            return Err(usage(anyhow!(
                "--input {}: no *.parquet file under this directory (hidden and _-prefixed names are skipped)",
                input.display()
            )));
        }
    }
    let paths: Vec<PathBuf> = paths.into_values().collect();
    let mut files = hash_files(&paths, jobs)?;
    files.sort_by(|a, b| (&a.sha256, a.bytes).cmp(&(&b.sha256, b.bytes)));
    Ok(Sources::Files(files))
}

fn is_hidden(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with('.') || name.starts_with('_')
}

/// Size and sha256 of every file, `jobs` at a time.
fn hash_files(paths: &[PathBuf], jobs: usize) -> Result<Vec<InputFile>, Failure> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<std::io::Result<InputFile>>>> =
        Mutex::new((0..paths.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(paths.len()) {
            scope.spawn(|| {
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(path) = paths.get(i) else { break };
                    let hashed = std::fs::File::open(path)
                        .and_then(|f| chpart_build::sha256_of(f, &mut buf))
                        .map(|(bytes, sha256)| InputFile {
                            path: path.clone(),
                            bytes,
                            sha256,
                        });
                    results.lock().expect("not poisoned")[i] = Some(hashed);
                }
            });
        }
    });
    results
        .into_inner()
        .expect("not poisoned")
        .into_iter()
        .zip(paths)
        .map(|(r, path)| {
            r.expect("every file was read")
                .with_context(|| format!("--input {}: read it", path.display()))
                .map_err(usage)
        })
        .collect()
}

impl Sources {
    /// What `begin` records, with the number of builds a first run splits the files into:
    /// `--jobs` builds, more where a build would read more than [`BUILD_INPUT_BYTES`], never
    /// more than there are files.
    fn inputs(&self, jobs: usize) -> LoadInputs {
        match self {
            Sources::Stdin => LoadInputs {
                files: 0,
                bytes: 0,
                digest: STDIN_DIGEST.to_owned(),
                builds: 1,
            },
            Sources::Files(files) => {
                let bytes: u64 = files.iter().map(|f| f.bytes).sum();
                let mut digest = String::new();
                for f in files {
                    digest.push_str(&format!("{} {}\n", f.sha256, f.bytes));
                }
                let by_size = usize::try_from(bytes.div_ceil(BUILD_INPUT_BYTES)).unwrap_or(1);
                let builds = jobs.max(by_size).clamp(1, files.len().max(1));
                LoadInputs {
                    files: files.len() as u64,
                    bytes,
                    digest: chpart_build::sha256_of(digest.as_bytes(), &mut [0u8; 4096])
                        .expect("reading memory does not fail")
                        .1,
                    builds: u32::try_from(builds).unwrap_or(u32::MAX),
                }
            }
        }
    }
}

/// The files of each of `builds` builds: the largest file first to the build with the fewest
/// bytes so far (ties: the lower build), so the split depends only on the files' contents.
fn split(files: &[InputFile], builds: u32) -> Vec<Vec<&InputFile>> {
    let mut groups: Vec<(u64, Vec<&InputFile>)> = (0..builds).map(|_| (0, Vec::new())).collect();
    let mut order: Vec<&InputFile> = files.iter().collect();
    order.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.sha256.cmp(&b.sha256)));
    for file in order {
        let (bytes, group) = groups
            .iter_mut()
            .min_by_key(|(bytes, group)| (*bytes, group.len()))
            .expect("at least one build");
        *bytes += file.bytes;
        group.push(file);
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// The builds' lines, in build order, and how many ran now.
struct Built {
    lines: Vec<String>,
    built_now: usize,
}

/// Runs every build whose line is not in `state_dir` yet, `jobs` at a time. On the first
/// failure no further build starts; the running ones finish (their lines are kept for the
/// re-run) and the first failure is returned.
fn run_builds(
    load: &LoadId,
    sources: &Sources,
    builds: u32,
    jobs: usize,
    state_dir: &Path,
    config: chpart_config::Config,
    merge: bool,
) -> Result<Built, Failure> {
    let groups: Vec<Vec<&InputFile>> = match sources {
        Sources::Files(files) => split(files, builds),
        Sources::Stdin => vec![Vec::new()],
    };
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("create the state directory {}", state_dir.display()))
        .map_err(usage)?;
    let mut lines: Vec<Option<String>> = (0..groups.len())
        .map(|i| saved_line(state_dir, load, i))
        .collect();
    let pending: Vec<usize> = (0..groups.len()).filter(|&i| lines[i].is_none()).collect();
    Step::start(load, "load.plan")
        .counts(0, 0, groups.len() as u64, pending.len() as u64)
        .ok();
    if pending.len() < groups.len() {
        tracing::info!(
            "load {load}: {} of {} build(s) finished in an earlier run; running {}",
            groups.len() - pending.len(),
            groups.len(),
            pending.len()
        );
    }
    let executor = Executor::new(config)?;
    let run = format!("{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff);
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let outcomes: Mutex<Vec<(usize, Result<String, Failure>)>> = Mutex::new(Vec::new());
    let stdin_taken = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(pending.len()) {
            scope.spawn(|| loop {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Some(&i) = pending.get(next.fetch_add(1, Ordering::SeqCst)) else {
                    break;
                };
                let input = match sources {
                    Sources::Files(_) => {
                        Input::Parquet(groups[i].iter().map(|f| f.path.clone()).collect())
                    }
                    Sources::Stdin if !stdin_taken.swap(true, Ordering::SeqCst) => {
                        Input::ArrowStream(Box::new(std::io::stdin()))
                    }
                    Sources::Stdin => unreachable!("a stream on stdin is one build"),
                };
                let result = build_one(&executor, load, &run, i, input, merge, &groups[i])
                    .and_then(|line| save_line(state_dir, i, &line).map(|()| line));
                crash_point("load-after-build");
                if result.is_err() {
                    stop.store(true, Ordering::SeqCst);
                }
                outcomes.lock().expect("not poisoned").push((i, result));
            });
        }
    });
    let mut outcomes = outcomes.into_inner().expect("not poisoned");
    outcomes.sort_by_key(|(i, _)| *i);
    let mut built_now = 0;
    let mut first_failure = None;
    for (i, result) in outcomes {
        match result {
            Ok(line) => {
                lines[i] = Some(line);
                built_now += 1;
            }
            Err(failure) => {
                first_failure.get_or_insert(failure);
            }
        }
    }
    if let Some(failure) = first_failure {
        return Err(failure);
    }
    Ok(Built {
        lines: lines
            .into_iter()
            .map(|l| l.expect("every build finished"))
            .collect(),
        built_now,
    })
}

/// One build: attempt `load.<run>.<i>` of partition `i`.
fn build_one(
    executor: &Executor,
    load: &LoadId,
    run: &str,
    i: usize,
    input: Input,
    merge: bool,
    files: &[&InputFile],
) -> Result<String, Failure> {
    let id: AttemptId = format!("load.{run}.{i}")
        .parse()
        .context("attempt id")
        .map_err(usage)?;
    let what = match files {
        [] => "an Arrow stream on stdin".to_owned(),
        [one] => one.path.display().to_string(),
        [first, ..] => format!(
            "{} and {} more file(s)",
            first.path.display(),
            files.len() - 1
        ),
    };
    let context = format!("load {load} build {i} (attempt {id}, {what})");
    let step = Step::start(load, "load.build").attempt(&id);
    let report = build(
        &executor.env(),
        BuildRequest {
            load: load.clone(),
            attempt: Attempt {
                id,
                partition: u32::try_from(i).expect("builds fit in u32"),
                stage: None,
                stage_attempt: None,
                attempt_number: None,
            },
            input,
            merge,
        },
    )
    .map_err(|e| {
        let kind = e.kind();
        Failure::new(kind, anyhow::Error::new(e).context(context.clone()))
    })?;
    let rows = report
        .manifests
        .iter()
        .map(chpart_core::Manifest::total_rows)
        .sum();
    let parts = report.manifests.iter().map(|m| m.parts.len() as u64).sum();
    step.counts(rows, report.timings.bytes, parts, 1).ok();
    tracing::info!("{context}: {rows} rows in {parts} part(s) published");
    Ok(report.line)
}

fn line_path(state_dir: &Path, i: usize) -> PathBuf {
    state_dir.join(format!("build-{i}.json"))
}

/// The line build `i` printed in an earlier run, if it finished and the line is this load's.
fn saved_line(state_dir: &Path, load: &LoadId, i: usize) -> Option<String> {
    let path = line_path(state_dir, i);
    let text = std::fs::read_to_string(&path).ok()?;
    let value: serde_json::Value = match serde_json::from_str(text.trim()) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(
                "{}: not a build's line ({e}); building again",
                path.display()
            );
            return None;
        }
    };
    if value.get("load").and_then(|l| l.as_str()) != Some(load.as_str()) {
        tracing::warn!(
            "{}: not a line of load {load}; building again",
            path.display()
        );
        return None;
    }
    Some(text.trim().to_owned())
}

/// Keeps build `i`'s line for a re-run: written to a temporary file, synced, renamed.
fn save_line(state_dir: &Path, i: usize, line: &str) -> Result<(), Failure> {
    let path = line_path(state_dir, i);
    let tmp = state_dir.join(format!(".build-{i}.json.tmp"));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(line.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write()
        .with_context(|| format!("keep build {i}'s line in {}", path.display()))
        .map_err(|e| Failure::new(FailureKind::Permanent, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, bytes: u64, sha: &str) -> InputFile {
        InputFile {
            path: PathBuf::from(name),
            bytes,
            sha256: sha.to_owned(),
        }
    }

    #[test]
    fn builds_follow_jobs_and_size() {
        // (files as (bytes), jobs, builds)
        let gib = BUILD_INPUT_BYTES;
        let rows: &[(&[u64], usize, u32)] = &[
            (&[10], 4, 1),                        // never more builds than files
            (&[10, 10, 10], 2, 2),                // --jobs builds
            (&[gib, gib, gib, gib], 1, 4),        // at most a GiB a build
            (&[gib * 3], 2, 1),                   // one file is one build, however large
            (&[gib / 2, gib / 2, gib / 2], 1, 2), // 1.5 GiB: two builds
        ];
        for (sizes, jobs, want) in rows {
            let files: Vec<InputFile> = sizes
                .iter()
                .enumerate()
                .map(|(i, b)| file(&format!("f{i}"), *b, &format!("{i:064x}")))
                .collect();
            let got = Sources::Files(files).inputs(*jobs).builds;
            assert_eq!(got, *want, "sizes {sizes:?}, jobs {jobs}");
        }
    }

    #[test]
    fn inputs_are_named_by_content_not_paths() {
        let a = Sources::Files(vec![
            file("/a/x.parquet", 5, "aa"),
            file("/a/y.parquet", 7, "bb"),
        ])
        .inputs(2);
        let b = Sources::Files(vec![
            file("/b/1.parquet", 5, "aa"),
            file("/b/2.parquet", 7, "bb"),
        ])
        .inputs(1);
        assert!(a.same_data(&b), "same contents elsewhere: {a:?} vs {b:?}");
        let c = Sources::Files(vec![
            file("/a/x.parquet", 5, "aa"),
            file("/a/y.parquet", 7, "bc"),
        ])
        .inputs(2);
        assert!(!a.same_data(&c));
        assert_ne!(
            a.builds, b.builds,
            "builds are the run's choice, not the data's"
        );
    }

    #[test]
    fn split_balances_bytes_and_depends_on_content_only() {
        let files = vec![
            file("a", 100, "01"),
            file("b", 60, "02"),
            file("c", 50, "03"),
            file("d", 40, "04"),
            file("e", 10, "05"),
        ];
        let groups = split(&files, 2);
        let sums: Vec<u64> = groups
            .iter()
            .map(|g| g.iter().map(|f| f.bytes).sum())
            .collect();
        // Largest first to the lighter build: 100 | 60, 50 | 40 | 10.
        assert_eq!(sums, vec![140, 120]);
        let names = |g: &Vec<&InputFile>| g.iter().map(|f| f.path.clone()).collect::<Vec<_>>();
        let mut reversed = files.clone();
        reversed.reverse();
        let again = split(&reversed, 2);
        assert_eq!(
            groups.iter().map(names).collect::<Vec<_>>(),
            again.iter().map(names).collect::<Vec<_>>()
        );
        // Every file in exactly one build, no build empty.
        let three = split(&files, 5);
        assert!(three.iter().all(|g| g.len() == 1));
    }
}
