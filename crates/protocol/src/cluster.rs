//! Loads into a `Distributed` table: the rows of each attempt routed to the shards exactly as
//! ClickHouse routes them, and one exactly-once load per shard.
//!
//! ```text
//!  begin db.dist ─► engine_full: cluster c, local table db.local, sharding key
//!     ─► system.clusters (shards, weights, hosts) ─► each shard's HTTP port (clusterAllReplicas)
//!     ─► every shard's db.local: same fingerprint, time zone; key type ─► one sub-load per shard
//!        (`<load>.shard<N>`: an ordinary load of db.local on that shard, its own shadow, disks,
//!        staging) ─► the cluster load's spec (routing, shards) last
//!  build ─► rows routed inside clickhouse-local (`Routing::slot_sql`) into one table per shard
//!     ─► per shard, in parallel: stage on that shard's host, publish into its detached/,
//!        one manifest per shard ─► one line: the attempt's cluster manifest
//!  commit ─► the cluster plan (every shard's winners, kept once by the server)
//!     ─► prepare every shard (check winners, tables, parts; record its plan): nothing visible
//!     ─► claim the cluster load ─► commit every shard's sub-load in parallel ─► commit entry
//! ```
//!
//! Each shard's sub-load is committed by the single-table protocol ([`crate::commit`]), so
//! everything it guarantees holds per shard: exactly once, resumable after a crash at any step,
//! partition visibility per shard. ClickHouse has no transaction across shards, so a reader of
//! the Distributed table may see a partition on one shard before another (see the README); what
//! this module adds is that nothing becomes visible on any shard until every shard's winners
//! were checked and planned, that all shards commit one set of winners (the cluster plan, kept
//! once per load by the server), and that abort and gc reach every shard.
//!
//! Routing happens where the rows are built, so a non-deterministic key (`rand()`) is fine:
//! each attempt routes its rows once, and only the winning attempt's routing becomes visible.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chpart_core::routing::{DistributedEngine, RoutingError};
use chpart_core::{AttemptId, IdError, PartitionId, TableRef};
use chpart_remote::{RemoteError, RemoteFs};
use chpart_server::{ClickHouseServer, SharedServer, TableDefinition};
use futures_util::future::join_all;

use crate::begin::{BeginError, BeginOutcome, BeginRequest};
use crate::commit::{commit, CommitEnv, CommitError, CommitOutcome, CommitRequest, CommitSummary};
use crate::hooks::crash_point;
use crate::ledger::{entry, kind, Decision, LoadSpec, LoadState, Mode, Visibility};
use crate::reach::Reach;
use crate::shards::{shard_load, ClusterManifest, ClusterPlan, ClusterSpec, ShardOf, ShardSpec};
use crate::snapshot::TableSnapshot;
use crate::store::{now_unix_ms, Ledger};

pub(crate) fn refuse(table: &TableRef, message: impl Into<String>) -> BeginError {
    BeginError::Unsupported {
        table: table.clone(),
        message: message.into(),
    }
}

fn shard_error(shard: &ShardSpec, source: BeginError) -> BeginError {
    BeginError::Shard {
        shard_num: shard.shard_num,
        host: shard.host.clone(),
        source: Box::new(source),
    }
}

/// What one shard's server says before anything is created on any shard.
pub(crate) struct ShardFacts {
    pub(crate) snapshot: TableSnapshot,
    pub(crate) version: String,
    pub(crate) timezone: String,
}

pub(crate) async fn shard_facts(
    server: &dyn ClickHouseServer,
    local: &TableRef,
) -> Result<ShardFacts, BeginError> {
    let seen = crate::begin::definition_of(server, local).await?;
    Ok(ShardFacts {
        snapshot: TableSnapshot::from_server(&seen.info, &seen.columns),
        version: seen.version,
        timezone: seen.timezone,
    })
}

