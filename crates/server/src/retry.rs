//! [`Retrying`]: a server whose reads, and whose changes that are safe to send again, are
//! retried after a transient fault (no answer, connection refused or reset, a retryable
//! `Code: N`) with exponential backoff and full jitter until a deadline. Changes that are not
//! safe to repeat (`execute`, `ATTACH PART`, `DROP DETACHED PART`) are sent once: after an
//! unclear outcome the protocol reads the server back and reconciles, it never resends.

use std::fmt;
use std::future::Future;
use std::time::Instant;

use async_trait::async_trait;
use chpart_core::events;
use chpart_core::retry::{clock_seed, RetryPolicy};

use crate::{
    AttachActivity, ClickHouseServer, ClusterReplica, ColumnInfo, DetachedPartInfo, DiskRow,
    ErrorClass, LedgerRow, PartCheck, ReplicaPorts, ServerError, SharedServer, StateRow,
    TableCheck, TableInfo, TableToCheck, VolumeRow,
};

/// A server with retries of what may be repeated.
pub struct Retrying {
    inner: SharedServer,
    policy: RetryPolicy,
}

impl fmt::Debug for Retrying {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retrying")
            .field("inner", &self.inner)
            .field("deadline", &self.policy.deadline)
            .finish()
    }
}

impl Retrying {
    /// `inner`, retried within `policy`.
    pub fn new(inner: SharedServer, policy: RetryPolicy) -> Retrying {
        Retrying { inner, policy }
    }

    /// Runs `call` until it succeeds, fails for good, or the deadline passes; every retry is
    /// logged with its cause and number. The error after the last try says how many there were.
    async fn again<T, F, Fut>(&self, what: &str, mut call: F) -> Result<T, ServerError>
    where
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = Result<T, ServerError>> + Send,
    {
        let started = Instant::now();
        let mut backoff = self.policy.backoff(clock_seed());
        loop {
            let error = match call().await {
                Ok(value) => return Ok(value),
                Err(e) if e.class(true) == ErrorClass::Transient => e,
                Err(e) => return Err(e),
            };
            let Some(delay) = backoff.next_delay(started.elapsed()) else {
                return Err(if backoff.retries() == 0 {
                    error
                } else {
                    error.noted(&format!(
                        "gave up after {} tries in {:.1} s",
                        backoff.retries() + 1,
                        started.elapsed().as_secs_f64()
                    ))
                });
            };
            tracing::warn!(
                "{what} on {}: retry {} in {:.2} s after a transient fault: {error}",
                self.inner.endpoint(),
                backoff.retries(),
                delay.as_secs_f64()
            );
            tracing::info!(
                target: events::TARGET,
                step = "retry",
                outcome = events::RETRYING,
                retry = backoff.retries(),
                duration_ms = delay.as_secs_f64() * 1e3,
                error = format!("{what} on {}: {error}", self.inner.endpoint()),
            );
            tokio::time::sleep(delay).await;
        }
    }
}

#[async_trait]
impl ClickHouseServer for Retrying {
    fn endpoint(&self) -> &str {
        self.inner.endpoint()
    }

    async fn execute(&self, sql: &str) -> Result<(), ServerError> {
        self.inner.execute(sql).await
    }

    async fn execute_idempotent(&self, sql: &str) -> Result<(), ServerError> {
        self.again("statement", || self.inner.execute_idempotent(sql))
            .await
    }

    async fn ledger_entries(
        &self,
        sql: &str,
        params: &[(&str, &str)],
    ) -> Result<Vec<LedgerRow>, ServerError> {
        self.again("ledger read", || self.inner.ledger_entries(sql, params))
            .await
    }

    async fn version(&self) -> Result<String, ServerError> {
        self.again("version", || self.inner.version()).await
    }

    async fn timezone(&self) -> Result<String, ServerError> {
        self.again("timezone", || self.inner.timezone()).await
    }

    async fn database_exists(&self, database: &str) -> Result<bool, ServerError> {
        self.again("database_exists", || self.inner.database_exists(database))
            .await
    }

    async fn database_engine(&self, database: &str) -> Result<Option<String>, ServerError> {
        self.again("database_engine", || self.inner.database_engine(database))
            .await
    }

    async fn table_names_by_uuid(
        &self,
        database: &str,
        uuids: &[String],
    ) -> Result<Vec<(String, String)>, ServerError> {
        self.again("table_names_by_uuid", || {
            self.inner.table_names_by_uuid(database, uuids)
        })
        .await
    }

    async fn table_info(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Option<TableInfo>, ServerError> {
        self.again("table_info", || self.inner.table_info(database, table))
            .await
    }

    async fn cluster_replicas(&self, cluster: &str) -> Result<Vec<ClusterReplica>, ServerError> {
        self.again("cluster_replicas", || self.inner.cluster_replicas(cluster))
            .await
    }

    async fn cluster_http_ports(&self, cluster: &str) -> Result<Vec<ReplicaPorts>, ServerError> {
        self.again("cluster_http_ports", || {
            self.inner.cluster_http_ports(cluster)
        })
        .await
    }

    async fn type_of(
        &self,
        expression: &str,
        database: &str,
        table: &str,
    ) -> Result<String, ServerError> {
        self.again("type_of", || {
            self.inner.type_of(expression, database, table)
        })
        .await
    }

    async fn disks(&self) -> Result<Vec<DiskRow>, ServerError> {
        self.again("disks", || self.inner.disks()).await
    }

    async fn policy_volumes(&self, policy: &str) -> Result<Vec<VolumeRow>, ServerError> {
        self.again("policy_volumes", || self.inner.policy_volumes(policy))
            .await
    }

    async fn materialized_views(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Vec<String>, ServerError> {
        self.again("materialized_views", || {
            self.inner.materialized_views(database, table)
        })
        .await
    }

    async fn columns(&self, database: &str, table: &str) -> Result<Vec<ColumnInfo>, ServerError> {
        self.again("columns", || self.inner.columns(database, table))
            .await
    }

    async fn detached_parts(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Vec<DetachedPartInfo>, ServerError> {
        self.again("detached_parts", || {
            self.inner.detached_parts(database, table)
        })
        .await
    }

    async fn attach_part(
        &self,
        database: &str,
        table: &str,
        part: &str,
    ) -> Result<(), ServerError> {
        self.inner.attach_part(database, table, part).await
    }

    async fn check_parts(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Vec<PartCheck>, ServerError> {
        self.again("check_parts", || self.inner.check_parts(database, table))
            .await
    }

    async fn drop_detached_part(
        &self,
        database: &str,
        table: &str,
        part: &str,
    ) -> Result<(), ServerError> {
        self.inner.drop_detached_part(database, table, part).await
    }

    async fn table_state(&self, database: &str, table: &str) -> Result<Vec<StateRow>, ServerError> {
        self.again("table_state", || self.inner.table_state(database, table))
            .await
    }

    async fn attach_activity(&self, table: &str) -> Result<AttachActivity, ServerError> {
        self.again("attach_activity", || self.inner.attach_activity(table))
            .await
    }

    async fn check_tables(
        &self,
        tables: &[TableToCheck<'_>],
    ) -> Result<Vec<TableCheck>, ServerError> {
        self.again("check_tables", || self.inner.check_tables(tables))
            .await
    }

    async fn count(&self, database: &str, table: &str) -> Result<u64, ServerError> {
        self.again("count", || self.inner.count(database, table))
            .await
    }
}
