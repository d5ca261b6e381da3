//! The staging scan: what the attempts of a load left under its staging directories (their
//! publish intents, whether they wrote a manifest), on every disk it published to, and where a
//! load's tables and files are (the configured server, or a shard's). Read by status, gc,
//! abort and the timeline; nothing here removes anything.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use chpart_core::{DiskPlace, LoadId, PartName, StagingLayout};
use chpart_remote::{RemoteError, RemoteFs};
use chpart_server::SharedServer;
use serde::{Deserialize, Serialize};

use crate::ledger::LoadSpec;
use crate::reach::Reach;
use crate::store::Ledger;

/// Why a scan failed.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// The load's spec names a data path that is no absolute path.
    #[error("load {load}: publish table data path: {source}")]
    BadSpec {
        /// The load.
        load: LoadId,
        /// Why.
        source: chpart_core::PathError,
    },
    /// The filesystem failed.
    #[error("{op}: {source}")]
    Remote {
        /// What was being done.
        op: String,
        /// The error.
        source: Box<RemoteError>,
    },
}

fn remote(op: impl Into<String>) -> impl FnOnce(RemoteError) -> ScanError {
    let op = op.into();
    move |e| ScanError::Remote {
        op,
        source: Box::new(e),
    }
}

/// What an attempt left in staging: its id and the detached names its intent lists.
#[derive(Debug, Clone, Serialize)]
pub struct StagedAttempt {
    /// The attempt id (the staging directory's name).
    pub attempt: String,
    /// Whether it wrote its manifest (it completed).
    pub has_manifest: bool,
    /// Part names its publish intent lists.
    pub parts: Vec<String>,
}

#[derive(Deserialize)]
struct Intent {
    detached: Vec<String>,
}

/// Prefix of an attempt's staging directory that gc has taken away from its writer.
pub(crate) const TAKEN_PREFIX: &str = ".gc.";

/// Attempts found under `<staging>/<load>/` (including directories an interrupted gc took).
pub fn staged_attempts(
    fs: &dyn RemoteFs,
    staging: &StagingLayout,
    load: &LoadId,
) -> Result<Vec<StagedAttempt>, ScanError> {
    let dir = staging.load_dir(load);
    let entries = match fs.list_dir(dir.as_str()) {
        Ok(entries) => entries,
        Err(RemoteError::NotFound { .. }) => return Ok(Vec::new()),
        Err(e) => return Err(remote(format!("list {dir}"))(e)),
    };
    let mut out = Vec::new();
    // By name: an earlier gc's taken-away directories (".gc.<attempt>") come first.
    let mut entries = entries;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for entry in entries {
        let attempt_dir = format!("{}/{}", dir.as_str(), entry.name);
        out.push(StagedAttempt {
            has_manifest: fs
                .stat(&format!("{attempt_dir}/manifest.json"))
                .map_err(remote("stat manifest"))?
                .is_some(),
            parts: read_intent(fs, &format!("{attempt_dir}/publish-intent.json"))?,
            attempt: entry.name,
        });
    }
    Ok(out)
}

pub(crate) fn read_intent(fs: &dyn RemoteFs, path: &str) -> Result<Vec<String>, ScanError> {
    match fs.read_file(path) {
        Ok(bytes) => Ok(serde_json::from_slice::<Intent>(&bytes)
            .map(|i| {
                i.detached
                    .iter()
                    .filter_map(|p| p.rsplit('/').next())
                    .filter(|n| n.parse::<PartName>().is_ok())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()),
        Err(RemoteError::NotFound { .. }) => Ok(Vec::new()),
        Err(e) => Err(remote(format!("read {path}"))(e)),
    }
}

/// The disks a load published to, each with its staging root (the configured `staging` for
/// loads begun before chpart recorded them).
pub(crate) fn disks_of(
    spec: &LoadSpec,
    staging: &StagingLayout,
) -> Result<Vec<DiskPlace>, ScanError> {
    spec.destination(staging)
        .map(|d| d.disks)
        .map_err(|source| ScanError::BadSpec {
            load: spec.load.clone(),
            source,
        })
}

/// Attempts found in the load's staging on every disk, one entry per attempt (an attempt that
/// published on several disks has a directory on each: its manifest is on one, its parts are
/// counted on all).
pub(crate) fn staged_attempts_on_disks(
    fs: &dyn RemoteFs,
    disks: &[DiskPlace],
    load: &LoadId,
) -> Result<Vec<StagedAttempt>, ScanError> {
    let mut out: Vec<StagedAttempt> = Vec::new();
    for disk in disks {
        for attempt in staged_attempts(fs, &disk.staging(), load)? {
            match out.iter_mut().find(|a| a.attempt == attempt.attempt) {
                Some(seen) => {
                    seen.has_manifest |= attempt.has_manifest;
                    seen.parts.extend(attempt.parts);
                }
                None => out.push(attempt),
            }
        }
    }
    Ok(out)
}

/// Where a load's tables and files are, for status and gc: the ledger's server and the
/// configured filesystem, or for a shard's sub-load that shard's server and host (one
/// connection per host, opened when first needed).
pub(crate) struct Places<'a> {
    pub(crate) ledger: &'a Ledger,
    pub(crate) reach: &'a dyn Reach,
    pub(crate) fs: &'a dyn RemoteFs,
    pub(crate) staging: &'a StagingLayout,
    hosts: Mutex<BTreeMap<String, Arc<dyn RemoteFs>>>,
}

/// A filesystem [`Places`] hands out.
pub(crate) enum FsOf<'a> {
    Configured(&'a dyn RemoteFs),
    Host(Arc<dyn RemoteFs>),
}

impl FsOf<'_> {
    pub(crate) fn get(&self) -> &dyn RemoteFs {
        match self {
            FsOf::Configured(fs) => *fs,
            FsOf::Host(fs) => fs.as_ref(),
        }
    }
}

impl<'a> Places<'a> {
    pub(crate) fn new(
        ledger: &'a Ledger,
        reach: &'a dyn Reach,
        fs: &'a dyn RemoteFs,
        staging: &'a StagingLayout,
    ) -> Places<'a> {
        Places {
            ledger,
            reach,
            fs,
            staging,
            hosts: Mutex::new(BTreeMap::new()),
        }
    }

    /// The server, filesystem and configured staging root of `spec`'s tables.
    pub(crate) fn of(
        &self,
        spec: &LoadSpec,
    ) -> Result<(SharedServer, FsOf<'a>, StagingLayout), ScanError> {
        let Some(of) = &spec.shard_of else {
            return Ok((
                self.ledger.shared_server(),
                FsOf::Configured(self.fs),
                self.staging.clone(),
            ));
        };
        let host = &spec.host;
        let mut hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        let fs = match hosts.get(host) {
            Some(fs) => fs.clone(),
            None => {
                let fs = tokio::task::block_in_place(|| self.reach.connect(host, 1))
                    .map_err(remote(format!(
                        "connect to shard {} ({host}) of load {}",
                        of.shard_num, of.parent
                    )))?
                    .remove(0);
                hosts.insert(host.clone(), fs.clone());
                fs
            }
        };
        let staging = StagingLayout::new(self.reach.staging(host).single.as_str())
            .expect("a RemotePath is a valid staging root");
        Ok((self.reach.server(&of.url), FsOf::Host(fs), staging))
    }
}
