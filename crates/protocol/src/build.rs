//! `build`: one task attempt's rows become verified parts in the publish table's `detached/`.
//!
//! ```text
//!  ledger spec ─► claim staging ─► check input schema
//!      ─► clickhouse-local (work dir of this process, the server's time zone; no newer than the server)
//!      ─► check parts ─► sha256 every file ─► upload to <staging>/<load>/<attempt>/parts/
//!      ─► publish-intent.json ─► fence: load still open? ─► owner check
//!      ─► rename each part into detached/<attempt-scoped name> ─► manifest.json (last)
//! ```
//!
//! Everything this attempt writes is under paths only it uses: its own local work dir, its own
//! staging dir, and part names derived from its attempt id. It never removes anything it did not
//! create, so a concurrent attempt of the same partition (a retry, a speculative copy, a zombie
//! of an old stage attempt) is never disturbed. On failure it removes what it published and its
//! staging; what it cannot remove (the connection is gone) is found by `gc` through the
//! publish intent. Fencing happens twice: before any work (a finished load builds nothing) and
//! right before publishing (a load committed meanwhile gets nothing new in `detached/`); a
//! writer that passes the second check just before a commit only leaves parts no manifest
//! names, which commit never attaches and gc removes.

use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chpart_build::{
    digest_part, inspect_parts, local_args, local_table_ddl, rewrite_query, runner::IDENTITY_QUERY,
    split_listings, ttl_due, BuildSession, BuiltPart, FileSource, LocalCommand, LocalIdentity,
    Rewrite, RunError, WorkDir,
};
use chpart_core::manifest::{FileEntry, Manifest, OtherDisk, PartEntry, Phases, Target};
use chpart_core::{
    detached_part_name, Attempt, AttemptId, AttemptStaging, Destination, DiskPlace, LoadId,
    PartName, RemotePath, StagingLayout,
};
use chpart_input::{
    ArrowStreamPump, ChType, ChunkSink, InputError, InputPlan, ParquetInput, StreamStats,
    TargetColumn,
};
use chpart_remote::{RemoteError, RemoteFs};
use serde::Serialize;

use crate::events::Step;
use crate::ledger::{LoadSpec, LoadState};
use crate::reach::Reach;
use crate::shards::{ClusterManifest, ClusterSpec, ShardSpec};
use crate::store::{now_unix_ms, LedgerStoreError};
use crate::FailureKind;

/// Database and table of the build inside clickhouse-local (private to the work dir).
const LOCAL_DATABASE: &str = "chpart_build";
const LOCAL_TABLE: &str = "t";

/// Where a load's spec and state come from (the ledger, in production).
pub trait LoadDirectory: Sync {
    /// The load's state and spec, read now (not cached: fencing depends on it).
    fn lookup(&self, load: &LoadId) -> Result<(LoadState, Option<LoadSpec>), LedgerStoreError>;

    /// Notes that `attempt` was fenced off `load` (best effort, for the load's timeline: a
    /// failure is only logged).
    fn record_fenced(&self, _load: &LoadId, _attempt: &Attempt, _started_at_unix_ms: u64) {}
}

/// The rows of this attempt.
pub enum Input {
    /// Parquet files, read by clickhouse-local itself (no spool, no re-encoding).
    Parquet(Vec<PathBuf>),
    /// An Arrow IPC stream (e.g. stdin), checked batch by batch into spool files of the work
    /// dir (bounded chunks: [`BuildEnv::spool_chunk_bytes`]), which clickhouse-local reads.
    ArrowStream(Box<dyn Read + Send>),
}

/// One `build` invocation.
pub struct BuildRequest {
    /// The load.
    pub load: LoadId,
    /// This attempt.
    pub attempt: Attempt,
    /// Its rows.
    pub input: Input,
    /// Merge each partition into one part before shipping (costs a merge; off by default).
    pub merge: bool,
}

/// What `build` works with.
pub struct BuildEnv<'a> {
    /// The ledger.
    pub loads: &'a dyn LoadDirectory,
    /// How to reach the host (or, for a load into a Distributed table, each shard's host)
    /// parts are published on.
    pub reach: &'a dyn Reach,
    /// Connections to each host that parts are uploaded over in parallel (at least one).
    pub connections: usize,
    /// clickhouse-local.
    pub local: &'a LocalCommand,
    /// Parent of this attempt's local work dir.
    pub work_parent: PathBuf,
    /// The configured staging root, for loads begun before chpart recorded theirs.
    pub staging: StagingLayout,
    /// An Arrow stream is spooled into the work dir in chunks of about this many bytes, each
    /// inserted by its own clickhouse-local session while the next is written
    /// ([`DEFAULT_SPOOL_CHUNK_BYTES`] unless configured).
    pub spool_chunk_bytes: u64,
}

/// The default of [`BuildEnv::spool_chunk_bytes`]: what one INSERT squashes into one block
/// ([`chpart_build::parts::ONE_BLOCK_BYTES`]), so chunking adds no part: an input below it is one
/// chunk, and a larger one was already one part per partition per block of this size.
pub const DEFAULT_SPOOL_CHUNK_BYTES: u64 = chpart_build::parts::ONE_BLOCK_BYTES;

/// Where the time went, for logs and benchmarks.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BuildTimings {
    /// Input checks and clickhouse-local.
    pub build_secs: f64,
    /// sha256 of every file.
    pub digest_secs: f64,
    /// Upload into staging.
    pub upload_secs: f64,
    /// Fence check, owner check, renames and manifest.
    pub publish_secs: f64,
    /// Bytes uploaded.
    pub bytes: u64,
    /// When the attempt started, Unix milliseconds.
    #[serde(skip)]
    pub started_unix_ms: u64,
}

/// A finished attempt.
#[derive(Debug)]
pub struct BuildReport {
    /// The manifests, as written to staging: one, or one per shard of a cluster load.
    pub manifests: Vec<Manifest>,
    /// What the attempt prints last, for its runner to hand to `commit`: the manifest, or the
    /// cluster manifest (every shard's) of a cluster load.
    pub line: String,
    /// Timings (for a cluster load: the slowest shard's phases, the bytes of all).
    pub timings: BuildTimings,
}

