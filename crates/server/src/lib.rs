//! chpart's ClickHouse client: the statements the protocol needs, typed answers, typed errors.
//!
//! Everything chpart asks of the server goes through [`ClickHouseServer`] (HTTP: [`Server`]): reading a table's definition
//! and where it stores data, listing active and detached parts, `ATTACH PART '<exact name>'`
//! (never `ATTACH PARTITION`, which would take every validly named part in `detached/`, losers
//! included), and dropping detached parts. It speaks HTTP through the official `clickhouse`
//! crate with row validation on, so a system-table column that changes type in a future server
//! is a clear error rather than garbage.
//!
//! Guarantees: a statement is sent once per call; nothing here retries. Errors carry the
//! server's `Code: N` and a class ([`ErrorClass`]) so callers decide retry versus reconcile.

#![warn(missing_docs)]

mod error;
#[macro_use]
mod forward;
#[cfg(feature = "test-support")]
pub mod faults;
pub mod resolve;
pub mod retry;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use clickhouse::Row;
use serde::Deserialize;

pub use chpart_core::sql::{quote_ident, quote_str, quote_table};
pub use error::{code, is_transient_code, parse_exception, ErrorClass, ServerError};

/// A password that never shows up in `Debug` output, logs or errors.
#[derive(Clone, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value (read from a file or the environment, never from argv).
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }
    fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// How to reach the server. Built from validated config; holds no unchecked input.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// HTTP endpoint, e.g. `http://127.0.0.1:8123`.
    pub url: String,
    /// ClickHouse user.
    pub user: String,
    /// Password; `None` for a user without one.
    pub password: Option<Secret>,
    /// Upper bound on one statement, end to end.
    pub request_timeout: Duration,
}

/// A table's definition and storage as the server reports them (`system.tables`).
#[derive(Debug, Clone, PartialEq, Eq, Row, Deserialize)]
pub struct TableInfo {
    /// Database.
    pub database: String,
    /// Table name.
    pub name: String,
    /// Table UUID (Atomic databases).
    pub uuid: String,
    /// Engine, e.g. `MergeTree`.
    pub engine: String,
    /// Engine with its arguments and settings.
    pub engine_full: String,
    /// The exact `CREATE TABLE` statement.
    pub create_table_query: String,
    /// Partition key expression.
    pub partition_key: String,
    /// Sorting key expression.
    pub sorting_key: String,
    /// Primary key expression.
    pub primary_key: String,
    /// Sampling key expression.
    pub sampling_key: String,
    /// Storage policy name.
    pub storage_policy: String,
    /// One directory per disk; `detached/` is directly under each.
    pub data_paths: Vec<String>,
}

/// A disk of the server (`system.disks`).
#[derive(Debug, Clone, PartialEq, Eq, Row, Deserialize)]
pub struct DiskRow {
    /// Its name.
    pub name: String,
    /// Its root path, ending in `/`.
    pub path: String,
    /// `Local`, `ObjectStorage`, ...
    #[serde(rename = "type")]
    pub disk_type: String,
    /// Whether its data is remote (object storage, web).
    pub is_remote: bool,
}

/// One volume of a storage policy (`system.storage_policies`).
#[derive(Debug, Clone, PartialEq, Eq, Row, Deserialize)]
pub struct VolumeRow {
    /// The volume's name.
    pub volume_name: String,
    /// Its priority: 1 is where inserted parts go first.
    pub volume_priority: u64,
    /// Its disks, in order.
    pub disks: Vec<String>,
}

/// One replica of a cluster (`system.clusters`).
#[derive(Debug, Clone, PartialEq, Eq, Row, Deserialize)]
pub struct ClusterReplica {
    /// The shard's number (1-based, config order).
    pub shard_num: u32,
    /// The shard's weight.
    pub shard_weight: u32,
    /// The replica's number within its shard.
    pub replica_num: u32,
    /// The host as the cluster config names it.
    pub host_name: String,
    /// Its native TCP port.
    pub port: u16,
}

/// What a server of a cluster says of itself, asked through the cluster
/// ([`Server::cluster_http_ports`]).
#[derive(Debug, Clone, PartialEq, Eq, Row, Deserialize)]
pub struct ReplicaPorts {
    /// `shardNum()`.
    pub shard_num: u32,
    /// `tcpPort()`: with the shard, identifies the replica.
    pub tcp_port: u16,
    /// `getServerPort('http_port')`.
    pub http_port: u16,
}

/// One column of a table (`system.columns`), in table order.
#[derive(Debug, Clone, PartialEq, Eq, Row, Deserialize)]
pub struct ColumnInfo {
    /// Column name.
    pub name: String,
    /// ClickHouse type, e.g. `LowCardinality(String)`.
    #[serde(rename = "type")]
    pub type_name: String,
    /// `DEFAULT`, `MATERIALIZED`, `ALIAS`, `EPHEMERAL` or empty.
    pub default_kind: String,
    /// The default expression, or empty.
    pub default_expression: String,
}