/// `begin` of a load into the Distributed table `req.target` (described by `seen`, read from
/// the ledger's server): see the module doc. Re-running it for an open load with the same
/// request is a no-op, as for one table.
pub async fn begin_cluster(
    ledger: &Ledger,
    reach: &dyn Reach,
    req: &BeginRequest,
    seen: &TableDefinition,
) -> Result<BeginOutcome, BeginError> {
    let (server, info) = (ledger.server(), &seen.info);
    ledger.ensure().await?;
    let view = ledger.view(&req.load, crate::KNOWN_KINDS).await?;
    if let Some(outcome) = crate::begin::existing_outcome(&view.state, view.spec.as_ref(), req)? {
        return Ok(outcome);
    }
    let target = &req.target;
    let engine =
        DistributedEngine::parse(&info.engine_full).map_err(|e| refuse(target, e.to_string()))?;
    if req.mode != Mode::Append {
        // One open replace (or overwrite) load per Distributed table, as per table (each
        // shard's sub-load checks its own local table again, and every shard's commit checks
        // the plans).
        if req.visibility == Visibility::Part {
            return Err(refuse(
                target,
                format!(
                    "{} mode swaps data from a shadow table; it needs --visibility partition",
                    req.mode
                ),
            ));
        }
        if let Some(other) = crate::begin::open_replace_loads(ledger, target, &req.load, None)
            .await?
            .into_iter()
            .next()
        {
            return Err(BeginError::ReplaceBusy {
                table: target.clone(),
                other: other.load,
            });
        }
    }
    let replicas = server.cluster_replicas(&engine.cluster).await?;
    if replicas.is_empty() {
        return Err(refuse(
            target,
            format!(
                "its cluster {} is not in system.clusters of {}",
                engine.cluster,
                server.endpoint()
            ),
        ));
    }
    if let Some(r) = replicas.iter().find(|r| r.replica_num > 1) {
        return Err(refuse(
            target,
            format!(
                "shard {} of cluster {} has more than one replica ({}); chpart loads shards of one replica only (replicated shards are not supported, see the README)",
                r.shard_num, engine.cluster, r.host_name
            ),
        ));
    }
    let local: TableRef = format!("{}.{}", engine.database, engine.table)
        .parse()
        .map_err(|e: IdError| refuse(target, format!("its local table: {e}")))?;
    let ports = server.cluster_http_ports(&engine.cluster).await?;
    let mut shards = Vec::new();
    for r in &replicas {
        let url = match reach.url(&r.host_name) {
            Some(url) => url,
            None => {
                let http = ports
                    .iter()
                    .find(|p| p.shard_num == r.shard_num && p.tcp_port == r.port)
                    .ok_or_else(|| BeginError::ShardUnreachable {
                        shard_num: r.shard_num,
                        host: r.host_name.clone(),
                        message: format!(
                            "it did not answer through cluster {} (its TCP port {}); nothing was created on any shard",
                            engine.cluster, r.port
                        ),
                    })?;
                format!("http://{}:{}", r.host_name, http.http_port)
            }
        };
        shards.push(ShardSpec {
            shard_num: r.shard_num,
            weight: r.shard_weight,
            host: r.host_name.clone(),
            url,
            load: shard_load(&req.load, r.shard_num)
                .map_err(|e| refuse(target, format!("load id {}: {e}", req.load)))?,
        });
    }

    // Every shard's facts first: nothing is created anywhere unless every shard answers and
    // holds the same table in the same zone.
    let servers: Vec<SharedServer> = shards.iter().map(|s| reach.server(&s.url)).collect();
    let facts = join_all(servers.iter().map(|s| shard_facts(s.as_ref(), &local))).await;
    let mut first: Option<(&ShardSpec, ShardFacts)> = None;
    for (shard, facts) in shards.iter().zip(facts) {
        let facts = facts.map_err(|e| match e {
            BeginError::Server(source) => BeginError::ShardUnreachable {
                shard_num: shard.shard_num,
                host: shard.host.clone(),
                message: format!("{source}; nothing was created on any shard"),
            },
            other => shard_error(shard, other),
        })?;
        match &first {
            None => first = Some((shard, facts)),
            Some((one, reference)) => {
                if facts.snapshot.fingerprint != reference.snapshot.fingerprint {
                    return Err(refuse(
                        target,
                        format!(
                            "the local table {local} differs between shard {} ({}, fingerprint {}) and shard {} ({}, fingerprint {}); every shard must have the same definition",
                            one.shard_num, one.host, reference.snapshot.fingerprint,
                            shard.shard_num, shard.host, facts.snapshot.fingerprint
                        ),
                    ));
                }
                if facts.timezone != reference.timezone {
                    return Err(refuse(
                        target,
                        format!(
                            "shard {} ({}) runs in time zone {} but shard {} ({}) in {}; partition ids of DateTime columns would differ",
                            shard.shard_num, shard.host, facts.timezone, one.shard_num, one.host, reference.timezone
                        ),
                    ));
                }
            }
        }
    }
    let (_, reference) = first.expect("a cluster has at least one shard");
    let key_type = match (&engine.sharding_key, shards.len()) {
        (Some(key), n) if n > 1 => Some(
            servers[0]
                .type_of(key, local.database.as_str(), local.table.as_str())
                .await
                .map_err(|e| refuse(target, format!("its sharding key {key}: {e}")))?,
        ),
        _ => None,
    };
    let cluster = ClusterSpec {
        cluster: engine.cluster.clone(),
        local: local.clone(),
        sharding_key: engine.sharding_key.clone(),
        key_type,
        shards,
    };
    cluster
        .routing()
        .slot_sql()
        .map_err(|e: RoutingError| refuse(target, e.to_string()))?;

    // The sub-load of each shard: the user must hold what it needs on every shard before
    // any is begun (nothing is created anywhere otherwise); a re-run after a crash finds the
    // open ones as they were.
    let subs: Vec<BeginRequest> = cluster
        .shards
        .iter()
        .map(|shard| BeginRequest {
            load: shard.load.clone(),
            target: local.clone(),
            mode: req.mode,
            visibility: req.visibility,
            host: shard.host.clone(),
            allow_materialized_views: req.allow_materialized_views,
            clickhouse_local_version: req.clickhouse_local_version.clone(),
            staging: reach.staging(&shard.host),
            shard_of: Some(ShardOf {
                parent: req.load.clone(),
                shard_num: shard.shard_num,
                url: shard.url.clone(),
            }),
            inputs: None,
        })
        .collect();
    let mut shards_seen = Vec::with_capacity(subs.len());
    for ((shard, server), sub) in cluster.shards.iter().zip(&servers).zip(&subs) {
        let info = server
            .table_definition(sub.target.database.as_str(), sub.target.table.as_str())
            .await
            .map_err(|e| shard_error(shard, e.into()))?;
        crate::begin::check_grants(ledger, server.as_ref(), sub, info.as_ref().map(|d| &d.info))
            .await
            .map_err(|e| shard_error(shard, e))?;
        shards_seen.push(info);
    }
    for (((shard, server), sub), info) in cluster
        .shards
        .iter()
        .zip(&servers)
        .zip(&subs)
        .zip(shards_seen)
    {
        // Granted: checked on every shard just above.
        crate::begin::begin_granted(ledger, server.as_ref(), sub, info)
            .await
            .map_err(|e| shard_error(shard, e))?;
    }
    let target_snapshot = TableSnapshot::from_server(info, &seen.columns);
    let spec = LoadSpec {
        load: req.load.clone(),
        target: target.clone(),
        mode: req.mode,
        visibility: req.visibility,
        publish: local,
        target_snapshot,
        publish_snapshot: reference.snapshot,
        // Shard 1's, for operators: every build checks its clickhouse-local against each
        // shard's own version (recorded in the shard's sub-load).
        server_version: reference.version,
        server_timezone: Some(reference.timezone),
        clickhouse_local_version: req.clickhouse_local_version.clone(),
        host: req.host.clone(),
        publish_disks: Vec::new(),
        cluster: Some(cluster),
        shard_of: None,
        inputs: req.inputs.clone(),
        // The ledger server's clock, as every entry's `written_at`: gc ages the load by it.
        opened_at_unix_ms: ledger.server_now_ms().await?,
    };
    crate::begin::open_load(ledger, req, spec).await
}

