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

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chpart_build::local::{rows_of, Built, LocalBuild, LocalError, LOCAL_TABLE};
use chpart_build::{digest_part, BuiltPart, LocalCommand, LocalIdentity, RunError, WorkDir};
use chpart_core::manifest::{FileEntry, Manifest, OtherDisk, PartEntry, Phases, Target};
use chpart_core::{
    detached_part_name, Attempt, AttemptId, AttemptStaging, Destination, DiskPlace, LoadId,
    PartName, PublishIntent, RemotePath, StagingLayout,
};
use chpart_input::{ChType, TargetColumn};
use chpart_remote::{RemoteError, RemoteFs};
use serde::Serialize;

use crate::events::Step;
use crate::ledger::{LoadSpec, LoadState};
use crate::reach::Reach;
use crate::shards::{ClusterManifest, ClusterSpec, ShardSpec};
use crate::store::{now_unix_ms, LedgerStoreError};
use crate::FailureKind;

mod cluster;
mod error;
mod local;
mod publish;

pub use chpart_build::local::Input;
use cluster::*;
pub use error::BuildError;
use error::*;
use local::*;
use publish::*;

/// Where a load's spec and state come from (the ledger, in production).
pub trait LoadDirectory: Sync {
    /// The load's state and spec, read now (not cached: fencing depends on it).
    fn lookup(&self, load: &LoadId) -> Result<(LoadState, Option<LoadSpec>), LedgerStoreError>;

    /// Notes that `attempt` was fenced off `load` (best effort, for the load's timeline: a
    /// failure is only logged).
    fn record_fenced(&self, _load: &LoadId, _attempt: &Attempt, _started_at_unix_ms: u64) {}
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
    /// Merge each partition the build wrote as several parts (one per spooled chunk or input
    /// file) into one before shipping, so that the server has nothing of this attempt's to merge
    /// ([`chpart_build::local::LocalBuild::merge_split_partitions`]; off unless configured).
    pub merge_split_partitions: bool,
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
        "built {} part(s), {} rows from {} input rows ({} removed by the table's TTL, {} folded by its engine) in {:.2}s",
        built.parts.len(),
        rows_of(&built.parts),
        built.source_rows,
        built.ttl_removed_rows,
        built.folded_rows,
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
        folded_rows: built.folded_rows,
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
