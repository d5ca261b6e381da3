//! Commit: from the manifests Spark's `collect()` returned to parts visible in the target,
//! exactly once, however often the commit is killed and re-run.
//!
//! Every attempt of every task publishes its parts into the publish table's `detached/` under
//! names no other attempt uses, so `detached/` holds the winners' parts *and* the losers'. The
//! driver attaches only the winners' parts, by exact name, and records each step in the ledger
//! (append-only; the first entry of each id counts). Everything here is a pure decision: the
//! caller observes the server and the ledger, asks one of these functions what to do, does it,
//! and observes again. Nothing is decided from memory of what a previous request "probably" did.
//!
//! ```text
//!  collect() ──► validate_winners ──► Winners ──► CommitPlan::from_winners
//!                                                      │  (re-run: plan_matches(recorded, new))
//!  ledger "plan" (body: the plan) ◄────────────────────┘
//!     │
//!     │  AttachParts: for each planned part, in plan order          decide_part
//!     ├─► ledger "attach:<part>" ─► ATTACH PART '<part>' ─► observe ─► ledger "attached:<part>"
//!     │        (intent)             (claims detached/<part> by renaming it to attaching_<part>)
//!     │
//!     │  reconcile_rows: rows attached per ClickHouse partition == rows planned
//!     │
//!     │  PublishPartitions (partition visibility only): for each      decide_partition
//!     │  ClickHouse partition of the plan, from the shadow (= publish table) into the target
//!     ├─► ledger "publish:<id>" ─► MOVE PARTITION | REPLACE PARTITION ─► observe ─► ledger "published:<id>"
//!     │
//!     │  MarkCommitted
//!     └─► ledger "commit"  ─►  Done: a re-run changes nothing
//! ```
//!
//! [`commit_phase`] tells a (re-)started commit where it is from the ledger alone; within a
//! phase, [`decide_part`] and [`decide_partition`] decide each step from fresh observations.
//!
//! Why each decision is safe:
//!
//! - **Winners** ([`validate_winners`]): only manifests of this load, for the publish table, its
//!   table definition (fingerprint), data path, host and this attempt's staging directory are
//!   accepted, exactly one per Spark partition, every partition present. `collect()` returns
//!   the first successful attempt of each partition, so anything else (two winners, a missing
//!   partition, a manifest pointing at another table) means the caller passed the wrong set,
//!   and attaching it would duplicate or lose rows. Every problem is reported at once.
//! - **Plan**: written to the ledger before anything is attached. A re-run computes the plan
//!   again from the winners it was given and must get the same one ([`plan_matches`]): a
//!   commit never mixes two sets of winners.
//! - **Attach** ([`decide_part`]): ATTACH PART first renames `detached/<part>` to
//!   `detached/attaching_<part>`, and a rename succeeds once, so one part is attached at most
//!   once however many commits race. Nothing but a successful ATTACH removes a planned part
//!   of an open load from `detached/` (gc keeps them, executors never touch a published
//!   part), and every commit records `attach:<part>` before it sends ATTACH, so "gone without
//!   an `attaching_` leftover, with an intent" means attached: the ledger's record is the
//!   identity, never an active part with the same hash (identical rows make identical parts),
//!   and a merge or a MOVE of the attached part changes nothing. "Gone with no intent" is
//!   decided only from a ledger read made *after* the observation: a read made before it may
//!   predate a concurrent commit's intent and ATTACH, so the commit reads the ledger again
//!   before it may call the part lost. An `attaching_` leftover means an ATTACH is in flight
//!   (the commit waits and observes again) or a server died in one: ATTACH turns the claimed
//!   directory itself into the active part with one more rename(2), so a leftover is never
//!   also active, and once no live ATTACH can hold it ([`claim_crashed`]) the commit renames it
//!   back to `detached/<part>` and attaches it ([`PartStep::Reclaim`]). After a timeout the
//!   commit never re-sends ATTACH blindly: it observes and decides again.
//! - **Publish** ([`decide_partition`]): MOVE PARTITION is atomic for readers and a second
//!   MOVE of a moved partition moves nothing (the shadow keeps only an empty covering part),
//!   so with all of a partition's parts attached, the shadow holds either all planned rows
//!   (not moved yet: move) or none (moved: record it); anything in between is unexplained and
//!   stops the commit. REPLACE PARTITION is not crash-atomic upstream but is idempotent (it
//!   copies from the shadow, which keeps its parts), so a crash inside it is repaired by
//!   running it again, as long as the target partition holds nothing but old parts and
//!   copies: a part that arrived since the intent stops the commit, since REPLACE would remove
//!   rows the load did not plan.
//! - **Commit**: written last; once it is in the ledger every re-run is a no-op.

mod entries;
mod exchange;
mod partitions;
mod parts;
mod plan;
mod reconcile;
mod settings;
mod winners;

#[cfg(test)]
mod tests;

pub use entries::{commit_phase, entry, CommitEntry, CommitPhase, CommitProgress, EntryIdError};
// Where these ids were before `entry` held them all.
pub use entry::{
    ATTACHED_PREFIX, ATTACH_INTENT_PREFIX, PLAN as PLAN_ENTRY, PUBLISHED_PREFIX,
    PUBLISH_INTENT_PREFIX,
};
pub use exchange::{decide_exchange, ExchangeFacts, ExchangeStep, TableAt};
pub use partitions::{
    decide_partition, replace_overlap, ForeignPart, OpenReplaceLoad, PartitionBroken,
    PartitionFacts, PartitionStep,
};
pub use parts::{claim_crashed, decide_part, PartFacts, PartLost, PartStep};
pub use plan::{plan_matches, CommitPlan, PlanConflict, PlanError, PlannedPart, PlannedPartition};
pub use reconcile::{reconcile_hashes, reconcile_rows, HashMismatch, RowDiff, RowMismatch};
pub use settings::{Mode, Visibility};
pub use winners::{
    validate_winners, Expected, LineOrigin, PartList, WinnerProblem, Winners, WinnersError,
};
