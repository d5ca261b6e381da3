//! Commit: from the manifests Spark's `collect()` returned to parts visible in the target,
//! exactly once, however often the commit is killed and re-run.
//!
//! Every attempt of every task publishes its parts into the publish table's `detached/` under
//! names no other attempt uses, so `detached/` holds the winners' parts *and* the losers'. The
//! driver attaches only the winners' parts, by exact name, and records each step in the ledger
//! (append-only; the first entry of each id counts). Everything here is a pure decision: the
//! caller observes the server and the ledger, asks one of these functions what to do, does it,
//! and observes again. Nothing is decided from memory of what a previous request "probably" did.
//!
//! ```text
//!  collect() ──► validate_winners ──► Winners ──► CommitPlan::from_winners
//!                                                      │  (re-run: plan_matches(recorded, new))
//!  ledger "plan" (body: the plan) ◄────────────────────┘
//!     │
//!     │  AttachParts: for each planned part, in plan order          decide_part
//!     ├─► ledger "attach:<part>" ─► ATTACH PART '<part>' ─► observe ─► ledger "attached:<part>"
//!     │        (intent)             (claims detached/<part> by renaming it to attaching_<part>)
//!     │
//!     │  reconcile_rows: rows attached per ClickHouse partition == rows planned
//!     │
//!     │  PublishPartitions (partition visibility only): for each      decide_partition
//!     │  ClickHouse partition of the plan, from the shadow (= publish table) into the target
//!     ├─► ledger "publish:<id>" ─► MOVE PARTITION | REPLACE PARTITION ─► observe ─► ledger "published:<id>"
//!     │
//!     │  MarkCommitted
//!     └─► ledger "commit"  ─►  Done: a re-run changes nothing
//! ```
//!
//! [`commit_phase`] tells a (re-)started commit where it is from the ledger alone; within a
//! phase, [`decide_part`] and [`decide_partition`] decide each step from fresh observations.
//!
//! Why each decision is safe:
//!
//! - **Winners** ([`validate_winners`]): only manifests of this load, for the publish table, its
//!   table definition (fingerprint), data path, host and this attempt's staging directory are
//!   accepted, exactly one per Spark partition, every partition present. `collect()` returns
//!   the first successful attempt of each partition, so anything else (two winners, a missing
//!   partition, a manifest pointing at another table) means the caller passed the wrong set,
//!   and attaching it would duplicate or lose rows. Every problem is reported at once.
//! - **Plan**: written to the ledger before anything is attached. A re-run computes the plan
//!   again from the winners it was given and must get the same one ([`plan_matches`]): a
//!   commit never mixes two sets of winners.
//! - **Attach** ([`decide_part`]): ATTACH PART first renames `detached/<part>` to
//!   `detached/attaching_<part>`, and a rename succeeds once, so one part is attached at most
//!   once however many commits race. Nothing but a successful ATTACH removes a planned part
//!   of an open load from `detached/` (gc keeps them, executors never touch a published
//!   part), and every commit records `attach:<part>` before it sends ATTACH, so "gone without
//!   an `attaching_` leftover, with an intent" means attached: the ledger's record is the
//!   identity, never an active part with the same hash (identical rows make identical parts),
//!   and a merge or a MOVE of the attached part changes nothing. "Gone with no intent" is
//!   decided only from a ledger read made *after* the observation: a read made before it may
//!   predate a concurrent commit's intent and ATTACH, so the commit reads the ledger again
//!   before it may call the part lost. An `attaching_` leftover means an ATTACH is in flight
//!   (the commit waits and observes again) or a server died in one: ATTACH turns the claimed
//!   directory itself into the active part with one more rename(2), so a leftover is never
//!   also active, and once no live ATTACH can hold it ([`claim_crashed`]) the commit renames it
//!   back to `detached/<part>` and attaches it ([`PartStep::Reclaim`]). After a timeout the
//!   commit never re-sends ATTACH blindly: it observes and decides again.
//! - **Publish** ([`decide_partition`]): MOVE PARTITION is atomic for readers and a second
//!   MOVE of a moved partition moves nothing (the shadow keeps only an empty covering part),
//!   so with all of a partition's parts attached, the shadow holds either all planned rows
//!   (not moved yet: move) or none (moved: record it); anything in between is unexplained and
//!   stops the commit. REPLACE PARTITION is not crash-atomic upstream but is idempotent (it
//!   copies from the shadow, which keeps its parts), so a crash inside it is repaired by
//!   running it again, as long as the target partition holds nothing but old parts and
//!   copies: a part that arrived since the intent stops the commit, since REPLACE would remove
//!   rows the load did not plan.
//! - **Commit**: written last; once it is in the ledger every re-run is a no-op.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::destination::DiskPlace;
use crate::fingerprint::TableFingerprint;
use crate::ids::{escape, AttemptId, LoadId, PartitionId, TableRef};
use crate::manifest::Manifest;
use crate::names::PartName;
use crate::staging::RemotePath;

#[cfg(test)]
mod tests;

// ---------------------------------------------------------------------------------------------
// Load settings
// ---------------------------------------------------------------------------------------------

/// How a load's rows relate to what the target already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Add the load's rows to the target.
    Append,
    /// Replace each partition the load touches, atomically for readers (historical reloads).
    Replace,
    /// Replace the whole table at once: the load's rows become the table's only rows, built
    /// in the shadow and swapped in by one `EXCHANGE TABLES` (a daily snapshot of a dimension).
    Overwrite,
}

/// When the load's rows become visible to readers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Visibility {
    /// Each partition of the load appears at once (parts are attached into a shadow table,
    /// then each partition is moved or replaced into the target).
    Partition,
    /// Each part appears when it is attached into the target; the load as a whole is not
    /// atomic.
    Part,
}

impl Mode {
    /// `append` or `replace`, as in config and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Append => "append",
            Mode::Replace => "replace",
            Mode::Overwrite => "overwrite",
        }
    }
}

impl Visibility {
    /// `partition` or `part`, as in config and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Visibility::Partition => "partition",
            Visibility::Part => "part",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Visibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Winners
// ---------------------------------------------------------------------------------------------

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
    fn of(m: &Manifest) -> PartList {
        PartList(m.parts.iter().map(|p| p.name.clone()).collect())
    }
}

