//! Step 1 of a commit: the manifests `collect()` returned, checked into one winner per Spark
//! partition ([`validate_winners`]), every problem reported at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde_json::Value;

use crate::destination::DiskPlace;
use crate::fingerprint::TableFingerprint;
use crate::ids::{escape, AttemptId, LoadId, TableRef};
use crate::manifest::Manifest;
use crate::names::PartName;
use crate::staging::RemotePath;

/// What every winning manifest must say, taken from the load's spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    /// The table whose `detached/` the parts were published into (a shadow table for partition
    /// visibility, the target for part visibility).
    pub publish: TableRef,
    /// The publish table's fingerprint.
    pub fingerprint: TableFingerprint,
    /// The disks parts may be published on, each with the publish table's data path there and
    /// the staging root attempts use for it.
    pub disks: Vec<DiskPlace>,
    /// The host parts are published on.
    pub host: String,
}

/// Which input line a problem is about. For a line that could not be read as a manifest,
/// `partition` and `attempt` come from the raw JSON as far as it tells them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineOrigin {
    /// The line number the caller gave.
    pub line: usize,
    /// The Spark partition, if known.
    pub partition: Option<u32>,
    /// The attempt id (escaped), or `?`.
    pub attempt: String,
}

impl fmt::Display for LineOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {} (partition ", self.line)?;
        match self.partition {
            Some(p) => write!(f, "{p}")?,
            None => f.write_str("?")?,
        }
        write!(f, ", attempt {})", self.attempt)
    }
}

/// The parts of a manifest, for messages: all names up to three, then a count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartList(pub Vec<PartName>);

impl PartList {
    pub(super) fn of(m: &Manifest) -> PartList {
        PartList(m.parts.iter().map(|p| p.name.clone()).collect())
    }
}

impl fmt::Display for PartList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.len() {
            0 => f.write_str("no parts"),
            1 => write!(f, "part {}", self.0[0]),
            _ => write!(f, "parts {}", crate::text::some_of(self.0.iter(), 3)),
        }
    }
}

