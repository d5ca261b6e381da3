//! How chpart reaches a host: its ClickHouse server and its filesystem. The single-table stages
//! reach the configured server's host, the cluster layer each shard's; the CLI implements it
//! from the config.

use std::sync::Arc;

use chpart_core::StagingRoots;
use chpart_remote::{RemoteError, RemoteFs};
use chpart_server::SharedServer;

/// How chpart reaches the hosts of a cluster: each shard's server and filesystem. The CLI
/// builds one from the config (`[[hosts]]` overrides, `[ssh]` and `[staging]` defaults).
///
/// Guarantee: `connect` returns connections to `host`'s filesystem only (never another host's:
/// staging and detached/ paths are only meaningful there), with the host key verified.
pub trait Reach: Send + Sync {
    /// A client for the server at `url`.
    fn server(&self, url: &str) -> SharedServer;
    /// `connections` (at least one) connections to `host`'s filesystem.
    fn connect(
        &self,
        host: &str,
        connections: usize,
    ) -> Result<Vec<Arc<dyn RemoteFs>>, RemoteError>;
    /// Where `host` stages parts.
    fn staging(&self, host: &str) -> StagingRoots;
    /// `host`'s HTTP endpoint when configured (else `begin` asks the cluster).
    fn url(&self, host: &str) -> Option<String>;
}