/// Why an attempt failed. Each names the load and attempt (via the CLI's context) and the file,
/// column, part or path at fault.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The load is committed or aborted.
    #[error("load {load} is {state}: this attempt is fenced off and published nothing")]
    Fenced {
        /// The load.
        load: LoadId,
        /// Its state.
        state: &'static str,
    },
    /// The load was never begun.
    #[error("load {load} was never begun: run `chpart begin` on the driver before the job")]
    NotBegun {
        /// The load.
        load: LoadId,
    },
    /// The load's table cannot be built for.
    #[error("load {load}: {message}")]
    Unsupported {
        /// The load.
        load: LoadId,
        /// Why.
        message: String,
    },
    /// Bad input: unreadable, corrupt, or not matching the table.
    #[error(transparent)]
    Input(#[from] InputError),
    /// clickhouse-local failed.
    #[error("building parts with clickhouse-local: {0}")]
    Run(#[from] RunError),
    /// Anything else in the local build (DDL, part checks, digests, work dir).
    #[error("building parts: {0}")]
    Build(String),
    /// The built rows do not add up.
    #[error("clickhouse-local built {part_rows} rows from {source_rows} input rows into a {engine} table{}: rows were lost or duplicated", stage.map(|s| format!(" ({s})")).unwrap_or_default())]
    RowMismatch {
        /// Rows read (for a rewrite: rows before it).
        source_rows: u64,
        /// Rows in the parts.
        part_rows: u64,
        /// The table engine.
        engine: String,
        /// The rewrite after which they do not add up, if any.
        stage: Option<&'static str>,
    },
    /// The server's filesystem failed.
    #[error("{op}: {source}")]
    Remote {
        /// What was being done.
        op: String,
        /// The transport's error.
        source: Box<RemoteError>,
    },
    /// This clickhouse-local may not build for the load's server (newer than it).
    #[error(transparent)]
    Version(#[from] chpart_core::VersionError),
    /// clickhouse-local computes in another zone than the server's, although it was given it.
    #[error("{program} runs in time zone {actual} although it was started with TZ={expected} (the server's zone, recorded when the load began): partition ids of DateTime columns would not be the server's; does a clickhouse-local config file set <timezone>?")]
    TimeZone {
        /// The clickhouse-local program.
        program: String,
        /// The server's zone.
        expected: String,
        /// The zone clickhouse-local reported.
        actual: String,
    },
    /// A shard of a cluster load failed; what the attempt published on every shard is undone.
    #[error("shard {shard_num} ({host}): {source}")]
    Shard {
        /// The shard's number.
        shard_num: u32,
        /// Its host.
        host: String,
        /// What went wrong there.
        source: Box<BuildError>,
    },
    /// Another build holds this attempt's staging directory: the attempt id was used twice.
    #[error("attempt {attempt} of load {load} already has a staging directory {path}: another build with this attempt id ran or is running, and attempt ids must never repeat; this build published nothing and left that directory alone")]
    AttemptTaken {
        /// The load.
        load: LoadId,
        /// The repeated attempt id.
        attempt: AttemptId,
        /// Its staging directory.
        path: RemotePath,
    },
    /// Published parts would not be owned by the server's user.
    #[error("published part {path} would be owned by uid {owner}, but {detached} belongs to uid {server_uid} (the ClickHouse server's user), which could not attach it: log in over SSH as the server's user (ssh.user in the config), or run the local transport as that user")]
    Ownership {
        /// The staged part.
        path: String,
        /// Its owner.
        owner: u32,
        /// detached/.
        detached: String,
        /// detached/'s owner.
        server_uid: u32,
    },
    /// The ledger failed.
    #[error(transparent)]
    Ledger(#[from] LedgerStoreError),
}

impl BuildError {
    /// What the failure means for the caller.
    pub fn kind(&self) -> FailureKind {
        match self {
            BuildError::Fenced { .. } => FailureKind::Fenced,
            BuildError::Shard { source, .. } => source.kind(),
            BuildError::Ledger(e) => e.kind(),
            BuildError::Remote { source, .. } if source.is_transient() => FailureKind::Retryable,
            BuildError::Run(RunError::NotFound { .. }) => FailureKind::Usage,
            BuildError::Run(RunError::TimedOut { .. }) => FailureKind::Retryable,
            BuildError::Run(RunError::Failed { stderr_tail, .. })
                if run_failure_is_transient(stderr_tail) =>
            {
                FailureKind::Retryable
            }
            _ => FailureKind::Permanent,
        }
    }
}

/// clickhouse-local failures that another try may not hit: out of disk space or memory.
fn run_failure_is_transient(stderr: &str) -> bool {
    chpart_server::parse_exception(stderr).is_some_and(|(code, _, _)| {
        use chpart_server::code::{MEMORY_LIMIT_EXCEEDED, NOT_ENOUGH_SPACE, SYSTEM_ERROR};
        matches!(
            code,
            MEMORY_LIMIT_EXCEEDED | NOT_ENOUGH_SPACE | SYSTEM_ERROR
        )
    })
}

fn remote(op: impl Into<String>) -> impl FnOnce(RemoteError) -> BuildError {
    let op = op.into();
    move |source| BuildError::Remote {
        op,
        source: Box::new(source),
    }
}

fn build_err(e: impl std::fmt::Display) -> BuildError {
    BuildError::Build(e.to_string())
}

/// The spec of an open load, or why there is none.
fn open_spec(loads: &dyn LoadDirectory, load: &LoadId) -> Result<LoadSpec, BuildError> {
    match loads.lookup(load)? {
        (LoadState::Open, Some(spec)) => Ok(spec),
        (LoadState::Unknown, _) | (LoadState::Open, None) => {
            Err(BuildError::NotBegun { load: load.clone() })
        }
        (state, _) => Err(BuildError::Fenced {
            load: load.clone(),
            state: state.as_str(),
        }),
    }
}

fn target_columns(spec: &LoadSpec) -> Result<Vec<TargetColumn>, BuildError> {
    spec.publish_snapshot
        .shape
        .columns
        .iter()
        .map(|c| {
            let ch_type: ChType = c.type_name.parse().map_err(|e| BuildError::Unsupported {
                load: spec.load.clone(),
                message: format!("column {} of {}: {e}", c.name, spec.target),
            })?;
            Ok(TargetColumn {
                name: c.name.clone(),
                ch_type,
                default_kind: c.default_kind.clone(),
            })
        })
        .collect()
}

/// The parts clickhouse-local built, the input rows it read, and what it said it is.
struct Built {
    parts: Vec<BuiltPart>,
    source_rows: u64,
    /// Input rows the table's TTL rules removed (expired, or folded by `TTL ... GROUP BY`):
    /// `source_rows` = rows of `parts` + this.
    ttl_removed_rows: u64,
    identity: LocalIdentity,
}

/// clickhouse-local as the load's server would compute: in the server's time zone.
fn local_for(env: &BuildEnv<'_>, spec: &LoadSpec) -> LocalCommand {
    match &spec.server_timezone {
        Some(tz) => env.local.clone().in_timezone(tz.clone()),
        None => {
            tracing::warn!(
                "load {} began before chpart recorded the server's time zone: building in this host's",
                spec.load
            );
            env.local.clone()
        }
    }
}

/// Refuses a clickhouse-local the load's server may not read parts of, or one that computes
/// in another zone than the server's.
fn check_local(
    local: &LocalCommand,
    spec: &LoadSpec,
    id: &LocalIdentity,
) -> Result<(), BuildError> {
    chpart_core::check_local_not_newer(&id.version, &spec.server_version)?;
    match &spec.server_timezone {
        Some(tz) if *tz != id.timezone => Err(BuildError::TimeZone {
            program: local.program.display().to_string(),
            expected: tz.clone(),
            actual: id.timezone.clone(),
        }),
        _ => Ok(()),
    }
}

/// Builds from an Arrow stream spooled into `dir` in chunks of about `chunk_bytes` (each a
/// complete Arrow stream, checked batch by batch on its way in): one clickhouse-local session
/// per chunk on the build's data dir `data`, the first creating the tables, each inserting its
/// chunk, while the pump writes the next. A chunk is removed once inserted and the pump waits
/// for the session to take the next, so the work dir holds at most two chunks (the one being
/// inserted and the one being written), whatever the stream's size. A chunk is inserted only
/// once it is complete; the last only once the stream ended cleanly; a stream that breaks
/// fails the build before anything leaves this host (parts are uploaded only after every chunk
/// was built). Returns the last session's output (the listing of every part) and what was
/// pumped.
fn run_spooled(
    local: &LocalCommand,
    data: &std::path::Path,
    dir: &std::path::Path,
    session: &BuildSession,
    pump: ArrowStreamPump<Box<dyn Read + Send>>,
    structure: &str,
    chunk_bytes: u64,
) -> Result<(Vec<u8>, StreamStats), BuildError> {
    let (chunks, done) = std::sync::mpsc::sync_channel::<PathBuf>(0);
    let mut sink = SpoolSink {
        dir: dir.to_path_buf(),
        chunks,
        current: None,
    };
    let pumper = std::thread::spawn(move || pump.pump_chunked(chunk_bytes, &mut sink));
    let mut output = None;
    for (i, chunk) in done.iter().enumerate() {
        let file: FileSource = (
            chunk.clone(),
            "ArrowStream".to_owned(),
            structure.to_owned(),
        );
        let run = session
            .query(i == 0, vec![file])
            .map_err(build_err)
            .and_then(|query| Ok(local.run(&local_args(data, &query))?));
        let _ = std::fs::remove_file(&chunk);
        // On failure the pump is left to stop at its next chunk (its hand-over fails) or with
        // its input: it may be waiting for the producer, which this build no longer reads.
        output = Some(run?);
    }
    let stats = pumper
        .join()
        .map_err(|_| BuildError::Build("the input pump panicked".into()))??;
    let output = output
        .ok_or_else(|| BuildError::Build("the Arrow stream was pumped into no chunk".into()))?;
    tracing::debug!(
        "built from {} spooled chunk(s) of at most about {} MiB",
        stats.chunks,
        chunk_bytes >> 20
    );
    Ok((output, stats))
}

/// [`run_spooled`]'s chunk files: `<dir>/input-<n>.arrows`, each handed to the building session
/// when complete.
struct SpoolSink {
    dir: PathBuf,
    chunks: std::sync::mpsc::SyncSender<PathBuf>,
    current: Option<PathBuf>,
}

impl ChunkSink for SpoolSink {
    type Output = std::io::BufWriter<std::fs::File>;

    fn open(&mut self, number: u64) -> Result<(Self::Output, String), InputError> {
        let path = self.dir.join(format!("input-{number:04}.arrows"));
        let file = std::fs::File::create(&path).map_err(|error| InputError::Io {
            path: path.clone(),
            error,
        })?;
        let name = path.display().to_string();
        self.current = Some(path);
        Ok((std::io::BufWriter::with_capacity(1 << 20, file), name))
    }

    fn done(&mut self, _number: u64) -> Result<(), InputError> {
        let path = self.current.take().expect("a chunk is open");
        self.chunks.send(path.clone()).map_err(|_| InputError::Io {
            path,
            error: std::io::Error::other("the build stopped taking chunks (it failed)"),
        })
    }
}

/// Builds the attempt's parts: into the one local table, or with `routed` = (tables with
/// their route values, route expression) into one table per shard, each row into the table
/// whose value its route gives. Returns one [`Built`] per table, in order.
fn run_clickhouse_local(
    env: &BuildEnv<'_>,
    spec: &LoadSpec,
    work: &WorkDir,
    input: Input,
    merge: bool,
    routed: Option<(&[(String, u32)], &str)>,
) -> Result<Vec<Built>, BuildError> {
    let local = local_for(env, spec);
    let target = target_columns(spec)?;
    let ddl_of = |table: &str| {
        local_table_ddl(
            &spec.publish_snapshot.create_table_query,
            LOCAL_DATABASE,
            table,
        )
        .map_err(build_err)
    };
    let data = work.path().join("clickhouse");

    let session_for = |plan: &InputPlan| -> Result<BuildSession, BuildError> {
        match routed {
            None => Ok(BuildSession::single(
                &ddl_of(LOCAL_TABLE)?,
                LOCAL_DATABASE,
                LOCAL_TABLE,
                &plan.insert_columns,
            )),
            Some((tables, route)) => {
                let ddls = tables
                    .iter()
                    .map(|(t, key)| Ok((t.clone(), ddl_of(t)?, *key)))
                    .collect::<Result<Vec<_>, BuildError>>()?;
                BuildSession::routed(&ddls, LOCAL_DATABASE, route, &plan.insert_columns)
                    .map_err(build_err)
            }
        }
    };
    // The engine's version and time zone (checked before anything leaves this host) are the
    // first line the build's own session prints: no process start-up of their own.
    let (output, rows, identity) = match input {
        Input::Parquet(paths) => {
            let (files, plan, rows) = parquet_sources(&paths, &target)?;
            let query = session_for(&plan)?.query(true, files).map_err(build_err)?;
            let query = format!("{IDENTITY_QUERY};\n{query}");
            let output = local.run(&local_args(&data, &query))?;
            let split = output.iter().position(|b| *b == b'\n');
            let (first, listing) = output.split_at(split.map_or(output.len(), |at| at + 1));
            let identity = local.identity_of(&String::from_utf8_lossy(first))?;
            (listing.to_vec(), rows, identity)
        }
        Input::ArrowStream(reader) => {
            // Chunked sessions: the identity query runs beside them (one process start-up,
            // not a serial one).
            let identify_cmd = local.clone();
            let identity = std::thread::spawn(move || identify_cmd.identify());
            // The stream is checked batch by batch on its way into files of this attempt's
            // work dir, and clickhouse-local reads those. It cannot read the stream from a
            // pipe: the 26.9 engine's ArrowStream reader seeks in its input, which fails on a
            // pipe for multi-batch streams ("Cannot seek through file (fd = 0)"). The spool is
            // the same binary Arrow stream (no re-encoding, no text), read once by the engine.
            let pump = ArrowStreamPump::start(reader, &target, "stdin")?;
            let session = session_for(pump.plan())?;
            let structure = pump.plan().structure.clone();
            let (output, stats) = run_spooled(
                &local,
                &data,
                work.path(),
                &session,
                pump,
                &structure,
                env.spool_chunk_bytes,
            )?;
            let identity = identity
                .join()
                .map_err(|_| BuildError::Build("the version query panicked".into()))??;
            (output, stats.rows, identity)
        }
    };
    let (tables, inserted): (Vec<String>, Vec<Vec<BuiltPart>>) = match routed {
        None => (vec![LOCAL_TABLE.to_owned()], vec![inspect(&output, None)?]),
        Some((tables, _)) => {
            let listings = split_listings(&String::from_utf8_lossy(&output));
            let inserted = tables
                .iter()
                .map(|(t, _)| {
                    let listing = listings.get(t).ok_or_else(|| {
                        BuildError::Build(format!("clickhouse-local listed no parts of table {t}"))
                    })?;
                    inspect_parts(listing, None).map_err(build_err)
                })
                .collect::<Result<Vec<_>, BuildError>>()?;
            (tables.iter().map(|(t, _)| t.clone()).collect(), inserted)
        }
    };
    check_local(&local, spec, &identity)?;
    let engine = &spec.publish_snapshot.shape.engine;
    // Every engine: the inserts fold nothing (optimize_on_insert = 0), so the parts hold exactly
    // the input's rows (all tables together, when routed).
    check_rows(rows, &inserted.concat(), engine)?;

    // A rewrite, if any, runs in a second session on the same data directory (and in the same
    // time zone). After it the rows may only have become fewer, and only by TTL: a merge of a
    // plain MergeTree and the TTL mutation fold no rows (merges of the other engines do, and are
    // refused in `build`).
    let now = now_unix_ms() / 1000;
    let mut out = Vec::new();
    for (table, inserted) in tables.iter().zip(inserted) {
        let ttl_expired = inserted
            .iter()
            .map(|p| ttl_due(p, now))
            .collect::<Result<Vec<bool>, _>>()
            .map_err(build_err)?
            .contains(&true);
        let rewrite = if merge {
            Some(Rewrite::Merge)
        } else if ttl_expired {
            Some(Rewrite::ApplyTtl)
        } else {
            None
        };
        let table_rows = rows_of(&inserted);
        let parts = match rewrite {
            None => inserted,
            Some(rewrite) => {
                let query = rewrite_query(LOCAL_DATABASE, table, rewrite);
                let output = local.run(&local_args(&data, &query))?;
                let mut parts = inspect(&output, Some(rewrite))?;
                if rows_of(&parts) > table_rows {
                    return Err(BuildError::RowMismatch {
                        source_rows: table_rows,
                        part_rows: rows_of(&parts),
                        engine: engine.clone(),
                        stage: Some(match rewrite {
                            Rewrite::Merge => "after OPTIMIZE FINAL",
                            Rewrite::ApplyTtl => "after MATERIALIZE TTL",
                        }),
                    });
                }
                // A part whose rows all expired has nothing to attach.
                parts.retain(|p| p.rows > 0);
                parts
            }
        };
        out.push(Built {
            ttl_removed_rows: table_rows - rows_of(&parts),
            parts,
            source_rows: table_rows,
            identity: identity.clone(),
        });
    }
    Ok(out)
}

fn rows_of(parts: &[BuiltPart]) -> u64 {
    parts.iter().map(|p| p.rows).sum()
}

fn inspect(output: &[u8], rewrite: Option<Rewrite>) -> Result<Vec<BuiltPart>, BuildError> {
    inspect_parts(&String::from_utf8_lossy(output), rewrite).map_err(build_err)
}

/// The parts hold exactly `expected` rows.
fn check_rows(expected: u64, parts: &[BuiltPart], engine: &str) -> Result<(), BuildError> {
    let part_rows = rows_of(parts);
    if part_rows != expected {
        return Err(BuildError::RowMismatch {
            source_rows: expected,
            part_rows,
            engine: engine.to_owned(),
            stage: None,
        });
    }
    Ok(())
}

/// Checks every Parquet file (footer, schema, nulls) and returns the `file()` sources, the
/// first file's plan (all must insert the same columns) and the total row count.
fn parquet_sources(
    paths: &[PathBuf],
    target: &[TargetColumn],
) -> Result<(Vec<FileSource>, InputPlan, u64), BuildError> {
    let mut files = Vec::new();
    let mut plan: Option<InputPlan> = None;
    let mut rows = 0;
    for path in paths {
        let path = std::path::absolute(path).map_err(|e| InputError::Io {
            path: path.clone(),
            error: e,
        })?;
        let file = ParquetInput::open(&path)?;
        let file_plan = file.check_schema(target).map_err(InputError::from)?;
        file.check_nulls(&file_plan)?;
        rows += file.num_rows();
        if let Some(first) = &plan {
            if first.insert_columns != file_plan.insert_columns {
                return Err(BuildError::Build(format!(
                    "input files {} and {} have different columns ({} vs {})",
                    first.source,
                    file_plan.source,
                    first.insert_columns.join(", "),
                    file_plan.insert_columns.join(", ")
                )));
            }
        }
        files.push((path, "Parquet".to_owned(), file_plan.structure.clone()));
        plan.get_or_insert(file_plan);
    }
    let plan = plan.ok_or_else(|| BuildError::Build("no input files given".into()))?;
    Ok((files, plan, rows))
}

/// Runs one attempt. On success the manifest is in staging and returned; print it last.
///
/// The attempt's staging directory is claimed first, exclusively: a build whose attempt id is
/// already in use is refused before any work, and every later failure removes only what this
/// build created (its staging directory and the parts it renamed into `detached/`).
pub fn build(env: &BuildEnv<'_>, req: BuildRequest) -> Result<BuildReport, BuildError> {
    let step = Step::start(&req.load, "build").attempt(&req.attempt.id);
    let (started_at, attempt) = (now_unix_ms(), req.attempt.clone());
    match build_attempt(env, req) {
        Err(BuildError::Fenced { load, state }) => {
            env.loads.record_fenced(&load, &attempt, started_at);
            step.end(Err(BuildError::Fenced { load, state }))
        }
        Ok(report) => {
            let m = &report.manifests;
            step.counts(
                m.iter().map(Manifest::total_rows).sum(),
                report.timings.bytes,
                m.iter().map(|m| m.parts.len() as u64).sum(),
                1,
            )
            .ok();
            Ok(report)
        }
        Err(e) => step.end(Err(e)),
    }
}

fn build_attempt(env: &BuildEnv<'_>, req: BuildRequest) -> Result<BuildReport, BuildError> {
    let started = Instant::now();
    let spec = open_spec(env.loads, &req.load)?;
    if let Some(of) = &spec.shard_of {
        return Err(BuildError::Unsupported {
            load: req.load.clone(),
            message: format!(
                "it is shard {} of the load {} into a Distributed table: build for {}, which routes the rows to every shard",
                of.shard_num, of.parent, of.parent
            ),
        });
    }
    let engine = &spec.publish_snapshot.shape.engine;
    if req.merge && engine != "MergeTree" {
        // OPTIMIZE FINAL folds rows in these engines (replaced versions, sums, collapsed
        // pairs), so the parts' rows could no longer be checked against the input's: a lost
        // row and a folded one would look the same. The table folds them itself after the load.
        return Err(BuildError::Unsupported {
            load: req.load.clone(),
            message: format!(
                "--merge is refused for {} ({engine}): merging folds rows, so the built rows could no longer be checked against the input rows; build without --merge (the table's engine merges the parts after the load)",
                spec.target
            ),
        });
    }
    if let Some(cluster) = &spec.cluster {
        return build_cluster(env, &spec, cluster, req, started);
    }
    let destination = destination_of(env, &spec)?;
    let connections = connect(env, &spec.host)?;
    let mut publisher = Publisher::claim(
        connections[0].as_ref(),
        &destination,
        &req.load,
        &req.attempt.id,
    )?;
    let result = build_claimed(env, &spec, req, &mut publisher, &connections, started);
    if result.is_err() {
        publisher.undo();
    }
    result
}

fn destination_of(env: &BuildEnv<'_>, spec: &LoadSpec) -> Result<Destination, BuildError> {
    spec.destination(&env.staging)
        .map_err(|e| BuildError::Unsupported {
            load: spec.load.clone(),
            message: format!("publish table data path: {e}"),
        })
}

/// `env.connections` connections to `host`'s filesystem.
fn connect(env: &BuildEnv<'_>, host: &str) -> Result<Vec<Arc<dyn RemoteFs>>, BuildError> {
    env.reach
        .connect(host, env.connections.max(1))
        .map_err(remote(format!("connect to the filesystem of {host}")))
}

fn uploaders(connections: &[Arc<dyn RemoteFs>]) -> Vec<&dyn RemoteFs> {
    connections.iter().map(|c| c.as_ref()).collect()
}

/// The attempt's private local work directory (after removing those of builds that are gone).
fn work_dir(env: &BuildEnv<'_>, req: &BuildRequest) -> Result<WorkDir, BuildError> {
    std::fs::create_dir_all(&env.work_parent).map_err(|e| {
        BuildError::Build(format!(
            "cannot create the work dir parent {}: {e}",
            env.work_parent.display()
        ))
    })?;
    // Builds killed with SIGKILL could not remove theirs.
    WorkDir::sweep_stale(&env.work_parent);
    WorkDir::create(&env.work_parent, req.load.as_str(), req.attempt.id.as_str()).map_err(build_err)
}

/// [`build`] once the attempt's staging directory is this process's.
fn build_claimed(
    env: &BuildEnv<'_>,
    spec: &LoadSpec,
    req: BuildRequest,
    publisher: &mut Publisher<'_>,
    connections: &[Arc<dyn RemoteFs>],
    started: Instant,
) -> Result<BuildReport, BuildError> {
    let work = work_dir(env, &req)?;
    let step = Step::start(&req.load, "build.read").attempt(&req.attempt.id);
    let built = step_built(
        step,
        run_clickhouse_local(env, spec, &work, req.input, req.merge, None),
    )?
    .pop()
    .expect("one table built");
    log_built(&built, started);
    let mut timings = BuildTimings {
        build_secs: started.elapsed().as_secs_f64(),
        started_unix_ms: unix_ms_at(started),
        ..Default::default()
    };
    let manifest = publish_built(
        env,
        spec,
        publisher,
        &uploaders(connections),
        &req.attempt,
        built,
        &mut timings,
    )?;
    // The attempt is complete and published: a local leftover must not fail it (a later build
    // sweeps work dirs whose process is gone).
    if let Err(e) = work.close() {
        tracing::warn!("{e}");
    }
    Ok(BuildReport {
        line: manifest.to_json_line(),
        manifests: vec![manifest],
        timings,
    })
}

/// The Unix time in milliseconds at `instant` (a moment already past).
fn unix_ms_at(instant: Instant) -> u64 {
    now_unix_ms().saturating_sub(instant.elapsed().as_millis() as u64)
}

/// Ends the `build.read` step with what clickhouse-local built.
fn step_built(step: Step, built: Result<Vec<Built>, BuildError>) -> Result<Vec<Built>, BuildError> {
    match built {
        Ok(built) => {
            let parts = built.iter().map(|b| b.parts.len() as u64).sum();
            let rows = built.iter().map(|b| rows_of(&b.parts)).sum();
            step.counts(rows, 0, parts, 0).ok();
            Ok(built)
        }
        Err(e) => step.end(Err(e)),
    }
}

fn log_built(built: &Built, started: Instant) {
    tracing::info!(
        "built {} part(s), {} rows from {} input rows ({} removed by the table's TTL) in {:.2}s",
        built.parts.len(),
        rows_of(&built.parts),
        built.source_rows,
        built.ttl_removed_rows,
        started.elapsed().as_secs_f64()
    );
}

/// Ships the parts of `built` to the load's disks through `uploaders`, publishes them into
/// `detached/` and writes the manifest (for `spec.load`, which is a shard's sub-load in a
/// cluster build).
fn publish_built(
    env: &BuildEnv<'_>,
    spec: &LoadSpec,
    publisher: &mut Publisher<'_>,
    uploaders: &[&dyn RemoteFs],
    attempt: &Attempt,
    built: Built,
    timings: &mut BuildTimings,
) -> Result<Manifest, BuildError> {
    let load = &spec.load;
    let names = built
        .parts
        .iter()
        .enumerate()
        .map(|(seq, part)| {
            let seq = u32::try_from(seq).map_err(build_err)?;
            Ok(detached_part_name(
                load,
                &attempt.id,
                &part.partition_id,
                seq,
            ))
        })
        .collect::<Result<Vec<PartName>, BuildError>>()?;
    // Each part goes to a disk of the load's destination, staged on that disk's filesystem.
    let disks: Vec<usize> = (0u32..)
        .zip(&names)
        .map(|(seq, _)| publisher.disk_for(load, &attempt.id, seq))
        .collect();
    for &disk in &disks {
        publisher.claim_disk(disk)?;
    }
    let staged: Vec<RemotePath> = names
        .iter()
        .zip(&disks)
        .map(|(name, &disk)| publisher.stagings[disk].staging.part_dir(name))
        .collect();
    let who = Who {
        load,
        attempt: &attempt.id,
        shard: spec.shard_of.as_ref().map(|of| of.shard_num),
    };
    let shipped = ship_parts(&who, uploaders, &built.parts, &names, &staged, timings)?;
    let uploaded_at_unix_ms = now_unix_ms();
    let entries: Vec<PartEntry> = (0u32..)
        .zip(built.parts.iter().zip(names).zip(shipped))
        .zip(&disks)
        .map(|((seq, ((part, name), files)), &disk)| PartEntry {
            bytes_on_disk: files.iter().map(|f| f.size).sum(),
            name,
            partition_id: part.partition_id.clone(),
            seq,
            rows: part.rows,
            hash_of_all_files: part.hash_of_all_files.clone(),
            files,
            disk: (disk != 0).then(|| publisher.stagings[disk].place.disk.clone()),
        })
        .collect();

    let home = &publisher.stagings[0];
    let manifest = Manifest {
        load: load.clone(),
        attempt: attempt.clone(),
        target: Target {
            database: spec.publish.database.clone(),
            table: spec.publish.table.clone(),
            host: spec.host.clone(),
            disk: home.place.disk.clone(),
            data_path: home.place.data_path.clone(),
            staging_dir: home.staging.dir().clone(),
            other_disks: publisher.stagings[1..]
                .iter()
                .filter(|s| s.claimed)
                .map(|s| OtherDisk {
                    disk: s.place.disk.clone(),
                    data_path: s.place.data_path.clone(),
                    staging_dir: s.staging.dir().clone(),
                })
                .collect(),
        },
        table_fingerprint: spec.publish_snapshot.fingerprint.clone(),
        clickhouse_local_version: built.identity.version.clone(),
        source_rows: built.source_rows,
        ttl_removed_rows: built.ttl_removed_rows,
        created_at_unix_ms: now_unix_ms(),
        phases: Phases {
            started_at_unix_ms: timings.started_unix_ms,
            built_at_unix_ms: timings.started_unix_ms + (timings.build_secs * 1e3) as u64,
            uploaded_at_unix_ms,
        },
        parts: entries,
    };
    manifest.validate().map_err(build_err)?;
    let step =
        who.step("build.publish")
            .counts(manifest.total_rows(), 0, manifest.parts.len() as u64, 0);
    step.end(publisher.publish(env, spec, &manifest, timings))?;
    timings.bytes = manifest.parts.iter().map(|p| p.bytes_on_disk).sum();
    Ok(manifest)
}

/// [`build`] of a load into a Distributed table: the rows routed to the shards inside one
/// clickhouse-local session, then each shard's parts shipped and published on its host, in
/// parallel; one manifest per shard's sub-load, printed together as the cluster manifest.
/// Every shard's staging is claimed before any work, and a failure on any shard undoes what
/// this attempt published on every shard.
fn build_cluster(
    env: &BuildEnv<'_>,
    spec: &LoadSpec,
    cluster: &ClusterSpec,
    req: BuildRequest,
    started: Instant,
) -> Result<BuildReport, BuildError> {
    let on_shard = |shard: &ShardSpec, e: BuildError| BuildError::Shard {
        shard_num: shard.shard_num,
        host: shard.host.clone(),
        source: Box::new(e),
    };
    if req.merge {
        return Err(BuildError::Unsupported {
            load: req.load.clone(),
            message: "--merge is not supported for Distributed tables yet".into(),
        });
    }
    let route = cluster
        .routing()
        .slot_sql()
        .map_err(|e| BuildError::Unsupported {
            load: req.load.clone(),
            message: e.to_string(),
        })?;
    let mut subs = Vec::new();
    for shard in &cluster.shards {
        let sub = open_spec(env.loads, &shard.load).map_err(|e| on_shard(shard, e))?;
        let destination = destination_of(env, &sub).map_err(|e| on_shard(shard, e))?;
        let connections = connect(env, &shard.host).map_err(|e| on_shard(shard, e))?;
        subs.push((shard, sub, destination, connections));
    }
    let mut publishers = Vec::new();
    for (shard, sub, destination, connections) in &subs {
        match Publisher::claim(
            connections[0].as_ref(),
            destination,
            &sub.load,
            &req.attempt.id,
        ) {
            Ok(p) => publishers.push(p),
            Err(e) => {
                publishers.iter_mut().for_each(Publisher::undo);
                return Err(on_shard(shard, e));
            }
        }
    }
    let result = (|| {
        let work = work_dir(env, &req)?;
        let tables: Vec<(String, u32)> = cluster
            .shards
            .iter()
            .map(|s| (format!("{LOCAL_TABLE}_{}", s.shard_num), s.shard_num))
            .collect();
        let reference = &subs[0].1;
        let step = Step::start(&req.load, "build.read").attempt(&req.attempt.id);
        let built = step_built(
            step,
            run_clickhouse_local(
                env,
                reference,
                &work,
                req.input,
                false,
                Some((&tables, &route)),
            ),
        )?;
        for (_, sub, _, _) in &subs {
            check_local(&local_for(env, sub), sub, &built[0].identity)?;
        }
        tracing::info!(
            "routed {} rows to {} shard(s) in {:.2}s: {}",
            built.iter().map(|b| b.source_rows).sum::<u64>(),
            built.len(),
            started.elapsed().as_secs_f64(),
            tables
                .iter()
                .zip(&built)
                .map(|((_, n), b)| format!(
                    "shard {n}: {} rows in {} part(s)",
                    rows_of(&b.parts),
                    b.parts.len()
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let build_secs = started.elapsed().as_secs_f64();
        let results: Vec<Result<(Manifest, BuildTimings), BuildError>> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = publishers
                    .iter_mut()
                    .zip(built)
                    .zip(&subs)
                    .map(|((publisher, built), (shard, sub, _, connections))| {
                        let attempt = &req.attempt;
                        scope.spawn(move || {
                            let mut timings = BuildTimings {
                                build_secs,
                                started_unix_ms: unix_ms_at(started),
                                ..Default::default()
                            };
                            publish_built(
                                env,
                                sub,
                                publisher,
                                &uploaders(connections),
                                attempt,
                                built,
                                &mut timings,
                            )
                            .map(|m| (m, timings))
                            .map_err(|e| on_shard(shard, e))
                        })
                    })
                    .collect();
                handles.into_iter().map(join).collect()
            });
        let mut manifests = Vec::new();
        let mut timings = BuildTimings {
            build_secs,
            ..Default::default()
        };
        for result in results {
            let (manifest, t) = result?;
            timings.digest_secs = timings.digest_secs.max(t.digest_secs);
            timings.upload_secs = timings.upload_secs.max(t.upload_secs);
            timings.publish_secs = timings.publish_secs.max(t.publish_secs);
            timings.bytes += t.bytes;
            manifests.push(manifest);
        }
        if let Err(e) = work.close() {
            tracing::warn!("{e}");
        }
        let line = ClusterManifest {
            load: spec.load.clone(),
            attempt: req.attempt.clone(),
            shards: cluster
                .shards
                .iter()
                .map(|s| s.shard_num)
                .zip(manifests.iter().cloned())
                .collect(),
        }
        .to_json_line();
        Ok(BuildReport {
            manifests,
            line,
            timings,
        })
    })();
    if result.is_err() {
        publishers.iter_mut().for_each(Publisher::undo);
    }
    result
}

/// Whose steps a build reports: the (sub-)load, the attempt, the shard.
struct Who<'a> {
    load: &'a LoadId,
    attempt: &'a AttemptId,
    shard: Option<u32>,
}

impl Who<'_> {
    fn step(&self, step: &'static str) -> Step {
        Step::start(self.load, step)
            .attempt(self.attempt)
            .shard(self.shard)
    }
}

/// Digests every part and uploads it into staging, as a pipeline: a part goes to the uploaders
/// (one thread per connection) as soon as its files are digested, so hashing overlaps the
/// transfer, and a backend that moves instead of copying (the local one) never takes a part
/// before it was digested. Part `i` goes to `staged[i]`. Returns each part's files, in order.
fn ship_parts(
    who: &Who<'_>,
    uploaders: &[&dyn RemoteFs],
    parts: &[BuiltPart],
    names: &[PartName],
    staged: &[RemotePath],
    timings: &mut BuildTimings,
) -> Result<Vec<Vec<FileEntry>>, BuildError> {
    let t = Instant::now();
    let failed = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let rx = Mutex::new(rx);
    let (digested, uploads) = std::thread::scope(|scope| {
        let digester = scope.spawn(|| {
            let t = Instant::now();
            let mut out = Vec::with_capacity(parts.len());
            for (i, part) in parts.iter().enumerate() {
                if failed.load(Ordering::Relaxed) {
                    break;
                }
                out.push(digest_part(&part.dir).map_err(build_err)?);
                let _ = tx.send(i);
            }
            drop(tx);
            Ok::<_, BuildError>((out, t.elapsed().as_secs_f64()))
        });
        let uploaders: Vec<_> = uploaders
            .iter()
            .map(|fs| {
                let (rx, failed) = (&rx, &failed);
                scope.spawn(move || loop {
                    let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok(i) = next else { return Ok(()) };
                    let to = &staged[i];
                    let step = who.step("build.upload").part(&names[i]);
                    match fs.upload_dir_consuming(&parts[i].dir, to.as_str()) {
                        Ok(stats) => step.counts(parts[i].rows, stats.bytes, 1, 0).ok(),
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            let e = remote(format!("upload part {} to {to}", names[i]))(e);
                            return step.end(Err(e));
                        }
                    }
                })
            })
            .collect();
        let digested = join(digester);
        if digested.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        let uploads: Vec<Result<(), BuildError>> = uploaders.into_iter().map(join).collect();
        (digested, uploads)
    });
    uploads
        .into_iter()
        .collect::<Result<Vec<()>, BuildError>>()?;
    let (files, digest_secs) = digested?;
    timings.digest_secs = digest_secs;
    timings.upload_secs = t.elapsed().as_secs_f64();
    Ok(files)
}

/// A scoped thread's result; its panic, if it panicked.
fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// The remote half of an attempt, remembering what it created so a failure can undo exactly
/// that and nothing of anyone else's. It owns one staging directory per disk it publishes
/// on: the home disk's (claimed before any work; the manifest goes there) and those of the
/// other disks its parts go to (claimed before the upload), each `<disk's staging root>/<load>/<attempt>/`.
struct Publisher<'a> {
    fs: &'a dyn RemoteFs,
    /// One per disk of the destination, the home disk first.
    stagings: Vec<DiskStaging>,
    published: Vec<String>,
}

