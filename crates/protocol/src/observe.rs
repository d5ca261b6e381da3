//! What the server and its filesystem say right now: the facts commit, abort and gc decide from.
//!
//! Nothing here changes anything. Decisions are made by the pure functions in
//! `chpart_core::commit` from these observations and the ledger, and every decision after a
//! crash or a timeout starts with a fresh observation.

use std::collections::{BTreeMap, HashMap, HashSet};

use chpart_core::manifest::PartEntry;
use chpart_core::{DetachedEntry, RemotePath, TableRef};
use chpart_remote::{FileKind, RemoteError, RemoteFs};
use chpart_server::{ClickHouseServer, ServerError};

/// A table's parts as the server reports them.
#[derive(Debug, Default, Clone)]
pub struct TableParts {
    /// Plain entries of `detached/` (no reason prefix), by directory name.
    pub detached: HashSet<String>,
    /// Names whose `attaching_<name>` directory exists: an ATTACH in flight, or a crashed one.
    pub attaching: HashSet<String>,
    /// When each `attaching_<name>` directory was last modified (unix seconds).
    pub attaching_modified: HashMap<String, u64>,
    /// Active parts' `hash_of_all_files`, with how many active parts have it.
    pub active_hashes: HashMap<String, u32>,
    /// Active rows per partition id.
    pub rows_by_partition: HashMap<String, u64>,
    /// Active parts' hashes per partition id.
    pub hashes_by_partition: HashMap<String, Vec<String>>,
    /// Partition ids with an active part of level > 0: the server merged parts there.
    pub merged_partitions: HashSet<String>,
    /// Active parts per partition id.
    pub parts_by_partition: HashMap<String, Vec<ActivePart>>,
}

/// An active part as `system.parts` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivePart {
    /// Its name in the table.
    pub name: String,
    /// Its `hash_of_all_files`.
    pub hash: String,
    /// Its rows.
    pub rows: u64,
    /// Its merge level (0: never merged).
    pub level: u64,
    /// The highest block number it covers.
    pub max_block: u64,
}

/// Reads `system.detached_parts` and the active `system.parts` of `table` (one query).
pub async fn table_parts(
    server: &dyn ClickHouseServer,
    table: &TableRef,
) -> Result<TableParts, ServerError> {
    let (db, name) = (table.database.as_str(), table.table.as_str());
    let mut out = TableParts::default();
    for row in server.table_state(db, name).await? {
        if row.detached {
            match chpart_core::parse_detached_entry(&row.name) {
                DetachedEntry::Reason {
                    reason: "attaching",
                    inner,
                } => {
                    out.attaching_modified
                        .insert(inner.clone(), row.modified_unix);
                    out.attaching.insert(inner);
                }
                DetachedEntry::Part(_) if row.reason.is_empty() => {
                    out.detached.insert(row.name);
                }
                _ => {}
            }
            continue;
        }
        *out.active_hashes
            .entry(row.hash_of_all_files.clone())
            .or_default() += 1;
        *out.rows_by_partition
            .entry(row.partition_id.clone())
            .or_default() += row.rows;
        if row.level > 0 {
            out.merged_partitions.insert(row.partition_id.clone());
        }
        out.parts_by_partition
            .entry(row.partition_id.clone())
            .or_default()
            .push(ActivePart {
                name: row.name,
                hash: row.hash_of_all_files.clone(),
                rows: row.rows,
                level: row.level,
                max_block: row.max_block,
            });
        out.hashes_by_partition
            .entry(row.partition_id)
            .or_default()
            .push(row.hash_of_all_files);
    }
    for hashes in out.hashes_by_partition.values_mut() {
        hashes.sort();
    }
    Ok(out)
}

/// What tells a crashed ATTACH's claim (`detached/attaching_<name>`) from a live one, read
/// *after* the table was observed (see `chpart_core::commit::claim_crashed` for why that order
/// makes "no ATTACH running" a proof).
#[derive(Debug, Clone, Copy)]
pub struct ClaimCheck {
    /// When the running server started (unix seconds).
    pub server_started_unix: u64,
    /// An ATTACH query on the table is running.
    pub attach_running: bool,
}

impl ClaimCheck {
    /// Reads the server's start time and the ATTACHes running on `table`. Call it after
    /// observing `table`, and only when that observation holds a leftover to decide.
    pub async fn read(
        server: &dyn ClickHouseServer,
        table: &TableRef,
    ) -> Result<ClaimCheck, ServerError> {
        let activity = server.attach_activity(table.table.as_str()).await?;
        Ok(ClaimCheck {
            server_started_unix: activity.started_unix,
            attach_running: activity.attaching > 0,
        })
    }

    /// Whether a leftover last modified at `modified_unix` was modified no later than the
    /// server started (whole seconds on both sides, so `<=`: a crashed claim always passes).
    pub fn predates_server_start(&self, modified_unix: u64) -> bool {
        modified_unix <= self.server_started_unix
    }

    /// Whether a leftover last modified at `modified_unix` is a crashed claim nothing holds.
    pub fn crashed(&self, modified_unix: u64) -> bool {
        chpart_core::commit::claim_crashed(
            self.predates_server_start(modified_unix),
            self.attach_running,
        )
    }
}

