//! The target table's DDL, adapted so that clickhouse-local can create the same table.
//!
//! A part can be attached only to a table whose columns, sorting key, partition key, codecs,
//! indices and projections match the ones it was written for, so chpart builds parts in a
//! clickhouse-local table created from the target's exact `system.tables.create_table_query`
//! rather than from a description of it. Only what cannot exist in clickhouse-local changes:
//!
//! - the name: `CREATE TABLE <database>.<table>` for the local database;
//! - `Replicated*MergeTree('/zk/path', 'replica'[, args])` becomes `*MergeTree([args])`: there is
//!   no Keeper locally, and replication does not change the part format;
//! - the `storage_policy` and `disk` settings go: the server's disks do not exist locally, and
//!   where a part is stored does not change what it contains;
//! - TTL elements that move data (`TO DISK '...'`, `TO VOLUME '...'`) go for the same reason;
//!   other TTL elements (DELETE, WHERE, GROUP BY, RECOMPRESS) stay, since they are recorded in the
//!   part's `ttl.txt`. Consequence: parts built here carry no move-TTL information, so the
//!   server moves them only once a merge or `ALTER TABLE ... MATERIALIZE TTL` recomputes it.
//!
//! Everything else is kept byte for byte. Engines outside the MergeTree family are refused:
//! only MergeTree tables have parts to attach.
//!
//! The edit works on tokens (a small lexer in the private `sql` module), not a full parser. The delicate part is
//! finding clause keywords: ClickHouse prints identifiers unquoted when it can, so
//! `ORDER BY settings SETTINGS index_granularity = 8192` is a real `create_table_query` of a
//! table with a column called `settings`. A keyword word starts a clause only at bracket depth 0
//! and only where an expression could have ended (not after an operator, a comma or a word such
//! as `BY` or `AND` that needs an operand).

use crate::sql::{lex, quote_ident, unquote, Kind, Token};

/// The non-replicated MergeTree-family engines; each may also be `Replicated`-prefixed.
const MERGE_TREE_FAMILY: &[&str] = &[
    "MergeTree",
    "ReplacingMergeTree",
    "SummingMergeTree",
    "AggregatingMergeTree",
    "CollapsingMergeTree",
    "VersionedCollapsingMergeTree",
    "GraphiteMergeTree",
    "CoalescingMergeTree",
];

/// Settings naming where the server stores data; meaningless (and invalid) locally.
const STORAGE_SETTINGS: &[&str] = &["storage_policy", "disk"];

/// Why a `create_table_query` cannot be adapted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DdlError {
    /// The text does not lex as SQL.
    #[error("cannot read the table DDL: {problem} at byte {offset}: {excerpt}")]
    Lex {
        /// Byte offset of the problem.
        offset: usize,
        /// What is wrong.
        problem: &'static str,
        /// The text around it.
        excerpt: String,
    },
    /// Not a `CREATE TABLE` statement (e.g. a view or a dictionary).
    #[error("the table DDL is not a CREATE TABLE statement: it starts with {start:?}")]
    NotCreateTable {
        /// The first words.
        start: String,
    },
    /// Something expected is missing or something unexpected is there.
    #[error("cannot read the table DDL: expected {expected} at byte {offset}, found {found:?}")]
    Unexpected {
        /// What the adapter expected.
        expected: &'static str,
        /// Byte offset.
        offset: usize,
        /// What is there instead (truncated).
        found: String,
    },
    /// A clause appears twice.
    #[error("cannot read the table DDL: the {clause} clause appears twice")]
    DuplicateClause {
        /// The clause keyword.
        clause: &'static str,
    },
    /// The engine is not in the MergeTree family.
    #[error("table engine {engine} is not a MergeTree-family engine: chpart builds and attaches MergeTree parts only (engines: [Replicated]{{{family}}})", family = MERGE_TREE_FAMILY.join(", "))]
    NotMergeTree {
        /// The engine name.
        engine: String,
    },
    /// A `Replicated*` engine whose arguments are neither (path, replica, ...) nor defaults.
    #[error("engine {engine}({args}): expected the ZooKeeper path and replica name as two string literals, or no path arguments")]
    ReplicatedArgs {
        /// The engine name.
        engine: String,
        /// Its arguments as written.
        args: String,
    },
}

