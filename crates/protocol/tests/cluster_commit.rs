//! The commit of a load into a Distributed table, driven in-process over a real 3-shard cluster
//! of 26.9 servers, with one fault at a time injected around one shard's real server
//! ([`Faulty`]): an ATTACH whose answer is lost, a transient exception on ATTACH, a refused
//! observation while shards are prepared, a lost answer to the cluster's decision, a lost
//! answer to a partition's MOVE; each without retries and with the CLI's retries. After the
//! commit (and, if it failed, one re-run without the fault), every shard holds exactly the rows
//! its winning manifests list, the loser's rows nowhere, and gc leaves nothing on any shard.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chpart_build::LocalCommand;
use chpart_core::retry::RetryPolicy;
use chpart_core::{Attempt, LoadId, RemotePath, StagingLayout, StagingRoots, TableRef};
use chpart_protocol::api::begin_load;
use chpart_protocol::api::gc;
use chpart_protocol::begin::BeginRequest;
use chpart_protocol::build::{build, BuildEnv, BuildRequest, Input, LedgerDirectory};
use chpart_protocol::cluster::commit_cluster;
use chpart_protocol::commit::{CommitError, CommitRequest};
use chpart_protocol::ledger::{Mode, Visibility};
use chpart_protocol::reach::Reach;
use chpart_protocol::store::Ledger;
use chpart_protocol::FailureKind;
use chpart_remote::{LocalFs, RemoteError, RemoteFs};
use chpart_server::faults::{Effect, Fault, Faulty};
use chpart_server::retry::Retrying;
use chpart_server::{Server, ServerConfig, SharedServer};
use chpart_testenv::cluster::Cluster;

const COLUMNS: &str = "ts DateTime('UTC'), id UInt64, name String";

/// Every host of the cluster reached on this machine: its real server behind one [`Faulty`]
/// per URL (the same one every time, so a test arms faults on it), retried as the CLI does
/// when `retry_deadline` is not zero; its filesystem directly.
struct TestReach {
    servers: Mutex<BTreeMap<String, Arc<Faulty>>>,
    staging: BTreeMap<String, String>,
    retry_deadline: Mutex<Duration>,
}

impl TestReach {
    fn faulty(&self, url: &str) -> Arc<Faulty> {
        let mut servers = self.servers.lock().unwrap();
        servers
            .entry(url.to_owned())
            .or_insert_with(|| {
                Arc::new(Faulty::new(Arc::new(Server::new(&ServerConfig {
                    url: url.to_owned(),
                    user: "default".into(),
                    password: None,
                    request_timeout: Duration::from_secs(60),
                }))))
            })
            .clone()
    }
}

impl Reach for TestReach {
    fn server(&self, url: &str) -> SharedServer {
        let deadline = *self.retry_deadline.lock().unwrap();
        Arc::new(Retrying::new(
            self.faulty(url),
            RetryPolicy::within(deadline),
        ))
    }
    fn connect(&self, _host: &str, _n: usize) -> Result<Vec<Arc<dyn RemoteFs>>, RemoteError> {
        Ok(vec![Arc::new(LocalFs::new())])
    }
    fn staging(&self, host: &str) -> StagingRoots {
        StagingRoots {
            single: RemotePath::new(&self.staging[host]).unwrap(),
            per_disk: Vec::new(),
        }
    }
    fn url(&self, _host: &str) -> Option<String> {
        None
    }
}

