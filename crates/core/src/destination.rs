//! Where a load's parts go: the disks of the publish table on one server, each with the
//! table's data path on that disk and a staging root on the same filesystem.
//!
//! A table under a storage policy of several disks has one data directory per disk
//! (`system.tables.data_paths`), each with its own `detached/`, and ATTACH PART takes a part on
//! the disk whose `detached/` holds it, without copying. A part must therefore be staged on the
//! filesystem of the disk it will live on (publishing is a rename, which fails across
//! filesystems), so every disk parts may go to has a staging root of its own. `begin` resolves
//! them once ([`publish_disks`]) and records them in the load's spec, so every executor, the
//! driver and gc agree on them whatever their own configs say.
//!
//! Parts go to the disks of the policy's first volume (where the server puts an INSERT's parts)
//! that are local filesystems; a later volume (colder disks, object storage) receives them by
//! the table's own TTL and move rules, as it would after an INSERT. An attempt spreads its parts
//! over those disks round robin ([`Destination::disk_for`]), starting at a disk derived from the
//! attempt so that attempts with one part each spread too.
//!
//! Part names are unique per (load, attempt, partition, seq) whatever the disk, so one name is
//! never in two disks' `detached/` (the same name on two disks would be attached twice).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::canon::Canon;
use crate::ids::{AttemptId, LoadId};
use crate::staging::{RemotePath, StagingLayout};

/// The name of a disk (`system.disks.name`).
pub type DiskName = String;

/// One disk a load publishes parts to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskPlace {
    /// The disk (`system.disks.name`).
    pub disk: DiskName,
    /// The publish table's data directory on that disk; parts are published into its
    /// `detached/`.
    pub data_path: RemotePath,
    /// The staging root on the same filesystem: attempts stage parts for this disk under
    /// `<staging_root>/<load>/<attempt>/`.
    pub staging_root: RemotePath,
}

impl DiskPlace {
    /// The staging layout under this disk's root.
    pub fn staging(&self) -> StagingLayout {
        StagingLayout::new(self.staging_root.as_str())
            .expect("a RemotePath is a valid staging root")
    }
}

/// The disks of one server a load publishes to, the first being the attempts' home (where
/// each attempt's manifest is written).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    /// The host name recorded in manifests.
    pub host: String,
    /// At least one disk, in the storage policy's order.
    pub disks: Vec<DiskPlace>,
}

impl Destination {
    /// The home disk: every attempt writes its manifest under this disk's staging root.
    pub fn home(&self) -> &DiskPlace {
        &self.disks[0]
    }

    /// The disk named `disk`, if the load publishes to it.
    pub fn disk(&self, disk: &str) -> Option<&DiskPlace> {
        self.disks.iter().find(|d| d.disk == disk)
    }

    /// The disk part number `seq` of `attempt` goes to (see [`disk_index`]).
    pub fn disk_for(&self, load: &LoadId, attempt: &AttemptId, seq: u32) -> &DiskPlace {
        &self.disks[disk_index(load, attempt, seq, self.disks.len())]
    }
}

/// Which of `disks` disks (in the destination's order) part number `seq` of `attempt` goes to:
/// round robin over them, starting at one derived from (load, attempt). Deterministic, so a
/// resumed or re-read attempt agrees with itself.
pub fn disk_index(load: &LoadId, attempt: &AttemptId, seq: u32, disks: usize) -> usize {
    let n = disks.max(1) as u64;
    if n == 1 {
        return 0;
    }
    let mut canon = Canon::new("chpart-disk-offset-v1");
    canon.str(load.as_str()).str(attempt.as_str());
    let digest = canon.finish();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let offset = u64::from_be_bytes(first) % n;
    ((offset + u64::from(seq)) % n) as usize
}

/// A disk as the server describes it (`system.disks`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskInfo {
    /// Its name.
    pub name: DiskName,
    /// Its root path, ending in `/` (`system.disks.path`).
    pub path: String,
    /// Whether it is a local filesystem (`type = 'Local'` and not remote); only such a disk's
    /// `detached/` can take a part built elsewhere (an object-storage disk's directories hold
    /// metadata that points at objects).
    pub local: bool,
}

