//! `chpart-bench build`: the executor side of chpart, measured beside the tools it replaces.
//!
//! One run generates the events file, starts its own ClickHouse server and sshd on loopback
//! (through the integration tests' harness, so both stop when the run ends, fails or is
//! killed), and then, for each round, times side by side:
//!
//! - (a) raw clickhouse-local building parts of the same table from the same file
//!   ([`crate::local`]): the floor for chpart's build, since chpart runs exactly that engine;
//! - (b) `chpart build` with the local transport: everything chpart adds on top of (a) (schema
//!   check, table snapshot, part checks, sha256 of every file, staging, publish, manifest);
//! - (c) `chpart build` over SFTP to the loopback sshd: (b) plus the upload;
//! - (d) `scp -r` of the part directories (a) made, to the server's filesystem: the upload
//!   baseline, beside chpart's upload phase as its own log line reports it (and, as a cross
//!   check that needs no log, (c) - (b));
//! - (e) `chpart build --input -` fed the same rows as an Arrow IPC stream through a pipe on
//!   its stdin (the file made once, outside the timings), local transport, with chpart's
//!   default spool chunk and a small one: its speed against (a) and (b), and the peak local
//!   disk of its work dir (spooled chunks and parts) against the bound the chunks promise;
//! - optionally the same with `--merge` (one part per partition), and for reference the
//!   server-side `INSERT ... FORMAT Parquet` over HTTP, with the server's CPU time.
//!
//! Memory is chpart's own peak RSS (see [`crate::measure`] for why not `wait4`'s). The machine
//! is shared and noisy, so each figure is the best of `--repeat` rounds and the report compares
//! ratios against the targets; nothing here asserts a timing.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};
use chpart_testenv::clickhouse::ClickHouse;
use chpart_testenv::sshd::Sshd;

use crate::chpart::{spooled_chunks, Chpart, Configs, ManifestSummary};
use crate::gen::{generate, GenOptions};
use crate::local::{self, DATABASE, TABLE};
use crate::measure::{self, DiskPeak, DiskWatch, Measured};
use crate::{events, http, interrupt};

mod report;
use report::report;

/// What to run.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Rows in the input.
    pub rows: u64,
    /// Input files the rows are split into (chpart gets them all as one attempt's input).
    pub files: usize,
    /// Generator seed.
    pub seed: u64,
    /// Start of the input's hour, Unix seconds.
    pub hour_start_secs: i64,
    /// Rounds; each variant's best round is reported.
    pub repeat: usize,
    /// Also measure `--merge` builds (raw and chpart, local transport).
    pub merge: bool,
    /// Also measure the server-side INSERT over HTTP.
    pub server_insert: bool,
    /// Measure only what needs no chpart: raw clickhouse-local, scp, server INSERT.
    pub raw_only: bool,
    /// Also measure `chpart build` fed the rows as an Arrow IPC stream on stdin (variant (e)).
    pub stream: bool,
    /// The small `spool_chunk_mib` of the second Arrow stream build (the first runs with
    /// chpart's default).
    pub small_spool_mib: u64,
    /// Keep the benchmark's directory (input, raw builds, configs, chpart's work dirs) instead of
    /// deleting it; the server's and sshd's directories go either way.
    pub keep: bool,
    /// The chpart binary; default: `chpart` next to this executable.
    pub chpart: Option<PathBuf>,
    /// Parent of the benchmark's directory; default: the system temp directory.
    pub work_dir: Option<PathBuf>,
}

/// Bounded disk for an Arrow stream build: chpart's work dir never holds more than this many
/// spool chunks besides the parts (the one being inserted and the one being written), so its
/// peak is at most this many chunk bounds plus the parts' size, whatever the stream's size.
const SPOOL_CHUNKS_AT_ONCE: u64 = 2;