/// An entry of a table's `detached/` directories (`system.detached_parts`).
#[derive(Debug, Clone, PartialEq, Eq, Row, Deserialize)]
pub struct DetachedPartInfo {
    /// Directory name as it is in `detached/`.
    pub name: String,
    /// Partition id, when the name parses.
    pub partition_id: Option<String>,
    /// Reason prefix (`attaching`, `broken`, `ignored`, ...), or `None` for a plain part.
    pub reason: Option<String>,
    /// Disk name.
    pub disk: String,
    /// Absolute path.
    pub path: String,
    /// Bytes on disk.
    pub bytes_on_disk: u64,
    /// The directory's modification time (unix seconds).
    pub modified_unix: u64,
}

/// One row of [`Server::table_state`]: a `detached/` entry or an active part.
#[derive(Debug, Clone, PartialEq, Eq, Row, Deserialize)]
pub struct StateRow {
    /// Whether this is a `detached/` entry (else an active part).
    pub detached: bool,
    /// Directory name (detached) or part name (active).
    pub name: String,
    /// Partition id (empty for a detached entry whose name does not parse).
    pub partition_id: String,
    /// Reason prefix of a detached entry (`attaching`, `broken`, ...), or empty.
    pub reason: String,
    /// Rows of an active part (0 for detached entries).
    pub rows: u64,
    /// `hash_of_all_files` of an active part (empty for detached entries).
    pub hash_of_all_files: String,
    /// A detached entry's directory modification time (unix seconds; 0 for active parts).
    pub modified_unix: u64,
    /// An active part's merge level (0 for detached entries).
    pub level: u64,
    /// An active part's highest block number (0 for detached entries).
    pub max_block: u64,
}

/// What [`Server::attach_activity`] reports: what tells a crashed ATTACH's claim from a live one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Row, Deserialize)]
pub struct AttachActivity {
    /// When the running server started (unix seconds, `now() - uptime()`: whole seconds).
    pub started_unix: u64,
    /// Queries other than this one running an ALTER ... ATTACH that names the table.
    pub attaching: u64,
}

/// One row of [`Server::check_parts`]: the server's verdict on one active part.
#[derive(Debug, Clone, PartialEq, Eq, Row, Deserialize)]
pub struct PartCheck {
    /// The part's name.
    pub part_path: String,
    /// Every file matched `checksums.txt`.
    pub is_passed: bool,
    /// Why not (e.g. `Code: 40 ... Checksum mismatch for file data.bin`), or empty.
    pub message: String,
}

/// A table for [`ClickHouseServer::check_tables`] to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableToCheck<'a> {
    /// Its database.
    pub database: &'a str,
    /// Its name.
    pub table: &'a str,
    /// A `create_table_query` whose columns the caller already holds: if the table's definition
    /// is still exactly this statement, its columns are not read (they are part of it).
    pub known_definition: Option<&'a str>,
}

/// A table with what `begin` records of it, read in one statement
/// ([`ClickHouseServer::table_definition`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDefinition {
    /// Its `system.tables` row.
    pub info: TableInfo,
    /// Its columns in order.
    pub columns: Vec<ColumnInfo>,
    /// The tables that depend on it (`dependencies_database`, `dependencies_table`: the
    /// materialized views reading from it), as `db.table`, sorted.
    pub views: Vec<String>,
    /// The server's version string.
    pub version: String,
    /// The server's time zone.
    pub timezone: String,
}

/// What [`ClickHouseServer::check_tables`] reports of one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCheck {
    /// Its definition, or `None` if it does not exist.
    pub info: Option<TableInfo>,
    /// Its columns in order; `None` when they were not read because the definition is the
    /// caller's `known_definition` (or the table does not exist).
    pub columns: Option<Vec<ColumnInfo>>,
    /// Mutations not done yet.
    pub pending_mutations: u64,
}

/// One entry of chpart's ledger table as [`ClickHouseServer::ledger_entries`] reads it.
#[derive(Debug, Clone, PartialEq, Eq, Row, Deserialize)]
pub struct LedgerRow {
    /// The load.
    pub load_id: String,
    /// The entry's id within the load.
    pub entry_id: String,
    /// Its kind.
    pub kind: String,
    /// When the server wrote it, in Unix milliseconds.
    pub written_at_ms: i64,
    /// `host:pid` of the writer.
    pub writer: String,
    /// Its JSON body.
    pub body: String,
}