/// One volume of a storage policy (`system.storage_policies`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Its name.
    pub name: String,
    /// Its priority (1 = where inserts go first).
    pub priority: u64,
    /// Its disks, in order.
    pub disks: Vec<DiskName>,
}

/// Where stagings go, from the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagingRoots {
    /// The root for a table stored on one disk (`staging.root`).
    pub single: RemotePath,
    /// Roots per disk for tables on several (`staging.disk_roots`); a disk not listed stages
    /// under `<disk path>/chpart-staging`.
    pub per_disk: Vec<(DiskName, RemotePath)>,
}

/// The directory, below a disk's path, where its parts are staged unless configured.
pub const DEFAULT_DISK_STAGING_DIR: &str = "chpart-staging";

/// Why a table's disks cannot take parts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    /// The server lists no data path for the table.
    #[error("the server reports no data path for the table")]
    NoDataPath,
    /// A data path under no known disk.
    #[error("data path {data_path} is under none of the server's disks ({disks})")]
    UnknownDisk {
        /// The data path.
        data_path: String,
        /// The disks and their paths.
        disks: String,
    },
    /// A path the server reported is not an absolute POSIX path.
    #[error("{what} {path}: {message}")]
    BadPath {
        /// Which path.
        what: &'static str,
        /// The path.
        path: String,
        /// Why.
        message: String,
    },
    /// The policy's first volume has no local disk the table has data on.
    #[error("storage policy {policy}: its first volume {volume} has no local disk to stage parts on (disks: {disks}); chpart publishes parts onto local disks only (object storage takes them by the table's move rules)")]
    NoLocalDisk {
        /// The policy.
        policy: String,
        /// Its first volume.
        volume: String,
        /// Its disks.
        disks: String,
    },
}

fn bad_path(what: &'static str, path: &str, e: impl fmt::Display) -> DestinationError {
    DestinationError::BadPath {
        what,
        path: path.to_owned(),
        message: e.to_string(),
    }
}

