//! The ledger's decision against the real ClickHouse 26.9 engine: the server keeps exactly one
//! decision per load, the first to reach the table, whoever sends the later ones.

use chpart_core::LoadId;
use chpart_protocol::ledger::{kind, Decision, LoadState, DECISION_ENTRY};
use chpart_testenv::clickhouse::{shared, TestDb};

mod common;
use common::{ledger_for, rt};

#[test]
fn the_first_decision_is_the_only_one_kept() {
    let ch = shared();
    let db = TestDb::new(ch, "ledger_decision");
    let rt = rt();
    let ledger = ledger_for(&db);
    rt.block_on(async {
        ledger.ensure().await.unwrap();
        let (a, b): (LoadId, LoadId) = ("load-a".parse().unwrap(), "load-b".parse().unwrap());
        // load-a: a commit claims it, then an abort (and the commit again) try.
        ledger.decide(&a, Decision::Commit).await.unwrap();
        ledger.decide(&a, Decision::Abort).await.unwrap();
        ledger.decide(&a, Decision::Commit).await.unwrap();
        // load-b: the other way round; its token is its own.
        ledger.decide(&b, Decision::Abort).await.unwrap();
        ledger.decide(&b, Decision::Commit).await.unwrap();

        let view = ledger.view(&a, &[]).await.unwrap();
        assert_eq!(view.decision, Some(Decision::Commit));
        let view_b = ledger.view(&b, &[]).await.unwrap();
        assert_eq!(view_b.decision, Some(Decision::Abort));
        assert_eq!(view_b.state, LoadState::Aborted);
        // The server kept one row per load: deduplication, not replay, settled it.
        for load in [&a, &b] {
            let rows = ledger.entries(load).await.unwrap();
            let decisions: Vec<_> = rows
                .iter()
                .filter(|e| e.entry_id == DECISION_ENTRY && e.kind == kind::DECIDED)
                .collect();
            assert_eq!(decisions.len(), 1, "{load}: {decisions:?}");
        }
    });
    // The deduplication the decision relies on is a setting of the ledger table.
    let ddl = ch.q(&format!(
        "SELECT engine_full FROM system.tables WHERE database = '{}_ledger' AND name = 'ledger'",
        db.name
    ));
    assert!(
        ddl.contains("non_replicated_deduplication_window = 10000"),
        "{ddl}"
    );
}

/// The load's spec and its commit plan are written like the decision: racing writers with
/// different bodies (a zombie driver and its replacement, an operator with another winners
/// file) each get an acknowledgement, but the server keeps only the first body, so every
/// writer reads back the same one.
#[test]
fn one_spec_and_one_plan_are_kept_per_load() {
    let ch = shared();
    let db = TestDb::new(ch, "ledger_once");
    let rt = rt();
    let ledger = ledger_for(&db);
    rt.block_on(async {
        ledger.ensure().await.unwrap();
        let load: LoadId = "load-once".parse().unwrap();
        for (entry, kind) in [("plan", kind::COMMIT_PLANNED), ("open", "x_open")] {
            // Sent concurrently, as two drivers would.
            let (first, second) = tokio::join!(
                ledger.append_once(&load, entry, kind, r#"{"winner":"app-a"}"#),
                ledger.append_once(&load, entry, kind, r#"{"winner":"app-b"}"#),
            );
            first.unwrap();
            second.unwrap();
            // And once more, later, with a third body.
            ledger
                .append_once(&load, entry, kind, r#"{"winner":"app-c"}"#)
                .await
                .unwrap();
            let rows: Vec<_> = ledger
                .entries(&load)
                .await
                .unwrap()
                .into_iter()
                .filter(|e| e.entry_id == entry)
                .collect();
            assert_eq!(rows.len(), 1, "{entry}: {rows:?}");
            assert_ne!(
                rows[0].body, r#"{"winner":"app-c"}"#,
                "{entry}: a later body"
            );
        }
        // Another load's entry of the same id has a token of its own.
        let other: LoadId = "load-other".parse().unwrap();
        ledger
            .append_once(
                &other,
                "plan",
                kind::COMMIT_PLANNED,
                r#"{"winner":"app-a"}"#,
            )
            .await
            .unwrap();
        assert_eq!(ledger.entries(&other).await.unwrap().len(), 1);
    });
}

/// A ledger made by an earlier chpart (no `by_written_at` projection, no deduplication window)
/// keeps every entry when a newer one first uses it: `ensure` adds what is missing, and the
/// reads across loads work before and after the projection is built.
#[test]
fn a_ledger_made_by_an_earlier_chpart_is_upgraded_in_place() {
    let ch = shared();
    let db = TestDb::new(ch, "ledger_upgrade");
    let rt = rt();
    let ledger = ledger_for(&db);
    let table = format!("`{}`.ledger", ledger.database());
    ch.q(&format!("CREATE DATABASE `{}`", ledger.database()));
    // The first chpart's DDL.
    ch.q(&format!(
        "CREATE TABLE {table} (load_id String, entry_id String, kind LowCardinality(String), \
         written_at DateTime64(3, 'UTC') DEFAULT now64(3), writer String, body String CODEC(ZSTD(3))) \
         ENGINE = MergeTree ORDER BY (load_id, written_at, entry_id) \
         SETTINGS fsync_after_insert = 1, fsync_part_directory = 1"
    ));
    let (a, b): (LoadId, LoadId) = ("old-a".parse().unwrap(), "old-b".parse().unwrap());
    rt.block_on(async {
        ledger.append(&a, "x", "x_step", "{}").await.unwrap();
        ledger
            .append(&b, "abort", kind::LOAD_ABORTED, "{}")
            .await
            .unwrap();
        let before = ledger.unsettled_loads().await.unwrap();
        assert!(!before.from_checkpoint);
        assert_eq!(before.loads.len(), 2, "{before:?}");

        ledger.ensure().await.unwrap();
        ledger.ensure().await.unwrap(); // idempotent
        assert_eq!(ledger.entries(&a).await.unwrap().len(), 1);
        assert_eq!(
            ledger.view(&b, &[]).await.unwrap().state,
            LoadState::Aborted
        );
        let after = ledger.unsettled_loads().await.unwrap();
        assert_eq!(after, before);
    });
    let ddl = ch.q(&format!(
        "SELECT create_table_query FROM system.tables WHERE database = '{}' AND name = 'ledger'",
        ledger.database()
    ));
    assert!(
        ddl.contains("PROJECTION by_written_at")
            && ddl.contains("non_replicated_deduplication_window = 10000"),
        "{ddl}"
    );
    assert_eq!(
        ch.q(&format!("SELECT count() FROM {table}")).trim(),
        "2",
        "no entry lost"
    );
}
