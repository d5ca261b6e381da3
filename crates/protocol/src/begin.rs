//! `begin`: open a load in the ledger and snapshot what every executor needs.
//!
//! Runs once on the driver before the batch job. It records a [`LoadSpec`] (target table, mode,
//! visibility, the exact table definition, data paths, server version and time zone,
//! clickhouse-local version, fingerprint) under the entry id `open`, after creating the shadow
//! table executors publish into when the load's partitions must appear atomically. Re-running it for an open load with the same request is
//! a no-op; for a committed or aborted load it refuses ([`BeginError::NotOpen`]).

use chpart_core::{
    publish_disks, DiskInfo, DiskPlace, LoadId, StagingRoots, TableName, TableRef, VolumeInfo,
};
use chpart_server::{
    quote_ident, quote_table, ClickHouseServer, ServerError, TableDefinition, TableInfo,
};
use sha2::{Digest, Sha256};

use chpart_core::commit::OpenReplaceLoad;

use crate::grants::{needed, GrantOn, Needed, OnServer};
#[cfg(test)]
use crate::ledger::STDIN_DIGEST;
use crate::ledger::{entry, kind, LoadInputs, LoadSpec, LoadState, Mode, Visibility};
use crate::shards::ShardOf;
use crate::snapshot::TableSnapshot;
use crate::store::{Ledger, LedgerStoreError};

/// What the driver asks for.
#[derive(Debug, Clone)]
pub struct BeginRequest {
    /// The load id (unique per load; e.g. `events-2026-11-30T09`).
    pub load: LoadId,
    /// The table the rows go into.
    pub target: TableRef,
    /// Append or replace.
    pub mode: Mode,
    /// Partition or part visibility.
    pub visibility: Visibility,
    /// Host name recorded in manifests.
    pub host: String,
    /// Accept a target that materialized views read from (they will not see the load's rows).
    pub allow_materialized_views: bool,
    /// This host's clickhouse-local version, if it could be run, to record in the spec.
    pub clickhouse_local_version: Option<String>,
    /// The configured staging roots; `begin` picks one per disk the load publishes to and
    /// records it in the spec, which every build, commit and gc then follows.
    pub staging: StagingRoots,
    /// For a shard's sub-load of a cluster load: which load and shard (`None` otherwise).
    pub shard_of: Option<crate::shards::ShardOf>,
    /// What `chpart load` reads (`None` for `chpart begin` and Spark): recorded in the spec,
    /// and a load open with other inputs is refused.
    pub inputs: Option<LoadInputs>,
}

/// What `begin` did.
#[derive(Debug, Clone)]
pub enum BeginOutcome {
    /// The load was opened now.
    Opened(LoadSpec),
    /// The load was already open with the same request: nothing changed.
    AlreadyOpen(LoadSpec),
}

impl BeginOutcome {
    /// The load's spec either way.
    pub fn spec(&self) -> &LoadSpec {
        match self {
            BeginOutcome::Opened(spec) | BeginOutcome::AlreadyOpen(spec) => spec,
        }
    }
}

