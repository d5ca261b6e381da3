//! Shared by the protocol's real-server tests.

use std::time::Duration;

use std::sync::Arc;

use chpart_core::{RemotePath, StagingRoots};
use chpart_protocol::cluster::Reach;
use chpart_protocol::store::Ledger;
use chpart_remote::{LocalFs, RemoteError, RemoteFs};
use chpart_server::{Server, ServerConfig, SharedServer};
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
}

impl Reach for OneHost {
    fn server(&self, _url: &str) -> SharedServer {
        self.server.clone()
    }
    fn connect(&self, _host: &str, _n: usize) -> Result<Vec<Arc<dyn RemoteFs>>, RemoteError> {
        Ok(vec![Arc::new(LocalFs::new())])
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
