//! A load on a time axis, for `chpart status --load L --timeline FILE.svg`: every attempt
//! still known (the winners from the commit plan, the others from what they left in staging)
//! with when it built, uploaded and published, which won, which lost, which never wrote a
//! manifest (failed or killed), which went to publish too late and was fenced (builds note that
//! in the ledger), and which gc is taking away; and the ledger's entries
//! (begin, plan, decision, attaches, partitions made visible, commit or abort).
//!
//! Attempts that lost are only known until gc removes what they left: take the picture before
//! gc to see them. Times of attempts are the executors' clocks, times of ledger entries the
//! server's.

use chpart_core::{LoadId, Manifest, Phases, StagingLayout};
use chpart_remote::{RemoteError, RemoteFs};
use serde::Serialize;

use crate::cleanup::CleanupError;
use crate::ledger::{kind, LoadSpec, LoadView};
use crate::reach::Reach;
use crate::staging::{disks_of, staged_attempts_on_disks, Places, TAKEN_PREFIX};
use crate::store::Ledger;

/// What became of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// Its manifest is a winner of the commit plan.
    Won,
    /// It wrote a manifest that is not a winner (a retry, a speculative copy, a zombie).
    Lost,
    /// It left staging without a manifest: it failed, was killed, or was fenced (it tried to
    /// publish after the load was finished).
    NoManifest,
    /// gc has taken its staging away and is removing it.
    Collected,
    /// It went to publish after the load was finished and published nothing (a late writer).
    Fenced,
}

/// One attempt's lane.
#[derive(Debug, Clone, Serialize)]
pub struct Lane {
    /// The attempt id.
    pub attempt: String,
    /// The shard, for a cluster load.
    pub shard: Option<u32>,
    /// Its Spark partition, when its manifest says.
    pub partition: Option<u32>,
    /// When its phases ended (zeros: unknown).
    pub phases: PhaseTimes,
    /// What became of it.
    pub fate: Fate,
    /// Parts it published.
    pub parts: usize,
}

/// When an attempt's phases ended, Unix milliseconds (0: unknown).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PhaseTimes {
    /// Started.
    pub started: u64,
    /// Built by clickhouse-local.
    pub built: u64,
    /// In staging.
    pub uploaded: u64,
    /// Published, manifest written; for an attempt without a manifest, when its staging was
    /// last changed.
    pub published: u64,
}

/// One ledger entry worth showing.
#[derive(Debug, Clone, Serialize)]
pub struct Mark {
    /// When the server wrote it, Unix milliseconds.
    pub at: i64,
    /// The shard, for a shard's sub-load.
    pub shard: Option<u32>,
    /// What it records.
    pub what: String,
}

/// A load on a time axis.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    /// The load.
    pub load: String,
    /// Its target table.
    pub table: String,
    /// `open`, `committed`, `aborted`.
    pub state: String,
    /// Every attempt still known, by start.
    pub lanes: Vec<Lane>,
    /// The ledger's entries worth showing, by time.
    pub marks: Vec<Mark>,
}

/// The timeline of `load`, or `None` if the ledger does not know it.
pub async fn timeline(
    ledger: &Ledger,
    reach: &dyn Reach,
    fs: &dyn RemoteFs,
    staging: &StagingLayout,
    load: &LoadId,
) -> Result<Option<Timeline>, CleanupError> {
    let view = ledger.view(load, crate::KNOWN_KINDS).await?;
    let Some(spec) = view.spec.clone() else {
        return Ok(None);
    };
    let places = Places::new(ledger, reach, fs, staging);
    let mut out = Timeline {
        load: load.to_string(),
        table: spec.target.to_string(),
        state: format!("{:?}", view.state).to_lowercase(),
        lanes: Vec::new(),
        marks: marks(&view, None),
    };
    match &spec.cluster {
        Some(cluster) => {
            for shard in &cluster.shards {
                let sub = ledger.view(&shard.load, crate::KNOWN_KINDS).await?;
                let Some(sub_spec) = sub.spec.clone() else {
                    continue;
                };
                out.marks.extend(marks(&sub, Some(shard.shard_num)));
                out.lanes
                    .extend(lanes(&places, &sub, &sub_spec, Some(shard.shard_num))?);
            }
        }
        None => out.lanes = lanes(&places, &view, &spec, None)?,
    }
    // By first known time; the end of a load last among entries written together (the last
    // partitions' entries share the commit's INSERT).
    let first = |l: &Lane| match l.phases.started {
        0 => l.phases.published,
        started => started,
    };
    out.lanes
        .sort_by_key(|l| (first(l), l.phases.published, l.shard));
    let last = |m: &Mark| ["committed", "aborted", "abandoned"].contains(&m.what.as_str());
    out.marks.sort_by_key(|m| (m.at, last(m)));
    Ok(Some(out))
}

