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

use std::collections::BTreeMap;
use std::sync::Arc;

use chpart_core::routing::{DistributedEngine, Routing, RoutingError, ShardWeight, ShardingKey};
use chpart_core::{Attempt, AttemptId, IdError, LoadId, Manifest, StagingRoots, TableRef};
use chpart_remote::{RemoteError, RemoteFs};
use chpart_server::{ClickHouseServer, SharedServer, TableInfo};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::begin::{begin_on, BeginError, BeginOutcome, BeginRequest};
use crate::commit::{commit, CommitEnv, CommitError, CommitOutcome, CommitRequest, CommitSummary};
use crate::ledger::{entry, kind, Decision, LoadSpec, LoadState, Mode};
use crate::snapshot::TableSnapshot;
use crate::store::{now_unix_ms, Ledger};

/// What `begin` records about the cluster of a load into a Distributed table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// The cluster's name (`Distributed(cluster, ...)`).
    pub cluster: String,
    /// The shards' local table.
    pub local: TableRef,
    /// The sharding key, verbatim SQL over the local table's columns (`None`: no key; then
    /// the cluster has one shard).
    pub sharding_key: Option<String>,
    /// The key's result type as the server computes it (`toTypeName`).
    pub key_type: Option<String>,
    /// The shards in config order.
    pub shards: Vec<ShardSpec>,
}

/// One shard of a cluster load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardSpec {
    /// `system.clusters.shard_num`.
    pub shard_num: u32,
    /// Its weight.
    pub weight: u32,
    /// Its host as the cluster names it.
    pub host: String,
    /// The HTTP endpoint `begin` reached it at.
    pub url: String,
    /// The shard's sub-load: an ordinary load of the local table on this shard.
    pub load: LoadId,
}

/// On a shard's sub-load: the cluster load and the shard it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardOf {
    /// The cluster load.
    pub parent: LoadId,
    /// The shard.
    pub shard_num: u32,
    /// The shard's HTTP endpoint.
    pub url: String,
}

impl ClusterSpec {
    /// What decides each row's shard.
    pub fn routing(&self) -> Routing {
        Routing {
            key: self
                .sharding_key
                .as_ref()
                .zip(self.key_type.as_ref())
                .map(|(sql, type_name)| ShardingKey {
                    sql: sql.clone(),
                    type_name: type_name.clone(),
                }),
            shards: self
                .shards
                .iter()
                .map(|s| ShardWeight {
                    shard_num: s.shard_num,
                    weight: s.weight,
                })
                .collect(),
        }
    }

    /// The shard `shard_num`.
    pub fn shard(&self, shard_num: u32) -> Option<&ShardSpec> {
        self.shards.iter().find(|s| s.shard_num == shard_num)
    }
}

/// The id of shard `shard_num`'s sub-load of `load`: `<load>.shard<N>`.
pub fn shard_load(load: &LoadId, shard_num: u32) -> Result<LoadId, IdError> {
    format!("{load}.shard{shard_num}").parse()
}

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

