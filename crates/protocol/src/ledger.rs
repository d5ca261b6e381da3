//! The ledger: the durable, append-only record of every load and every step of it.
//!
//! It lives in ClickHouse itself (a MergeTree table in the configured database, created on first
//! use, with fsync on insert) because every party must read it: the driver that opens and
//! commits a load, a driver restarted on another machine, and every executor, which checks just
//! before publishing that its load is still open (fencing). Entries are never updated; the state
//! of a load is derived by replaying them ([`replay`], pure, tested with scenario tables).
//!
//! Writes are idempotent: every entry carries an `entry_id` that names the fact it records
//! (`open`, `commit`, `attach:<part>`, ...), and replay keeps the first entry of each id, so a
//! retried insert, or two drivers recording the same fact, change nothing. The facts of
//! which a load has exactly one, whose body racing writers may disagree on (the load's spec
//! from `begin`, the commit plan with its winners, the decision), are written with a
//! deduplication token of the load and the entry id (`Ledger::append_once`): the server keeps
//! the first body to reach the table and each writer reads back whose that was.
//!
//! Whether a load ends committed or aborted is settled before anything becomes visible, by a
//! **decision** entry that `commit` (before its first visible step) and `abort` (before removing
//! anything) both try to write with the same `insert_deduplication_token`: the server keeps
//! exactly one of them, the first to reach the table, and each writer reads back which one that
//! was. Write times decide nothing here: an INSERT's timestamp is taken when it starts, not when
//! it becomes visible, so "the earlier entry" is not what a racing reader saw.

use std::collections::HashSet;

use chpart_core::{Destination, DiskPlace, LoadId, PathError, RemotePath, StagingLayout, TableRef};
use serde::{Deserialize, Serialize};

use crate::snapshot::TableSnapshot;

/// The ledger table's name inside the ledger database.
pub const LEDGER_TABLE: &str = "ledger";

pub use chpart_core::commit::{Mode, Visibility};

/// What `begin` records: everything an executor needs to build parts for this load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSpec {
    /// The load.
    pub load: LoadId,
    /// The table the rows are for.
    pub target: TableRef,
    /// Append or replace.
    pub mode: Mode,
    /// Partition or part visibility.
    pub visibility: Visibility,
    /// The table whose `detached/` executors publish into: a shadow table of the target for
    /// partition visibility, the target itself for part visibility.
    pub publish: TableRef,
    /// The target's definition when the load began.
    pub target_snapshot: TableSnapshot,
    /// The publish table's definition and data paths (equal to the target's for part visibility).
    pub publish_snapshot: TableSnapshot,
    /// The server's version when the load began.
    pub server_version: String,
    /// The server's time zone (`SELECT timezone()`) when the load began: clickhouse-local
    /// builds in it, so partition ids of `DateTime` columns without a zone are the server's.
    /// `None` for loads begun by a chpart that did not record it.
    #[serde(default)]
    pub server_timezone: Option<String>,
    /// The driver's clickhouse-local version when the load began (`None`: it could not run
    /// there or was not asked), for operators; every build checks its own.
    #[serde(default)]
    pub clickhouse_local_version: Option<String>,
    /// Host name parts are published on (from the config), recorded in manifests.
    pub host: String,
    /// The disks of the publish table parts go to, each with its data path and staging root
    /// (see `chpart_core::destination`). Empty for loads begun by a chpart that did not record
    /// them: those publish to the one data path under the configured staging root.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub publish_disks: Vec<DiskPlace>,
    /// For a load into a `Distributed` table: its cluster, routing and one sub-load per shard
    /// (see `crate::cluster`). `None` for a load into one table on one server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::shards::ClusterSpec>,
    /// For a shard's sub-load of a cluster load: the load and shard it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_of: Option<crate::shards::ShardOf>,
    /// For a load begun by `chpart load`: what it reads, so that a re-run with other inputs is
    /// refused. `None` for loads begun otherwise (`chpart begin`, Spark).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<LoadInputs>,
    /// When the load began (ms since the Unix epoch), on the ledger server's clock (that of
    /// every entry's `written_at`; specs written before this was so hold the driver's clock).
    pub opened_at_unix_ms: u64,
}

