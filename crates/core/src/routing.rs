//! Which shard a row of a `Distributed` table belongs to, computed exactly as ClickHouse does.
//!
//! To load a Distributed table chpart builds each shard's parts itself, so every row must go to
//! the shard ClickHouse's own INSERT would send it to; otherwise a later query that prunes
//! shards by key (`optimize_skip_unused_shards`) misses rows, and a re-sharding tool disagrees
//! with the load. The facts come from the server: the engine's arguments from
//! `system.tables.engine_full` ([`DistributedEngine::parse`]), the shards' numbers and weights
//! from `system.clusters` in config order, and the sharding key's result type from ClickHouse
//! (`DESCRIBE (SELECT <key> FROM <local table>)`), never guessed from the SQL text.
//! [`Routing::slot_sql`] then writes one SQL expression that clickhouse-local evaluates per row
//! to the shard number, so the rule runs on the same engine and types as the server's.
//!
//! The rule (ClickHouse's `createBlockSelector`, `StorageDistributed::createSelector`): the
//! key's value read as the *unsigned* integer of its own width, modulo the sum of the weights,
//! gives a slot; slots map to shards by cumulative weight in config order (a shard of weight
//! `w` owns `w` consecutive slots; weight 0 owns none). Traps: a signed `%` gives negative
//! remainders (about 40 % of rows misplaced, seen), and the width is that of the whole key
//! expression's result type (`toInt32(x) - 500` is `Int64`). Only `(U)Int8/16/32/64`, `Bool`
//! (a `UInt8`) and `LowCardinality` of those route; `Date`, `DateTime`, `Enum`, `IPv4` and the
//! 128/256-bit integers pass `CREATE TABLE` but every INSERT into a multi-shard table fails
//! (`Code: 53 ... does not evaluate to an integer type`), and `Nullable`, floats, decimals and
//! strings are refused at CREATE (all seen on 26.9). With one shard the server sends every row
//! there without evaluating the key; with several and no key it refuses INSERT.

use std::fmt::Write as _;

/// Why a Distributed table's routing cannot be stated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutingError {
    /// `engine_full` is not a `Distributed(...)` engine clause this parser understands.
    #[error("cannot parse the Distributed engine {engine_full:?}: {reason}")]
    Parse {
        /// The text from `system.tables.engine_full`.
        engine_full: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The cluster has no shards.
    #[error("the cluster has no shards")]
    NoShards,
    /// Every shard has weight 0 (ClickHouse refuses such a cluster as well).
    #[error(
        "every shard of the cluster has weight 0 ({shards} shards): no shard can receive rows"
    )]
    ZeroTotalWeight {
        /// How many shards there are.
        shards: usize,
    },
    /// Several shards and no sharding key: ClickHouse refuses INSERT into such a table.
    #[error("the Distributed table has no sharding key but {shards} shards: ClickHouse refuses INSERT into it, and so does chpart")]
    NoShardingKey {
        /// How many shards there are.
        shards: usize,
    },
    /// The key's result type is not one ClickHouse routes by.
    #[error("sharding key {key} has type {type_name}, by which ClickHouse does not route rows: it must be (U)Int8/16/32/64, Bool or LowCardinality of those")]
    UnsupportedKeyType {
        /// The key expression.
        key: String,
        /// Its result type, as `toTypeName` says.
        type_name: String,
    },
}

/// The arguments of a `Distributed` engine, from `system.tables.engine_full`, e.g.
/// `Distributed('c', 'db', 'local', cityHash64(user_id))`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedEngine {
    /// The cluster's name in the server's `<remote_servers>`.
    pub cluster: String,
    /// The database of the shards' local table.
    pub database: String,
    /// The shards' local table.
    pub table: String,
    /// The sharding key expression, verbatim SQL (`None`: the engine has no key).
    pub sharding_key: Option<String>,
    /// The storage policy for the table's pending-insert queue, the 5th argument.
    pub policy: Option<String>,
}

