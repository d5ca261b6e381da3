//! Verification of the winning parts waiting in `detached/` against their manifests, over one
//! or several connections.

use super::*;

/// Checks every winning part that is still waiting in detached/ against its manifest.
///
/// A winning part found neither in `detached/` nor held by an ATTACH is only "not published"
/// if a ledger read made after this observation records no attach of it: `progress` may be
/// older than a concurrent commit that attached it meanwhile.
pub(super) async fn verify_waiting_parts(
    env: &CommitEnv<'_>,
    spec: &LoadSpec,
    winners: &Winners,
    progress: &CommitProgress,
    verify: Verify,
) -> Result<TableParts, CommitError> {
    let observed = table_parts(env.server, &spec.publish).await?;
    // The parts waiting in detached/ are read first, all at once (over several connections
    // when there are many), then judged in the manifests' order as before: the first problem
    // in that order is the one reported, however the reads were spread.
    let waiting: Vec<(&Manifest, &PartEntry)> = winners
        .manifests()
        .values()
        .flat_map(|m| m.parts.iter().map(move |part| (m, part)))
        .filter(|(_, part)| {
            !progress.attached.contains(&part.name)
                && !progress.attach_intents.contains(&part.name)
                && observed.detached.contains(&part.name.to_string())
        })
        .collect();
    let mut verified: HashMap<&PartName, Result<(), VerifyError>> =
        tokio::task::block_in_place(|| verify_parts(env, &waiting, verify));
    let mut fresh: Option<CommitProgress> = None;
    for manifest in winners.manifests().values() {
        for part in &manifest.parts {
            let name = part.name.to_string();
            let handled = |p: &CommitProgress| {
                p.attached.contains(&part.name) || p.attach_intents.contains(&part.name)
            };
            let not_published = || CommitError::NotPublished {
                load: spec.load.clone(),
                part: name.clone(),
                attempt: manifest.attempt.id.clone(),
                partition: manifest.attempt.partition,
                table: spec.publish.clone(),
            };
            if handled(progress) {
                continue;
            }
            if !observed.detached.contains(&name) {
                if observed.attaching.contains(&name) {
                    continue; // an ATTACH holds it: decided later
                }
                if fresh.is_none() {
                    fresh = Some(progress_of(
                        &env.ledger.view(&spec.load, crate::KNOWN_KINDS).await?,
                    )?);
                }
                if fresh.as_ref().is_some_and(handled) {
                    continue; // a concurrent commit attached it: decided later
                }
                return Err(not_published());
            }
            // Read above with every part waiting in detached/ (the same test as here); read
            // now should a part ever be judged that the reads above did not take.
            let result = verified.remove(&part.name).unwrap_or_else(|| {
                tokio::task::block_in_place(|| {
                    verify_part(
                        env.fs,
                        manifest.data_path_of(part),
                        manifest.attempt.id.as_str(),
                        part,
                        verify,
                    )
                })
            });
            match result {
                Ok(()) => {}
                // Gone while it was being read: a concurrent commit's ATTACH took it (it
                // recorded its intent first). Decided like a part found gone, from a ledger
                // read made after it went.
                Err(VerifyError::Remote { source, .. })
                    if matches!(*source, chpart_remote::RemoteError::NotFound { .. }) =>
                {
                    let read =
                        progress_of(&env.ledger.view(&spec.load, crate::KNOWN_KINDS).await?)?;
                    let taken = handled(&read);
                    fresh = Some(read);
                    if !taken {
                        return Err(not_published());
                    }
                }
                Err(e) => return Err(CommitError::Verify(Box::new(e))),
            }
        }
    }
    Ok(observed)
}

/// Verifies each of `parts` (waiting in detached/) against its manifest entry: over `env.fs`
/// alone for a few parts, else over up to `MoreConnections::total` connections at once, each
/// taking the next part not yet taken. A connection that cannot be opened leaves the work to
/// the others (a warning says so). Reads stop early once one part has a problem other than
/// being gone.
pub(super) fn verify_parts<'p>(
    env: &CommitEnv<'_>,
    parts: &[(&Manifest, &'p PartEntry)],
    verify: Verify,
) -> HashMap<&'p PartName, Result<(), VerifyError>> {
    let one = |fs: &dyn RemoteFs, (manifest, part): (&Manifest, &PartEntry)| {
        verify_part(
            fs,
            manifest.data_path_of(part),
            manifest.attempt.id.as_str(),
            part,
            verify,
        )
    };
    let more = match env.more {
        Some(more) if more.total > 1 && parts.len() >= PARALLEL_VERIFY_MIN => {
            let wanted = (more.total - 1).min(parts.len() - 1);
            match more.reach.connect(more.host, wanted) {
                Ok(connections) => connections,
                Err(e) => {
                    tracing::warn!(
                        "verifying {} parts over one connection: opening {wanted} more to {} failed: {e}",
                        parts.len(),
                        more.host
                    );
                    Vec::new()
                }
            }
        }
        _ => Vec::new(),
    };
    let connections: Vec<&dyn RemoteFs> = std::iter::once(env.fs)
        .chain(more.iter().map(|c| c.as_ref()))
        .collect();
    read_in_turn(&connections, parts, one)
}

/// Reads `parts` over `connections`, each taking the next part not yet taken (in `parts`'
/// order) until none is left or one part has a problem other than being gone. Every part
/// before that one was taken first and is read whole, so the judging, in that order, reaches
/// the problem before any part left unread. One connection reads on the calling thread.
pub(super) fn read_in_turn<'p>(
    connections: &[&dyn RemoteFs],
    parts: &[(&Manifest, &'p PartEntry)],
    one: impl Fn(&dyn RemoteFs, (&Manifest, &PartEntry)) -> Result<(), VerifyError> + Sync,
) -> HashMap<&'p PartName, Result<(), VerifyError>> {
    use std::sync::atomic::Ordering::SeqCst;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let results = std::sync::Mutex::new(HashMap::new());
    let worker = |fs: &dyn RemoteFs| {
        while !stop.load(SeqCst) {
            let Some(&(manifest, part)) = parts.get(next.fetch_add(1, SeqCst)) else {
                break;
            };
            let result = one(fs, (manifest, part));
            if matches!(&result, Err(e) if !is_gone(e)) {
                stop.store(true, SeqCst);
            }
            results
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(&part.name, result);
        }
    };
    match connections {
        [fs] => worker(*fs),
        _ => std::thread::scope(|scope| {
            for &fs in connections {
                let worker = &worker;
                scope.spawn(move || worker(fs));
            }
        }),
    }
    results.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// The part went away while it was read (a concurrent commit's ATTACH took it).
pub(super) fn is_gone(e: &VerifyError) -> bool {
    matches!(e, VerifyError::Remote { source, .. }
        if matches!(**source, chpart_remote::RemoteError::NotFound { .. }))
}