/// What a `chpart load` reads, recorded when it begins the load: a re-run of the same command
/// must read the same data (and then finishes the load), another command with the load's id is
/// refused. The files' contents decide, not their paths: a retry on another machine, with the
/// files downloaded elsewhere, is the same load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadInputs {
    /// Input files (0 for an Arrow stream on stdin).
    pub files: u64,
    /// Their total size in bytes.
    pub bytes: u64,
    /// sha256 of the sorted lines `<sha256 of a file> <its bytes>`, one per file; `stdin` for an
    /// Arrow stream on stdin, whose content cannot be known before it is read.
    pub digest: String,
    /// How many builds (partitions `0..builds`) the files are split into: chosen by the first
    /// run and followed by every re-run, whatever its `--jobs`.
    pub builds: u32,
}

impl LoadInputs {
    /// Whether `other` names the same data (the number of builds is the recorded run's choice).
    pub fn same_data(&self, other: &LoadInputs) -> bool {
        self.files == other.files && self.bytes == other.bytes && self.digest == other.digest
    }

    /// A line naming the data, for messages.
    pub fn describe(&self) -> String {
        if self.digest == STDIN_DIGEST {
            "an Arrow stream on stdin".to_owned()
        } else {
            format!(
                "{} file(s), {} bytes, content sha256 {}",
                self.files, self.bytes, self.digest
            )
        }
    }
}

/// [`LoadInputs::digest`] of an Arrow stream on stdin.
pub const STDIN_DIGEST: &str = "stdin";

/// The arguments of `begin` that must match for a re-run to be a no-op.
impl LoadSpec {
    /// Whether `other` asks for the same load (same table, mode, visibility).
    pub fn same_request(&self, target: &TableRef, mode: Mode, visibility: Visibility) -> bool {
        &self.target == target && self.mode == mode && self.visibility == visibility
    }

    /// Where the load's parts go. A spec without recorded disks (from an older chpart) means
    /// the publish table's one data path, on the disk older builds recorded (`default`), under
    /// `configured` (the config's `staging.root`).
    pub fn destination(&self, configured: &StagingLayout) -> Result<Destination, PathError> {
        let disks = if self.publish_disks.is_empty() {
            let data_path = self
                .publish_snapshot
                .data_paths
                .first()
                .map(String::as_str)
                .unwrap_or("");
            vec![DiskPlace {
                disk: "default".into(),
                data_path: RemotePath::new(data_path)?,
                staging_root: configured.root().clone(),
            }]
        } else {
            self.publish_disks.clone()
        };
        Ok(Destination {
            host: self.host.clone(),
            disks,
        })
    }
}

/// One row of the ledger table (load, entry id, kind, when and by whom it was written, body).
pub use chpart_server::LedgerRow as Entry;