/// Why `begin` refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum BeginError {
    /// The load is committed or aborted: it cannot be begun again.
    #[error(
        "load {load} is already {state}; a finished load cannot be begun again (use a new load id)"
    )]
    NotOpen {
        /// The load.
        load: LoadId,
        /// Its state (`committed` or `aborted`).
        state: &'static str,
    },
    /// The load was begun for other inputs (`chpart load` with the same load id and other data).
    #[error("load {load} was begun for {recorded}, but these inputs are {given}; a load id names one set of inputs: re-run with the same inputs to finish it, or use a new load id")]
    InputsDiffer {
        /// The load.
        load: LoadId,
        /// The recorded inputs, described.
        recorded: String,
        /// The given inputs, described.
        given: String,
    },
    /// Another open load replaces partitions of the same table.
    #[error("table {table}: load {other} is open in replace mode on it; a replace load owns the partitions it replaces until it is committed or aborted (an overwrite load the whole table), so another one cannot begin (finish or abort {other} first)")]
    ReplaceBusy {
        /// The table.
        table: TableRef,
        /// The open replace load.
        other: LoadId,
    },
    /// The load is open with a different request.
    #[error("load {load} is already open for {existing}; this request is for {requested}")]
    Conflict {
        /// The load.
        load: LoadId,
        /// What the open load is for.
        existing: String,
        /// What was asked now.
        requested: String,
    },
    /// The target table does not exist.
    #[error("table {table} does not exist on {endpoint}")]
    TableMissing {
        /// The table.
        table: TableRef,
        /// The server.
        endpoint: String,
    },
    /// The request cannot work for this table.
    #[error("table {table}: {message}")]
    Unsupported {
        /// The table.
        table: TableRef,
        /// Why.
        message: String,
    },
    /// The configured user lacks privileges the load needs ([`crate::grants::needed`]):
    /// refused before anything is created.
    #[error(
        "user {user} on {endpoint} lacks {} privilege(s) a load of {table} needs: {}; grant them (e.g. GRANT {} ON {} TO {user}) and run begin again; nothing was created",
        missing.len(),
        missing.iter().map(describe_missing).collect::<Vec<_>>().join("; "),
        missing[0].privilege,
        missing[0].on
    )]
    MissingGrants {
        /// The user (`currentUser()` on the table's server).
        user: String,
        /// The table's server.
        endpoint: String,
        /// The table the load is for.
        table: TableRef,
        /// What the user lacks, at least one.
        missing: Vec<Needed>,
    },
    /// A shard of a cluster load refused or failed.
    #[error("shard {shard_num} ({host}): {source}")]
    Shard {
        /// The shard's number.
        shard_num: u32,
        /// Its host.
        host: String,
        /// What went wrong there.
        source: Box<BeginError>,
    },
    /// A shard of a cluster load could not be reached.
    #[error("shard {shard_num} ({host}) is unreachable: {message}")]
    ShardUnreachable {
        /// The shard's number.
        shard_num: u32,
        /// Its host.
        host: String,
        /// What happened.
        message: String,
    },
    /// A server call failed.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The ledger failed.
    #[error(transparent)]
    Ledger(#[from] LedgerStoreError),
}

/// The shadow table of `target` for `load`: same database, a name derived from both, so two
/// loads of one table never share a shadow.
pub fn shadow_table(target: &TableRef, load: &LoadId) -> Result<TableRef, BeginError> {
    let digest = Sha256::digest(load.as_str().as_bytes());
    let name = format!(
        "{}__chpart_{}",
        target.table.as_str(),
        &hex::encode(digest)[..12]
    );
    let table: TableName = name.parse().map_err(|e| BeginError::Unsupported {
        table: target.clone(),
        message: format!("its name is too long for a shadow table name ({e})"),
    })?;
    Ok(TableRef {
        database: target.database.clone(),
        table,
    })
}

fn describe_missing(n: &Needed) -> String {
    let server = match n.server {
        OnServer::Ledger => " (on the ledger's server)",
        OnServer::Table => "",
    };
    format!("{} ON {}{server}, to {}", n.privilege, n.on, n.needed_by)
}

/// `on` as SQL for `GRANT`/`CHECK GRANT ... ON <this>`, names quoted.
fn grant_on_sql(on: &GrantOn) -> String {
    match on {
        GrantOn::Table { database, table } => quote_table(database, table),
        GrantOn::Database(database) => format!("{}.*", quote_ident(database)),
        GrantOn::Engine(engine) => quote_ident(engine),
    }
}

