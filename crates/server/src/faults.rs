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

use crate::{
    AttachActivity, ClusterReplica, ColumnInfo, DetachedPartInfo, DiskRow, LedgerRow, PartCheck,
    ReplicaPorts, ServerError, SharedServer, StateRow, TableCheck, TableDefinition, TableInfo,
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

    /// Records the call and applies the fault that fires on it, if any; `call` starts the call
    /// (it is not started for a fault that refuses it).
    async fn around<T, Fut>(
        &self,
        method: &'static str,
        detail: &str,
        call: impl FnOnce() -> Fut,
    ) -> Result<T, ServerError>
    where
        Fut: Future<Output = Result<T, ServerError>>,
    {
        let transport = |what: &str| ServerError::Transport {
            endpoint: self.inner.endpoint().to_owned(),
            detail: format!("injected fault: {what}"),
            statement: crate::short(&format!("{method} {detail}")),
        };
        match self.take(method, detail) {
            None => call().await,
            Some(Effect::Refuse) => Err(transport("connection refused")),
            Some(Effect::LoseAnswer) => {
                let _ = call().await;
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
                call().await
            }
        }
    }
}

// `Faulty` records each call under the trait method's name (`execute_idempotent` as
// `"execute"`, since both send a statement) with the detail tests match faults on.
forward_server! {
    impl ClickHouseServer for Faulty;
    by_hand {
        fn endpoint(&self) -> &str {
            self.inner.endpoint()
        }
    }
    forward via around {
        fn execute(&self, sql: &str) -> () = "execute", sql;
        fn execute_idempotent(&self, sql: &str) -> () = "execute", sql;
        fn ledger_entries(&self, sql: &str, params: &[(&str, &str)]) -> Vec<LedgerRow>
            = "ledger_entries", params.first().map(|(_, v)| *v).unwrap_or("");
        fn version(&self) -> String = "version", "";
        fn timezone(&self) -> String = "timezone", "";
        fn now_unix_ms(&self) -> i64 = "now_unix_ms", "";
        fn current_user(&self) -> String = "current_user", "";
        fn has_grant(&self, privilege: &str, on: &str) -> bool = "has_grant", privilege;
        fn database_exists(&self, database: &str) -> bool = "database_exists", database;
        fn database_engine(&self, database: &str) -> Option<String>
            = "database_engine", database;
        fn table_names_by_uuid(&self, database: &str, uuids: &[String]) -> Vec<(String, String)>
            = "table_names_by_uuid", database;
        fn table_info(&self, database: &str, table: &str) -> Option<TableInfo>
            = "table_info", &format!("{database}.{table}");
        fn table_definition(&self, database: &str, table: &str) -> Option<TableDefinition>
            = "table_definition", &format!("{database}.{table}");
        fn cluster_replicas(&self, cluster: &str) -> Vec<ClusterReplica>
            = "cluster_replicas", cluster;
        fn cluster_http_ports(&self, cluster: &str) -> Vec<ReplicaPorts>
            = "cluster_http_ports", cluster;
        fn type_of(&self, expression: &str, database: &str, table: &str) -> String
            = "type_of", expression;
        fn disks(&self) -> Vec<DiskRow> = "disks", "";
        fn policy_volumes(&self, policy: &str) -> Vec<VolumeRow> = "policy_volumes", policy;
        fn materialized_views(&self, database: &str, table: &str) -> Vec<String>
            = "materialized_views", &format!("{database}.{table}");
        fn columns(&self, database: &str, table: &str) -> Vec<ColumnInfo>
            = "columns", &format!("{database}.{table}");
        fn detached_parts(&self, database: &str, table: &str) -> Vec<DetachedPartInfo>
            = "detached_parts", &format!("{database}.{table}");
        fn attach_part(&self, database: &str, table: &str, part: &str) -> ()
            = "attach_part", &format!("{database}.{table} {part}");
        fn check_parts(&self, database: &str, table: &str) -> Vec<PartCheck>
            = "check_parts", &format!("{database}.{table}");
        fn drop_detached_part(&self, database: &str, table: &str, part: &str) -> ()
            = "drop_detached_part", &format!("{database}.{table} {part}");
        fn table_state(&self, database: &str, table: &str) -> Vec<StateRow>
            = "table_state", &format!("{database}.{table}");
        fn attach_activity(&self, table: &str) -> AttachActivity = "attach_activity", table;
        fn check_tables(&self, tables: &[TableToCheck<'_>]) -> Vec<TableCheck>
            = "check_tables", &tables
                .iter()
                .map(|t| format!("{}.{}", t.database, t.table))
                .collect::<Vec<_>>()
                .join(" ");
        fn count(&self, database: &str, table: &str) -> u64
            = "count", &format!("{database}.{table}");
    }
}