impl fmt::Display for PartList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 3;
        match self.0.len() {
            0 => return f.write_str("no parts"),
            1 => f.write_str("part ")?,
            _ => f.write_str("parts ")?,
        }
        for (i, name) in self.0.iter().take(SHOWN).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name}")?;
        }
        if self.0.len() > SHOWN {
            write!(f, " and {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
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
fn list<T: fmt::Display>(items: &[T], noun: &str) -> String {
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

// ---------------------------------------------------------------------------------------------
// 2. The plan
// ---------------------------------------------------------------------------------------------

/// One part the commit attaches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannedPart {
    /// The Spark partition whose winner built it.
    pub partition: u32,
    /// That winner.
    pub attempt: AttemptId,
    /// Its exact name in `detached/`.
    pub name: PartName,
    /// The ClickHouse partition it belongs to.
    pub partition_id: PartitionId,
    /// Rows.
    pub rows: u64,
    /// Bytes on disk.
    pub bytes: u64,
    /// `hash_of_all_files`, to find it again once attached.
    pub hash_of_all_files: String,
}

/// One ClickHouse partition the load touches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannedPartition {
    /// The partition.
    pub partition_id: PartitionId,
    /// Rows the load adds to it (always > 0: every part has rows).
    pub rows: u64,
    /// Parts the load attaches into it.
    pub parts: u32,
}

/// What a commit attaches and publishes, recorded in the ledger (entry [`PLAN_ENTRY`]) before
/// anything is attached. Build it with [`CommitPlan::from_winners`]; read a recorded one with
/// [`CommitPlan::from_json`], which checks that it is consistent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitPlan {
    /// The load.
    pub load: LoadId,
    /// Partition or part visibility.
    pub visibility: Visibility,
    /// Append or replace.
    pub mode: Mode,
    /// Every part, ordered by ClickHouse partition, then Spark partition, then seq.
    pub parts: Vec<PlannedPart>,
    /// Every ClickHouse partition the parts are in, sorted.
    pub partitions: Vec<PlannedPartition>,
    /// Rows in all parts.
    pub total_rows: u64,
    /// The winner of each Spark partition, sorted by partition (including winners without
    /// parts).
    pub winners: Vec<(u32, AttemptId)>,
    /// The winners' manifests as JSON lines ([`Manifest::to_json_line`]), in Spark partition
    /// order: everything a commit resumed without the winners file needs (the files and
    /// digests of every part). Empty in plans recorded before chpart kept them.
    #[serde(default)]
    pub manifests: Vec<String>,
    /// Replace mode, on one shard of a load into a Distributed table: ClickHouse partitions
    /// the load replaces on other shards that this shard's winners put no rows in (sorted).
    /// Each is replaced by nothing, so the load replaces the same partitions on every shard
    /// (a row routed elsewhere this time must not survive on this shard). Absent from the
    /// JSON when empty, so plans without it keep their fingerprints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub emptied: Vec<PartitionId>,
}

/// A recorded plan that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Not a plan at all (or one written by a newer chpart).
    #[error("recorded commit plan is not readable: {source}")]
    Json {
        /// The reader's error.
        source: serde_json::Error,
    },
    /// A plan whose summary does not follow from its parts.
    #[error("recorded commit plan of load {load} is inconsistent: {problem}")]
    Inconsistent {
        /// The load.
        load: LoadId,
        /// What does not add up.
        problem: String,
    },
}

impl CommitPlan {
    /// The plan for committing `winners`.
    pub fn from_winners(winners: &Winners, visibility: Visibility, mode: Mode) -> CommitPlan {
        let mut keyed: Vec<((PartitionId, u32, u32), PlannedPart)> = Vec::new();
        for (&partition, m) in winners.manifests() {
            for p in &m.parts {
                let key = (p.partition_id.clone(), partition, p.seq);
                keyed.push((
                    key,
                    PlannedPart {
                        partition,
                        attempt: m.attempt.id.clone(),
                        name: p.name.clone(),
                        partition_id: p.partition_id.clone(),
                        rows: p.rows,
                        bytes: p.bytes_on_disk,
                        hash_of_all_files: p.hash_of_all_files.clone(),
                    },
                ));
            }
        }
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        let parts: Vec<PlannedPart> = keyed.into_iter().map(|(_, p)| p).collect();
        let winners_list = winners
            .manifests()
            .iter()
            .map(|(&partition, m)| (partition, m.attempt.id.clone()))
            .collect();
        let (partitions, total_rows) = summarize(&parts);
        CommitPlan {
            load: winners.load().clone(),
            visibility,
            mode,
            parts,
            partitions,
            total_rows,
            winners: winners_list,
            manifests: winners
                .manifests()
                .values()
                .map(Manifest::to_json_line)
                .collect(),
            emptied: Vec::new(),
        }
    }

    /// This plan, also emptying `replaced` partitions it puts no rows in (a shard's share of
    /// a replace load into a Distributed table whose rows fall into `replaced`; see
    /// [`CommitPlan::emptied`]).
    pub fn emptying(mut self, replaced: &BTreeSet<PartitionId>) -> CommitPlan {
        self.emptied = replaced
            .iter()
            .filter(|id| self.partition(id).is_none())
            .cloned()
            .collect();
        self
    }

    /// Every partition the publish step settles, sorted: the planned ones with their rows,
    /// and the [`CommitPlan::emptied`] ones with none.
    pub fn to_publish(&self) -> Vec<PlannedPartition> {
        let mut all = self.partitions.clone();
        all.extend(self.emptied.iter().map(|id| PlannedPartition {
            partition_id: id.clone(),
            rows: 0,
            parts: 0,
        }));
        all.sort_by(|a, b| a.partition_id.cmp(&b.partition_id));
        all
    }

    /// The plan as one line of JSON: the body of the ledger's `plan` entry, and what
    /// [`CommitPlan::fingerprint`] digests.
    pub fn to_json(&self) -> String {
        // Cannot fail: no maps with non-string keys, no floats.
        serde_json::to_string(self).expect("a plan always serializes")
    }

