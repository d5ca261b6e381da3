//! Swapping an overwrite load's shadow in for the target with one `EXCHANGE TABLES`: where the
//! two tables are ([`ExchangeFacts`]) and the next step ([`decide_exchange`]).

/// Where one of an overwrite load's two tables is, found by its UUID (which a table keeps
/// through RENAME and EXCHANGE in an Atomic database).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableAt {
    /// Under the target's name.
    Target,
    /// Under this commit's own claim name (no other process uses it).
    Mine,
    /// Under another name: the shadow's own, or another commit's claim name.
    Other,
    /// Nowhere: the table was dropped.
    Missing,
}

/// What is known about an overwrite load's swap, observed just before deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExchangeFacts {
    /// The ledger has `exchanged`.
    pub recorded_exchanged: bool,
    /// Where the shadow (the new table, every planned part attached into it) is.
    pub new: TableAt,
    /// Where the table `begin` found under the target's name (the old rows) is.
    pub old: TableAt,
}

/// What to do about an overwrite load's swap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExchangeStep {
    /// Recorded: nothing to do.
    Skip,
    /// Swapped but not recorded: write `exchanged`.
    RecordExchanged,
    /// Take the new table for this commit: `RENAME TABLE <where it is> TO <my claim name>`,
    /// then observe again.
    Claim,
    /// The new table is this commit's and the old one is the target: `EXCHANGE TABLES target
    /// AND <my claim name>`, then observe again.
    Exchange,
    /// A state chpart cannot explain (a table dropped, or renamed by someone else): stop.
    Broken,
}

/// Decides the next step of an overwrite load's swap (all its parts are attached into the
/// shadow, the load's decision is this commit's).
///
/// `EXCHANGE TABLES` swaps two names in one step, but it is its own inverse: a second swap by
/// a racing (or resumed) commit would put the old rows back. So a commit first claims the new
/// table by renaming it to a name only it uses (a rename of a name succeeds once), and swaps
/// only its own claim, after observing that the new table is under that name and the old one
/// under the target's. A racing commit may take the claim away (rename it to its own name);
/// then the first commit's swap fails for want of the table and it observes again. Tables are
/// found by UUID, which RENAME and EXCHANGE keep, so "the new table is under the target's
/// name" is exactly "swapped", whoever swapped it.
pub fn decide_exchange(facts: &ExchangeFacts) -> ExchangeStep {
    use TableAt::{Mine, Missing, Other, Target};
    if facts.recorded_exchanged {
        return ExchangeStep::Skip;
    }
    match (facts.new, facts.old) {
        (Target, Mine | Other | Missing) => ExchangeStep::RecordExchanged,
        (Mine, Target) => ExchangeStep::Exchange,
        (Other, Target) => ExchangeStep::Claim,
        (Missing, _) | (Mine | Other, Mine | Other | Missing) | (Target, Target) => {
            ExchangeStep::Broken
        }
    }
}
