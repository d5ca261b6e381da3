//! Overwrite mode: the shadow, holding every planned part, is swapped in for the target by one
//! `EXCHANGE TABLES` (readers see the old table or the new one, never an empty or half-filled
//! one), guarded against a second swap by a racing or resumed commit (see
//! `chpart_core::commit::decide_exchange`).

use chpart_core::commit::{decide_exchange, ExchangeFacts, ExchangeStep, TableAt};

use super::*;

/// The name under which this commit claims the new table before swapping it in: derived from
/// the shadow's (so gc knows it as the load's) and unique to this process.
pub(crate) fn claim_name(shadow: &str) -> String {
    let nonce = chpart_core::retry::clock_seed() ^ u64::from(std::process::id());
    format!("{shadow}{CLAIM_INFIX}{:012x}", nonce & 0xffff_ffff_ffff)
}

/// What separates the shadow's name from a claim name's nonce.
pub(crate) const CLAIM_INFIX: &str = "_x";

/// Whether `name` is one this load gives its tables: the shadow's, or a commit's claim name.
pub fn is_load_table_name(shadow: &str, name: &str) -> bool {
    name == shadow
        || name
            .strip_prefix(shadow)
            .and_then(|rest| rest.strip_prefix(CLAIM_INFIX))
            .is_some_and(|nonce| !nonce.is_empty() && nonce.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Swaps the shadow in for the target (see the module doc), round after round from fresh
/// observations of both tables by UUID, and notes `exchanged` once it is done (written by the
/// commit's next INSERT). The load's decision is won first: the swap is visible.
pub(super) async fn exchange_table(
    env: &CommitEnv<'_>,
    p: &mut Planned,
) -> Result<(), CommitError> {
    let server = env.server;
    let spec = p.spec.clone();
    let db = spec.target.database.as_str();
    let (target, shadow) = (spec.target.table.as_str(), spec.publish.table.as_str());
    let (new_uuid, old_uuid) = (
        spec.publish_snapshot.uuid.clone(),
        spec.target_snapshot.uuid.clone(),
    );
    let mine = claim_name(shadow);
    if !p.decided {
        p.decide(env, Vec::new()).await?;
    }
    // Observations in a row that found a table missing: a table being renamed by a racing
    // commit can be missing from `system.tables` for that moment, so "gone" is decided only
    // from several observations apart.
    let mut missing_seen = 0;
    for _ in 0..MAX_ROUNDS {
        let names = server
            .table_names_by_uuid(db, &[new_uuid.clone(), old_uuid.clone()])
            .await?;
        let name_of = |uuid: &str| {
            names
                .iter()
                .find(|(u, _)| u == uuid)
                .map(|(_, n)| n.clone())
        };
        let at = |name: &Option<String>| match name.as_deref() {
            None => TableAt::Missing,
            Some(n) if n == target => TableAt::Target,
            Some(n) if n == mine => TableAt::Mine,
            Some(_) => TableAt::Other,
        };
        let (new_name, old_name) = (name_of(&new_uuid), name_of(&old_uuid));
        let facts = ExchangeFacts {
            recorded_exchanged: p.progress.known.exchanged,
            new: at(&new_name),
            old: at(&old_name),
        };
        let step = step_of(&spec, "commit.exchange");
        let decided = decide_exchange(&facts);
        if decided != ExchangeStep::Broken {
            missing_seen = 0;
        }
        match decided {
            ExchangeStep::Skip => {
                step.ok();
                return Ok(());
            }
            ExchangeStep::RecordExchanged => {
                p.progress.note(CommitEntry::Exchanged);
                // The new table's merges were stopped while it was the shadow.
                step.end(
                    server
                        .execute_idempotent(&format!(
                            "SYSTEM START MERGES {}",
                            quote_table(db, target)
                        ))
                        .await,
                )?;
                return Ok(());
            }
            ExchangeStep::Claim => {
                let from = new_name.expect("decided from a table that exists");
                // Fails if another commit renamed it first, or swapped it in meanwhile (then
                // the next observation says so): either way, observe again.
                let sql = format!(
                    "RENAME TABLE {} TO {}",
                    quote_table(db, &from),
                    quote_table(db, &mine)
                );
                if let Err(e) = server.execute(&sql).await {
                    tracing::info!(
                        "load {}: claiming {from} for the swap: {e}; observing again",
                        spec.load
                    );
                }
                step.ok();
            }
            ExchangeStep::Exchange => {
                crash_point("before-exchange");
                let sql = format!(
                    "EXCHANGE TABLES {} AND {}",
                    quote_table(db, target),
                    quote_table(db, &mine)
                );
                // An unclear outcome is read back from the tables' names, never inferred.
                if let Err(e) = server.execute(&sql).await {
                    tracing::info!("load {}: the swap: {e}; observing again", spec.load);
                }
                crash_point("after-exchange");
                step.ok();
            }
            ExchangeStep::Broken if missing_seen < BROKEN_OBSERVATIONS => {
                missing_seen += 1;
                step.ok();
                tokio::time::sleep(ROUND_PAUSE).await;
                continue;
            }
            ExchangeStep::Broken => {
                return Err(CommitError::ExchangeBroken {
                    load: spec.load.clone(),
                    table: spec.target.clone(),
                    new: describe_at(&new_name, &new_uuid),
                    old: describe_at(&old_name, &old_uuid),
                })
            }
        }
    }
    Err(CommitError::ExchangeStuck {
        load: spec.load.clone(),
        table: spec.target.clone(),
    })
}

/// Observations of a broken state (a table missing or elsewhere) before the swap stops.
const BROKEN_OBSERVATIONS: u32 = 4;

fn describe_at(name: &Option<String>, uuid: &str) -> String {
    match name {
        Some(n) => format!("{n} (uuid {uuid})"),
        None => format!("no table (uuid {uuid})"),
    }
}
