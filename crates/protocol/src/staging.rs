//! The staging scan: what the attempts of a load left under its staging directories (their
//! publish intents, whether they wrote a manifest), on every disk it published to, and where a
//! load's tables and files are (the configured server, or a shard's). Read by status, gc,
//! abort and the timeline; nothing here removes anything.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use chpart_core::{
    AttemptStaging, DiskPlace, IntentError, LoadId, PathError, PublishIntent, RemotePath,
    StagingLayout,
};
use chpart_remote::{RemoteError, RemoteFs};
use chpart_server::SharedServer;
use serde::Serialize;

use crate::ledger::LoadSpec;
use crate::reach::Reach;
use crate::store::Ledger;
use crate::FailureKind;

/// Why a scan failed.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// The load's spec names a data path that is no absolute path.
    #[error("load {load}: publish table data path: {source}")]
    BadSpec {
        /// The load.
        load: LoadId,
        /// Why.
        source: PathError,
    },
    /// An entry of a load's staging directory whose name is no single path component.
    #[error("staging entry in {dir}: {source}")]
    BadEntry {
        /// The load's staging directory.
        dir: RemotePath,
        /// Why.
        source: PathError,
    },
    /// A publish intent that exists but does not parse. It is the only record of which parts
    /// in `detached/` are the attempt's, so nothing of the attempt is removed until it is fixed.
    #[error("publish intent {path} is corrupt ({source}); nothing of its attempt is removed until it lists the attempt's parts again")]
    BadIntent {
        /// The intent's path.
        path: RemotePath,
        /// What is wrong with it.
        source: Box<IntentError>,
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

impl ScanError {
    /// What the failure means for the caller.
    pub fn kind(&self) -> FailureKind {
        match self {
            ScanError::Remote { source, .. } if source.is_transient() => FailureKind::Retryable,
            _ => FailureKind::Permanent,
        }
    }
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
        let attempt_dir = listed_attempt(&dir, &entry.name)?;
        out.push(StagedAttempt {
            has_manifest: fs
                .stat(attempt_dir.manifest().as_str())
                .map_err(remote("stat manifest"))?
                .is_some(),
            parts: read_intent(fs, &attempt_dir)?,
            attempt: entry.name,
        });
    }
    Ok(out)
}

/// The paths of the attempt directory `name` found by listing `load_dir` (which may be one
/// gc took, see [`TAKEN_PREFIX`]).
pub(crate) fn listed_attempt(
    load_dir: &RemotePath,
    name: &str,
) -> Result<AttemptStaging, ScanError> {
    load_dir
        .join(name)
        .map(AttemptStaging::in_dir)
        .map_err(|source| ScanError::BadEntry {
            dir: load_dir.clone(),
            source,
        })
}

/// The part names the attempt's publish intent lists: none if it wrote none (it published
/// nothing), an error if the intent exists but does not parse.
pub(crate) fn read_intent(
    fs: &dyn RemoteFs,
    attempt: &AttemptStaging,
) -> Result<Vec<String>, ScanError> {
    let path = attempt.publish_intent();
    match fs.read_file(path.as_str()) {
        Ok(bytes) => PublishIntent::from_json(&bytes)
            .and_then(|intent| intent.part_names())
            .map(|names| names.iter().map(ToString::to_string).collect())
            .map_err(|source| ScanError::BadIntent {
                path,
                source: Box::new(source),
            }),
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

#[cfg(test)]
mod tests {
    use chpart_core::{AttemptId, LoadId};
    use chpart_remote::LocalFs;

    use super::*;

    #[test]
    fn read_intent_refuses_a_corrupt_intent_and_reads_a_missing_one_as_empty() {
        let root = tempfile::tempdir().unwrap();
        let layout = StagingLayout::new(root.path().to_str().unwrap()).unwrap();
        let (load, attempt): (LoadId, AttemptId) = ("L".parse().unwrap(), "A".parse().unwrap());
        let staged = layout.attempt(&load, &attempt);
        std::fs::create_dir_all(staged.dir().as_str()).unwrap();
        let fs = LocalFs::new();
        assert!(read_intent(&fs, &staged).unwrap().is_empty(), "no intent");

        std::fs::write(staged.publish_intent().as_str(), "garbage").unwrap();
        let err = read_intent(&fs, &staged).unwrap_err();
        assert!(matches!(err, ScanError::BadIntent { .. }), "{err:?}");
        assert!(
            err.to_string().contains(staged.publish_intent().as_str()),
            "names the file: {err}"
        );
        let err = staged_attempts(&fs, &layout, &load).unwrap_err();
        assert!(matches!(err, ScanError::BadIntent { .. }), "{err:?}");
    }
}
