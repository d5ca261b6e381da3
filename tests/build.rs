//! `chpart build` end to end against the real components: clickhouse-local builds, the local
//! transport and SFTP publish, the real ClickHouse 26.9 server attaches.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use chpart_core::Manifest;
use chpart_testenv::clickhouse::{shared, ClickHouse, TestDb};
use chpart_testenv::sshd::Sshd;

pub use chpart_testenv::write_rows;

use crate::cli::{chpart, local_config, text};

pub const COLUMNS: &str = "ts DateTime('UTC'), id UInt64, name String, score Nullable(Float64)";
pub const ENGINE: &str = "ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id";

/// A table, a ledger and a config of a test's own on `server`.
pub struct Setup<'a> {
    pub db: TestDb<'a>,
    pub table: String,
    pub config: PathBuf,
    pub dir: tempfile::TempDir,
}

impl<'a> Setup<'a> {
    pub fn new(server: &'a ClickHouse, name: &str) -> Setup<'a> {
        Setup::with_tables(server, name, COLUMNS, ENGINE, &["events"])
    }

    /// As [`Setup::new`], with `tables` (the first is the target, `events`) of this definition.
    pub fn with_tables(
        server: &'a ClickHouse,
        name: &str,
        columns: &str,
        engine: &str,
        tables: &[&str],
    ) -> Setup<'a> {
        let db = TestDb::new(server, name);
        for table in tables {
            server.q(&format!(
                "CREATE TABLE `{}`.{table} ({columns}) {engine}",
                db.name
            ));
        }
        let dir = tempfile::tempdir().unwrap();
        let config = local_config(dir.path(), server, &format!("{}_ledger", db.name));
        let table = format!("{}.events", db.name);
        Setup {
            db,
            table,
            config,
            dir,
        }
    }

    pub fn begin(&self, load: &str, extra: &[&str]) -> Output {
        chpart()
            .args(["begin", "--config"])
            .arg(&self.config)
            .args(["--table", &self.table, "--load", load])
            .args(extra)
            .output()
            .unwrap()
    }

    /// Runs `chpart <args[0]> --config <this config> <args[1..]>`.
    pub fn run(&self, args: &[&str]) -> Output {
        crate::cli::run_with(&self.config, args)
    }

    pub fn build_cmd(&self, load: &str, attempt: &str, partition: u32) -> Command {
        let mut cmd = chpart();
        cmd.args(["build", "--config"]).arg(&self.config).args([
            "--load",
            load,
            "--attempt",
            attempt,
            "--partition",
            &partition.to_string(),
        ]);
        cmd
    }

    /// Runs build on Parquet files; the manifest on success.
    pub fn build_files(
        &self,
        load: &str,
        attempt: &str,
        files: &[&Path],
    ) -> Result<Manifest, Output> {
        let out = self
            .build_cmd(load, attempt, 0)
            .arg("--input")
            .args(files)
            .output()
            .unwrap();
        manifest_of(out)
    }

    /// Everything in the publish table's `detached/` (via system.detached_parts).
    pub fn detached(&self, table: &str) -> Vec<String> {
        let rows = self.db.server.q(&format!(
            "SELECT name FROM system.detached_parts WHERE database = '{}' AND table = '{table}' ORDER BY name",
            self.db.name
        ));
        rows.lines().map(str::to_owned).collect()
    }
}

pub fn manifest_of(out: Output) -> Result<Manifest, Output> {
    if !out.status.success() {
        return Err(out);
    }
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let line = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no manifest on stdout: {}", text(&out)));
    Ok(
        Manifest::from_json(line)
            .unwrap_or_else(|e| panic!("manifest does not parse: {e}\n{line}")),
    )
}

/// `n` rows over two months, ids from `from`.
pub fn rows_select(from: u64, n: u64) -> String {
    format!(
        "SELECT toDateTime('2026-01-20 00:00:00', 'UTC') + toIntervalDay(number % 20) AS ts, {from} + number AS id, \
         concat('name-', toString(number)) AS name, if(number % 3 = 0, NULL, number / 7) AS score \
         FROM numbers({n})"
    )
}

fn exit_code(out: &Output) -> Option<i32> {
    out.status.code()
}

