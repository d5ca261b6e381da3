//! A digest of a table's shape, so parts are attached only to the schema they were built for.
//!
//! Executors build parts with clickhouse-local against the table's definition read at the start
//! of a load; the driver re-reads the definition before attaching. A part built for another
//! column list, type, order or key would attach wrongly or not at all, so the manifest carries
//! the fingerprint of the shape it was built for, and the driver compares it with the table's
//! current one.
//!
//! The shape comes from `system.columns` (name, type, default_kind, default_expression, in
//! position order) and `system.tables` (engine, engine_full, the key expressions). The database
//! and table names are deliberately not part of it: a shadow table made with
//! `CREATE TABLE shadow AS target` must have the target's fingerprint.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::canon::{is_lower_hex, Canon};
use crate::ids::show;

/// One column, as `system.columns` describes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnShape {
    /// Column name.
    pub name: String,
    /// Type, e.g. `LowCardinality(String)`.
    pub type_name: String,
    /// `DEFAULT`, `MATERIALIZED`, `ALIAS`, `EPHEMERAL` or empty.
    pub default_kind: String,
    /// The default expression, or empty.
    pub default_expression: String,
}

/// What a part's layout depends on: columns in order, engine and keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableShape {
    /// Columns in table order (`system.columns.position`).
    pub columns: Vec<ColumnShape>,
    /// `system.tables.engine`, e.g. `MergeTree`.
    pub engine: String,
    /// `system.tables.engine_full`: engine with arguments, keys and settings.
    pub engine_full: String,
    /// `system.tables.partition_key`.
    pub partition_key: String,
    /// `system.tables.sorting_key`.
    pub sorting_key: String,
    /// `system.tables.primary_key`.
    pub primary_key: String,
    /// `system.tables.sampling_key`.
    pub sampling_key: String,
}

impl TableShape {
    /// `sha256:<hex>` over a length-prefixed encoding of every field, columns in order.
    pub fn fingerprint(&self) -> TableFingerprint {
        let mut canon = Canon::new("chpart-table-shape-v1");
        canon.u64(self.columns.len() as u64);
        for c in &self.columns {
            canon
                .str(&c.name)
                .str(&c.type_name)
                .str(&c.default_kind)
                .str(&c.default_expression);
        }
        canon
            .str(&self.engine)
            .str(&self.engine_full)
            .str(&self.partition_key)
            .str(&self.sorting_key)
            .str(&self.primary_key)
            .str(&self.sampling_key);
        TableFingerprint(format!("{PREFIX}{}", hex::encode(canon.finish())))
    }
}

const PREFIX: &str = "sha256:";

/// A table fingerprint: `sha256:` and 64 lowercase hex digits.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TableFingerprint(String);

/// A string that is not a table fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("table fingerprint {value} is not \"sha256:\" followed by 64 lowercase hex digits")]
pub struct FingerprintError {
    /// The offending value, quoted and truncated.
    pub value: String,
}

impl TableFingerprint {
    /// The fingerprint as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for TableFingerprint {
    type Err = FingerprintError;
    fn from_str(s: &str) -> Result<Self, FingerprintError> {
        match s.strip_prefix(PREFIX) {
            Some(digest) if is_lower_hex(digest, 64) => Ok(TableFingerprint(s.to_string())),
            _ => Err(FingerprintError { value: show(s) }),
        }
    }
}

impl TryFrom<String> for TableFingerprint {
    type Error = FingerprintError;
    fn try_from(s: String) -> Result<Self, FingerprintError> {
        s.parse()
    }
}

impl From<TableFingerprint> for String {
    fn from(f: TableFingerprint) -> String {
        f.0
    }
}

