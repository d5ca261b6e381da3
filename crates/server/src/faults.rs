//! Faults around a real server, for tests: [`Faulty`] forwards every call to the server it
//! wraps, except the calls a [`Fault`] picks, which it refuses, answers with an exception,
//! delays, or lets through while losing the answer (the statement took effect; the caller
//! cannot know). It never answers in the server's place, so what the protocol reads back is
//! always the real server's state.
//!
//! It also records every call (method and detail), so a test can count the statements a step
//! costs or find the one to fault.

use std::fmt;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    AttachActivity, ClickHouseServer, ClusterReplica, ColumnInfo, DetachedPartInfo, DiskRow,
    LedgerRow, PartCheck, ReplicaPorts, ServerError, SharedServer, StateRow, TableCheck, TableInfo,
    TableToCheck, VolumeRow,
};

/// What happens to a call a [`Fault`] picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Not sent; a transport error as if the connection were refused.
    Refuse,
    /// Sent and finished by the server; the answer is lost (a transport error). The outcome of
    /// a change is unknown to the caller.
    LoseAnswer,
    /// Not sent; the server's exception `Code: code` instead.
    Exception {
        /// The `Code: N`, e.g. 242 (TABLE_IS_READ_ONLY, transient) or 36 (permanent).
        code: u32,
    },
    /// Sent after this delay.
    Delay(Duration),
}

/// One fault: the `skip + 1`-th call of `method` whose detail contains `matching` gets
/// `effect`; the fault then fires no more.
#[derive(Debug, Clone)]
pub struct Fault {
    /// The [`ClickHouseServer`] method, e.g. `"attach_part"`, `"execute"`, `"table_state"`.
    pub method: &'static str,
    /// A substring of the call's detail (the statement of `execute`, the part of
    /// `attach_part` and `drop_detached_part`, otherwise the table or the argument).
    pub matching: String,
    /// Matching calls to let through first.
    pub skip: usize,
    /// What the fault does.
    pub effect: Effect,
}

impl Fault {
    /// The first call of `method` whose detail contains `matching` gets `effect`.
    pub fn on(method: &'static str, matching: impl Into<String>, effect: Effect) -> Fault {
        Fault {
            method,
            matching: matching.into(),
            skip: 0,
            effect,
        }
    }

    /// Lets `skip` matching calls through first.
    pub fn after(mut self, skip: usize) -> Fault {
        self.skip = skip;
        self
    }
}

/// One call as [`Faulty`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The method.
    pub method: &'static str,
    /// Its detail (see [`Fault::matching`]).
    pub detail: String,
    /// The effect of a fault on it, if one fired.
    pub fault: Option<Effect>,
}

/// A real server with faults at chosen calls.
pub struct Faulty {
    inner: SharedServer,
    faults: Mutex<Vec<Fault>>,
    calls: Mutex<Vec<Call>>,
}

impl fmt::Debug for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faulty")
            .field("inner", &self.inner)
            .finish()
    }
}

impl Faulty {
    /// `inner` with no faults yet.
    pub fn new(inner: SharedServer) -> Faulty {
        Faulty {
            inner,
            faults: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
        }
    }

    /// Arms `fault`.
    pub fn inject(&self, fault: Fault) {
        self.faults.lock().expect("faults lock").push(fault);
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("calls lock").clone()
    }

    /// Faults armed that have not fired.
    pub fn pending(&self) -> Vec<Fault> {
        self.faults.lock().expect("faults lock").clone()
    }

    /// The effect for this call, taking the fault that fires (if any).
    fn take(&self, method: &'static str, detail: &str) -> Option<Effect> {
        let mut faults = self.faults.lock().expect("faults lock");
        let mut fired = None;
        for (i, fault) in faults.iter_mut().enumerate() {
            if fault.method == method && detail.contains(&fault.matching) {
                if fault.skip == 0 {
                    fired = Some(i);
                    break;
                }
                fault.skip -= 1;
            }
        }
        let effect = fired.map(|i| faults.remove(i).effect);
        self.calls.lock().expect("calls lock").push(Call {
            method,
            detail: detail.to_owned(),
            fault: effect.clone(),
        });
        effect
    }

    async fn around<T>(
        &self,
        method: &'static str,
        detail: &str,
        call: impl Future<Output = Result<T, ServerError>>,
    ) -> Result<T, ServerError> {
        let transport = |what: &str| ServerError::Transport {
            endpoint: self.inner.endpoint().to_owned(),
            detail: format!("injected fault: {what}"),
            statement: crate::short(&format!("{method} {detail}")),
        };
        match self.take(method, detail) {
            None => call.await,
            Some(Effect::Refuse) => Err(transport("connection refused")),
            Some(Effect::LoseAnswer) => {
                let _ = call.await;
                Err(transport("answer lost"))
            }
            Some(Effect::Exception { code }) => Err(ServerError::Server {
                endpoint: self.inner.endpoint().to_owned(),
                code,
                name: None,
                message: "injected fault".into(),
                statement: crate::short(&format!("{method} {detail}")),
            }),
            Some(Effect::Delay(delay)) => {
                tokio::time::sleep(delay).await;
                call.await
            }
        }
    }
}

#[async_trait]
impl ClickHouseServer for Faulty {
    fn endpoint(&self) -> &str {
        self.inner.endpoint()
    }

    async fn execute(&self, sql: &str) -> Result<(), ServerError> {
        self.around("execute", sql, self.inner.execute(sql)).await
    }

