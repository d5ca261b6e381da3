//! gc against a late writer, with the real ClickHouse 26.9 engine and the real local filesystem:
//! the writer passed its fence before the load finished and renames its part into `detached/`
//! at the worst moment for gc. A wrapper around [`LocalFs`] makes that moment deterministic.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use chpart_core::{
    detached_part_name, AttemptId, LoadId, PartitionId, PublishIntent, RemotePath, StagingLayout,
    StagingRoots,
};
use chpart_protocol::begin::{begin, BeginOutcome, BeginRequest};
use chpart_protocol::cleanup::clean_finished_load;
use chpart_protocol::ledger::{kind, Mode, Visibility};
use chpart_remote::{DirEntry, LocalFs, RemoteError, RemoteFs, Stat, UploadStats};
use chpart_testenv::clickhouse::{shared, TestDb};

/// When the late writer's rename into `detached/` happens, relative to gc's first change to the
/// writer's staging directory (taking it away, or removing it).
#[derive(Clone, Copy, Debug)]
enum Moment {
    JustBefore,
    JustAfter,
}

/// [`LocalFs`], plus a late writer that renames `part_from` to `part_to` at `moment` around
/// gc's first rename or removal of `attempt_dir`.
struct LateWriter {
    inner: LocalFs,
    attempt_dir: String,
    part_from: String,
    part_to: String,
    moment: Moment,
    outcome: Mutex<Option<Result<(), String>>>,
}

impl LateWriter {
    fn fire(&self) {
        let mut outcome = self.outcome.lock().unwrap();
        if outcome.is_none() {
            let result = self
                .inner
                .rename_noreplace(&self.part_from, &self.part_to)
                .map_err(|e| e.to_string());
            *outcome = Some(result);
        }
    }

    fn around<T>(&self, path: &str, op: impl FnOnce() -> T) -> T {
        let ours = path == self.attempt_dir && self.outcome.lock().unwrap().is_none();
        if ours && matches!(self.moment, Moment::JustBefore) {
            self.fire();
        }
        let result = op();
        if ours {
            self.fire();
        }
        result
    }
}

impl RemoteFs for LateWriter {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn create_dir_all(&self, path: &str) -> Result<(), RemoteError> {
        self.inner.create_dir_all(path)
    }
    fn create_dir(&self, path: &str) -> Result<(), RemoteError> {
        self.inner.create_dir(path)
    }
    fn upload_dir(&self, local: &Path, remote: &str) -> Result<UploadStats, RemoteError> {
        self.inner.upload_dir(local, remote)
    }
    fn rename_noreplace(&self, from: &str, to: &str) -> Result<(), RemoteError> {
        self.around(from, || self.inner.rename_noreplace(from, to))
    }
    fn stat(&self, path: &str) -> Result<Option<Stat>, RemoteError> {
        self.inner.stat(path)
    }
    fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, RemoteError> {
        self.inner.list_dir(path)
    }
    fn read_file(&self, path: &str) -> Result<Vec<u8>, RemoteError> {
        self.inner.read_file(path)
    }
    fn write_file_atomic(&self, path: &str, bytes: &[u8]) -> Result<(), RemoteError> {
        self.inner.write_file_atomic(path, bytes)
    }
    fn remove_all(&self, path: &str) -> Result<(), RemoteError> {
        self.around(path, || self.inner.remove_all(path))
    }
    fn digest_dir(&self, path: &str) -> Result<BTreeMap<String, (u64, String)>, RemoteError> {
        self.inner.digest_dir(path)
    }
}

mod common;
use common::{ledger_for, rt};