    /// Reads a recorded plan and checks that its summary (partitions, totals, order) follows
    /// from its parts, so the decisions below can rely on it.
    pub fn from_json(text: &str) -> Result<CommitPlan, PlanError> {
        let plan: CommitPlan =
            serde_json::from_str(text).map_err(|source| PlanError::Json { source })?;
        let inconsistent = |problem: String| PlanError::Inconsistent {
            load: plan.load.clone(),
            problem,
        };
        if let Some(p) = plan.parts.iter().find(|p| p.rows == 0) {
            return Err(inconsistent(format!(
                "part {} (partition {}, attempt {}) has 0 rows",
                p.name, p.partition, p.attempt
            )));
        }
        if let Some(p) = plan
            .parts
            .iter()
            .find(|p| p.name.partition_id() != &p.partition_id)
        {
            return Err(inconsistent(format!(
                "part {} (partition {}, attempt {}) is listed under ClickHouse partition {}",
                p.name, p.partition, p.attempt, p.partition_id
            )));
        }
        let ordered = plan
            .parts
            .windows(2)
            .all(|w| (&w[0].partition_id, w[0].partition) <= (&w[1].partition_id, w[1].partition));
        if !ordered {
            return Err(inconsistent(
                "parts are not ordered by ClickHouse partition, then Spark partition".into(),
            ));
        }
        let mut names = BTreeSet::new();
        if let Some(p) = plan.parts.iter().find(|p| !names.insert(&p.name)) {
            return Err(inconsistent(format!("part {} is listed twice", p.name)));
        }
        if (plan.partitions.clone(), plan.total_rows) != summarize(&plan.parts) {
            return Err(inconsistent(
                "partitions or total_rows do not add up from the parts".into(),
            ));
        }
        if !plan.emptied.is_empty()
            && (plan.mode, plan.visibility) != (Mode::Replace, Visibility::Partition)
        {
            return Err(inconsistent(
                "it empties partitions, which only replace mode with partition visibility does"
                    .into(),
            ));
        }
        if !plan.emptied.windows(2).all(|w| w[0] < w[1]) {
            return Err(inconsistent(
                "the partitions it empties are not sorted, one each".into(),
            ));
        }
        if let Some(id) = plan.emptied.iter().find(|id| plan.partition(id).is_some()) {
            return Err(inconsistent(format!(
                "partition {id} is both planned with rows and emptied"
            )));
        }
        if !plan.winners.windows(2).all(|w| w[0].0 < w[1].0) {
            return Err(inconsistent(
                "winners are not sorted by partition, one each".into(),
            ));
        }
        let winner: HashMap<u32, &AttemptId> = plan.winners.iter().map(|(p, a)| (*p, a)).collect();
        if let Some(p) = plan
            .parts
            .iter()
            .find(|p| winner.get(&p.partition) != Some(&&p.attempt))
        {
            return Err(inconsistent(format!(
                "part {} is of attempt {} for partition {}, which is not that partition's winner",
                p.name, p.attempt, p.partition
            )));
        }
        if !plan.manifests.is_empty() {
            let mut of_manifests = Vec::new();
            for (i, line) in plan.manifests.iter().enumerate() {
                let m = Manifest::from_json(line).map_err(|e| {
                    inconsistent(format!("manifest {} of the plan does not read: {e}", i + 1))
                })?;
                of_manifests.push((m.attempt.partition, m.attempt.id));
            }
            if of_manifests != plan.winners {
                return Err(inconsistent(
                    "its manifests are not those of its winners".into(),
                ));
            }
        }
        Ok(plan)
    }

    /// The winning manifests as numbered lines, as a winners file would give them: what a
    /// commit resumed from the ledger alone validates again. `None` for a plan recorded
    /// before chpart kept the manifests in it.
    pub fn winner_lines(&self) -> Option<Vec<(usize, String)>> {
        (!self.manifests.is_empty() || self.winners.is_empty()).then(|| {
            self.manifests
                .iter()
                .enumerate()
                .map(|(i, line)| (i + 1, line.clone()))
                .collect()
        })
    }

    /// `sha256:<hex>` of [`CommitPlan::to_json`]: equal plans have equal fingerprints.
    pub fn fingerprint(&self) -> String {
        format!(
            "sha256:{}",
            hex::encode(Sha256::digest(self.to_json().as_bytes()))
        )
    }

    /// The planned partition `id`, if the load touches it.
    pub fn partition(&self, id: &PartitionId) -> Option<&PlannedPartition> {
        self.partitions.iter().find(|p| &p.partition_id == id)
    }
}

/// The partitions and total rows of `parts` (which are ordered by partition id).
fn summarize(parts: &[PlannedPart]) -> (Vec<PlannedPartition>, u64) {
    let mut partitions: BTreeMap<&PartitionId, (u64, u32)> = BTreeMap::new();
    let mut total = 0u64;
    for p in parts {
        let entry = partitions.entry(&p.partition_id).or_default();
        entry.0 = entry.0.saturating_add(p.rows);
        entry.1 = entry.1.saturating_add(1);
        total = total.saturating_add(p.rows);
    }
    let partitions = partitions
        .into_iter()
        .map(|(id, (rows, parts))| PlannedPartition {
            partition_id: id.clone(),
            rows,
            parts,
        })
        .collect();
    (partitions, total)
}

/// A re-run of commit was given other winners (or settings) than the recorded plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanConflict {
    /// Plans of two loads.
    #[error("the recorded plan is of load {recorded}, this commit's is of load {new}")]
    Load {
        /// The recorded plan's load.
        recorded: LoadId,
        /// The new plan's load.
        new: LoadId,
    },
    /// Another mode or visibility.
    #[error("load {load}: the recorded plan has {setting} {recorded}, this commit asks for {new}; a load is committed with the settings it began with")]
    Setting {
        /// The load.
        load: LoadId,
        /// `mode` or `visibility`.
        setting: &'static str,
        /// The recorded value.
        recorded: &'static str,
        /// The new value.
        new: &'static str,
    },
    /// Another winner for a Spark partition.
    #[error("load {load} partition {partition}: {}, but this commit was given {}; a load commits one set of winners — pass the manifests the first commit was given", recorded_winner(.recorded), given_winner(.new))]
    Winner {
        /// The load.
        load: LoadId,
        /// The Spark partition.
        partition: u32,
        /// The recorded winner, if any.
        recorded: Option<AttemptId>,
        /// The new winner, if any.
        new: Option<AttemptId>,
    },
    /// Same winners and parts, but a manifest's files or digests differ from the recorded one.
    #[error("load {load} partition {partition}: the manifest of attempt {attempt} differs from the one recorded in the plan (files or digests changed); pass the manifests the first commit was given, or resume without --winners")]
    Manifest {
        /// The load.
        load: LoadId,
        /// The Spark partition.
        partition: u32,
        /// The attempt.
        attempt: AttemptId,
    },
    /// Same winners and parts, but other partitions to empty (a shard of a replace load into
    /// a Distributed table, committed with another cluster plan).
    #[error("load {load}: the recorded plan empties partition(s) [{}], this commit would empty [{}]; a load commits one set of winners across its shards", join_ids(.recorded), join_ids(.new))]
    Emptied {
        /// The load.
        load: LoadId,
        /// The recorded plan's.
        recorded: Vec<PartitionId>,
        /// This commit's.
        new: Vec<PartitionId>,
    },
    /// Same winners, but a part differs (a manifest was changed after the first commit).
    #[error("load {load} partition {partition} attempt {attempt}: part {part} {detail}; the manifests changed since the plan was recorded")]
    Part {
        /// The load.
        load: LoadId,
        /// The Spark partition.
        partition: u32,
        /// The attempt.
        attempt: AttemptId,
        /// The part.
        part: String,
        /// What differs.
        detail: String,
    },
}