/// Refuses `req` ([`BeginError::MissingGrants`]) when the configured user lacks a privilege
/// the load will need on the ledger's server or on `server` (the table's), each asked with
/// `CHECK GRANT` before anything is created: a load that could not finish must not begin,
/// build and then fail halfway through its commit. `seen` is the target's `table_info` as
/// `server` showed it to this user (read once per `begin`).
pub(crate) async fn check_grants(
    ledger: &Ledger,
    server: &dyn ClickHouseServer,
    req: &BeginRequest,
    seen: Option<&TableInfo>,
) -> Result<(), BeginError> {
    let (db, table) = (req.target.database.as_str(), req.target.table.as_str());
    let missing_grants = |missing: Vec<Needed>| async move {
        Ok::<_, BeginError>(BeginError::MissingGrants {
            user: server.current_user().await?,
            endpoint: server.endpoint().to_owned(),
            table: req.target.clone(),
            missing,
        })
    };
    let Some(info) = seen else {
        // `system.tables` hides the tables a user holds no privilege on: say that, not
        // "missing". A table that is really missing is refused by `begin` itself.
        let on = GrantOn::Table {
            database: db.to_owned(),
            table: table.to_owned(),
        };
        if server.has_grant("SHOW TABLES", &grant_on_sql(&on)).await? {
            return Ok(());
        }
        let needed = Needed {
            privilege: "SHOW TABLES",
            on,
            server: OnServer::Table,
            needed_by: "see the target table",
        };
        return Err(missing_grants(vec![needed]).await?);
    };
    let shadow = match req.visibility {
        Visibility::Partition => Some(shadow_table(&req.target, &req.load)?),
        Visibility::Part => None,
    };
    let needed = needed(
        ledger.database(),
        &req.target,
        &info.engine,
        req.mode,
        shadow.as_ref(),
    );
    let missing = missing_grants_of(ledger.server(), server, needed).await?;
    if missing.is_empty() {
        return Ok(());
    }
    Err(missing_grants(missing).await?)
}

/// Which of `needed` the user lacks, in as few `CHECK GRANT`s as the answers allow (each
/// costs the server a statement, on every `begin`): first every privilege at once on
/// everything, per server (a user such as `default`, who holds them all, is done in one or
/// two questions); then every privilege on one object at once; one by one only on an object
/// where some privilege lacks, to name it.
async fn missing_grants_of(
    ledger_server: &dyn ClickHouseServer,
    server: &dyn ClickHouseServer,
    needed: Vec<Needed>,
) -> Result<Vec<Needed>, BeginError> {
    let same_server = ledger_server.endpoint() == server.endpoint();
    let server_of = |n: &Needed| match n.server {
        OnServer::Ledger if !same_server => ledger_server,
        _ => server,
    };
    let key = |n: &Needed| {
        (
            n.server == OnServer::Ledger && !same_server,
            grant_on_sql(&n.on),
        )
    };
    // Every privilege at once, per server: tables' on `*.*`, engines' on `*`.
    let mut all_held = true;
    for on_ledger in [false, true] {
        let of_server: Vec<&Needed> = needed.iter().filter(|n| key(n).0 == on_ledger).collect();
        for engines in [false, true] {
            let privileges = distinct(
                of_server
                    .iter()
                    .filter(|n| matches!(n.on, GrantOn::Engine(_)) == engines)
                    .map(|n| n.privilege),
            );
            if privileges.is_empty() {
                continue;
            }
            let on = if engines { "*" } else { "*.*" };
            let asked = if on_ledger { ledger_server } else { server };
            if !asked.has_grant(&privileges.join(", "), on).await? {
                all_held = false;
            }
        }
    }
    if all_held {
        return Ok(Vec::new());
    }
    // Per object, then per privilege where one lacks.
    let mut objects: Vec<(bool, String)> = Vec::new();
    for n in &needed {
        if !objects.contains(&key(n)) {
            objects.push(key(n));
        }
    }
    let mut missing = Vec::new();
    for object in objects {
        let here: Vec<&Needed> = needed.iter().filter(|n| key(n) == object).collect();
        let asked = server_of(here[0]);
        let privileges = distinct(here.iter().map(|n| n.privilege));
        if asked.has_grant(&privileges.join(", "), &object.1).await? {
            continue;
        }
        for privilege in privileges {
            if !asked.has_grant(privilege, &object.1).await? {
                missing.extend(
                    here.iter()
                        .filter(|n| n.privilege == privilege)
                        .take(1)
                        .map(|n| (*n).clone()),
                );
            }
        }
    }
    Ok(missing)
}

/// `items` without repeats, in their order.
fn distinct<'a>(items: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

fn describe(target: &TableRef, mode: Mode, visibility: Visibility) -> String {
    format!("table {target}, mode {mode}, visibility {visibility}")
}

/// `table`'s definition on `server` ([`ClickHouseServer::table_definition`], one statement),
/// or [`BeginError::TableMissing`] naming the table and the server.
pub(crate) async fn definition_of(
    server: &dyn ClickHouseServer,
    table: &TableRef,
) -> Result<TableDefinition, BeginError> {
    server
        .table_definition(table.database.as_str(), table.table.as_str())
        .await?
        .ok_or_else(|| BeginError::TableMissing {
            table: table.clone(),
            endpoint: server.endpoint().to_owned(),
        })
}