#[test]
fn parquet_build_publishes_into_the_shadow_and_attaches() {
    let ch = shared();
    let s = Setup::new(ch, "build_parquet");
    let begun = s.begin("bp-1", &["--json"]);
    assert_eq!(exit_code(&begun), Some(0), "{}", text(&begun));
    let spec: serde_json::Value = serde_json::from_slice(&begun.stdout).unwrap();
    let shadow = spec["publish"]
        .as_str()
        .unwrap()
        .split('.')
        .nth(1)
        .unwrap()
        .to_owned();

    let a = write_rows(s.dir.path(), "a.parquet", &rows_select(0, 1000), "Parquet");
    let b = write_rows(
        s.dir.path(),
        "b.parquet",
        &rows_select(1000, 500),
        "Parquet",
    );
    let m = s
        .build_files("bp-1", "app-1.7", &[&a, &b])
        .unwrap_or_else(|o| panic!("{}", text(&o)));
    assert_eq!(m.source_rows, 1500);
    assert_eq!(m.total_rows(), 1500);
    assert_eq!(m.target.table.as_str(), shadow);
    assert!(
        m.parts.len() >= 2,
        "two months, two files: {} parts",
        m.parts.len()
    );
    let mut names: Vec<String> = m.parts.iter().map(|p| p.name.to_string()).collect();
    names.sort();
    assert_eq!(
        s.detached(&shadow),
        names,
        "exactly the manifest's parts are in detached/"
    );
    // The manifest is also in staging, and the local work dir is gone.
    let staged = Path::new(m.target.staging_dir.as_str()).join("manifest.json");
    assert_eq!(
        Manifest::from_json(&std::fs::read_to_string(staged).unwrap()).unwrap(),
        m
    );
    assert_eq!(
        std::fs::read_dir(s.dir.path().join("work"))
            .unwrap()
            .count(),
        0,
        "work dir cleaned up"
    );

    attach_every_part(ch, &format!("`{}`.`{shadow}`", s.db.name), &m);
    assert_eq!(
        ch.q(&format!(
            "SELECT count(), sum(id), countIf(score IS NULL) FROM `{}`.`{shadow}`",
            s.db.name
        ))
        .trim(),
        "1500\t1124250\t501"
    );
    let hashes = ch.q(&format!("SELECT hash_of_all_files FROM system.parts WHERE database = '{}' AND table = '{shadow}' AND active ORDER BY hash_of_all_files", s.db.name));
    let mut want: Vec<&str> = m
        .parts
        .iter()
        .map(|p| p.hash_of_all_files.as_str())
        .collect();
    want.sort();
    assert_eq!(hashes.lines().collect::<Vec<_>>(), want);
}

#[test]
fn arrow_stream_on_stdin_over_sftp_into_the_target() {
    let ch = shared();
    let sshd = Sshd::start(&[]);
    let s = Setup::new(ch, "build_sftp");
    let mut config = std::fs::read_to_string(&s.config).unwrap();
    config = config.replace("kind = \"local\"", "kind = \"sftp\"");
    config.push_str(&format!(
        "[ssh]\nhost = \"127.0.0.1\"\nport = {}\nuser = \"root\"\nidentity_file = \"{}\"\nknown_hosts = \"{}\"\n",
        sshd.port,
        sshd.client_key.display(),
        sshd.known_hosts.display()
    ));
    std::fs::write(&s.config, config).unwrap();
    assert_eq!(
        exit_code(&s.begin("bs-1", &["--visibility", "part"])),
        Some(0)
    );

    let stream = arrow_stream_of(&s, 200_000);
    let out = run_on_stdin(
        s.build_cmd("bs-1", "app-2.1", 3).args([
            "--stage",
            "4",
            "--stage-attempt",
            "1",
            "--attempt-number",
            "0",
            "--input",
            "-",
            "--die-with-parent",
        ]),
        &stream,
    );
    let m = manifest_of(out).unwrap_or_else(|o| panic!("{}", text(&o)));
    assert_eq!((m.source_rows, m.total_rows()), (200_000, 200_000));
    assert_eq!(
        (
            m.attempt.partition,
            m.attempt.stage,
            m.attempt.stage_attempt
        ),
        (3, Some(4), Some(1))
    );
    assert_eq!(
        m.target.table.as_str(),
        "events",
        "part visibility publishes into the target itself"
    );
    attach_every_part(ch, &s.table, &m);
    assert_eq!(
        ch.q(&format!("SELECT count(), uniqExact(id) FROM {}", s.table))
            .trim(),
        "200000\t200000"
    );
}

/// `ALTER TABLE table ATTACH PART` of every part of `m`, by its exact name.
fn attach_every_part(ch: &ClickHouse, table: &str, m: &Manifest) {
    for part in &m.parts {
        ch.q(&format!("ALTER TABLE {table} ATTACH PART '{}'", part.name));
    }
}

/// `rows` generated rows as an Arrow IPC stream file of the test's dir, in many batches
/// (7000-row blocks: the engine cannot read such a stream from a pipe, it seeks, so chpart must
/// not hand it one), with `ts` as a timestamp (ClickHouse writes DateTime as UInt32 in Arrow;
/// a timestamp is what batch jobs send).
pub fn arrow_stream_of(s: &Setup, rows: u64) -> PathBuf {
    let select = format!(
        "SELECT toDateTime64(ts, 3, 'UTC') AS ts, id, name, score FROM ({}) SETTINGS max_block_size = 7000",
        rows_select(0, rows)
    );
    write_rows(s.dir.path(), "rows.arrows", &select, "ArrowStream")
}

/// Runs `cmd` with `file` on its stdin (closed once written); its output.
fn run_on_stdin(cmd: &mut Command, file: &Path) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().expect("the child's stdin is piped");
    stdin.write_all(&std::fs::read(file).unwrap()).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// Writes `dir/name`: a clickhouse-local that is the real engine in everything but its identity,
/// which it reports as `version` computing in `zone` (the first line a run with `SELECT
/// version(), timezone()` prints, alone or before a build's listing). With `runs`, each run
/// appends a line to that file. Returns the path.
fn local_reporting(
    dir: &Path,
    name: &str,
    version: &str,
    zone: &str,
    runs: Option<&Path>,
) -> PathBuf {
    let real = chpart_testenv::clickhouse_local().display().to_string();
    let count = runs.map_or(String::new(), |runs| {
        format!("echo run >> {}\n", runs.display())
    });
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "#!/bin/bash\nset -o pipefail\n{count}case \"$*\" in *'version()'*) {real} \"$@\" | sed '1s|^.*$|{version}\\t{zone}|'; exit $?;; esac\nexec {real} \"$@\"\n"
        ),
    )
    .unwrap();
    chpart_testenv::set_mode(&path, 0o755);
    path
}