fn join_ids(ids: &[PartitionId]) -> String {
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn recorded_winner(a: &Option<AttemptId>) -> String {
    a.as_ref().map_or_else(
        || "the recorded plan has no winner".to_string(),
        |a| format!("the recorded plan's winner is attempt {a}"),
    )
}

fn given_winner(a: &Option<AttemptId>) -> String {
    a.as_ref()
        .map_or_else(|| "no winner".to_string(), |a| format!("attempt {a}"))
}

/// Whether `new` (computed from the winners a re-run was given) is the plan already recorded;
/// if not, the first difference: load, settings, then the first Spark partition whose winner
/// differs, then the first part that differs.
pub fn plan_matches(recorded: &CommitPlan, new: &CommitPlan) -> Result<(), PlanConflict> {
    let load = || recorded.load.clone();
    if recorded.load != new.load {
        return Err(PlanConflict::Load {
            recorded: load(),
            new: new.load.clone(),
        });
    }
    if recorded.mode != new.mode {
        return Err(PlanConflict::Setting {
            load: load(),
            setting: "mode",
            recorded: recorded.mode.as_str(),
            new: new.mode.as_str(),
        });
    }
    if recorded.visibility != new.visibility {
        return Err(PlanConflict::Setting {
            load: load(),
            setting: "visibility",
            recorded: recorded.visibility.as_str(),
            new: new.visibility.as_str(),
        });
    }
    let old_winners: BTreeMap<u32, &AttemptId> =
        recorded.winners.iter().map(|(p, a)| (*p, a)).collect();
    let new_winners: BTreeMap<u32, &AttemptId> = new.winners.iter().map(|(p, a)| (*p, a)).collect();
    let partitions: BTreeSet<u32> = old_winners
        .keys()
        .chain(new_winners.keys())
        .copied()
        .collect();
    for partition in partitions {
        let (r, n) = (old_winners.get(&partition), new_winners.get(&partition));
        if r != n {
            return Err(PlanConflict::Winner {
                load: load(),
                partition,
                recorded: r.map(|a| (*a).clone()),
                new: n.map(|a| (*a).clone()),
            });
        }
    }
    let part_conflict = |p: &PlannedPart, detail: String| PlanConflict::Part {
        load: load(),
        partition: p.partition,
        attempt: p.attempt.clone(),
        part: p.name.to_string(),
        detail,
    };
    let new_parts: HashMap<&PartName, &PlannedPart> =
        new.parts.iter().map(|p| (&p.name, p)).collect();
    for r in &recorded.parts {
        match new_parts.get(&r.name) {
            None => {
                return Err(part_conflict(
                    r,
                    "is in the recorded plan but not in this commit's manifests".into(),
                ))
            }
            Some(n) if *n != r => {
                return Err(part_conflict(
                    r,
                    format!(
                        "was recorded with {} rows, {} bytes, hash {} and is now given with {} rows, {} bytes, hash {}",
                        r.rows, r.bytes, r.hash_of_all_files, n.rows, n.bytes, n.hash_of_all_files
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    let recorded_names: BTreeSet<&PartName> = recorded.parts.iter().map(|p| &p.name).collect();
    if let Some(n) = new.parts.iter().find(|p| !recorded_names.contains(&p.name)) {
        return Err(part_conflict(
            n,
            "is in this commit's manifests but not in the recorded plan".into(),
        ));
    }
    if recorded.emptied != new.emptied {
        return Err(PlanConflict::Emptied {
            load: load(),
            recorded: recorded.emptied.clone(),
            new: new.emptied.clone(),
        });
    }
    // The winners are equal by now, so both plans list one manifest per winner, in order.
    if !recorded.manifests.is_empty() {
        if let Some(i) = recorded
            .manifests
            .iter()
            .zip(&new.manifests)
            .position(|(r, n)| r != n)
        {
            let (partition, attempt) = recorded.winners[i].clone();
            return Err(PlanConflict::Manifest {
                load: load(),
                partition,
                attempt,
            });
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3. Ledger entries and resume decisions
// ---------------------------------------------------------------------------------------------

/// Entry id of the plan (body: [`CommitPlan::to_json`]).
pub const PLAN_ENTRY: &str = "plan";
/// Entry id recording that the load is committed.
pub const COMMIT_ENTRY: &str = "commit";
/// Prefix of an attach intent's id, written before ATTACH PART.
pub const ATTACH_INTENT_PREFIX: &str = "attach:";
/// Prefix of an attach outcome's id.
pub const ATTACHED_PREFIX: &str = "attached:";
/// Prefix of a publish intent's id, written before MOVE or REPLACE PARTITION.
pub const PUBLISH_INTENT_PREFIX: &str = "publish:";
/// Prefix of a publish outcome's id.
pub const PUBLISHED_PREFIX: &str = "published:";
/// Entry id recording that the shadow was swapped in for the target (overwrite mode).
pub const EXCHANGED_ENTRY: &str = "exchanged";

/// A ledger entry commit writes, by what its id says.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CommitEntry {
    /// `plan`.
    Plan,
    /// `attach:<part>`: about to send ATTACH PART.
    AttachIntent(PartName),
    /// `attached:<part>`: the part is attached.
    Attached(PartName),
    /// `publish:<partition id>`: about to send MOVE or REPLACE PARTITION.
    PublishIntent(PartitionId),
    /// `published:<partition id>`: the partition is in the target.
    Published(PartitionId),
    /// `exchanged`: the shadow is the target now (overwrite mode).
    Exchanged,
    /// `commit`.
    Commit,
}

/// An entry id with a commit prefix but an invalid part name or partition id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ledger entry id {entry_id} has a commit prefix but {problem}")]
pub struct EntryIdError {
    /// The id, quoted and escaped.
    pub entry_id: String,
    /// What is wrong after the prefix.
    pub problem: String,
}

impl CommitEntry {
    /// The entry id.
    pub fn id(&self) -> String {
        self.to_string()
    }

    /// The entry for `id`: `Ok(None)` for ids commit does not write (`open`, ...), an error
    /// for a commit prefix followed by something that is not a part name or partition id.
    pub fn parse(id: &str) -> Result<Option<CommitEntry>, EntryIdError> {
        let err = |problem: String| EntryIdError {
            entry_id: format!("\"{}\"", escape(id)),
            problem,
        };
        let part = |s: &str| {
            s.parse::<PartName>()
                .map_err(|e| err(format!("no part name: {e}")))
        };
        let partition = |s: &str| {
            s.parse::<PartitionId>()
                .map_err(|e| err(format!("no partition id: {e}")))
        };
        Ok(Some(match id {
            PLAN_ENTRY => CommitEntry::Plan,
            COMMIT_ENTRY => CommitEntry::Commit,
            EXCHANGED_ENTRY => CommitEntry::Exchanged,
            _ => {
                if let Some(rest) = id.strip_prefix(ATTACH_INTENT_PREFIX) {
                    CommitEntry::AttachIntent(part(rest)?)
                } else if let Some(rest) = id.strip_prefix(ATTACHED_PREFIX) {
                    CommitEntry::Attached(part(rest)?)
                } else if let Some(rest) = id.strip_prefix(PUBLISH_INTENT_PREFIX) {
                    CommitEntry::PublishIntent(partition(rest)?)
                } else if let Some(rest) = id.strip_prefix(PUBLISHED_PREFIX) {
                    CommitEntry::Published(partition(rest)?)
                } else {
                    return Ok(None);
                }
            }
        }))
    }
}

impl fmt::Display for CommitEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommitEntry::Plan => f.write_str(PLAN_ENTRY),
            CommitEntry::Commit => f.write_str(COMMIT_ENTRY),
            CommitEntry::Exchanged => f.write_str(EXCHANGED_ENTRY),
            CommitEntry::AttachIntent(p) => write!(f, "{ATTACH_INTENT_PREFIX}{p}"),
            CommitEntry::Attached(p) => write!(f, "{ATTACHED_PREFIX}{p}"),
            CommitEntry::PublishIntent(p) => write!(f, "{PUBLISH_INTENT_PREFIX}{p}"),
            CommitEntry::Published(p) => write!(f, "{PUBLISHED_PREFIX}{p}"),
        }
    }
}

/// What the ledger says commit has done so far (the plan itself is passed separately).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitProgress {
    /// Parts with an `attach:` intent.
    pub attach_intents: BTreeSet<PartName>,
    /// Parts recorded `attached:`.
    pub attached: BTreeSet<PartName>,
    /// Partitions with a `publish:` intent.
    pub publish_intents: BTreeSet<PartitionId>,
    /// Partitions recorded `published:`.
    pub published: BTreeSet<PartitionId>,
    /// `exchanged` is recorded (overwrite mode).
    pub exchanged: bool,
    /// `commit` is recorded.
    pub committed: bool,
}

impl CommitProgress {
    /// Progress from a load's replayed entry ids; ids commit does not write are ignored.
    pub fn from_entry_ids<'a>(
        ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<CommitProgress, EntryIdError> {
        let mut progress = CommitProgress::default();
        for id in ids {
            if let Some(entry) = CommitEntry::parse(id)? {
                progress.record(entry);
            }
        }
        Ok(progress)
    }

    /// Adds one entry.
    pub fn record(&mut self, entry: CommitEntry) {
        match entry {
            CommitEntry::Plan => {}
            CommitEntry::AttachIntent(p) => _ = self.attach_intents.insert(p),
            CommitEntry::Attached(p) => _ = self.attached.insert(p),
            CommitEntry::PublishIntent(p) => _ = self.publish_intents.insert(p),
            CommitEntry::Published(p) => _ = self.published.insert(p),
            CommitEntry::Exchanged => self.exchanged = true,
            CommitEntry::Commit => self.committed = true,
        }
    }
}

/// Where a (re-)started commit of a load is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitPhase {
    /// No plan recorded: compute it from the winners and record it.
    NeedsPlan,
    /// These planned parts (in plan order) are not recorded attached: decide each with
    /// [`decide_part`].
    AttachParts {
        /// The parts not recorded attached.
        pending: Vec<PartName>,
    },
    /// Partition visibility, every part attached: these partitions (sorted) are not recorded
    /// published: decide each with [`decide_partition`].
    PublishPartitions {
        /// The partitions not recorded published.
        pending: Vec<PartitionId>,
    },
    /// Overwrite mode, every part attached into the shadow: the shadow is not recorded swapped
    /// in: decide with [`decide_exchange`].
    ExchangeTable,
    /// Everything attached (and published): record `commit`.
    MarkCommitted,
    /// `commit` is recorded: nothing to do.
    Done,
}

/// The phase of a commit, from the recorded plan (the body of the `plan` entry, `None` when
/// there is none) and the ledger's progress. Entries for parts or partitions outside the plan
/// are ignored: only the plan decides what is committed.
pub fn commit_phase(plan: Option<&CommitPlan>, progress: &CommitProgress) -> CommitPhase {
    if progress.committed {
        return CommitPhase::Done;
    }
    let Some(plan) = plan else {
        return CommitPhase::NeedsPlan;
    };
    let pending: Vec<PartName> = plan
        .parts
        .iter()
        .filter(|p| !progress.attached.contains(&p.name))
        .map(|p| p.name.clone())
        .collect();
    if !pending.is_empty() {
        return CommitPhase::AttachParts { pending };
    }
    if plan.mode == Mode::Overwrite {
        return if progress.exchanged {
            CommitPhase::MarkCommitted
        } else {
            CommitPhase::ExchangeTable
        };
    }
    if plan.visibility == Visibility::Partition {
        let pending: Vec<PartitionId> = plan
            .to_publish()
            .iter()
            .filter(|p| !progress.published.contains(&p.partition_id))
            .map(|p| p.partition_id.clone())
            .collect();
        if !pending.is_empty() {
            return CommitPhase::PublishPartitions { pending };
        }
    }
    CommitPhase::MarkCommitted
}

/// What is known about one planned part, observed just before deciding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartFacts {
    /// The ledger has `attached:<part>`.
    pub recorded_attached: bool,
    /// The ledger has `attach:<part>`.
    pub attach_intent: bool,
    /// `detached/<part>` exists in the attach table (the publish table).
    pub in_detached: bool,
    /// `detached/attaching_<part>` exists: an ATTACH holds it, or a crashed server left it.
    pub attaching_leftover: bool,
    /// The leftover's directory was last modified no later than the running server started
    /// (both in whole seconds). Every crashed claim passes; a claim this server made passes
    /// only within its first seconds or in the instant between the claiming rename (which
    /// keeps the directory's old mtime) and ATTACH's first write into it, so this alone never
    /// proves a crash: see [`claim_crashed`].
    pub claim_predates_server_start: bool,
    /// The server's process list, read after the table was observed, holds an ATTACH query on
    /// the table (any part: `ATTACH PARTITION` claims many).
    pub attach_running: bool,
    /// The ledger was read *after* the table was observed. A commit records `attach:<part>`
    /// before it sends ATTACH, so a part that left `detached/` before the observation has its
    /// intent in any ledger read made after it; a read made before may simply be too old.
    pub ledger_read_after_observation: bool,
}

/// What to do about one planned part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartStep {
    /// Recorded attached: nothing to do.
    Skip,
    /// Attached but not recorded: write `attached:<part>`.
    RecordAttached,
    /// Still in `detached/`: write `attach:<part>` (unless recorded), send ATTACH PART, then
    /// observe again (after a success, a failure or a timeout alike).
    Attach,
    /// An ATTACH holds the part (`attaching_` leftover): touch nothing, observe again later.
    Wait,
    /// A crashed ATTACH of this load left `detached/attaching_<part>` and nothing holds it any
    /// more: rename it back to `detached/<part>` (never over an existing one), then observe
    /// again (the next round attaches it).
    Reclaim,
    /// Gone, and the ledger read is older than the observation: read the ledger again (a
    /// concurrent commit may have attached it meanwhile) and decide with that read.
    ReadLedger,
    /// Gone without a trace, even in a ledger read made after the observation: report
    /// [`PartLost`].
    Lost,
}

/// Decides the next step for one planned part (see the module doc for why it is safe).
///
/// Only the ledger says a part was attached: an active part with the same
/// `hash_of_all_files` is no proof (identical rows loaded twice have identical parts), and a
/// part is lost only when a ledger read taken after the observation still holds no intent for
/// it, so a merge or MOVE of an attached part, or a ledger read that predates a concurrent
/// commit's work, never makes it look lost.
pub fn decide_part(facts: &PartFacts) -> PartStep {
    if facts.recorded_attached {
        PartStep::Skip
    } else if facts.attaching_leftover {
        // Only a claim of this load's own ATTACH (intent recorded, so the part was verified
        // before it) is taken back, and never while a copy sits in detached/ (the rename
        // back could not succeed, and that state is not chpart's).
        let ours = facts.attach_intent && !facts.in_detached;
        if ours && claim_crashed(facts.claim_predates_server_start, facts.attach_running) {
            PartStep::Reclaim
        } else {
            PartStep::Wait
        }
    } else if facts.in_detached {
        PartStep::Attach
    } else if facts.attach_intent {
        PartStep::RecordAttached
    } else if !facts.ledger_read_after_observation {
        PartStep::ReadLedger
    } else {
        PartStep::Lost
    }
}

/// Whether an `attaching_<part>` directory is a crashed claim that no ATTACH holds any more,
/// from two observations made after the leftover was seen: whether its directory was last
/// modified before the running server started, and whether an ATTACH on its table is running.
///
/// ATTACH PART claims `detached/<n>` by renaming it to `detached/attaching_<n>`, writes into it
/// while it loads the part, and then renames that same directory into the table: a query holds
/// the claim from the first rename until the last (or until its failure renames it back), and
/// it is in the server's process list the whole time. A claim made after the table was
/// observed cannot be the leftover seen (it would have needed `detached/<n>`), so "no ATTACH
/// running, read after the observation" proves that nothing holds it. The start-time check
/// alone proves nothing (the claiming rename keeps the directory's old mtime until ATTACH's
/// first write, and both clocks are whole seconds), but it keeps a leftover made by the
/// running server out when the process list is wrong about it: only a restart makes claims
/// nobody finishes.
pub fn claim_crashed(predates_server_start: bool, attach_running: bool) -> bool {
    predates_server_start && !attach_running
}

/// A planned part that was removed from `detached/` without being attached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("load {load} partition {partition} attempt {attempt}: part {part} (hash {hash}) is lost: it is not in detached/, no ATTACH holds it, and the ledger, read after looking, records no attach of it; something removed it (a manual DROP DETACHED, or gc run against an open load). The load cannot be committed as planned: abort it (`chpart abort --force` once a commit claimed it; rows it already made visible stay: `chpart status --load` shows which partitions were published) and load again only what is not visible")]
pub struct PartLost {
    /// The load.
    pub load: LoadId,
    /// The Spark partition.
    pub partition: u32,
    /// The attempt that built it.
    pub attempt: AttemptId,
    /// The part.
    pub part: String,
    /// Its `hash_of_all_files`.
    pub hash: String,
}

impl PartLost {
    /// The error for `part` of `plan`.
    pub fn new(plan: &CommitPlan, part: &PlannedPart) -> PartLost {
        PartLost {
            load: plan.load.clone(),
            partition: part.partition,
            attempt: part.attempt.clone(),
            part: part.name.to_string(),
            hash: part.hash_of_all_files.clone(),
        }
    }
}

/// What is known about one planned ClickHouse partition once all its parts are attached into
/// the shadow, observed just before deciding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionFacts {
    /// The ledger has `published:<id>`.
    pub recorded_published: bool,
    /// Active rows of the partition in the shadow.
    pub shadow_rows: u64,
    /// Rows the plan puts into the partition (> 0, but 0 for a partition the plan empties:
    /// [`CommitPlan::emptied`]).
    pub planned_rows: u64,
    /// Replace mode: the multiset of the target partition's active part hashes equals the
    /// shadow's (for a partition the plan empties: the target partition has no active part).
    pub target_has_plan_hashes: bool,
    /// Replace mode: the ledger has `publish:<id>` (read after the observation), so a REPLACE
    /// may have run.
    pub publish_intent: bool,
    /// Replace mode: the target partition holds an active part that is neither a copy of one
    /// of the shadow's (same hash) nor made only of blocks the table had handed out when the
    /// intent was recorded (an old part, or a merge of old parts: a merge keeps its sources'
    /// highest block number, and every part entering the table gets a new, higher one). What a
    /// crash inside REPLACE can leave is old parts and copies, so such a part arrived since.
    pub target_foreign: bool,
    /// Replace mode: every such part is a merge (level > 0), none of the old parts is left,
    /// and the partition holds exactly the planned rows: the REPLACE went through and the
    /// target merged its copies since.
    pub target_merged_plan: bool,
}

/// What to do about one planned partition (partition visibility).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionStep {
    /// Recorded published: nothing to do.
    Skip,
    /// Published but not recorded: write `published:<id>`.
    RecordPublished,
    /// Append: write `publish:<id>` (unless recorded), send `ALTER TABLE shadow MOVE PARTITION
    /// ID '<id>' TO TABLE target`, observe again.
    Move,
    /// Replace: write `publish:<id>` (unless recorded), send `ALTER TABLE target REPLACE
    /// PARTITION ID '<id>' FROM shadow`, observe again.
    Replace,
    /// A state chpart cannot explain: report [`PartitionBroken`].
    Broken,
    /// Replace: the target partition holds rows that arrived after this load's REPLACE was
    /// intended; running REPLACE again would remove them: report [`ForeignPart`].
    Foreign,
}

