//! Validated identifiers: loads, attempts, partitions, databases and tables.
//!
//! These strings end up inside remote paths (`<staging>/<load>/<attempt>/`), part names
//! (`<partition>_<N>_<N>_0`) and SQL (`` `db`.`table` ``). Validating them once, at the edge,
//! means no later step has to worry about `/`, `..`, whitespace or quotes smuggled in by a job
//! configuration: a value of these types is safe to join into a path or a statement as is.
//!
//! An attempt is named by whoever runs it. Spark's `(stage, partition, attemptNumber)` repeats
//! across stage attempts (stage 1.0 and 1.1 can both run "partition 0, attempt 0" at once);
//! only `taskAttemptId` is unique, and only within one application attempt (a YARN application
//! attempt keeps the application id and counts task attempts from 0 again), so a Spark attempt
//! id is `<applicationId>.<application attempt>.<nonce>.<taskAttemptId>` ([`AttemptId::spark`])
//! and the rest is kept for humans only ([`Attempt`]). `chpart build` does not trust the
//! runner on this: it claims the attempt's staging directory exclusively and refuses an id
//! already in use.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a string is not a valid identifier. `kind` names the identifier ("load id", ...);
/// `value` is the offending string, quoted, escaped and truncated for safe display.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The string is empty.
    #[error("{kind} is empty")]
    Empty {
        /// Which identifier.
        kind: &'static str,
    },
    /// The string is longer than allowed.
    #[error("{kind} {value} is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Which identifier.
        kind: &'static str,
        /// The offending value, quoted and truncated.
        value: String,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A character outside the identifier's charset.
    #[error("{kind} {value} contains {ch:?} at byte {pos}; only {allowed} are allowed")]
    BadChar {
        /// Which identifier.
        kind: &'static str,
        /// The offending value, quoted and truncated.
        value: String,
        /// The first character not allowed.
        ch: char,
        /// Its byte offset.
        pos: usize,
        /// The allowed charset, for the message.
        allowed: &'static str,
    },
    /// A character allowed inside but not at the start.
    #[error("{kind} {value} starts with {ch:?}; it must not start with {rule}")]
    BadStart {
        /// Which identifier.
        kind: &'static str,
        /// The offending value, quoted and truncated.
        value: String,
        /// The first character.
        ch: char,
        /// What may not start the identifier, for the message.
        rule: &'static str,
    },
    /// `..` inside a load or attempt id (it would read as a parent directory to careless code).
    #[error("{kind} {value} contains \"..\"")]
    DotDot {
        /// Which identifier.
        kind: &'static str,
        /// The offending value, quoted and truncated.
        value: String,
    },
    /// A table reference that is not `database.table`.
    #[error("table reference {value} must be `database.table`, with exactly one dot")]
    TableRefShape {
        /// The offending value, quoted and truncated.
        value: String,
    },
}

/// Quotes, escapes and truncates an untrusted string for an error message, so a hostile or
/// binary value cannot forge log lines or flood them.
pub(crate) fn show(value: &str) -> String {
    format!("\"{}\"", escape(value))
}

/// [`show`] without the quotes, for values that are usually plain identifiers.
pub(crate) fn escape(value: &str) -> String {
    const MAX_CHARS: usize = 80;
    let mut out = String::new();
    for (i, ch) in value.chars().enumerate() {
        if i == MAX_CHARS {
            out.push('…');
            break;
        }
        out.extend(ch.escape_debug());
    }
    out
}

/// A set of ASCII bytes.
type ByteClass = fn(u8) -> bool;