fn refuse(table: &TableRef, message: impl Into<String>) -> BeginError {
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
struct ShardFacts {
    snapshot: TableSnapshot,
    version: String,
    timezone: String,
}

async fn shard_facts(
    server: &dyn ClickHouseServer,
    local: &TableRef,
) -> Result<ShardFacts, BeginError> {
    let (db, table) = (local.database.as_str(), local.table.as_str());
    let info = server
        .table_info(db, table)
        .await?
        .ok_or_else(|| BeginError::TableMissing {
            table: local.clone(),
            endpoint: server.endpoint().to_owned(),
        })?;
    Ok(ShardFacts {
        snapshot: TableSnapshot::from_server(&info, &server.columns(db, table).await?),
        version: server.version().await?,
        timezone: server.timezone().await?,
    })
}

/// `begin` of a load into the Distributed table `req.target` (described by `info`, read from
/// the ledger's server): see the module doc. Re-running it for an open load with the same
/// request is a no-op, as for one table.
pub async fn begin_cluster(
    ledger: &Ledger,
    reach: &dyn Reach,
    req: &BeginRequest,
    info: &TableInfo,
) -> Result<BeginOutcome, BeginError> {
    let server = ledger.server();
    ledger.ensure().await?;
    let view = ledger.view(&req.load, crate::KNOWN_KINDS).await?;
    if let Some(outcome) = crate::begin::existing_outcome(&view.state, view.spec.as_ref(), req)? {
        return Ok(outcome);
    }
    let target = &req.target;
    let engine =
        DistributedEngine::parse(&info.engine_full).map_err(|e| refuse(target, e.to_string()))?;
    if req.mode == Mode::Replace {
        return Err(refuse(
            target,
            "replace mode is not supported for Distributed tables yet (append only); replace the partitions of each shard's local table with a load per shard",
        ));
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

    // One sub-load per shard; a re-run after a crash finds the open ones as they were.
    for (shard, server) in cluster.shards.iter().zip(&servers) {
        let sub = BeginRequest {
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
        };
        begin_on(ledger, server.as_ref(), &sub)
            .await
            .map_err(|e| shard_error(shard, e))?;
    }
    let target_snapshot = TableSnapshot::from_server(
        info,
        &server
            .columns(target.database.as_str(), target.table.as_str())
            .await?,
    );
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
        opened_at_unix_ms: now_unix_ms(),
    };
    crate::begin::open_load(ledger, req, spec).await
}

// ---------------------------------------------------------------------------------------------
// The attempt's output: one manifest per shard
// ---------------------------------------------------------------------------------------------

/// The value of a cluster manifest's `format` field.
pub const CLUSTER_MANIFEST_FORMAT: &str = "chpart-cluster-manifest";

/// What one attempt of a cluster load built: a manifest per shard (for the shard's sub-load),
/// printed by `build` as one JSON line and committed as one winner line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterManifest {
    /// The cluster load.
    pub load: LoadId,
    /// The attempt (every shard manifest's).
    pub attempt: Attempt,
    /// Per shard number, the shard's manifest.
    pub shards: BTreeMap<u32, Manifest>,
}

impl ClusterManifest {
    /// One line of JSON: `{"format":"chpart-cluster-manifest","version":1,"load":..,
    /// "shards":[{"shard":1,"manifest":{...}}, ...]}`.
    pub fn to_json_line(&self) -> String {
        let shards: Vec<Value> = self
            .shards
            .iter()
            .map(|(shard, m)| {
                let manifest: Value =
                    serde_json::from_str(&m.to_json_line()).expect("a manifest is JSON");
                serde_json::json!({ "shard": shard, "manifest": manifest })
            })
            .collect();
        serde_json::json!({
            "format": CLUSTER_MANIFEST_FORMAT,
            "version": 1,
            "load": self.load,
            "attempt": self.attempt,
            "shards": shards,
        })
        .to_string()
    }