/// Decides the next step for one planned partition, all of whose parts are recorded attached
/// into the shadow (see the module doc for why it is safe).
///
/// Append: the shadow holds all planned rows (move them) or none (they were moved; only a MOVE
/// empties a shadow partition of an open load). Replace: REPLACE copies, so the shadow must
/// always hold all planned rows, and the partition is published exactly when the target's
/// parts are the shadow's, or their merge. REPLACE runs again only while everything in the
/// target partition is explained: the parts it held when the intent was recorded and copies
/// of the shadow's (not replaced yet, or a crash inside REPLACE, which is not crash-atomic
/// upstream, left old and new parts). Anything else arrived from elsewhere after the intent
/// (an INSERT, another load's MOVE), and a REPLACE would silently remove it: the commit stops
/// instead. Before the intent, REPLACE is the first one and replaces the partition, as the
/// mode says.
///
/// # Panics
///
/// If `planned_rows` is 0 in append mode: only a replace plan empties partitions
/// ([`CommitPlan::from_json`] and [`validate_winners`] refuse parts without rows), so this is
/// a caller bug; in overwrite mode, which swaps the table instead ([`decide_exchange`]).
pub fn decide_partition(mode: Mode, facts: &PartitionFacts) -> PartitionStep {
    assert!(
        facts.planned_rows > 0 || mode == Mode::Replace,
        "an appended partition always has rows: {facts:?}"
    );
    if facts.recorded_published {
        return PartitionStep::Skip;
    }
    let foreign = facts.publish_intent && facts.target_foreign;
    match mode {
        Mode::Append if facts.shadow_rows == facts.planned_rows => PartitionStep::Move,
        Mode::Append if facts.shadow_rows == 0 => PartitionStep::RecordPublished,
        Mode::Append => PartitionStep::Broken,
        Mode::Replace if facts.shadow_rows != facts.planned_rows => PartitionStep::Broken,
        Mode::Replace if facts.target_has_plan_hashes => PartitionStep::RecordPublished,
        Mode::Replace if foreign && facts.target_merged_plan => PartitionStep::RecordPublished,
        Mode::Replace if foreign => PartitionStep::Foreign,
        Mode::Replace => PartitionStep::Replace,
        Mode::Overwrite => {
            panic!("an overwrite load swaps the whole table; it publishes no partition on its own")
        }
    }
}