/// One reason the given winners cannot be committed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WinnerProblem {
    /// The line is not a valid manifest.
    #[error("{origin}: {message}")]
    Invalid {
        /// The line.
        origin: LineOrigin,
        /// The manifest reader's message.
        message: String,
    },
    /// A manifest of another load.
    #[error("{origin}: manifest of load {found}, not of this load; its {parts} must not be attached by this load")]
    OtherLoad {
        /// The line.
        origin: LineOrigin,
        /// The manifest's load.
        found: LoadId,
        /// Its parts.
        parts: PartList,
    },
    /// The manifest says its parts are in another table than the publish table.
    #[error("{origin}: its {parts} were published into {found}, but this load publishes into {expected}; refusing a manifest that points at another table")]
    WrongTable {
        /// The line.
        origin: LineOrigin,
        /// The manifest's `database.table`.
        found: String,
        /// The publish table.
        expected: TableRef,
        /// Its parts.
        parts: PartList,
    },
    /// The parts were built for another table definition.
    #[error("{origin}: its {parts} were built for table fingerprint {found}, but the publish table's is {expected} (built for another table definition)")]
    Fingerprint {
        /// The line.
        origin: LineOrigin,
        /// The manifest's fingerprint.
        found: TableFingerprint,
        /// The publish table's.
        expected: TableFingerprint,
        /// Its parts.
        parts: PartList,
    },
    /// The parts are under another data path.
    #[error("{origin}: its {parts} were published under data path {found}, but the publish table's is {expected}")]
    DataPath {
        /// The line.
        origin: LineOrigin,
        /// The manifest's data path.
        found: RemotePath,
        /// The publish table's.
        expected: RemotePath,
        /// Its parts.
        parts: PartList,
    },
    /// The parts are on a disk the load does not publish to.
    #[error("{origin}: its {parts} were published on disk {found}, but this load publishes on {expected}")]
    Disk {
        /// The line.
        origin: LineOrigin,
        /// The manifest's disk (escaped).
        found: String,
        /// The load's disks.
        expected: String,
        /// Its parts.
        parts: PartList,
    },
    /// The parts are on another host.
    #[error("{origin}: its {parts} were published on host {found}, but this load publishes on {expected}")]
    Host {
        /// The line.
        origin: LineOrigin,
        /// The manifest's host (escaped).
        found: String,
        /// The configured host (escaped).
        expected: String,
        /// Its parts.
        parts: PartList,
    },
    /// The staging directory is not this attempt's under the configured root.
    #[error("{origin}: staging_dir {found} is not {expected}, this attempt's directory under the configured staging root; its {parts} are not this load's")]
    StagingDir {
        /// The line.
        origin: LineOrigin,
        /// The manifest's staging directory.
        found: RemotePath,
        /// This attempt's staging directory.
        expected: RemotePath,
        /// Its parts.
        parts: PartList,
    },
    /// A part without rows (chpart never publishes one; a plan partition must have rows).
    #[error("{origin}: part {part} has 0 rows; chpart never publishes an empty part")]
    EmptyPart {
        /// The line.
        origin: LineOrigin,
        /// The part.
        part: PartName,
    },
    /// A Spark partition outside `0..expected_partitions`.
    #[error("{origin}: partition {partition} is outside 0..{expected} (the job has {expected} partitions)", partition = .origin.partition.unwrap_or_default())]
    UnexpectedPartition {
        /// The line.
        origin: LineOrigin,
        /// `expected_partitions`.
        expected: u32,
    },
    /// Two manifests for one Spark partition.
    #[error("partition {partition} has two winners: attempt {first} (line {first_line}) and attempt {second} (line {second_line}); collect() returns one per partition — pass exactly what it returned")]
    TwoWinners {
        /// The Spark partition.
        partition: u32,
        /// The attempt given first.
        first: AttemptId,
        /// Its line.
        first_line: usize,
        /// The attempt given second.
        second: AttemptId,
        /// Its line.
        second_line: usize,
    },
    /// One attempt given as the winner of two partitions.
    #[error("attempt {attempt} is given as the winner of two partitions: partition {first} (line {first_line}) and partition {second} (line {second_line}); an attempt runs one task — pass exactly what collect() returned")]
    AttemptTwice {
        /// The attempt.
        attempt: AttemptId,
        /// The partition given first.
        first: u32,
        /// Its line.
        first_line: usize,
        /// The partition given second.
        second: u32,
        /// Its line.
        second_line: usize,
    },
    /// One part name in two manifests.
    #[error("part {part} is listed by two manifests: partition {first} attempt {first_attempt} (line {first_line}) and partition {second} attempt {second_attempt} (line {second_line}); it would be attached once and its rows counted twice")]
    DuplicatePart {
        /// The part.
        part: PartName,
        /// The first manifest's partition.
        first: u32,
        /// Its attempt.
        first_attempt: AttemptId,
        /// Its line.
        first_line: usize,
        /// The second manifest's partition.
        second: u32,
        /// Its attempt.
        second_attempt: AttemptId,
        /// Its line.
        second_line: usize,
    },
    /// A Spark partition without a winner.
    #[error("partition {partition} has no winner ({expected}); its rows would be lost — pass every manifest collect() returned, or allow missing partitions")]
    Missing {
        /// The Spark partition.
        partition: u32,
        /// Why it is expected, for the message.
        expected: String,
    },
    /// No winners at all and no partition count to say that is right.
    #[error("no winners were given; if the job really had no partitions, say expected_partitions = 0, or allow missing partitions")]
    NoWinners,
}

/// The winners cannot be committed; lists every problem found, one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refusing the winners of load {load}: {}", list(.problems, "problem"))]
pub struct WinnersError {
    /// The load.
    pub load: LoadId,
    /// Every problem, in line order, then cross-manifest problems, then missing partitions.
    pub problems: Vec<WinnerProblem>,
}

/// `<n> <noun>(s)`, then each item on its own line.
pub(super) fn list<T: fmt::Display>(items: &[T], noun: &str) -> String {
    let mut out = format!(
        "{} {noun}{}",
        items.len(),
        if items.len() == 1 { "" } else { "s" }
    );
    for item in items {
        out.push_str("\n  - ");
        out.push_str(&item.to_string());
    }
    out
}