/// Opens `req.load`, or confirms it is open with the same request.
pub async fn begin(ledger: &Ledger, req: &BeginRequest) -> Result<BeginOutcome, BeginError> {
    begin_on(ledger, ledger.server(), req).await
}

/// [`begin`] for a table on `server`, which need not be the ledger's (a shard of a cluster).
pub async fn begin_on(
    ledger: &Ledger,
    server: &dyn ClickHouseServer,
    req: &BeginRequest,
) -> Result<BeginOutcome, BeginError> {
    let seen = server
        .table_definition(req.target.database.as_str(), req.target.table.as_str())
        .await?;
    begin_seen(ledger, server, req, seen).await
}

/// [`begin_on`] with the target's `table_definition` already read from `server` (`None`:
/// not shown to this user).
pub(crate) async fn begin_seen(
    ledger: &Ledger,
    server: &dyn ClickHouseServer,
    req: &BeginRequest,
    seen: Option<TableDefinition>,
) -> Result<BeginOutcome, BeginError> {
    check_grants(ledger, server, req, seen.as_ref().map(|d| &d.info)).await?;
    begin_granted(ledger, server, req, seen).await
}

/// [`begin_seen`] once [`check_grants`] has passed (a cluster load checks every shard
/// first), with the `seen` it was given: the target's definition, its columns, the views
/// reading from it and the server's version and time zone, read in one statement.
pub(crate) async fn begin_granted(
    ledger: &Ledger,
    server: &dyn ClickHouseServer,
    req: &BeginRequest,
    seen: Option<TableDefinition>,
) -> Result<BeginOutcome, BeginError> {
    ledger.ensure().await?;
    let view = ledger.view(&req.load, crate::KNOWN_KINDS).await?;
    if let Some(outcome) = existing_outcome(&view.state, view.spec.as_ref(), req)? {
        return Ok(outcome);
    }
    if req.mode != Mode::Append && req.visibility == Visibility::Part {
        return Err(BeginError::Unsupported {
            table: req.target.clone(),
            message: format!(
                "{} mode swaps {} from a shadow table; it needs --visibility partition",
                req.mode,
                if req.mode == Mode::Replace {
                    "whole partitions"
                } else {
                    "the whole table"
                }
            ),
        });
    }
    if req.mode == Mode::Overwrite {
        check_swappable(server, &req.target).await?;
    }
    // Which partitions a load replaces is known only at commit (which checks again, against
    // the other loads' plans); at begin, one open replace (or overwrite) load per table.
    if req.mode != Mode::Append {
        if let Some(other) =
            open_replace_loads(ledger, &req.target, &req.load, req.shard_of.as_ref())
                .await?
                .into_iter()
                .next()
        {
            return Err(BeginError::ReplaceBusy {
                table: req.target.clone(),
                other: other.load,
            });
        }
    }
    let (db, table) = (req.target.database.as_str(), req.target.table.as_str());
    let seen = seen.ok_or_else(|| BeginError::TableMissing {
        table: req.target.clone(),
        endpoint: server.endpoint().to_owned(),
    })?;
    let target_snapshot = TableSnapshot::from_server(&seen.info, &seen.columns);
    if !target_snapshot.engine_supported() {
        return Err(BeginError::Unsupported {
            table: req.target.clone(),
            message: format!(
                "engine {} is not supported (chpart builds parts for non-replicated MergeTree-family tables)",
                target_snapshot.shape.engine
            ),
        });
    }
    let unsupported = target_snapshot.unsupported_columns();
    if !unsupported.is_empty() {
        return Err(BeginError::Unsupported {
            table: req.target.clone(),
            message: format!(
                "chpart cannot fill these columns from Parquet or Arrow input: {}",
                unsupported.join("; ")
            ),
        });
    }
    let views = &seen.views;
    if !views.is_empty() && !req.allow_materialized_views {
        return Err(BeginError::Unsupported {
            table: req.target.clone(),
            message: format!(
                "materialized views read from it ({}); they run on INSERT only and never see rows that arrive by ATTACH PART, MOVE PARTITION or REPLACE PARTITION, so they would miss this load. Load their targets yourself, or pass --allow-materialized-views to load anyway",
                views.join(", ")
            ),
        });
    }
    if target_snapshot.data_paths.is_empty() {
        return Err(BeginError::Unsupported {
            table: req.target.clone(),
            message: "the server reports no data path".into(),
        });
    }

    // Refused before anything is created: a table whose policy has no local disk to stage
    // on (the shadow, made `AS` the target, would have the same policy).
    let mut disk_facts = None;
    let target_disks = resolve_disks(
        server,
        &req.target,
        &target_snapshot,
        &req.staging,
        &mut disk_facts,
    )
    .await?;
    let (publish, publish_snapshot) = match req.visibility {
        Visibility::Part => (req.target.clone(), target_snapshot.clone()),
        Visibility::Partition => {
            let shadow = shadow_table(&req.target, &req.load)?;
            server
                .execute_idempotent(&format!(
                    "CREATE TABLE IF NOT EXISTS {} AS {}",
                    quote_table(shadow.database.as_str(), shadow.table.as_str()),
                    quote_table(db, table)
                ))
                .await?;
            stop_merges(server, &shadow).await?;
            let made = definition_of(server, &shadow).await?;
            let snapshot = TableSnapshot::from_server(&made.info, &made.columns);
            if snapshot.fingerprint != target_snapshot.fingerprint {
                return Err(BeginError::Unsupported {
                    table: shadow.clone(),
                    message: format!(
                        "this shadow table exists with a different structure than {} (fingerprint {} vs {}); \
                         drop it or use a new load id",
                        req.target, snapshot.fingerprint, target_snapshot.fingerprint
                    ),
                });
            }
            (shadow, snapshot)
        }
    };

    let publish_disks = if publish == req.target {
        target_disks
    } else {
        resolve_disks(
            server,
            &publish,
            &publish_snapshot,
            &req.staging,
            &mut disk_facts,
        )
        .await?
    };
    let server_version = seen.version;
    if let Some(local) = &req.clickhouse_local_version {
        // Only executors build; this host's clickhouse-local is a hint that theirs may be newer.
        if let Err(e) = chpart_core::check_local_not_newer(local, &server_version) {
            tracing::warn!("load {}: {e}; builds with it will be refused", req.load);
        }
    }
    let spec = LoadSpec {
        load: req.load.clone(),
        target: req.target.clone(),
        mode: req.mode,
        visibility: req.visibility,
        publish,
        target_snapshot,
        publish_snapshot,
        server_version,
        server_timezone: Some(seen.timezone),
        clickhouse_local_version: req.clickhouse_local_version.clone(),
        host: req.host.clone(),
        publish_disks,
        cluster: None,
        shard_of: req.shard_of.clone(),
        inputs: req.inputs.clone(),
        // The ledger server's clock, as every entry's `written_at`: gc ages the load by it.
        opened_at_unix_ms: ledger.server_now_ms().await?,
    };
    open_load(ledger, req, spec).await
}

