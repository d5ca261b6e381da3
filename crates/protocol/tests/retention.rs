//! The ledger at the scale of years of loads, against the real ClickHouse 26.9 engine and the
//! local filesystem: gc reads only the loads with something left to do and records what it
//! finished; a staging directory a killed late builder leaves after that is still found; the
//! replace checks still see an open load begun long ago; `ledger prune` deletes the entries of
//! long-finished loads and keeps what fences them.
//!
//! The history is written straight into the ledger, as years of earlier loads would have left
//! it (`load_opened` with a real spec, `decided`, `load_committed`), dated three days back: far
//! behind any gc checkpoint's rediscovery margin.

use std::collections::BTreeMap;
use std::path::Path;

use chpart_core::{LoadId, StagingLayout, StagingRoots, TableRef};
use chpart_protocol::api::{abort, gc};
use chpart_protocol::begin::{begin, shadow_table, BeginError, BeginOutcome, BeginRequest};
use chpart_protocol::build::{LedgerDirectory, LoadDirectory};
use chpart_protocol::cleanup::{status, GcReport, Removal};
use chpart_protocol::commit::CommitSummary;
use chpart_protocol::ledger::{kind, LoadSpec, LoadState, Mode, Visibility, TOMBSTONE_KINDS};
use chpart_protocol::retention::prune;
use chpart_protocol::store::{now_unix_ms, Ledger};
use chpart_remote::LocalFs;
use chpart_testenv::clickhouse::{shared, ClickHouse, TestDb};

mod common;
use common::OneHost;
use common::{ledger_for, rt};

/// Finished loads of the synthetic history.
const HISTORY: usize = 300;
/// How long ago the history was written.
const THREE_DAYS_MS: u64 = 3 * 86_400_000;

struct Setup<'a> {
    ch: &'a ClickHouse,
    db: TestDb<'a>,
    ledger: Ledger,
    reach: OneHost,
    staging: StagingLayout,
    fs: LocalFs,
    rt: tokio::runtime::Runtime,
}

impl Setup<'_> {
    fn request(&self, load: &str, mode: Mode) -> BeginRequest {
        BeginRequest {
            load: load.parse().unwrap(),
            target: self.target(),
            mode,
            visibility: Visibility::Partition,
            host: "ch-test".into(),
            allow_materialized_views: false,
            clickhouse_local_version: None,
            staging: StagingRoots {
                single: self.staging.root().clone(),
                per_disk: Vec::new(),
            },
            shard_of: None,
            inputs: None,
        }
    }

    fn target(&self) -> TableRef {
        format!("{}.events", self.db.name).parse().unwrap()
    }

    fn begin(&self, load: &str, mode: Mode) -> Result<LoadSpec, BeginError> {
        match self
            .rt
            .block_on(begin(&self.ledger, &self.request(load, mode)))?
        {
            BeginOutcome::Opened(spec) => Ok(spec),
            other => panic!("{load}: expected a new load, got {other:?}"),
        }
    }

    fn gc(&self) -> GcReport {
        self.rt
            .block_on(gc(
                &self.ledger,
                &self.reach,
                &self.fs,
                &self.staging,
                None,
                false,
                false,
            ))
            .unwrap()
    }

    fn ledger_table(&self) -> String {
        format!("`{}`.ledger", self.ledger.database())
    }

    /// Rows of `sql` on the test's server, one per line.
    fn q(&self, sql: &str) -> String {
        self.ch.q(sql).trim().to_owned()
    }
}

fn setup(name: &str) -> Setup<'static> {
    let ch = shared();
    let db = TestDb::new(ch, name);
    ch.q(&format!(
        "CREATE TABLE `{}`.events (ts DateTime, id UInt64) ENGINE = MergeTree \
         PARTITION BY toYYYYMM(ts) ORDER BY id",
        db.name
    ));
    let ledger = ledger_for(&db);
    let root = ch.data_dir.join(format!("staging-{}", db.name));
    std::fs::create_dir_all(&root).unwrap();
    let staging = StagingLayout::new(root.to_str().unwrap()).unwrap();
    let reach = OneHost {
        server: ledger.shared_server(),
        staging: root.to_str().unwrap().to_owned(),
        opened: Default::default(),
    };
    Setup {
        ch,
        db,
        ledger,
        reach,
        staging,
        fs: LocalFs::new(),
        rt: rt(),
    }
}