impl DistributedEngine {
    /// Parses `engine_full`: names unquoted, in single quotes (as the server prints them) or in
    /// back quotes/double quotes; a key with any nesting and string literals; an optional
    /// policy; then optionally `SETTINGS ...`, which is ignored.
    pub fn parse(engine_full: &str) -> Result<DistributedEngine, RoutingError> {
        let fail = |reason: String| RoutingError::Parse {
            engine_full: engine_full.to_owned(),
            reason,
        };
        let text = engine_full.trim();
        let rest = text
            .strip_prefix("Distributed")
            .ok_or_else(|| fail("it does not start with Distributed".into()))?
            .trim_start();
        let inner = rest
            .strip_prefix('(')
            .ok_or_else(|| fail("no ( after Distributed".into()))?;
        let (args, after) = split_args(inner).map_err(fail)?;
        let after = after.trim();
        if !(after.is_empty() || starts_with_keyword(after, "SETTINGS")) {
            return Err(fail(format!("unexpected {after:?} after the arguments")));
        }
        if !(3..=5).contains(&args.len()) {
            return Err(fail(format!(
                "{} arguments; Distributed takes 3 to 5 (cluster, database, table[, sharding key[, policy]])",
                args.len()
            )));
        }
        if let Some(i) = args.iter().position(|a| a.is_empty()) {
            return Err(fail(format!("argument {} is empty", i + 1)));
        }
        let name = |i: usize, what: &str| {
            name_value(args[i]).ok_or_else(|| {
                fail(format!(
                    "the {what} argument {:?} is not a name or a string literal",
                    args[i]
                ))
            })
        };
        Ok(DistributedEngine {
            cluster: name(0, "cluster")?,
            database: name(1, "database")?,
            table: name(2, "table")?,
            sharding_key: args.get(3).map(|k| (*k).to_owned()),
            policy: if args.len() == 5 {
                Some(name(4, "policy")?)
            } else {
                None
            },
        })
    }
}

/// One shard as `system.clusters` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardWeight {
    /// `shard_num` (1-based, config order).
    pub shard_num: u32,
    /// `shard_weight`.
    pub weight: u32,
}

/// The sharding key with its result type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardingKey {
    /// The key expression, verbatim SQL over the local table's columns.
    pub sql: String,
    /// Its result type as ClickHouse names it (`toTypeName`), e.g. `Int64`.
    pub type_name: String,
}

/// Everything that decides where a row of a Distributed table goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    /// The sharding key (`None`: the engine has none).
    pub key: Option<ShardingKey>,
    /// The cluster's shards in config order (`system.clusters ORDER BY shard_num`).
    pub shards: Vec<ShardWeight>,
}

impl Routing {
    /// A ClickHouse SQL expression over the local table's columns that evaluates, per row, to
    /// the `shard_num` the Distributed engine sends the row to, e.g. for weights 1, 2, 3 and
    /// an `Int32` key `k`:
    /// `multiIf(reinterpretAsUInt32(k) % 6 < 1, 1, reinterpretAsUInt32(k) % 6 < 3, 2, 3)`.
    pub fn slot_sql(&self) -> Result<String, RoutingError> {
        let shards = self.shards.len();
        if shards == 0 {
            return Err(RoutingError::NoShards);
        }
        let total: u64 = self.shards.iter().map(|s| u64::from(s.weight)).sum();
        if total == 0 {
            return Err(RoutingError::ZeroTotalWeight { shards });
        }
        if shards == 1 {
            // The server writes the whole block to its only shard, key or no key.
            return Ok(self.shards[0].shard_num.to_string());
        }
        let key = self
            .key
            .as_ref()
            .ok_or(RoutingError::NoShardingKey { shards })?;
        let bits =
            unsigned_width(&key.type_name).ok_or_else(|| RoutingError::UnsupportedKeyType {
                key: key.sql.clone(),
                type_name: key.type_name.clone(),
            })?;
        let slot = format!("reinterpretAsUInt{bits}({}) % {total}", key.sql.trim());
        let owners: Vec<&ShardWeight> = self.shards.iter().filter(|s| s.weight > 0).collect();
        let Some((last, owners)) = owners.split_last() else {
            unreachable!("total weight > 0")
        };
        if owners.is_empty() {
            return Ok(last.shard_num.to_string());
        }
        let mut sql = String::from("multiIf(");
        let mut bound = 0u64;
        for shard in owners {
            bound += u64::from(shard.weight);
            write!(sql, "{slot} < {bound}, {}, ", shard.shard_num).expect("write to a String");
        }
        write!(sql, "{})", last.shard_num).expect("write to a String");
        Ok(sql)
    }
}