/// The syntax of one kind of identifier. All kinds are ASCII-only.
struct Rules {
    kind: &'static str,
    max_len: usize,
    allowed: ByteClass,
    allowed_desc: &'static str,
    /// Bytes that may not start the identifier, and how the message describes them.
    bad_start: Option<(ByteClass, &'static str)>,
    forbid_dot_dot: bool,
}

impl Rules {
    fn check(&self, value: &str) -> Result<(), IdError> {
        let kind = self.kind;
        if value.is_empty() {
            return Err(IdError::Empty { kind });
        }
        if value.len() > self.max_len {
            return Err(IdError::TooLong {
                kind,
                value: show(value),
                len: value.len(),
                max: self.max_len,
            });
        }
        if let Some((pos, ch)) = value
            .char_indices()
            .find(|&(_, ch)| !ch.is_ascii() || !(self.allowed)(ch as u8))
        {
            return Err(IdError::BadChar {
                kind,
                value: show(value),
                ch,
                pos,
                allowed: self.allowed_desc,
            });
        }
        if let Some((is_bad, rule)) = self.bad_start {
            let first = value.as_bytes()[0];
            if is_bad(first) {
                return Err(IdError::BadStart {
                    kind,
                    value: show(value),
                    ch: first as char,
                    rule,
                });
            }
        }
        if self.forbid_dot_dot && value.contains("..") {
            return Err(IdError::DotDot {
                kind,
                value: show(value),
            });
        }
        Ok(())
    }
}

/// Rules shared by load and attempt ids: safe as one path component on any POSIX host and
/// inside a Spark application id.
const fn run_id_rules(kind: &'static str) -> Rules {
    Rules {
        kind,
        max_len: 128,
        allowed: |b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'),
        allowed_desc: "ASCII letters, digits, '.', '_' and '-'",
        bad_start: Some((|b| matches!(b, b'.' | b'-'), "'.' or '-'")),
        forbid_dot_dot: true,
    }
}

/// Rules for database and table names: the identifiers ClickHouse accepts without quoting, so
/// backtick-quoting them never needs escaping.
const fn ident_rules(kind: &'static str) -> Rules {
    Rules {
        kind,
        max_len: 128,
        allowed: |b| b.is_ascii_alphanumeric() || b == b'_',
        allowed_desc: "ASCII letters, digits and '_'",
        bad_start: Some((|b| b.is_ascii_digit(), "a digit")),
        forbid_dot_dot: false,
    }
}

macro_rules! validated_string {
    ($(#[$meta:meta])* $name:ident, $rules:expr) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            const RULES: Rules = $rules;

            /// Validates `value`; the error names the rule it breaks.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                Self::RULES.check(&value)?;
                Ok(Self(value))
            }

            /// The validated string.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

validated_string!(
    /// One load: a batch job's run that must land exactly once. Chosen by the job (e.g. a
    /// run id); `[A-Za-z0-9._-]`, 1 to 128 bytes, not starting with `.` or `-`, no `..`.
    LoadId,
    run_id_rules("load id")
);

validated_string!(
    /// One attempt at one task of a load, unique within the load and never reused, even across
    /// retries and stage re-runs. Same syntax as [`LoadId`]. See [`AttemptId::spark`].
    AttemptId,
    run_id_rules("attempt id")
);

validated_string!(
    /// A ClickHouse partition id as it appears in part names: `all`, `202601`, `202601-5`,
    /// `-3`, or a hex hash. `[A-Za-z0-9-]`, 1 to 128 bytes; never `_`, which separates the
    /// fields of a part name.
    PartitionId,
    Rules {
        kind: "partition id",
        max_len: 128,
        allowed: |b| b.is_ascii_alphanumeric() || b == b'-',
        allowed_desc: "ASCII letters, digits and '-'",
        bad_start: None,
        forbid_dot_dot: false,
    }
);

validated_string!(
    /// A ClickHouse database name: `[A-Za-z0-9_]`, not starting with a digit, 1 to 128 bytes.
    DatabaseName,
    ident_rules("database name")
);

validated_string!(
    /// A ClickHouse table name: `[A-Za-z0-9_]`, not starting with a digit, 1 to 128 bytes.
    TableName,
    ident_rules("table name")
);

impl AttemptId {
    /// The attempt id of a Spark task, as `chpart_spark` makes it:
    /// `<app_id>.<app_attempt>.<nonce>.<task_attempt_id>`. `taskAttemptId` is the only attempt
    /// counter Spark keeps unique, within one application attempt; `app_attempt` (YARN's
    /// application attempt id, or the driver's start time where Spark has none) separates
    /// application attempts, and `nonce` (random, one per write on the driver) separates
    /// writes and drivers that agree on everything else.
    pub fn spark(
        app_id: &str,
        app_attempt: &str,
        nonce: &str,
        task_attempt_id: u64,
    ) -> Result<AttemptId, IdError> {
        AttemptId::new(format!("{app_id}.{app_attempt}.{nonce}.{task_attempt_id}"))
    }
}

/// One attempt and what the runner said about it. Only `id` identifies the attempt; the other
/// fields are for operators reading logs and manifests, because Spark repeats them across stage
/// attempts and they must never decide anything.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attempt {
    /// The unique attempt id.
    pub id: AttemptId,
    /// The input partition (Spark `partitionId`) this attempt processed.
    pub partition: u32,
    /// Spark `stageId`, if the runner has stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<u32>,
    /// Spark stage attempt number, if known (PySpark does not expose it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_attempt: Option<u32>,
    /// Spark `attemptNumber`: restarts at 0 in each stage attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_number: Option<u32>,
}

/// A table: `db.table` in text and config, `` `db`.`table` `` in SQL.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TableRef {
    /// The database.
    pub database: DatabaseName,
    /// The table.
    pub table: TableName,
}

impl FromStr for TableRef {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        match s.split_once('.') {
            Some((database, table)) if !table.contains('.') => Ok(TableRef {
                database: database.parse()?,
                table: table.parse()?,
            }),
            _ => Err(IdError::TableRefShape { value: show(s) }),
        }
    }
}

