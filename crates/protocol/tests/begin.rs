//! `begin` against the real ClickHouse 26.9 engine.

use chpart_core::StagingRoots;
use chpart_protocol::begin::{begin, shadow_table, BeginError, BeginOutcome, BeginRequest};
use chpart_protocol::ledger::{kind, LoadState, Mode, Visibility};
use chpart_testenv::clickhouse::{shared, TestDb};

mod common;
use common::{ledger_for, rt};

fn request(db: &TestDb, load: &str, mode: Mode, visibility: Visibility) -> BeginRequest {
    BeginRequest {
        load: load.parse().unwrap(),
        target: format!("{}.events", db.name).parse().unwrap(),
        mode,
        visibility,
        host: "ch-test".into(),
        allow_materialized_views: false,
        clickhouse_local_version: None,
        staging: StagingRoots {
            single: "/var/lib/clickhouse/chpart-staging".parse().unwrap(),
            per_disk: Vec::new(),
        },
        shard_of: None,
        inputs: None,
    }
}

#[test]
fn begin_opens_once_snapshots_the_table_and_creates_the_shadow() {
    let ch = shared();
    let db = TestDb::new(ch, "begin_opens");
    ch.q(&format!(
        "CREATE TABLE `{}`.events (ts DateTime, id UInt64, tag LowCardinality(String) DEFAULT 'none') \
         ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id",
        db.name
    ));
    let ledger = ledger_for(&db);
    let rt = rt();
    let req = request(
        &db,
        "hour-2026-11-30T09",
        Mode::Append,
        Visibility::Partition,
    );
    let spec = match rt.block_on(begin(&ledger, &req)).unwrap() {
        BeginOutcome::Opened(spec) => spec,
        other => panic!("expected a new load, got {other:?}"),
    };
    let shadow = shadow_table(&req.target, &req.load).unwrap();
    assert_eq!(spec.publish, shadow);
    assert_eq!(spec.server_version, "26.9.2.1");
    assert_eq!(
        spec.server_timezone.as_deref(),
        Some(ch.q("SELECT timezone()").trim())
    );
    assert_eq!(spec.target_snapshot.shape.partition_key, "toYYYYMM(ts)");
    assert_eq!(spec.target_snapshot.shape.columns.len(), 3);
    assert_eq!(
        spec.target_snapshot.fingerprint,
        spec.publish_snapshot.fingerprint
    );
    assert_ne!(
        spec.target_snapshot.data_paths, spec.publish_snapshot.data_paths,
        "the shadow has its own detached/"
    );
    assert!(spec.publish_snapshot.data_paths[0].starts_with(ch.data_dir.to_str().unwrap()));
    assert_eq!(
        ch.q(&format!(
            "EXISTS TABLE `{}`.`{}`",
            shadow.database, shadow.table
        ))
        .trim(),
        "1"
    );

    // Same request again: a no-op that returns the recorded spec.
    match rt.block_on(begin(&ledger, &req)).unwrap() {
        BeginOutcome::AlreadyOpen(again) => assert_eq!(again, spec),
        other => panic!("expected a no-op, got {other:?}"),
    }
    let view = rt.block_on(ledger.view(&req.load, &[])).unwrap();
    assert_eq!(view.state, LoadState::Open);
    assert_eq!(view.entries.len(), 1);

    // A different request for the open load is refused and names both.
    let other = request(
        &db,
        "hour-2026-11-30T09",
        Mode::Replace,
        Visibility::Partition,
    );
    let err = rt.block_on(begin(&ledger, &other)).unwrap_err();
    assert!(matches!(err, BeginError::Conflict { .. }), "{err}");
    assert!(
        err.to_string().contains("mode append") && err.to_string().contains("mode replace"),
        "{err}"
    );

    // Once committed, begin refuses with NotOpen.
    rt.block_on(ledger.append(&req.load, "commit", kind::LOAD_COMMITTED, "{}"))
        .unwrap();
    let err = rt.block_on(begin(&ledger, &req)).unwrap_err();
    assert!(
        matches!(
            err,
            BeginError::NotOpen {
                state: "committed",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn begin_refuses_what_cannot_work() {
    let ch = shared();
    let db = TestDb::new(ch, "begin_refuses");
    ch.q(&format!(
        "CREATE TABLE `{}`.logtable (x UInt64) ENGINE = Log",
        db.name
    ));
    let ledger = ledger_for(&db);
    let rt = rt();

    let err = rt
        .block_on(begin(
            &ledger,
            &request(&db, "l1", Mode::Append, Visibility::Part),
        ))
        .unwrap_err();
    assert!(matches!(err, BeginError::TableMissing { .. }), "{err}");
    assert!(err.to_string().contains(".events does not exist"), "{err}");

    let mut req = request(&db, "l2", Mode::Append, Visibility::Part);
    req.target = format!("{}.logtable", db.name).parse().unwrap();
    let err = rt.block_on(begin(&ledger, &req)).unwrap_err();
    assert!(
        err.to_string().contains("engine Log is not supported"),
        "{err}"
    );

    let err = rt
        .block_on(begin(
            &ledger,
            &request(&db, "l3", Mode::Replace, Visibility::Part),
        ))
        .unwrap_err();
    assert!(
        err.to_string().contains("needs --visibility partition"),
        "{err}"
    );
    // Nothing was recorded for refused loads.
    for load in ["l1", "l2", "l3"] {
        let view = rt
            .block_on(ledger.view(&load.parse().unwrap(), &[]))
            .unwrap();
        assert_eq!(view.state, LoadState::Unknown, "{load}");
    }
}