impl fmt::Display for TableFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::expect_row;

    fn col(name: &str, type_name: &str) -> ColumnShape {
        ColumnShape {
            name: name.into(),
            type_name: type_name.into(),
            default_kind: String::new(),
            default_expression: String::new(),
        }
    }

    /// `events (ts DateTime, user UInt64, kind String)`, partitioned by month.
    fn events() -> TableShape {
        TableShape {
            columns: vec![col("ts", "DateTime"), col("user", "UInt64"), col("kind", "String")],
            engine: "MergeTree".into(),
            engine_full: "MergeTree PARTITION BY toYYYYMM(ts) ORDER BY (user, ts) SETTINGS index_granularity = 8192"
                .into(),
            partition_key: "toYYYYMM(ts)".into(),
            sorting_key: "user, ts".into(),
            primary_key: "user, ts".into(),
            sampling_key: String::new(),
        }
    }

    #[test]
    fn changes_that_matter_change_the_fingerprint() {
        type Edit = fn(&mut TableShape);
        let rows: Vec<(&str, Edit, bool)> = vec![
            // A shadow table (`CREATE TABLE shadow AS target`) has the same shape.
            ("identical copy", |_| {}, false),
            (
                "column type",
                |t| t.columns[1].type_name = "UInt32".into(),
                true,
            ),
            ("column order", |t| t.columns.swap(0, 1), true),
            (
                "column renamed",
                |t| t.columns[2].name = "kind2".into(),
                true,
            ),
            (
                "column added",
                |t| t.columns.push(col("extra", "UInt8")),
                true,
            ),
            ("column dropped", |t| _ = t.columns.pop(), true),
            (
                "default kind",
                |t| t.columns[2].default_kind = "DEFAULT".into(),
                true,
            ),
            (
                "default expression",
                |t| t.columns[2].default_expression = "'x'".into(),
                true,
            ),
            ("engine", |t| t.engine = "ReplacingMergeTree".into(), true),
            (
                "engine settings",
                |t| t.engine_full.push_str(", min_bytes_for_wide_part = 0"),
                true,
            ),
            (
                "partition key",
                |t| t.partition_key = "toDate(ts)".into(),
                true,
            ),
            ("sorting key", |t| t.sorting_key = "ts".into(), true),
            ("primary key", |t| t.primary_key = "user".into(), true),
            ("sampling key", |t| t.sampling_key = "user".into(), true),
            // Field boundaries are encoded: moving text between fields is a change.
            (
                "text moved between name and type",
                |t| {
                    t.columns[0].name = "tsD".into();
                    t.columns[0].type_name = "ateTime".into();
                },
                true,
            ),
        ];
        let base = events().fingerprint();
        for (row, edit, changes) in rows {
            let mut shape = events();
            edit(&mut shape);
            assert_eq!(shape.fingerprint() != base, changes, "{row}");
        }
    }

    #[test]
    fn fingerprint_format_and_pin() {
        let f = events().fingerprint();
        assert!(
            f.as_str().starts_with("sha256:") && f.as_str().len() == 7 + 64,
            "{f}"
        );
        assert_eq!(f.to_string().parse::<TableFingerprint>().unwrap(), f);
        // Pinned: a change to the encoding would make every in-flight load's manifests
        // mismatch their table.
        assert_eq!(f.as_str(), PINNED);
    }

    const PINNED: &str = "sha256:428a32b094a1101ddc6bc5f1236951493cf8061973aa6d96a1316fa4b5db9be7";

    #[test]
    fn parse_table() {
        let hex64 = "ab".repeat(32);
        let rows = [
            ("valid", format!("sha256:{hex64}"), true),
            ("no prefix", hex64.clone(), false),
            ("other algorithm", format!("md5:{hex64}"), false),
            (
                "uppercase",
                format!("sha256:{}", hex64.to_uppercase()),
                false,
            ),
            ("short", format!("sha256:{}", &hex64[..63]), false),
            ("long", format!("sha256:{hex64}0"), false),
            ("empty", String::new(), false),
        ];
        for (row, input, ok) in rows {
            let expected = if ok { Ok(()) } else { Err("table fingerprint") };
            expect_row(row, input.parse::<TableFingerprint>(), expected);
        }
        assert!(serde_json::from_str::<TableFingerprint>("\"sha256:xyz\"").is_err());
    }
}
