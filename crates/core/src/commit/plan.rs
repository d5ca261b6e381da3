//! Step 2 of a commit: the plan computed from the winners and recorded in the ledger before
//! anything is attached ([`CommitPlan`]), and the check that a re-run was given the same one
//! ([`plan_matches`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::settings::{Mode, Visibility};
use super::winners::Winners;
use crate::ids::{AttemptId, LoadId, PartitionId};
use crate::manifest::Manifest;
use crate::names::PartName;

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

/// What a commit attaches and publishes, recorded in the ledger (entry [`entry::PLAN`](super::entry::PLAN)) before
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