/// Entry kinds this chpart writes and understands.
pub mod kind {
    /// `begin` opened the load; body: [`super::LoadSpec`].
    pub const LOAD_OPENED: &str = "load_opened";
    /// The load is committed; body: a summary.
    pub const LOAD_COMMITTED: &str = "load_committed";
    /// The load is aborted; body: the reason.
    pub const LOAD_ABORTED: &str = "load_aborted";
    /// `commit` recorded its plan; body: `chpart_core::commit::CommitPlan`.
    pub const COMMIT_PLANNED: &str = "commit_planned";
    /// The commit of a cluster load recorded its plan (the winners' manifests of every shard);
    /// body: `crate::shards::ClusterPlan`.
    pub const CLUSTER_PLANNED: &str = "cluster_planned";
    /// `commit` is about to ATTACH a part.
    pub const ATTACH_INTENT: &str = "attach_intent";
    /// A part is attached.
    pub const PART_ATTACHED: &str = "part_attached";
    /// `commit` is about to MOVE or REPLACE a partition into the target.
    pub const PUBLISH_INTENT: &str = "publish_intent";
    /// A partition is in the target.
    pub const PARTITION_PUBLISHED: &str = "partition_published";
    /// Overwrite mode: the shadow was swapped in for the target (entry id `exchanged`).
    pub const TABLE_EXCHANGED: &str = "table_exchanged";
    /// An operator ended a load that a commit had claimed but cannot finish (`abort --force`);
    /// rows that commit already made visible stay. Body: when.
    pub const LOAD_ABANDONED: &str = "load_abandoned";
    /// A build found the load finished when it went to publish and published nothing (best
    /// effort, for the load's timeline); entry id `fenced:<attempt>`, body:
    /// [`super::FencedBody`].
    pub const ATTEMPT_FENCED: &str = "attempt_fenced";
    /// The load's outcome is settled; body: [`super::DecisionBody`]. Entry id `decision`,
    /// written with a deduplication token so that the server keeps only the first.
    pub const DECIDED: &str = "decided";
    /// gc removed everything the finished load left (`crate::cleanup::gc`), so later gc runs
    /// and `status` of all loads need none of its other entries; body: the load as `status`
    /// showed it then (`crate::cleanup::LoadStatus`). Entry id `gc-done`.
    pub const GC_DONE: &str = "gc_done";
    /// What one gc run saw (under the load id [`super::GC_RECORDS`], never a load's own);
    /// body: [`super::GcCheckpoint`].
    pub const GC_CHECKPOINT: &str = "gc_checkpoint";
}

/// The ledger's vocabulary of entry ids, defined with the commit's own in `chpart_core`.
pub use chpart_core::commit::entry;

/// Entry id of the decision.
pub use entry::DECISION as DECISION_ENTRY;

/// Entry kinds written by steps beyond `begin` (commit plans and outcomes); replay keeps them
/// for those steps instead of refusing them as unknown.
pub const KNOWN_KINDS: &[&str] = &[
    kind::COMMIT_PLANNED,
    kind::CLUSTER_PLANNED,
    kind::ATTACH_INTENT,
    kind::PART_ATTACHED,
    kind::PUBLISH_INTENT,
    kind::PARTITION_PUBLISHED,
    kind::TABLE_EXCHANGED,
    kind::ATTEMPT_FENCED,
];

/// The body of an [`kind::ATTEMPT_FENCED`] entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedBody {
    /// The attempt.
    pub attempt: String,
    /// Its Spark partition.
    pub partition: u32,
    /// When it started (executor clock, Unix milliseconds).
    pub started_at_unix_ms: u64,
}

/// The entry kinds `chpart ledger prune` keeps of a load it prunes: they alone settle a
/// finished load's state by [`replay`] (the same state as all of its entries give, see the
/// tests), so a pruned load still fences its builds, refuses `begin` (exit 5) and answers a
/// re-run of its commit with its summary, and gc's summary of it stays for `status`.
pub const TOMBSTONE_KINDS: &[&str] = &[
    kind::DECIDED,
    kind::LOAD_COMMITTED,
    kind::LOAD_ABORTED,
    kind::LOAD_ABANDONED,
    kind::GC_DONE,
];

/// The load id gc records its checkpoints under. No load's id can be it (a load id never
/// starts with `.`), so no load's replay ever sees them.
pub const GC_RECORDS: &str = ".gc";

/// How long before a checkpoint's view of the ledger gc looks again for loads with new
/// entries. An entry's `written_at` is taken when its INSERT starts, and the INSERT becomes
/// visible when it ends; a ledger INSERT of a few rows that takes longer than this to become
/// visible is not expected, so a load whose entries a gc run could not yet see is found by the
/// next one. Larger only costs each gc run the entries of this much more history.
pub const GC_REDISCOVERY_MARGIN_MS: i64 = 60 * 60 * 1000;

