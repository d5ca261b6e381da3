//! The clickhouse-local side of an attempt: the input checked and spooled, the sessions run
//! (one per spooled chunk, then a rewrite when the table's TTL or a merge asks for one), the
//! engine checked against the load's server, and the parts it built checked against the
//! input's rows. What the load says (DDL, engine, columns, the server's version and time zone)
//! comes in as plain values ([`LocalBuild`]); uploading and publishing the parts is the
//! caller's.

use std::io::Read;
use std::path::PathBuf;

use chpart_input::{
    ArrowStreamPump, ChunkSink, InputError, InputPlan, ParquetInput, StreamStats, TargetColumn,
};

use crate::ddl::local_table_ddl;
use crate::parts::{
    inspect_parts, local_args, rewrite_query, split_listings, split_partitions, ttl_due,
    BuildSession, BuiltPart, FileSource, Rewrite,
};
use crate::runner::{LocalCommand, LocalIdentity, RunError, IDENTITY_QUERY};
use crate::workdir::WorkDir;

/// Database of the build inside clickhouse-local (private to the work dir).
pub const LOCAL_DATABASE: &str = "chpart_build";
/// The build's table inside clickhouse-local (with a shard suffix, one per shard, when routed).
pub const LOCAL_TABLE: &str = "t";

/// The rows of this attempt.
pub enum Input {
    /// Parquet files, read by clickhouse-local itself (no spool, no re-encoding).
    Parquet(Vec<PathBuf>),
    /// An Arrow IPC stream (e.g. stdin), checked batch by batch into spool files of the work
    /// dir (bounded chunks: [`LocalBuild::spool_chunk_bytes`]), which clickhouse-local reads.
    ArrowStream(Box<dyn Read + Send>),
}

/// What one attempt's build needs to know about its load.
pub struct LocalBuild<'a> {
    /// clickhouse-local, started in the server's time zone.
    pub local: &'a LocalCommand,
    /// The publish table's `create_table_query`, adapted for clickhouse-local per table.
    pub create_table_query: &'a str,
    /// The publish table's engine, for messages.
    pub engine: &'a str,
    /// The publish table's columns, which the input must match.
    pub target: &'a [TargetColumn],
    /// The load's server version: clickhouse-local may not be newer.
    pub server_version: &'a str,
    /// The load's server time zone, if recorded: clickhouse-local must compute in it.
    pub server_timezone: Option<&'a str>,
    /// An Arrow stream is spooled into the work dir in chunks of about this many bytes, each
    /// inserted by its own clickhouse-local session while the next is written.
    pub spool_chunk_bytes: u64,
    /// Merge each partition the build wrote as several parts (one per spooled chunk or input
    /// file) into one, so that the build ships one part per partition (per shard) as a merge of
    /// every partition (`merge`) would, without rewriting the partitions that are one part.
    pub merge_split_partitions: bool,
    /// The clock (Unix milliseconds) that decides which rows' TTL is due.
    pub now_unix_ms: fn() -> u64,
}