/// The attempt's staging on one disk.
struct DiskStaging {
    place: DiskPlace,
    staging: AttemptStaging,
    /// This process created `staging.dir()` (so it may remove it, and parts go through it).
    claimed: bool,
}

#[derive(Serialize)]
struct PublishIntent<'a> {
    load: &'a LoadId,
    attempt: &'a str,
    detached: Vec<String>,
}

impl<'a> Publisher<'a> {
    /// Claims the home disk's `<staging>/<load>/<attempt>/` by creating it exclusively, and
    /// its `parts/`.
    fn claim(
        fs: &'a dyn RemoteFs,
        destination: &Destination,
        load: &LoadId,
        attempt: &AttemptId,
    ) -> Result<Publisher<'a>, BuildError> {
        let mut publisher = Publisher {
            fs,
            stagings: destination
                .disks
                .iter()
                .map(|place| DiskStaging {
                    staging: place.staging().attempt(load, attempt),
                    place: place.clone(),
                    claimed: false,
                })
                .collect(),
            published: Vec::new(),
        };
        publisher.claim_disk(0)?;
        Ok(publisher)
    }

    /// The index of the disk the attempt's part `seq` goes to (the stagings are in the
    /// destination's order).
    fn disk_for(&self, load: &LoadId, attempt: &AttemptId, seq: u32) -> usize {
        chpart_core::disk_index(load, attempt, seq, self.stagings.len())
    }

    /// Claims the attempt's staging directory on disk `index` (exclusively, with `parts/`),
    /// unless this process already did. A directory that exists is another build's: the
    /// attempt id was used twice.
    fn claim_disk(&mut self, index: usize) -> Result<(), BuildError> {
        let fs = self.fs;
        let slot = &mut self.stagings[index];
        if slot.claimed {
            return Ok(());
        }
        let dir = slot.staging.dir().clone();
        let load_dir = dir.parent().expect("an attempt dir has a load dir");
        fs.create_dir_all(load_dir.as_str())
            .map_err(remote(format!("create staging dir {load_dir}")))?;
        match fs.create_dir(dir.as_str()) {
            Ok(()) => slot.claimed = true,
            Err(RemoteError::AlreadyExists { .. }) => {
                let load = load_dir.file_name().unwrap_or_default();
                return Err(BuildError::AttemptTaken {
                    load: load.parse().map_err(build_err)?,
                    attempt: dir
                        .file_name()
                        .unwrap_or_default()
                        .parse()
                        .map_err(build_err)?,
                    path: dir,
                });
            }
            Err(e) => return Err(remote(format!("create staging dir {dir}"))(e)),
        }
        let parts_dir = slot.staging.parts_dir();
        fs.create_dir(parts_dir.as_str())
            .map_err(remote(format!("create staging dir {parts_dir}")))
    }

    fn publish(
        &mut self,
        env: &BuildEnv<'_>,
        spec: &LoadSpec,
        manifest: &Manifest,
        timings: &mut BuildTimings,
    ) -> Result<(), BuildError> {
        let fs = self.fs;
        let t = Instant::now();
        // Per disk: (its staging, the table's data path there, the parts going there).
        let mut per_disk: Vec<(&DiskStaging, &RemotePath, Vec<&PartEntry>)> = self
            .stagings
            .iter()
            .filter(|s| s.claimed)
            .map(|s| (s, &s.place.data_path, Vec::new()))
            .collect();
        for part in &manifest.parts {
            let data_path = manifest.data_path_of(part);
            let slot = per_disk
                .iter_mut()
                .find(|(_, d, _)| *d == data_path)
                .expect("every part's disk was claimed");
            slot.2.push(part);
        }
        // Each disk's intent lists the parts about to leave that disk's staging for its
        // detached/, before the first of them does: gc finds them there.
        for (slot, data_path, parts) in &per_disk {
            let intent = PublishIntent {
                load: &manifest.load,
                attempt: manifest.attempt.id.as_str(),
                detached: parts
                    .iter()
                    .map(|p| chpart_core::detached_part_path(data_path, &p.name).to_string())
                    .collect(),
            };
            let intent_path = slot.staging.publish_intent();
            fs.write_file_atomic(
                intent_path.as_str(),
                serde_json::to_string(&intent)
                    .expect("serializes")
                    .as_bytes(),
            )
            .map_err(remote(format!("write {intent_path}")))?;
        }

        // Fence: nothing enters detached/ once the load (or its cluster load) is finished.
        let _ = open_spec(env.loads, &spec.load)?;
        if let Some(of) = &spec.shard_of {
            let _ = open_spec(env.loads, &of.parent)?;
        }

        for (slot, data_path, parts) in &per_disk {
            if let Some(first) = parts.first() {
                check_owner(fs, data_path, &slot.staging.part_dir(&first.name))?;
            }
        }
        for (slot, data_path, parts) in &per_disk {
            for entry in parts {
                let from = slot.staging.part_dir(&entry.name);
                let to = chpart_core::detached_part_path(data_path, &entry.name).to_string();
                fs.rename_noreplace(from.as_str(), &to)
                    .map_err(remote(format!("publish part {} into {to}", entry.name)))?;
                self.published.push(to);
            }
        }
        let home = &self.stagings[0].staging;
        let tmp = home.manifest_tmp();
        let _ = fs.remove_all(tmp.as_str());
        fs.write_file_atomic(home.manifest().as_str(), manifest.to_json_line().as_bytes())
            .map_err(remote(format!("write manifest {}", home.manifest())))?;
        timings.publish_secs = t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Best effort: remove the parts this process published and the staging dirs it created.
    /// What fails here stays for gc, which finds it through the publish intents (kept if a part
    /// could not go).
    fn undo(&mut self) {
        let mut all_removed = true;
        for path in self.published.drain(..) {
            if let Err(e) = self.fs.remove_all(&path) {
                tracing::warn!(
                    "could not remove published part {path} after the failure: {e}; gc will"
                );
                all_removed = false;
            }
        }
        if !all_removed {
            return;
        }
        for slot in self.stagings.iter_mut().filter(|s| s.claimed) {
            slot.claimed = false;
            let dir = slot.staging.dir();
            if let Err(e) = self.fs.remove_all(dir.as_str()) {
                tracing::warn!("could not remove staging {dir} after the failure: {e}; gc will");
            }
        }
    }
}

