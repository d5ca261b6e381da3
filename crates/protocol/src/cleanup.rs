//! `abort`, `gc` and `status`: what a load left behind, and removing what no load will attach.
//!
//! A finished load (committed or aborted) can leave: losing attempts' parts in the publish
//! table's `detached/` (and late writers' parts published after the commit), staging
//! directories of every attempt, and the shadow table. Attribution never guesses: a shadow table
//! belongs to exactly one load (its name derives from the load id), and a part in a target's
//! `detached/` is removed only if an attempt of the load listed it in its `publish-intent.json`
//! (written before the part was renamed into `detached/`). Nothing of an open load is removed.
//!
//! Order matters: the terminal ledger entry is durable before anything is removed (abort writes
//! it first; gc only looks at finished loads), detached parts go before the staging that names
//! them, and an attempt's staging directory goes last, after its intent was read again, so a
//! late writer that renames a part meanwhile is caught by the second read or, finding its staging
//! gone, fails and removes its own part.

use std::collections::{BTreeMap, BTreeSet};

use chpart_core::commit::{Mode, Visibility};
use chpart_core::{
    DetachedEntry, DiskPlace, LoadId, PartName, RemotePath, StagingLayout, TableRef,
};
use chpart_remote::{RemoteError, RemoteFs};
use chpart_server::{code, quote_table, ClickHouseServer, ServerError};
use serde::{Deserialize, Serialize};

use futures_util::future::BoxFuture;

use crate::ledger::{kind, Decision, GcCheckpoint, LoadSpec, LoadState, LoadView};
use crate::observe::{reclaim, ClaimCheck};
use crate::reach::Reach;
use crate::staging::{
    disks_of, listed_attempt, read_intent, staged_attempts, Places, ScanError, StagedAttempt,
    TAKEN_PREFIX,
};
use crate::store::{now_unix_ms, Ledger, LedgerStoreError, LOADS_PER_STATEMENT};
use crate::FailureKind;

mod status;
use status::load_status;
pub use status::{status, AttemptStatus, LoadStatus, ShardStatus};

/// One thing gc or abort removes (or, with `--dry-run`, would remove).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Removal {
    /// A part in a table's `detached/` (via `DROP DETACHED PART`).
    DetachedPart {
        /// The table.
        table: String,
        /// The part.
        part: String,
        /// The attempt that published it.
        attempt: String,
    },
    /// The load's shadow table (and with it everything in its `detached/`).
    ShadowTable {
        /// The table.
        table: String,
    },
    /// A staging directory of one attempt.
    Staging {
        /// The directory.
        path: String,
    },
}

/// Why abort or gc failed.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// Abort of a committed load.
    #[error("load {0} is committed; it cannot be aborted")]
    Committed(LoadId),
    /// Abort while a commit has made (or may have made) rows visible.
    #[error("load {0} has a commit in progress that may already have made rows visible; run `chpart commit` again to finish it (if it cannot finish, `chpart abort --force` ends the load: rows it already made visible stay)")]
    CommitInProgress(LoadId),
    /// A shard's sub-load of a cluster load, which is ended through its cluster load.
    #[error("load {load} is shard {shard_num} of cluster load {parent}: abort {parent} instead")]
    ShardOfCluster {
        /// The sub-load.
        load: LoadId,
        /// Its shard.
        shard_num: u32,
        /// The cluster load.
        parent: LoadId,
    },
    /// The ledger failed.
    #[error(transparent)]
    Ledger(#[from] LedgerStoreError),
    /// The server failed.
    #[error(transparent)]
    Server(Box<ServerError>),
    /// Reading what the load left in staging failed.
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// The filesystem failed.
    #[error("{op}: {source}")]
    Remote {
        /// What was being done.
        op: String,
        /// The error.
        source: Box<RemoteError>,
    },
}

impl From<ServerError> for CleanupError {
    fn from(e: ServerError) -> Self {
        CleanupError::Server(Box::new(e))
    }
}

impl CleanupError {
    /// What the failure means for the caller.
    pub fn kind(&self) -> FailureKind {
        match self {
            CleanupError::Ledger(e) => e.kind(),
            CleanupError::Server(e) => crate::server_failure(e),
            CleanupError::Scan(e) => e.kind(),
            CleanupError::Remote { source, .. } if source.is_transient() => FailureKind::Retryable,
            _ => FailureKind::Permanent,
        }
    }
}