/// `VALUES` rows `(load_id, entry_id, kind, written_at, writer, body)` of a history load begun
/// with `spec` (its load, publish table and mode changed) `at_ms`, committed a minute later
/// unless `open`.
fn history_rows(
    s: &Setup,
    template: &LoadSpec,
    load: &str,
    mode: Mode,
    at_ms: u64,
    open: bool,
) -> Vec<String> {
    let load_id: LoadId = load.parse().unwrap();
    let mut spec = template.clone();
    spec.load = load_id.clone();
    spec.mode = mode;
    spec.publish = shadow_table(&s.target(), &load_id).unwrap();
    spec.opened_at_unix_ms = at_ms;
    let summary = CommitSummary {
        load: load_id.clone(),
        table: s.target(),
        mode,
        visibility: Visibility::Partition,
        partitions: 1,
        parts: 2,
        rows: 2000,
        winners: vec![
            (0, "app-h.0".parse().unwrap()),
            (1, "app-h.1".parse().unwrap()),
        ],
    };
    let row = |id: &str, kind: &str, at: u64, body: String| {
        format!(
            "('{load}', '{id}', '{kind}', fromUnixTimestamp64Milli(toInt64({at}), 'UTC'), 'history:1', '{}')",
            body.replace('\\', "\\\\").replace('\'', "\\'")
        )
    };
    let mut rows = vec![row(
        "open",
        kind::LOAD_OPENED,
        at_ms,
        serde_json::to_string(&spec).unwrap(),
    )];
    if !open {
        rows.push(row(
            "decision",
            kind::DECIDED,
            at_ms + 30_000,
            r#"{"decision":"commit"}"#.into(),
        ));
        rows.push(row(
            "commit",
            kind::LOAD_COMMITTED,
            at_ms + 60_000,
            serde_json::to_string(&summary).unwrap(),
        ));
    }
    rows
}

fn removed_loads(report: &GcReport) -> Vec<&str> {
    report.removed.iter().map(|(l, _)| l.as_str()).collect()
}

