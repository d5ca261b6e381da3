//! The clickhouse-local side of an attempt: the command checked against the server, the
//! input checked and spooled, the run, and the parts it built checked against the input's rows.

use super::*;

/// The parts clickhouse-local built, the input rows it read, and what it said it is.
pub(super) struct Built {
    pub(super) parts: Vec<BuiltPart>,
    pub(super) source_rows: u64,
    /// Input rows the table's TTL rules removed (expired, or folded by `TTL ... GROUP BY`).
    pub(super) ttl_removed_rows: u64,
    /// Input rows the table's engine folded (a folding engine's rows, folded as an INSERT
    /// folds its block): `source_rows` = rows of `parts` + TTL-removed rows + this.
    pub(super) folded_rows: u64,
    pub(super) identity: LocalIdentity,
}

/// clickhouse-local as the load's server would compute: in the server's time zone.
pub(super) fn local_for(env: &BuildEnv<'_>, spec: &LoadSpec) -> LocalCommand {
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
pub(super) fn check_local(
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
pub(super) fn run_spooled(
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
pub(super) struct SpoolSink {
    pub(super) dir: PathBuf,
    pub(super) chunks: std::sync::mpsc::SyncSender<PathBuf>,
    pub(super) current: Option<PathBuf>,
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
pub(super) fn run_clickhouse_local(
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

    // Rewrites, if any, run in further sessions on the same data directory (and in the same
    // time zone), on parts just checked to hold every input row. After each the rows may only
    // have become fewer: by TTL (expired rows removed first, counted apart), then by the
    // engine's fold. A folding engine folds each attempt's rows as an INSERT folds its block
    // (`optimize_on_insert`), so readers right after the commit see what they would after an
    // INSERT of the same rows; a plain MergeTree folds nothing, merged or not.
    let folds = folds_rows(engine);
    let now = now_unix_ms() / 1000;
    let mut out = Vec::new();
    for (table, inserted) in tables.iter().zip(inserted) {
        let ttl_expired = inserted
            .iter()
            .map(|p| ttl_due(p, now))
            .collect::<Result<Vec<bool>, _>>()
            .map_err(build_err)?
            .contains(&true);
        let table_rows = rows_of(&inserted);
        let mut parts = inserted;
        let mut removed = [0u64; 2]; // by TTL, by the engine's fold
        let ttl_first = ttl_expired && (folds || !merge);
        let rewrites = [
            ttl_first.then_some(Rewrite::ApplyTtl),
            (merge || folds).then_some(if ttl_first {
                Rewrite::MergeAfterTtl
            } else {
                Rewrite::Merge
            }),
        ];
        for (i, rewrite) in rewrites.into_iter().enumerate() {
            let Some(rewrite) = rewrite else { continue };
            let before = rows_of(&parts);
            let query = rewrite_query(LOCAL_DATABASE, table, rewrite);
            let output = local.run(&local_args(&data, &query))?;
            parts = inspect(&output, Some(rewrite))?;
            if rows_of(&parts) > before {
                return Err(BuildError::RowMismatch {
                    source_rows: before,
                    part_rows: rows_of(&parts),
                    engine: engine.clone(),
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
pub(super) fn folds_rows(engine: &str) -> bool {
    engine != "MergeTree"
}

pub(super) fn rows_of(parts: &[BuiltPart]) -> u64 {
    parts.iter().map(|p| p.rows).sum()
}

pub(super) fn inspect(
    output: &[u8],
    rewrite: Option<Rewrite>,
) -> Result<Vec<BuiltPart>, BuildError> {
    inspect_parts(&String::from_utf8_lossy(output), rewrite).map_err(build_err)
}

/// The parts hold exactly `expected` rows.
pub(super) fn check_rows(
    expected: u64,
    parts: &[BuiltPart],
    engine: &str,
) -> Result<(), BuildError> {
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
pub(super) fn parquet_sources(
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
