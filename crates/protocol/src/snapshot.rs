//! What `begin` records about a table, so that every executor builds for exactly that
//! definition and the driver can tell when the table changed under the load.

use chpart_core::{ColumnShape, TableFingerprint, TableShape};
use chpart_server::{ColumnInfo, TableInfo};
use serde::{Deserialize, Serialize};

/// A table's definition and storage at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSnapshot {
    /// The exact `CREATE TABLE` statement.
    pub create_table_query: String,
    /// Columns, engine and keys: what the fingerprint covers.
    pub shape: TableShape,
    /// Storage policy.
    pub storage_policy: String,
    /// One data directory per disk, each ending in `/`; `detached/` is directly under each.
    pub data_paths: Vec<String>,
    /// Table UUID.
    pub uuid: String,
    /// Fingerprint of the shape, independent of the table's name.
    pub fingerprint: TableFingerprint,
}

impl TableSnapshot {
    /// Snapshot from what the server reports.
    pub fn from_server(info: &TableInfo, columns: &[ColumnInfo]) -> TableSnapshot {
        let shape = TableShape {
            columns: columns
                .iter()
                .map(|c| ColumnShape {
                    name: c.name.clone(),
                    type_name: c.type_name.clone(),
                    default_kind: c.default_kind.clone(),
                    default_expression: c.default_expression.clone(),
                })
                .collect(),
            engine: info.engine.clone(),
            engine_full: info.engine_full.clone(),
            partition_key: info.partition_key.clone(),
            sorting_key: info.sorting_key.clone(),
            primary_key: info.primary_key.clone(),
            sampling_key: info.sampling_key.clone(),
        };
        TableSnapshot {
            create_table_query: info.create_table_query.clone(),
            fingerprint: shape.fingerprint(),
            shape,
            storage_policy: info.storage_policy.clone(),
            data_paths: info.data_paths.clone(),
            uuid: info.uuid.clone(),
        }
    }

    /// The columns whose type chpart cannot fill from input (e.g. `AggregateFunction(...)`
    /// states), each as "`column` Type: why"; `build` would refuse them, `begin` does first.
    pub fn unsupported_columns(&self) -> Vec<String> {
        self.shape
            .columns
            .iter()
            .filter_map(|c| {
                let parsed = c.type_name.parse::<chpart_input::ChType>();
                parsed
                    .err()
                    .map(|e| format!("column `{}` {}: {e}", c.name, c.type_name))
            })
            .collect()
    }

    /// Whether the engine is one chpart can build parts for (the MergeTree family, not
    /// replicated: a replicated table's parts must be attached on every replica).
    pub fn engine_supported(&self) -> bool {
        let engine = &self.shape.engine;
        engine.ends_with("MergeTree")
            && !engine.starts_with("Replicated")
            && !engine.starts_with("Shared")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ledger::{LoadSpec, Mode, Visibility};

    pub(crate) fn sample_snapshot() -> TableSnapshot {
        let info = TableInfo {
            database: "db".into(),
            name: "events".into(),
            uuid: "3e4c1f0a-0000-4000-8000-000000000001".into(),
            engine: "MergeTree".into(),
            engine_full: "MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id SETTINGS index_granularity = 8192".into(),
            create_table_query: "CREATE TABLE db.events (`ts` DateTime, `id` UInt64) ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id SETTINGS index_granularity = 8192".into(),
            partition_key: "toYYYYMM(ts)".into(),
            sorting_key: "id".into(),
            primary_key: "id".into(),
            sampling_key: String::new(),
            storage_policy: "default".into(),
            data_paths: vec!["/var/lib/clickhouse/store/3e4/3e4c1f0a-0000-4000-8000-000000000001/".into()],
        };
        let columns = [("ts", "DateTime"), ("id", "UInt64")].map(|(n, t)| ColumnInfo {
            name: n.into(),
            type_name: t.into(),
            default_kind: String::new(),
            default_expression: String::new(),
        });
        TableSnapshot::from_server(&info, &columns)
    }

    pub(crate) fn sample_spec() -> LoadSpec {
        LoadSpec {
            load: "L".parse().unwrap(),
            target: "db.events".parse().unwrap(),
            mode: Mode::Append,
            visibility: Visibility::Part,
            publish: "db.events".parse().unwrap(),
            target_snapshot: sample_snapshot(),
            publish_snapshot: sample_snapshot(),
            server_version: "26.9.2.1".into(),
            server_timezone: Some("Etc/UTC".into()),
            clickhouse_local_version: Some("26.9.2.1".into()),
            host: "ch-1".into(),
            publish_disks: vec![chpart_core::DiskPlace {
                disk: "default".into(),
                data_path: "/var/lib/clickhouse/store/3e4/3e4c1f0a-0000-4000-8000-000000000001"
                    .parse()
                    .unwrap(),
                staging_root: "/var/lib/clickhouse/chpart-staging".parse().unwrap(),
            }],
            cluster: None,
            shard_of: None,
            inputs: None,
            opened_at_unix_ms: 1,
        }
    }

    #[test]
    fn spec_round_trips_and_engines_are_classified() {
        let spec = sample_spec();
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<LoadSpec>(&json).unwrap(), spec);
        // A spec recorded before the zone and clickhouse-local version were: still a spec.
        let mut old: serde_json::Value = serde_json::from_str(&json).unwrap();
        let fields = old.as_object_mut().unwrap();
        fields.remove("server_timezone");
        fields.remove("clickhouse_local_version");
        fields.remove("publish_disks");
        let old: LoadSpec = serde_json::from_value(old).unwrap();
        assert!(old.publish_disks.is_empty());
        // Its destination: the one data path, under the configured staging root.
        let configured = chpart_core::StagingLayout::new("/staging").unwrap();
        let legacy = old.destination(&configured).unwrap();
        assert_eq!(legacy.disks.len(), 1);
        assert_eq!(
            (
                legacy.home().disk.as_str(),
                legacy.home().staging_root.as_str()
            ),
            ("default", "/staging")
        );
        assert_eq!(
            spec.destination(&configured).unwrap().disks,
            spec.publish_disks
        );
        assert_eq!(
            (old.server_timezone, old.clickhouse_local_version),
            (None, None)
        );
        let mut snap = sample_snapshot();
        for (engine, ok) in [
            ("MergeTree", true),
            ("ReplacingMergeTree", true),
            ("SummingMergeTree", true),
            ("ReplicatedMergeTree", false),
            ("Log", false),
            ("Distributed", false),
        ] {
            snap.shape.engine = engine.into();
            assert_eq!(snap.engine_supported(), ok, "{engine}");
        }
    }
}