/// The winning manifests of a load, one per Spark partition, checked by [`validate_winners`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Winners {
    load: LoadId,
    manifests: BTreeMap<u32, Manifest>,
}

impl Winners {
    /// The load.
    pub fn load(&self) -> &LoadId {
        &self.load
    }

    /// The manifests by Spark partition.
    pub fn manifests(&self) -> &BTreeMap<u32, Manifest> {
        &self.manifests
    }
}

/// Reads the partition and attempt of a line that is not a valid manifest, for its message.
fn peek_origin(line: usize, text: &str) -> LineOrigin {
    let raw: Option<Value> = serde_json::from_str(text).ok();
    let attempt = raw.as_ref().and_then(|v| v.get("attempt"));
    LineOrigin {
        line,
        partition: attempt
            .and_then(|a| a.get("partition"))
            .and_then(Value::as_u64)
            .and_then(|p| u32::try_from(p).ok()),
        attempt: attempt
            .and_then(|a| a.get("id"))
            .and_then(Value::as_str)
            .map_or_else(|| "?".to_string(), escape),
    }
}

/// The problems of one manifest taken on its own.
fn check_manifest(
    load: &LoadId,
    expected: &Expected,
    origin: &LineOrigin,
    m: &Manifest,
) -> Vec<WinnerProblem> {
    let mut out = Vec::new();
    let origin = || origin.clone();
    let parts = || PartList::of(m);
    if &m.load != load {
        out.push(WinnerProblem::OtherLoad {
            origin: origin(),
            found: m.load.clone(),
            parts: parts(),
        });
    }
    if m.target.database != expected.publish.database || m.target.table != expected.publish.table {
        out.push(WinnerProblem::WrongTable {
            origin: origin(),
            found: format!("{}.{}", m.target.database, m.target.table),
            expected: expected.publish.clone(),
            parts: parts(),
        });
    }
    if m.table_fingerprint != expected.fingerprint {
        out.push(WinnerProblem::Fingerprint {
            origin: origin(),
            found: m.table_fingerprint.clone(),
            expected: expected.fingerprint.clone(),
            parts: parts(),
        });
    }
    for (disk, data_path, staging_dir) in m.disks() {
        let Some(place) = expected.disks.iter().find(|d| d.disk == disk) else {
            out.push(WinnerProblem::Disk {
                origin: origin(),
                found: escape(disk),
                expected: expected
                    .disks
                    .iter()
                    .map(|d| escape(&d.disk))
                    .collect::<Vec<_>>()
                    .join(", "),
                parts: parts(),
            });
            continue;
        };
        if data_path != &place.data_path {
            out.push(WinnerProblem::DataPath {
                origin: origin(),
                found: data_path.clone(),
                expected: place.data_path.clone(),
                parts: parts(),
            });
        }
        let staging = place.staging().attempt(load, &m.attempt.id);
        if staging_dir != staging.dir() {
            out.push(WinnerProblem::StagingDir {
                origin: origin(),
                found: staging_dir.clone(),
                expected: staging.dir().clone(),
                parts: parts(),
            });
        }
    }
    if m.target.host != expected.host {
        out.push(WinnerProblem::Host {
            origin: origin(),
            found: escape(&m.target.host),
            expected: escape(&expected.host),
            parts: parts(),
        });
    }
    for p in m.parts.iter().filter(|p| p.rows == 0) {
        out.push(WinnerProblem::EmptyPart {
            origin: origin(),
            part: p.name.clone(),
        });
    }
    out
}