fn remote(op: impl Into<String>) -> impl FnOnce(RemoteError) -> CleanupError {
    let op = op.into();
    move |e| CleanupError::Remote {
        op,
        source: Box::new(e),
    }
}

/// Removes (or lists, with `dry_run`) what a finished load left, on every disk it published
/// to. Idempotent.
pub async fn clean_finished_load(
    server: &dyn ClickHouseServer,
    fs: &dyn RemoteFs,
    staging: &StagingLayout,
    spec: &LoadSpec,
    dry_run: bool,
) -> Result<Vec<Removal>, CleanupError> {
    Ok(clean(server, fs, staging, spec, dry_run).await?.removed)
}

/// What [`clean`] did.
struct Cleaned {
    /// Removed (or, with dry run, to remove).
    removed: Vec<Removal>,
    /// Something had to stay for a later gc (parts a running ATTACH holds, with the staging
    /// whose intent names them).
    kept: bool,
}

/// [`clean_finished_load`], saying whether anything had to stay.
async fn clean(
    server: &dyn ClickHouseServer,
    fs: &dyn RemoteFs,
    staging: &StagingLayout,
    spec: &LoadSpec,
    dry_run: bool,
) -> Result<Cleaned, CleanupError> {
    let mut cleaned = Cleaned {
        removed: Vec::new(),
        kept: false,
    };
    if spec.cluster.is_some() {
        // A cluster load's tables and files are its shards' sub-loads'; they are cleaned each
        // on its own shard.
        return Ok(cleaned);
    }
    let removed = &mut cleaned.removed;
    let disks = disks_of(spec, staging)?;
    let (db, table) = (spec.publish.database.as_str(), spec.publish.table.as_str());
    // The table whose detached/ holds the load's parts and is cleaned part by part (`None`: it
    // is dropped whole, detached/ with it).
    let mut parts_in = (spec.publish == spec.target).then(|| spec.target.clone());
    if spec.mode == Mode::Overwrite {
        // The shadow and the table it replaced are found by UUID: either may be under the
        // shadow's name, a commit's claim name or the target's. Under the target's it is the
        // table now (the shadow after the swap: its detached/ holds the losers' parts); under
        // a name of the load's it is garbage: the shadow of a load that never swapped, or the
        // old table after the swap.
        let uuids = [
            spec.publish_snapshot.uuid.clone(),
            spec.target_snapshot.uuid.clone(),
        ];
        for (uuid, name) in server.table_names_by_uuid(db, &uuids).await? {
            if name == spec.target.table.as_str() {
                if uuid == spec.publish_snapshot.uuid {
                    parts_in = Some(spec.target.clone());
                }
            } else if crate::commit::is_load_table_name(table, &name) {
                if !dry_run {
                    server
                        .execute_idempotent(&format!(
                            "DROP TABLE IF EXISTS {} SYNC",
                            quote_table(db, &name)
                        ))
                        .await?;
                }
                removed.push(Removal::ShadowTable {
                    table: format!("{db}.{name}"),
                });
            }
        }
    } else if spec.publish != spec.target {
        // The shadow belongs to this load alone: dropping it removes its detached/ too.
        if server.table_info(db, table).await?.is_some() {
            if !dry_run {
                server
                    .execute_idempotent(&format!(
                        "DROP TABLE IF EXISTS {} SYNC",
                        quote_table(db, table)
                    ))
                    .await?;
            }
            removed.push(Removal::ShadowTable {
                table: spec.publish.to_string(),
            });
        }
    }
    for disk in &disks {
        let on_disk = clean_disk(server, fs, spec, parts_in.as_ref(), disk, dry_run).await?;
        cleaned.removed.extend(on_disk.removed);
        cleaned.kept |= on_disk.kept;
    }
    Ok(cleaned)
}