/// One scenario: where the fault is, and what the first commit must do.
struct Scenario {
    name: &'static str,
    /// Whether transient faults are retried (the CLI's default) or not (`deadline_secs = 0`).
    retries: bool,
    /// The shard whose server gets the fault.
    shard: u32,
    fault: Fault,
    /// Whether the first commit finishes despite the fault (it reconciled from what it read
    /// back), or fails retryably and a re-run finishes.
    first_commit_finishes: bool,
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            retries: false,
            name: "attach_answer_lost",
            shard: 2,
            fault: Fault::on("attach_part", "", Effect::LoseAnswer),
            first_commit_finishes: true,
        },
        Scenario {
            retries: false,
            name: "attach_transient",
            shard: 3,
            fault: Fault::on("attach_part", "", Effect::Exception { code: 242 }),
            first_commit_finishes: true,
        },
        Scenario {
            retries: false,
            name: "prepare_refused",
            shard: 3,
            fault: Fault::on("table_state", "", Effect::Refuse),
            first_commit_finishes: false,
        },
        Scenario {
            retries: false,
            name: "decision_answer_lost",
            shard: 1,
            fault: Fault::on("execute", "chpart-decision:", Effect::LoseAnswer),
            first_commit_finishes: false,
        },
        Scenario {
            retries: false,
            name: "move_answer_lost",
            shard: 2,
            fault: Fault::on("execute", "MOVE PARTITION", Effect::LoseAnswer),
            first_commit_finishes: false,
        },
        // With retries: a read and a ledger write are sent again and the commit finishes in
        // one run; a MOVE is never resent, retries or not.
        Scenario {
            retries: true,
            name: "prepare_refused_retried",
            shard: 3,
            fault: Fault::on("table_state", "", Effect::Refuse),
            first_commit_finishes: true,
        },
        Scenario {
            retries: true,
            name: "decision_answer_lost_retried",
            shard: 1,
            fault: Fault::on("execute", "chpart-decision:", Effect::LoseAnswer),
            first_commit_finishes: true,
        },
        Scenario {
            retries: true,
            name: "move_answer_lost_retried",
            shard: 2,
            fault: Fault::on("execute", "MOVE PARTITION", Effect::LoseAnswer),
            first_commit_finishes: false,
        },
    ]
}

