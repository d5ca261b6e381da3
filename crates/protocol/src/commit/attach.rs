//! Attaching the planned parts, batch by batch, and reconciling an ATTACH whose outcome is
//! unclear from what the server holds.

use super::*;

/// Attaches every planned part not yet attached; returns how many this call attached itself.
///
/// Each round observes the table once (the first round may take `first`, an observation made
/// before the ledger reads it decides from), decides every part, records the intents of a batch in
/// one ledger INSERT (with the plan or the decision when one is due, and with the outcomes of the
/// batch before), and sends that batch's ATTACHes a few at a time. Their outcomes are noted and
/// written by the commit's next INSERT: a part still costs one ATTACH, but the ledger costs one
/// write per batch, not per part. A crash anywhere in between leaves intents whose parts are
/// either still in detached/ (attached on resume) or gone without a leftover (recorded as
/// attached on resume); a server killed inside an ATTACH leaves `attaching_<part>`, taken back
/// once nothing holds it.
pub(super) async fn attach_parts(
    env: &CommitEnv<'_>,
    p: &mut Planned,
    mut first: Option<TableParts>,
) -> Result<usize, CommitError> {
    let server = env.server;
    let (spec, plan) = (p.spec.clone(), p.plan.clone());
    let (spec, plan) = (&spec, &plan);
    let mut attached = 0;
    // Parts whose ATTACH failed in the previous round, with the error: decided from this
    // round's observation (see `after_failed_attach`).
    let mut failed: Vec<(chpart_core::PartName, ServerError)> = Vec::new();
    for round in 0..MAX_ROUNDS {
        let observed = match first.take() {
            Some(observed) => observed,
            None => table_parts(server, &spec.publish).await?,
        };
        for (part, error) in failed.drain(..) {
            let name = part.to_string();
            let left = !observed.detached.contains(&name) || observed.attaching.contains(&name);
            if after_failed_attach(left, error.class(false)) == AfterFailedAttach::Fail {
                return Err(error.into());
            }
            tracing::warn!(
                "ATTACH PART {part}: {error}; deciding again from what the server shows"
            );
        }
        // A leftover is judged by what the server says after this observation (see
        // `claim_crashed`); asked only when there is one to judge.
        let leftover = plan.parts.iter().any(|part| {
            !p.progress.known.attached.contains(&part.name)
                && observed.attaching.contains(&part.name.to_string())
        });
        let claims = match leftover {
            true => Some(ClaimCheck::read(server, &spec.publish).await?),
            false => None,
        };
        // Decide from the ledger as last read; a part that looks lost is decided again from
        // a ledger read made after this observation.
        let mut fresh = false;
        let steps = loop {
            let steps: Vec<(&chpart_core::commit::PlannedPart, PartStep)> = plan
                .parts
                .iter()
                .map(|part| {
                    let name = part.name.to_string();
                    let progress = &p.progress.known;
                    let facts = PartFacts {
                        recorded_attached: progress.attached.contains(&part.name),
                        attach_intent: progress.attach_intents.contains(&part.name),
                        in_detached: observed.detached.contains(&name),
                        attaching_leftover: observed.attaching.contains(&name),
                        ledger_read_after_observation: fresh,
                        claim_predates_server_start: claims.is_some_and(|c| {
                            observed
                                .attaching_modified
                                .get(&name)
                                .is_some_and(|m| c.predates_server_start(*m))
                        }),
                        attach_running: claims.is_some_and(|c| c.attach_running),
                    };
                    (part, decide_part(&facts))
                })
                .collect();
            if fresh || !steps.iter().any(|(_, s)| *s == PartStep::ReadLedger) {
                break steps;
            }
            p.progress
                .refresh(&env.ledger.view(&spec.load, crate::KNOWN_KINDS).await?)?;
            fresh = true;
        };
        let mut waiting = None;
        let mut vanished = Vec::new();
        let mut to_attach = Vec::new();
        let mut to_reclaim = Vec::new();
        for (part, step) in steps {
            match step {
                PartStep::Skip => {}
                PartStep::RecordAttached => vanished.push(CommitEntry::Attached(part.name.clone())),
                PartStep::Attach => to_attach.push(part.name.clone()),
                PartStep::Wait => waiting = Some(part.name.to_string()),
                PartStep::Reclaim => to_reclaim.push(part.name.clone()),
                PartStep::ReadLedger => unreachable!("decided again from a fresh ledger read"),
                PartStep::Lost => {
                    return Err(CommitError::PartLost(Box::new(PartLost::new(plan, part))))
                }
            }
        }
        for entry in vanished {
            p.progress.note(entry);
        }
        for part in &to_reclaim {
            let data_path = p
                .data_paths
                .get(part)
                .ok_or_else(|| CommitError::Unsupported {
                    load: spec.load.clone(),
                    message: format!("planned part {part} is in no winning manifest"),
                })?;
            let taken =
                tokio::task::block_in_place(|| reclaim(env.fs, data_path, part)).map_err(|e| {
                    CommitError::Reclaim {
                        load: spec.load.clone(),
                        part: part.to_string(),
                        path: chpart_core::attaching_part_path(data_path, part).to_string(),
                        source: Box::new(e),
                    }
                })?;
            if taken {
                tracing::warn!(
                    "part {part}: took back detached/attaching_{part}, claimed by an ATTACH that died with the server (restarted since); attaching it again"
                );
            }
        }
        for batch in to_attach.chunks(ATTACH_BATCH) {
            p.record_attach_intents(env, batch).await?;
            let (done, errors) = attach_batch(server, spec, batch).await;
            attached += done.len();
            for part in done {
                p.progress.note(CommitEntry::Attached(part));
            }
            if let Some((part, _)) = errors.first() {
                waiting = Some(part.to_string());
            }
            failed.extend(errors);
        }
        // Parts taken back are attached by the next round, at once.
        let reclaimed = to_reclaim.first().map(ToString::to_string);
        match waiting.or(reclaimed.clone()) {
            None => return Ok(attached),
            Some(part) if round + 1 == MAX_ROUNDS => {
                return Err(CommitError::Stuck {
                    load: spec.load.clone(),
                    part,
                })
            }
            Some(_) if reclaimed.is_some() => {}
            Some(_) => tokio::time::sleep(ROUND_PAUSE).await,
        }
    }
    unreachable!("the loop returns by its last round")
}