/// [`clean_finished_load`] for the staging on one disk and the parts it published into that
/// disk's `detached/`.
async fn clean_disk(
    server: &dyn ClickHouseServer,
    fs: &dyn RemoteFs,
    spec: &LoadSpec,
    parts_in: Option<&TableRef>,
    disk: &DiskPlace,
    dry_run: bool,
) -> Result<Cleaned, CleanupError> {
    let mut removed = Vec::new();
    let staging = disk.staging();
    let attempts = tokio::task::block_in_place(|| staged_attempts(fs, &staging, &spec.load))?;
    let data_path = &disk.data_path;
    if let (Some(table), true) = (parts_in, dry_run) {
        // What the pass below drops; it reads each intent only once the directory is taken.
        for attempt in &attempts {
            removed.extend(
                drop_listed_parts(server, fs, table, data_path, attempt, true)
                    .await?
                    .removed,
            );
        }
    }
    let load_dir = staging.load_dir(&spec.load);
    let mut kept_staging = false;
    for attempt in &attempts {
        let dir = format!("{}/{}", load_dir.as_str(), attempt.attempt);
        if dry_run {
            removed.push(Removal::Staging { path: dir });
            continue;
        }
        // Take the directory away from a writer that may still be running (it passed the
        // fence before the load finished): once it is renamed, no part can go from it into
        // detached/ any more, and the publish intent inside lists every part that already went
        // (a writer writes its intent before its first rename).
        let taken = if attempt.attempt.starts_with(TAKEN_PREFIX) {
            // An earlier gc took it and stopped before removing it.
            listed_attempt(&load_dir, &attempt.attempt)?
        } else {
            let taken = listed_attempt(&load_dir, &format!("{TAKEN_PREFIX}{}", attempt.attempt))?;
            let to = taken.dir().as_str();
            match tokio::task::block_in_place(|| fs.rename_noreplace(&dir, to)) {
                Ok(()) => taken,
                Err(RemoteError::NotFound { .. }) => continue, // removed meanwhile
                Err(e) => return Err(remote(format!("rename {dir} to {to}"))(e)),
            }
        };
        if let Some(table) = parts_in {
            let taken_attempt = StagedAttempt {
                parts: tokio::task::block_in_place(|| read_intent(fs, &taken))?,
                ..attempt.clone()
            };
            let dropped =
                drop_listed_parts(server, fs, table, data_path, &taken_attempt, false).await?;
            removed.extend(dropped.removed);
            if dropped.held > 0 {
                // The intent is the only record that these parts are the attempt's: keep it
                // (in the taken directory, which the next gc finishes) until they are gone.
                kept_staging = true;
                tracing::warn!(
                    "load {}: attempt {}: {} part(s) are claimed by a running ATTACH (detached/attaching_*); kept {} for the next gc",
                    spec.load,
                    attempt.attempt,
                    dropped.held,
                    taken.dir()
                );
                continue;
            }
        }
        let taken = taken.dir();
        tokio::task::block_in_place(|| fs.remove_all(taken.as_str()))
            .map_err(remote(format!("remove {taken}")))?;
        removed.push(Removal::Staging { path: dir });
    }
    if !dry_run && !kept_staging {
        tokio::task::block_in_place(|| fs.remove_all(load_dir.as_str()))
            .map_err(remote(format!("remove {load_dir}")))?;
    }
    Ok(Cleaned {
        removed,
        kept: kept_staging,
    })
}

/// What [`drop_listed_parts`] did.
struct Dropped {
    /// Parts removed (or, with dry run, to remove).
    removed: Vec<Removal>,
    /// Listed parts a running ATTACH holds (`attaching_<part>`), left alone.
    held: usize,
}

