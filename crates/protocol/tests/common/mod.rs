//! Shared by the protocol's real-server tests.

use std::time::Duration;

use std::sync::Arc;

use chpart_build::LocalCommand;
use chpart_core::{Attempt, RemotePath, StagingLayout, StagingRoots};
use chpart_protocol::begin::{begin, BeginRequest};
use chpart_protocol::build::{build, BuildEnv, BuildRequest, Input, LedgerDirectory};
use chpart_protocol::commit::{CommitEnv, CommitRequest, MoreConnections};
use chpart_protocol::ledger::{Mode, Visibility};
use chpart_protocol::reach::Reach;
use chpart_protocol::store::Ledger;
use chpart_remote::{LocalFs, RemoteError, RemoteFs};
use chpart_server::faults::Faulty;
use chpart_server::{ClickHouseServer, Server, ServerConfig, SharedServer};
use chpart_testenv::clickhouse::TestDb;

/// A ledger in a database of this test's own (`<db>_ledger`), so tests do not see each other's
/// loads.
#[allow(dead_code)] // each test binary compiles this module; not every one uses this
pub fn ledger_for(db: &TestDb) -> Ledger {
    let server = Server::new(&ServerConfig {
        url: db.server.url(),
        user: "default".into(),
        password: None,
        request_timeout: Duration::from_secs(60),
    });
    Ledger::new(std::sync::Arc::new(server), &format!("{}_ledger", db.name))
}

/// A runtime for a test's async calls (multi-threaded: the protocol runs blocking
/// filesystem work with `block_in_place`).
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// One server, reached at any URL, with the local filesystem: nothing here is a cluster.
#[allow(dead_code)] // each test binary compiles this module; not every one uses this
pub struct OneHost {
    /// The server every URL reaches.
    pub server: SharedServer,
    /// The staging root.
    pub staging: String,
    /// Filesystem connections handed out by `connect` so far.
    pub opened: std::sync::atomic::AtomicUsize,
}

impl Reach for OneHost {
    fn server(&self, _url: &str) -> SharedServer {
        self.server.clone()
    }
    fn connect(&self, _host: &str, n: usize) -> Result<Vec<Arc<dyn RemoteFs>>, RemoteError> {
        self.opened
            .fetch_add(n.max(1), std::sync::atomic::Ordering::SeqCst);
        Ok((0..n.max(1))
            .map(|_| Arc::new(LocalFs::new()) as Arc<dyn RemoteFs>)
            .collect())
    }
    fn staging(&self, _host: &str) -> StagingRoots {
        StagingRoots {
            single: RemotePath::new(&self.staging).unwrap(),
            per_disk: Vec::new(),
        }
    }
    fn url(&self, _host: &str) -> Option<String> {
        None
    }
}

/// A begun load of `spark_partitions` built attempts (1000 rows each over `months` months, so
/// `spark_partitions * months` parts in `months` partitions) into a new table `table` of `db`,
/// every server call through one [`Faulty`] (no fault armed), ready to commit.
#[allow(dead_code)] // each test binary compiles this module; not every one uses this
pub struct BuiltLoad {
    /// Every call of the begin, the builds and commits made with [`BuiltLoad::env`].
    pub server: Arc<Faulty>,
    /// The calls `begin` made.
    pub begin_calls: usize,
    /// The calls each build made, in order.
    pub build_calls: Vec<usize>,
    /// The load's ledger, through `server`.
    pub ledger: Ledger,
    /// The staging root.
    pub staging: String,
    /// The load.
    pub load: chpart_core::LoadId,
    /// The winners: (Spark partition, manifest line).
    pub winners: Vec<(usize, String)>,
    /// Spark partitions.
    pub spark_partitions: u32,
    /// The runtime the builds ran on.
    pub rt: tokio::runtime::Runtime,
    /// Connections a commit verifies over (`fs` and this many minus one from `reach`).
    pub verify_connections: usize,
    fs: LocalFs,
    /// How commits made with [`BuiltLoad::env`] open more connections.
    pub reach: OneHost,
    _dir: tempfile::TempDir,
}

#[allow(dead_code)] // each test binary compiles this module; not every one uses this
impl BuiltLoad {
    /// A commit environment over `server` (e.g. [`BuiltLoad::server`], or a fault-injecting
    /// wrapper of its own).
    pub fn env_with<'a>(
        &'a self,
        server: &'a dyn ClickHouseServer,
        ledger: &'a Ledger,
    ) -> CommitEnv<'a> {
        CommitEnv {
            ledger,
            server,
            fs: &self.fs,
            staging: StagingLayout::new(&self.staging).unwrap(),
            more: Some(MoreConnections {
                reach: &self.reach,
                host: "ch-test",
                total: self.verify_connections,
            }),
        }
    }

    /// A commit environment over [`BuiltLoad::server`].
    pub fn env(&self) -> CommitEnv<'_> {
        self.env_with(self.server.as_ref(), &self.ledger)
    }

    /// A commit of exactly the winners, every Spark partition required.
    pub fn request(&self) -> CommitRequest {
        CommitRequest {
            load: self.load.clone(),
            winners: Some(self.winners.clone()),
            verify: None,
            expected_partitions: Some(self.spark_partitions),
            allow_missing: false,
            visibility: None,
            prepare_only: false,
            replaced_on_every_shard: None,
        }
    }
}

/// See [`BuiltLoad`].
#[allow(dead_code)] // each test binary compiles this module; not every one uses this
pub fn built_load(
    db: &TestDb,
    table: &str,
    spark_partitions: u64,
    months: u64,
    visibility: Visibility,
) -> BuiltLoad {
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
        opened: Default::default(),
    };
    let ledger = Ledger::new(faulty.clone(), &format!("{}_ledger", db.name));
    let rt = rt();
    // The staging root is the shared server's: the load (and so every attempt's path) is
    // this test database's own.
    let load: chpart_core::LoadId = format!("{}-{table}", db.name).parse().unwrap();
    let before_begin = faulty.calls().len();
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
            inputs: None,
        },
    ))
    .unwrap();
    let begin_calls = faulty.calls().len() - before_begin;
    let mut build_calls = Vec::new();
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
        merge_split_partitions: false,
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
        let before_build = faulty.calls().len();
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
        build_calls.push(faulty.calls().len() - before_build);
        winners.push((p as usize, report.line));
    }
    BuiltLoad {
        server: faulty,
        begin_calls,
        build_calls,
        ledger,
        staging,
        load,
        winners,
        spark_partitions: spark_partitions as u32,
        rt,
        verify_connections: 4,
        fs: LocalFs::new(),
        reach,
        _dir: dir,
    }
}