/// chpart's default `[clickhouse_local] spool_chunk_mib`, in bytes
/// (`chpart_protocol::build::DEFAULT_SPOOL_CHUNK_BYTES`, defined as this constant).
const DEFAULT_SPOOL_CHUNK_BYTES: u64 = chpart_build::parts::ONE_BLOCK_BYTES;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    Raw,
    RawSync,
    Local,
    Sftp,
    StreamDefault,
    StreamSmall,
    RawMerge,
    LocalMerge,
    ServerInsert,
    Scp,
    ScpSync,
    ScpConnect,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Raw => "(a) raw clickhouse-local",
            Variant::RawSync => "(a) raw, then fsync of its parts' files",
            Variant::Local => "(b) chpart build, local transport",
            Variant::Sftp => "(c) chpart build, SFTP to loopback sshd",
            Variant::StreamDefault => "(e) chpart build < Arrow stream, default spool",
            Variant::StreamSmall => "(e) chpart build < Arrow stream, small spool",
            Variant::RawMerge => "(m) raw clickhouse-local + OPTIMIZE FINAL",
            Variant::LocalMerge => "(m) chpart build --merge, local transport",
            Variant::ServerInsert => "(r) server INSERT ... FORMAT Parquet (HTTP)",
            Variant::Scp => "(d) scp -r of the part directories",
            Variant::ScpSync => "(d) scp -r, then fsync of every file copied",
            Variant::ScpConnect => "(d) scp of one small file (SSH set-up cost)",
        }
    }
}

/// One timed run of a variant.
#[derive(Debug)]
struct Sample {
    secs: f64,
    own_peak_kib: Option<u64>,
    tree_peak_kib: Option<u64>,
    server_cpu_secs: Option<f64>,
    /// Bytes of parts produced or moved.
    part_bytes: Option<u64>,
    /// chpart's own account of where the time went, from its log.
    phases: Option<Phases>,
    /// Parts chpart made.
    parts: Option<usize>,
    /// chpart's work dir while it ran (watched for chpart builds on the local transport).
    disk: Option<DiskPeak>,
    /// Spooled chunks of an Arrow stream build, from chpart's debug log.
    chunks: Option<u64>,
}

impl Sample {
    fn of(run: &Measured, server_cpu_secs: Option<f64>, part_bytes: Option<u64>) -> Sample {
        Sample {
            secs: run.wall.as_secs_f64(),
            own_peak_kib: run.own_peak_kib,
            tree_peak_kib: Some(run.tree_peak_kib),
            server_cpu_secs,
            part_bytes,
            phases: Phases::parse(&String::from_utf8_lossy(&run.stderr)),
            parts: None,
            disk: None,
            chunks: spooled_chunks(&String::from_utf8_lossy(&run.stderr)),
        }
    }
}

/// The phase timings `chpart build` logs when it finishes:
/// `...: published N part(s), R rows, X MB (build 1.23s, digest 0.45s, upload 0.67s, publish 0.01s)`.
/// They are what isolates the upload from the build; a chpart that stops logging them still
/// gets the (c) - (b) estimate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Phases {
    build: f64,
    digest: f64,
    upload: f64,
    publish: f64,
}

impl Phases {
    fn parse(log: &str) -> Option<Phases> {
        let plain = strip_ansi(log);
        let line = plain
            .lines()
            .rev()
            .find(|l| l.contains("published") && l.contains("(build "))?;
        let inner = line.rsplit_once("(build ")?.1.split(')').next()?;
        let mut phases = Phases::default();
        let mut seen = 0;
        for item in format!("build {inner}").split(", ") {
            let (name, value) = item.trim().split_once(' ')?;
            let secs: f64 = value.strip_suffix('s')?.parse().ok()?;
            let slot = match name {
                "build" => &mut phases.build,
                "digest" => &mut phases.digest,
                "upload" => &mut phases.upload,
                "publish" => &mut phases.publish,
                _ => continue,
            };
            *slot = secs;
            seen += 1;
        }
        (seen == 4).then_some(phases)
    }

    fn total(&self) -> f64 {
        self.build + self.digest + self.upload + self.publish
    }
}

/// `text` without ANSI escape sequences (a log writer may colour its output).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, ended by a byte in @..~.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The samples of every variant, and what the report needs besides.
#[derive(Default)]
struct Results {
    samples: BTreeMap<Variant, Vec<Sample>>,
    raw_parts: usize,
    raw_part_bytes: u64,
    raw_uncompressed: u64,
    chpart_parts: Option<usize>,
    /// Bytes of the Arrow stream file the (e) builds are fed.
    stream_bytes: Option<u64>,
}