/// gc's first run reads every load (no checkpoint yet) and records each finished one done; the
/// next runs read the loads left pending and those written since, not the history. An open
/// replace load begun long ago still blocks a second one (it is pending, not written since);
/// a killed late builder's staging of a long-done load is found by listing the staging root.
/// Then `ledger prune` deletes the history's entries but its tombstones: the loads stay
/// committed, fenced and listed.
#[test]
fn gc_reads_what_is_left_to_do_and_prune_keeps_what_fences() {
    let s = setup("retention_scale");
    let template = s.begin("template", Mode::Append).unwrap();
    let _open = s.begin("recent-open", Mode::Append).unwrap();
    s.rt.block_on(abort(
        &s.ledger,
        &s.reach,
        &s.fs,
        &s.staging,
        &"template".parse().unwrap(),
    ))
    .unwrap();
    let ddl = s.q(&format!(
        "SELECT create_table_query FROM system.tables WHERE database = '{}' AND name = 'ledger'",
        s.ledger.database()
    ));
    assert!(ddl.contains("PROJECTION by_written_at"), "{ddl}");

    let long_ago = now_unix_ms() - THREE_DAYS_MS;
    let mut rows = Vec::new();
    for i in 0..HISTORY {
        let load = format!("hist-{i:05}");
        rows.extend(history_rows(
            &s,
            &template,
            &load,
            Mode::Append,
            long_ago + i as u64 * 3_600_000 / 100,
            false,
        ));
    }
    rows.extend(history_rows(
        &s,
        &template,
        "hist-open-replace",
        Mode::Replace,
        long_ago,
        true,
    ));
    s.ch.q(&format!(
        "INSERT INTO {} (load_id, entry_id, kind, written_at, writer, body) VALUES {}",
        s.ledger_table(),
        rows.join(", ")
    ));
    let everything = HISTORY + 3;

    // The first gc: no checkpoint, so it reads every load once and records every finished one.
    let first = s.gc();
    assert_eq!(first.loads_read, everything, "{first:?}");
    assert_eq!(
        first.loads_done,
        HISTORY + 1,
        "the history and the aborted template"
    );
    assert!(first.removed.is_empty(), "{first:?}");

    // The next ones read what is pending (the two open loads) and what was written within
    // the rediscovery margin (the template's entries, its gc_done among them): 3 loads.
    let second = s.gc();
    assert_eq!(second.loads_read, 3, "{second:?}");
    assert_eq!(second.loads_done, 0);

    // An open replace load begun three days ago still owns the table's partitions.
    match s.begin("new-replace", Mode::Replace) {
        Err(BeginError::ReplaceBusy { other, .. }) => {
            assert_eq!(other.as_str(), "hist-open-replace")
        }
        other => panic!("a second replace load began: {other:?}"),
    }

    // A builder of hist-00007 read it open, was killed after claiming its staging directory
    // and before its fence check: gc recorded the load done long before; the listing of the
    // staging root finds it.
    let killed =
        Path::new(s.staging.root().as_str()).join("hist-00007/app-killed.3/parts/202611_1_1_0");
    std::fs::create_dir_all(&killed).unwrap();
    std::fs::write(killed.join("data.bin"), b"half an upload").unwrap();
    let third = s.gc();
    assert_eq!(removed_loads(&third), ["hist-00007"], "{third:?}");
    assert!(
        matches!(&third.removed[0].1[..], [Removal::Staging { .. }]),
        "{third:?}"
    );
    assert!(!Path::new(s.staging.root().as_str())
        .join("hist-00007")
        .exists());
    assert_eq!(third.loads_read, 4, "{third:?}");

    // status of every load: the history from gc's summaries, the open ones from their entries.
    let all =
        s.rt.block_on(status(&s.ledger, &s.reach, &s.fs, &s.staging, None))
            .unwrap();
    assert_eq!(all.len(), everything);
    let by_load: BTreeMap<&str, _> = all.iter().map(|l| (l.load.as_str(), l)).collect();
    let h = by_load["hist-00042"];
    assert_eq!(
        (h.state.as_str(), h.rows, h.winners.len()),
        ("committed", None, 0)
    );
    assert!(h.gc_done_at_unix_ms.is_some());
    assert_eq!(by_load["recent-open"].state, "open");
    assert_eq!(by_load["hist-open-replace"].gc_done_at_unix_ms, None);

    // Prune what finished more than a day ago: the history, not the template (finished now),
    // never the open loads.
    let day_ago = (now_unix_ms() - 86_400_000) as i64;
    let dry = s.rt.block_on(prune(&s.ledger, day_ago, true)).unwrap();
    assert_eq!(
        (dry.loads.len(), dry.entries),
        (HISTORY, HISTORY),
        "{dry:?}"
    );
    let count_not_tombstone = |like: &str| {
        s.q(&format!(
            "SELECT count() FROM {} WHERE load_id LIKE '{like}' AND kind NOT IN ({})",
            s.ledger_table(),
            TOMBSTONE_KINDS
                .iter()
                .map(|k| format!("'{k}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    assert_eq!(
        count_not_tombstone("hist-0%"),
        HISTORY.to_string(),
        "a dry run deletes nothing"
    );
    let pruned = s.rt.block_on(prune(&s.ledger, day_ago, false)).unwrap();
    assert_eq!((pruned.loads.len(), pruned.entries), (HISTORY, HISTORY));
    assert_eq!(count_not_tombstone("hist-0%"), "0");
    assert_eq!(
        count_not_tombstone("hist-open-replace"),
        "1",
        "an open load is never pruned"
    );
    assert_eq!(count_not_tombstone("template"), "1", "finished today");
    let again = s.rt.block_on(prune(&s.ledger, day_ago, false)).unwrap();
    assert_eq!(
        (again.loads.len(), again.already_pruned),
        (0, HISTORY),
        "{again:?}"
    );

    // A pruned load is still committed: its builds are fenced, `begin` refuses it, status
    // shows what gc recorded.
    let pruned_load: LoadId = "hist-00003".parse().unwrap();
    let view =
        s.rt.block_on(s.ledger.view(&pruned_load, chpart_protocol::KNOWN_KINDS))
            .unwrap();
    assert_eq!(
        (view.state, view.spec.is_none()),
        (LoadState::Committed, true)
    );
    let directory = LedgerDirectory {
        ledger: s.ledger.clone(),
        runtime: s.rt.handle().clone(),
    };
    assert_eq!(
        directory.lookup(&pruned_load).unwrap().0,
        LoadState::Committed
    );
    match s.begin("hist-00003", Mode::Append) {
        Err(BeginError::NotOpen { state, .. }) => assert_eq!(state, "committed"),
        other => panic!("a pruned load began again: {other:?}"),
    }
    let one =
        s.rt.block_on(status(
            &s.ledger,
            &s.reach,
            &s.fs,
            &s.staging,
            Some(&pruned_load),
        ))
        .unwrap();
    assert_eq!((one.len(), one[0].state.as_str()), (1, "committed"));
    assert_eq!(
        one[0].table.as_deref(),
        Some(s.target().to_string().as_str())
    );

    // gc after the prune: still only what is left to do.
    let fourth = s.gc();
    assert_eq!(fourth.loads_read, 3, "{fourth:?}");
}