/// What a gc run saw, recorded once it finished without an error (entry kind
/// [`kind::GC_CHECKPOINT`] under [`GC_RECORDS`]): every load with an entry written before the
/// run looked ([`GcCheckpoint::covers_before`]) is either finished and done (a `gc_done` entry)
/// or listed in `pending`. A later run therefore reads only `pending` and the loads with
/// entries written since; a load that becomes done stays done, so every checkpoint ever
/// written stays true and the newest one serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcCheckpoint {
    /// Loads gc has to look at again: open ones, and finished ones it could not finish (a part
    /// a running ATTACH holds).
    pub pending: Vec<String>,
    /// Milliseconds from the start of the run's first ledger read to the INSERT of this entry
    /// (this machine's monotonic clock): with the entry's `written_at` (the server's clock)
    /// it bounds, on the server's clock, when the run looked.
    pub looked_ms_before_written: u64,
}

impl GcCheckpoint {
    /// Server time (ms) before which every entry written was visible to the run that recorded
    /// this checkpoint, written at `written_at_ms`, minus [`GC_REDISCOVERY_MARGIN_MS`]: the
    /// next run looks at every load with an entry written from here on.
    pub fn covers_before(&self, written_at_ms: i64) -> i64 {
        written_at_ms
            .saturating_sub(i64::try_from(self.looked_ms_before_written).unwrap_or(i64::MAX))
            .saturating_sub(GC_REDISCOVERY_MARGIN_MS)
    }
}

/// How a load ends, settled once by the first `decision` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// A commit claimed the load: it may make rows visible; abort must not remove anything.
    Commit,
    /// An abort claimed the load: no commit may make anything visible.
    Abort,
}

/// Body of a `decided` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// The outcome.
    pub decision: Decision,
}

impl DecisionBody {
    /// The `decided` entry's body for `decision`, as written.
    pub fn json(decision: Decision) -> String {
        serde_json::to_string(&DecisionBody { decision }).expect("a decision serializes")
    }
}

/// A load's state, derived from its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadState {
    /// No entry: the load was never begun.
    Unknown,
    /// Begun, neither committed nor aborted: executors may publish.
    Open,
    /// Committed: nothing may be published any more.
    Committed,
    /// Aborted: nothing may be published any more.
    Aborted,
}

impl LoadState {
    /// Name for messages and `status`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LoadState::Unknown => "unknown",
            LoadState::Open => "open",
            LoadState::Committed => "committed",
            LoadState::Aborted => "aborted",
        }
    }
}

/// The result of replaying a load's entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadView {
    /// The state.
    pub state: LoadState,
    /// The spec recorded by `begin`, if it was.
    pub spec: Option<LoadSpec>,
    /// The decision, once a commit or an abort claimed the load.
    pub decision: Option<Decision>,
    /// Entries after de-duplication, in write order.
    pub entries: Vec<Entry>,
}

impl LoadView {
    /// What the load's commit has done so far, from its entry ids; a malformed commit entry id
    /// is an error naming the entry, never skipped.
    pub fn progress(&self) -> Result<chpart_core::commit::CommitProgress, LedgerError> {
        let mut progress = chpart_core::commit::CommitProgress::default();
        for e in &self.entries {
            match chpart_core::commit::CommitEntry::parse(&e.entry_id) {
                Ok(Some(step)) => progress.record(step),
                Ok(None) => {}
                Err(err) => return Err(bad_entry(e, err.to_string())),
            }
        }
        Ok(progress)
    }

    /// The recorded commit plan, if any; one that does not read is an error naming the entry.
    pub fn plan(&self) -> Result<Option<chpart_core::commit::CommitPlan>, LedgerError> {
        self.entries
            .iter()
            .find(|e| e.entry_id == entry::PLAN)
            .map(|e| {
                chpart_core::commit::CommitPlan::from_json(&e.body)
                    .map_err(|err| bad_entry(e, err.to_string()))
            })
            .transpose()
    }

    /// Whether a commit recorded its plan (of one table, or of a cluster load): from then on
    /// the winners are the plan's, and a commit resumes without being given them.
    pub fn planned(&self) -> bool {
        self.entries
            .iter()
            .any(|e| e.entry_id == entry::PLAN || e.kind == kind::CLUSTER_PLANNED)
    }

    /// The entry by which gc recorded the load finished and cleaned, if it did.
    pub fn gc_done(&self) -> Option<&Entry> {
        self.entries.iter().find(|e| e.kind == kind::GC_DONE)
    }