/// The disks a load of a table publishes to: for each of the table's data paths, the disk it
/// is on (the disk with the longest path that is a prefix of it), kept if that disk is local
/// and in the policy's first volume (`volumes` may be empty for a server that lists none: then
/// every local disk counts). A table on one disk stages under `roots.single`; on several, under
/// each disk's configured root or `<disk path>/chpart-staging`.
pub fn publish_disks(
    policy: &str,
    data_paths: &[String],
    disks: &[DiskInfo],
    volumes: &[VolumeInfo],
    roots: &StagingRoots,
) -> Result<Vec<DiskPlace>, DestinationError> {
    if data_paths.is_empty() {
        return Err(DestinationError::NoDataPath);
    }
    let first_volume = volumes.iter().min_by_key(|v| v.priority);
    let mut placed: Vec<(&DiskInfo, RemotePath)> = Vec::new();
    for path in data_paths {
        let disk = disks
            .iter()
            .filter(|d| path.starts_with(&d.path))
            .max_by_key(|d| d.path.len())
            .ok_or_else(|| DestinationError::UnknownDisk {
                data_path: path.clone(),
                disks: disks
                    .iter()
                    .map(|d| format!("{} at {}", d.name, d.path))
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let in_first = first_volume.is_none_or(|v| v.disks.contains(&disk.name));
        if disk.local && in_first {
            let data_path = RemotePath::new(path).map_err(|e| bad_path("data path", path, e))?;
            placed.push((disk, data_path));
        }
    }
    if placed.is_empty() {
        let volume = first_volume.map_or_else(String::new, |v| v.name.clone());
        let names = first_volume.map_or_else(
            || disks.iter().map(|d| d.name.clone()).collect(),
            |v| v.disks.clone(),
        );
        return Err(DestinationError::NoLocalDisk {
            policy: policy.to_owned(),
            volume,
            disks: names.join(", "),
        });
    }
    let single = data_paths.len() == 1;
    placed
        .into_iter()
        .map(|(disk, data_path)| {
            let staging_root = if single {
                roots.single.clone()
            } else if let Some((_, root)) = roots.per_disk.iter().find(|(d, _)| *d == disk.name) {
                root.clone()
            } else {
                let root = format!(
                    "{}/{DEFAULT_DISK_STAGING_DIR}",
                    disk.path.trim_end_matches('/')
                );
                RemotePath::new(&root).map_err(|e| bad_path("disk path", &disk.path, e))?
            };
            Ok(DiskPlace {
                disk: disk.name.clone(),
                data_path,
                staging_root,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(name: &str, path: &str, local: bool) -> DiskInfo {
        DiskInfo {
            name: name.into(),
            path: path.into(),
            local,
        }
    }

    fn volume(name: &str, priority: u64, disks: &[&str]) -> VolumeInfo {
        VolumeInfo {
            name: name.into(),
            priority,
            disks: disks.iter().map(|d| d.to_string()).collect(),
        }
    }

    fn roots(per_disk: &[(&str, &str)]) -> StagingRoots {
        StagingRoots {
            single: RemotePath::new("/var/lib/clickhouse/chpart-staging").unwrap(),
            per_disk: per_disk
                .iter()
                .map(|(d, r)| (d.to_string(), RemotePath::new(r).unwrap()))
                .collect(),
        }
    }

    /// (case, data paths, disks, volumes, configured per-disk roots, expected (disk, data path,
    /// staging root) or the error's text).
    #[test]
    fn publish_disks_table() {
        let server_disks = vec![
            disk("default", "/var/lib/clickhouse/", true),
            disk("d1", "/mnt/d1/", true),
            disk("d2", "/mnt/d2/ch/", true),
            disk("s3", "/var/lib/clickhouse/disks/s3/", false),
        ];
        type Row<'a> = (
            &'a str,
            Vec<&'a str>,
            Vec<VolumeInfo>,
            Vec<(&'a str, &'a str)>,
            Result<Vec<(&'a str, &'a str, &'a str)>, &'a str>,
        );
        let rows: Vec<Row> = vec![
            (
                "one disk: the configured single root",
                vec!["/var/lib/clickhouse/store/abc/abcd/"],
                vec![volume("default", 1, &["default"])],
                vec![("default", "/elsewhere")],
                Ok(vec![(
                    "default",
                    "/var/lib/clickhouse/store/abc/abcd",
                    "/var/lib/clickhouse/chpart-staging",
                )]),
            ),
            (
                "jbod: a root per disk, derived from the disk path",
                vec!["/mnt/d1/store/abc/abcd/", "/mnt/d2/ch/store/abc/abcd/"],
                vec![volume("main", 1, &["d1", "d2"])],
                vec![],
                Ok(vec![
                    ("d1", "/mnt/d1/store/abc/abcd", "/mnt/d1/chpart-staging"),
                    ("d2", "/mnt/d2/ch/store/abc/abcd", "/mnt/d2/ch/chpart-staging"),
                ]),
            ),
            (
                "jbod: a configured root wins",
                vec!["/mnt/d1/store/abc/abcd/", "/mnt/d2/ch/store/abc/abcd/"],
                vec![volume("main", 1, &["d1", "d2"])],
                vec![("d2", "/mnt/d2/stage")],
                Ok(vec![
                    ("d1", "/mnt/d1/store/abc/abcd", "/mnt/d1/chpart-staging"),
                    ("d2", "/mnt/d2/ch/store/abc/abcd", "/mnt/d2/stage"),
                ]),
            ),
            (
                "tiered: the s3 volume is not published to (longest prefix finds s3 under default)",
                vec![
                    "/var/lib/clickhouse/store/abc/abcd/",
                    "/var/lib/clickhouse/disks/s3/store/abc/abcd/",
                ],
                vec![
                    volume("hot", 1, &["default"]),
                    volume("cold", 2, &["s3"]),
                ],
                vec![],
                Ok(vec![(
                    "default",
                    "/var/lib/clickhouse/store/abc/abcd",
                    "/var/lib/clickhouse/chpart-staging",
                )]),
            ),
            (
                "a second volume of local disks is not published to",
                vec!["/mnt/d1/store/abc/abcd/", "/mnt/d2/ch/store/abc/abcd/"],
                vec![volume("hot", 1, &["d1"]), volume("cold", 2, &["d2"])],
                vec![],
                Ok(vec![("d1", "/mnt/d1/store/abc/abcd", "/mnt/d1/chpart-staging")]),
            ),
            (
                "object storage only: refused",
                vec!["/var/lib/clickhouse/disks/s3/store/abc/abcd/"],
                vec![volume("s3only", 1, &["s3"])],
                vec![],
                Err("storage policy p: its first volume s3only has no local disk to stage parts on (disks: s3)"),
            ),
            (
                "a data path on no disk",
                vec!["/srv/other/store/abc/abcd/"],
                vec![],
                vec![],
                Err("data path /srv/other/store/abc/abcd/ is under none of the server's disks"),
            ),
            (
                "no data path",
                vec![],
                vec![],
                vec![],
                Err("the server reports no data path"),
            ),
        ];
        for (case, paths, volumes, per_disk, want) in rows {
            let paths: Vec<String> = paths.into_iter().map(String::from).collect();
            let got = publish_disks("p", &paths, &server_disks, &volumes, &roots(&per_disk));
            match (got, want) {
                (Ok(got), Ok(want)) => {
                    let got: Vec<(String, String, String)> = got
                        .into_iter()
                        .map(|d| (d.disk, d.data_path.to_string(), d.staging_root.to_string()))
                        .collect();
                    let want: Vec<(String, String, String)> = want
                        .into_iter()
                        .map(|(a, b, c)| (a.into(), b.into(), c.into()))
                        .collect();
                    assert_eq!(got, want, "{case}");
                }
                (Err(e), Err(want)) => {
                    assert!(e.to_string().contains(want), "{case}: {e}")
                }
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    fn destination(n: usize) -> Destination {
        Destination {
            host: "ch-1".into(),
            disks: (0..n)
                .map(|i| DiskPlace {
                    disk: format!("d{i}"),
                    data_path: RemotePath::new(&format!("/mnt/d{i}/store/abc/abcd")).unwrap(),
                    staging_root: RemotePath::new(&format!("/mnt/d{i}/chpart-staging")).unwrap(),
                })
                .collect(),
        }
    }

    #[test]
    fn parts_spread_round_robin_and_attempts_start_on_different_disks() {
        let load: LoadId = "L".parse().unwrap();
        let two = destination(2);
        let mut firsts = std::collections::BTreeMap::<String, usize>::new();
        for a in 0..64 {
            let attempt: AttemptId = format!("app.{a}").parse().unwrap();
            let disks: Vec<&str> = (0..4)
                .map(|seq| two.disk_for(&load, &attempt, seq).disk.as_str())
                .collect();
            assert_ne!(disks[0], disks[1], "consecutive parts alternate");
            assert_eq!(disks[0], disks[2]);
            assert_eq!(
                disks,
                (0..4)
                    .map(|seq| two.disk_for(&load, &attempt, seq).disk.as_str())
                    .collect::<Vec<_>>(),
                "deterministic"
            );
            *firsts.entry(disks[0].to_owned()).or_default() += 1;
        }
        // 64 attempts of one part each: both disks get some (fails with probability 2^-63).
        assert_eq!(firsts.len(), 2, "{firsts:?}");
        let one = destination(1);
        let attempt: AttemptId = "app.1".parse().unwrap();
        assert_eq!(one.disk_for(&load, &attempt, 7).disk, "d0");
    }
}
