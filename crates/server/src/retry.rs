//! [`Retrying`]: a server whose reads, and whose changes that are safe to send again, are
//! retried after a transient fault (no answer, connection refused or reset, a retryable
//! `Code: N`) with exponential backoff and full jitter until a deadline. Changes that are not
//! safe to repeat (`execute`, `ATTACH PART`, `DROP DETACHED PART`) are sent once: after an
//! unclear outcome the protocol reads the server back and reconciles, it never resends.

use std::fmt;
use std::future::Future;

use chpart_core::events;
use chpart_core::retry::{retry_async, GiveUp, Retry, RetryPolicy};

use crate::{
    AttachActivity, ClusterReplica, ColumnInfo, DetachedPartInfo, DiskRow, ErrorClass, LedgerRow,
    PartCheck, ReplicaPorts, ServerError, SharedServer, StateRow, TableCheck, TableDefinition,
    TableInfo, TableToCheck, VolumeRow,
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
    async fn again<T, F, Fut>(&self, what: &str, call: F) -> Result<T, ServerError>
    where
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = Result<T, ServerError>> + Send,
    {
        let endpoint = self.inner.endpoint();
        let log = |retry: Retry<'_, ServerError>| {
            let error = retry.error;
            tracing::warn!(
                "{what} on {endpoint}: retry {} in {:.2} s after a transient fault: {error}",
                retry.number,
                retry.wait.as_secs_f64()
            );
            tracing::info!(
                target: events::TARGET,
                step = "retry",
                outcome = events::RETRYING,
                retry = retry.number,
                duration_ms = retry.wait.as_secs_f64() * 1e3,
                error = format!("{what} on {endpoint}: {error}"),
            );
        };
        let transient = |e: &ServerError| e.class(true) == ErrorClass::Transient;
        retry_async(self.policy, transient, log, tokio::time::sleep, call)
            .await
            .map_err(|failed| match failed.why {
                GiveUp::Deadline if failed.retries > 0 => failed.error.noted(&format!(
                    "gave up after {} tries in {:.1} s",
                    failed.retries + 1,
                    failed.elapsed.as_secs_f64()
                )),
                _ => failed.error,
            })
    }
}

forward_server! {
    impl ClickHouseServer for Retrying;
    by_hand {
        fn endpoint(&self) -> &str {
            self.inner.endpoint()
        }

        // Changes that are not safe to send again: sent once (the protocol reads the server
        // back after an unclear outcome).
        async fn execute(&self, sql: &str) -> Result<(), ServerError> {
            self.inner.execute(sql).await
        }

        async fn attach_part(
            &self,
            database: &str,
            table: &str,
            part: &str,
        ) -> Result<(), ServerError> {
            self.inner.attach_part(database, table, part).await
        }

        async fn drop_detached_part(
            &self,
            database: &str,
            table: &str,
            part: &str,
        ) -> Result<(), ServerError> {
            self.inner.drop_detached_part(database, table, part).await
        }
    }
    forward via again {
        fn execute_idempotent(&self, sql: &str) -> () = "statement";
        fn ledger_entries(&self, sql: &str, params: &[(&str, &str)]) -> Vec<LedgerRow>
            = "ledger read";
        fn version(&self) -> String = "version";
        fn timezone(&self) -> String = "timezone";
        fn now_unix_ms(&self) -> i64 = "clock";
        fn current_user(&self) -> String = "current_user";
        fn has_grant(&self, privilege: &str, on: &str) -> bool = "CHECK GRANT";
        fn database_exists(&self, database: &str) -> bool = "database_exists";
        fn database_engine(&self, database: &str) -> Option<String> = "database_engine";
        fn table_names_by_uuid(&self, database: &str, uuids: &[String]) -> Vec<(String, String)>
            = "table_names_by_uuid";
        fn table_info(&self, database: &str, table: &str) -> Option<TableInfo> = "table_info";
        fn table_definition(&self, database: &str, table: &str) -> Option<TableDefinition>
            = "table_definition";
        fn cluster_replicas(&self, cluster: &str) -> Vec<ClusterReplica> = "cluster_replicas";
        fn cluster_http_ports(&self, cluster: &str) -> Vec<ReplicaPorts> = "cluster_http_ports";
        fn type_of(&self, expression: &str, database: &str, table: &str) -> String = "type_of";
        fn disks(&self) -> Vec<DiskRow> = "disks";
        fn policy_volumes(&self, policy: &str) -> Vec<VolumeRow> = "policy_volumes";
        fn materialized_views(&self, database: &str, table: &str) -> Vec<String>
            = "materialized_views";
        fn columns(&self, database: &str, table: &str) -> Vec<ColumnInfo> = "columns";
        fn detached_parts(&self, database: &str, table: &str) -> Vec<DetachedPartInfo>
            = "detached_parts";
        fn check_parts(&self, database: &str, table: &str) -> Vec<PartCheck> = "check_parts";
        fn table_state(&self, database: &str, table: &str) -> Vec<StateRow> = "table_state";
        fn attach_activity(&self, table: &str) -> AttachActivity = "attach_activity";
        fn check_tables(&self, tables: &[TableToCheck<'_>]) -> Vec<TableCheck> = "check_tables";
        fn count(&self, database: &str, table: &str) -> u64 = "count";
    }
}
