//! A commit whose plan block the server drops as a duplicate, over the real 26.9 engine: the
//! plan and the first attach intents travel in one INSERT deduplicated by the plan's token, so
//! when another writer's plan block came first (here a `--prepare-only` of the same winners,
//! made while this commit's INSERT was held back), the server keeps none of this commit's
//! block. The commit must learn that from the view it reads back and write its intents on
//! their own before any ATTACH (an ATTACH without a durable intent could not be told from a
//! lost part on resume); then it finishes with every row exactly once.

mod common;

use std::time::Duration;

use chpart_protocol::commit::commit;
use chpart_protocol::ledger::Visibility;
use chpart_server::faults::{Effect, Fault};
use chpart_testenv::clickhouse::{shared, TestDb};

#[test]
fn a_commit_whose_plan_block_was_dropped_writes_its_intents_before_attaching() {
    let ch = shared();
    let db = TestDb::new(ch, "commit_race");
    let built = common::built_load(&db, "t", 2, 2, Visibility::Partition);
    let token = format!("chpart-plan:{}", built.load);
    // This commit's plan INSERT is held back 4 s, long enough for the other writer.
    built.server.inject(Fault::on(
        "execute",
        token.clone(),
        Effect::Delay(Duration::from_secs(4)),
    ));
    let before = built.server.calls().len();
    std::thread::scope(|scope| {
        let held = scope.spawn(|| {
            let done = built.rt.block_on(commit(&built.env(), built.request()));
            done.map(|_| ()).map_err(|e| e.to_string())
        });
        // Once the held INSERT has been issued, another writer records the same plan alone.
        let issued = chpart_testenv::wait_until(Duration::from_secs(60), || {
            built.server.calls()[before..]
                .iter()
                .any(|c| c.method == "execute" && c.detail.contains(&token))
        });
        assert!(issued, "the commit never sent its plan");
        let other = common::rt();
        let ledger = common::ledger_for(&db);
        let server = chpart_server::Server::new(&chpart_server::ServerConfig {
            url: ch.url(),
            user: "default".into(),
            password: None,
            request_timeout: Duration::from_secs(60),
        });
        let mut prepare = built.request();
        prepare.prepare_only = true;
        other
            .block_on(commit(&built.env_with(&server, &ledger), prepare))
            .unwrap();
        held.join().unwrap().unwrap();
    });

    // The held block was dropped: the intents went in an INSERT of their own, before the
    // first ATTACH.
    let calls = built.server.calls()[before..].to_vec();
    let plan_insert = calls
        .iter()
        .position(|c| c.method == "execute" && c.detail.contains(&token))
        .unwrap();
    let first_attach = calls
        .iter()
        .position(|c| c.method == "attach_part")
        .expect("the commit attached its parts");
    let intents_alone = calls[plan_insert + 1..first_attach].iter().any(|c| {
        c.method == "execute"
            && c.detail.starts_with("INSERT INTO")
            && c.detail.contains("attach_intent")
            && !c.detail.contains("insert_deduplication_token")
    });
    assert!(
        intents_alone,
        "no INSERT of the intents between the dropped plan block and the first ATTACH: {:#?}",
        calls
            .iter()
            .map(|c| (c.method, &c.detail[..c.detail.len().min(120)]))
            .collect::<Vec<_>>()
    );
    let rows = ch.q(&format!(
        "SELECT count(), uniqExact(id) FROM `{}`.t",
        db.name
    ));
    assert_eq!(rows.trim(), "2000\t2000", "every row exactly once");
    let intents = ch.q(&format!(
        "SELECT count() FROM `{}_ledger`.ledger WHERE load_id = '{}' AND kind = 'attach_intent'",
        db.name, built.load
    ));
    assert_eq!(intents.trim(), "4", "one intent per part, durable");
}

/// With nothing racing, a commit writes each of its facts once, however its INSERTs are
/// batched: 270 parts in 90 partitions are two ATTACH batches, whose outcomes ride with the
/// next batch's intents and with the decision.
#[test]
fn a_commit_writes_each_fact_once() {
    let ch = shared();
    let db = TestDb::new(ch, "commit_facts");
    let built = common::built_load(&db, "t", 3, 90, Visibility::Partition);
    built
        .rt
        .block_on(commit(&built.env(), built.request()))
        .unwrap();
    let by_kind = ch.q(&format!(
        "SELECT kind, count(), uniqExact(entry_id) FROM `{}_ledger`.ledger \
         WHERE load_id = '{}' GROUP BY kind ORDER BY kind FORMAT TSV",
        db.name, built.load
    ));
    let expected = [
        ("attach_intent", 270),
        ("commit_planned", 1),
        ("decided", 1),
        ("load_committed", 1),
        ("load_opened", 1),
        ("part_attached", 270),
        ("partition_published", 90),
        ("publish_intent", 90),
    ]
    .iter()
    .map(|(kind, n)| format!("{kind}\t{n}\t{n}\n"))
    .collect::<String>();
    assert_eq!(by_kind, expected, "each fact written once");
    let rows = ch.q(&format!(
        "SELECT count(), uniqExact(id) FROM `{}`.t",
        db.name
    ));
    assert_eq!(rows.trim(), "3000\t3000");
}
