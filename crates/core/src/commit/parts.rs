//! Attaching one planned part: what is observed about it ([`PartFacts`]) and the next step
//! ([`decide_part`]), or the error when it is gone ([`PartLost`]).

use super::plan::{CommitPlan, PlannedPart};
use crate::ids::{AttemptId, LoadId};

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