    async fn execute_idempotent(&self, sql: &str) -> Result<(), ServerError> {
        self.around("execute", sql, self.inner.execute_idempotent(sql))
            .await
    }

    async fn ledger_entries(
        &self,
        sql: &str,
        params: &[(&str, &str)],
    ) -> Result<Vec<LedgerRow>, ServerError> {
        let load = params.first().map(|(_, v)| *v).unwrap_or("");
        self.around(
            "ledger_entries",
            load,
            self.inner.ledger_entries(sql, params),
        )
        .await
    }

    async fn version(&self) -> Result<String, ServerError> {
        self.around("version", "", self.inner.version()).await
    }

    async fn timezone(&self) -> Result<String, ServerError> {
        self.around("timezone", "", self.inner.timezone()).await
    }

    async fn database_exists(&self, database: &str) -> Result<bool, ServerError> {
        self.around(
            "database_exists",
            database,
            self.inner.database_exists(database),
        )
        .await
    }

    async fn database_engine(&self, database: &str) -> Result<Option<String>, ServerError> {
        self.around(
            "database_engine",
            database,
            self.inner.database_engine(database),
        )
        .await
    }

    async fn table_names_by_uuid(
        &self,
        database: &str,
        uuids: &[String],
    ) -> Result<Vec<(String, String)>, ServerError> {
        self.around(
            "table_names_by_uuid",
            database,
            self.inner.table_names_by_uuid(database, uuids),
        )
        .await
    }

    async fn table_info(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Option<TableInfo>, ServerError> {
        let detail = format!("{database}.{table}");
        self.around(
            "table_info",
            &detail,
            self.inner.table_info(database, table),
        )
        .await
    }

    async fn cluster_replicas(&self, cluster: &str) -> Result<Vec<ClusterReplica>, ServerError> {
        self.around(
            "cluster_replicas",
            cluster,
            self.inner.cluster_replicas(cluster),
        )
        .await
    }

    async fn cluster_http_ports(&self, cluster: &str) -> Result<Vec<ReplicaPorts>, ServerError> {
        self.around(
            "cluster_http_ports",
            cluster,
            self.inner.cluster_http_ports(cluster),
        )
        .await
    }

    async fn type_of(
        &self,
        expression: &str,
        database: &str,
        table: &str,
    ) -> Result<String, ServerError> {
        self.around(
            "type_of",
            expression,
            self.inner.type_of(expression, database, table),
        )
        .await
    }

    async fn disks(&self) -> Result<Vec<DiskRow>, ServerError> {
        self.around("disks", "", self.inner.disks()).await
    }

    async fn policy_volumes(&self, policy: &str) -> Result<Vec<VolumeRow>, ServerError> {
        self.around("policy_volumes", policy, self.inner.policy_volumes(policy))
            .await
    }

    async fn materialized_views(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Vec<String>, ServerError> {
        let detail = format!("{database}.{table}");
        self.around(
            "materialized_views",
            &detail,
            self.inner.materialized_views(database, table),
        )
        .await
    }

    async fn columns(&self, database: &str, table: &str) -> Result<Vec<ColumnInfo>, ServerError> {
        let detail = format!("{database}.{table}");
        self.around("columns", &detail, self.inner.columns(database, table))
            .await
    }

    async fn detached_parts(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Vec<DetachedPartInfo>, ServerError> {
        let detail = format!("{database}.{table}");
        self.around(
            "detached_parts",
            &detail,
            self.inner.detached_parts(database, table),
        )
        .await
    }

    async fn attach_part(
        &self,
        database: &str,
        table: &str,
        part: &str,
    ) -> Result<(), ServerError> {
        let detail = format!("{database}.{table} {part}");
        self.around(
            "attach_part",
            &detail,
            self.inner.attach_part(database, table, part),
        )
        .await
    }

    async fn check_parts(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Vec<PartCheck>, ServerError> {
        let detail = format!("{database}.{table}");
        self.around(
            "check_parts",
            &detail,
            self.inner.check_parts(database, table),
        )
        .await
    }

    async fn drop_detached_part(
        &self,
        database: &str,
        table: &str,
        part: &str,
    ) -> Result<(), ServerError> {
        let detail = format!("{database}.{table} {part}");
        self.around(
            "drop_detached_part",
            &detail,
            self.inner.drop_detached_part(database, table, part),
        )
        .await
    }

    async fn table_state(&self, database: &str, table: &str) -> Result<Vec<StateRow>, ServerError> {
        let detail = format!("{database}.{table}");
        self.around(
            "table_state",
            &detail,
            self.inner.table_state(database, table),
        )
        .await
    }

    async fn attach_activity(&self, table: &str) -> Result<AttachActivity, ServerError> {
        self.around("attach_activity", table, self.inner.attach_activity(table))
            .await
    }

    async fn check_tables(
        &self,
        tables: &[TableToCheck<'_>],
    ) -> Result<Vec<TableCheck>, ServerError> {
        let detail = tables
            .iter()
            .map(|t| format!("{}.{}", t.database, t.table))
            .collect::<Vec<_>>()
            .join(" ");
        self.around("check_tables", &detail, self.inner.check_tables(tables))
            .await
    }

    async fn count(&self, database: &str, table: &str) -> Result<u64, ServerError> {
        let detail = format!("{database}.{table}");
        self.around("count", &detail, self.inner.count(database, table))
            .await
    }
}