/// Records `spec` as `req.load`'s (once per load) and reads back which spec the server kept:
/// if another `begin` of the same load won the race, its spec is the load's.
pub(crate) async fn open_load(
    ledger: &Ledger,
    req: &BeginRequest,
    spec: LoadSpec,
) -> Result<BeginOutcome, BeginError> {
    let body = serde_json::to_string(&spec).expect("a LoadSpec serializes");
    ledger
        .append_once(&req.load, entry::OPEN, kind::LOAD_OPENED, &body)
        .await?;
    let view = ledger.view(&req.load, crate::KNOWN_KINDS).await?;
    match view.spec {
        Some(winner) if winner == spec => Ok(BeginOutcome::Opened(spec)),
        winner => Ok(existing_outcome(&view.state, winner.as_ref(), req)?
            .unwrap_or(BeginOutcome::Opened(spec))),
    }
}

/// What the server says of its disks and of one storage policy's volumes: read once per
/// `begin`, for the target and its shadow (made `AS` the target: the same policy).
struct DiskFacts {
    policy: String,
    disks: Vec<DiskInfo>,
    volumes: Vec<VolumeInfo>,
}

impl DiskFacts {
    async fn read(server: &dyn ClickHouseServer, policy: &str) -> Result<DiskFacts, BeginError> {
        let disks = server
            .disks()
            .await?
            .into_iter()
            .map(|d| DiskInfo {
                local: d.disk_type == "Local" && !d.is_remote,
                name: d.name,
                path: d.path,
            })
            .collect();
        let volumes = server
            .policy_volumes(policy)
            .await?
            .into_iter()
            .map(|v| VolumeInfo {
                name: v.volume_name,
                priority: v.volume_priority,
                disks: v.disks,
            })
            .collect();
        Ok(DiskFacts {
            policy: policy.to_owned(),
            disks,
            volumes,
        })
    }
}