/// Where one of an overwrite load's two tables is, found by its UUID (which a table keeps
/// through RENAME and EXCHANGE in an Atomic database).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableAt {
    /// Under the target's name.
    Target,
    /// Under this commit's own claim name (no other process uses it).
    Mine,
    /// Under another name: the shadow's own, or another commit's claim name.
    Other,
    /// Nowhere: the table was dropped.
    Missing,
}

/// What is known about an overwrite load's swap, observed just before deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExchangeFacts {
    /// The ledger has `exchanged`.
    pub recorded_exchanged: bool,
    /// Where the shadow (the new table, every planned part attached into it) is.
    pub new: TableAt,
    /// Where the table `begin` found under the target's name (the old rows) is.
    pub old: TableAt,
}

/// What to do about an overwrite load's swap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExchangeStep {
    /// Recorded: nothing to do.
    Skip,
    /// Swapped but not recorded: write `exchanged`.
    RecordExchanged,
    /// Take the new table for this commit: `RENAME TABLE <where it is> TO <my claim name>`,
    /// then observe again.
    Claim,
    /// The new table is this commit's and the old one is the target: `EXCHANGE TABLES target
    /// AND <my claim name>`, then observe again.
    Exchange,
    /// A state chpart cannot explain (a table dropped, or renamed by someone else): stop.
    Broken,
}