/// Renames a crashed claim `detached/attaching_<name>` back to `detached/<name>` (never over an
/// existing directory). `Ok(false)` when another process got there first (the leftover is gone,
/// or `<name>` exists again): the caller observes again.
pub fn reclaim(
    fs: &dyn RemoteFs,
    data_path: &RemotePath,
    name: &chpart_core::PartName,
) -> Result<bool, RemoteError> {
    let from = chpart_core::attaching_part_path(data_path, name);
    let to = chpart_core::detached_part_path(data_path, name);
    match fs.rename_noreplace(from.as_str(), to.as_str()) {
        Ok(()) => Ok(true),
        Err(RemoteError::NotFound { .. } | RemoteError::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// How thoroughly a published part is compared with its manifest before anything of it becomes
/// visible. ClickHouse's ATTACH itself only compares file sizes with `checksums.txt`, so a
/// flipped byte would attach and then make every query over the table fail (`Code: 40 ...
/// Checksum doesn't match`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Every file present with the manifest's size (metadata only): no content check. Opt-in.
    Sizes,
    /// Sizes on the host before ATTACH, then, with the parts attached into the load's shadow
    /// table and before any partition is published, `CHECK TABLE` on the server (every file
    /// against `checksums.txt`) and each part's `hash_of_all_files` (the digest of its
    /// `checksums.txt`) against the manifest. The default for partition visibility.
    Server,
    /// Every file's sha256 recomputed on the host before ATTACH (reads every byte back). The
    /// default for part visibility, where an attached part is already visible.
    Full,
}

impl Verify {
    /// The default for a load's visibility.
    pub fn default_for(visibility: crate::ledger::Visibility) -> Verify {
        match visibility {
            crate::ledger::Visibility::Partition => Verify::Server,
            crate::ledger::Visibility::Part => Verify::Full,
        }
    }
}

/// A published part that is not what its manifest says.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Files differ.
    #[error("part {part} of attempt {attempt} at {path}: {problem}")]
    Mismatch {
        /// The part.
        part: String,
        /// Its attempt.
        attempt: String,
        /// Its directory.
        path: String,
        /// What differs.
        problem: String,
    },
    /// The filesystem failed.
    #[error("verifying part {part} at {path}: {source}")]
    Remote {
        /// The part.
        part: String,
        /// Its directory.
        path: String,
        /// The error.
        #[source]
        source: Box<RemoteError>,
    },
}

/// Relative path -> size of every file under `dir`, recursively (projections are subdirectories).
pub fn remote_file_sizes(
    fs: &dyn RemoteFs,
    dir: &str,
) -> Result<BTreeMap<String, u64>, RemoteError> {
    let mut out = BTreeMap::new();
    let mut pending = vec![String::new()];
    while let Some(rel) = pending.pop() {
        let path = if rel.is_empty() {
            dir.to_owned()
        } else {
            format!("{dir}/{rel}")
        };
        for entry in fs.list_dir(&path)? {
            let child = if rel.is_empty() {
                entry.name.clone()
            } else {
                format!("{rel}/{}", entry.name)
            };
            match entry.stat.kind {
                FileKind::Dir => pending.push(child),
                _ => {
                    out.insert(child, entry.stat.size);
                }
            }
        }
    }
    Ok(out)
}

/// Compares the part published at `data_path/detached/<name>` with its manifest entry.
pub fn verify_part(
    fs: &dyn RemoteFs,
    data_path: &RemotePath,
    attempt: &str,
    part: &PartEntry,
    verify: Verify,
) -> Result<(), VerifyError> {
    let path = chpart_core::detached_part_path(data_path, &part.name)
        .as_str()
        .to_owned();
    let mismatch = |problem: String| VerifyError::Mismatch {
        part: part.name.to_string(),
        attempt: attempt.to_owned(),
        path: path.clone(),
        problem,
    };
    let remote_err = |e: RemoteError| VerifyError::Remote {
        part: part.name.to_string(),
        path: path.clone(),
        source: Box::new(e),
    };
    let want: BTreeMap<&str, (u64, &str)> = part
        .files
        .iter()
        .map(|f| (f.path.as_str(), (f.size, f.sha256.as_str())))
        .collect();
    match verify {
        Verify::Sizes | Verify::Server => {
            let have = remote_file_sizes(fs, &path).map_err(remote_err)?;
            compare(&want, have.iter().map(|(p, s)| (p.as_str(), *s, None))).map_err(mismatch)
        }
        Verify::Full => {
            let have = fs.digest_dir(&path).map_err(remote_err)?;
            compare(
                &want,
                have.iter()
                    .map(|(p, (s, h))| (p.as_str(), *s, Some(h.as_str()))),
            )
            .map_err(mismatch)
        }
    }
}

fn compare<'a>(
    want: &BTreeMap<&str, (u64, &str)>,
    have: impl Iterator<Item = (&'a str, u64, Option<&'a str>)>,
) -> Result<(), String> {
    let mut seen = 0;
    for (path, size, sha) in have {
        let Some((want_size, want_sha)) = want.get(path) else {
            return Err(format!("file {path} is not in the manifest"));
        };
        seen += 1;
        if size != *want_size {
            return Err(format!(
                "file {path} has {size} bytes, the manifest says {want_size}"
            ));
        }
        if let Some(sha) = sha {
            if sha != *want_sha {
                return Err(format!("file {path} has sha256 {sha}, the manifest says {want_sha} (changed after upload)"));
            }
        }
    }
    if seen != want.len() {
        return Err(format!(
            "{} of the manifest's {} files are missing",
            want.len() - seen,
            want.len()
        ));
    }
    Ok(())
}