/// Drops the parts an attempt's intent lists that are still in the publish table's detached/
/// (a finished load's with part visibility, whose publish table is the target), including
/// those a server killed inside an ATTACH left as `attaching_<part>`: the server refuses to
/// drop such a name, so a crashed claim (see `chpart_core::commit::claim_crashed`) is first
/// renamed back to its own name. A claim a running ATTACH may hold is left alone.
async fn drop_listed_parts(
    server: &dyn ClickHouseServer,
    fs: &dyn RemoteFs,
    table: &TableRef,
    data_path: &RemotePath,
    attempt: &StagedAttempt,
    dry_run: bool,
) -> Result<Dropped, CleanupError> {
    let (db, name) = (table.database.as_str(), table.table.as_str());
    let entries = server.detached_parts(db, name).await?;
    let present: BTreeSet<&str> = entries
        .iter()
        .filter(|d| d.reason.is_none())
        .map(|d| d.name.as_str())
        .collect();
    // Listed parts held as attaching_<part>, with the leftover's modification time.
    let claimed: Vec<(PartName, u64)> = entries
        .iter()
        .filter_map(|d| match chpart_core::parse_detached_entry(&d.name) {
            DetachedEntry::Reason {
                reason: "attaching",
                inner,
            } if attempt.parts.contains(&inner) => {
                inner.parse().ok().map(|p: PartName| (p, d.modified_unix))
            }
            _ => None,
        })
        .collect();
    let mut out = Dropped {
        removed: Vec::new(),
        held: 0,
    };
    let mut to_drop: Vec<String> = attempt
        .parts
        .iter()
        .filter(|p| present.contains(p.as_str()))
        .cloned()
        .collect();
    if !claimed.is_empty() {
        // Read after the observation above: see `claim_crashed`.
        let check = ClaimCheck::read(server, table).await?;
        for (part, modified) in claimed {
            if !check.crashed(modified) {
                out.held += 1;
                continue;
            }
            if !dry_run {
                let taken = tokio::task::block_in_place(|| reclaim(fs, data_path, &part))
                    .map_err(remote(format!("rename detached/attaching_{part} back")))?;
                if !taken {
                    continue; // another gc or commit took it meanwhile
                }
            }
            to_drop.push(part.to_string());
        }
    }
    for part in to_drop {
        if !dry_run {
            match server.drop_detached_part(db, name, &part).await {
                Ok(()) => {}
                Err(e) if e.code() == Some(code::BAD_DATA_PART_NAME) => {} // gone meanwhile
                Err(e) => return Err(e.into()),
            }
        }
        out.removed.push(Removal::DetachedPart {
            table: table.to_string(),
            part,
            attempt: attempt.attempt.clone(),
        });
    }
    Ok(out)
}

/// [`crate::api::abort_with`] of a load whose tables are on `server` (the ledger's, or a shard's).
pub async fn abort_on(
    ledger: &Ledger,
    server: &dyn ClickHouseServer,
    fs: &dyn RemoteFs,
    staging: &StagingLayout,
    load: &LoadId,
    force: bool,
) -> Result<Vec<Removal>, CleanupError> {
    let view = ledger.view(load, crate::KNOWN_KINDS).await?;
    let view =
        if force && view.state != LoadState::Committed && view.decision == Some(Decision::Commit) {
            let body = serde_json::json!({ "abandoned_at_unix_ms": now_unix_ms() }).to_string();
            ledger
                .append(
                    load,
                    crate::ledger::entry::ABANDON,
                    kind::LOAD_ABANDONED,
                    &body,
                )
                .await?;
            let view = ledger.view(load, crate::KNOWN_KINDS).await?;
            if view.state == LoadState::Committed {
                return Err(CleanupError::Committed(load.clone()));
            }
            view
        } else {
            match view.state {
                LoadState::Committed => return Err(CleanupError::Committed(load.clone())),
                LoadState::Open if commit_made_rows_visible(&view)? => {
                    return Err(CleanupError::CommitInProgress(load.clone()))
                }
                _ => {}
            }
            // Claim the load: a commit that claimed it first may be making rows visible right now.
            ledger.decide(load, Decision::Abort).await?;
            let view = ledger.view(load, crate::KNOWN_KINDS).await?;
            match (&view.state, view.decision) {
                (LoadState::Committed, _) => return Err(CleanupError::Committed(load.clone())),
                (_, Some(Decision::Commit)) => {
                    return Err(CleanupError::CommitInProgress(load.clone()))
                }
                _ => {}
            }
            let body = serde_json::json!({ "aborted_at_unix_ms": now_unix_ms() }).to_string();
            ledger
                .append(load, crate::ledger::entry::ABORT, kind::LOAD_ABORTED, &body)
                .await?;
            view
        };
    match &view.spec {
        Some(spec) => clean_finished_load(server, fs, staging, spec, false).await,
        None => Ok(Vec::new()),
    }
}

