//! Step 3 of a commit: the ledger entries it writes ([`CommitEntry`]), every entry id of the
//! ledger ([`entry`]), and where a (re-)started commit is, from those entries alone
//! ([`commit_phase`]).

use std::collections::BTreeSet;
use std::fmt;

use super::plan::CommitPlan;
use super::settings::{Mode, Visibility};
use crate::ids::{escape, PartitionId};
use crate::names::PartName;

/// The ledger's vocabulary of entry ids: every fact a load records has one id, and replay keeps
/// the first entry of each. The ids commit writes (`plan`, `attach:<part>`, ...) are parsed by
/// [`CommitEntry`]; `chpart_protocol::ledger` re-exports this module as `ledger::entry`, so
/// every writer of the ledger names its ids from here.
pub mod entry {
    /// `begin` opened the load (kind `load_opened`), written once per load.
    pub const OPEN: &str = "open";
    /// The load's outcome (kind `decided`), written once per load.
    pub const DECISION: &str = "decision";
    /// `abort` ended the load (kind `load_aborted`).
    pub const ABORT: &str = "abort";
    /// `abort --force` ended a load a commit had claimed (kind `load_abandoned`).
    pub const ABANDON: &str = "abandon";
    /// The plan of a cluster load (kind `cluster_planned`), written once per load.
    pub const CLUSTER_PLAN: &str = "cluster-plan";
    /// gc finished the load (kind `gc_done`).
    pub const GC_DONE: &str = "gc-done";
    /// The plan (body: [`CommitPlan::to_json`](super::CommitPlan::to_json)).
    pub const PLAN: &str = "plan";
    /// The load is committed.
    pub const COMMIT: &str = "commit";
    /// The shadow was swapped in for the target (overwrite mode).
    pub const EXCHANGED: &str = "exchanged";
    /// Prefix of an attach intent's id, written before ATTACH PART.
    pub const ATTACH_INTENT_PREFIX: &str = "attach:";
    /// Prefix of an attach outcome's id.
    pub const ATTACHED_PREFIX: &str = "attached:";
    /// Prefix of a publish intent's id, written before MOVE or REPLACE PARTITION.
    pub const PUBLISH_INTENT_PREFIX: &str = "publish:";
    /// Prefix of a publish outcome's id.
    pub const PUBLISHED_PREFIX: &str = "published:";
}

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
            entry::PLAN => CommitEntry::Plan,
            entry::COMMIT => CommitEntry::Commit,
            entry::EXCHANGED => CommitEntry::Exchanged,
            _ => {
                if let Some(rest) = id.strip_prefix(entry::ATTACH_INTENT_PREFIX) {
                    CommitEntry::AttachIntent(part(rest)?)
                } else if let Some(rest) = id.strip_prefix(entry::ATTACHED_PREFIX) {
                    CommitEntry::Attached(part(rest)?)
                } else if let Some(rest) = id.strip_prefix(entry::PUBLISH_INTENT_PREFIX) {
                    CommitEntry::PublishIntent(partition(rest)?)
                } else if let Some(rest) = id.strip_prefix(entry::PUBLISHED_PREFIX) {
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
            CommitEntry::Plan => f.write_str(entry::PLAN),
            CommitEntry::Commit => f.write_str(entry::COMMIT),
            CommitEntry::Exchanged => f.write_str(entry::EXCHANGED),
            CommitEntry::AttachIntent(p) => write!(f, "{}{p}", entry::ATTACH_INTENT_PREFIX),
            CommitEntry::Attached(p) => write!(f, "{}{p}", entry::ATTACHED_PREFIX),
            CommitEntry::PublishIntent(p) => write!(f, "{}{p}", entry::PUBLISH_INTENT_PREFIX),
            CommitEntry::Published(p) => write!(f, "{}{p}", entry::PUBLISHED_PREFIX),
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
    /// [`decide_part`](super::decide_part).
    AttachParts {
        /// The parts not recorded attached.
        pending: Vec<PartName>,
    },
    /// Partition visibility, every part attached: these partitions (sorted) are not recorded
    /// published: decide each with
    /// [`decide_partition`](super::decide_partition).
    PublishPartitions {
        /// The partitions not recorded published.
        pending: Vec<PartitionId>,
    },
    /// Overwrite mode, every part attached into the shadow: the shadow is not recorded swapped
    /// in: decide with
    /// [`decide_exchange`](super::decide_exchange).
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
