//! What a commit asks of the server, counted in-process over the real 26.9 engine (every call
//! recorded by [`Faulty`] with no fault armed): besides one `ATTACH PART` per part and one
//! `MOVE PARTITION` per partition, a commit's statements are a fixed number, whatever the
//! load's size. The breakdown is printed (issue 12 works that number down).

mod common;
use common::OneHost;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chpart_build::LocalCommand;
use chpart_core::{Attempt, StagingLayout};
use chpart_protocol::begin::{begin, BeginRequest};
use chpart_protocol::build::{build, BuildEnv, BuildRequest, Input, LedgerDirectory};
use chpart_protocol::cluster::Reach;
use chpart_protocol::commit::{commit, CommitEnv, CommitRequest};
use chpart_protocol::ledger::{Mode, Visibility};
use chpart_protocol::store::Ledger;
use chpart_remote::LocalFs;
use chpart_server::faults::Faulty;
use chpart_server::{Server, ServerConfig};
use chpart_testenv::clickhouse::{shared, TestDb};

/// Statements of one commit of `spark_partitions` attempts, each 1000 rows over
/// `months` months (so `spark_partitions * months` parts in `months` partitions), by method.
fn commit_calls(
    db: &TestDb,
    table: &str,
    spark_partitions: u64,
    months: u64,
    visibility: Visibility,
) -> BTreeMap<&'static str, usize> {
    let ch = db.server;
    ch.q(&format!(
        "CREATE TABLE `{}`.{table} (ts DateTime('UTC'), id UInt64, name String) \
         ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id",
        db.name
    ));
    let staging = ch.data_dir.join("chpart-staging").display().to_string();
    let faulty = Arc::new(Faulty::new(Arc::new(Server::new(&ServerConfig {
        url: ch.url(),
        user: "default".into(),
        password: None,
        request_timeout: Duration::from_secs(60),
    }))));
    let reach = OneHost {
        server: faulty.clone(),
        staging: staging.clone(),
    };
    let ledger = Ledger::new(faulty.clone(), &format!("{}_ledger", db.name));
    let rt = common::rt();
    let load: chpart_core::LoadId = format!("cost-{table}").parse().unwrap();
    rt.block_on(begin(
        &ledger,
        &BeginRequest {
            load: load.clone(),
            target: format!("{}.{table}", db.name).parse().unwrap(),
            mode: Mode::Append,
            visibility,
            host: "ch-test".into(),
            allow_materialized_views: false,
            clickhouse_local_version: None,
            staging: reach.staging(""),
            shard_of: None,
        },
    ))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let local = LocalCommand::new(chpart_testenv::clickhouse_local(), Duration::from_secs(120));
    let loads = LedgerDirectory {
        ledger: ledger.clone(),
        runtime: rt.handle().clone(),
    };
    let env = BuildEnv {
        loads: &loads,
        reach: &reach,
        connections: 1,
        local: &local,
        work_parent: dir.path().join("work"),
        staging: StagingLayout::new(&staging).unwrap(),
        spool_chunk_bytes: chpart_protocol::build::DEFAULT_SPOOL_CHUNK_BYTES,
    };
    let mut winners = Vec::new();
    for p in 0..spark_partitions {
        let select = format!(
            "SELECT toDateTime('2026-01-15 00:00:00', 'UTC') + toIntervalMonth(number % {months}) AS ts, \
             {} + number AS id, 'x' AS name FROM numbers(1000)",
            p * 1000
        );
        let rows =
            chpart_testenv::write_rows(dir.path(), &format!("{p}.parquet"), &select, "Parquet");
        let report = build(
            &env,
            BuildRequest {
                load: load.clone(),
                attempt: Attempt {
                    id: format!("a{p}").parse().unwrap(),
                    partition: p as u32,
                    stage: None,
                    stage_attempt: None,
                    attempt_number: None,
                },
                input: Input::Parquet(vec![rows]),
                merge: false,
            },
        )
        .unwrap();
        winners.push((p as usize, report.line));
    }
    let before = faulty.calls().len();
    rt.block_on(commit(
        &CommitEnv {
            ledger: &ledger,
            server: faulty.as_ref(),
            fs: &LocalFs::new(),
            staging: StagingLayout::new(&staging).unwrap(),
        },
        CommitRequest {
            load,
            winners: Some(winners),
            verify: None,
            expected_partitions: Some(spark_partitions as u32),
            allow_missing: false,
            visibility: None,
            prepare_only: false,
        },
    ))
    .unwrap();
    let mut by_method = BTreeMap::new();
    for call in &faulty.calls()[before..] {
        let method = match call.method {
            "execute" if call.detail.contains("MOVE PARTITION") => "execute: MOVE PARTITION",
            "execute" if call.detail.starts_with("INSERT INTO") => "execute: ledger INSERT",
            "execute" => "execute: other",
            m => m,
        };
        *by_method.entry(method).or_insert(0) += 1;
    }
    let rows = ch.q(&format!("SELECT count() FROM `{}`.{table}", db.name));
    assert_eq!(rows.trim(), (spark_partitions * 1000).to_string());
    by_method
}

#[test]
fn a_commit_costs_a_fixed_number_of_statements_besides_its_attaches_and_moves() {
    let ch = shared();
    let db = TestDb::new(ch, "commit_cost");
    for visibility in [Visibility::Partition, Visibility::Part] {
        // (Spark partitions, months): 2 x 2 = 4 parts in 2 partitions; 4 x 3 = 12 in 3.
        let mut fixed = Vec::new();
        for (n, (spark, months)) in [(2u64, 2u64), (4, 3)].into_iter().enumerate() {
            let table = format!("t_{visibility:?}_{n}").to_lowercase();
            let calls = commit_calls(&db, &table, spark, months, visibility);
            let total: usize = calls.values().sum();
            let per_load = calls.get("attach_part").copied().unwrap_or(0)
                + calls.get("execute: MOVE PARTITION").copied().unwrap_or(0);
            assert_eq!(
                calls.get("attach_part").copied(),
                Some((spark * months) as usize)
            );
            eprintln!(
                "{visibility:?}, {} parts in {months} partitions: {total} statements, {} fixed: {calls:?}",
                spark * months,
                total - per_load
            );
            fixed.push(total - per_load);
        }
        assert_eq!(
            fixed[0], fixed[1],
            "{visibility:?}: the statements besides ATTACH and MOVE do not grow with the load"
        );
        // Measured 2026-12-02 (the ledger written once per phase: plan with the first attach
        // intents, decision with the outcomes and publish intents, commit): a regression
        // above these is a round trip added to every commit.
        let bound = match visibility {
            Visibility::Partition => 11,
            Visibility::Part => 8,
        };
        assert!(
            fixed[0] <= bound,
            "{visibility:?}: {} fixed statements, more than the {bound} measured",
            fixed[0]
        );
    }
}