impl TryFrom<String> for TableRef {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        s.parse()
    }
}

impl From<TableRef> for String {
    fn from(t: TableRef) -> String {
        t.to_string()
    }
}

impl fmt::Display for TableRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.database, self.table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::expect_row;

    /// Each row: (name, input, `Ok(())` or a substring of the expected error message).
    fn check_table<T, S, E>(rows: &[(&str, S, Result<(), E>)])
    where
        T: FromStr<Err = IdError> + fmt::Display + fmt::Debug,
        S: AsRef<str>,
        E: AsRef<str>,
    {
        for (row, input, expected) in rows {
            let input = input.as_ref();
            let expected = expected.as_ref().map(|_| ()).map_err(AsRef::as_ref);
            if let Some(id) = expect_row(row, input.parse::<T>(), expected) {
                assert_eq!(id.to_string(), input, "{row}: display round trip");
            }
        }
    }

    fn run_id_rows(kind: &'static str) -> Vec<(&'static str, String, Result<(), String>)> {
        let long = "a".repeat(129);
        vec![
            ("plain", "run-2026-01-01".into(), Ok(())),
            ("spark shaped", "app-20260101123456-0001.17".into(), Ok(())),
            ("underscore start", "_x".into(), Ok(())),
            ("single dot inside", "a.b".into(), Ok(())),
            ("trailing dot", "a.".into(), Ok(())),
            ("max length", "a".repeat(128), Ok(())),
            ("empty", "".into(), Err(format!("{kind} is empty"))),
            ("too long", long, Err("129 bytes long; at most 128".into())),
            ("slash", "a/b".into(), Err("contains '/' at byte 1".into())),
            ("space", "a b".into(), Err("contains ' '".into())),
            (
                "newline",
                "a\nb".into(),
                Err("\"a\\nb\" contains '\\n'".into()),
            ),
            ("nul", "a\0b".into(), Err("contains '\\0'".into())),
            (
                "non-ascii",
                "é".into(),
                Err("contains 'é' at byte 0".into()),
            ),
            (
                "leading dot",
                ".hidden".into(),
                Err("starts with '.'".into()),
            ),
            ("leading dash", "-rf".into(), Err("starts with '-'".into())),
            ("dot dot", "a..b".into(), Err("contains \"..\"".into())),
            ("dot dot alone", "..".into(), Err("starts with '.'".into())),
        ]
    }

    #[test]
    fn load_ids() {
        check_table::<LoadId, _, _>(&run_id_rows("load id"));
    }

    #[test]
    fn attempt_ids() {
        check_table::<AttemptId, _, _>(&run_id_rows("attempt id"));
    }

    #[test]
    fn partition_ids() {
        check_table::<PartitionId, _, _>(&[
            ("unpartitioned", "all", Ok(())),
            ("month", "202601", Ok(())),
            ("tuple", "202601-5", Ok(())),
            ("negative int", "-3", Ok(())),
            ("hash", "f0e5c0a9c2bd3f36b16c6bdb1a8b4b37", Ok(())),
            ("empty", "", Err("partition id is empty")),
            ("underscore", "2026_01", Err("contains '_' at byte 4")),
            ("dot", "2026.01", Err("contains '.'")),
            ("slash", "a/b", Err("contains '/'")),
        ]);
    }

    #[test]
    fn clickhouse_identifiers() {
        check_table::<DatabaseName, _, _>(&[
            ("plain", "analytics", Ok(())),
            ("underscore start", "_tmp", Ok(())),
            ("digits inside", "t2026", Ok(())),
            (
                "digit start",
                "2026t",
                Err("database name \"2026t\" starts with '2'; it must not start with a digit"),
            ),
            ("dash", "a-b", Err("contains '-'")),
            ("backtick", "a`b", Err("contains '`'")),
            ("empty", "", Err("database name is empty")),
        ]);
        check_table::<TableName, _, _>(&[("dot", "a.b", Err("table name \"a.b\" contains '.'"))]);
    }

    #[test]
    fn table_refs() {
        check_table::<TableRef, _, _>(&[
            ("plain", "db.events", Ok(())),
            ("no dot", "events", Err("exactly one dot")),
            ("two dots", "a.b.c", Err("exactly one dot")),
            ("empty table", "db.", Err("table name is empty")),
            (
                "bad database",
                "1db.events",
                Err("database name \"1db\" starts with '1'"),
            ),
        ]);
        let t: TableRef = "db.events".parse().unwrap();
        assert_eq!(t.to_string(), "db.events");
    }

    #[test]
    fn spark_attempt_ids() {
        let yarn = AttemptId::spark("application_1764490000000_0042", "2", "9f3a0c1d2e4b", 42);
        assert_eq!(
            yarn.unwrap().as_str(),
            "application_1764490000000_0042.2.9f3a0c1d2e4b.42"
        );
        let local = AttemptId::spark("local-1764490000000", "s1764489999000", "00ff", 0).unwrap();
        assert_eq!(local.as_str(), "local-1764490000000.s1764489999000.00ff.0");
        let err = AttemptId::spark("app/1", "1", "ab", 3)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("attempt id \"app/1.1.ab.3\" contains '/'"),
            "{err}"
        );
        // The longest ids chpart_spark makes still fit: a Kubernetes application id
        // (spark-<32 hex>), a start time, 12 hex of nonce and the largest taskAttemptId.
        let long = format!("spark-{}", "a".repeat(32));
        assert!(AttemptId::spark(&long, "s1764489999000", "9f3a0c1d2e4b", u64::MAX >> 1).is_ok());
    }

    #[test]
    fn long_values_are_truncated_in_messages() {
        let err = LoadId::new(format!("{}/", "x".repeat(200)))
            .unwrap_err()
            .to_string();
        assert!(err.contains('…'), "{err}");
        assert!(err.len() < 200, "{err}");
    }

    #[test]
    fn serde_validates_and_round_trips() {
        let id: LoadId = serde_json::from_str("\"load-1\"").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"load-1\"");
        let err = serde_json::from_str::<LoadId>("\"etl/2026\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("load id \"etl/2026\" contains '/'"), "{err}");
        let t: TableRef = serde_json::from_str("\"db.t\"").unwrap();
        assert_eq!(serde_json::to_value(&t).unwrap(), serde_json::json!("db.t"));
    }

    #[test]
    fn attempt_serde() {
        let full = r#"{"id":"app.7","partition":3,"stage":1,"stage_attempt":0,"attempt_number":2}"#;
        let a: Attempt = serde_json::from_str(full).unwrap();
        assert_eq!(a.stage, Some(1));
        assert_eq!(serde_json::to_string(&a).unwrap(), full);
        let minimal: Attempt = serde_json::from_str(r#"{"id":"x","partition":0}"#).unwrap();
        assert_eq!(minimal.attempt_number, None);
        assert!(serde_json::from_str::<Attempt>(r#"{"id":"x","partition":0,"host":"h"}"#).is_err());
    }
}
