//! The ledger's storage: a MergeTree table in ClickHouse, written with fsync and read back in
//! full for one load at a time.

use std::time::{SystemTime, UNIX_EPOCH};

use chpart_core::LoadId;
use chpart_server::{quote_ident, quote_str, ClickHouseServer, ServerError, SharedServer};

use crate::ledger::{
    kind, replay, Decision, DecisionBody, Entry, LedgerError, LoadView, DECISION_ENTRY,
    LEDGER_TABLE,
};

/// Inserts into the ledger the server remembers for deduplication. Two decisions of one load
/// race within seconds; this many other ledger INSERTs in between is far beyond that.
pub const DEDUPLICATION_WINDOW: u64 = 10_000;

/// The ledger of one ClickHouse server, in `database`.
#[derive(Debug, Clone)]
pub struct Ledger {
    server: SharedServer,
    database: String,
    writer: String,
}

/// A failure reading or writing the ledger.
#[derive(Debug, thiserror::Error)]
pub enum LedgerStoreError {
    /// The server failed.
    #[error("ledger {database}.{LEDGER_TABLE}: {source}")]
    Server {
        /// The ledger database.
        database: String,
        /// The server's error.
        #[source]
        source: Box<ServerError>,
    },
    /// The entries cannot be interpreted.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl LedgerStoreError {
    /// The server error, if that is what failed (for retry classification).
    pub fn server_error(&self) -> Option<&ServerError> {
        match self {
            LedgerStoreError::Server { source, .. } => Some(source.as_ref()),
            LedgerStoreError::Ledger(_) => None,
        }
    }
}

