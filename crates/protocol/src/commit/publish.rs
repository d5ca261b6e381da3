//! Making each partition visible at once (partition visibility): MOVE from the shadow, or
//! REPLACE in replace mode, with the intents that let a re-run tell what happened.

use super::*;

/// Partitions moved by one `ALTER` (its text stays far below the server's `max_query_size`).
const MOVES_PER_ALTER: usize = 100;

/// One `ALTER` of `shadow` that moves each of `ids` into `target`.
fn move_partitions_sql(shadow: &str, target: &str, ids: &[PartitionId]) -> String {
    let commands: Vec<String> = ids
        .iter()
        .map(|id| {
            format!(
                "MOVE PARTITION ID {} TO TABLE {target}",
                quote_str(id.as_str())
            )
        })
        .collect();
    format!("ALTER TABLE {shadow} {}", commands.join(", "))
}

/// The recorded `publish:<id>` intents of a load, with the target's highest block number each
/// recorded (`None` for an intent without it: every part not a copy counts as arrived since).
pub(super) fn replace_intents(
    view: &LoadView,
) -> Result<BTreeMap<PartitionId, Option<u64>>, CommitError> {
    let mut out = BTreeMap::new();
    for e in &view.entries {
        if let Ok(Some(CommitEntry::PublishIntent(id))) = CommitEntry::parse(&e.entry_id) {
            let body: serde_json::Value =
                crate::ledger::body_of(e).map_err(|err| CommitError::Ledger(err.into()))?;
            out.insert(id, body.get("target_max_block").and_then(|b| b.as_u64()));
        }
    }
    Ok(out)
}

/// What of a replace load's target partition cannot be explained by its REPLACE.
pub(super) struct Arrived<'a> {
    /// The first part that is neither a copy of the shadow's nor covers only blocks handed
    /// out before the intent (see `PartitionFacts::target_foreign`).
    pub(super) first: Option<&'a ActivePart>,
    /// Every such part is a merge, no old part is left and the rows are the plan's.
    pub(super) merged_plan: bool,
}

pub(super) fn arrived_since_intent<'a>(
    target: &'a [ActivePart],
    shadow_hashes: &[String],
    intent_max_block: Option<u64>,
    planned_rows: u64,
) -> Arrived<'a> {
    let copy = |p: &ActivePart| shadow_hashes.contains(&p.hash);
    let old = |p: &ActivePart| intent_max_block.is_some_and(|m| p.max_block <= m);
    let mut arrived = target.iter().filter(|p| !copy(p) && !old(p)).peekable();
    let first = arrived.peek().copied();
    let merges_only = arrived.all(|p| p.level > 0);
    Arrived {
        first,
        merged_plan: merges_only
            && !target.iter().any(|p| !copy(p) && old(p))
            && target.iter().map(|p| p.rows).sum::<u64>() == planned_rows,
    }
}