// ---------------------------------------------------------------------------------------------
// Commit
// ---------------------------------------------------------------------------------------------

/// The connections a shard's sub-load is committed, aborted or cleaned with.
pub struct ShardEnv {
    /// The shard.
    pub shard: ShardSpec,
    /// Its server.
    pub server: SharedServer,
    /// Its filesystem.
    pub fs: Arc<dyn RemoteFs>,
    /// Its configured staging root (for loads that did not record theirs).
    pub staging: chpart_core::StagingLayout,
}

/// A shard's host whose filesystem could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("shard {shard_num} ({host}): cannot reach its filesystem: {source}")]
pub struct ShardUnreachable {
    /// The shard.
    pub shard_num: u32,
    /// Its host.
    pub host: String,
    /// Why.
    pub source: Box<RemoteError>,
}

/// Connects to every shard of `cluster`; an unreachable host is an error naming the shard.
pub fn shard_envs(
    reach: &dyn Reach,
    cluster: &ClusterSpec,
) -> Result<Vec<ShardEnv>, ShardUnreachable> {
    cluster
        .shards
        .iter()
        .map(|shard| {
            let fs = reach
                .connect(&shard.host, 1)
                .map_err(|e| ShardUnreachable {
                    shard_num: shard.shard_num,
                    host: shard.host.clone(),
                    source: Box::new(e),
                })?
                .remove(0);
            let staging =
                chpart_core::StagingLayout::new(reach.staging(&shard.host).single.as_str())
                    .expect("a RemotePath is a valid staging root");
            Ok(ShardEnv {
                server: reach.server(&shard.url),
                shard: shard.clone(),
                fs,
                staging,
            })
        })
        .collect()
}