/// The `system.tables` fields of [`TableInfo`] (a SELECT list: add more fields, then FROM).
const TABLE_INFO_SELECT_FIELDS: &str = "SELECT database, name, toString(uuid) AS uuid, engine, \
     engine_full, create_table_query, partition_key, sorting_key, primary_key, sampling_key, \
     storage_policy, data_paths";
/// The `system.columns` fields of [`ColumnInfo`].
const COLUMN_FIELDS: &str = "name, type, default_kind, default_expression";

/// A server as the protocol holds it: shared, behind the trait.
pub type SharedServer = Arc<dyn ClickHouseServer>;

/// A connection to one ClickHouse server over HTTP: the [`ClickHouseServer`] of production.
#[derive(Clone)]
pub struct Server {
    client: clickhouse::Client,
    endpoint: String,
    timeout: Duration,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl Server {
    /// A client for `config`. Connects lazily; nothing is sent yet. Host names are resolved
    /// by the system resolver, once each ([`resolve`]).
    pub fn new(config: &ServerConfig) -> Server {
        Server::with_lookup(config, resolve::system_lookup())
    }

    /// A client for `config` whose host names are looked up with `lookup` (once each).
    pub fn with_lookup(config: &ServerConfig, lookup: resolve::Lookup) -> Server {
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new_with_resolver(
            resolve::Resolver::new(lookup),
        );
        // As the clickhouse crate's own client: keepalive, and idle connections dropped before
        // the server's 3 s keep-alive timeout closes them.
        connector.set_keepalive(Some(Duration::from_secs(60)));
        let http =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(2))
                .build(connector);
        let mut client = clickhouse::Client::with_http_client(http)
            .with_url(&config.url)
            .with_user(&config.user);
        if let Some(password) = &config.password {
            client = client.with_password(password.expose());
        }
        Server {
            client,
            endpoint: config.url.clone(),
            timeout: config.request_timeout,
        }
    }

    /// The same client, naming `product` (e.g. `chpart-commit`) and `version` first in the
    /// HTTP `User-Agent` of every statement, which the server keeps in
    /// `system.query_log.http_user_agent`: operators see which command sent what.
    pub fn identified_as(mut self, product: &str, version: &str) -> Server {
        self.client = self.client.with_product_info(product, version);
        self
    }

    /// The endpoint URL, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn run<T>(
        &self,
        statement: &str,
        fut: impl std::future::Future<Output = clickhouse::error::Result<T>>,
    ) -> Result<T, ServerError> {
        let started = std::time::Instant::now();
        let result = tokio::time::timeout(self.timeout, fut).await;
        tracing::debug!(
            "{:.1} ms: {}",
            started.elapsed().as_secs_f64() * 1e3,
            short(statement)
        );
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.translate(statement, e)),
            Err(_) => Err(ServerError::Transport {
                endpoint: self.endpoint.clone(),
                detail: format!("no answer within {:?}", self.timeout),
                statement: short(statement),
            }),
        }
    }

    fn translate(&self, statement: &str, e: clickhouse::error::Error) -> ServerError {
        use clickhouse::error::Error as E;
        let endpoint = self.endpoint.clone();
        let statement = short(statement);
        let text = e.to_string();
        if let Some((code, name, message)) = parse_exception(&text) {
            return ServerError::Server {
                endpoint,
                code,
                name,
                message,
                statement,
            };
        }
        match e {
            E::Network(_) | E::TimedOut => ServerError::Transport {
                endpoint,
                detail: text,
                statement,
            },
            _ => ServerError::Protocol {
                endpoint,
                detail: text,
                statement,
            },
        }
    }

    /// Runs a statement that returns no rows (DDL, ALTER). Sent verbatim: `?` is not special.
    pub async fn execute(&self, sql: &str) -> Result<(), ServerError> {
        self.run(sql, self.client.query_raw(sql).execute()).await
    }

    /// Runs a query with `{name: Type}` server-side parameters and returns all rows.
    pub async fn fetch<T>(&self, sql: &str, params: &[(&str, &str)]) -> Result<Vec<T>, ServerError>
    where
        T: Row + for<'b> Deserialize<'b> + 'static,
        for<'b> T: Row<Value<'b> = T>,
    {
        let mut query = self.client.query_raw(sql);
        for (name, value) in params {
            query = query.param(name, *value);
        }
        self.run(sql, query.fetch_all::<T>()).await
    }
}