impl Results {
    fn add(&mut self, variant: Variant, sample: Sample) {
        self.samples.entry(variant).or_default().push(sample);
    }

    /// The fastest upload phase chpart logged over SFTP, with its part bytes.
    fn best_logged_upload(&self) -> Option<(f64, u64)> {
        self.samples
            .get(&Variant::Sftp)?
            .iter()
            .filter_map(|s| Some((s.phases?.upload, s.part_bytes?)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
    }

    fn best(&self, variant: Variant) -> Option<&Sample> {
        self.samples
            .get(&variant)?
            .iter()
            .min_by(|a, b| a.secs.total_cmp(&b.secs))
    }
}

/// Runs the build benchmark and prints its report.
pub fn run(options: &BuildOptions) -> anyhow::Result<()> {
    if options.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    let chpart = if options.raw_only {
        None
    } else {
        Some(Chpart::find(
            options.chpart.as_deref(),
            &["begin", "build"],
            ", or run with --raw-only to measure only the baselines (raw clickhouse-local, scp, \
             server INSERT)",
        )?)
    };
    let clickhouse_local = chpart_testenv::clickhouse_local();

    let mut builder = tempfile::Builder::new();
    builder.prefix("chpart-bench-");
    let dir = match &options.work_dir {
        Some(parent) => builder.tempdir_in(parent),
        None => builder.tempdir(),
    }
    .context("create the benchmark's directory")?;
    let root = dir.path().to_path_buf();
    println!("chpart-bench build: working in {}", root.display());

    let gen = generate(&GenOptions {
        rows: options.rows,
        out: root.join("input").join("events.parquet"),
        files: options.files,
        seed: options.seed,
        hour_start_secs: options.hour_start_secs,
    })?;
    println!("input: {}", gen.summary());
    // The (e) builds' input, made once and outside every timing.
    let stream = match (&chpart, options.stream) {
        (Some(_), true) => {
            let path = root.join("input").join("events.arrows");
            let made = local::arrow_stream(&clickhouse_local, &gen.paths, &path)?;
            println!(
                "arrow stream: {} ({:.1} MB, written in {:.1}s by clickhouse-local)",
                path.display(),
                mb(made.bytes),
                made.run.wall.as_secs_f64()
            );
            Some((path, made.bytes))
        }
        _ => None,
    };

    println!("starting ClickHouse 26.9 (chdb) and sshd on 127.0.0.1 ...");
    let server = ClickHouse::start(None);
    let sshd = Sshd::start(&[]);
    let target = format!("{DATABASE}.{TABLE}");
    let http_table = format!("{DATABASE}.{TABLE}_http");
    for sql in [
        format!("CREATE DATABASE {DATABASE}"),
        events::ddl(&target),
        events::ddl(&http_table),
        // Background merges of the INSERTed parts would burn server CPU during later
        // variants and blur the server CPU column; chpart's parts sit in detached/ anyway.
        format!("SYSTEM STOP MERGES {http_table}"),
    ] {
        server
            .query(&sql)
            .map_err(|e| anyhow::anyhow!("{sql}: {e}"))?;
    }
    let staging = server.data_dir.join("chpart-staging");
    fs::create_dir_all(&staging)?;

    let configs = Configs::write(&root, &server, &sshd, &clickhouse_local, &staging)?;
    if let Some(chpart) = &chpart {
        chpart.begin(&configs.local, &target, "bench-local", None)?;
        chpart.begin(&configs.sftp, &target, "bench-sftp", None)?;
        if options.merge {
            chpart.begin(&configs.local, &target, "bench-merge", None)?;
        }
    }

    let mut results = Results {
        stream_bytes: stream.as_ref().map(|(_, bytes)| *bytes),
        ..Results::default()
    };
    for round in 0..options.repeat {
        if interrupt::requested() {
            bail!("interrupted");
        }
        println!("round {}/{} ...", round + 1, options.repeat);
        let round_dir = root.join(format!("round-{round}"));
        let ctx = Round {
            round,
            dir: &round_dir,
            inputs: &gen.paths,
            stream: stream.as_ref().map(|(path, _)| path.as_path()),
            server: &server,
            sshd: &sshd,
            clickhouse_local: &clickhouse_local,
            chpart: chpart.as_ref(),
            configs: &configs,
            rows: options.rows,
        };
        ctx.run(options, &mut results)?;
        if !options.keep {
            fs::remove_dir_all(&round_dir).ok();
        }
    }

    print!("{}", report(options, &gen.summary(), &results));
    if options.keep {
        let kept = dir.keep();
        println!(
            "kept {} (the server and sshd directories are removed on exit)",
            kept.display()
        );
    }
    Ok(())
}

/// One round of every variant.
struct Round<'a> {
    round: usize,
    dir: &'a Path,
    inputs: &'a [PathBuf],
    /// The Arrow stream file of the same rows, if the (e) builds run.
    stream: Option<&'a Path>,
    server: &'a ClickHouse,
    sshd: &'a Sshd,
    clickhouse_local: &'a Path,
    chpart: Option<&'a Chpart>,
    configs: &'a Configs,
    rows: u64,
}

impl Round<'_> {
    fn run(&self, options: &BuildOptions, results: &mut Results) -> anyhow::Result<()> {
        fs::create_dir_all(self.dir)?;

        // (a) raw clickhouse-local; its parts are also the payload of the scp baseline.
        let cpu = self.server.cpu_seconds();
        let raw = local::raw_build(
            self.clickhouse_local,
            &self.dir.join("raw"),
            self.inputs,
            false,
        )?;
        self.expect_rows("raw clickhouse-local", raw.rows())?;
        results.raw_parts = raw.parts.len();
        results.raw_part_bytes = raw.bytes_on_disk();
        results.raw_uncompressed = raw.data_uncompressed_bytes();
        results.add(
            Variant::Raw,
            Sample::of(
                &raw.run,
                self.server_cpu_since(cpu),
                Some(raw.bytes_on_disk()),
            ),
        );
        // The same parts made as durable as chpart's (it fsyncs every file it publishes): the
        // raw build's time plus an fsync of each of its parts' files right after it.
        let dirs: Vec<PathBuf> = raw.parts.iter().map(|p| p.path.clone()).collect();
        let mut durable = Sample::of(&raw.run, None, Some(raw.bytes_on_disk()));
        durable.secs += fsync_trees(&dirs)?.as_secs_f64();
        results.add(Variant::RawSync, durable);

        if let Some(chpart) = self.chpart {
            // (b) and (c): the same build, published locally and over SFTP.
            for (variant, config, load, transport) in [
                (Variant::Local, &self.configs.local, "bench-local", "local"),
                (Variant::Sftp, &self.configs.sftp, "bench-sftp", "sftp"),
            ] {
                let cpu = self.server.cpu_seconds();
                let attempt = format!("{transport}-r{}", self.round);
                let watch = DiskWatch::start(&self.configs.work, SPOOL_EXTENSION);
                let built = chpart.build(config, load, 0, &attempt, self.inputs, false);
                let disk = watch.stop();
                let (run, manifest) = built?;
                results.chpart_parts = Some(manifest.parts);
                let sample = self.chpart_sample(variant, &run, cpu, &manifest, disk)?;
                results.add(variant, sample);
            }
            // (e): the same rows as an Arrow stream on stdin, spooled in chunks of chpart's
            // default bound and of a small one.
            if let Some(stream) = self.stream {
                for (variant, spool_mib) in [
                    (Variant::StreamDefault, None),
                    (Variant::StreamSmall, Some(options.small_spool_mib)),
                ] {
                    let cpu = self.server.cpu_seconds();
                    let attempt = format!(
                        "stream-{}-r{}",
                        spool_mib.map_or("default".into(), |m| format!("{m}mib")),
                        self.round
                    );
                    let watch = DiskWatch::start(&self.configs.work, SPOOL_EXTENSION);
                    let built = chpart.build_stream(
                        &self.configs.local,
                        "bench-local",
                        0,
                        &attempt,
                        stream,
                        spool_mib,
                    );
                    let disk = watch.stop();
                    let (run, manifest) = built?;
                    let sample = self.chpart_sample(variant, &run, cpu, &manifest, disk)?;
                    results.add(variant, sample);
                }
            }
        }

        // (d) scp -r of raw's part directories into the server's filesystem.
        let (scp, copied) = self.scp(&dirs, false)?;
        results.add(Variant::Scp, Sample::of(&scp, None, Some(copied)));
        // The same, made as durable as chpart's upload (which fsyncs every file it writes)
        // before it counts as done.
        let (durable, copied) = self.scp(&dirs, true)?;
        results.add(Variant::ScpSync, Sample::of(&durable, None, Some(copied)));
        let small = [raw.parts[0].path.join("count.txt")];
        let (connect, copied) = self.scp(&small, false)?;
        results.add(
            Variant::ScpConnect,
            Sample::of(&connect, None, Some(copied)),
        );
        drop(raw);

        if options.merge {
            let cpu = self.server.cpu_seconds();
            let merged = local::raw_build(
                self.clickhouse_local,
                &self.dir.join("raw-merge"),
                self.inputs,
                true,
            )?;
            self.expect_rows("raw clickhouse-local + OPTIMIZE FINAL", merged.rows())?;
            results.add(
                Variant::RawMerge,
                Sample::of(
                    &merged.run,
                    self.server_cpu_since(cpu),
                    Some(merged.bytes_on_disk()),
                ),
            );
            if let Some(chpart) = self.chpart {
                let cpu = self.server.cpu_seconds();
                let attempt = format!("merge-r{}", self.round);
                let (run, manifest) = chpart.build(
                    &self.configs.local,
                    "bench-merge",
                    0,
                    &attempt,
                    self.inputs,
                    true,
                )?;
                self.expect_rows("chpart build --merge", manifest.rows)?;
                results.add(
                    Variant::LocalMerge,
                    Sample::of(&run, self.server_cpu_since(cpu), Some(manifest.bytes)),
                );
            }
        }

        if options.server_insert {
            let cpu = self.server.cpu_seconds();
            let started = Instant::now();
            let query = format!("INSERT INTO {DATABASE}.{TABLE}_http FORMAT Parquet");
            for input in self.inputs {
                http::post_file(self.server.http_port, &query, input)?;
            }
            let secs = started.elapsed().as_secs_f64();
            let server_cpu = self.server_cpu_since(cpu);
            let rows = self
                .server
                .query(&format!("SELECT count() FROM {DATABASE}.{TABLE}_http"))
                .map_err(|e| anyhow::anyhow!(e))?;
            self.expect_rows("server INSERT", rows.trim().parse::<u64>()?)?;
            self.server
                .query(&format!("TRUNCATE TABLE {DATABASE}.{TABLE}_http"))
                .map_err(|e| anyhow::anyhow!(e))?;
            results.add(
                Variant::ServerInsert,
                Sample {
                    secs,
                    own_peak_kib: None,
                    tree_peak_kib: None,
                    server_cpu_secs: server_cpu,
                    part_bytes: None,
                    phases: None,
                    parts: None,
                    disk: None,
                    chunks: None,
                },
            );
        }
        Ok(())
    }