/// An Arrow stream on stdin is spooled in bounded chunks (here `spool_chunk_mib = 1`, about
/// 9 MiB of rows): each chunk is built by its own clickhouse-local session while the next is
/// written, so the work dir never holds more than two chunks, and the parts hold every row
/// once. Each chunk is one INSERT, so this small bound gives a part per partition per chunk,
/// unless `merge_split_partitions` merges them.
#[test]
fn an_arrow_stream_is_built_in_bounded_chunks() {
    let ch = shared();
    let s = Setup::new(ch, "build_chunks");
    let stream = arrow_stream_of(&s, 300_000);
    // The same stream of two months in 1 MiB chunks: with merge_split_partitions = true the
    // chunks' parts of a month are merged into one before shipping; with false (the default)
    // they are shipped as built, a part per month per chunk.
    for (i, merge_split) in [true, false].into_iter().enumerate() {
        let load = format!("bc-{i}");
        assert_eq!(
            exit_code(&s.begin(&load, &["--visibility", "part"])),
            Some(0)
        );
        let work = s.dir.path().join(format!("chunked-work-{i}"));
        std::fs::create_dir_all(&work).unwrap();
        // Chunk files in the work dir, watched while the build runs: the most at one time, and
        // every name seen (a chunk's file stays until its session ends).
        let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let watcher = {
            let (work, watching) = (work.clone(), watching.clone());
            std::thread::spawn(move || {
                let (mut most, mut seen) = (0, std::collections::BTreeSet::new());
                while watching.load(std::sync::atomic::Ordering::SeqCst) {
                    let chunks: Vec<String> = walkdir::WalkDir::new(&work)
                        .into_iter()
                        .filter_map(Result::ok)
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.starts_with("input-") && n.ends_with(".arrows"))
                        .collect();
                    most = most.max(chunks.len());
                    seen.extend(chunks);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                (most, seen)
            })
        };
        let out = run_on_stdin(
            s.build_cmd(&load, "app-9.1", 0)
                .args(["--input", "-"])
                .env("CHPART_CLICKHOUSE_LOCAL_SPOOL_CHUNK_MIB", "1")
                .env("CHPART_CLICKHOUSE_LOCAL_WORK_DIR", &work)
                .env(
                    "CHPART_CLICKHOUSE_LOCAL_MERGE_SPLIT_PARTITIONS",
                    merge_split.to_string(),
                ),
            &stream,
        );
        watching.store(false, std::sync::atomic::Ordering::SeqCst);
        let (most, seen) = watcher.join().unwrap();
        let m = manifest_of(out).unwrap_or_else(|o| panic!("{}", text(&o)));
        assert_eq!((m.source_rows, m.total_rows()), (300_000, 300_000));
        assert!(seen.len() > 2, "{} chunk(s) only: {seen:?}", seen.len());
        assert!(
            most <= 2,
            "the work dir held {most} chunks at once (seen: {seen:?})"
        );
        let parts: Vec<String> = m.parts.iter().map(|p| p.name.to_string()).collect();
        if merge_split {
            assert_eq!(parts.len(), 2, "not one part per month: {parts:?}");
        } else {
            // Two months: a part per month per chunk.
            assert!(parts.len() > 2, "chunks' parts were merged: {parts:?}");
        }
        eprintln!(
            "chunked build (merge_split_partitions = {merge_split}): {} parts, {} chunk file(s) seen, at most {most} at once",
            parts.len(),
            seen.len()
        );
        attach_every_part(ch, &s.table, &m);
        assert_eq!(
            ch.q(&format!("SELECT count(), uniqExact(id) FROM {}", s.table))
                .trim(),
            format!("{}\t300000", 300_000 * (i + 1))
        );
    }
}