/// Decides the next step of an overwrite load's swap (all its parts are attached into the
/// shadow, the load's decision is this commit's).
///
/// `EXCHANGE TABLES` swaps two names in one step, but it is its own inverse: a second swap by
/// a racing (or resumed) commit would put the old rows back. So a commit first claims the new
/// table by renaming it to a name only it uses (a rename of a name succeeds once), and swaps
/// only its own claim, after observing that the new table is under that name and the old one
/// under the target's. A racing commit may take the claim away (rename it to its own name);
/// then the first commit's swap fails for want of the table and it observes again. Tables are
/// found by UUID, which RENAME and EXCHANGE keep, so "the new table is under the target's
/// name" is exactly "swapped", whoever swapped it.
pub fn decide_exchange(facts: &ExchangeFacts) -> ExchangeStep {
    use TableAt::{Mine, Missing, Other, Target};
    if facts.recorded_exchanged {
        return ExchangeStep::Skip;
    }
    match (facts.new, facts.old) {
        (Target, Mine | Other | Missing) => ExchangeStep::RecordExchanged,
        (Mine, Target) => ExchangeStep::Exchange,
        (Other, Target) => ExchangeStep::Claim,
        (Missing, _) | (Mine | Other, Mine | Other | Missing) | (Target, Target) => {
            ExchangeStep::Broken
        }
    }
}

/// A planned partition in a state chpart cannot explain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("load {load} partition {partition_id} ({mode} mode): the shadow table holds {shadow_rows} rows of it, but the plan put {planned_rows} there and {}; something other than this load changed the shadow table. Inspect it before retrying", if *.mode == Mode::Append { "a MOVE leaves all or none" } else { "REPLACE copies, so all must still be there" })]
pub struct PartitionBroken {
    /// The load.
    pub load: LoadId,
    /// The ClickHouse partition.
    pub partition_id: PartitionId,
    /// The mode.
    pub mode: Mode,
    /// Rows in the shadow.
    pub shadow_rows: u64,
    /// Rows planned.
    pub planned_rows: u64,
}