fn count(cluster: &Cluster, shard: u32, table: &str) -> u64 {
    cluster
        .node(shard)
        .server
        .q(&format!("SELECT count() FROM {table}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_fault_on_one_shard_never_loses_or_duplicates_rows() {
    let cluster = Cluster::start("cc_faults", &[1, 2, 3]);
    let dir = tempfile::tempdir().unwrap();
    let reach = TestReach {
        servers: Mutex::new(BTreeMap::new()),
        retry_deadline: Mutex::new(Duration::ZERO),
        staging: cluster
            .nodes
            .iter()
            .map(|n| {
                let root = n.data_dir().join("chpart-staging");
                (n.address.to_string(), root.display().to_string())
            })
            .collect(),
    };
    let entry = &cluster.node(1).server;
    let rt = common::rt();
    let local = LocalCommand::new(chpart_testenv::clickhouse_local(), Duration::from_secs(120));
    for node in &cluster.nodes {
        node.server.q("CREATE DATABASE db");
    }

    for (i, scenario) in scenarios().into_iter().enumerate() {
        *reach.retry_deadline.lock().unwrap() = if scenario.retries {
            Duration::from_secs(20)
        } else {
            Duration::ZERO
        };
        let ledger = Ledger::new(reach.server(&entry.url()), "chpart_ledger");
        let (local_table, dist) = (format!("db.local_{i}"), format!("db.dist_{i}"));
        for node in &cluster.nodes {
            node.server.q(&format!(
                "CREATE TABLE {local_table} ({COLUMNS}) ENGINE = MergeTree \
                 PARTITION BY toYYYYMM(ts) ORDER BY id"
            ));
        }
        entry.q(&format!(
            "CREATE TABLE {dist} AS {local_table} ENGINE = Distributed(cc_faults, db, local_{i}, id)"
        ));
        let load: LoadId = format!("faults-{}", scenario.name).parse().unwrap();
        let target: TableRef = dist.parse().unwrap();
        rt.block_on(begin_load(
            &ledger,
            &reach,
            &BeginRequest {
                load: load.clone(),
                target,
                mode: Mode::Append,
                visibility: Visibility::Partition,
                host: cluster.node(1).address.to_string(),
                allow_materialized_views: false,
                clickhouse_local_version: None,
                staging: reach.staging(&cluster.node(1).address.to_string()),
                shard_of: None,
                inputs: None,
            },
        ))
        .unwrap_or_else(|e| panic!("{}: begin: {e}", scenario.name));

        // Partition 0 twice (the first attempt loses), partition 1 once; 4,000 rows in all
        // that count, over two months.
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
            staging: StagingLayout::new(&reach.staging[&cluster.node(1).address.to_string()])
                .unwrap(),
            spool_chunk_bytes: chpart_protocol::build::DEFAULT_SPOOL_CHUNK_BYTES,
            merge_split_partitions: false,
        };
        let mut lines = Vec::new();
        for (partition, attempt, from) in [(0, "a0-lost", 0), (0, "a0-won", 0), (1, "a1", 2000)] {
            let rows = write_rows(dir.path(), &format!("{i}-{attempt}.parquet"), from, 2000);
            let report = build(
                &env,
                BuildRequest {
                    load: load.clone(),
                    attempt: Attempt {
                        id: attempt.parse().unwrap(),
                        partition,
                        stage: None,
                        stage_attempt: None,
                        attempt_number: None,
                    },
                    input: Input::Parquet(vec![rows]),
                    merge: false,
                },
            )
            .unwrap_or_else(|e| panic!("{}: build {attempt}: {e}", scenario.name));
            if attempt != "a0-lost" {
                lines.push(report.line);
            }
        }
        let request = |winners: Option<Vec<String>>| CommitRequest {
            load: load.clone(),
            winners: winners.map(|w| w.into_iter().enumerate().collect()),
            verify: None,
            expected_partitions: Some(2),
            allow_missing: false,
            visibility: None,
            prepare_only: false,
            replaced_on_every_shard: None,
        };

        let faulty = reach.faulty(&cluster.node(scenario.shard).server.url());
        faulty.inject(scenario.fault.clone());
        let first = rt.block_on(commit_cluster(&ledger, &reach, request(Some(lines))));
        assert!(
            faulty.pending().is_empty(),
            "{}: the fault never fired",
            scenario.name
        );
        match (first, scenario.first_commit_finishes) {
            (Ok(_), true) => {}
            (Err(e), false) => {
                assert_eq!(e.kind(), FailureKind::Retryable, "{}: {e}", scenario.name);
                if matches!(e, CommitError::Shard { .. }) {
                    let text = e.to_string();
                    assert!(
                        text.contains(&format!("shard {}", scenario.shard)),
                        "{}: the error names the shard: {text}",
                        scenario.name
                    );
                }
                // Resumed from the ledger alone, as a driver on another machine would.
                rt.block_on(commit_cluster(&ledger, &reach, request(None)))
                    .unwrap_or_else(|e| panic!("{}: re-run: {e}", scenario.name));
            }
            (outcome, expected) => panic!(
                "{}: first commit finishing expected {expected}, got {:?}",
                scenario.name,
                outcome.map(|o| o.summary)
            ),
        }

        // Exactly once: 4,000 rows in all, each shard what ClickHouse's own routing sends it.
        let total: u64 = (1..=3).map(|s| count(&cluster, s, &local_table)).sum();
        assert_eq!(total, 4000, "{}", scenario.name);
        for shard in 1..=3u32 {
            let expected: u64 = entry
                .q(&format!(
                    "SELECT count() FROM numbers(4000) WHERE \
                     (toUInt64(number) % 6) {} ",
                    match shard {
                        1 => "< 1",
                        2 => "BETWEEN 1 AND 2",
                        _ => ">= 3",
                    }
                ))
                .trim()
                .parse()
                .unwrap();
            assert_eq!(
                count(&cluster, shard, &local_table),
                expected,
                "{}: shard {shard}",
                scenario.name
            );
        }
        let distinct: u64 = entry
            .q(&format!("SELECT uniqExact(id) FROM {dist}"))
            .trim()
            .parse()
            .unwrap();
        assert_eq!(distinct, 4000, "{}", scenario.name);
    }

    // gc leaves nothing on any shard: no detached part, no staging directory.
    let ledger = Ledger::new(reach.server(&entry.url()), "chpart_ledger");
    rt.block_on(gc(
        &ledger,
        &reach,
        &LocalFs::new(),
        &StagingLayout::new(&reach.staging[&cluster.node(1).address.to_string()]).unwrap(),
        None,
        false,
        false,
    ))
    .unwrap();
    for node in &cluster.nodes {
        let detached = node
            .server
            .q("SELECT count() FROM system.detached_parts WHERE database = 'db'");
        assert_eq!(detached.trim(), "0", "shard {}", node.shard_num);
        let staging = PathBuf::from(&reach.staging[&node.address.to_string()]);
        let left: Vec<_> = walk(&staging);
        assert!(left.is_empty(), "shard {}: {left:?}", node.shard_num);
    }
}

/// `n` rows with ids from `from`, as Parquet.
fn write_rows(dir: &std::path::Path, name: &str, from: u64, n: u64) -> PathBuf {
    let select = format!(
        "SELECT toDateTime('2026-01-20 00:00:00', 'UTC') + toIntervalDay(number % 20) AS ts, \
         {from} + number AS id, concat('name-', toString(number)) AS name FROM numbers({n})"
    );
    chpart_testenv::write_rows(dir, name, &select, "Parquet")
}

/// Files left under `root` (directories that are empty do not count).
fn walk(root: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