/// The width in bits of the unsigned integer ClickHouse reads a key of type `type_name` as, or
/// `None` for a type it does not route by.
fn unsigned_width(type_name: &str) -> Option<u8> {
    let name = type_name.trim();
    let name = name
        .strip_prefix("LowCardinality(")
        .and_then(|inner| inner.strip_suffix(')'))
        .unwrap_or(name);
    match name {
        "UInt8" | "Int8" | "Bool" => Some(8),
        "UInt16" | "Int16" => Some(16),
        "UInt32" | "Int32" => Some(32),
        "UInt64" | "Int64" => Some(64),
        _ => None,
    }
}

/// Whether `text` starts with the SQL keyword `word` (any case) followed by a non-word character.
fn starts_with_keyword(text: &str, word: &str) -> bool {
    text.get(..word.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(word))
        && !text[word.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
}

/// Splits the text after `Distributed(` into its top-level arguments (trimmed) and the text
/// after the closing parenthesis. Commas and parentheses inside quotes or nested brackets do
/// not count.
fn split_args(inner: &str) -> Result<(Vec<&str>, &str), String> {
    let mut args = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    let mut chars = inner.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\'' | '"' | '`' => skip_quoted(&mut chars, c).ok_or_else(|| {
                format!("unterminated {c}-quoted text at byte {i} of the arguments")
            })?,
            '(' | '[' | '{' => depth += 1,
            ')' if depth == 0 => {
                args.push(inner[start..i].trim());
                return Ok((args, &inner[i + 1..]));
            }
            ')' | ']' | '}' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("unbalanced {c} in the arguments"))?;
            }
            ',' if depth == 0 => {
                args.push(inner[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    Err("no closing ) for Distributed(".into())
}

/// Advances past a quoted token whose opening `quote` was just read: a backslash escapes the
/// next character and a doubled quote stands for one. `None` if the text ends first.
fn skip_quoted(chars: &mut std::str::CharIndices<'_>, quote: char) -> Option<()> {
    while let Some((_, c)) = chars.next() {
        if c == '\\' {
            chars.next()?;
        } else if c == quote {
            // Look ahead on a copy: only a second quote is consumed.
            if chars.clone().next().is_some_and(|(_, next)| next == quote) {
                chars.next();
            } else {
                return Some(());
            }
        }
    }
    None
}

/// The value of a name argument: a bare identifier, a quoted identifier or a string literal.
fn name_value(arg: &str) -> Option<String> {
    let mut chars = arg.chars();
    let first = chars.next()?;
    if matches!(first, '\'' | '"' | '`') {
        return unquote(arg, first);
    }
    let bare = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    bare.then(|| arg.to_owned())
}

/// The text inside `arg` quoted with `quote`, escapes resolved; `None` unless `arg` is exactly
/// one quoted token.
fn unquote(arg: &str, quote: char) -> Option<String> {
    let body = arg.strip_prefix(quote)?;
    let mut out = String::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            out.push(match chars.next()? {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                '0' => '\0',
                other => other,
            });
        } else if c == quote {
            if chars.peek() == Some(&quote) {
                chars.next();
                out.push(quote);
            } else {
                return chars.next().is_none().then_some(out);
            }
        } else {
            out.push(c);
        }
    }
    None
}

#[cfg(test)]
mod tests;