/// What chpart asks of one ClickHouse server: every read and every change the protocol makes.
/// The protocol (begin, build's fences, commit, abort, gc, status) holds servers only as
/// [`SharedServer`], so a test can wrap a real server in `faults::Faulty` (feature `test-support`) and drive the
/// protocol in-process with a fault at an exact statement.
///
/// Guarantees of every implementation (the conformance suite in `tests/server.rs` checks them):
/// - a call sends its statement at most once; nothing retries inside (retrying is the caller's
///   decision, by the error's [`ErrorClass`]);
/// - a read changes nothing;
/// - `Ok` from a change (`execute`, `attach_part`, `drop_detached_part`) means the server applied
///   it; after a transport error (no answer, connection lost: [`ErrorClass::Unknown`] for a
///   change) the outcome is unknown, and the caller learns it by reading the server back
///   (`table_state`, `detached_parts`), never by sending the change again;
/// - every error names the endpoint and the statement.
#[async_trait]
pub trait ClickHouseServer: Send + Sync + fmt::Debug {
    /// The endpoint URL, for messages.
    fn endpoint(&self) -> &str;

    /// Runs a statement that returns no rows (DDL, ALTER, INSERT ... VALUES). Sent verbatim.
    /// `Ok` means the server finished it; an unclear error (transport, timeout) means it may or
    /// may not have taken effect: the caller reads the server back before acting on it.
    async fn execute(&self, sql: &str) -> Result<(), ServerError>;

    /// [`ClickHouseServer::execute`] of a statement that is safe to send again whatever became
    /// of an earlier send (an INSERT with a deduplication token, `CREATE ... IF NOT EXISTS`):
    /// an implementation may retry it after a transient error.
    async fn execute_idempotent(&self, sql: &str) -> Result<(), ServerError> {
        self.execute(sql).await
    }

    /// The rows of a query that selects chpart's ledger columns (`load_id, entry_id, kind,
    /// written_at_ms, writer, body`), with `{name: Type}` server-side parameters.
    async fn ledger_entries(
        &self,
        sql: &str,
        params: &[(&str, &str)],
    ) -> Result<Vec<LedgerRow>, ServerError>;

    /// The server's version string, e.g. `26.9.2.1`.
    async fn version(&self) -> Result<String, ServerError>;

    /// The server's time zone (`SELECT timezone()`): the zone of `DateTime` columns without
    /// one, so the zone their partition keys are computed in.
    async fn timezone(&self) -> Result<String, ServerError>;

    /// The server's clock (`now64(3)`), in ms since the Unix epoch: the clock every
    /// `DEFAULT now64()` column the server fills is written with.
    async fn now_unix_ms(&self) -> Result<i64, ServerError>;

    /// The user this client logs in as (`currentUser()`).
    async fn current_user(&self) -> Result<String, ServerError>;

    /// Whether that user holds `privilege` on `on` (`CHECK GRANT <privilege> ON <on>`: its
    /// own grants and its roles', whether or not the table exists). Both are SQL as a `GRANT`
    /// writes them: `ALTER DELETE`; `` `db`.`t` ``, `` `db`.* `` or an engine name.
    async fn has_grant(&self, privilege: &str, on: &str) -> Result<bool, ServerError>;

    /// Whether `database` exists.
    async fn database_exists(&self, database: &str) -> Result<bool, ServerError>;

    /// The engine of `database` (`Atomic`, `Ordinary`, ...), `None` if it does not exist.
    async fn database_engine(&self, database: &str) -> Result<Option<String>, ServerError>;

    /// The names in `database` of the tables with these UUIDs, as (uuid, name); a UUID no
    /// table there has is left out. A table keeps its UUID through RENAME and EXCHANGE.
    async fn table_names_by_uuid(
        &self,
        database: &str,
        uuids: &[String],
    ) -> Result<Vec<(String, String)>, ServerError>;