    /// Reads a line [`ClusterManifest::to_json_line`] wrote; every shard manifest is read as
    /// strictly as a single-table one, and must be of `cluster`'s sub-load of that shard and of
    /// one attempt. Every shard of the cluster must be there.
    pub fn from_json(text: &str, cluster: &ClusterSpec) -> Result<ClusterManifest, String> {
        let raw: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        if raw.get("format").and_then(Value::as_str) != Some(CLUSTER_MANIFEST_FORMAT) {
            return Err(format!(
                "not a cluster manifest (field `format` is not \"{CLUSTER_MANIFEST_FORMAT}\"); a load into a Distributed table commits the lines its builds printed"
            ));
        }
        if raw.get("version").and_then(Value::as_u64) != Some(1) {
            return Err("unsupported cluster manifest version (this chpart reads 1)".into());
        }
        let load: LoadId = raw
            .get("load")
            .and_then(Value::as_str)
            .ok_or("no load")?
            .parse()
            .map_err(|e: IdError| e.to_string())?;
        let attempt: Attempt =
            serde_json::from_value(raw.get("attempt").cloned().ok_or("no attempt")?)
                .map_err(|e| format!("attempt: {e}"))?;
        let mut shards = BTreeMap::new();
        for entry in raw
            .get("shards")
            .and_then(Value::as_array)
            .ok_or("no shards")?
        {
            let shard = entry
                .get("shard")
                .and_then(Value::as_u64)
                .and_then(|s| u32::try_from(s).ok())
                .ok_or("a shard entry without a shard number")?;
            let spec = cluster.shard(shard).ok_or_else(|| {
                format!(
                    "shard {shard} is not a shard of cluster {}",
                    cluster.cluster
                )
            })?;
            let manifest = Manifest::from_json(
                &entry
                    .get("manifest")
                    .ok_or_else(|| format!("shard {shard}: no manifest"))?
                    .to_string(),
            )
            .map_err(|e| format!("shard {shard}: {e}"))?;
            if manifest.load != spec.load {
                return Err(format!(
                    "shard {shard}: manifest of load {}, not of {} (this load's shard {shard})",
                    manifest.load, spec.load
                ));
            }
            if manifest.attempt != attempt {
                return Err(format!(
                    "shard {shard}: manifest of attempt {} (partition {}), but the line is attempt {}'s (partition {})",
                    manifest.attempt.id, manifest.attempt.partition, attempt.id, attempt.partition
                ));
            }
            if shards.insert(shard, manifest).is_some() {
                return Err(format!("shard {shard} is listed twice"));
            }
        }
        if let Some(missing) = cluster
            .shards
            .iter()
            .find(|s| !shards.contains_key(&s.shard_num))
        {
            return Err(format!("shard {} has no manifest", missing.shard_num));
        }
        Ok(ClusterManifest {
            load,
            attempt,
            shards,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Commit
// ---------------------------------------------------------------------------------------------

/// The plan of a cluster load: the winners' cluster manifests, kept once per load by the
/// server, so every shard commits the same winners whatever drivers race.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterPlan {
    /// The winning attempt of each Spark partition.
    pub winners: BTreeMap<u32, AttemptId>,
    /// The winners' lines, as committed.
    pub lines: Vec<String>,
}

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
    crate::observe::crash_point("after-cluster-decision");
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
    crate::observe::crash_point("before-cluster-commit");
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

/// `begin` of any load: into a Distributed table ([`begin_cluster`]) or into one table on the
/// ledger's server ([`crate::begin::begin`]).
pub async fn begin_load(
    ledger: &Ledger,
    reach: &dyn Reach,
    req: &BeginRequest,
) -> Result<BeginOutcome, BeginError> {
    crate::events::Step::start(&req.load, "begin").end(begin_any(ledger, reach, req).await)
}

async fn begin_any(
    ledger: &Ledger,
    reach: &dyn Reach,
    req: &BeginRequest,
) -> Result<BeginOutcome, BeginError> {
    let (db, table) = (req.target.database.as_str(), req.target.table.as_str());
    match ledger.server().table_info(db, table).await? {
        Some(info) if info.engine == "Distributed" => {
            begin_cluster(ledger, reach, req, &info).await
        }
        _ => crate::begin::begin(ledger, req).await,
    }
}

/// `commit` of any load: a cluster load ([`commit_cluster`]) or a load of one table
/// ([`commit`] with `env`). A shard's sub-load is committed through its cluster load only.
pub async fn commit_load(
    reach: &dyn Reach,
    env: &CommitEnv<'_>,
    req: CommitRequest,
) -> Result<CommitOutcome, CommitError> {
    let view = env.ledger.view(&req.load, crate::KNOWN_KINDS).await?;
    match view.spec.as_ref() {
        Some(spec) if spec.cluster.is_some() => commit_cluster(env.ledger, reach, req).await,
        Some(LoadSpec {
            shard_of: Some(of), ..
        }) => Err(CommitError::ShardOfCluster {
            load: req.load.clone(),
            shard_num: of.shard_num,
            parent: of.parent.clone(),
        }),
        _ => crate::commit::commit_viewed(env, req, view).await,
    }
}

/// [`commit_load`], run again after a retryable failure until `policy`'s deadline. A commit
/// resumes at any step (its plan, claims and progress are in the ledger, and every step starts
/// from a fresh observation of the servers), so running it again is how a MOVE whose answer
/// was lost, or a server that restarted mid-commit, is reconciled within one command: what
/// happened is read back, nothing is resent blindly. Other failures, and the last one after
/// the deadline, are returned.
pub async fn commit_load_retrying(
    reach: &dyn Reach,
    env: &CommitEnv<'_>,
    req: CommitRequest,
    policy: chpart_core::retry::RetryPolicy,
) -> Result<CommitOutcome, CommitError> {
    let started = std::time::Instant::now();
    let mut backoff = policy.backoff(chpart_core::retry::clock_seed());
    loop {
        let error = match commit_load(reach, env, req.clone()).await {
            Ok(outcome) => return Ok(outcome),
            Err(e) if e.kind() == crate::FailureKind::Retryable => e,
            Err(e) => return Err(e),
        };
        let Some(delay) = backoff.next_delay(started.elapsed()) else {
            return Err(error);
        };
        tracing::warn!(
            "commit of load {}: resuming ({}) in {:.2} s after a retryable failure: {error}",
            req.load,
            backoff.retries(),
            delay.as_secs_f64()
        );
        tracing::info!(
            target: chpart_core::events::TARGET,
            load = req.load.as_str(),
            step = "retry",
            outcome = chpart_core::events::RETRYING,
            retry = backoff.retries(),
            duration_ms = delay.as_secs_f64() * 1e3,
            error = format!("commit: {error}"),
        );
        tokio::time::sleep(delay).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The topology a load would use (`chpart plan`)
// ---------------------------------------------------------------------------------------------

/// One host a load of a table would publish on, as `chpart plan` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct HostPlan {
    /// The shard's number (1 for a table on one server).
    pub shard_num: u32,
    /// Its weight (1 for a table on one server).
    pub weight: u32,
    /// The host name.
    pub host: String,
    /// The HTTP endpoint.
    pub url: String,
    /// The server's version, if it answered.
    pub version: Option<String>,
    /// The table's fingerprint there.
    pub fingerprint: Option<String>,
    /// The disks parts would go to, with data paths and staging roots.
    pub disks: Vec<chpart_core::DiskPlace>,
    /// Whether chpart reached the host's filesystem.
    pub filesystem_reachable: bool,
    /// The table's partition and sorting keys there, if it answered (shown once, in
    /// [`Topology`]).
    #[serde(skip)]
    pub keys: Option<(String, String)>,
    /// What is wrong with this host (unreachable server or filesystem, another definition,
    /// no local disk to stage on, ...). Empty: ready.
    pub problems: Vec<String>,
}

/// The topology of a load of a table, resolved before anything is written.
#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    /// The table.
    pub table: String,
    /// Its engine.
    pub engine: String,
    /// For a Distributed table: its cluster.
    pub cluster: Option<String>,
    /// For a Distributed table: the shards' local table.
    pub local: Option<String>,
    /// The sharding key and its type.
    pub sharding_key: Option<String>,
    /// The key's result type.
    pub key_type: Option<String>,
    /// What decides each row's shard, as clickhouse-local evaluates it.
    pub routing: Option<String>,
    /// The MergeTree table's `PARTITION BY` (`system.tables.partition_key`; for a Distributed
    /// table its local table's, from the first shard that answered), e.g. `toYYYYMMDD(ts)`;
    /// empty when unpartitioned. What a Spark write clusters its rows by.
    pub partition_key: Option<String>,
    /// Its `ORDER BY` (`system.tables.sorting_key`), e.g. `kind, id`. What a Spark write sorts by.
    pub sorting_key: Option<String>,
    /// Every host parts would go to, in shard order.
    pub hosts: Vec<HostPlan>,
    /// Problems of the table as a whole (e.g. an unsupported key type).
    pub problems: Vec<String>,
}

impl Topology {
    /// Whether a load could begin now: no problem anywhere.
    pub fn ready(&self) -> bool {
        self.problems.is_empty() && self.hosts.iter().all(|h| h.problems.is_empty())
    }
}

/// What one host says about `table` for [`plan`].
async fn plan_host(reach: &dyn Reach, mut host: HostPlan, table: &TableRef) -> HostPlan {
    let server = reach.server(&host.url);
    match shard_facts(server.as_ref(), table).await {
        Ok(facts) => {
            host.version = Some(facts.version);
            host.fingerprint = Some(facts.snapshot.fingerprint.to_string());
            host.keys = Some((
                facts.snapshot.shape.partition_key.clone(),
                facts.snapshot.shape.sorting_key.clone(),
            ));
            let disks = async {
                let disks: Vec<chpart_core::DiskInfo> = server
                    .disks()
                    .await?
                    .into_iter()
                    .map(|d| chpart_core::DiskInfo {
                        local: d.disk_type == "Local" && !d.is_remote,
                        name: d.name,
                        path: d.path,
                    })
                    .collect();
                let volumes: Vec<chpart_core::VolumeInfo> = server
                    .policy_volumes(&facts.snapshot.storage_policy)
                    .await?
                    .into_iter()
                    .map(|v| chpart_core::VolumeInfo {
                        name: v.volume_name,
                        priority: v.volume_priority,
                        disks: v.disks,
                    })
                    .collect();
                Ok::<_, chpart_server::ServerError>((disks, volumes))
            }
            .await;
            match disks {
                Ok((disks, volumes)) => match chpart_core::publish_disks(
                    &facts.snapshot.storage_policy,
                    &facts.snapshot.data_paths,
                    &disks,
                    &volumes,
                    &reach.staging(&host.host),
                ) {
                    Ok(places) => host.disks = places,
                    Err(e) => host.problems.push(e.to_string()),
                },
                Err(e) => host.problems.push(e.to_string()),
            }
        }
        Err(e) => host.problems.push(format!("server {}: {e}", host.url)),
    }
    let fs = tokio::task::block_in_place(|| reach.connect(&host.host, 1));
    match fs {
        Ok(fs) => {
            host.filesystem_reachable = true;
            for disk in &host.disks {
                let root = disk.staging_root.as_str();
                let parent = disk.staging_root.parent();
                // The root is made on first use; its parent must exist.
                let exists = tokio::task::block_in_place(|| {
                    Ok::<_, RemoteError>(
                        fs[0].stat(root)?.is_some()
                            || parent.map_or(Ok(false), |p| {
                                fs[0].stat(p.as_str()).map(|s| s.is_some())
                            })?,
                    )
                });
                match exists {
                    Ok(true) => {}
                    Ok(false) => host.problems.push(format!(
                        "staging root {root} (disk {}) cannot be made: its parent does not exist",
                        disk.disk
                    )),
                    Err(e) => host.problems.push(format!("staging root {root}: {e}")),
                }
            }
        }
        Err(e) => host.problems.push(format!("filesystem: {e}")),
    }
    host
}

/// Resolves what a load of `table` would use, reaching every host, writing nothing: the
/// cluster's shards with weights, hosts, URLs, versions, the table's definition on each, the
/// disks parts would go to with their staging roots, and whether every host's server and
/// filesystem answer.
pub async fn plan(
    server: &dyn ClickHouseServer,
    reach: &dyn Reach,
    table: &TableRef,
    host_name: &str,
) -> Result<Topology, BeginError> {
    let (db, name) = (table.database.as_str(), table.table.as_str());
    let info = server
        .table_info(db, name)
        .await?
        .ok_or_else(|| BeginError::TableMissing {
            table: table.clone(),
            endpoint: server.endpoint().to_owned(),
        })?;
    let mut topology = Topology {
        table: table.to_string(),
        engine: info.engine.clone(),
        cluster: None,
        local: None,
        sharding_key: None,
        key_type: None,
        routing: None,
        partition_key: None,
        sorting_key: None,
        hosts: Vec::new(),
        problems: Vec::new(),
    };
    let host = |shard_num, weight, host: &str, url: String| HostPlan {
        shard_num,
        weight,
        host: host.to_owned(),
        url,
        version: None,
        fingerprint: None,
        disks: Vec::new(),
        filesystem_reachable: false,
        keys: None,
        problems: Vec::new(),
    };
    if info.engine != "Distributed" {
        topology.partition_key = Some(info.partition_key.clone());
        topology.sorting_key = Some(info.sorting_key.clone());
        let one = host(1, 1, host_name, server.endpoint().to_owned());
        topology.hosts.push(plan_host(reach, one, table).await);
        return Ok(topology);
    }
    let engine =
        DistributedEngine::parse(&info.engine_full).map_err(|e| refuse(table, e.to_string()))?;
    let local: TableRef = format!("{}.{}", engine.database, engine.table)
        .parse()
        .map_err(|e: IdError| refuse(table, format!("its local table: {e}")))?;
    topology.cluster = Some(engine.cluster.clone());
    topology.local = Some(local.to_string());
    topology.sharding_key = engine.sharding_key.clone();
    let replicas = server.cluster_replicas(&engine.cluster).await?;
    if replicas.is_empty() {
        topology.problems.push(format!(
            "cluster {} is not in system.clusters",
            engine.cluster
        ));
    }
    if let Some(r) = replicas.iter().find(|r| r.replica_num > 1) {
        topology.problems.push(format!(
            "shard {} has more than one replica: replicated shards are not supported",
            r.shard_num
        ));
    }
    let ports = server.cluster_http_ports(&engine.cluster).await?;
    let mut hosts = Vec::new();
    for r in replicas.iter().filter(|r| r.replica_num == 1) {
        let url = reach.url(&r.host_name).or_else(|| {
            ports
                .iter()
                .find(|p| p.shard_num == r.shard_num && p.tcp_port == r.port)
                .map(|p| format!("http://{}:{}", r.host_name, p.http_port))
        });
        let mut plan = host(
            r.shard_num,
            r.shard_weight,
            &r.host_name,
            url.clone().unwrap_or_default(),
        );
        match url {
            Some(_) => hosts.push(plan),
            None => {
                plan.problems.push(format!(
                    "did not answer through cluster {} (TCP port {})",
                    engine.cluster, r.port
                ));
                topology.hosts.push(plan);
            }
        }
    }
    let planned = join_all(hosts.into_iter().map(|h| plan_host(reach, h, &local))).await;
    topology.hosts.extend(planned);
    topology.hosts.sort_by_key(|h| h.shard_num);
    let fingerprints: std::collections::BTreeSet<&String> = topology
        .hosts
        .iter()
        .filter_map(|h| h.fingerprint.as_ref())
        .collect();
    if fingerprints.len() > 1 {
        topology.problems.push(format!(
            "the shards' {local} differ: fingerprints {}",
            topology
                .hosts
                .iter()
                .map(|h| format!(
                    "shard {}: {}",
                    h.shard_num,
                    h.fingerprint.as_deref().unwrap_or("?")
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let reachable = topology.hosts.iter().find(|h| h.version.is_some());
    if let Some((partition_key, sorting_key)) = reachable.and_then(|h| h.keys.clone()) {
        topology.partition_key = Some(partition_key);
        topology.sorting_key = Some(sorting_key);
    }
    if let (Some(key), Some(first)) = (&engine.sharding_key, reachable) {
        if topology.hosts.len() > 1 {
            match reach
                .server(&first.url)
                .type_of(key, local.database.as_str(), local.table.as_str())
                .await
            {
                Ok(t) => topology.key_type = Some(t),
                Err(e) => topology.problems.push(format!("sharding key {key}: {e}")),
            }
        }
    }
    let routing = Routing {
        key: engine
            .sharding_key
            .clone()
            .zip(topology.key_type.clone())
            .map(|(sql, type_name)| ShardingKey { sql, type_name }),
        shards: topology
            .hosts
            .iter()
            .map(|h| ShardWeight {
                shard_num: h.shard_num,
                weight: h.weight,
            })
            .collect(),
    };
    match routing.slot_sql() {
        Ok(sql) => topology.routing = Some(sql),
        Err(e) => topology.problems.push(e.to_string()),
    }
    Ok(topology)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chpart_core::manifest::Target;

    fn cluster() -> ClusterSpec {
        ClusterSpec {
            cluster: "c".into(),
            local: "db.local".parse().unwrap(),
            sharding_key: Some("id".into()),
            key_type: Some("UInt64".into()),
            shards: (1..=2)
                .map(|n| ShardSpec {
                    shard_num: n,
                    weight: 1,
                    host: format!("ch-{n}"),
                    url: format!("http://ch-{n}:8123"),
                    load: shard_load(&"L".parse().unwrap(), n).unwrap(),
                })
                .collect(),
        }
    }

    fn attempt(id: &str, partition: u32) -> Attempt {
        Attempt {
            id: id.parse().unwrap(),
            partition,
            stage: None,
            stage_attempt: None,
            attempt_number: None,
        }
    }

    /// A shard manifest without parts (valid on its own) of `load` by `attempt`.
    fn manifest(load: &str, attempt: Attempt) -> Manifest {
        let staging = format!("/staging/{load}/{}", attempt.id);
        Manifest {
            load: load.parse().unwrap(),
            attempt,
            target: Target {
                database: "db".parse().unwrap(),
                table: "local".parse().unwrap(),
                host: "ch".into(),
                disk: "default".into(),
                data_path: "/var/lib/clickhouse/store/abc/abcd".parse().unwrap(),
                staging_dir: staging.parse().unwrap(),
                other_disks: Vec::new(),
            },
            table_fingerprint: format!("sha256:{}", "cd".repeat(32)).parse().unwrap(),
            clickhouse_local_version: "26.9.2.1".into(),
            source_rows: 0,
            ttl_removed_rows: 0,
            created_at_unix_ms: 1,
            phases: Default::default(),
            parts: Vec::new(),
        }
    }

    fn line(edit: impl FnOnce(&mut ClusterManifest)) -> String {
        let a = attempt("app.1", 0);
        let mut m = ClusterManifest {
            load: "L".parse().unwrap(),
            attempt: a.clone(),
            shards: [
                (1, manifest("L.shard1", a.clone())),
                (2, manifest("L.shard2", a)),
            ]
            .into_iter()
            .collect(),
        };
        edit(&mut m);
        m.to_json_line()
    }

    /// (case, the line, None if it reads back, else a substring of the error)
    #[test]
    fn cluster_manifest_table() {
        let rows: Vec<(&str, String, Option<&str>)> = vec![
            ("as built", line(|_| {}), None),
            (
                "a shard missing",
                line(|m| {
                    m.shards.remove(&2);
                }),
                Some("shard 2 has no manifest"),
            ),
            (
                "a shard the cluster does not have",
                line(|m| {
                    let extra = manifest("L.shard3", m.attempt.clone());
                    m.shards.insert(3, extra);
                }),
                Some("shard 3 is not a shard of cluster c"),
            ),
            (
                "another shard's manifest in its place (a forged line)",
                line(|m| {
                    let other = manifest("L.shard1", m.attempt.clone());
                    m.shards.insert(2, other);
                }),
                Some("shard 2: manifest of load L.shard1, not of L.shard2"),
            ),
            (
                "another attempt's manifest on one shard",
                line(|m| {
                    let other = manifest("L.shard2", attempt("app.9", 0));
                    m.shards.insert(2, other);
                }),
                Some("shard 2: manifest of attempt app.9"),
            ),
            (
                "another partition on one shard",
                line(|m| {
                    let other = manifest("L.shard2", attempt("app.1", 5));
                    m.shards.insert(2, other);
                }),
                Some("(partition 5), but the line is attempt app.1's (partition 0)"),
            ),
            (
                "a single-table manifest",
                manifest("L", attempt("app.1", 0)).to_json_line(),
                Some("not a cluster manifest"),
            ),
            ("not JSON", "{\"format\":".into(), Some("not JSON")),
        ];
        for (case, text, want) in rows {
            let got = ClusterManifest::from_json(&text, &cluster());
            match (got, want) {
                (Ok(m), None) => {
                    assert_eq!(m.to_json_line(), text, "{case}: round trip");
                    assert_eq!(m.shards.len(), 2, "{case}");
                }
                (Err(e), Some(want)) => assert!(e.contains(want), "{case}: {e}"),
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn sub_load_ids() {
        let load: LoadId = "events-2026-12-01T09".parse().unwrap();
        assert_eq!(
            shard_load(&load, 3).unwrap().as_str(),
            "events-2026-12-01T09.shard3"
        );
        let long: LoadId = "x".repeat(127).parse().unwrap();
        assert!(
            shard_load(&long, 1).is_err(),
            "an id over 128 characters is refused"
        );
    }
}