    /// The sample of a chpart build whose work dir was watched, after checking its rows.
    fn chpart_sample(
        &self,
        variant: Variant,
        run: &Measured,
        server_cpu_before: Option<f64>,
        manifest: &ManifestSummary,
        disk: DiskPeak,
    ) -> anyhow::Result<Sample> {
        self.expect_rows(variant.label(), manifest.rows)?;
        Ok(Sample {
            parts: Some(manifest.parts),
            disk: Some(disk),
            ..Sample::of(
                run,
                self.server_cpu_since(server_cpu_before),
                Some(manifest.bytes),
            )
        })
    }

    /// A benchmark of a wrong result is worthless: every variant must produce every row.
    fn expect_rows(&self, what: &str, rows: u64) -> anyhow::Result<()> {
        if rows != self.rows {
            bail!("{what} produced {rows} rows from an input of {}", self.rows);
        }
        Ok(())
    }

    fn server_cpu_since(&self, before: Option<f64>) -> Option<f64> {
        Some(self.server.cpu_seconds()? - before?)
    }

    /// Copies `paths` (part directories, or files) with OpenSSH's scp into
    /// `<server data>/bench-scp/r<round>/` on the server's filesystem, checks the copy's size and
    /// removes it. OpenSSH 9 scp speaks SFTP by default, the protocol chpart uses; the key and
    /// host key check are chpart's. With `fsync`, every file copied is then fsynced (coreutils
    /// `sync FILE...`, timed with the copy), as durable as chpart's upload leaves its files.
    /// Returns the run and the bytes copied.
    fn scp(&self, paths: &[PathBuf], fsync: bool) -> anyhow::Result<(Measured, u64)> {
        let dest = self
            .server
            .data_dir
            .join("bench-scp")
            .join(format!("r{}", self.round));
        fs::create_dir_all(&dest)?;
        let mut cmd = Command::new("scp");
        cmd.args(["-q", "-r", "-P", &self.sshd.port.to_string(), "-i"])
            .arg(&self.sshd.client_key)
            .args(["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"])
            .args([
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "GlobalKnownHostsFile=/dev/null",
            ])
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                self.sshd.known_hosts.display()
            ));
        for path in paths {
            cmd.arg(path.as_os_str());
        }
        cmd.arg(format!("root@127.0.0.1:{}/", dest.display()));
        let mut run = measure::run(&mut cmd)?;
        run.check()?;
        if fsync {
            run.wall += fsync_trees(std::slice::from_ref(&dest))?;
        }
        // system.parts' bytes_on_disk leaves out a few small files (checksums.txt among them);
        // what scp moved is every file.
        let copied = tree_bytes(&dest)?;
        let mut expected = 0;
        for path in paths {
            expected += tree_bytes(path)?;
        }
        fs::remove_dir_all(&dest).ok();
        if copied != expected {
            bail!("scp copied {copied} bytes, the sources hold {expected}");
        }
        Ok((run, copied))
    }
}

