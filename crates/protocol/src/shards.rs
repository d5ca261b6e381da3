//! The model of a load into a `Distributed` table, pure: what `begin` records about its cluster
//! and shards, the names of the shards' sub-loads, what one attempt prints (a manifest per
//! shard) and the plan a commit keeps once per load. The stages that use it are in
//! [`crate::cluster`].

use std::collections::BTreeMap;

use chpart_core::routing::{Routing, ShardWeight, ShardingKey};
use chpart_core::{Attempt, AttemptId, IdError, LoadId, Manifest, TableRef};
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
            folded_rows: 0,
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