    /// Whether the load is committed or aborted.
    pub fn finished(&self) -> bool {
        matches!(self.state, LoadState::Committed | LoadState::Aborted)
    }

    /// The body of the first entry of `kind`, read as `T`; one that does not read is an error
    /// naming the entry.
    pub fn body_of_kind<T: serde::de::DeserializeOwned>(
        &self,
        kind: &str,
    ) -> Result<Option<T>, LedgerError> {
        self.entries
            .iter()
            .find(|e| e.kind == kind)
            .map(body_of)
            .transpose()
    }
}

fn bad_entry(e: &Entry, message: String) -> LedgerError {
    LedgerError::BadEntry {
        load: e.load_id.clone(),
        entry_id: e.entry_id.clone(),
        kind: e.kind.clone(),
        message,
    }
}

/// A ledger that cannot be interpreted.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// An entry's body is not what its kind promises.
    #[error("ledger entry {entry_id:?} ({kind}) of load {load}: {message}")]
    BadEntry {
        /// The load.
        load: String,
        /// The entry.
        entry_id: String,
        /// Its kind.
        kind: String,
        /// What is wrong.
        message: String,
    },
    /// An entry of a kind this chpart does not know: written by a newer chpart.
    #[error("ledger entry {entry_id:?} of load {load} has kind {kind:?}, unknown to this chpart (written by a newer version?)")]
    UnknownKind {
        /// The load.
        load: String,
        /// The entry.
        entry_id: String,
        /// Its kind.
        kind: String,
    },
}

/// An entry's JSON body, or the error naming the entry.
pub(crate) fn body_of<T: serde::de::DeserializeOwned>(e: &Entry) -> Result<T, LedgerError> {
    serde_json::from_str(&e.body).map_err(|err| bad_entry(e, err.to_string()))
}