/// Moves (append) or swaps in (replace) each partition from the shadow into the target.
///
/// `observed` is reconcile's observation of the shadow, used for the first round instead of
/// observing again. The first round's intents go with the load's decision when this commit
/// has not won it yet (nothing is visible before). The `published:` entries of partitions
/// moved are noted in `p.progress` and written by the commit's next INSERT (a crash before
/// that leaves their `publish:` intents, and resume confirms them by observing the shadow).
pub(super) async fn publish_partitions(
    env: &CommitEnv<'_>,
    p: &mut Planned,
    mut observed: Option<TableParts>,
) -> Result<(), CommitError> {
    let server = env.server;
    let (spec, plan) = (p.spec.clone(), p.plan.clone());
    let (spec, plan) = (&spec, &plan);
    let shadow = quote_table(spec.publish.database.as_str(), spec.publish.table.as_str());
    let target = quote_table(spec.target.database.as_str(), spec.target.table.as_str());
    for round in 0..MAX_ROUNDS {
        let in_shadow = match observed.take() {
            Some(observed) => observed,
            None => table_parts(server, &spec.publish).await?,
        };
        let in_target = match spec.mode {
            Mode::Replace => Some(table_parts(server, &spec.target).await?),
            Mode::Append => None,
            Mode::Overwrite => unreachable!("an overwrite load swaps the table (exchange.rs)"),
        };
        // Replace: the intents (and the blocks the target had handed out when each was
        // recorded), read after the observation, so an intent missing here means no REPLACE
        // of that partition had been sent before it.
        let intents = match spec.mode {
            Mode::Replace => {
                replace_intents(&env.ledger.view(&spec.load, crate::KNOWN_KINDS).await?)?
            }
            Mode::Append | Mode::Overwrite => BTreeMap::new(),
        };
        let mut confirmed = Vec::new();
        // Partitions to MOVE; REPLACE statements with the target partition's highest block.
        let (mut moves, mut replaces) = (Vec::new(), Vec::new());
        for partition in &plan.to_publish() {
            let pid = partition.partition_id.as_str();
            let shadow_hashes = in_shadow.hashes_by_partition.get(pid);
            let target_parts = in_target
                .as_ref()
                .and_then(|t| t.parts_by_partition.get(pid))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let intent = intents.get(&partition.partition_id);
            let arrived = arrived_since_intent(
                target_parts,
                shadow_hashes.map(Vec::as_slice).unwrap_or_default(),
                intent.copied().flatten(),
                partition.rows,
            );
            let facts = PartitionFacts {
                recorded_published: p.progress.known.published.contains(&partition.partition_id),
                shadow_rows: in_shadow.rows_by_partition.get(pid).copied().unwrap_or(0),
                planned_rows: partition.rows,
                // A partition the plan empties is published once the target holds none of it.
                target_has_plan_hashes: if partition.rows == 0 {
                    target_parts.is_empty()
                } else {
                    in_target.as_ref().is_some_and(|t| {
                        shadow_hashes.is_some() && t.hashes_by_partition.get(pid) == shadow_hashes
                    })
                },
                publish_intent: intent.is_some(),
                target_foreign: arrived.first.is_some(),
                target_merged_plan: arrived.merged_plan,
            };
            let id = partition.partition_id.clone();
            // Replace: the blocks the target partition has handed out so far, for the intent.
            let max_block = target_parts.iter().map(|p| p.max_block).max().unwrap_or(0);
            match decide_partition(spec.mode, &facts) {
                PartitionStep::Skip => {}
                PartitionStep::RecordPublished => confirmed.push(CommitEntry::Published(id)),
                PartitionStep::Move => moves.push(id),
                // Emptying: the shadow has no part of it, and 26.9 refuses to replace a
                // partition by nothing unless told to (DROP PARTITION would do the same).
                PartitionStep::Replace => replaces.push((
                    id,
                    max_block,
                    format!(
                        "ALTER TABLE {target} REPLACE PARTITION ID {} FROM {shadow}{}",
                        quote_str(pid),
                        if partition.rows == 0 {
                            " SETTINGS allow_replace_partition_from_empty_source = 1"
                        } else {
                            ""
                        }
                    ),
                )),
                PartitionStep::Foreign => {
                    let part = arrived.first.expect("decided from a foreign part");
                    return Err(CommitError::ForeignPart(Box::new(ForeignPart {
                        load: spec.load.clone(),
                        partition_id: partition.partition_id.clone(),
                        part: part.name.clone(),
                        hash: part.hash.clone(),
                        rows: part.rows,
                    })));
                }
                PartitionStep::Broken => {
                    return Err(CommitError::PartitionBroken(Box::new(
                        PartitionBroken::new(plan, &partition.partition_id, &facts),
                    )))
                }
            }
        }
        for entry in confirmed {
            p.progress.note(entry);
        }
        let again = !moves.is_empty() || !replaces.is_empty();
        // A replace intent's body holds the target partition's highest block number so far:
        // whatever covers a higher one and is not a copy of the shadow's arrived since.
        let intents: Vec<(CommitEntry, String)> = moves
            .iter()
            .map(|id| (CommitEntry::PublishIntent(id.clone()), "{}".to_owned()))
            .chain(replaces.iter().map(|(id, max_block, _)| {
                let body = serde_json::json!({ "target_max_block": max_block }).to_string();
                (CommitEntry::PublishIntent(id.clone()), body)
            }))
            .collect();
        if !p.decided {
            p.decide(env, intents).await?;
        } else if !intents.is_empty() {
            record(env, &spec.load, &mut p.progress, intents).await?;
        }
        let mut unconfirmed = false;
        // MOVEs go many to one ALTER: the server runs its commands one after the other, so a
        // failure or a crash inside it leaves some partitions moved and the rest not, which
        // is the state a crash between two single MOVEs leaves, and the next observation
        // tells which (their intents are recorded). One statement instead of one per
        // partition: a bulk reload's 24 MOVEs cost the server more than the rest of the
        // publish phase.
        for chunk in moves.chunks(MOVES_PER_ALTER) {
            // One event per partition still, each with the statement's outcome.
            let steps: Vec<Step> = chunk
                .iter()
                .map(|id| step_of(spec, "commit.publish_partition").partition(id))
                .collect();
            crash_point("before-publish");
            let result = server
                .execute(&move_partitions_sql(&shadow, &target, chunk))
                .await;
            for step in steps {
                step.end(result.as_ref().map(|_| ())).ok();
            }
            result?;
            crash_point("after-publish");
            // An ALTER that returned has moved every partition it names.
            for id in chunk {
                p.progress.note(CommitEntry::Published(id.clone()));
            }
        }
        for (id, _, sql) in replaces {
            crash_point("before-publish");
            let step = step_of(spec, "commit.publish_partition").partition(&id);
            step.end(server.execute(&sql).await)?;
            crash_point("after-publish");
            // A REPLACE is confirmed by the next observation (target hashes equal to the
            // shadow's), since upstream it is not crash-atomic.
            unconfirmed = true;
        }
        if !again || !unconfirmed {
            // Every partition is published now: no need to observe again.
            return Ok(());
        }
        if round + 1 == MAX_ROUNDS {
            break;
        }
    }
    Err(CommitError::Stuck {
        load: spec.load.clone(),
        part: "(a partition that does not settle)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_alter_moves_every_partition_it_names() {
        let ids: Vec<PartitionId> = ["202601", "all"]
            .iter()
            .map(|id| PartitionId::new(*id).unwrap())
            .collect();
        assert_eq!(
            move_partitions_sql("`db`.`s`", "`db`.`t`", &ids),
            "ALTER TABLE `db`.`s` MOVE PARTITION ID '202601' TO TABLE `db`.`t`, \
             MOVE PARTITION ID 'all' TO TABLE `db`.`t`"
        );
    }
}