/// Clauses after `ENGINE = ...`, in the order ClickHouse prints them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClauseKind {
    PartitionBy,
    PrimaryKey,
    OrderBy,
    SampleBy,
    Ttl,
    Settings,
    Comment,
}

impl ClauseKind {
    fn keyword(self) -> &'static str {
        match self {
            ClauseKind::PartitionBy => "PARTITION BY",
            ClauseKind::PrimaryKey => "PRIMARY KEY",
            ClauseKind::OrderBy => "ORDER BY",
            ClauseKind::SampleBy => "SAMPLE BY",
            ClauseKind::Ttl => "TTL",
            ClauseKind::Settings => "SETTINGS",
            ClauseKind::Comment => "COMMENT",
        }
    }
}

/// Words after which an operand must follow, so a keyword-like word there is an identifier.
/// Compared case-sensitively: ClickHouse prints keywords in upper case and identifiers as they
/// are, so `ORDER BY ttl TTL ...` has a column `ttl` followed by the TTL keyword. (Clause
/// keywords themselves are handled by position: the word right after one is its operand.)
const NEEDS_OPERAND: &[&str] = &[
    "BY",
    "KEY",
    "AND",
    "OR",
    "NOT",
    "IS",
    "IN",
    "LIKE",
    "ILIKE",
    "BETWEEN",
    "WHEN",
    "THEN",
    "ELSE",
    "CASE",
    "INTERVAL",
    "WHERE",
    "SET",
    "TO",
    "DISK",
    "VOLUME",
    "RECOMPRESS",
    "CODEC",
    "GLOBAL",
    "ESCAPE",
    "AS",
    "DISTINCT",
    "DIV",
    "MOD",
    "GROUP",
];

