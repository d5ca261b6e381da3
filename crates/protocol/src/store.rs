//! The ledger's storage: a MergeTree table in ClickHouse, written with fsync and read back in
//! full for one load at a time.
//!
//! The table is ordered by `(load_id, written_at, entry_id)`, so every read of one load (or of
//! a list of loads) is a range of the primary index: what `begin`, `build`'s fences, `commit`,
//! `abort` and `status --load` read costs the same in a ledger of a hundred loads and in one of
//! years of hourly loads. The reads across loads are few and bounded too: gc and the replace
//! checks read the loads its newest checkpoint left pending plus those written since
//! ([`Ledger::unsettled_loads`], over a projection ordered by `written_at`), and `status` of
//! every load reads the summaries gc recorded instead of every entry.

use std::time::{SystemTime, UNIX_EPOCH};

use chpart_core::LoadId;
use chpart_server::{code, quote_ident, quote_str, ClickHouseServer, ServerError, SharedServer};

use std::collections::{BTreeMap, BTreeSet};

use crate::ledger::{
    kind, replay, Decision, DecisionBody, Entry, GcCheckpoint, LedgerError, LoadView,
    DECISION_ENTRY, GC_RECORDS, LEDGER_TABLE,
};

/// Inserts into the ledger the server remembers for deduplication. Two decisions of one load
/// race within seconds; this many other ledger INSERTs in between is far beyond that.
pub const DEDUPLICATION_WINDOW: u64 = 10_000;

/// The ledger's projection ordered by write time: which loads have entries written since a
/// moment is then a range of its index, not a scan of the table.
pub const BY_WRITTEN_AT: &str = "by_written_at";

/// Loads per statement of the reads, writes and deletes that name loads: well under
/// ClickHouse's 256 KiB `max_query_size` at 128 bytes per id.
pub const LOADS_PER_STATEMENT: usize = 1000;

/// The ledger's columns as [`chpart_server::ClickHouseServer::ledger_entries`] reads them.
const COLUMNS: &str = "load_id, entry_id, toString(kind) AS kind, \
     toInt64(toUnixTimestamp64Milli(written_at)) AS written_at_ms, writer, body";

/// Which bodies [`Ledger::entries_of`] reads.
#[derive(Debug, Clone, Copy)]
pub enum Bodies<'a> {
    /// Every entry's.
    All,
    /// Those of entries of these kinds only.
    OfKinds(&'a [&'a str]),
}

/// The loads a gc run (or a check across loads) has to read: every load that is not yet
/// recorded done by gc, and perhaps some that are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsettled {
    /// The loads, by id.
    pub loads: BTreeSet<String>,
    /// From the newest gc checkpoint and the loads written since; `false`: no gc has recorded
    /// one yet, and the whole ledger was read (load ids and kinds only).
    pub from_checkpoint: bool,
}

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

/// `load_id IN ('a', 'b')` of `loads`, quoted.
fn in_list(loads: &[String]) -> String {
    let quoted: Vec<String> = loads.iter().map(|l| quote_str(l)).collect();
    format!("load_id IN ({})", quoted.join(", "))
}

/// `kind IN ('a', 'b')` of `kinds`, quoted.
fn kinds_list(kinds: &[&str]) -> String {
    let quoted: Vec<String> = kinds.iter().map(|k| quote_str(k)).collect();
    format!("kind IN ({})", quoted.join(", "))
}