/// A finished (aborted) part-visibility load with one late writer whose part is staged and
/// listed in its publish intent but not yet renamed into the target's `detached/`.
fn late_writer_is_never_left_in_detached(moment: Moment) {
    let ch = shared();
    let db = TestDb::new(ch, &format!("gc_late_{moment:?}").to_lowercase());
    let d = &db.name;
    ch.q(&format!(
        "CREATE TABLE `{d}`.events (ts DateTime, id UInt64) ENGINE = MergeTree \
         PARTITION BY toYYYYMM(ts) ORDER BY id"
    ));
    let ledger = ledger_for(&db);
    let load: LoadId = "late-load".parse().unwrap();
    let rt = rt();
    let staging_root = ch.data_dir.join(format!("staging-{d}"));
    let staging = StagingLayout::new(staging_root.to_str().unwrap()).unwrap();
    let req = BeginRequest {
        load: load.clone(),
        target: format!("{d}.events").parse().unwrap(),
        mode: Mode::Append,
        visibility: Visibility::Part,
        host: "ch-test".into(),
        allow_materialized_views: false,
        clickhouse_local_version: None,
        staging: StagingRoots {
            single: staging.root().clone(),
            per_disk: Vec::new(),
        },
        shard_of: None,
        inputs: None,
    };
    let spec = match rt.block_on(begin(&ledger, &req)).unwrap() {
        BeginOutcome::Opened(spec) => spec,
        other => panic!("expected a new load, got {other:?}"),
    };

    // A real part of the table: made by the server, detached, then moved into the writer's
    // staging under the name the writer would publish it as.
    ch.q(&format!(
        "INSERT INTO `{d}`.events VALUES ('2026-11-30 09:00:00', 1), ('2026-11-30 09:10:00', 2)"
    ));
    ch.q(&format!(
        "ALTER TABLE `{d}`.events DETACH PARTITION ID '202611'"
    ));
    let data_path = spec.publish_snapshot.data_paths[0].clone();
    let detached = Path::new(&data_path).join("detached");
    let made: Vec<_> = std::fs::read_dir(&detached)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(made.len(), 1, "{made:?}");

    let attempt: AttemptId = "app-zombie.7".parse().unwrap();
    let partition: PartitionId = "202611".parse().unwrap();
    let name = detached_part_name(&load, &attempt, &partition, 0);
    let layout = staging.attempt(&load, &attempt);
    let part_from = layout.part_dir(&name).as_str().to_owned();
    let part_to = detached.join(name.to_string()).to_str().unwrap().to_owned();
    std::fs::create_dir_all(Path::new(&part_from).parent().unwrap()).unwrap();
    std::fs::rename(&made[0], &part_from).unwrap();
    let intent = PublishIntent {
        load: load.clone(),
        attempt: attempt.clone(),
        detached: vec![RemotePath::new(&part_to).unwrap()],
    };
    std::fs::write(layout.publish_intent().as_str(), intent.to_json()).unwrap();

    // The load finishes; the writer passed its fence before that.
    rt.block_on(ledger.append(&load, "abort", kind::LOAD_ABORTED, "{}"))
        .unwrap();

    let fs = LateWriter {
        inner: LocalFs::new(),
        attempt_dir: staging.load_dir(&load).as_str().to_owned() + "/" + attempt.as_str(),
        part_from,
        part_to: part_to.clone(),
        moment,
        outcome: Mutex::new(None),
    };
    let removed = rt
        .block_on(clean_finished_load(
            ledger.server(),
            &fs,
            &staging,
            &spec,
            false,
        ))
        .unwrap();
    let writer = fs.outcome.lock().unwrap().clone();
    let writer = writer.expect("the late writer ran during gc");
    match moment {
        // The writer won the race: its part reached detached/, gc must find and drop it.
        Moment::JustBefore => assert_eq!(writer, Ok(()), "the writer's rename"),
        // gc had taken the directory: the writer's rename finds nothing to move.
        Moment::JustAfter => assert!(writer.is_err(), "the writer's rename: {writer:?}"),
    }
    assert!(
        !Path::new(&part_to).exists(),
        "a late writer's part was left in detached/ ({moment:?}); gc removed {removed:?}"
    );
    let left: Vec<_> = std::fs::read_dir(&detached).unwrap().collect();
    assert!(left.is_empty(), "detached/ holds {left:?}");
    assert!(
        !Path::new(staging.load_dir(&load).as_str()).exists(),
        "the load's staging is removed"
    );
}

#[test]
fn gc_drops_a_part_a_late_writer_publishes_just_before_gc_reaches_its_staging() {
    late_writer_is_never_left_in_detached(Moment::JustBefore);
}

#[test]
fn a_late_writer_cannot_publish_once_gc_has_taken_its_staging() {
    late_writer_is_never_left_in_detached(Moment::JustAfter);
}
