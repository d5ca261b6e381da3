//! What a load of a table would use (`chpart plan`), writing nothing: for a Distributed table
//! every shard (weight, host, HTTP endpoint, version), the sharding key and routing; for every
//! host the disks parts would go to and whether its server and filesystem answer. Or, with
//! [`PlanScope::Keys`], only the table's keys (what a Spark write's layout needs).

use chpart_core::routing::{DistributedEngine, Routing, ShardWeight, ShardingKey};
use chpart_core::{IdError, TableRef, TableShape};
use chpart_remote::RemoteError;
use chpart_server::{ClickHouseServer, TableDefinition};
use futures_util::future::join_all;
use serde::Serialize;

use crate::begin::BeginError;
use crate::cluster::{refuse, shard_facts};
use crate::reach::Reach;
use crate::snapshot::TableSnapshot;

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
    /// The table's keys, columns and zone there, if it answered (shown once, in
    /// [`Topology`]).
    #[serde(skip)]
    pub keys: Option<TableKeys>,
    /// What is wrong with this host (unreachable server or filesystem, another definition,
    /// no local disk to stage on, ...). Empty: ready.
    pub problems: Vec<String>,
}

/// One column of the table, as `chpart plan` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedColumn {
    /// Its name.
    pub name: String,
    /// Its ClickHouse type, e.g. `DateTime('UTC')`.
    #[serde(rename = "type")]
    pub type_name: String,
}

/// What a write's layout needs of a table, read from one server: its keys, its columns and
/// the server's time zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableKeys {
    partition_key: String,
    sorting_key: String,
    columns: Vec<PlannedColumn>,
    timezone: String,
}

impl TableKeys {
    fn of(shape: &TableShape, timezone: &str) -> TableKeys {
        TableKeys {
            partition_key: shape.partition_key.clone(),
            sorting_key: shape.sorting_key.clone(),
            columns: shape
                .columns
                .iter()
                .map(|c| PlannedColumn {
                    name: c.name.clone(),
                    type_name: c.type_name.clone(),
                })
                .collect(),
            timezone: timezone.to_owned(),
        }
    }

    fn of_definition(seen: &TableDefinition) -> TableKeys {
        let snapshot = TableSnapshot::from_server(&seen.info, &seen.columns);
        TableKeys::of(&snapshot.shape, &seen.timezone)
    }
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
    /// Its columns in order, with their types (from the same server as the keys): what a
    /// Spark write evaluates a partition key of functions with (the zones of its `DateTime`
    /// columns).
    pub columns: Option<Vec<PlannedColumn>>,
    /// The time zone of the server the keys come from: the zone of `DateTime` columns
    /// without one, as chpart's build computes their partitions.
    pub timezone: Option<String>,
    /// Every host parts would go to, in shard order.
    pub hosts: Vec<HostPlan>,
    /// Problems of the table as a whole (e.g. an unsupported key type).
    pub problems: Vec<String>,
}

impl Topology {
    fn set_keys(&mut self, keys: TableKeys) {
        self.partition_key = Some(keys.partition_key);
        self.sorting_key = Some(keys.sorting_key);
        self.columns = Some(keys.columns);
        self.timezone = Some(keys.timezone);
    }

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
            host.keys = Some(TableKeys::of(&facts.snapshot.shape, &facts.timezone));
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

/// How much [`plan`] finds out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanScope {
    /// Every host's server, disks and filesystem: whether a load could begin now.
    Full,
    /// The table's keys only (`partition_key`, `sorting_key`; for a Distributed table its
    /// cluster, sharding key and its local table's keys from the first shard that answers): no
    /// filesystem is reached, no disk checked, `hosts` left empty. What a Spark write's layout
    /// asks for on every write, at a few statements' cost.
    Keys,
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
    scope: PlanScope,
) -> Result<Topology, BeginError> {
    let seen = crate::begin::definition_of(server, table).await?;
    let info = &seen.info;
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
        columns: None,
        timezone: None,
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
        topology.set_keys(TableKeys::of_definition(&seen));
        if scope == PlanScope::Keys {
            return Ok(topology);
        }
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
    if scope == PlanScope::Keys {
        for h in &hosts {
            let (db, name) = (local.database.as_str(), local.table.as_str());
            match reach.server(&h.url).table_definition(db, name).await {
                Ok(Some(shard)) => {
                    topology.set_keys(TableKeys::of_definition(&shard));
                    break;
                }
                Ok(None) => topology.problems.push(format!(
                    "shard {}: {local} does not exist at {}",
                    h.shard_num, h.url
                )),
                Err(e) => topology
                    .problems
                    .push(format!("shard {}: server {}: {e}", h.shard_num, h.url)),
            }
        }
        return Ok(topology);
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
    let reachable = topology
        .hosts
        .iter()
        .find(|h| h.version.is_some())
        .map(|h| (h.url.clone(), h.keys.clone()));
    if let Some((_, Some(keys))) = &reachable {
        topology.set_keys(keys.clone());
    }
    if let (Some(key), Some((first_url, _))) = (&engine.sharding_key, &reachable) {
        if topology.hosts.len() > 1 {
            match reach
                .server(first_url)
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