    /// The table's definition and data paths, or `None` if it does not exist.
    async fn table_info(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Option<TableInfo>, ServerError>;

    /// [`ClickHouseServer::table_info`] with the table's columns, the tables that depend on
    /// it and the server's version and time zone, in one statement; `None` if it does not
    /// exist (or this user is not shown it).
    async fn table_definition(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Option<TableDefinition>, ServerError>;

    /// The replicas of `cluster` in config order (`system.clusters`); empty if the server
    /// knows no such cluster.
    async fn cluster_replicas(&self, cluster: &str) -> Result<Vec<ClusterReplica>, ServerError>;

    /// Every replica of `cluster` that answers, asked through the cluster itself
    /// (`clusterAllReplicas`, skipping replicas that do not answer): its shard, TCP and HTTP
    /// ports.
    async fn cluster_http_ports(&self, cluster: &str) -> Result<Vec<ReplicaPorts>, ServerError>;

    /// The type ClickHouse gives `expression` over the columns of `database.table`
    /// (`toTypeName`), e.g. a Distributed table's sharding key over its local table.
    async fn type_of(
        &self,
        expression: &str,
        database: &str,
        table: &str,
    ) -> Result<String, ServerError>;

    /// The server's disks (`system.disks`).
    async fn disks(&self) -> Result<Vec<DiskRow>, ServerError>;

    /// The volumes of storage policy `policy`, by priority (`system.storage_policies`).
    async fn policy_volumes(&self, policy: &str) -> Result<Vec<VolumeRow>, ServerError>;

    /// The materialized views that read from the table (as `db.view`): those an INSERT into it
    /// triggers. On 26.9 `system.tables.dependencies_database/_table` of the source table lists
    /// them (a plain view is not listed: it reads the table when queried).
    async fn materialized_views(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Vec<String>, ServerError>;

    /// The table's columns in order.
    async fn columns(&self, database: &str, table: &str) -> Result<Vec<ColumnInfo>, ServerError>;

    /// Everything in the table's `detached/` directories.
    async fn detached_parts(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Vec<DetachedPartInfo>, ServerError>;

    /// `ALTER TABLE db.t ATTACH PART '<name>'`: the server claims `detached/<name>` by renaming
    /// it, so a part can be attached at most once. Not idempotent: after a transport error the
    /// caller must look at `system.parts` and `detached/` before doing anything else.
    async fn attach_part(&self, database: &str, table: &str, part: &str)
        -> Result<(), ServerError>;

    /// `CHECK TABLE db.t`, one row per active part: the server reads every file of every part
    /// and compares it with the part's `checksums.txt` (sizes *and* content, unlike ATTACH,
    /// which compares sizes only). Reads all of the table's data: meant for a shadow table
    /// that holds one load's parts.
    async fn check_parts(&self, database: &str, table: &str)
        -> Result<Vec<PartCheck>, ServerError>;

    /// `ALTER TABLE db.t DROP DETACHED PART '<name>'` with `allow_drop_detached = 1`.
    async fn drop_detached_part(
        &self,
        database: &str,
        table: &str,
        part: &str,
    ) -> Result<(), ServerError>;

    /// The table's `detached/` entries and active parts, in one query (one consistent-enough
    /// observation for the commit's decisions, at the cost of one round trip, not two).
    async fn table_state(&self, database: &str, table: &str) -> Result<Vec<StateRow>, ServerError>;

    /// The server's start time and the ATTACH queries running on `table` (by its name in the
    /// query text, so any database, any part and `ATTACH PARTITION` too: a false match only
    /// makes a caller wait). An ATTACH holds its claim on a detached part (`attaching_<name>`)
    /// only while its query runs, and a running query is in `system.processes`.
    async fn attach_activity(&self, table: &str) -> Result<AttachActivity, ServerError>;

    /// Definition, columns and pending mutations of several tables in at most three queries
    /// (not three per table): the columns query runs only for the tables that exist and whose
    /// `create_table_query` is not their `known_definition`. The result is in the order of
    /// `tables`.
    async fn check_tables(
        &self,
        tables: &[TableToCheck<'_>],
    ) -> Result<Vec<TableCheck>, ServerError>;

    /// `count()` of the table.
    async fn count(&self, database: &str, table: &str) -> Result<u64, ServerError>;
}

#[async_trait]
impl ClickHouseServer for Server {
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn execute(&self, sql: &str) -> Result<(), ServerError> {
        Server::execute(self, sql).await
    }

    async fn ledger_entries(
        &self,
        sql: &str,
        params: &[(&str, &str)],
    ) -> Result<Vec<LedgerRow>, ServerError> {
        self.fetch(sql, params).await
    }

    async fn version(&self) -> Result<String, ServerError> {
        let sql = "SELECT version()";
        self.run(sql, self.client.query_raw(sql).fetch_one::<String>())
            .await
    }

    async fn timezone(&self) -> Result<String, ServerError> {
        let sql = "SELECT timezone()";
        self.run(sql, self.client.query_raw(sql).fetch_one::<String>())
            .await
    }

    async fn now_unix_ms(&self) -> Result<i64, ServerError> {
        let sql = "SELECT toInt64(toUnixTimestamp64Milli(now64(3)))";
        self.run(sql, self.client.query_raw(sql).fetch_one::<i64>())
            .await
    }

    async fn current_user(&self) -> Result<String, ServerError> {
        let sql = "SELECT currentUser()";
        self.run(sql, self.client.query_raw(sql).fetch_one::<String>())
            .await
    }

    async fn has_grant(&self, privilege: &str, on: &str) -> Result<bool, ServerError> {
        // CHECK GRANT takes no FORMAT clause: the answer comes in the `default_format` the
        // request names (a bare `1` or `0`).
        let sql = format!("CHECK GRANT {privilege} ON {on}");
        let answer = self
            .run(&sql, async {
                self.client
                    .query_raw(&sql)
                    .fetch_bytes("TSV")?
                    .collect()
                    .await
            })
            .await?;
        match String::from_utf8_lossy(&answer).trim() {
            "1" => Ok(true),
            "0" => Ok(false),
            other => Err(ServerError::Protocol {
                endpoint: self.endpoint.clone(),
                detail: format!("CHECK GRANT answered {other:?}, not 1 or 0"),
                statement: short(&sql),
            }),
        }
    }

    async fn database_exists(&self, database: &str) -> Result<bool, ServerError> {
        let rows: Vec<u8> = self
            .fetch(
                "SELECT 1::UInt8 FROM system.databases WHERE name = {db:String}",
                &[("db", database)],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn database_engine(&self, database: &str) -> Result<Option<String>, ServerError> {
        let mut rows: Vec<String> = self
            .fetch(
                "SELECT engine FROM system.databases WHERE name = {db:String}",
                &[("db", database)],
            )
            .await?;
        Ok(rows.pop())
    }

    async fn table_names_by_uuid(
        &self,
        database: &str,
        uuids: &[String],
    ) -> Result<Vec<(String, String)>, ServerError> {
        if uuids.is_empty() {
            return Ok(Vec::new());
        }
        let list = uuids.join(",");
        self.fetch(
            "SELECT toString(uuid), name FROM system.tables WHERE database = {db:String} \
             AND has(splitByChar(',', {uuids:String}), toString(uuid)) ORDER BY name",
            &[("db", database), ("uuids", &list)],
        )
        .await
    }

    async fn table_info(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Option<TableInfo>, ServerError> {
        let sql =
            format!("{TABLE_INFO_SELECT_FIELDS} FROM system.tables WHERE database = {{db:String}} AND name = {{t:String}}");
        let mut rows: Vec<TableInfo> = self.fetch(&sql, &[("db", database), ("t", table)]).await?;
        Ok(rows.pop())
    }

    async fn table_definition(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Option<TableDefinition>, ServerError> {
        #[derive(Row, Deserialize)]
        struct DefinitionRow {
            database: String,
            name: String,
            uuid: String,
            engine: String,
            engine_full: String,
            create_table_query: String,
            partition_key: String,
            sorting_key: String,
            primary_key: String,
            sampling_key: String,
            storage_policy: String,
            data_paths: Vec<String>,
            views: Vec<String>,
            columns: Vec<(String, String, String, String)>,
            version: String,
            timezone: String,
        }
        // The columns come from an uncorrelated scalar subquery (run once), sorted by position
        // here rather than trusted to keep the inner ORDER BY through groupArray.
        let sql = format!(
            "{TABLE_INFO_SELECT_FIELDS}, \
             arraySort(arrayMap(d -> concat(d.1, '.', d.2), arrayZip(dependencies_database, dependencies_table))) AS views, \
             (SELECT arrayMap(c -> (c.2, c.3, c.4, c.5), arraySort(c -> c.1, \
                groupArray((position, name, type, default_kind, default_expression)))) \
              FROM system.columns WHERE database = {{db:String}} AND table = {{t:String}}) AS columns, \
             version() AS version, timezone() AS timezone \
             FROM system.tables WHERE database = {{db:String}} AND name = {{t:String}}"
        );
        let mut rows: Vec<DefinitionRow> =
            self.fetch(&sql, &[("db", database), ("t", table)]).await?;
        Ok(rows.pop().map(|r| TableDefinition {
            info: TableInfo {
                database: r.database,
                name: r.name,
                uuid: r.uuid,
                engine: r.engine,
                engine_full: r.engine_full,
                create_table_query: r.create_table_query,
                partition_key: r.partition_key,
                sorting_key: r.sorting_key,
                primary_key: r.primary_key,
                sampling_key: r.sampling_key,
                storage_policy: r.storage_policy,
                data_paths: r.data_paths,
            },
            columns: r
                .columns
                .into_iter()
                .map(
                    |(name, type_name, default_kind, default_expression)| ColumnInfo {
                        name,
                        type_name,
                        default_kind,
                        default_expression,
                    },
                )
                .collect(),
            views: r.views,
            version: r.version,
            timezone: r.timezone,
        }))
    }

    async fn cluster_replicas(&self, cluster: &str) -> Result<Vec<ClusterReplica>, ServerError> {
        let sql =
            "SELECT shard_num, shard_weight, replica_num, host_name, port FROM system.clusters \
                   WHERE cluster = {c:String} ORDER BY shard_num, replica_num";
        self.fetch(sql, &[("c", cluster)]).await
    }

    async fn cluster_http_ports(&self, cluster: &str) -> Result<Vec<ReplicaPorts>, ServerError> {
        let sql = format!(
            "SELECT shardNum() AS shard_num, toUInt16(tcpPort()) AS tcp_port, \
             toUInt16(getServerPort('http_port')) AS http_port \
             FROM clusterAllReplicas({}, system.one) \
             SETTINGS skip_unavailable_shards = 1, connect_timeout_with_failover_ms = 1000, \
             connections_with_failover_max_tries = 1",
            quote_str(cluster)
        );
        self.fetch(&sql, &[]).await
    }

    async fn type_of(
        &self,
        expression: &str,
        database: &str,
        table: &str,
    ) -> Result<String, ServerError> {
        let sql = format!(
            "SELECT toTypeName(any(k)) FROM (SELECT ({expression}) AS k FROM {} LIMIT 0)",
            quote_table(database, table)
        );
        self.run(&sql, self.client.query_raw(&sql).fetch_one::<String>())
            .await
    }

    async fn disks(&self) -> Result<Vec<DiskRow>, ServerError> {
        let sql = "SELECT name, path, type, toBool(is_remote) AS is_remote FROM system.disks ORDER BY name";
        self.fetch(sql, &[]).await
    }

    async fn policy_volumes(&self, policy: &str) -> Result<Vec<VolumeRow>, ServerError> {
        let sql = "SELECT volume_name, volume_priority, disks FROM system.storage_policies \
                   WHERE policy_name = {p:String} ORDER BY volume_priority";
        self.fetch(sql, &[("p", policy)]).await
    }

    async fn materialized_views(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Vec<String>, ServerError> {
        let sql = "SELECT concat(d.1, '.', d.2) FROM system.tables \
                   ARRAY JOIN arrayZip(dependencies_database, dependencies_table) AS d \
                   WHERE database = {db:String} AND name = {t:String} ORDER BY 1";
        self.fetch(sql, &[("db", database), ("t", table)]).await
    }

    async fn columns(&self, database: &str, table: &str) -> Result<Vec<ColumnInfo>, ServerError> {
        let sql = format!(
            "SELECT {COLUMN_FIELDS} FROM system.columns \
             WHERE database = {{db:String}} AND table = {{t:String}} ORDER BY position"
        );
        self.fetch(&sql, &[("db", database), ("t", table)]).await
    }

    async fn detached_parts(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Vec<DetachedPartInfo>, ServerError> {
        let sql = "SELECT name, partition_id, nullIf(reason, '') AS reason, disk, path, \
                   toUInt64(bytes_on_disk) AS bytes_on_disk, \
                   toUInt64(toUnixTimestamp(modification_time)) AS modified_unix \
                   FROM system.detached_parts WHERE database = {db:String} AND table = {t:String} ORDER BY name";
        self.fetch(sql, &[("db", database), ("t", table)]).await
    }

    async fn attach_part(
        &self,
        database: &str,
        table: &str,
        part: &str,
    ) -> Result<(), ServerError> {
        let sql = format!(
            "ALTER TABLE {} ATTACH PART {}",
            quote_table(database, table),
            quote_str(part)
        );
        self.execute(&sql).await
    }

    async fn check_parts(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Vec<PartCheck>, ServerError> {
        let sql = format!(
            "CHECK TABLE {} SETTINGS check_query_single_value_result = 0",
            quote_table(database, table)
        );
        self.fetch(&sql, &[]).await
    }

    async fn drop_detached_part(
        &self,
        database: &str,
        table: &str,
        part: &str,
    ) -> Result<(), ServerError> {
        let sql = format!(
            "ALTER TABLE {} DROP DETACHED PART {} SETTINGS allow_drop_detached = 1",
            quote_table(database, table),
            quote_str(part)
        );
        self.execute(&sql).await
    }

    async fn table_state(&self, database: &str, table: &str) -> Result<Vec<StateRow>, ServerError> {
        let sql = "SELECT true AS detached, name, ifNull(partition_id, '') AS partition_id, \
                   ifNull(reason, '') AS reason, toUInt64(0) AS rows, '' AS hash_of_all_files, \
                   toUInt64(toUnixTimestamp(modification_time)) AS modified_unix, \
                   toUInt64(0) AS level, toUInt64(0) AS max_block \
                   FROM system.detached_parts WHERE database = {db:String} AND table = {t:String} \
                   UNION ALL \
                   SELECT false, name, partition_id, '', toUInt64(rows), hash_of_all_files, toUInt64(0), \
                   toUInt64(level), toUInt64(max_block_number) \
                   FROM system.parts WHERE database = {db:String} AND table = {t:String} AND active";
        self.fetch(sql, &[("db", database), ("t", table)]).await
    }

    async fn attach_activity(&self, table: &str) -> Result<AttachActivity, ServerError> {
        let sql = "SELECT toUInt64(toUnixTimestamp(now()) - uptime()) AS started_unix, \
                   toUInt64(count()) AS attaching FROM system.processes \
                   WHERE query_id != queryID() AND query_kind = 'Alter' \
                   AND positionCaseInsensitive(query, 'ATTACH') > 0 AND position(query, {t:String}) > 0";
        let rows: Vec<AttachActivity> = self.fetch(sql, &[("t", table)]).await?;
        rows.into_iter()
            .next()
            .ok_or_else(|| ServerError::Protocol {
                endpoint: self.endpoint.clone(),
                detail: "an aggregate without GROUP BY returned no row".into(),
                statement: short(sql),
            })
    }

    async fn check_tables(
        &self,
        tables: &[TableToCheck<'_>],
    ) -> Result<Vec<TableCheck>, ServerError> {
        // `{d<i>:String}` / `{t<i>:String}` name table i of `tables`.
        let condition = |table_column: &str, which: &[usize]| {
            which
                .iter()
                .map(|i| {
                    format!("(database = {{d{i}:String}} AND {table_column} = {{t{i}:String}})")
                })
                .collect::<Vec<_>>()
                .join(" OR ")
        };
        let names: Vec<(String, String)> = (0..tables.len())
            .map(|i| (format!("d{i}"), format!("t{i}")))
            .collect();
        let params_of = |which: &[usize]| -> Vec<(&str, &str)> {
            which
                .iter()
                .flat_map(|&i| {
                    [
                        (names[i].0.as_str(), tables[i].database),
                        (names[i].1.as_str(), tables[i].table),
                    ]
                })
                .collect()
        };
        let all: Vec<usize> = (0..tables.len()).collect();
        // Each table's pending mutations come with its row: listed once for all of them by an
        // uncorrelated scalar subquery, then counted per row.
        let rows: Vec<(TableInfo, u64)> = self
            .fetch(
                &format!(
                    "{TABLE_INFO_SELECT_FIELDS}, \
                     toUInt64(arrayCount(m -> m.1 = database AND m.2 = name, \
                       (SELECT groupArray((database, table)) FROM system.mutations \
                        WHERE ({}) AND NOT is_done))) AS pending_mutations \
                     FROM system.tables WHERE {}",
                    condition("table", &all),
                    condition("name", &all)
                ),
                &params_of(&all),
            )
            .await?;
        let info_of = |t: &TableToCheck<'_>| {
            rows.iter()
                .find(|(i, _)| i.database == t.database && i.name == t.table)
        };
        // The tables whose columns are needed: those that exist with another definition than
        // the one the caller knows.
        let unknown: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&i| {
                info_of(&tables[i]).is_some_and(|(info, _)| {
                    tables[i].known_definition != Some(info.create_table_query.as_str())
                })
            })
            .collect();
        #[derive(Row, Deserialize)]
        struct TableColumn {
            database: String,
            table: String,
            name: String,
            #[serde(rename = "type")]
            type_name: String,
            default_kind: String,
            default_expression: String,
        }
        let columns: Vec<TableColumn> = if unknown.is_empty() {
            Vec::new()
        } else {
            self.fetch(
                &format!(
                    "SELECT database, table, {COLUMN_FIELDS} \
                     FROM system.columns WHERE {} ORDER BY database, table, position",
                    condition("table", &unknown)
                ),
                &params_of(&unknown),
            )
            .await?
        };
        Ok(all
            .iter()
            .map(|&i| {
                let t = &tables[i];
                let is = |d: &String, n: &String| d == t.database && n == t.table;
                TableCheck {
                    info: info_of(t).map(|(info, _)| info.clone()),
                    columns: unknown.contains(&i).then(|| {
                        columns
                            .iter()
                            .filter(|c| is(&c.database, &c.table))
                            .map(|c| ColumnInfo {
                                name: c.name.clone(),
                                type_name: c.type_name.clone(),
                                default_kind: c.default_kind.clone(),
                                default_expression: c.default_expression.clone(),
                            })
                            .collect()
                    }),
                    pending_mutations: info_of(t).map_or(0, |(_, pending)| *pending),
                }
            })
            .collect())
    }

    async fn count(&self, database: &str, table: &str) -> Result<u64, ServerError> {
        let sql = format!("SELECT count() FROM {}", quote_table(database, table));
        self.run(&sql, self.client.query_raw(&sql).fetch_one::<u64>())
            .await
    }
}

/// A statement shortened for error messages (first line, at most 200 characters).
pub(crate) fn short(sql: &str) -> String {
    let line = sql.trim().lines().next().unwrap_or("");
    if line.chars().count() > 200 {
        format!("{}...", line.chars().take(200).collect::<String>())
    } else {
        line.to_owned()
    }
}
