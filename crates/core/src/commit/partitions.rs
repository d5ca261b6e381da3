//! Publishing one planned ClickHouse partition from the shadow into the target (partition
//! visibility): what is observed ([`PartitionFacts`]), the next step ([`decide_partition`]), the
//! errors that stop it, and the check that two replace loads do not replace the same partition
//! ([`replace_overlap`]).

use std::collections::BTreeSet;

use super::plan::CommitPlan;
use super::settings::Mode;
use crate::ids::{LoadId, PartitionId};

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
/// ([`CommitPlan::from_json`] and [`validate_winners`](super::validate_winners) refuse parts without rows), so this is
/// a caller bug; in overwrite mode, which swaps the table instead ([`decide_exchange`](super::decide_exchange)).
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
