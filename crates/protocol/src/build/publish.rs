//! The remote half of an attempt: shipping its parts into staging, the publish intent, the
//! fence, the renames into `detached/`, the manifest last, and undoing exactly what it created.

use super::*;

/// Whose steps a build reports: the (sub-)load, the attempt, the shard.
pub(super) struct Who<'a> {
    pub(super) load: &'a LoadId,
    pub(super) attempt: &'a AttemptId,
    pub(super) shard: Option<u32>,
}

impl Who<'_> {
    pub(super) fn step(&self, step: &'static str) -> Step {
        Step::start(self.load, step)
            .attempt(self.attempt)
            .shard(self.shard)
    }
}

/// Digests every part and uploads it into staging, as a pipeline: a part goes to the uploaders
/// (one thread per connection) as soon as its files are digested, so hashing overlaps the
/// transfer, and a backend that moves instead of copying (the local one) never takes a part
/// before it was digested. Part `i` goes to `staged[i]`. Returns each part's files, in order.
pub(super) fn ship_parts(
    who: &Who<'_>,
    uploaders: &[&dyn RemoteFs],
    parts: &[BuiltPart],
    names: &[PartName],
    staged: &[RemotePath],
    timings: &mut BuildTimings,
) -> Result<Vec<Vec<FileEntry>>, BuildError> {
    let t = Instant::now();
    let failed = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let rx = Mutex::new(rx);
    let (digested, uploads) = std::thread::scope(|scope| {
        let digester = scope.spawn(|| {
            let t = Instant::now();
            let mut out = Vec::with_capacity(parts.len());
            for (i, part) in parts.iter().enumerate() {
                if failed.load(Ordering::Relaxed) {
                    break;
                }
                out.push(digest_part(&part.dir).map_err(build_err)?);
                let _ = tx.send(i);
            }
            drop(tx);
            Ok::<_, BuildError>((out, t.elapsed().as_secs_f64()))
        });
        let uploaders: Vec<_> = uploaders
            .iter()
            .map(|fs| {
                let (rx, failed) = (&rx, &failed);
                scope.spawn(move || loop {
                    let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok(i) = next else { return Ok(()) };
                    let to = &staged[i];
                    let step = who.step("build.upload").part(&names[i]);
                    match fs.upload_dir_consuming(&parts[i].dir, to.as_str()) {
                        Ok(stats) => step.counts(parts[i].rows, stats.bytes, 1, 0).ok(),
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            let e = remote(format!("upload part {} to {to}", names[i]))(e);
                            return step.end(Err(e));
                        }
                    }
                })
            })
            .collect();
        let digested = join(digester);
        if digested.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        let uploads: Vec<Result<(), BuildError>> = uploaders.into_iter().map(join).collect();
        (digested, uploads)
    });
    uploads
        .into_iter()
        .collect::<Result<Vec<()>, BuildError>>()?;
    let (files, digest_secs) = digested?;
    timings.digest_secs = digest_secs;
    timings.upload_secs = t.elapsed().as_secs_f64();
    Ok(files)
}

/// A scoped thread's result; its panic, if it panicked.
pub(super) fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// The remote half of an attempt, remembering what it created so a failure can undo exactly
/// that and nothing of anyone else's. It owns one staging directory per disk it publishes
/// on: the home disk's (claimed before any work; the manifest goes there) and those of the
/// other disks its parts go to (claimed before the upload), each `<disk's staging root>/<load>/<attempt>/`.
pub(super) struct Publisher<'a> {
    pub(super) fs: &'a dyn RemoteFs,
    /// One per disk of the destination, the home disk first.
    pub(super) stagings: Vec<DiskStaging>,
    pub(super) published: Vec<String>,
}

/// The attempt's staging on one disk.
pub(super) struct DiskStaging {
    pub(super) place: DiskPlace,
    pub(super) staging: AttemptStaging,
    /// This process created `staging.dir()` (so it may remove it, and parts go through it).
    pub(super) claimed: bool,
}