/// Milliseconds since the Unix epoch, on this machine's clock (shifted by
/// [`crate::hooks::clock_skew_ms`] in tests). Only for what this machine records about itself
/// (a manifest's phase times, ids): an age compared with a time the ledger recorded is
/// measured on the server's clock ([`Ledger::server_now_ms`]), since drivers and executors
/// may be minutes off it.
pub fn now_unix_ms() -> u64 {
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    real.saturating_add_signed(crate::hooks::clock_skew_ms())
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

    /// The ledger server's clock, in ms since the Unix epoch: the clock of every `written_at`
    /// and of a spec's `opened_at_unix_ms`, so the one every age the protocol decides on is
    /// measured with (`gc --older-than`, `ledger prune --finished-before`).
    pub async fn server_now_ms(&self) -> Result<u64, LedgerStoreError> {
        let ms = self.server.now_unix_ms().await.map_err(|e| self.err(e))?;
        Ok(u64::try_from(ms).unwrap_or(0))
    }

    /// Creates the database and table if they do not exist, and brings a ledger made by an
    /// older chpart up to date. Idempotent. The table is looked at first, so that a current
    /// ledger costs one statement (every `begin` calls this), not three.
    pub async fn ensure(&self) -> Result<(), LedgerStoreError> {
        let (db, table) = (self.database.as_str(), crate::ledger::LEDGER_TABLE);
        let mut info = self
            .server
            .table_info(db, table)
            .await
            .map_err(|e| self.err(e))?;
        if info.is_none() {
            self.create().await?;
            // Made now, or by a racing older chpart: looked at as any other.
            info = self
                .server
                .table_info(db, table)
                .await
                .map_err(|e| self.err(e))?;
        }
        // A ledger made before decisions existed: add the deduplication they rely on.
        if info.as_ref().is_some_and(|i| {
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
        // A ledger made before the projection: add it, and build it for the parts already
        // there in the background (a mutation; until it is done those parts are read whole,
        // which costs time, never correctness).
        if info
            .as_ref()
            .is_some_and(|i| !i.create_table_query.contains(BY_WRITTEN_AT))
        {
            self.server
                .execute_idempotent(&format!(
                    "ALTER TABLE {} ADD PROJECTION IF NOT EXISTS {BY_WRITTEN_AT} \
                     (SELECT load_id, written_at, kind ORDER BY written_at)",
                    self.table()
                ))
                .await
                .map_err(|e| self.err(e))?;
            self.server
                .execute_idempotent(&format!(
                    "ALTER TABLE {} MATERIALIZE PROJECTION {BY_WRITTEN_AT}",
                    self.table()
                ))
                .await
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// `CREATE ... IF NOT EXISTS` of the database and the table, as this chpart makes them.
    async fn create(&self) -> Result<(), LedgerStoreError> {
        let db = quote_ident(&self.database);
        self.server
            .execute_idempotent(&format!("CREATE DATABASE IF NOT EXISTS {db}"))
            .await
            .map_err(|e| self.err(e))?;
        // fsync so that an acknowledged entry survives a server crash: fencing and resume rely on it.
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {} (\
               load_id String, entry_id String, kind LowCardinality(String), \
               written_at DateTime64(3, 'UTC') DEFAULT now64(3), writer String, body String CODEC(ZSTD(3)), \
               PROJECTION {BY_WRITTEN_AT} (SELECT load_id, written_at, kind ORDER BY written_at)\
             ) ENGINE = MergeTree ORDER BY (load_id, written_at, entry_id) \
             SETTINGS fsync_after_insert = 1, fsync_part_directory = 1, \
             non_replicated_deduplication_window = {DEDUPLICATION_WINDOW}",
            self.table()
        );
        self.server
            .execute_idempotent(&ddl)
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Tries to settle how `load` ends: [`Ledger::append_once`] of the decision entry, which
    /// every commit and abort of the load writes. Read the view afterwards to learn which
    /// decision the server kept. Idempotent.
    pub async fn decide(&self, load: &LoadId, decision: Decision) -> Result<(), LedgerStoreError> {
        let body = DecisionBody::json(decision);
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
        self.append_once_with(
            load,
            entry_id,
            &[(entry_id.to_owned(), kind, body.to_owned())],
        )
        .await
    }

    /// [`Ledger::append_once`] of the fact `entry_id` (one of `entries`) with other entries
    /// riding in the same INSERT: the server keeps the whole block or, when another writer's
    /// block with the same token came first, none of it. A writer whose block was dropped
    /// learns it from the view it reads back, and writes the riders it still needs on their
    /// own. Idempotent.
    pub async fn append_once_with(
        &self,
        load: &LoadId,
        entry_id: &str,
        entries: &[(String, &str, String)],
    ) -> Result<(), LedgerStoreError> {
        let settings = format!(
            "SETTINGS insert_deduplicate = 1, insert_deduplication_token = {}",
            quote_str(&format!("chpart-{entry_id}:{}", load.as_str()))
        );
        self.insert(load, entries, &settings).await
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
        let rows: Vec<(&str, &str, &str, &str)> = entries
            .iter()
            .map(|(id, kind, body)| (load.as_str(), id.as_str(), *kind, body.as_str()))
            .collect();
        self.insert_rows(&rows, settings).await
    }

    /// One INSERT of `(load_id, entry_id, kind, body)` rows, loads of their own.
    async fn insert_rows(
        &self,
        entries: &[(&str, &str, &str, &str)],
        settings: &str,
    ) -> Result<(), LedgerStoreError> {
        let rows: Vec<String> = entries
            .iter()
            .map(|(load, id, kind, body)| {
                format!(
                    "({}, {}, {}, {}, {})",
                    quote_str(load),
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
            "SELECT {COLUMNS} FROM {} WHERE load_id = {{l:String}} ORDER BY written_at, entry_id",
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
                if matches!(
                    source.code(),
                    Some(code::UNKNOWN_TABLE | code::UNKNOWN_DATABASE)
                ) =>
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
    /// Rows of `sql` (a query selecting the ledger's columns); a missing ledger table means no
    /// load was ever begun, so no rows.
    async fn rows(
        &self,
        sql: &str,
        params: &[(&str, &str)],
    ) -> Result<Vec<Entry>, LedgerStoreError> {
        match self.server.ledger_entries(sql, params).await {
            Ok(rows) => Ok(rows),
            Err(e) if matches!(e.code(), Some(code::UNKNOWN_TABLE | code::UNKNOWN_DATABASE)) => {
                Ok(Vec::new())
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// The entries of each of `loads` (index ranges), grouped by load, with the bodies
    /// `bodies` asks for (the others empty: what is only counted is not read).
    pub async fn entries_of(
        &self,
        loads: &[String],
        bodies: Bodies<'_>,
    ) -> Result<BTreeMap<String, Vec<Entry>>, LedgerStoreError> {
        let mut out: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
        let columns = match bodies {
            Bodies::All => COLUMNS.to_owned(),
            Bodies::OfKinds(kinds) => COLUMNS.replace(
                ", body",
                &format!(", if({}, body, '') AS body", kinds_list(kinds)),
            ),
        };
        for batch in loads.chunks(LOADS_PER_STATEMENT) {
            let sql = format!(
                "SELECT {columns} FROM {} WHERE {} ORDER BY load_id, written_at, entry_id",
                self.table(),
                in_list(batch)
            );
            for e in self.rows(&sql, &[]).await? {
                out.entry(e.load_id.clone()).or_default().push(e);
            }
        }
        Ok(out)
    }

    /// The views of `loads`, read in a few statements (index ranges); loads without entries
    /// are absent.
    pub async fn views(
        &self,
        loads: &[String],
    ) -> Result<BTreeMap<String, LoadView>, LedgerStoreError> {
        let mut out = BTreeMap::new();
        for (load, entries) in self.entries_of(loads, Bodies::All).await? {
            out.insert(load, replay(entries, crate::KNOWN_KINDS)?);
        }
        Ok(out)
    }

    /// The loads to look at across the ledger (gc, and the checks of other open replace
    /// loads): those the newest gc checkpoint left pending and those with an entry written
    /// since it looked ([`GcCheckpoint::covers_before`]), read over the `written_at`
    /// projection; a `gc_done` entry does not count (it makes nothing to do). Every load not
    /// recorded done by gc is among them, so every open load is.
    /// Without a checkpoint, every load without a `gc_done` entry (a scan of two narrow
    /// columns, once: the first gc run records a checkpoint).
    pub async fn unsettled_loads(&self) -> Result<Unsettled, LedgerStoreError> {
        // Selected as ledger rows (the blanks named like columns only outside the subquery, so
        // that `kind` in its WHERE is the column).
        let loads_of = |inner: String| {
            format!(
                "SELECT load_id, '' AS entry_id, '' AS kind, toInt64(toUnixTimestamp64Milli(last)) AS written_at_ms, \
                 '' AS writer, '' AS body FROM ({inner})"
            )
        };
        let Some((written_at, checkpoint)) = self.latest_gc_checkpoint().await? else {
            let sql = loads_of(format!(
                "SELECT load_id, max(written_at) AS last FROM {} WHERE NOT startsWith(load_id, '.') \
                 GROUP BY load_id HAVING countIf(kind = {}) = 0",
                self.table(),
                quote_str(kind::GC_DONE)
            ));
            return Ok(Unsettled {
                loads: self
                    .rows(&sql, &[])
                    .await?
                    .into_iter()
                    .map(|e| e.load_id)
                    .collect(),
                from_checkpoint: false,
            });
        };
        let from = checkpoint.covers_before(written_at).to_string();
        let sql = loads_of(format!(
            "SELECT load_id, max(written_at) AS last FROM {} \
             WHERE written_at >= fromUnixTimestamp64Milli({{from:Int64}}, 'UTC') AND kind != {{done:String}} \
             AND NOT startsWith(load_id, '.') GROUP BY load_id",
            self.table()
        ));
        let mut loads: BTreeSet<String> = checkpoint.pending.into_iter().collect();
        loads.extend(
            self.rows(&sql, &[("from", from.as_str()), ("done", kind::GC_DONE)])
                .await?
                .into_iter()
                .map(|e| e.load_id),
        );
        Ok(Unsettled {
            loads,
            from_checkpoint: true,
        })
    }

    /// The newest gc checkpoint and when it was written (server clock, ms), if any: the last
    /// rows of one index range.
    pub async fn latest_gc_checkpoint(
        &self,
    ) -> Result<Option<(i64, GcCheckpoint)>, LedgerStoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM {} WHERE load_id = {{l:String}} AND kind = {{k:String}} \
             ORDER BY written_at DESC, entry_id DESC LIMIT 1",
            self.table()
        );
        let rows = self
            .rows(&sql, &[("l", GC_RECORDS), ("k", kind::GC_CHECKPOINT)])
            .await?;
        rows.into_iter()
            .next()
            .map(|e| Ok((e.written_at_ms, crate::ledger::body_of::<GcCheckpoint>(&e)?)))
            .transpose()
    }

    /// What one gc run finished, in one INSERT: a `gc_done` entry per load (`(load, summary)`)
    /// and, when given, the run's checkpoint. Written after the removals they record, so a
    /// crash before leaves the next run to do the same again (gc is idempotent).
    pub async fn record_gc(
        &self,
        done: &[(String, String)],
        checkpoint: Option<&GcCheckpoint>,
    ) -> Result<(), LedgerStoreError> {
        let checkpoint = checkpoint.map(|c| {
            (
                format!("checkpoint:{}:{}", now_unix_ms(), self.writer),
                serde_json::to_string(c).expect("a checkpoint serializes"),
            )
        });
        let mut rows: Vec<(&str, &str, &str, &str)> = done
            .iter()
            .map(|(load, body)| {
                (
                    load.as_str(),
                    crate::ledger::entry::GC_DONE,
                    kind::GC_DONE,
                    body.as_str(),
                )
            })
            .collect();
        if let Some((id, body)) = &checkpoint {
            rows.push((GC_RECORDS, id.as_str(), kind::GC_CHECKPOINT, body.as_str()));
        }
        if rows.is_empty() {
            return Ok(());
        }
        self.insert_rows(&rows, "").await
    }

    /// Every `gc_done` entry (of loads gc finished): the summaries `status` shows for them, and
    /// what `ledger prune` may prune. A scan of the `kind` column; bodies are read for matching
    /// rows only.
    pub async fn gc_done_entries(&self) -> Result<Vec<Entry>, LedgerStoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM {} WHERE kind = {{k:String}} AND NOT startsWith(load_id, '.') \
             ORDER BY load_id, written_at, entry_id",
            self.table()
        );
        self.rows(&sql, &[("k", kind::GC_DONE)]).await
    }

    /// Deletes every entry of `loads` except those of `keep` kinds (`ALTER TABLE ... DELETE`,
    /// waited for). Safe to send again: it deletes the same rows or none.
    pub async fn delete_entries(
        &self,
        loads: &[String],
        keep: &[&str],
    ) -> Result<(), LedgerStoreError> {
        for batch in loads.chunks(LOADS_PER_STATEMENT) {
            let sql = format!(
                "ALTER TABLE {} DELETE WHERE {} AND NOT ({}) SETTINGS mutations_sync = 1",
                self.table(),
                in_list(batch),
                kinds_list(keep)
            );
            self.server
                .execute_idempotent(&sql)
                .await
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Deletes gc checkpoints written before `before_ms` (server clock), except the newest
    /// checkpoint, which later gc runs start from (with `dry_run`, only counts them). Returns
    /// how many there were.
    pub async fn delete_gc_checkpoints(
        &self,
        before_ms: i64,
        dry_run: bool,
    ) -> Result<usize, LedgerStoreError> {
        let Some((newest, _)) = self.latest_gc_checkpoint().await? else {
            return Ok(0);
        };
        let cut = before_ms.min(newest);
        let sql = format!(
            "SELECT load_id, entry_id, toString(kind) AS kind, \
             toInt64(toUnixTimestamp64Milli(written_at)) AS written_at_ms, writer, '' AS body \
             FROM {} WHERE load_id = {{l:String}} AND written_at < fromUnixTimestamp64Milli({{c:Int64}}, 'UTC')",
            self.table()
        );
        let cut_text = cut.to_string();
        let old = self
            .rows(&sql, &[("l", GC_RECORDS), ("c", cut_text.as_str())])
            .await?;
        if !old.is_empty() && !dry_run {
            self.server
                .execute_idempotent(&format!(
                    "ALTER TABLE {} DELETE WHERE load_id = {} AND written_at < fromUnixTimestamp64Milli(toInt64({cut}), 'UTC') \
                     SETTINGS mutations_sync = 1",
                    self.table(),
                    quote_str(GC_RECORDS)
                ))
                .await
                .map_err(|e| self.err(e))?;
        }
        Ok(old.len())
    }
}