/// The statement that creates, in clickhouse-local, table `database`.`table` with the shape of
/// the table whose `system.tables.create_table_query` is `create_table_query`. See the module
/// docs for what changes.
pub fn local_table_ddl(
    create_table_query: &str,
    database: &str,
    table: &str,
) -> Result<String, DdlError> {
    let q = Query::new(create_table_query)?;
    let toks = &q.tokens;

    // CREATE TABLE <name...> ( columns )
    let starts_ok = toks.len() >= 2 && q.is_word(0, "CREATE") && q.is_word(1, "TABLE");
    if !starts_ok {
        return Err(DdlError::NotCreateTable {
            start: excerpt(create_table_query, 0).chars().take(40).collect(),
        });
    }
    // The name runs to the first bracket; a statement without a column list (`AS other`,
    // `ENGINE = ...` straight away) cannot be adapted.
    let cols_open = (2..toks.len())
        .find(|&i| toks[i].kind == Kind::Open || q.is_word(i, "ENGINE") || q.is_word(i, "AS"))
        .filter(|&i| toks[i].kind == Kind::Open && q.text(&toks[i]) == "(");
    let Some(cols_open) = cols_open else {
        let at = (2..toks.len())
            .find(|&i| toks[i].kind == Kind::Open || q.is_word(i, "ENGINE") || q.is_word(i, "AS"));
        return Err(q.unexpected(at.unwrap_or(toks.len()), "the column list"));
    };
    if cols_open == 2 {
        return Err(q.unexpected(2, "the table name"));
    }
    let cols_close = q.matching_close(cols_open);

    // ENGINE = Name[(args)]
    let mut i = cols_close + 1;
    if !q.is_word(i, "ENGINE") {
        return Err(q.unexpected(i, "ENGINE"));
    }
    i += 1;
    if !q.is_punct(i, "=") {
        return Err(q.unexpected(i, "'=' after ENGINE"));
    }
    i += 1;
    if toks.get(i).map(|t| t.kind) != Some(Kind::Word) {
        return Err(q.unexpected(i, "the engine name"));
    }
    let engine_name = q.text(&toks[i]).to_string();
    let args = if toks
        .get(i + 1)
        .is_some_and(|t| t.kind == Kind::Open && q.text(t) == "(")
    {
        let close = q.matching_close(i + 1);
        let args = q.split_commas(i + 2, close);
        i = close + 1;
        Some(args)
    } else {
        i += 1;
        None
    };
    let engine = local_engine(&q, &engine_name, args.as_deref())?;

    // The clauses, each running to the next clause keyword.
    let mut clauses: Vec<(ClauseKind, usize, usize)> = Vec::new();
    let mut j = i;
    let mut keyword_end = None;
    while j < toks.len() {
        // Right after a clause keyword comes its operand, whatever it is called.
        match q.clause_at(j).filter(|_| keyword_end != Some(j)) {
            Some((kind, len)) => {
                if clauses.iter().any(|&(k, _, _)| k == kind) {
                    return Err(DdlError::DuplicateClause {
                        clause: kind.keyword(),
                    });
                }
                if let Some(last) = clauses.last_mut() {
                    last.2 = j;
                }
                clauses.push((kind, j, toks.len()));
                j += len;
                keyword_end = Some(j);
            }
            None if clauses.is_empty() => {
                return Err(q.unexpected(j, "a table clause (PARTITION BY, ORDER BY, ...)"))
            }
            None => j += 1,
        }
    }
    // The body of a clause starts after its keyword; `clauses[n].2` is its end (exclusive).
    let mut out = format!(
        "CREATE TABLE {}.{} ",
        quote_ident(database),
        quote_ident(table)
    );
    out.push_str(q.span(cols_open, cols_close + 1));
    out.push_str(" ENGINE = ");
    out.push_str(&engine);
    for (n, &(kind, keyword_start, _)) in clauses.iter().enumerate() {
        let body_start = keyword_start + kind.keyword().split(' ').count();
        let end = clauses[n].2;
        if body_start >= end {
            return Err(q.unexpected(body_start, "the clause's contents"));
        }
        let body = match kind {
            ClauseKind::Ttl => local_ttl(&q, body_start, end),
            ClauseKind::Settings => local_settings(&q, body_start, end),
            _ => Some(q.span(body_start, end).to_string()),
        };
        if let Some(body) = body {
            out.push(' ');
            out.push_str(kind.keyword());
            out.push(' ');
            out.push_str(&body);
        }
    }
    Ok(out)
}

/// The engine as clickhouse-local gets it: `Replicated` and its path arguments removed.
fn local_engine(
    q: &Query,
    name: &str,
    args: Option<&[(usize, usize)]>,
) -> Result<String, DdlError> {
    let (base, replicated) = match name.strip_prefix("Replicated") {
        Some(base) if MERGE_TREE_FAMILY.contains(&base) => (base, true),
        _ if MERGE_TREE_FAMILY.contains(&name) => (name, false),
        _ => {
            return Err(DdlError::NotMergeTree {
                engine: name.to_string(),
            })
        }
    };
    let Some(args) = args else {
        return Ok(base.to_string());
    };
    let is_string = |&(s, e): &(usize, usize)| e == s + 1 && q.tokens[s].kind == Kind::Str;
    let kept: &[(usize, usize)] = if !replicated {
        args
    } else if base == "GraphiteMergeTree" && args.len() == 1 {
        // ClickHouse reads a lone argument of Graphite as its config section, with default
        // ZooKeeper path and replica.
        args
    } else if args.len() >= 2 && is_string(&args[0]) && is_string(&args[1]) {
        &args[2..]
    } else if args.first().is_none_or(|a| !is_string(a)) {
        // Default path and replica (from the server's config): the arguments are the engine's own.
        args
    } else {
        return Err(DdlError::ReplicatedArgs {
            engine: name.to_string(),
            args: q.args_text(args),
        });
    };
    if !replicated {
        return Ok(format!("{base}({})", q.args_text(args)));
    }
    // `ReplicatedMergeTree('/p', 'r')` becomes `MergeTree`, not `MergeTree()`: same engine, and
    // what ClickHouse prints for a table created without arguments.
    Ok(if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}({})", q.args_text(kept))
    })
}