/// The disks of `table` a load publishes parts to, each with its staging root (see
/// `chpart_core::destination`): the local disks of its storage policy's first volume. `facts`
/// are read again if they are of another policy than the table's.
async fn resolve_disks(
    server: &dyn ClickHouseServer,
    table: &TableRef,
    snapshot: &TableSnapshot,
    roots: &StagingRoots,
    facts: &mut Option<DiskFacts>,
) -> Result<Vec<DiskPlace>, BeginError> {
    let policy = snapshot.storage_policy.as_str();
    if facts.as_ref().is_none_or(|f| f.policy != policy) {
        *facts = Some(DiskFacts::read(server, policy).await?);
    }
    let facts = facts.as_ref().expect("read just above");
    publish_disks(
        policy,
        &snapshot.data_paths,
        &facts.disks,
        &facts.volumes,
        roots,
    )
    .map_err(|e| BeginError::Unsupported {
        table: table.clone(),
        message: e.to_string(),
    })
}

/// Stops background merges of the load's shadow table until its partitions are published:
/// a merge there would fold rows of the folding engines (Replacing, Summing, Collapsing, ...)
/// or drop expired ones, and commit reconciles each partition's rows in the shadow with the
/// rows its parts were built with. The target merges them after MOVE/REPLACE, as it would
/// after an INSERT. `SYSTEM STOP MERGES` lasts until the server restarts, so `commit` repeats
/// it each time it starts; a restart between its ATTACH and its MOVE leaves a window (see the
/// README's guarantees).
pub async fn stop_merges(
    server: &dyn ClickHouseServer,
    shadow: &TableRef,
) -> Result<(), ServerError> {
    server
        .execute_idempotent(&format!(
            "SYSTEM STOP MERGES {}",
            quote_table(shadow.database.as_str(), shadow.table.as_str())
        ))
        .await
}

/// Overwrite swaps the target with its shadow by `EXCHANGE TABLES`, which only an Atomic
/// database does at once (readers see one table or the other); anywhere else it is refused.
async fn check_swappable(
    server: &dyn ClickHouseServer,
    target: &TableRef,
) -> Result<(), BeginError> {
    let db = target.database.as_str();
    match server.database_engine(db).await?.as_deref() {
        Some("Atomic") => Ok(()),
        engine => Err(BeginError::Unsupported {
            table: target.clone(),
            message: format!(
                "overwrite swaps the table with a shadow by EXCHANGE TABLES, which only an Atomic database does atomically; database {db} is {}",
                engine.map_or_else(|| "missing".to_owned(), |e| format!("of engine {e}"))
            ),
        }),
    }
}

/// The open loads in replace mode that target `table`, other than `except`, each with the
/// partitions its recorded plan replaces (`None` before it has one). Reads the loads gc has not
/// recorded done ([`Ledger::unsettled_loads`]), among which every open load is, not the ledger.
///
/// `shard` is the asking load's shard when it is a Distributed table's sub-load: sub-loads of
/// the same local table on two shards' servers (told apart by URL) are different tables. Any
/// other pair naming the same table counts, so a load of a shard's table made directly on the
/// ledger's server and a cluster's sub-load on that server exclude each other whatever URL
/// names it.
pub(crate) async fn open_replace_loads(
    ledger: &Ledger,
    table: &TableRef,
    except: &LoadId,
    shard: Option<&ShardOf>,
) -> Result<Vec<OpenReplaceLoad>, LedgerStoreError> {
    let mut out = Vec::new();
    let unsettled: Vec<String> = ledger
        .unsettled_loads()
        .await?
        .loads
        .into_iter()
        .filter(|l| l != except.as_str())
        .collect();
    for view in ledger.views(&unsettled).await?.into_values() {
        let Some(spec) = view.spec.as_ref() else {
            continue;
        };
        if view.state != LoadState::Open || spec.mode == Mode::Append || &spec.target != table {
            continue;
        }
        if let (Some(mine), Some(theirs)) = (shard, spec.shard_of.as_ref()) {
            if mine.url != theirs.url {
                continue;
            }
        }
        let planned = view.plan()?.map(|plan| {
            plan.to_publish()
                .into_iter()
                .map(|p| p.partition_id)
                .collect()
        });
        out.push(OpenReplaceLoad {
            load: spec.load.clone(),
            planned,
            whole_table: spec.mode == Mode::Overwrite,
        });
    }
    Ok(out)
}

