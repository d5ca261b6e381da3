//! The commit's ledger: the recorded plan, progress and summary, and writing what this run
//! established once per phase.

use super::*;

pub(super) fn recorded_plan(view: &LoadView) -> Result<Option<CommitPlan>, CommitError> {
    view.plan().map_err(|e| CommitError::Ledger(e.into()))
}

pub(super) fn progress_of(view: &LoadView) -> Result<CommitProgress, CommitError> {
    view.progress().map_err(|e| CommitError::Ledger(e.into()))
}

pub(super) fn committed_summary(view: &LoadView) -> Result<Option<CommitSummary>, CommitError> {
    view.body_of_kind(kind::LOAD_COMMITTED)
        .map_err(|e| CommitError::Ledger(e.into()))
}

pub(super) fn summary_of(spec: &LoadSpec, plan: &CommitPlan) -> CommitSummary {
    CommitSummary {
        load: spec.load.clone(),
        table: spec.target.clone(),
        mode: spec.mode,
        visibility: spec.visibility,
        partitions: plan.partitions.len(),
        parts: plan.parts.len(),
        rows: plan.total_rows,
        winners: plan.winners.clone(),
    }
}

/// What a commit knows of its load's progress: the ledger as last read, plus the facts this
/// run established and has not written yet (attach outcomes, partitions found published, the
/// last MOVEs). The next ledger INSERT of the run carries them, so a commit writes the ledger
/// once per phase, not once per step. Losing them to a crash loses nothing: each one's intent
/// is recorded, and the next run decides it again from the server.
#[derive(Debug, Clone, Default)]
pub(super) struct Progress {
    /// Recorded, or established by this run.
    pub(super) known: CommitProgress,
    /// Established by this run, not yet written.
    pub(super) unrecorded: Vec<CommitEntry>,
}

impl Progress {
    pub(super) fn of(view: &LoadView) -> Result<Progress, CommitError> {
        Ok(Progress {
            known: progress_of(view)?,
            unrecorded: Vec::new(),
        })
    }

    /// The ledger as `view` shows it, plus what this run has not written yet.
    pub(super) fn refresh(&mut self, view: &LoadView) -> Result<(), CommitError> {
        let mut known = progress_of(view)?;
        for entry in &self.unrecorded {
            known.record(entry.clone());
        }
        self.known = known;
        Ok(())
    }

    /// A fact this run established, written by its next ledger INSERT.
    pub(super) fn note(&mut self, entry: CommitEntry) {
        self.known.record(entry.clone());
        self.unrecorded.push(entry);
    }

    /// `entries` (with their bodies) after every unrecorded fact, as ledger rows; the facts
    /// count as written from here on (a failed INSERT ends the run).
    pub(super) fn rows_with_unrecorded(
        &mut self,
        entries: Vec<(CommitEntry, String)>,
    ) -> Vec<(String, &'static str, String)> {
        std::mem::take(&mut self.unrecorded)
            .into_iter()
            .map(|e| (e, "{}".to_owned()))
            .chain(entries)
            .map(|(e, body)| (e.id(), entry_kind(&e), body))
            .collect()
    }
}

/// The ledger kind of a commit entry.
pub(super) fn entry_kind(entry: &CommitEntry) -> &'static str {
    match entry {
        CommitEntry::Plan => kind::COMMIT_PLANNED,
        CommitEntry::AttachIntent(_) => kind::ATTACH_INTENT,
        CommitEntry::Attached(_) => kind::PART_ATTACHED,
        CommitEntry::PublishIntent(_) => kind::PUBLISH_INTENT,
        CommitEntry::Published(_) => kind::PARTITION_PUBLISHED,
        CommitEntry::Exchanged => kind::TABLE_EXCHANGED,
        CommitEntry::Commit => kind::LOAD_COMMITTED,
    }
}

/// Whether `progress` holds `entry`.
pub(super) fn holds(progress: &CommitProgress, entry: &CommitEntry) -> bool {
    match entry {
        CommitEntry::Plan => true,
        CommitEntry::AttachIntent(p) => progress.attach_intents.contains(p),
        CommitEntry::Attached(p) => progress.attached.contains(p),
        CommitEntry::PublishIntent(p) => progress.publish_intents.contains(p),
        CommitEntry::Published(p) => progress.published.contains(p),
        CommitEntry::Exchanged => progress.exchanged,
        CommitEntry::Commit => progress.committed,
    }
}

/// Writes `entries` and every fact `progress` has not written yet, in one ledger INSERT.
pub(super) async fn record(
    env: &CommitEnv<'_>,
    load: &LoadId,
    progress: &mut Progress,
    entries: Vec<(CommitEntry, String)>,
) -> Result<(), CommitError> {
    for (entry, _) in &entries {
        progress.known.record(entry.clone());
    }
    let rows = progress.rows_with_unrecorded(entries);
    if !rows.is_empty() {
        env.ledger.append_many(load, &rows).await?;
    }
    Ok(())
}

/// Writes the load's one `fact` (its plan or its decision: `(entry id, kind, body)`, sent with
/// that fact's deduplication token, see [`Ledger::append_once_with`]) with `riders` and every
/// fact `progress` has not written yet in one INSERT, then reads the load back: `accept`
/// judges the view (whose plan or decision the server kept) and its answer is returned; once
/// accepted, riders the view lacks (the server kept another writer's block) are written on
/// their own, so each is durable before this returns, as its step needs (an intent before its
/// ATTACH or MOVE).
pub(super) async fn record_once<T>(
    env: &CommitEnv<'_>,
    load: &LoadId,
    progress: &mut Progress,
    fact: (&str, &'static str, String),
    riders: Vec<(CommitEntry, String)>,
    crash_after: &str,
    accept: impl FnOnce(&LoadView) -> Result<T, CommitError>,
) -> Result<T, CommitError> {
    let (entry_id, fact_kind, body) = fact;
    let carried: Vec<(CommitEntry, String)> = progress
        .unrecorded
        .iter()
        .map(|e| (e.clone(), "{}".to_owned()))
        .chain(riders.iter().cloned())
        .collect();
    let mut rows = vec![(entry_id.to_owned(), fact_kind, body)];
    rows.extend(progress.rows_with_unrecorded(riders));
    env.ledger.append_once_with(load, entry_id, &rows).await?;
    crash_point(crash_after);
    let view = env.ledger.view(load, crate::KNOWN_KINDS).await?;
    let accepted = accept(&view)?;
    // What the ledger holds now, and then everything carried (written, by now, one way or
    // the other: nothing is left unrecorded).
    let mut known = progress_of(&view)?;
    let missing: Vec<(String, &str, String)> = carried
        .iter()
        .filter(|(e, _)| !holds(&known, e))
        .map(|(e, body)| (e.id(), entry_kind(e), body.clone()))
        .collect();
    if !missing.is_empty() {
        env.ledger.append_many(load, &missing).await?;
    }
    for (entry, _) in carried {
        known.record(entry);
    }
    progress.known = known;
    Ok(accepted)
}