/// The TTL clause body without its move elements, or None when nothing is left.
///
/// Elements are separated by commas, but so are `GROUP BY` keys and `SET` assignments inside
/// one element (`d + toIntervalMonth(1) GROUP BY a, b SET x = max(x), y = sum(y), d + ...`).
/// As in ClickHouse's parser, keys run greedily, and after `SET` an item continues the element
/// while it is an assignment (`name = ...`).
fn local_ttl(q: &Query, start: usize, end: usize) -> Option<String> {
    #[derive(PartialEq)]
    enum Mode {
        Plain,
        GroupKeys,
        Assignments,
    }
    let mut elements: Vec<(usize, usize)> = Vec::new();
    let mut mode = Mode::Plain;
    for (s, e) in q.split_commas(start, end) {
        let continues = match mode {
            Mode::Plain => false,
            Mode::GroupKeys => true,
            Mode::Assignments => {
                matches!(
                    q.tokens.get(s).map(|t| t.kind),
                    Some(Kind::Word | Kind::Quoted)
                ) && s + 1 < e
                    && q.is_punct(s + 1, "=")
            }
        };
        match elements.last_mut() {
            Some(last) if continues => last.1 = e,
            _ => {
                elements.push((s, e));
                mode = Mode::Plain;
            }
        }
        let base = q.tokens[s].depth;
        for k in s..e {
            if q.tokens[k].depth != base {
                continue;
            }
            if q.is_word(k, "GROUP") && q.is_word(k + 1, "BY") {
                mode = Mode::GroupKeys;
            } else if q.is_word(k, "SET") && mode == Mode::GroupKeys {
                mode = Mode::Assignments;
            }
        }
    }
    let kept: Vec<&str> = elements
        .iter()
        .filter(|&&(s, e)| {
            let base = q.tokens[s].depth;
            let moves = (s..e.saturating_sub(2)).any(|k| {
                q.tokens[k].depth == base
                    && q.is_word(k, "TO")
                    && (q.is_word(k + 1, "DISK") || q.is_word(k + 1, "VOLUME"))
                    && q.tokens[k + 2].kind == Kind::Str
            });
            if moves {
                tracing::debug!(
                    element = q.span(s, e),
                    "dropping a TTL move from the local table"
                );
            }
            !moves
        })
        .map(|&(s, e)| q.span(s, e))
        .collect();
    (!kept.is_empty()).then(|| kept.join(", "))
}

/// The SETTINGS clause body without storage settings, or None when nothing is left.
fn local_settings(q: &Query, start: usize, end: usize) -> Option<String> {
    let kept: Vec<&str> = q
        .split_commas(start, end)
        .into_iter()
        .filter(|&(s, _)| {
            let token = &q.tokens[s];
            let name = match token.kind {
                Kind::Quoted => unquote(q.text(token)),
                _ => q.text(token).to_string(),
            };
            !STORAGE_SETTINGS.contains(&name.as_str())
        })
        .map(|(s, e)| q.span(s, e))
        .collect();
    (!kept.is_empty()).then(|| kept.join(", "))
}

/// The statement and its tokens.
struct Query<'a> {
    text: &'a str,
    tokens: Vec<Token>,
}

impl<'a> Query<'a> {
    fn new(text: &'a str) -> Result<Query<'a>, DdlError> {
        let mut tokens = lex(text).map_err(|e| DdlError::Lex {
            offset: e.offset,
            problem: e.problem,
            excerpt: excerpt(text, e.offset),
        })?;
        // A statement may end with `;`; system.tables prints none.
        while tokens
            .last()
            .is_some_and(|t| t.kind == Kind::Punct && &text[t.start..t.end] == ";")
        {
            tokens.pop();
        }
        Ok(Query { text, tokens })
    }

    fn text(&self, token: &Token) -> &'a str {
        &self.text[token.start..token.end]
    }