/// Fsyncs every file under `dirs` (coreutils `sync FILE...`); returns how long that took.
fn fsync_trees(dirs: &[PathBuf]) -> anyhow::Result<std::time::Duration> {
    let mut sync = Command::new("sync");
    for dir in dirs {
        sync.args(tree_files(dir)?);
    }
    let synced = measure::run(&mut sync)?;
    synced.check()?;
    Ok(synced.wall)
}

/// The files under `dir`, recursively.
fn tree_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            files.extend(tree_files(&path)?);
        } else {
            files.push(path);
        }
    }
    Ok(files)
}

/// Bytes of the file at `path`, or of all files under it.
fn tree_bytes(path: &Path) -> anyhow::Result<u64> {
    let meta = fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
    if !meta.is_dir() {
        return Ok(meta.len());
    }
    let mut total = 0;
    for entry in fs::read_dir(path).with_context(|| format!("list {}", path.display()))? {
        total += tree_bytes(&entry?.path())?;
    }
    Ok(total)
}

/// The extension of chpart's spooled chunk files (`<work dir>/input-<n>.arrows`).
const SPOOL_EXTENSION: &str = "arrows";

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_read_from_chpart_log_line() {
        let log = "\u{1b}[2m2026-11-30T09:00:01Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m built 10 part(s)\n\
                   2026-11-30T09:00:02Z  INFO load bench-sftp attempt sftp-r0 (partition 0): published \
                   10 part(s), 10000000 rows, 362.6 MB (build 4.10s, digest 0.92s, upload 1.75s, publish 0.03s)\n";
        let phases = Phases::parse(log).unwrap();
        assert_eq!(
            phases,
            Phases {
                build: 4.10,
                digest: 0.92,
                upload: 1.75,
                publish: 0.03
            }
        );
        assert!((phases.total() - 6.8).abs() < 1e-9);
        assert_eq!(Phases::parse("INFO built 10 part(s) in 4.1s"), None);
        assert_eq!(
            Phases::parse("published 1 part(s) (build 1s, digest x, upload 1s, publish 1s)"),
            None
        );
    }
}