fn on_shard(shard: &ShardSpec, source: CommitError) -> CommitError {
    CommitError::Shard {
        shard_num: shard.shard_num,
        host: shard.host.clone(),
        source: Box::new(source),
    }
}

/// Commits a cluster load (see the module doc), or finishes one that was interrupted: with
/// `req.winners` the lines the builds printed (one per Spark partition), without them from the
/// recorded cluster plan.
pub async fn commit_cluster(
    ledger: &Ledger,
    reach: &dyn Reach,
    req: CommitRequest,
) -> Result<CommitOutcome, CommitError> {
    let started = std::time::Instant::now();
    let load = req.load.clone();
    let view = ledger.view(&load, crate::KNOWN_KINDS).await?;
    let spec = match (&view.state, &view.spec) {
        (LoadState::Aborted, _) => return Err(CommitError::Aborted(load)),
        (_, None) | (LoadState::Unknown, _) => return Err(CommitError::NotBegun(load)),
        (_, Some(spec)) => spec.clone(),
    };
    let cluster = spec
        .cluster
        .clone()
        .expect("commit_cluster is called for cluster loads");
    if view.state == LoadState::Committed {
        let summary: Option<CommitSummary> = view
            .body_of_kind(kind::LOAD_COMMITTED)
            .map_err(|e| CommitError::Ledger(e.into()))?;
        return Ok(CommitOutcome {
            summary: summary.ok_or(CommitError::NotBegun(load))?,
            already_committed: true,
            attached_now: 0,
            seconds: started.elapsed().as_secs_f64(),
        });
    }

    // The plan: the winners of every shard, once per load.
    let recorded: Option<ClusterPlan> = view
        .body_of_kind(kind::CLUSTER_PLANNED)
        .map_err(|e| CommitError::Ledger(e.into()))?;
    let lines: Vec<(usize, String)> = match (&req.winners, &recorded) {
        (Some(lines), _) => lines.clone(),
        (None, Some(plan)) => plan
            .lines
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, l)| (i + 1, l))
            .collect(),
        (None, None) => return Err(CommitError::NoPlan { load }),
    };
    let mut parsed = Vec::new();
    let mut problems = Vec::new();
    for (line, text) in &lines {
        match ClusterManifest::from_json(text, &cluster) {
            Ok(m) if m.load != load => problems.push(format!(
                "line {line}: cluster manifest of load {}, not of this load",
                m.load
            )),
            Ok(m) => parsed.push((*line, m)),
            Err(e) => problems.push(format!("line {line}: {e}")),
        }
    }
    if !problems.is_empty() {
        return Err(CommitError::ClusterWinners { load, problems });
    }
    let mut winners = BTreeMap::new();
    for (line, m) in &parsed {
        if let Some(other) = winners.insert(m.attempt.partition, m.attempt.id.clone()) {
            problems.push(format!(
                "line {line}: partition {} has two winners ({other} and {})",
                m.attempt.partition, m.attempt.id
            ));
        }
    }
    if !problems.is_empty() {
        return Err(CommitError::ClusterWinners { load, problems });
    }
    let plan = ClusterPlan {
        winners: winners.clone(),
        lines: lines.iter().map(|(_, l)| l.clone()).collect(),
    };
    if recorded.is_none() {
        ledger
            .append_once(
                &load,
                entry::CLUSTER_PLAN,
                kind::CLUSTER_PLANNED,
                &serde_json::to_string(&plan).expect("a plan serializes"),
            )
            .await?;
    }
    let view = ledger.view(&load, crate::KNOWN_KINDS).await?;
    let kept: ClusterPlan = view
        .body_of_kind(kind::CLUSTER_PLANNED)
        .map_err(|e| CommitError::Ledger(e.into()))?
        .ok_or_else(|| CommitError::NoPlan { load: load.clone() })?;
    if kept.winners != winners {
        return Err(CommitError::ClusterPlanConflict {
            load,
            recorded: describe_winners(&kept.winners),
            given: describe_winners(&winners),
        });
    }

    let envs = shard_envs(reach, &cluster).map_err(|e| CommitError::Shard {
        shard_num: e.shard_num,
        host: e.host.clone(),
        source: Box::new(CommitError::Unreachable {
            host: e.host,
            source: e.source,
        }),
    })?;
    // Replace: every partition the load's rows fall into, on any shard; each shard replaces
    // all of them (those its winners put no rows in by nothing), so a reload leaves no row of
    // a replaced partition on a shard its new rows were not routed to.
    let replaced: Option<BTreeSet<PartitionId>> = (spec.mode == Mode::Replace).then(|| {
        parsed
            .iter()
            .flat_map(|(_, m)| m.shards.values())
            .flat_map(|m| m.parts.iter().map(|p| p.partition_id.clone()))
            .collect()
    });
    let shard_lines = |shard: u32| -> Vec<(usize, String)> {
        parsed
            .iter()
            .map(|(line, m)| (*line, m.shards[&shard].to_json_line()))
            .collect()
    };
    let request = |shard: u32, prepare_only: bool| CommitRequest {
        load: cluster
            .shard(shard)
            .expect("a shard of the cluster")
            .load
            .clone(),
        winners: prepare_only.then(|| shard_lines(shard)),
        verify: req.verify,
        expected_partitions: req.expected_partitions,
        allow_missing: req.allow_missing,
        visibility: req.visibility,
        prepare_only,
        replaced_on_every_shard: replaced.clone(),
    };
    // Each shard's commit is a task of its own: its filesystem calls block (block_in_place),
    // and one shard's must not hold up the others'.
    let run = |prepare_only: bool| {
        let tasks: Vec<_> = envs
            .iter()
            .map(|env| {
                let request = request(env.shard.shard_num, prepare_only);
                let (ledger, shard) = (ledger.clone(), env.shard.clone());
                let (server, fs, staging) =
                    (env.server.clone(), env.fs.clone(), env.staging.clone());
                tokio::spawn(async move {
                    // Shards verify in parallel with each other, each over its one
                    // connection.
                    let commit_env = CommitEnv {
                        ledger: &ledger,
                        server: server.as_ref(),
                        fs: fs.as_ref(),
                        staging,
                        more: None,
                    };
                    commit(&commit_env, request)
                        .await
                        .map_err(|e| on_shard(&shard, e))
                })
            })
            .collect();
        join_all(tasks.into_iter().map(|task| async move {
            task.await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        }))
    };
    // Phase 1: every shard checks its winners, tables and parts and records its plan; nothing
    // is visible anywhere yet, so a shard that fails here leaves every shard as it was.
    for result in run(true).await {
        result?;
    }
    // The cluster load is this commit's: an abort that came first stops it before anything
    // is visible; after this no abort removes anything of any shard.
    ledger.decide(&load, Decision::Commit).await?;
    let view = ledger.view(&load, crate::KNOWN_KINDS).await?;
    if view.decision != Some(Decision::Commit) {
        return Err(CommitError::Aborted(load));
    }
    crash_point("after-cluster-decision");
    // Phase 2: every shard's sub-load commits (each resumable on its own).
    let mut outcomes = Vec::new();
    let mut failed = Vec::new();
    for result in run(false).await {
        match result {
            Ok(outcome) => outcomes.push(outcome),
            Err(e) => failed.push(e),
        }
    }
    if let Some(first) = failed.into_iter().next() {
        return Err(first);
    }
    let summary = CommitSummary {
        load: load.clone(),
        table: spec.target.clone(),
        mode: spec.mode,
        visibility: spec.visibility,
        partitions: outcomes.iter().map(|o| o.summary.partitions).sum(),
        parts: outcomes.iter().map(|o| o.summary.parts).sum(),
        rows: outcomes.iter().map(|o| o.summary.rows).sum(),
        winners: winners.into_iter().collect(),
    };
    crash_point("before-cluster-commit");
    ledger
        .append(
            &load,
            entry::COMMIT,
            kind::LOAD_COMMITTED,
            &serde_json::to_string(&summary).expect("a summary serializes"),
        )
        .await?;
    Ok(CommitOutcome {
        summary,
        already_committed: false,
        attached_now: outcomes.iter().map(|o| o.attached_now).sum(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn describe_winners(winners: &BTreeMap<u32, AttemptId>) -> String {
    winners
        .iter()
        .map(|(p, a)| format!("{p}: {a}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Ends a cluster load: claims it for abort (refused when a commit claimed it first), then
/// aborts every shard's sub-load on its own server.
pub async fn abort_cluster(
    ledger: &Ledger,
    reach: &dyn Reach,
    spec: &LoadSpec,
    force: bool,
) -> Result<Vec<(u32, Vec<crate::cleanup::Removal>)>, crate::cleanup::CleanupError> {
    use crate::cleanup::CleanupError;
    let cluster = spec.cluster.as_ref().expect("a cluster load");
    let load = &spec.load;
    let view = ledger.view(load, crate::KNOWN_KINDS).await?;
    if view.state == LoadState::Committed {
        return Err(CleanupError::Committed(load.clone()));
    }
    if view.state == LoadState::Open {
        if force && view.decision == Some(Decision::Commit) {
            let body = serde_json::json!({ "abandoned_at_unix_ms": now_unix_ms() }).to_string();
            ledger
                .append(load, entry::ABANDON, kind::LOAD_ABANDONED, &body)
                .await?;
        } else {
            ledger.decide(load, Decision::Abort).await?;
            let view = ledger.view(load, crate::KNOWN_KINDS).await?;
            match (&view.state, view.decision) {
                (LoadState::Committed, _) => return Err(CleanupError::Committed(load.clone())),
                (_, Some(Decision::Commit)) => {
                    return Err(CleanupError::CommitInProgress(load.clone()))
                }
                _ => {}
            }
            let body = serde_json::json!({ "aborted_at_unix_ms": now_unix_ms() }).to_string();
            ledger
                .append(load, entry::ABORT, kind::LOAD_ABORTED, &body)
                .await?;
        }
    }
    let envs = shard_envs(reach, cluster).map_err(|e| CleanupError::Remote {
        op: format!("connect to shard {} ({})", e.shard_num, e.host),
        source: e.source,
    })?;
    let mut out = Vec::new();
    for env in &envs {
        let removed = crate::cleanup::abort_on(
            ledger,
            env.server.as_ref(),
            env.fs.as_ref(),
            &env.staging,
            &env.shard.load,
            force,
        )
        .await?;
        out.push((env.shard.shard_num, removed));
    }
    Ok(out)
}
