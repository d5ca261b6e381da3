//! Checks after attaching: the rows ([`reconcile_rows`]) and the parts' hashes
//! ([`reconcile_hashes`]) attached per ClickHouse partition are exactly the plan's.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::plan::CommitPlan;
use super::winners::list;
use crate::ids::{LoadId, PartitionId};

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