/// The ledger entries of one (sub-)load worth a mark: begin, plans, the decision, the first and
/// last attach, each partition made visible, the end.
fn marks(view: &LoadView, shard: Option<u32>) -> Vec<Mark> {
    let mark = |at: i64, what: String| Mark { at, shard, what };
    let mut out = Vec::new();
    let attached: Vec<i64> = view
        .entries
        .iter()
        .filter(|e| e.kind == kind::PART_ATTACHED)
        .map(|e| e.written_at_ms)
        .collect();
    for e in &view.entries {
        let what = match e.kind.as_str() {
            kind::LOAD_OPENED if shard.is_none() => "begin".to_owned(),
            kind::COMMIT_PLANNED | kind::CLUSTER_PLANNED => "plan".to_owned(),
            kind::DECIDED => {
                let decision = serde_json::from_str::<serde_json::Value>(&e.body)
                    .ok()
                    .and_then(|v| v["decision"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                format!("decided: {decision}")
            }
            kind::PARTITION_PUBLISHED => {
                let partition = e.entry_id.rsplit(':').next().unwrap_or("");
                format!("partition {partition} visible")
            }
            kind::LOAD_COMMITTED => "committed".to_owned(),
            kind::LOAD_ABORTED => "aborted".to_owned(),
            kind::LOAD_ABANDONED => "abandoned".to_owned(),
            _ => continue,
        };
        out.push(mark(e.written_at_ms, what));
    }
    if let (Some(first), Some(last)) = (attached.iter().min(), attached.iter().max()) {
        out.push(mark(
            *first,
            format!("attaching {} part(s)", attached.len()),
        ));
        if last > first {
            out.push(mark(*last, "all attached".to_owned()));
        }
    }
    out
}

/// The attempts of one (sub-)load: winners from its plan, the rest from its staging.
fn lanes(
    places: &Places<'_>,
    view: &LoadView,
    spec: &LoadSpec,
    shard: Option<u32>,
) -> Result<Vec<Lane>, CleanupError> {
    let plan = view.plan().map_err(crate::store::LedgerStoreError::from)?;
    let mut out: Vec<Lane> = Vec::new();
    let lane = |m: &Manifest, fate: Fate| Lane {
        attempt: m.attempt.id.to_string(),
        shard,
        partition: Some(m.attempt.partition),
        phases: times(&m.phases, m.created_at_unix_ms),
        fate,
        parts: m.parts.len(),
    };
    for e in view
        .entries
        .iter()
        .filter(|e| e.kind == kind::ATTEMPT_FENCED)
    {
        if let Ok(body) = serde_json::from_str::<crate::ledger::FencedBody>(&e.body) {
            out.push(Lane {
                attempt: body.attempt,
                shard,
                partition: Some(body.partition),
                phases: PhaseTimes {
                    started: body.started_at_unix_ms,
                    published: e.written_at_ms.max(0) as u64,
                    ..Default::default()
                },
                fate: Fate::Fenced,
                parts: 0,
            });
        }
    }
    let mut winners = Vec::new();
    if let Some(plan) = &plan {
        for text in &plan.manifests {
            if let Ok(m) = Manifest::from_json(text) {
                winners.push(m.attempt.id.to_string());
                out.push(lane(&m, Fate::Won));
            }
        }
        winners.extend(plan.winners.iter().map(|(_, a)| a.to_string()));
    }
    let (_, fs, staging) = places.of(spec)?;
    let fs = fs.get();
    let disks = disks_of(spec, &staging)?;
    let staged = tokio::task::block_in_place(|| staged_attempts_on_disks(fs, &disks, &spec.load))?;
    for attempt in staged {
        let (name, collected) = match attempt.attempt.strip_prefix(TAKEN_PREFIX) {
            Some(name) => (name.to_owned(), true),
            None => (attempt.attempt.clone(), false),
        };
        if winners.contains(&name) {
            continue;
        }
        let dir = |disk: &chpart_core::DiskPlace| {
            format!(
                "{}/{}",
                disk.staging().load_dir(&spec.load),
                attempt.attempt
            )
        };
        let manifest = disks.iter().find_map(|d| {
            let bytes = fs.read_file(&format!("{}/manifest.json", dir(d))).ok()?;
            Manifest::from_json(std::str::from_utf8(&bytes).ok()?).ok()
        });
        let fate = match (collected, &manifest) {
            (true, _) => Fate::Collected,
            (false, Some(_)) => Fate::Lost,
            (false, None) => Fate::NoManifest,
        };
        match manifest {
            Some(m) => out.push(Lane {
                attempt: name,
                ..lane(&m, fate)
            }),
            None => {
                let mut changed = 0;
                for d in &disks {
                    match fs.stat(&dir(d)) {
                        Ok(Some(stat)) => changed = changed.max(stat.mtime.max(0) as u64 * 1000),
                        Ok(None) | Err(RemoteError::NotFound { .. }) => {}
                        Err(e) => {
                            return Err(CleanupError::Remote {
                                op: format!("stat {}", dir(d)),
                                source: Box::new(e),
                            })
                        }
                    }
                }
                out.push(Lane {
                    attempt: name,
                    shard,
                    partition: None,
                    phases: PhaseTimes {
                        published: changed,
                        ..Default::default()
                    },
                    fate,
                    parts: attempt.parts.len(),
                });
            }
        }
    }
    Ok(out)
}

fn times(phases: &Phases, published: u64) -> PhaseTimes {
    PhaseTimes {
        started: phases.started_at_unix_ms,
        built: phases.built_at_unix_ms,
        uploaded: phases.uploaded_at_unix_ms,
        published,
    }
}
