//! What a commit checks before anything becomes visible: the tables' definitions, the shadow's
//! partitions against the plan, and (replace mode) other open replace loads.

use super::*;

/// Each table still has the definition the parts were built for, and no mutation is pending
/// (two queries for all of them; a third reads the columns of a table whose `CREATE` statement
/// is no longer the snapshot's, since the definition may differ and the shape still match).
pub(super) async fn check_tables(
    env: &CommitEnv<'_>,
    load: &LoadId,
    tables: &[(&TableRef, &TableSnapshot)],
) -> Result<(), CommitError> {
    let to_check: Vec<TableToCheck<'_>> = tables
        .iter()
        .map(|(t, snapshot)| TableToCheck {
            database: t.database.as_str(),
            table: t.table.as_str(),
            known_definition: Some(snapshot.create_table_query.as_str()),
        })
        .collect();
    let checks = env.server.check_tables(&to_check).await?;
    for ((table, snapshot), check) in tables.iter().zip(checks) {
        let changed = |now: String| CommitError::TableChanged {
            load: load.clone(),
            table: (*table).clone(),
            was: snapshot.fingerprint.to_string(),
            now,
        };
        let info = check
            .info
            .ok_or_else(|| changed("(table dropped)".into()))?;
        // Columns unread: the definition is the snapshot's, columns included.
        if let Some(columns) = &check.columns {
            let now = TableSnapshot::from_server(&info, columns);
            if now.fingerprint != snapshot.fingerprint {
                return Err(changed(now.fingerprint.to_string()));
            }
        }
        if check.pending_mutations > 0 {
            return Err(CommitError::PendingMutations {
                load: load.clone(),
                table: (*table).clone(),
                count: check.pending_mutations,
            });
        }
    }
    Ok(())
}

/// The shadow's partitions that `progress` shows neither published nor intended are exactly
/// the plan's, by rows and by each part's hash; returns whether there is any such partition.
pub(super) fn check_shadow(
    spec: &LoadSpec,
    plan: &CommitPlan,
    progress: &CommitProgress,
    observed: &TableParts,
) -> Result<bool, CommitError> {
    let rows: BTreeMap<PartitionId, u64> = plan
        .partitions
        .iter()
        .filter(|p| {
            !progress.published.contains(&p.partition_id)
                && !progress.publish_intents.contains(&p.partition_id)
        })
        .map(|p| {
            (
                p.partition_id.clone(),
                observed
                    .rows_by_partition
                    .get(p.partition_id.as_str())
                    .copied()
                    .unwrap_or(0),
            )
        })
        .collect();
    let pending = CommitPlan {
        partitions: plan
            .partitions
            .iter()
            .filter(|p| rows.contains_key(&p.partition_id))
            .cloned()
            .collect(),
        ..plan.clone()
    };
    reconcile_rows(&pending, &rows).map_err(|e| CommitError::Rows(Box::new(e)))?;
    // The shadow's parts are exactly the plan's: each one's `checksums.txt` is the builder's.
    // Merges of the shadow are stopped until its partitions are published, but a server
    // restart lifts that until the next commit run stops them again: a partition merged
    // meanwhile has lost its parts' identity (the rows above and the server's CHECK TABLE
    // still hold for it).
    let (merged, unmerged): (Vec<_>, Vec<_>) = pending
        .partitions
        .iter()
        .cloned()
        .partition(|p| observed.merged_partitions.contains(p.partition_id.as_str()));
    for p in &merged {
        tracing::warn!(
            "load {}: partition {} of the shadow {} was merged by the server (merges restart with the server); its parts are checked by rows and CHECK TABLE, not by their hashes",
            spec.load,
            p.partition_id,
            spec.publish
        );
    }
    let observed_hashes: BTreeMap<PartitionId, Vec<String>> = unmerged
        .iter()
        .map(|p| {
            let pid = p.partition_id.as_str();
            let hashes = observed.hashes_by_partition.get(pid).cloned();
            (p.partition_id.clone(), hashes.unwrap_or_default())
        })
        .collect();
    let unmerged_plan = CommitPlan {
        partitions: unmerged,
        ..pending.clone()
    };
    reconcile_hashes(&unmerged_plan, &observed_hashes).map_err(|e| CommitError::PartCorrupt {
        load: spec.load.clone(),
        table: spec.publish.clone(),
        problem: e.to_string(),
    })?;
    Ok(!pending.partitions.is_empty())
}

/// Replace mode, before this load's first REPLACE of any partition: no other open replace load
/// of the table has planned one of its partitions (`begin` allows one open replace load per
/// table, but two begins racing both pass). Partitions already intended were checked before.
pub(super) async fn check_replace_overlap(
    env: &CommitEnv<'_>,
    spec: &LoadSpec,
    plan: &CommitPlan,
    progress: &CommitProgress,
) -> Result<(), CommitError> {
    let mine: BTreeSet<PartitionId> = plan
        .to_publish()
        .into_iter()
        .map(|p| p.partition_id)
        .filter(|id| !progress.publish_intents.contains(id))
        .collect();
    let whole_table = spec.mode == Mode::Overwrite;
    if mine.is_empty() && !whole_table {
        return Ok(());
    }
    let others = crate::begin::open_replace_loads(
        env.ledger,
        &spec.target,
        &spec.load,
        spec.shard_of.as_ref(),
    )
    .await?;
    match replace_overlap(&mine, whole_table, &others) {
        None => Ok(()),
        Some((other, partitions)) => Err(CommitError::ReplaceOverlap {
            load: spec.load.clone(),
            table: spec.target.clone(),
            other,
            partitions: if partitions.is_empty() {
                vec!["all of them (an overwrite replaces the whole table)".into()]
            } else {
                partitions.iter().map(ToString::to_string).collect()
            },
        }),
    }
}