/// Checks the winning manifests of `load`: `winners` are (line number, JSON text) pairs, exactly
/// the lines the tasks printed and `collect()` returned. With `expected_partitions = Some(n)`
/// the Spark partitions must be exactly `0..n`; with `None`, every partition up to the highest
/// given must be present. `allow_missing` accepts absent partitions (never extra or duplicate
/// ones). A manifest with no parts is valid: its partition had no rows.
pub fn validate_winners<S: AsRef<str>>(
    load: &LoadId,
    expected: &Expected,
    winners: &[(usize, S)],
    expected_partitions: Option<u32>,
    allow_missing: bool,
) -> Result<Winners, WinnersError> {
    let mut problems = Vec::new();
    let mut read: Vec<(usize, Manifest)> = Vec::new();
    // Partitions named by lines that could not be read: already reported, not "missing".
    let mut unreadable: BTreeSet<u32> = BTreeSet::new();
    for (line, text) in winners {
        let (line, text) = (*line, text.as_ref());
        match Manifest::from_json(text) {
            Err(e) => {
                let origin = peek_origin(line, text);
                unreadable.extend(origin.partition);
                problems.push(WinnerProblem::Invalid {
                    origin,
                    message: e.to_string(),
                })
            }
            Ok(m) => {
                let origin = LineOrigin {
                    line,
                    partition: Some(m.attempt.partition),
                    attempt: m.attempt.id.to_string(),
                };
                problems.extend(check_manifest(load, expected, &origin, &m));
                if let Some(n) = expected_partitions.filter(|&n| m.attempt.partition >= n) {
                    problems.push(WinnerProblem::UnexpectedPartition {
                        origin,
                        expected: n,
                    });
                }
                read.push((line, m));
            }
        }
    }

    let mut by_partition: BTreeMap<u32, (usize, &Manifest)> = BTreeMap::new();
    let mut by_attempt: HashMap<&AttemptId, (usize, u32)> = HashMap::new();
    let mut by_part: HashMap<&PartName, (usize, &Manifest)> = HashMap::new();
    for (line, m) in &read {
        let (line, partition, attempt) = (*line, m.attempt.partition, &m.attempt.id);
        match by_partition.get(&partition) {
            Some(&(first_line, first)) => problems.push(WinnerProblem::TwoWinners {
                partition,
                first: first.attempt.id.clone(),
                first_line,
                second: attempt.clone(),
                second_line: line,
            }),
            None => {
                by_partition.insert(partition, (line, m));
            }
        }
        match by_attempt.get(attempt) {
            Some(&(first_line, first)) if first != partition => {
                problems.push(WinnerProblem::AttemptTwice {
                    attempt: attempt.clone(),
                    first,
                    first_line,
                    second: partition,
                    second_line: line,
                });
            }
            Some(_) => {}
            None => {
                by_attempt.insert(attempt, (line, partition));
            }
        }
        for p in &m.parts {
            match by_part.get(&p.name) {
                Some(&(first_line, first)) => problems.push(WinnerProblem::DuplicatePart {
                    part: p.name.clone(),
                    first: first.attempt.partition,
                    first_attempt: first.attempt.id.clone(),
                    first_line,
                    second: partition,
                    second_attempt: attempt.clone(),
                    second_line: line,
                }),
                None => {
                    by_part.insert(&p.name, (line, m));
                }
            }
        }
    }

    let present = |p: &u32| by_partition.contains_key(p) || unreadable.contains(p);
    if !allow_missing {
        match expected_partitions {
            Some(n) => {
                for partition in (0..n).filter(|p| !present(p)) {
                    problems.push(WinnerProblem::Missing {
                        partition,
                        expected: format!("the job has partitions 0..{n}"),
                    });
                }
            }
            None => match by_partition.keys().next_back() {
                Some(&max) => {
                    for partition in (0..=max).filter(|p| !present(p)) {
                        problems.push(WinnerProblem::Missing {
                            partition,
                            expected: format!("winners were given for partitions up to {max}"),
                        });
                    }
                }
                None if winners.is_empty() => problems.push(WinnerProblem::NoWinners),
                // Lines were given but none could be read: those problems say enough.
                None => {}
            },
        }
    }

    if !problems.is_empty() {
        return Err(WinnersError {
            load: load.clone(),
            problems,
        });
    }
    let manifests = read
        .into_iter()
        .map(|(_, m)| (m.attempt.partition, m))
        .collect();
    Ok(Winners {
        load: load.clone(),
        manifests,
    })
}