/// Whether a commit of this open load may already be making rows visible: it claimed the load,
/// or (ledgers without decisions) with part visibility
/// once any ATTACH was intended, with partition visibility once any partition publish was.
fn commit_made_rows_visible(view: &LoadView) -> Result<bool, CleanupError> {
    if view.decision == Some(Decision::Commit) {
        return Ok(true);
    }
    let progress = view.progress().map_err(LedgerStoreError::from)?;
    Ok(match view.spec.as_ref().map(|s| s.visibility) {
        Some(Visibility::Part) => {
            !progress.attach_intents.is_empty() || !progress.attached.is_empty()
        }
        Some(Visibility::Partition) => {
            !progress.publish_intents.is_empty() || !progress.published.is_empty()
        }
        None => false,
    })
}

/// What one gc run did.
#[derive(Debug, Clone, Serialize)]
pub struct GcReport {
    /// Removed (or, with dry run, to remove), per load.
    pub removed: Vec<(String, Vec<Removal>)>,
    /// Open loads older than the bound.
    pub stale_open: Vec<String>,
    /// Of those, aborted by this run.
    pub aborted: Vec<String>,
    /// Loads whose entries this run read: those its last checkpoint left pending, those
    /// written since, and those whose staging it found (not every load in the ledger).
    pub loads_read: usize,
    /// Finished loads this run recorded done (`gc_done`): later runs do not read them again.
    pub loads_done: usize,
}

/// How gc aborts a stale open load: the entry point's abort ([`crate::api::abort`]), which
/// reaches every shard of a cluster load.
pub trait AbortLoad: Sync {
    /// Aborts `load` as `chpart abort` does (without force).
    fn abort<'a>(&'a self, load: &'a LoadId) -> BoxFuture<'a, Result<Vec<Removal>, CleanupError>>;
}

/// Removes what finished loads left; reports (and with `abort_stale`, through it, aborts) open
/// loads begun more than `older_than_ms` ago. Never touches anything of an open load.
///
/// It reads only the loads the ledger says may still hold something ([`Ledger::unsettled_loads`]:
/// those its last checkpoint left pending and those with entries written since) and records,
/// after their removals, each finished load it left nothing of (a `gc_done` entry) and a
/// checkpoint of what is still pending, so its cost follows what is left to do, not the
/// ledger's size. A builder that passed its fence before its load finished is stopped by the
/// taking of its staging directory before the load is recorded done; one that read the load
/// open just before it finished and was killed before its fence check failed can only have
/// claimed a staging directory, never a part in `detached/`: every gc lists the staging roots
/// of the loads it reads and of the config, and removes such a directory of any finished load.
pub async fn gc(
    ledger: &Ledger,
    reach: &dyn Reach,
    fs: &dyn RemoteFs,
    staging: &StagingLayout,
    older_than_ms: Option<u64>,
    abort_stale: Option<&dyn AbortLoad>,
    dry_run: bool,
) -> Result<GcReport, CleanupError> {
    let looked = std::time::Instant::now();
    let places = Places::new(ledger, reach, fs, staging);
    // Ages are measured on the ledger server's clock, as `opened_at_unix_ms` is: a driver
    // minutes off it must neither abort a load just begun nor spare a stale one.
    let now_ms = match older_than_ms {
        Some(_) => ledger.server_now_ms().await?,
        None => 0,
    };
    let mut run = GcRun {
        now_ms,
        older_than_ms,
        abort_stale,
        dry_run,
        roots: StagingRoots::new(&places),
        pending: Vec::new(),
        done: Vec::new(),
        report: GcReport {
            removed: Vec::new(),
            stale_open: Vec::new(),
            aborted: Vec::new(),
            loads_read: 0,
            loads_done: 0,
        },
    };
    let unsettled = ledger.unsettled_loads().await?;
    let loads: Vec<String> = unsettled.loads.iter().cloned().collect();
    // A few loads' entries in memory at a time (the first run over a large ledger reads them
    // all), and what is done recorded as it goes.
    for chunk in loads.chunks(LOADS_PER_STATEMENT) {
        let views = ledger.views(chunk).await?;
        run.report.loads_read += views.len();
        run.visit(&places, &views).await?;
        if !dry_run && run.done.len() >= LOADS_PER_STATEMENT {
            ledger.record_gc(&run.done, None).await?;
            run.report.loads_done += run.done.len();
            run.done.clear();
        }
    }
    let swept = sweep(&places, &run.roots, &unsettled.loads, dry_run).await?;
    let mut report = run.report;
    report.loads_read += swept.read;
    report.removed.extend(swept.removed);
    if !dry_run {
        let checkpoint = GcCheckpoint {
            pending: run.pending,
            looked_ms_before_written: u64::try_from(looked.elapsed().as_millis())
                .unwrap_or(u64::MAX),
        };
        ledger.record_gc(&run.done, Some(&checkpoint)).await?;
        report.loads_done += run.done.len();
    }
    Ok(report)
}