/// Why building an attempt's parts with clickhouse-local failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// Bad input: unreadable, corrupt, or not matching the table.
    #[error(transparent)]
    Input(#[from] InputError),
    /// clickhouse-local failed.
    #[error("building parts with clickhouse-local: {0}")]
    Run(#[from] RunError),
    /// Anything else in the local build (DDL, part checks, the input pump).
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
}

fn build_err(e: impl std::fmt::Display) -> LocalError {
    LocalError::Build(e.to_string())
}

/// The parts clickhouse-local built, the input rows it read, and what it said it is.
pub struct Built {
    /// The parts, checked.
    pub parts: Vec<BuiltPart>,
    /// Input rows read.
    pub source_rows: u64,
    /// Input rows the table's TTL rules removed (expired, or folded by `TTL ... GROUP BY`).
    pub ttl_removed_rows: u64,
    /// Input rows the table's engine folded (a folding engine's rows, folded as an INSERT
    /// folds its block): `source_rows` = rows of `parts` + TTL-removed rows + this.
    pub folded_rows: u64,
    /// The clickhouse-local that built them: its version and time zone.
    pub identity: LocalIdentity,
}

/// Refuses a clickhouse-local the load's server (`server_version`, `server_timezone`) may not
/// read parts of, or one that computes in another zone than the server's.
pub fn check_local(
    local: &LocalCommand,
    server_version: &str,
    server_timezone: Option<&str>,
    id: &LocalIdentity,
) -> Result<(), LocalError> {
    chpart_core::check_local_not_newer(&id.version, server_version)?;
    match server_timezone {
        Some(tz) if tz != id.timezone => Err(LocalError::TimeZone {
            program: local.program.display().to_string(),
            expected: tz.to_owned(),
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
/// was built). The first session runs [`IDENTITY_QUERY`] first ([`run_identified`]). Returns the
/// identity line the first session printed, the last session's output (the listing of every
/// part) and what was pumped.
fn run_spooled(
    local: &LocalCommand,
    data: &std::path::Path,
    dir: &std::path::Path,
    session: &BuildSession,
    pump: ArrowStreamPump<Box<dyn Read + Send>>,
    structure: &str,
    chunk_bytes: u64,
) -> Result<(String, Vec<u8>, StreamStats), LocalError> {
    let (chunks, done) = std::sync::mpsc::sync_channel::<PathBuf>(0);
    let mut sink = SpoolSink {
        dir: dir.to_path_buf(),
        chunks,
        current: None,
    };
    let started = std::time::Instant::now();
    let pumper = std::thread::spawn(move || {
        let pumped = pump.pump_chunked(chunk_bytes, &mut sink);
        (pumped, started.elapsed())
    });
    let mut output = None;
    let mut identity = String::new();
    let mut sessions = std::time::Duration::ZERO;
    for (i, chunk) in done.iter().enumerate() {
        let session_started = std::time::Instant::now();
        let file: FileSource = (
            chunk.clone(),
            "ArrowStream".to_owned(),
            structure.to_owned(),
        );
        let first = i == 0;
        let run = session
            .query(first, vec![file])
            .map_err(build_err)
            .and_then(|query| {
                if first {
                    let (line, rest) = run_identified(local, data, &query)?;
                    identity = line;
                    Ok(rest)
                } else {
                    Ok(local.run(&local_args(data, &query))?)
                }
            });
        sessions += session_started.elapsed();
        let _ = std::fs::remove_file(&chunk);
        // On failure the pump is left to stop at its next chunk (its hand-over fails) or with
        // its input: it may be waiting for the producer, which this build no longer reads.
        output = Some(run?);
    }
    let (stats, streamed) = pumper
        .join()
        .map_err(|_| LocalError::Build("the input pump panicked".into()))?;
    let stats = stats?;
    let output = output
        .ok_or_else(|| LocalError::Build("the Arrow stream was pumped into no chunk".into()))?;
    // Which side is slower: the producer (most of the stream's time waiting for it) or the
    // build; and how long clickhouse-local took after (or beside) the stream.
    tracing::info!(
        "the Arrow stream: {} rows, {:.1} MB in {:.2}s ({:.2}s of it waiting for its producer), \
         spooled in {} chunk(s) of at most about {} MiB; clickhouse-local {:.2}s",
        stats.rows,
        stats.bytes as f64 / 1e6,
        streamed.as_secs_f64(),
        stats.read_wait.as_secs_f64(),
        stats.chunks,
        chunk_bytes >> 20,
        sessions.as_secs_f64()
    );
    Ok((identity, output, stats))
}

/// Runs the session `query` on the build's data dir `data` with [`IDENTITY_QUERY`] first, in the
/// same process: the engine's version and time zone cost no start-up of their own. Returns the
/// identity line and the rest of the output.
fn run_identified(
    local: &LocalCommand,
    data: &std::path::Path,
    query: &str,
) -> Result<(String, Vec<u8>), RunError> {
    let mut output = local.run(&local_args(data, &format!("{IDENTITY_QUERY};\n{query}")))?;
    let at = output
        .iter()
        .position(|b| *b == b'\n')
        .map_or(output.len(), |at| at + 1);
    let rest = output.split_off(at);
    Ok((String::from_utf8_lossy(&output).into_owned(), rest))
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
pub fn run_clickhouse_local(
    build: &LocalBuild<'_>,
    work: &WorkDir,
    input: Input,
    merge: bool,
    routed: Option<(&[(String, u32)], &str)>,
) -> Result<Vec<Built>, LocalError> {
    let local = build.local;
    let target = build.target;
    let ddl_of = |table: &str| {
        local_table_ddl(build.create_table_query, LOCAL_DATABASE, table).map_err(build_err)
    };
    let data = work.path().join("clickhouse");

    let session_for = |plan: &InputPlan| -> Result<BuildSession, LocalError> {
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
                    .collect::<Result<Vec<_>, LocalError>>()?;
                BuildSession::routed(&ddls, LOCAL_DATABASE, route, &plan.insert_columns)
                    .map_err(build_err)
            }
        }
    };
    // The engine's version and time zone (checked before anything leaves this host) are the
    // first line the build's own session prints: no process start-up of their own.
    let (output, rows, identity) = match input {
        Input::Parquet(paths) => {
            let (files, plan, rows) = parquet_sources(&paths, target)?;
            let query = session_for(&plan)?.query(true, files).map_err(build_err)?;
            let (first, listing) = run_identified(local, &data, &query)?;
            let identity = local.identity_of(&first)?;
            (listing, rows, identity)
        }
        Input::ArrowStream(reader) => {
            // Chunked sessions, the first of which prints the identity first. The stream is
            // checked batch by batch on its way into files of this attempt's work dir, and
            // clickhouse-local reads those. It cannot read the stream from a pipe: the 26.9
            // engine's ArrowStream reader seeks in its input, which fails on a pipe for
            // multi-batch streams ("Cannot seek through file (fd = 0)"). The spool is the same
            // binary Arrow stream (no re-encoding, no text), read once by the engine.
            let pump = ArrowStreamPump::start(reader, target, "stdin")?;
            let session = session_for(pump.plan())?;
            let structure = pump.plan().structure.clone();
            let (first, output, stats) = run_spooled(
                local,
                &data,
                work.path(),
                &session,
                pump,
                &structure,
                build.spool_chunk_bytes,
            )?;
            let identity = local.identity_of(&first)?;
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
                        LocalError::Build(format!("clickhouse-local listed no parts of table {t}"))
                    })?;
                    inspect_parts(listing, None).map_err(build_err)
                })
                .collect::<Result<Vec<_>, LocalError>>()?;
            (tables.iter().map(|(t, _)| t.clone()).collect(), inserted)
        }
    };
    check_local(
        local,
        build.server_version,
        build.server_timezone,
        &identity,
    )?;
    let engine = build.engine;
    // Every engine: the inserts fold nothing (optimize_on_insert = 0), so the parts hold exactly
    // the input's rows (all tables together, when routed).
    check_rows(rows, &inserted.concat(), engine)?;

    // Rewrites, if any, run in further sessions on the same data directory (and in the same
    // time zone), on parts just checked to hold every input row. After each the rows may only
    // have become fewer: by TTL (expired rows removed first, counted apart), then by the
    // engine's fold. A folding engine folds each attempt's rows as an INSERT folds its block
    // (`optimize_on_insert`), so readers right after the commit see what they would after an
    // INSERT of the same rows; a plain MergeTree folds nothing, merged or not.
    let folds = folds_rows(engine);
    let now = (build.now_unix_ms)() / 1000;
    let mut out = Vec::new();
    for (table, inserted) in tables.iter().zip(inserted) {
        let ttl_expired = inserted
            .iter()
            .map(|p| ttl_due(p, now))
            .collect::<Result<Vec<bool>, _>>()
            .map_err(build_err)?
            .contains(&true);
        let table_rows = rows_of(&inserted);
        // A merge of every partition (asked for, or a folding engine's), else of the partitions
        // the build split over several parts (chunks of a stream, input files), if any.
        let merge_all = merge || folds;
        let split = if merge_all || !build.merge_split_partitions {
            Vec::new()
        } else {
            split_partitions(&inserted)
        };
        if !split.is_empty() {
            tracing::info!(
                "merging {} partition(s) the build wrote as several parts into one part each (local table {table}: {})",
                split.len(),
                chpart_core::text::some_of(split.iter(), 10)
            );
        }
        let mut parts = inserted;
        // Rows removed by TTL, and by the engine's fold.
        let mut removed = [0u64; 2];
        // Only a merge of every partition applies the TTL of all: otherwise TTL first.
        let ttl_first = ttl_expired && (folds || !merge);
        // What a merge covers: every partition, or the split ones.
        let partitions = (!merge_all).then_some(split.as_slice());
        let rewrites = [
            ttl_first.then_some(Rewrite::ApplyTtl),
            (merge_all || !split.is_empty()).then_some(if ttl_first {
                Rewrite::MergeAfterTtl
            } else {
                Rewrite::Merge
            }),
        ];
        for (i, rewrite) in rewrites.into_iter().enumerate() {
            let Some(rewrite) = rewrite else { continue };
            let before = rows_of(&parts);
            let query = rewrite_query(LOCAL_DATABASE, table, rewrite, partitions);
            let output = local.run(&local_args(&data, &query))?;
            parts = inspect(&output, Some(rewrite))?;
            if rows_of(&parts) > before {
                return Err(LocalError::RowMismatch {
                    source_rows: before,
                    part_rows: rows_of(&parts),
                    engine: engine.to_owned(),
                    stage: Some(match rewrite {
                        Rewrite::Merge | Rewrite::MergeAfterTtl => "after OPTIMIZE FINAL",
                        Rewrite::ApplyTtl => "after MATERIALIZE TTL",
                    }),
                });
            }
            // A part whose rows all expired (or all folded away) has nothing to attach.
            parts.retain(|p| p.rows > 0);
            // A plain MergeTree's merge folds nothing: what it removed had expired (TTL).
            let by_fold = i == 1 && folds;
            removed[usize::from(by_fold)] += before - rows_of(&parts);
        }
        out.push(Built {
            ttl_removed_rows: removed[0],
            folded_rows: removed[1],
            parts,
            source_rows: table_rows,
            identity: identity.clone(),
        });
    }
    Ok(out)
}

/// Whether the table's engine folds rows when it merges (every MergeTree-family engine but the
/// plain one: Replacing, Summing, Aggregating, Collapsing, VersionedCollapsing, Graphite).
pub fn folds_rows(engine: &str) -> bool {
    engine != "MergeTree"
}

/// Rows in `parts`.
pub fn rows_of(parts: &[BuiltPart]) -> u64 {
    parts.iter().map(|p| p.rows).sum()
}

fn inspect(output: &[u8], rewrite: Option<Rewrite>) -> Result<Vec<BuiltPart>, LocalError> {
    inspect_parts(&String::from_utf8_lossy(output), rewrite).map_err(build_err)
}

/// The parts hold exactly `expected` rows.
fn check_rows(expected: u64, parts: &[BuiltPart], engine: &str) -> Result<(), LocalError> {
    let part_rows = rows_of(parts);
    if part_rows != expected {
        return Err(LocalError::RowMismatch {
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
) -> Result<(Vec<FileSource>, InputPlan, u64), LocalError> {
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
                return Err(LocalError::Build(format!(
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
    let plan = plan.ok_or_else(|| LocalError::Build("no input files given".into()))?;
    Ok((files, plan, rows))
}