/// Sends `ATTACH PART` for each part, [`ATTACH_CONCURRENCY`] at a time (no new ones after the
/// first error). Returns the parts attached and the parts whose ATTACH failed, with the error.
/// A failed ATTACH is never resent blindly: its outcome is decided by the next observation
/// ([`after_failed_attach`]).
pub(super) async fn attach_batch(
    server: &dyn ClickHouseServer,
    spec: &LoadSpec,
    batch: &[chpart_core::PartName],
) -> (
    Vec<chpart_core::PartName>,
    Vec<(chpart_core::PartName, ServerError)>,
) {
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    let mut pending = batch.iter();
    // Concurrent in this task (no spawn): the requests are I/O, and `server` is borrowed.
    let mut running = futures_util::stream::FuturesUnordered::new();
    loop {
        while running.len() < ATTACH_CONCURRENCY && failed.is_empty() {
            let Some(part) = pending.next() else { break };
            crash_point("before-attach");
            let (db, name) = (&spec.publish.database, &spec.publish.table);
            running.push(async move {
                let step = step_of(spec, "commit.attach_part").part(part);
                let result = server
                    .attach_part(db.as_str(), name.as_str(), &part.to_string())
                    .await;
                (part.clone(), step.end(result))
            });
        }
        let Some((part, result)) = futures_util::StreamExt::next(&mut running).await else {
            break;
        };
        match result {
            Ok(()) => {
                crash_point("after-attach");
                done.push(part);
            }
            Err(e) => failed.push((part, e)),
        }
    }
    (done, failed)
}

/// What a failed ATTACH means, once the table has been observed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterFailedAttach {
    /// Decide the part again from the observation: it may have been attached (by this ATTACH,
    /// which the answer did not confirm, or by a concurrent commit), be held by an ATTACH in
    /// flight, or still wait in `detached/` after a transient fault.
    DecideAgain,
    /// The server refused this part itself: report the error.
    Fail,
}

/// A failed ATTACH whose part has left `detached/` (claimed: `attaching_<part>`, or gone) was
/// racing another ATTACH of it (`Code: 233 ... not found`, or `Code: 1001 ... rename: No such
/// file or directory` when two claims cross) or may have succeeded without the answer getting
/// back: the observation decides, whatever the error. A part still waiting in `detached/` was
/// not claimed by anyone: a transient fault or an unknown outcome (the connection broke before
/// the server got to it) means trying again; any other error is the server refusing the part.
pub(super) fn after_failed_attach(
    left_detached: bool,
    class: chpart_server::ErrorClass,
) -> AfterFailedAttach {
    use chpart_server::ErrorClass::{Permanent, Transient, Unknown};
    match (left_detached, class) {
        (true, _) | (false, Transient | Unknown) => AfterFailedAttach::DecideAgain,
        (false, Permanent) => AfterFailedAttach::Fail,
    }
}