/// One gc run: its options and what it found so far.
struct GcRun<'a> {
    /// When the run started, on the ledger server's clock (read only with `older_than_ms`).
    now_ms: u64,
    older_than_ms: Option<u64>,
    abort_stale: Option<&'a dyn AbortLoad>,
    dry_run: bool,
    /// The staging roots of the loads read, for [`sweep`].
    roots: StagingRoots,
    /// Loads the checkpoint will list: open ones, and finished ones something had to stay of.
    pending: Vec<String>,
    /// Finished loads left with nothing, not yet recorded: `(load, gc_done body)`.
    done: Vec<(String, String)>,
    report: GcReport,
}

impl GcRun<'_> {
    /// Removes (or lists) what the finished loads of `views` left; each one left with nothing
    /// goes to `done`, open loads and those that kept something to `pending`.
    async fn visit(
        &mut self,
        places: &Places<'_>,
        views: &BTreeMap<String, LoadView>,
    ) -> Result<(), CleanupError> {
        let now = self.now_ms;
        for (load_id, view) in views {
            let Ok(load) = load_id.parse::<LoadId>() else {
                continue;
            };
            if let Some(spec) = &view.spec {
                self.roots.note(places, spec)?;
            }
            if view.gc_done().is_some() {
                continue; // finished, and everything of it removed: nothing can come back
            }
            match (&view.state, &view.spec) {
                (LoadState::Committed | LoadState::Aborted, Some(spec)) => {
                    let (server, fs, staging) = places.of(spec)?;
                    let cleaned =
                        clean(server.as_ref(), fs.get(), &staging, spec, self.dry_run).await?;
                    if !cleaned.removed.is_empty() {
                        self.report.removed.push((load_id.clone(), cleaned.removed));
                    }
                    if cleaned.kept {
                        self.pending.push(load_id.clone());
                    } else {
                        self.done
                            .push((load_id.clone(), done_body(places, &load, view).await?));
                    }
                }
                // Aborted before it was begun: it never had anything to remove.
                (LoadState::Committed | LoadState::Aborted, None) => {
                    self.done
                        .push((load_id.clone(), done_body(places, &load, view).await?));
                }
                // A shard's sub-load ends with its cluster load, which the branch below aborts.
                (LoadState::Open, Some(spec)) if spec.shard_of.is_some() => {
                    self.pending.push(load_id.clone())
                }
                (LoadState::Open, spec) => {
                    self.pending.push(load_id.clone());
                    let Some(spec) = spec else { continue };
                    let stale = self
                        .older_than_ms
                        .is_some_and(|age| now.saturating_sub(spec.opened_at_unix_ms) > age);
                    if !stale {
                        continue;
                    }
                    self.report.stale_open.push(load_id.clone());
                    let Some(aborter) = self.abort_stale else {
                        continue;
                    };
                    if !self.dry_run && !commit_made_rows_visible(view)? {
                        match aborter.abort(&spec.load).await {
                            Ok(removed) => {
                                self.report.aborted.push(load_id.clone());
                                self.report.removed.push((load_id.clone(), removed));
                            }
                            // A commit claimed it meanwhile: it is not stale any more.
                            Err(CleanupError::CommitInProgress(_) | CleanupError::Committed(_)) => {
                                tracing::info!("load {load_id}: a commit claimed it; not aborted");
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
                (LoadState::Unknown, _) => {}
            }
        }
        Ok(())
    }
}

/// The body of the `gc_done` entry of a finished load: its status from the ledger.
async fn done_body(
    places: &Places<'_>,
    load: &LoadId,
    view: &LoadView,
) -> Result<String, CleanupError> {
    let status = load_status(places, load, view, false).await?;
    Ok(serde_json::to_string(&status).expect("a status serializes"))
}

/// The staging roots gc lists: the configured one, and every disk's of the loads it read (on
/// their hosts), each with a load whose spec reaches it (`None`: the configured filesystem).
struct StagingRoots {
    /// `(host of a shard, or None for the configured filesystem; root)` -> a load reaching it.
    roots: BTreeMap<(Option<String>, String), Option<LoadSpec>>,
}

impl StagingRoots {
    fn new(places: &Places<'_>) -> StagingRoots {
        let configured = (None, places.staging.root().as_str().to_owned());
        StagingRoots {
            roots: BTreeMap::from([(configured, None)]),
        }
    }

    fn note(&mut self, places: &Places<'_>, spec: &LoadSpec) -> Result<(), CleanupError> {
        if spec.cluster.is_some() {
            return Ok(()); // its shards' sub-loads stage
        }
        let staging = match &spec.shard_of {
            None => places.staging.clone(),
            Some(_) => StagingLayout::new(places.reach.staging(&spec.host).single.as_str())
                .expect("a RemotePath is a valid staging root"),
        };
        for disk in disks_of(spec, &staging)? {
            let host = spec.shard_of.as_ref().map(|_| spec.host.clone());
            self.roots
                .entry((host, disk.staging_root.as_str().to_owned()))
                .or_insert_with(|| Some(spec.clone()));
        }
        Ok(())
    }
}

/// What [`sweep`] did.
struct Swept {
    removed: Vec<(String, Vec<Removal>)>,
    read: usize,
}

/// Lists the staging roots for directories of loads gc did not read (`visited`), and cleans
/// those of finished loads: what a builder that read its load open just before it finished,
/// and was killed before its fence check failed, can have left after gc recorded the load
/// done. A directory of a load the ledger does not know (pruned, or another ledger's) is left.
async fn sweep(
    places: &Places<'_>,
    roots: &StagingRoots,
    visited: &BTreeSet<String>,
    dry_run: bool,
) -> Result<Swept, CleanupError> {
    let mut found = BTreeSet::new();
    for ((host, root), spec) in &roots.roots {
        // A safety net, not what gc is for: a root that cannot be listed now (a shard's host
        // down) is listed by a later run, and gc goes on.
        let listed = match spec {
            None => tokio::task::block_in_place(|| places.fs.list_dir(root))
                .map_err(remote(format!("list {root}"))),
            Some(spec) => places
                .of(spec)
                .map_err(CleanupError::from)
                .and_then(|(_, fs, _)| {
                    tokio::task::block_in_place(|| fs.get().list_dir(root))
                        .map_err(remote(format!("list {root}")))
                }),
        };
        let entries = match listed {
            Ok(entries) => entries,
            Err(
                CleanupError::Remote { source, .. }
                | CleanupError::Scan(ScanError::Remote { source, .. }),
            ) if matches!(*source, RemoteError::NotFound { .. }) => continue,
            Err(e) => {
                tracing::warn!(
                    "gc: staging root {root}{} not listed ({e}); a later gc lists it",
                    host.as_deref()
                        .map(|h| format!(" on {h}"))
                        .unwrap_or_default()
                );
                continue;
            }
        };
        for entry in entries {
            if entry.name.parse::<LoadId>().is_ok() && !visited.contains(&entry.name) {
                found.insert(entry.name);
            }
        }
    }
    let mut swept = Swept {
        removed: Vec::new(),
        read: 0,
    };
    if found.is_empty() {
        return Ok(swept);
    }
    let views = places
        .ledger
        .views(&found.into_iter().collect::<Vec<_>>())
        .await?;
    swept.read = views.len();
    for (load_id, view) in views {
        let (true, Some(spec)) = (view.finished(), &view.spec) else {
            continue;
        };
        let (server, fs, staging) = places.of(spec)?;
        let removed = clean(server.as_ref(), fs.get(), &staging, spec, dry_run)
            .await?
            .removed;
        if !removed.is_empty() {
            tracing::info!("load {load_id}: staging left after gc recorded it done");
            swept.removed.push((load_id, removed));
        }
    }
    Ok(swept)
}