/// Refuses `given` inputs other than the `recorded` ones. A request without inputs (`chpart
/// begin`) accepts any: it does not say what it reads.
pub fn check_inputs(
    load: &LoadId,
    recorded: Option<&LoadInputs>,
    given: Option<&LoadInputs>,
) -> Result<(), BeginError> {
    match (recorded, given) {
        (_, None) => Ok(()),
        (Some(recorded), Some(given)) if recorded.same_data(given) => Ok(()),
        (recorded, Some(given)) => Err(BeginError::InputsDiffer {
            load: load.clone(),
            recorded: recorded.map_or_else(
                || "no recorded inputs (it was begun by `chpart begin` or Spark)".to_owned(),
                LoadInputs::describe,
            ),
            given: given.describe(),
        }),
    }
}

/// The outcome for a load that already has entries, or `None` when it has none.
pub(crate) fn existing_outcome(
    state: &LoadState,
    spec: Option<&LoadSpec>,
    req: &BeginRequest,
) -> Result<Option<BeginOutcome>, BeginError> {
    match (state, spec) {
        (LoadState::Committed | LoadState::Aborted, _) => Err(BeginError::NotOpen {
            load: req.load.clone(),
            state: state.as_str(),
        }),
        (LoadState::Open, Some(spec))
            if spec.same_request(&req.target, req.mode, req.visibility) =>
        {
            check_inputs(&req.load, spec.inputs.as_ref(), req.inputs.as_ref())?;
            Ok(Some(BeginOutcome::AlreadyOpen(spec.clone())))
        }
        (LoadState::Open, Some(spec)) => Err(BeginError::Conflict {
            load: req.load.clone(),
            existing: describe(&spec.target, spec.mode, spec.visibility),
            requested: describe(&req.target, req.mode, req.visibility),
        }),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(files: u64, digest: &str, builds: u32) -> LoadInputs {
        LoadInputs {
            files,
            bytes: files * 10,
            digest: digest.into(),
            builds,
        }
    }

    #[test]
    fn a_load_names_one_set_of_inputs() {
        let load: LoadId = "l".parse().unwrap();
        let a = inputs(3, "aa", 2);
        // (recorded, given, accepted)
        let rows: Vec<(&str, Option<LoadInputs>, Option<LoadInputs>, bool)> = vec![
            (
                "chpart begin asks nothing of the inputs",
                Some(a.clone()),
                None,
                true,
            ),
            ("same data", Some(a.clone()), Some(a.clone()), true),
            (
                "same data, other --jobs",
                Some(a.clone()),
                Some(inputs(3, "aa", 4)),
                true,
            ),
            (
                "other content",
                Some(a.clone()),
                Some(inputs(3, "ab", 2)),
                false,
            ),
            (
                "other count",
                Some(a.clone()),
                Some(inputs(2, "aa", 2)),
                false,
            ),
            ("begun without inputs", None, Some(a.clone()), false),
            (
                "stdin against files",
                Some(a.clone()),
                Some(inputs(0, STDIN_DIGEST, 1)),
                false,
            ),
        ];
        for (what, recorded, given, accepted) in rows {
            let got = check_inputs(&load, recorded.as_ref(), given.as_ref());
            assert_eq!(got.is_ok(), accepted, "{what}: {got:?}");
            if let Err(e) = got {
                assert!(matches!(e, BeginError::InputsDiffer { .. }), "{what}: {e}");
                assert_eq!(e.kind(), crate::FailureKind::Permanent, "{what}");
            }
        }
    }
}