impl<'a> Publisher<'a> {
    /// Claims the home disk's `<staging>/<load>/<attempt>/` by creating it exclusively, and
    /// its `parts/`.
    pub(super) fn claim(
        fs: &'a dyn RemoteFs,
        destination: &Destination,
        load: &LoadId,
        attempt: &AttemptId,
    ) -> Result<Publisher<'a>, BuildError> {
        let mut publisher = Publisher {
            fs,
            stagings: destination
                .disks
                .iter()
                .map(|place| DiskStaging {
                    staging: place.staging().attempt(load, attempt),
                    place: place.clone(),
                    claimed: false,
                })
                .collect(),
            published: Vec::new(),
        };
        publisher.claim_disk(0)?;
        Ok(publisher)
    }

    /// The index of the disk the attempt's part `seq` goes to (the stagings are in the
    /// destination's order).
    pub(super) fn disk_for(&self, load: &LoadId, attempt: &AttemptId, seq: u32) -> usize {
        chpart_core::disk_index(load, attempt, seq, self.stagings.len())
    }

    /// Claims the attempt's staging directory on disk `index` (exclusively, with `parts/`),
    /// unless this process already did. A directory that exists is another build's: the
    /// attempt id was used twice.
    pub(super) fn claim_disk(&mut self, index: usize) -> Result<(), BuildError> {
        let fs = self.fs;
        let slot = &mut self.stagings[index];
        if slot.claimed {
            return Ok(());
        }
        let dir = slot.staging.dir().clone();
        let load_dir = dir.parent().expect("an attempt dir has a load dir");
        fs.create_dir_all(load_dir.as_str())
            .map_err(remote(format!("create staging dir {load_dir}")))?;
        match fs.create_dir(dir.as_str()) {
            Ok(()) => slot.claimed = true,
            Err(RemoteError::AlreadyExists { .. }) => {
                let load = load_dir.file_name().unwrap_or_default();
                return Err(BuildError::AttemptTaken {
                    load: load.parse().map_err(build_err)?,
                    attempt: dir
                        .file_name()
                        .unwrap_or_default()
                        .parse()
                        .map_err(build_err)?,
                    path: dir,
                });
            }
            Err(e) => return Err(remote(format!("create staging dir {dir}"))(e)),
        }
        let parts_dir = slot.staging.parts_dir();
        fs.create_dir(parts_dir.as_str())
            .map_err(remote(format!("create staging dir {parts_dir}")))
    }

    pub(super) fn publish(
        &mut self,
        env: &BuildEnv<'_>,
        spec: &LoadSpec,
        manifest: &Manifest,
        timings: &mut BuildTimings,
    ) -> Result<(), BuildError> {
        let fs = self.fs;
        let t = Instant::now();
        // Per disk: (its staging, the table's data path there, the parts going there).
        let mut per_disk: Vec<(&DiskStaging, &RemotePath, Vec<&PartEntry>)> = self
            .stagings
            .iter()
            .filter(|s| s.claimed)
            .map(|s| (s, &s.place.data_path, Vec::new()))
            .collect();
        for part in &manifest.parts {
            let data_path = manifest.data_path_of(part);
            let slot = per_disk
                .iter_mut()
                .find(|(_, d, _)| *d == data_path)
                .expect("every part's disk was claimed");
            slot.2.push(part);
        }
        // Each disk's intent lists the parts about to leave that disk's staging for its
        // detached/, before the first of them does: gc finds them there.
        for (slot, data_path, parts) in &per_disk {
            let intent = PublishIntent {
                load: manifest.load.clone(),
                attempt: manifest.attempt.id.clone(),
                detached: parts
                    .iter()
                    .map(|p| chpart_core::detached_part_path(data_path, &p.name))
                    .collect(),
            };
            let intent_path = slot.staging.publish_intent();
            fs.write_file_atomic(intent_path.as_str(), intent.to_json().as_bytes())
                .map_err(remote(format!("write {intent_path}")))?;
        }

        // Fence: nothing enters detached/ once the load (or its cluster load) is finished.
        let _ = open_spec(env.loads, &spec.load)?;
        if let Some(of) = &spec.shard_of {
            let _ = open_spec(env.loads, &of.parent)?;
        }

        for (slot, data_path, parts) in &per_disk {
            if let Some(first) = parts.first() {
                check_owner(fs, data_path, &slot.staging.part_dir(&first.name))?;
            }
        }
        for (slot, data_path, parts) in &per_disk {
            for entry in parts {
                let from = slot.staging.part_dir(&entry.name);
                let to = chpart_core::detached_part_path(data_path, &entry.name).to_string();
                fs.rename_noreplace(from.as_str(), &to)
                    .map_err(remote(format!("publish part {} into {to}", entry.name)))?;
                self.published.push(to);
            }
        }
        let home = &self.stagings[0].staging;
        let tmp = home.manifest_tmp();
        let _ = fs.remove_all(tmp.as_str());
        fs.write_file_atomic(home.manifest().as_str(), manifest.to_json_line().as_bytes())
            .map_err(remote(format!("write manifest {}", home.manifest())))?;
        timings.publish_secs = t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Best effort: remove the parts this process published and the staging dirs it created.
    /// What fails here stays for gc, which finds it through the publish intents (kept if a part
    /// could not go).
    pub(super) fn undo(&mut self) {
        let mut all_removed = true;
        for path in self.published.drain(..) {
            if let Err(e) = self.fs.remove_all(&path) {
                tracing::warn!(
                    "could not remove published part {path} after the failure: {e}; gc will"
                );
                all_removed = false;
            }
        }
        if !all_removed {
            return;
        }
        for slot in self.stagings.iter_mut().filter(|s| s.claimed) {
            slot.claimed = false;
            let dir = slot.staging.dir();
            if let Err(e) = self.fs.remove_all(dir.as_str()) {
                tracing::warn!("could not remove staging {dir} after the failure: {e}; gc will");
            }
        }
    }
}

/// Refuses to publish a part the server could not attach: `staged` (a part in staging) must
/// belong to the owner of `<data_path>/detached`, the server's user.
pub(super) fn check_owner(
    fs: &dyn RemoteFs,
    data_path: &RemotePath,
    staged: &RemotePath,
) -> Result<(), BuildError> {
    let detached_dir = chpart_core::detached_dir(data_path);
    let detached = fs
        .stat(detached_dir.as_str())
        .map_err(remote(format!("stat {detached_dir}")))?
        .ok_or_else(|| BuildError::Remote {
            op: format!("find {detached_dir}"),
            source: Box::new(RemoteError::NotFound {
                path: detached_dir.as_str().to_owned(),
                at: fs.describe(),
                op: "stat",
            }),
        })?;
    let part = fs
        .stat(staged.as_str())
        .map_err(remote(format!("stat {staged}")))?
        .ok_or_else(|| BuildError::Build(format!("staged part {staged} vanished")))?;
    if part.uid != detached.uid {
        return Err(BuildError::Ownership {
            path: staged.as_str().to_owned(),
            owner: part.uid,
            detached: detached_dir.as_str().to_owned(),
            server_uid: detached.uid,
        });
    }
    Ok(())
}