/// Derives a load's state from its entries (any order; sorted here by write time, then id).
/// The first entry of each `entry_id` counts. A decision fixes the outcome: `abort` makes the
/// load aborted, `commit` lets only a commit entry end it. Without a decision (ledgers written
/// before decisions existed, and loads never claimed), the first terminal entry fixes it.
/// Entries of kinds this function does not interpret but later steps write (plans, attach
/// outcomes) are kept in `entries` for those steps.
pub fn replay(mut entries: Vec<Entry>, known_kinds: &[&str]) -> Result<LoadView, LedgerError> {
    entries.sort_by(|a, b| (a.written_at_ms, &a.entry_id).cmp(&(b.written_at_ms, &b.entry_id)));
    let mut seen = HashSet::new();
    entries.retain(|e| seen.insert(e.entry_id.clone()));
    let mut state = LoadState::Unknown;
    let mut spec = None;
    let mut decision = None;
    for e in &entries {
        if e.kind == kind::DECIDED && decision.is_none() {
            decision = Some(body_of::<DecisionBody>(e)?.decision);
        }
    }
    for e in &entries {
        match e.kind.as_str() {
            kind::LOAD_OPENED => {
                if spec.is_none() {
                    spec = Some(body_of::<LoadSpec>(e)?);
                }
                if state == LoadState::Unknown {
                    state = LoadState::Open;
                }
            }
            kind::LOAD_COMMITTED
                if matches!(state, LoadState::Open | LoadState::Unknown)
                    && decision != Some(Decision::Abort) =>
            {
                state = LoadState::Committed
            }
            kind::LOAD_ABORTED
                if matches!(state, LoadState::Open | LoadState::Unknown)
                    && decision != Some(Decision::Commit) =>
            {
                state = LoadState::Aborted
            }
            // Ends the load whatever the decision; a commit entry after it does not count.
            kind::LOAD_ABANDONED if matches!(state, LoadState::Open | LoadState::Unknown) => {
                state = LoadState::Aborted
            }
            kind::LOAD_COMMITTED
            | kind::LOAD_ABORTED
            | kind::LOAD_ABANDONED
            | kind::DECIDED
            | kind::GC_DONE => {}
            other if known_kinds.contains(&other) => {}
            other => {
                return Err(LedgerError::UnknownKind {
                    load: e.load_id.clone(),
                    entry_id: e.entry_id.clone(),
                    kind: other.to_owned(),
                })
            }
        }
    }
    if decision == Some(Decision::Abort) {
        state = LoadState::Aborted;
    }
    Ok(LoadView {
        state,
        spec,
        decision,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, kind: &str, at: i64, body: &str) -> Entry {
        Entry {
            load_id: "L".into(),
            entry_id: id.into(),
            kind: kind.into(),
            written_at_ms: at,
            writer: "w".into(),
            body: body.into(),
        }
    }

    /// Replay's scenario table: (name, entries, state).
    fn scenarios() -> Vec<(&'static str, Vec<Entry>, LoadState)> {
        let spec = serde_json::to_string(&crate::snapshot::tests::sample_spec()).unwrap();
        let opened = |at| entry("open", kind::LOAD_OPENED, at, &spec);
        let committed = |at| entry("commit", kind::LOAD_COMMITTED, at, "{}");
        let aborted = |at| entry("abort", kind::LOAD_ABORTED, at, "{}");
        let abandoned = |at| entry("abandon", kind::LOAD_ABANDONED, at, "{}");
        let decided = |at, d: &str| {
            entry(
                DECISION_ENTRY,
                kind::DECIDED,
                at,
                &format!("{{\"decision\":\"{d}\"}}"),
            )
        };
        let rows: Vec<(&'static str, Vec<Entry>, LoadState)> = vec![
            ("nothing written", vec![], LoadState::Unknown),
            ("begun", vec![opened(1)], LoadState::Open),
            (
                "begun twice (retried insert)",
                vec![opened(1), opened(2)],
                LoadState::Open,
            ),
            (
                "committed",
                vec![opened(1), committed(5)],
                LoadState::Committed,
            ),
            ("aborted", vec![opened(1), aborted(5)], LoadState::Aborted),
            (
                "commit then a racing abort: first wins",
                vec![opened(1), committed(5), aborted(6)],
                LoadState::Committed,
            ),
            (
                "abort then a racing commit: first wins",
                vec![opened(1), committed(7), aborted(6)],
                LoadState::Aborted,
            ),
            (
                "entries out of order",
                vec![committed(5), opened(1)],
                LoadState::Committed,
            ),
            (
                "abort of a never-begun load fences it",
                vec![aborted(3)],
                LoadState::Aborted,
            ),
            (
                "decided commit, not finished: open",
                vec![opened(1), decided(4, "commit")],
                LoadState::Open,
            ),
            (
                "decided commit, then committed",
                vec![opened(1), decided(4, "commit"), committed(9)],
                LoadState::Committed,
            ),
            (
                "decided abort: aborted before its abort entry is written",
                vec![opened(1), decided(4, "abort")],
                LoadState::Aborted,
            ),
            (
                "an abort entry written after a commit decision does not count",
                vec![opened(1), aborted(3), decided(4, "commit")],
                LoadState::Open,
            ),
            (
                "a commit entry never overrides an abort decision",
                vec![opened(1), committed(3), decided(4, "abort")],
                LoadState::Aborted,
            ),
            (
                "abandoned after a commit decision (abort --force): aborted",
                vec![opened(1), decided(4, "commit"), abandoned(6)],
                LoadState::Aborted,
            ),
            (
                "a commit entry after the load was abandoned does not count",
                vec![opened(1), decided(4, "commit"), abandoned(6), committed(9)],
                LoadState::Aborted,
            ),
            (
                "abandoning a committed load changes nothing",
                vec![opened(1), decided(4, "commit"), committed(6), abandoned(9)],
                LoadState::Committed,
            ),
            (
                "two decision rows (deduplication window exceeded): the first counts",
                vec![
                    opened(1),
                    decided(4, "commit"),
                    decided(5, "abort"),
                    committed(9),
                ],
                LoadState::Committed,
            ),
            (
                "committed, then recorded done by gc",
                vec![
                    opened(1),
                    decided(4, "commit"),
                    committed(6),
                    entry(entry::GC_DONE, kind::GC_DONE, 9, "{}"),
                ],
                LoadState::Committed,
            ),
        ];
        rows
    }

    #[test]
    fn state_is_derived_by_replay() {
        for (name, entries, want) in scenarios() {
            let view = replay(entries, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(view.state, want, "{name}");
        }
    }

    /// What `chpart ledger prune` keeps of a finished load settles the same state as all of its
    /// entries, and an unfinished load's tombstone kinds never read as finished (so prune,
    /// which checks them, can never take an open load for a finished one).
    #[test]
    fn the_tombstone_kinds_alone_settle_a_finished_loads_state() {
        for (name, entries, want) in scenarios() {
            let kept: Vec<Entry> = entries
                .iter()
                .filter(|e| TOMBSTONE_KINDS.contains(&e.kind.as_str()))
                .cloned()
                .collect();
            let pruned = replay(kept, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
            match want {
                LoadState::Committed | LoadState::Aborted => {
                    assert_eq!(pruned.state, want, "{name}")
                }
                LoadState::Open | LoadState::Unknown => {
                    assert!(!pruned.finished(), "{name}: {:?}", pruned.state)
                }
            }
        }
    }

    #[test]
    fn a_checkpoint_covers_what_its_run_could_see_less_the_margin() {
        let checkpoint = GcCheckpoint {
            pending: vec![],
            looked_ms_before_written: 2_500,
        };
        assert_eq!(
            checkpoint.covers_before(10_000_000),
            10_000_000 - 2_500 - GC_REDISCOVERY_MARGIN_MS
        );
        let absurd = GcCheckpoint {
            pending: vec![],
            looked_ms_before_written: u64::MAX,
        };
        assert_eq!(absurd.covers_before(0), i64::MIN);
    }

    #[test]
    fn malformed_entries_are_errors_naming_the_entry() {
        let view = |entries| replay(entries, KNOWN_KINDS).unwrap();
        let v = view(vec![entry(
            "attached:not a part",
            kind::PART_ATTACHED,
            1,
            "{}",
        )]);
        let err = v.progress().unwrap_err().to_string();
        assert!(
            err.contains("ledger entry \"attached:not a part\""),
            "{err}"
        );
        let v = view(vec![entry(
            entry::PLAN,
            kind::COMMIT_PLANNED,
            1,
            "{\"load\":",
        )]);
        let err = v.plan().unwrap_err().to_string();
        assert!(
            err.contains("ledger entry \"plan\" (commit_planned)"),
            "{err}"
        );
        let v = view(vec![entry(
            entry::COMMIT,
            kind::LOAD_COMMITTED,
            1,
            "not json",
        )]);
        let err = v
            .body_of_kind::<serde_json::Value>(kind::LOAD_COMMITTED)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ledger entry \"commit\" (load_committed)"),
            "{err}"
        );
        // Well-formed entries read, and absent ones are absent.
        let v = view(vec![entry(
            "attach:202601_1_1_0",
            kind::ATTACH_INTENT,
            1,
            "{}",
        )]);
        assert!(v.plan().unwrap().is_none());
        assert_eq!(v.progress().unwrap().attach_intents.len(), 1);
    }

    #[test]
    fn duplicates_collapse_and_unknown_kinds_are_refused() {
        let view = replay(
            vec![
                entry("a:1", "x_step", 2, "{}"),
                entry("a:1", "x_step", 3, "{}"),
            ],
            &["x_step"],
        )
        .unwrap();
        assert_eq!(view.entries.len(), 1);
        assert_eq!(
            view.entries[0].written_at_ms, 2,
            "the first write of an id counts"
        );
        let err = replay(vec![entry("z", "from_the_future", 1, "{}")], &[]).unwrap_err();
        assert!(err.to_string().contains("from_the_future"), "{err}");
        let err = replay(vec![entry("open", kind::LOAD_OPENED, 1, "{not json")], &[]).unwrap_err();
        assert!(err.to_string().contains("ledger entry \"open\""), "{err}");
    }
}