    /// The source text from token `first` to token `last_exclusive - 1`.
    fn span(&self, first: usize, last_exclusive: usize) -> &'a str {
        &self.text[self.tokens[first].start..self.tokens[last_exclusive - 1].end]
    }

    /// Argument token ranges as source text, joined with ", ".
    fn args_text(&self, args: &[(usize, usize)]) -> String {
        args.iter()
            .map(|&(s, e)| self.span(s, e))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn is_word(&self, i: usize, word: &str) -> bool {
        self.tokens
            .get(i)
            .is_some_and(|t| t.kind == Kind::Word && self.text(t).eq_ignore_ascii_case(word))
    }

    fn is_punct(&self, i: usize, punct: &str) -> bool {
        self.tokens
            .get(i)
            .is_some_and(|t| t.kind == Kind::Punct && self.text(t) == punct)
    }

    /// Index of the bracket closing the one at `open` (the lexer checked they balance).
    fn matching_close(&self, open: usize) -> usize {
        let depth = self.tokens[open].depth;
        (open + 1..self.tokens.len())
            .find(|&i| self.tokens[i].kind == Kind::Close && self.tokens[i].depth == depth)
            .expect("the lexer checked that brackets balance")
    }

    /// Token ranges between `start` and `end` separated by commas at the depth of `start`.
    fn split_commas(&self, start: usize, end: usize) -> Vec<(usize, usize)> {
        if start >= end {
            return Vec::new();
        }
        let depth = self.tokens[start].depth;
        let mut parts = Vec::new();
        let mut from = start;
        for i in start..end {
            if self.tokens[i].kind == Kind::Comma && self.tokens[i].depth == depth {
                if i > from {
                    parts.push((from, i));
                }
                from = i + 1;
            }
        }
        if end > from {
            parts.push((from, end));
        }
        parts
    }

    /// The clause whose keyword starts at token `i`, with the keyword's length in tokens.
    fn clause_at(&self, i: usize) -> Option<(ClauseKind, usize)> {
        let token = self.tokens.get(i)?;
        if token.kind != Kind::Word || token.depth != 0 {
            return None;
        }
        let found = match self.text(token).to_ascii_uppercase().as_str() {
            "PARTITION" if self.is_word(i + 1, "BY") => (ClauseKind::PartitionBy, 2),
            "PRIMARY" if self.is_word(i + 1, "KEY") => (ClauseKind::PrimaryKey, 2),
            "ORDER" if self.is_word(i + 1, "BY") => (ClauseKind::OrderBy, 2),
            "SAMPLE" if self.is_word(i + 1, "BY") => (ClauseKind::SampleBy, 2),
            "TTL" => (ClauseKind::Ttl, 1),
            "SETTINGS" => (ClauseKind::Settings, 1),
            "COMMENT" => (ClauseKind::Comment, 1),
            _ => return None,
        };
        let previous = i.checked_sub(1).map(|p| &self.tokens[p]);
        let after_operand = match previous {
            None => false,
            Some(p) => match p.kind {
                Kind::Open | Kind::Comma | Kind::Punct => false,
                Kind::Word => !NEEDS_OPERAND.contains(&self.text(p)),
                Kind::Quoted | Kind::Str | Kind::Number | Kind::Close => true,
            },
        };
        after_operand.then_some(found)
    }

    fn unexpected(&self, i: usize, expected: &'static str) -> DdlError {
        match self.tokens.get(i) {
            Some(t) => DdlError::Unexpected {
                expected,
                offset: t.start,
                found: excerpt(self.text, t.start),
            },
            None => DdlError::Unexpected {
                expected,
                offset: self.text.len(),
                found: "the end of the statement".to_string(),
            },
        }
    }
}

/// Up to 60 characters of `text` from `offset`.
fn excerpt(text: &str, offset: usize) -> String {
    let mut start = offset.min(text.len());
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    text[start..].chars().take(60).collect()
}

#[cfg(test)]
mod tests;