/// After attaching into a shadow table: its rows per partition are exactly the plan's (the
/// shadow holds nothing else). With part visibility the target holds other rows too; there each
/// part was checked before its ATTACH, so once this run knows every part attached there is
/// nothing to observe.
///
/// The table is observed first, and the check uses this run's progress: the ledger as last
/// read plus what it attached. A concurrent commit records its `publish:` intent before it
/// moves a partition out of the shadow, so a partition moved before this observation can make
/// that progress look short of rows; then the ledger is read (after the observation) and the
/// check made again, excluding it. Returns the observation, for the first publish round.
pub(super) async fn reconcile_attached(
    env: &CommitEnv<'_>,
    p: &mut Planned,
) -> Result<Option<TableParts>, CommitError> {
    let all_attached = |known: &CommitProgress| {
        p.plan
            .parts
            .iter()
            .all(|part| known.attached.contains(&part.name))
    };
    if p.spec.visibility == Visibility::Part && all_attached(&p.progress.known) {
        return Ok(None);
    }
    let observed = table_parts(env.server, &p.spec.publish).await?;
    // Decided from this run's progress; when that falls short (a part not known attached, or
    // a shadow that does not add up), once more from a ledger read made after the observation.
    let mut fresh = false;
    let pending = loop {
        if all_attached(&p.progress.known) {
            if p.spec.visibility == Visibility::Part {
                return Ok(Some(observed));
            }
            match check_shadow(&p.spec, &p.plan, &p.progress.known, &observed) {
                Ok(pending) => break pending,
                Err(e) if fresh => {
                    // Overwrite: a racing commit claimed the shadow (renamed it) or swapped it
                    // in, after it checked it; the swap finds it by UUID.
                    let (db, shadow) = (
                        p.spec.publish.database.as_str(),
                        p.spec.publish.table.as_str(),
                    );
                    if p.spec.mode == Mode::Overwrite
                        && env.server.table_info(db, shadow).await?.is_none()
                    {
                        return Ok(None);
                    }
                    return Err(e);
                }
                Err(_) => {}
            }
        } else if fresh {
            return Ok(Some(observed));
        }
        let view = env.ledger.view(&p.spec.load, crate::KNOWN_KINDS).await?;
        p.progress.refresh(&view)?;
        fresh = true;
    };
    if p.verify == Verify::Server && pending {
        // ... and every file of every part matches its `checksums.txt`.
        let (db, table) = (
            p.spec.publish.database.as_str(),
            p.spec.publish.table.as_str(),
        );
        let checks = env.server.check_parts(db, table).await?;
        if let Some(bad) = checks.iter().find(|c| !c.is_passed) {
            return Err(CommitError::PartCorrupt {
                load: p.spec.load.clone(),
                table: p.spec.publish.clone(),
                problem: format!(
                    "the server's CHECK TABLE fails part {}: {}",
                    bad.part_path, bad.message
                ),
            });
        }
    }
    Ok(Some(observed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chpart_server::ErrorClass::{Permanent, Transient, Unknown};

    #[test]
    fn after_failed_attach_table() {
        use AfterFailedAttach::*;
        // (situation, part left detached/ by the next observation, error class, decision)
        let rows = [
            (
                "a concurrent ATTACH claimed it first (233 not found)",
                true,
                Permanent,
                DecideAgain,
            ),
            (
                "two claims crossed (1001 rename: no such file)",
                true,
                Permanent,
                DecideAgain,
            ),
            (
                "timed out, but the server attached it",
                true,
                Unknown,
                DecideAgain,
            ),
            (
                "connection broke before the server got it",
                false,
                Unknown,
                DecideAgain,
            ),
            (
                "server busy (too many parts)",
                false,
                Transient,
                DecideAgain,
            ),
            (
                "the server refuses the part (bad checksums)",
                false,
                Permanent,
                Fail,
            ),
        ];
        for (row, left, class, want) in rows {
            assert_eq!(after_failed_attach(left, class), want, "{row}");
        }
    }
}