/// Milliseconds since the Unix epoch, on this machine's clock.
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Ledger {
    /// The ledger in `database` of `server`. Nothing is sent until used.
    pub fn new(server: SharedServer, database: &str) -> Ledger {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        Ledger {
            server,
            database: database.to_owned(),
            writer: format!("{}:{}", host.trim(), std::process::id()),
        }
    }

    fn table(&self) -> String {
        format!(
            "{}.{}",
            quote_ident(&self.database),
            quote_ident(LEDGER_TABLE)
        )
    }

    fn err(&self, source: ServerError) -> LedgerStoreError {
        LedgerStoreError::Server {
            database: self.database.clone(),
            source: Box::new(source),
        }
    }

    /// Creates the database and table if they do not exist. Idempotent.
    pub async fn ensure(&self) -> Result<(), LedgerStoreError> {
        let db = quote_ident(&self.database);
        self.server
            .execute_idempotent(&format!("CREATE DATABASE IF NOT EXISTS {db}"))
            .await
            .map_err(|e| self.err(e))?;
        // fsync so that an acknowledged entry survives a server crash: fencing and resume rely on it.
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {} (\
               load_id String, entry_id String, kind LowCardinality(String), \
               written_at DateTime64(3, 'UTC') DEFAULT now64(3), writer String, body String CODEC(ZSTD(3))\
             ) ENGINE = MergeTree ORDER BY (load_id, written_at, entry_id) \
             SETTINGS fsync_after_insert = 1, fsync_part_directory = 1, \
             non_replicated_deduplication_window = {DEDUPLICATION_WINDOW}",
            self.table()
        );
        self.server
            .execute_idempotent(&ddl)
            .await
            .map_err(|e| self.err(e))?;
        // A ledger made before decisions existed: add the deduplication they rely on.
        let (db, table) = (self.database.as_str(), crate::ledger::LEDGER_TABLE);
        let info = self
            .server
            .table_info(db, table)
            .await
            .map_err(|e| self.err(e))?;
        if info.is_some_and(|i| {
            !i.engine_full
                .contains("non_replicated_deduplication_window")
        }) {
            self.server
                .execute_idempotent(&format!(
                    "ALTER TABLE {} MODIFY SETTING non_replicated_deduplication_window = {DEDUPLICATION_WINDOW}",
                    self.table()
                ))
                .await
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Tries to settle how `load` ends: [`Ledger::append_once`] of the decision entry, which
    /// every commit and abort of the load writes. Read the view afterwards to learn which
    /// decision the server kept. Idempotent.
    pub async fn decide(&self, load: &LoadId, decision: Decision) -> Result<(), LedgerStoreError> {
        let body = serde_json::to_string(&DecisionBody { decision }).expect("serializes");
        self.append_once(load, DECISION_ENTRY, kind::DECIDED, &body)
            .await
    }

    /// Writes a fact of which a load has exactly one (its spec, its plan, its decision), with
    /// a deduplication token of the load and `entry_id`: racing writers of *different* bodies
    /// send the same token, so the server keeps only the first to reach the table (within the
    /// last [`DEDUPLICATION_WINDOW`] inserts) and acknowledges the others without storing
    /// them. Write times cannot order such a race (an INSERT's `now64()` is taken when it
    /// starts, not when it becomes visible), so every writer reads the view back afterwards
    /// to learn whose body counts. Idempotent.
    pub async fn append_once(
        &self,
        load: &LoadId,
        entry_id: &str,
        kind: &str,
        body: &str,
    ) -> Result<(), LedgerStoreError> {
        let settings = format!(
            "SETTINGS insert_deduplicate = 1, insert_deduplication_token = {}",
            quote_str(&format!("chpart-{entry_id}:{}", load.as_str()))
        );
        self.insert(
            load,
            &[(entry_id.to_owned(), kind, body.to_owned())],
            &settings,
        )
        .await
    }

    /// Appends one entry (idempotent by `entry_id`: replay keeps the first).
    pub async fn append(
        &self,
        load: &LoadId,
        entry_id: &str,
        kind: &str,
        body: &str,
    ) -> Result<(), LedgerStoreError> {
        self.append_many(load, &[(entry_id.to_owned(), kind, body.to_owned())])
            .await
    }

    /// Appends entries `(entry_id, kind, body)` in one INSERT: all of them or none become
    /// durable together. The values travel as SQL literals in the request body (not as query
    /// parameters, which HTTP limits to 128 KiB each), so a plan of any size fits.
    pub async fn append_many(
        &self,
        load: &LoadId,
        entries: &[(String, &str, String)],
    ) -> Result<(), LedgerStoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        self.insert(load, entries, "").await
    }

    /// One INSERT of `entries`, with `settings` (a `SETTINGS ...` clause, or empty). Safe to
    /// send again: an entry written twice counts once (replay keeps an entry id's first, and
    /// a decision carries a deduplication token), so a retrying server may resend it.
    async fn insert(
        &self,
        load: &LoadId,
        entries: &[(String, &str, String)],
        settings: &str,
    ) -> Result<(), LedgerStoreError> {
        let rows: Vec<String> = entries
            .iter()
            .map(|(id, kind, body)| {
                format!(
                    "({}, {}, {}, {}, {})",
                    quote_str(load.as_str()),
                    quote_str(id),
                    quote_str(kind),
                    quote_str(&self.writer),
                    quote_str(body)
                )
            })
            .collect();
        let sql = format!(
            "INSERT INTO {} (load_id, entry_id, kind, writer, body) {settings} VALUES {}",
            self.table(),
            rows.join(", ")
        );
        self.server
            .execute_idempotent(&sql)
            .await
            .map_err(|e| self.err(e))
    }

    /// Every entry of `load`, raw.
    pub async fn entries(&self, load: &LoadId) -> Result<Vec<Entry>, LedgerStoreError> {
        let sql = format!(
            "SELECT load_id, entry_id, toString(kind) AS kind, toInt64(toUnixTimestamp64Milli(written_at)) AS written_at_ms, \
             writer, body FROM {} WHERE load_id = {{l:String}} ORDER BY written_at, entry_id",
            self.table()
        );
        let rows = self
            .server
            .ledger_entries(&sql, &[("l", load.as_str())])
            .await
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// The load's state by replay. A missing ledger table means no load was ever begun.
    pub async fn view(
        &self,
        load: &LoadId,
        known_kinds: &[&str],
    ) -> Result<LoadView, LedgerStoreError> {
        let entries = match self.entries(load).await {
            Ok(entries) => entries,
            Err(LedgerStoreError::Server { source, .. })
                if matches!(source.code(), Some(60) | Some(81)) =>
            {
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        Ok(replay(entries, known_kinds)?)
    }

    /// The ledger's server.
    pub fn server(&self) -> &dyn ClickHouseServer {
        self.server.as_ref()
    }

    /// The ledger's server, to hold on to.
    pub fn shared_server(&self) -> SharedServer {
        self.server.clone()
    }

    /// The ledger database.
    pub fn database(&self) -> &str {
        &self.database
    }
}

impl Ledger {
    /// Every entry of every load, grouped by load (for `status` and `gc`). A missing ledger
    /// table means no load was ever begun.
    pub async fn all_entries(
        &self,
    ) -> Result<std::collections::BTreeMap<String, Vec<Entry>>, LedgerStoreError> {
        let sql = format!(
            "SELECT load_id, entry_id, toString(kind) AS kind, toInt64(toUnixTimestamp64Milli(written_at)) AS written_at_ms, \
             writer, body FROM {} ORDER BY load_id, written_at, entry_id",
            self.table()
        );
        let rows = match self.server.ledger_entries(&sql, &[]).await {
            Ok(rows) => rows,
            Err(e) if matches!(e.code(), Some(60) | Some(81)) => Vec::new(),
            Err(e) => return Err(self.err(e)),
        };
        let mut out: std::collections::BTreeMap<String, Vec<Entry>> =
            std::collections::BTreeMap::new();
        for r in rows {
            out.entry(r.load_id.clone()).or_default().push(r);
        }
        Ok(out)
    }
}