/// Refuses to publish a part the server could not attach: `staged` (a part in staging) must
/// belong to the owner of `<data_path>/detached`, the server's user.
fn check_owner(
    fs: &dyn RemoteFs,
    data_path: &RemotePath,
    staged: &RemotePath,
) -> Result<(), BuildError> {
    let detached_dir = chpart_core::detached_dir(data_path);
    let detached = fs
        .stat(detached_dir.as_str())
        .map_err(remote(format!("stat {detached_dir}")))?
        .ok_or_else(|| BuildError::Remote {
            op: format!("find {detached_dir}"),
            source: Box::new(RemoteError::NotFound {
                path: detached_dir.as_str().to_owned(),
                at: fs.describe(),
                op: "stat",
            }),
        })?;
    let part = fs
        .stat(staged.as_str())
        .map_err(remote(format!("stat {staged}")))?
        .ok_or_else(|| BuildError::Build(format!("staged part {staged} vanished")))?;
    if part.uid != detached.uid {
        return Err(BuildError::Ownership {
            path: staged.as_str().to_owned(),
            owner: part.uid,
            detached: detached_dir.as_str().to_owned(),
            server_uid: detached.uid,
        });
    }
    Ok(())
}

/// The load directory backed by the ledger, for synchronous code (the build runs on a plain
/// thread; ledger calls block on the runtime).
pub struct LedgerDirectory {
    /// The ledger.
    pub ledger: crate::store::Ledger,
    /// Runtime to block on.
    pub runtime: tokio::runtime::Handle,
}

impl LoadDirectory for LedgerDirectory {
    fn lookup(&self, load: &LoadId) -> Result<(LoadState, Option<LoadSpec>), LedgerStoreError> {
        let view = self
            .runtime
            .block_on(self.ledger.view(load, crate::KNOWN_KINDS))?;
        Ok((view.state, view.spec))
    }

    fn record_fenced(&self, load: &LoadId, attempt: &Attempt, started_at_unix_ms: u64) {
        let body = crate::ledger::FencedBody {
            attempt: attempt.id.to_string(),
            partition: attempt.partition,
            started_at_unix_ms,
        };
        let written = self.runtime.block_on(self.ledger.append(
            load,
            &format!("fenced:{}", attempt.id),
            crate::ledger::kind::ATTEMPT_FENCED,
            &serde_json::to_string(&body).expect("serializes"),
        ));
        if let Err(e) = written {
            tracing::warn!(
                "could not note in the ledger that attempt {} was fenced: {e}",
                attempt.id
            );
        }
    }
}