impl PartitionBroken {
    /// The error for partition `partition_id` of `plan`, observed with `facts`.
    pub fn new(plan: &CommitPlan, partition_id: &PartitionId, facts: &PartitionFacts) -> Self {
        PartitionBroken {
            load: plan.load.clone(),
            partition_id: partition_id.clone(),
            mode: plan.mode,
            shadow_rows: facts.shadow_rows,
            planned_rows: facts.planned_rows,
        }
    }
}

/// A replace load's target partition holds a part this load can neither explain nor remove.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("load {load} partition {partition_id} (replace mode): the target holds part {part} ({rows} rows, hash {hash}), which is neither a copy of the load's shadow nor a part the partition held when its REPLACE was intended: rows arrived from elsewhere (an INSERT, another load) after this load began replacing the partition, and REPLACE again would silently remove them. Nothing was removed; decide what the partition should hold, then re-run commit (after removing the foreign rows) or `chpart abort --force` the load")]
pub struct ForeignPart {
    /// The load.
    pub load: LoadId,
    /// The ClickHouse partition.
    pub partition_id: PartitionId,
    /// The foreign part's name in the target.
    pub part: String,
    /// Its `hash_of_all_files`.
    pub hash: String,
    /// Its rows.
    pub rows: u64,
}

/// One open load in replace mode, as another load of the same table sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenReplaceLoad {
    /// The load.
    pub load: LoadId,
    /// The partitions its recorded plan replaces; `None` before it recorded one.
    pub planned: Option<BTreeSet<PartitionId>>,
    /// It is an overwrite load: its plan replaces the whole table, whatever partitions it has.
    pub whole_table: bool,
}

/// The first other open replace or overwrite load of the table whose plan replaces any of
/// `mine`, with the partitions both replace (sorted; empty when one of the two is an overwrite,
/// `whole_table`, which replaces every partition). Two such loads of one partition would each
/// replace the other's rows, and the one that publishes last wins silently; a load without a
/// plan yet claims nothing (it checks against this one when it plans).
pub fn replace_overlap(
    mine: &BTreeSet<PartitionId>,
    whole_table: bool,
    others: &[OpenReplaceLoad],
) -> Option<(LoadId, Vec<PartitionId>)> {
    others.iter().find_map(|other| {
        let planned = other.planned.as_ref()?;
        if whole_table || other.whole_table {
            return Some((other.load.clone(), Vec::new()));
        }
        let shared: Vec<PartitionId> = planned.intersection(mine).cloned().collect();
        (!shared.is_empty()).then(|| (other.load.clone(), shared))
    })
}

/// One partition whose attached rows differ from the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowDiff {
    /// The ClickHouse partition.
    pub partition_id: PartitionId,
    /// Rows the winners' parts hold.
    pub planned: u64,
    /// Rows attached.
    pub attached: u64,
}

impl fmt::Display for RowDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "partition {}: the winners' parts hold {} rows, {} are attached",
            self.partition_id, self.planned, self.attached
        )
    }
}

/// The rows attached differ from the rows planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("load {load}: rows attached differ from the plan in {}", list(.diffs, "partition"))]
pub struct RowMismatch {
    /// The load.
    pub load: LoadId,
    /// Every partition that differs, sorted.
    pub diffs: Vec<RowDiff>,
}

/// Checks, per ClickHouse partition, that the rows attached (`attached_rows_by_partition`, the
/// load's rows only, e.g. the shadow's rows before any MOVE) equal the sum of the winners' part
/// rows. A partition attached but not planned counts as planned with 0 rows.
pub fn reconcile_rows(
    plan: &CommitPlan,
    attached_rows_by_partition: &BTreeMap<PartitionId, u64>,
) -> Result<(), RowMismatch> {
    let planned: BTreeMap<&PartitionId, u64> = plan
        .partitions
        .iter()
        .map(|p| (&p.partition_id, p.rows))
        .collect();
    let ids: BTreeSet<&PartitionId> = planned
        .keys()
        .copied()
        .chain(attached_rows_by_partition.keys())
        .collect();
    let diffs: Vec<RowDiff> = ids
        .into_iter()
        .filter_map(|id| {
            let planned = planned.get(id).copied().unwrap_or(0);
            let attached = attached_rows_by_partition.get(id).copied().unwrap_or(0);
            (planned != attached).then(|| RowDiff {
                partition_id: id.clone(),
                planned,
                attached,
            })
        })
        .collect();
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(RowMismatch {
            load: plan.load.clone(),
            diffs,
        })
    }
}

/// The parts attached into a partition are not exactly the planned ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("partition {partition_id}: {detail}")]
pub struct HashMismatch {
    /// The load.
    pub load: LoadId,
    /// The ClickHouse partition.
    pub partition_id: PartitionId,
    /// Which part differs, and how.
    pub detail: String,
}

/// Checks, per ClickHouse partition of `plan`, that the active parts attached there
/// (`attached_hashes`: their `hash_of_all_files`, the digest of each part's `checksums.txt`)
/// are exactly the planned parts' (as a multiset: two planned parts with identical content
/// have one hash). Only meaningful for a table that holds nothing but the load's parts and
/// does not merge (the shadow). The first difference names a planned part that is missing
/// (its `checksums.txt` changed, or it is not there) or a hash the plan does not have.
pub fn reconcile_hashes(
    plan: &CommitPlan,
    attached_hashes: &BTreeMap<PartitionId, Vec<String>>,
) -> Result<(), HashMismatch> {
    for partition in &plan.partitions {
        let id = &partition.partition_id;
        let mut have: Vec<&str> = attached_hashes
            .get(id)
            .map(|h| h.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let mismatch = |detail: String| HashMismatch {
            load: plan.load.clone(),
            partition_id: id.clone(),
            detail,
        };
        for part in plan.parts.iter().filter(|p| &p.partition_id == id) {
            match have.iter().position(|h| *h == part.hash_of_all_files) {
                Some(i) => _ = have.swap_remove(i),
                None => {
                    return Err(mismatch(format!(
                        "no attached part has the hash {} of part {} (attempt {}, Spark partition {}): its checksums.txt differs from what the builder wrote",
                        part.hash_of_all_files, part.name, part.attempt, part.partition
                    )))
                }
            }
        }
        if let Some(extra) = have.first() {
            return Err(mismatch(format!(
                "an attached part has hash {extra}, which no planned part has"
            )));
        }
    }
    Ok(())
}