#[test]
fn two_attempts_of_one_partition_at_once_never_share_a_path() {
    let ch = shared();
    let s = Setup::new(ch, "build_concurrent");
    assert_eq!(
        exit_code(&s.begin("bc-1", &["--visibility", "part"])),
        Some(0)
    );
    let input = write_rows(s.dir.path(), "in.parquet", &rows_select(0, 3000), "Parquet");
    // Same partition, two attempt ids (a retry and a zombie of the old stage attempt), as
    // separate processes running at the same time.
    let children: Vec<_> = ["app-3.10", "app-3.11"]
        .iter()
        .map(|attempt| {
            s.build_cmd("bc-1", attempt, 5)
                .arg("--input")
                .arg(&input)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let manifests: Vec<Manifest> = children
        .into_iter()
        .map(|c| {
            manifest_of(c.wait_with_output().unwrap()).unwrap_or_else(|o| panic!("{}", text(&o)))
        })
        .collect();
    let (a, b) = (&manifests[0], &manifests[1]);
    assert_ne!(a.target.staging_dir, b.target.staging_dir);
    for pa in &a.parts {
        assert!(
            b.parts.iter().all(|pb| pb.name != pa.name),
            "part name {} shared",
            pa.name
        );
    }
    // Both complete, both published: the driver picks one; the other is gc's.
    assert_eq!(s.detached("events").len(), a.parts.len() + b.parts.len());
    // Same rows, same engine: the same part contents, only the names differ.
    let hashes = |m: &Manifest| {
        let mut h: Vec<String> = m
            .parts
            .iter()
            .map(|p| p.hash_of_all_files.clone())
            .collect();
        h.sort();
        h
    };
    assert_eq!(hashes(a), hashes(b));
}

#[test]
fn a_finished_load_fences_the_build_and_publishes_nothing() {
    let ch = shared();
    let s = Setup::new(ch, "build_fenced");
    assert_eq!(
        exit_code(&s.begin("bf-1", &["--visibility", "part"])),
        Some(0)
    );
    ch.q(&format!(
        "INSERT INTO `{}_ledger`.ledger (load_id, entry_id, kind, writer, body) VALUES ('bf-1', 'commit', 'load_committed', 't', '{{}}')",
        s.db.name
    ));
    let input = write_rows(s.dir.path(), "in.parquet", &rows_select(0, 10), "Parquet");
    let out = s.build_files("bf-1", "app-4.1", &[&input]).unwrap_err();
    assert_eq!(exit_code(&out), Some(5), "{}", text(&out));
    assert!(
        text(&out).contains("load bf-1 is committed"),
        "{}",
        text(&out)
    );
    assert!(s.detached("events").is_empty());
    assert!(!ch.data_dir.join("chpart-staging/bf-1/app-4.1").exists());

    let out = s
        .build_files("never-begun", "app-4.2", &[&input])
        .unwrap_err();
    assert_eq!(exit_code(&out), Some(4), "{}", text(&out));
    assert!(text(&out).contains("was never begun"), "{}", text(&out));
}

#[test]
fn bad_input_is_refused_with_the_file_and_column_named() {
    let ch = shared();
    let s = Setup::new(ch, "build_bad_input");
    assert_eq!(
        exit_code(&s.begin("bb-1", &["--visibility", "part"])),
        Some(0)
    );
    let dir = s.dir.path();
    let good = write_rows(dir, "good.parquet", &rows_select(0, 100), "Parquet");
    let truncated = dir.join("truncated.parquet");
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let garbage = dir.join("garbage.parquet");
    std::fs::write(&garbage, b"this is not parquet at all, not even close").unwrap();
    let extra = write_rows(
        dir,
        "extra.parquet",
        &format!("SELECT *, 1 AS surprise FROM ({})", rows_select(0, 5)),
        "Parquet",
    );
    let missing = write_rows(
        dir,
        "missing.parquet",
        "SELECT now() AS ts, number AS id FROM numbers(5)",
        "Parquet",
    );
    let wrong_type = write_rows(
        dir,
        "wrong_type.parquet",
        "SELECT now() AS ts, toInt64(number) - 3 AS id, 'x' AS name, 1.5 AS score FROM numbers(5)",
        "Parquet",
    );
    let nulls = write_rows(
        dir,
        "nulls.parquet",
        "SELECT now() AS ts, number AS id, if(number = 2, NULL, 'x') AS name, 1.5 AS score FROM numbers(5)",
        "Parquet",
    );
    let rows: Vec<(&str, &Path, Vec<&str>)> = vec![
        (
            "truncated parquet",
            &truncated,
            vec!["truncated.parquet", "not a valid Parquet file"],
        ),
        (
            "garbage",
            &garbage,
            vec!["garbage.parquet", "not a valid Parquet file"],
        ),
        ("extra column", &extra, vec!["extra.parquet", "surprise"]),
        (
            "missing column without default",
            &missing,
            vec!["missing.parquet", "name"],
        ),
        (
            "incompatible type",
            &wrong_type,
            vec!["wrong_type.parquet", "id", "Int64", "UInt64"],
        ),
        (
            "null into a non-Nullable column",
            &nulls,
            vec!["nulls.parquet", "name", "String"],
        ),
    ];
    for (case, file, wants) in rows {
        let out = s
            .build_files("bb-1", &format!("app-5.{}", case.len()), &[file])
            .unwrap_err();
        assert_eq!(exit_code(&out), Some(4), "{case}: {}", text(&out));
        for want in wants {
            assert!(
                text(&out).contains(want),
                "{case}: message lacks {want:?}: {}",
                text(&out)
            );
        }
        let message = text(&out);
        let first = message
            .lines()
            .find(|l| l.contains("error:"))
            .unwrap_or(&message);
        let causes: Vec<&str> = first.split(": ").filter(|c| c.len() > 12).collect();
        for cause in &causes {
            assert_eq!(
                first.matches(cause).count(),
                1,
                "{case}: {cause:?} is said more than once: {first}"
            );
        }
        assert!(
            s.detached("events").is_empty(),
            "{case}: something was published"
        );
        assert_eq!(
            std::fs::read_dir(ch.data_dir.join("chpart-staging/bb-1"))
                .unwrap()
                .count(),
            0,
            "{case}: the refused attempt's staging dir was left"
        );
    }
    assert_eq!(
        std::fs::read_dir(s.dir.path().join("work"))
            .unwrap()
            .count(),
        0,
        "work dirs cleaned up"
    );
}

#[test]
fn clickhouse_local_missing_or_failing_and_unreachable_ssh() {
    let ch = shared();
    let s = Setup::new(ch, "build_faults");
    assert_eq!(
        exit_code(&s.begin("bx-1", &["--visibility", "part"])),
        Some(0)
    );
    let input = write_rows(s.dir.path(), "in.parquet", &rows_select(0, 10), "Parquet");

    let out = s
        .build_cmd("bx-1", "app-6.1", 0)
        .arg("--input")
        .arg(&input)
        .env(
            "CHPART_CLICKHOUSE_LOCAL_COMMAND",
            "/nonexistent/clickhouse-local",
        )
        .output()
        .unwrap();
    assert_eq!(exit_code(&out), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("clickhouse_local.command")
            && text(&out).contains(&format!("on host {}", crate::cli::hostname())),
        "the key and the executor's host named: {}",
        text(&out)
    );

    // A clickhouse-local that crashes: the error carries its status and stderr.
    let crashing = s.dir.path().join("crashing-clickhouse-local");
    std::fs::write(
        &crashing,
        "#!/bin/sh\necho 'Code: 1001. DB::Exception: simulated crash' >&2\nkill -SEGV $$\n",
    )
    .unwrap();
    chpart_testenv::set_mode(&crashing, 0o755);
    let out = s
        .build_cmd("bx-1", "app-6.2", 0)
        .arg("--input")
        .arg(&input)
        .env("CHPART_CLICKHOUSE_LOCAL_COMMAND", &crashing)
        .output()
        .unwrap();
    assert_eq!(exit_code(&out), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("simulated crash") && text(&out).contains("app-6.2"),
        "{}",
        text(&out)
    );
    assert_eq!(
        text(&out).matches("simulated crash").count(),
        1,
        "the cause is said once: {}",
        text(&out)
    );

    // SFTP to a port nobody listens on: retryable, names the host.
    let closed = chpart_testenv::ClosedPort::new();
    let port = closed.port;
    let known_hosts = s.dir.path().join("known_hosts");
    std::fs::write(&known_hosts, "").unwrap();
    let mut config = std::fs::read_to_string(&s.config)
        .unwrap()
        .replace("kind = \"local\"", "kind = \"sftp\"");
    config.push_str(&format!(
        "[ssh]\nhost = \"127.0.0.1\"\nport = {port}\nuser = \"root\"\nidentity_file = \"/nonexistent\"\nknown_hosts = \"{}\"\nconnect_timeout_secs = 3\n",
        known_hosts.display()
    ));
    let sftp_config = s.dir.path().join("sftp.toml");
    std::fs::write(&sftp_config, config).unwrap();
    let out = chpart()
        .args(["build", "--config"])
        .arg(&sftp_config)
        .args([
            "--load",
            "bx-1",
            "--attempt",
            "app-6.3",
            "--partition",
            "0",
            "--input",
        ])
        .arg(&input)
        .output()
        .unwrap();
    assert_eq!(exit_code(&out), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("127.0.0.1:{port}")),
        "{}",
        text(&out)
    );
    assert!(s.detached("events").is_empty());
}

#[test]
fn a_part_the_server_could_not_own_is_refused_before_publishing() {
    // The server runs as `clickhouse`; the local transport runs as root: publishing would
    // leave root-owned parts ClickHouse cannot attach, so build refuses and explains.
    let ch = ClickHouse::start(Some("clickhouse"));
    let s = Setup::new(&ch, "build_owner");
    assert_eq!(
        exit_code(&s.begin("bo-1", &["--visibility", "part"])),
        Some(0)
    );
    let input = write_rows(s.dir.path(), "in.parquet", &rows_select(0, 10), "Parquet");
    let out = s.build_files("bo-1", "app-7.1", &[&input]).unwrap_err();
    assert_eq!(exit_code(&out), Some(4), "{}", text(&out));
    assert!(text(&out).contains("server's user"), "{}", text(&out));
    assert!(s.detached("events").is_empty());
    assert!(
        !ch.data_dir.join("chpart-staging/bo-1/app-7.1").exists(),
        "staging removed"
    );
}

/// A tmpfs mounted for one test, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = chpart_testenv::scratch_dir("tmpfs");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount tmpfs (tests run as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

#[test]
fn staging_on_another_filesystem_or_a_full_disk_fails_cleanly() {
    let ch = shared();
    let s = Setup::new(ch, "build_fs_faults");
    // `begin` records the staging root (from its config) and every build follows it.
    let begin_staging_on = |load: &str, root: &Path| {
        let out = chpart()
            .args(["begin", "--config"])
            .arg(&s.config)
            .args(["--table", &s.table, "--load", load, "--visibility", "part"])
            .env("CHPART_STAGING_ROOT", root)
            .output()
            .unwrap();
        assert_eq!(exit_code(&out), Some(0), "{}", text(&out));
    };
    let input = write_rows(s.dir.path(), "in.parquet", &rows_select(0, 1000), "Parquet");

    // Staging on another filesystem than detached/: the rename cannot work (EXDEV).
    let other_fs = Tmpfs::mount("16m");
    begin_staging_on("bd-1", other_fs.dir.path());
    let out = s
        .build_cmd("bd-1", "app-8.1", 0)
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap();
    assert_eq!(exit_code(&out), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("different filesystems") || text(&out).contains("cross-device"),
        "{}",
        text(&out)
    );
    assert!(s.detached("events").is_empty());
    assert!(
        !other_fs.dir.path().join("bd-1/app-8.1").exists(),
        "staging removed after the failure"
    );

    // A staging filesystem too small for the parts: the upload fails with the cause named.
    let small = Tmpfs::mount("256k");
    let big = write_rows(
        s.dir.path(),
        "big.parquet",
        "SELECT now() AS ts, number AS id, randomString(200) AS name, NULL::Nullable(Float64) AS score FROM numbers(20000)",
        "Parquet",
    );
    begin_staging_on("bd-2", small.dir.path());
    let out = s
        .build_cmd("bd-2", "app-8.2", 0)
        .arg("--input")
        .arg(&big)
        .output()
        .unwrap();
    // Retrying on the same full disk cannot help until someone frees space: permanent.
    assert_eq!(exit_code(&out), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("no space left on device"),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("app-8.2"), "{}", text(&out));
    assert!(s.detached("events").is_empty());
    assert!(
        !small.dir.path().join("bd-2/app-8.2").exists(),
        "staging removed after the failure"
    );
}

/// What an attempt's staging holds, file by file (relative path -> bytes), to show it untouched.
fn staging_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = walkdir::WalkDir::new(dir)
        .into_iter()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
            (rel, std::fs::read(e.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn a_second_build_with_the_same_attempt_id_is_refused_and_touches_nothing() {
    // Attempt ids come from the runner; a runner that repeats one (a YARN application attempt
    // restarting task attempt ids at 0 under the same application id) must not make the
    // second build remove the first one's staging, publish intent or parts.
    let ch = shared();
    let s = Setup::new(ch, "build_same_attempt");
    assert_eq!(exit_code(&s.begin("bsa-1", &[])), Some(0));
    let input = write_rows(s.dir.path(), "in.parquet", &rows_select(0, 2000), "Parquet");
    let other = write_rows(
        s.dir.path(),
        "other.parquet",
        &rows_select(5000, 300),
        "Parquet",
    );
    let first = s
        .build_files("bsa-1", "app-9.1", &[&input])
        .unwrap_or_else(|o| panic!("{}", text(&o)));
    let staging = PathBuf::from(first.target.staging_dir.as_str());
    let shadow = first.target.table.as_str().to_owned();
    let before = staging_files(&staging);
    assert!(
        before.iter().any(|(f, _)| f == "publish-intent.json")
            && before.iter().any(|(f, _)| f == "manifest.json"),
        "{before:?}"
    );
    let published = s.detached(&shadow);
    assert_eq!(published.len(), first.parts.len());

    // Again with the same attempt id, with the same rows and with other rows.
    for file in [&input, &other] {
        let out = s.build_files("bsa-1", "app-9.1", &[file]).unwrap_err();
        assert_eq!(exit_code(&out), Some(4), "{}", text(&out));
        let message = text(&out);
        assert!(
            message.contains("app-9.1") && message.contains(staging.to_str().unwrap()),
            "the refusal names the attempt and its staging: {message}"
        );
        assert_eq!(
            staging_files(&staging),
            before,
            "the first attempt's staging changed"
        );
        assert_eq!(s.detached(&shadow), published, "detached/ changed");
    }

    // Two more at once with one new id: exactly one of them builds.
    let children: Vec<_> = [&input, &input]
        .iter()
        .map(|file| {
            s.build_cmd("bsa-1", "app-9.2", 1)
                .arg("--input")
                .arg(file)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outcomes: Vec<Result<Manifest, Output>> = children
        .into_iter()
        .map(|c| manifest_of(c.wait_with_output().unwrap()))
        .collect();
    let built: Vec<&Manifest> = outcomes.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(
        built.len(),
        1,
        "{:?}",
        outcomes
            .iter()
            .map(|r| r.as_ref().err().map(text))
            .collect::<Vec<_>>()
    );
    let refused = outcomes.iter().find_map(|r| r.as_ref().err()).unwrap();
    assert_eq!(exit_code(refused), Some(4), "{}", text(refused));
    let second = built[0];
    assert!(
        Path::new(second.target.staging_dir.as_str())
            .join("manifest.json")
            .exists(),
        "the winner's manifest survived the refused one"
    );

    // The load still commits exactly once.
    let winners = s.dir.path().join("winners.jsonl");
    std::fs::write(
        &winners,
        format!("{}\n{}\n", first.to_json_line(), second.to_json_line()),
    )
    .unwrap();
    let out = chpart()
        .args(["commit", "--config"])
        .arg(&s.config)
        .args(["--load", "bsa-1", "--partitions", "2", "--winners"])
        .arg(&winners)
        .output()
        .unwrap();
    assert_eq!(exit_code(&out), Some(0), "{}", text(&out));
    assert_eq!(
        ch.q(&format!("SELECT count(), sum(id) FROM {}", s.table))
            .trim(),
        format!("4000\t{}", 2 * (0..2000u64).sum::<u64>())
    );
}

/// `(partition id, rows, sum of ids)` of the active parts of `db`.`table`.
fn partitions_of(ch: &ClickHouse, db: &str, table: &str) -> Vec<String> {
    ch.q(&format!(
        "SELECT _partition_id, count(), sum(id) FROM `{db}`.`{table}` GROUP BY _partition_id ORDER BY _partition_id"
    ))
    .lines()
    .map(str::to_owned)
    .collect()
}

#[test]
fn datetime_partitions_are_computed_in_the_servers_zone_not_the_executors() {
    // `toYYYYMMDD(ts)` of a `DateTime` without a zone is a day in the server's zone: a part
    // built in another zone holds rows of another day under its partition id. The server runs
    // in New York, the executor in Tokyo; every row is within hours of some midnight.
    let ch = ClickHouse::start_in_zone("America/New_York");
    assert_eq!(ch.q("SELECT timezone()").trim(), "America/New_York");
    let db = TestDb::new(&ch, "build_tz");
    let d = &db.name;
    let ddl = "(ts DateTime, id UInt64) ENGINE = MergeTree PARTITION BY toYYYYMMDD(ts) ORDER BY id";
    ch.q(&format!("CREATE TABLE `{d}`.events {ddl}"));
    ch.q(&format!("CREATE TABLE `{d}`.twin {ddl}"));
    // Every 20 minutes for two days from 2026-03-01 00:00 UTC (19:00 the day before in New
    // York, 09:00 in Tokyo): every midnight of the three zones is crossed.
    let rows = "SELECT toDateTime64(1772323200 + number * 1200, 3, 'UTC') AS ts, number AS id FROM numbers(144)";
    ch.q(&format!(
        "INSERT INTO `{d}`.twin SELECT ts, id FROM ({rows})"
    ));
    let dir = tempfile::tempdir().unwrap();
    let config = local_config(dir.path(), &ch, &format!("{d}_ledger"));
    let input = write_rows(dir.path(), "rows.parquet", rows, "Parquet");

    let out = chpart()
        .args(["begin", "--config"])
        .arg(&config)
        .args([
            "--table",
            &format!("{d}.events"),
            "--load",
            "tz-1",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(exit_code(&out), Some(0), "{}", text(&out));
    let spec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(spec["server_timezone"], "America/New_York", "{spec}");
    assert_eq!(spec["server_version"], "26.9.2.1", "{spec}");
    assert_eq!(spec["clickhouse_local_version"], "26.9.2.1", "{spec}");

    let out = chpart()
        .args(["build", "--config"])
        .arg(&config)
        .args([
            "--load",
            "tz-1",
            "--attempt",
            "app-tz.1",
            "--partition",
            "0",
            "--input",
        ])
        .arg(&input)
        .env("TZ", "Asia/Tokyo")
        .output()
        .unwrap();
    let m = manifest_of(out).unwrap_or_else(|o| panic!("{}", text(&o)));
    let mut built: Vec<&str> = m.parts.iter().map(|p| p.partition_id.as_str()).collect();
    built.sort();
    let twin = partitions_of(&ch, d, "twin");
    let want: Vec<&str> = twin.iter().map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(built, want, "the parts' partition ids are the server's");

    let winners = dir.path().join("winners.jsonl");
    std::fs::write(&winners, m.to_json_line() + "\n").unwrap();
    let out = chpart()
        .args(["commit", "--config"])
        .arg(&config)
        .args(["--load", "tz-1", "--winners"])
        .arg(&winners)
        .output()
        .unwrap();
    assert_eq!(exit_code(&out), Some(0), "{}", text(&out));
    assert_eq!(partitions_of(&ch, d, "events"), twin);
    assert_eq!(
        ch.q(&format!(
            "SELECT count() FROM `{d}`.events WHERE toYYYYMMDD(ts) != toUInt32(_partition_id)"
        ))
        .trim(),
        "0",
        "every row sits in the partition of its own day"
    );
}

#[test]
fn a_clickhouse_local_newer_than_the_server_is_refused() {
    let ch = shared();
    let s = Setup::new(ch, "build_newer_local");
    assert_eq!(exit_code(&s.begin("bn-1", &[])), Some(0));
    let input = write_rows(s.dir.path(), "in.parquet", &rows_select(0, 10), "Parquet");
    // The real engine for everything but the version, which it reports as a newer one.
    let tz = ch.q("SELECT timezone()").trim().to_owned();
    let newer = local_reporting(
        s.dir.path(),
        "newer-clickhouse-local",
        "26.10.1.5",
        &tz,
        None,
    );
    let out = s
        .build_cmd("bn-1", "app-10.1", 0)
        .arg("--input")
        .arg(&input)
        .env("CHPART_CLICKHOUSE_LOCAL_COMMAND", &newer)
        .output()
        .unwrap();
    assert_eq!(exit_code(&out), Some(4), "{}", text(&out));
    let message = text(&out);
    assert!(
        message.contains("26.10.1.5")
            && message.contains("26.9.2.1")
            && message.contains("app-10.1")
            && message.contains(&format!("on host {}", crate::cli::hostname())),
        "both versions, the attempt and the executor's host named: {message}"
    );
    let shadow =
        chpart_protocol::begin::shadow_table(&s.table.parse().unwrap(), &"bn-1".parse().unwrap())
            .unwrap();
    assert!(s.detached(shadow.table.as_str()).is_empty());
    assert!(!ch.data_dir.join("chpart-staging/bn-1/app-10.1").exists());

    // An older one is fine.
    let older = local_reporting(
        s.dir.path(),
        "older-clickhouse-local",
        "25.8.3.1",
        &tz,
        None,
    );
    let out = s
        .build_cmd("bn-1", "app-10.2", 0)
        .arg("--input")
        .arg(&input)
        .env("CHPART_CLICKHOUSE_LOCAL_COMMAND", &older)
        .output()
        .unwrap();
    let m = manifest_of(out).unwrap_or_else(|o| panic!("{}", text(&o)));
    assert_eq!(m.clickhouse_local_version, "25.8.3.1");

    // One that computes in another zone than it was given (a config file's <timezone>).
    let elsewhere = local_reporting(
        s.dir.path(),
        "elsewhere-clickhouse-local",
        "26.9.2.1",
        "Asia/Tokyo",
        None,
    );
    let out = s
        .build_cmd("bn-1", "app-10.3", 0)
        .arg("--input")
        .arg(&input)
        .env("CHPART_CLICKHOUSE_LOCAL_COMMAND", &elsewhere)
        .output()
        .unwrap();
    assert_eq!(exit_code(&out), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("Asia/Tokyo") && text(&out).contains(&format!("TZ={tz}")),
        "{}",
        text(&out)
    );
    assert!(!ch.data_dir.join("chpart-staging/bn-1/app-10.3").exists());
}

/// An Arrow stream's build starts the engine once for a stream of one chunk: the engine's
/// version and zone are the first line the build's own session prints, checked as a Parquet
/// build's are (a newer engine refused, naming both versions; an older one recorded).
#[test]
fn an_arrow_stream_build_checks_the_engine_in_its_own_session() {
    let ch = shared();
    let s = Setup::new(ch, "build_stream_identity");
    assert_eq!(exit_code(&s.begin("bi-1", &[])), Some(0));
    let stream = arrow_stream_of(&s, 1_000);
    let tz = ch.q("SELECT timezone()").trim().to_owned();
    let runs = s.dir.path().join("runs");
    // The real engine, counting its runs, reporting `version` as its own.
    let engine =
        |name: &str, version: &str| local_reporting(s.dir.path(), name, version, &tz, Some(&runs));
    let build = |attempt: &str, command: &Path| -> (Output, usize) {
        let _ = std::fs::remove_file(&runs);
        let out = run_on_stdin(
            s.build_cmd("bi-1", attempt, 0)
                .args(["--input", "-"])
                .env("CHPART_CLICKHOUSE_LOCAL_COMMAND", command),
            &stream,
        );
        let runs = std::fs::read_to_string(&runs).unwrap_or_default();
        (out, runs.lines().count())
    };

    let (out, runs_newer) = build("app-11.1", &engine("newer-clickhouse-local", "26.10.1.5"));
    assert_eq!(exit_code(&out), Some(4), "{}", text(&out));
    let message = text(&out);
    assert!(
        message.contains("26.10.1.5")
            && message.contains("26.9.2.1")
            && message.contains("app-11.1"),
        "both versions and the attempt named: {message}"
    );
    assert_eq!(
        runs_newer, 1,
        "one engine run: the build's session printed the identity"
    );
    assert!(!ch.data_dir.join("chpart-staging/bi-1/app-11.1").exists());

    let (out, runs_older) = build("app-11.2", &engine("older-clickhouse-local", "25.8.3.1"));
    let m = manifest_of(out).unwrap_or_else(|o| panic!("{}", text(&o)));
    assert_eq!(
        (
            m.clickhouse_local_version.as_str(),
            m.source_rows,
            m.total_rows()
        ),
        ("25.8.3.1", 1_000, 1_000)
    );
    assert_eq!(runs_older, 1, "one engine run for a stream of one chunk");
}

#[test]
fn work_dirs_of_builds_killed_with_sigkill_are_removed_by_the_next_build() {
    let ch = shared();
    let s = Setup::new(ch, "build_killed_workdir");
    assert_eq!(
        exit_code(&s.begin("bk-1", &["--visibility", "part"])),
        Some(0)
    );
    let work = s.dir.path().join("work");
    let listing = || -> Vec<PathBuf> {
        std::fs::read_dir(&work)
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default()
    };
    // A build reading its Arrow stream from stdin, which never comes: it waits with its work
    // dir made, and is killed there as Spark kills a losing attempt's worker.
    let mut stuck = s
        .build_cmd("bk-1", "app-11.1", 0)
        .args(["--input", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        chpart_testenv::wait_until(std::time::Duration::from_secs(60), || listing().len() == 1),
        "the build made no work dir"
    );
    stuck.kill().unwrap(); // SIGKILL
    stuck.wait().unwrap();
    let left = listing();
    assert_eq!(left.len(), 1, "SIGKILL leaves the work dir: {left:?}");

    let input = write_rows(s.dir.path(), "in.parquet", &rows_select(0, 100), "Parquet");
    s.build_files("bk-1", "app-11.2", &[&input])
        .unwrap_or_else(|o| panic!("{}", text(&o)));
    assert!(
        !left[0].exists(),
        "{} survived the next build",
        left[0].display()
    );
    assert_eq!(listing(), Vec::<PathBuf>::new());
}
