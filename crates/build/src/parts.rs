//! The clickhouse-local session that builds parts, and the checks a built part must pass.
//!
//! One attempt builds its parts in one clickhouse-local run ([`build_query`]): create the local
//! table from the adapted DDL ([`crate::ddl`]), insert the attempt's rows, and print
//! `system.parts` for the table. The parts are then shipped as they are, so before anything
//! leaves the machine [`inspect_parts`] checks each one against what ClickHouse reported and
//! against what ATTACH PART will expect, and [`digest_part`] records every file's size and
//! SHA-256 so the copy in `detached/` can be verified end to end.
//!
//! Every part must hold exactly the attempt's rows, whatever the table engine, so that the
//! rows can be accounted for from the input to the server (the build compares the parts' rows
//! with the input's, the driver the table's with the parts'). So the inserts run with
//! `optimize_on_insert = 0`: left on, a Replacing, Summing, Aggregating or Collapsing table
//! folds rows while writing (and marks such parts level 1); the table's own engine does that
//! folding after the load, as it would after an INSERT. Merges are stopped, and made impossible
//! for the session's table (see [`NO_BACKGROUND_MERGES`]): a merge would fold rows just the same, the
//! same input would give a different set of parts from run to run, and a merge caught half-way
//! leaves `tmp_merge_*` directories behind.
//!
//! A second session on the same data directory may then rewrite the parts ([`rewrite_query`]):
//! [`Rewrite::Merge`] (`build --merge`) merges each partition into one part with
//! `OPTIMIZE TABLE ... FINAL`; [`Rewrite::ApplyTtl`] applies the table's TTL rules with
//! `ALTER TABLE ... MATERIALIZE TTL`, so expired rows (and expired column values) are gone
//! from the parts as the server's first TTL merge after an INSERT would remove them. Both also
//! apply TTL; neither folds rows in the mutation case, a merge does for the folding engines
//! (which is why the protocol allows `--merge` for plain MergeTree only).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use chpart_core::{FileEntry, PartName, PartNameError, PartitionId};
use sha2::{Digest, Sha256};

use crate::sql::{quote_ident, quote_os, quote_str};

/// One input file of a build, read with the `file()` table function: (absolute path, format,
/// structure). The structure's column names must match the insert columns.
pub type FileSource = (PathBuf, String, String);

/// Why a build query cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// A `file()` source with a relative path: it would be resolved against clickhouse-local's
    /// own directory for user files, not the directory chpart meant.
    #[error("input file {} for the clickhouse-local build is not an absolute path", path.display())]
    RelativePath {
        /// The path.
        path: PathBuf,
    },
    /// A source with no files: the build would make no parts, which is never what was meant.
    #[error("the clickhouse-local build has no input files")]
    NoFiles,
}

/// Table settings that keep the session's table from merging in the background (regular
/// merges select nothing larger than one byte; no TTL merge is ever assigned), set right after
/// it is created. `SYSTEM STOP MERGES` alone is not enough: it lasts one session, and it also
/// stops the mutation [`Rewrite::ApplyTtl`] needs, so a second session has to start merges
/// again. These settings decide what a background merge may pick, not what a part contains:
/// `OPTIMIZE ... FINAL` and mutations still run, and `ALTER ... MODIFY SETTING` leaves the
/// parts' `metadata_version.txt` at 0 (seen on 26.9).
pub const NO_BACKGROUND_MERGES: &str = "max_bytes_to_merge_at_max_space_in_pool = 1, \
     max_bytes_to_merge_at_min_space_in_pool = 1, max_number_of_merges_with_ttl_in_pool = 0";

/// Insert settings that make one part per table partition of each input file, up to
/// [`ONE_BLOCK_BYTES`] of uncompressed rows per file. An INSERT writes one part per partition of
/// every block it squashes its input into, and by default it squashes to blocks of about 1M rows
/// (`min_insert_block_size_rows` = 1,048,449) or 256 MiB: a task of 1.25M rows of one partition
/// gave 2 parts, and a task holding rows of several partitions gave a part per partition per
/// block, all of which the server then has to merge. With no row limit the block ends at the
/// byte limit or at the end of the file, so the whole file becomes one block (clickhouse-local
/// holds it in memory while it sorts and writes it: 280 MB of rows peaked at 1.0 GB RSS with
/// chdb 26.9, against 0.9 GB with the default blocks). Larger inputs still give one part per
/// [`ONE_BLOCK_BYTES`], which a build with `merge_split_partitions` merges into one part per
/// partition (see [`split_partitions`]).
pub const ONE_BLOCK: &str =
    "min_insert_block_size_rows = 0, min_insert_block_size_bytes = 1073741824";

/// The uncompressed bytes of rows one INSERT of a build squashes into one block: [`ONE_BLOCK`].
pub const ONE_BLOCK_BYTES: u64 = 1 << 30;

/// The statements of one build session, ending with a query whose TabSeparated output is what
/// [`inspect_parts`] reads (with `None`). `ddl` is [`crate::ddl::local_table_ddl`]'s statement for
/// `database`.`table`; `insert_columns` are the columns the input provides (empty: all of the
/// table's insertable columns, in table order); one INSERT per file of `files`.
pub fn build_query(
    ddl: &str,
    database: &str,
    table: &str,
    insert_columns: &[String],
    files: Vec<FileSource>,
) -> Result<String, QueryError> {
    BuildSession::single(ddl, database, table, insert_columns).query(true, files)
}

/// The statements of one build session that routes rows to several tables (a Distributed
/// table's shards): see [`BuildSession::routed`]. Ends with each table's parts listing after a
/// marker line ([`split_listings`] separates them).
pub fn build_query_routed(
    tables: &[(String, String, u32)],
    database: &str,
    route: &str,
    insert_columns: &[String],
    files: Vec<FileSource>,
) -> Result<String, QueryError> {
    BuildSession::routed(tables, database, route, insert_columns)?.query(true, files)
}

/// A build's statements in three pieces, so that its input can arrive as several files run in
/// turn by clickhouse-local sessions on one data directory (an Arrow stream spooled in bounded
/// chunks): the first session creates the tables, each inserts its files, and each ends with
/// the listing of every part built so far (the last one's is the build's).
pub struct BuildSession {
    setup: Vec<String>,
    /// What the INSERTs write into (the table, or a routed build's `Null` source).
    insert_target: String,
    insert_columns: Vec<String>,
    listing: Vec<String>,
}

impl BuildSession {
    /// Into `database`.`table`, created by `ddl` ([`crate::ddl::local_table_ddl`]'s statement);
    /// `insert_columns` as for [`build_query`].
    pub fn single(
        ddl: &str,
        database: &str,
        table: &str,
        insert_columns: &[String],
    ) -> BuildSession {
        let target = format!("{}.{}", quote_ident(database), quote_ident(table));
        BuildSession {
            setup: vec![
                format!("CREATE DATABASE {}", quote_ident(database)),
                ddl.trim().trim_end_matches(';').trim_end().to_string(),
                format!("ALTER TABLE {target} MODIFY SETTING {NO_BACKGROUND_MERGES}"),
                format!("SYSTEM STOP MERGES {target}"),
            ],
            insert_target: target,
            insert_columns: insert_columns.to_vec(),
            listing: vec![list_parts(database, table)],
        }
    }

    /// Routed to several tables (a Distributed table's shards): `tables` are (table name,
    /// [`crate::ddl::local_table_ddl`]'s statement for it, route value), all of one definition.
    /// The input goes once into a `Null` table of that definition, and one materialized view
    /// per table takes the rows whose `route` (an expression over the table's columns, e.g.
    /// `chpart_core::routing::Routing::slot_sql`) equals that table's value; so every row is
    /// read, converted and routed once, with the table's defaults computed before the route
    /// is. The listing is each table's parts after a marker line ([`split_listings`]).
    pub fn routed(
        tables: &[(String, String, u32)],
        database: &str,
        route: &str,
        insert_columns: &[String],
    ) -> Result<BuildSession, QueryError> {
        let Some((first, _, _)) = tables.first() else {
            return Err(QueryError::NoFiles);
        };
        let table = |t: &str| format!("{}.{}", quote_ident(database), quote_ident(t));
        let source = table(ROUTED_SOURCE);
        let mut setup = vec![format!("CREATE DATABASE {}", quote_ident(database))];
        for (name, ddl, _) in tables {
            let target = table(name);
            setup.push(ddl.trim().trim_end_matches(';').trim_end().to_string());
            setup.push(format!(
                "ALTER TABLE {target} MODIFY SETTING {NO_BACKGROUND_MERGES}"
            ));
            setup.push(format!("SYSTEM STOP MERGES {target}"));
        }
        setup.push(format!(
            "CREATE TABLE {source} AS {} ENGINE = Null",
            table(first)
        ));
        for (name, _, key) in tables {
            setup.push(format!(
                "CREATE MATERIALIZED VIEW {} TO {} AS SELECT * FROM {source} WHERE ({route}) = {key}",
                table(&format!("{ROUTED_VIEW_PREFIX}{name}")),
                table(name)
            ));
        }
        let mut listing = Vec::new();
        for (name, _, _) in tables {
            listing.push(format!(
                "SELECT {} FORMAT TabSeparated",
                quote_str(&format!("{LISTING_MARKER}{name}"))
            ));
            listing.push(list_parts(database, name));
        }
        Ok(BuildSession {
            setup,
            insert_target: source,
            insert_columns: insert_columns.to_vec(),
            listing,
        })
    }

    /// One session's statements: the setup when `first`, one INSERT per file of `files`, the
    /// listing.
    pub fn query(&self, first: bool, files: Vec<FileSource>) -> Result<String, QueryError> {
        let mut statements = if first {
            self.setup.clone()
        } else {
            Vec::new()
        };
        statements.extend(inserts(&self.insert_target, &self.insert_columns, files)?);
        statements.extend(self.listing.iter().cloned());
        Ok(statements.join(";\n"))
    }
}

/// One `INSERT INTO target` per file of `files`, of the columns `insert_columns` (empty: all
/// of the table's insertable columns). Each part keeps every input row: see the module docs.
fn inserts(
    target: &str,
    insert_columns: &[String],
    files: Vec<FileSource>,
) -> Result<Vec<String>, QueryError> {
    let (column_list, select_list) = if insert_columns.is_empty() {
        (String::new(), "*".to_string())
    } else {
        let quoted: Vec<String> = insert_columns.iter().map(|c| quote_ident(c)).collect();
        (format!(" ({})", quoted.join(", ")), quoted.join(", "))
    };
    let insert =
        format!("INSERT INTO {target}{column_list} SETTINGS optimize_on_insert = 0, {ONE_BLOCK}");
    if files.is_empty() {
        return Err(QueryError::NoFiles);
    }
    files
        .into_iter()
        .map(|(path, format, structure)| {
            if !path.is_absolute() {
                return Err(QueryError::RelativePath { path });
            }
            Ok(format!(
                "{insert} SELECT {select_list} FROM file({}, {}, {})",
                quote_os(path.as_os_str()),
                quote_str(&format),
                quote_str(&structure)
            ))
        })
        .collect()
}

/// The `Null` table a routed build inserts into.
const ROUTED_SOURCE: &str = "chpart_routed_input";
/// Prefix of the routed build's materialized views.
const ROUTED_VIEW_PREFIX: &str = "chpart_route_";
/// The line before each table's listing in [`build_query_routed`]'s output.
const LISTING_MARKER: &str = "chpart-parts-of:";

/// [`build_query_routed`]'s output as each table's listing (what [`inspect_parts`] reads), by
/// table name.
pub fn split_listings(output: &str) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut current: Option<String> = None;
    for line in output.lines() {
        if let Some(table) = line.strip_prefix(LISTING_MARKER) {
            out.insert(table.to_owned(), String::new());
            current = Some(table.to_owned());
        } else if let Some(listing) = current.as_ref().and_then(|t| out.get_mut(t)) {
            listing.push_str(line);
            listing.push('\n');
        }
    }
    out
}

/// How a second session rewrites the parts [`build_query`] made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rewrite {
    /// `OPTIMIZE TABLE ... FINAL`: one part per partition (level > 0), TTL applied, rows folded
    /// as the engine folds them on merge.
    Merge,
    /// `ALTER TABLE ... MATERIALIZE TTL`: each part rewritten by a mutation (level 0, a mutation
    /// version in its name) without its expired rows and values; no rows folded.
    ApplyTtl,
    /// [`Rewrite::Merge`] of parts [`Rewrite::ApplyTtl`] rewrote: merged parts (level > 0) that
    /// keep the mutation version in their names.
    MergeAfterTtl,
}

/// The statements of the second session on the data directory of a [`build_query`] session:
/// merges started (for this session; [`NO_BACKGROUND_MERGES`] still keeps background merges
/// from picking anything), the rewrite run to its end, then the same parts listing. A merge
/// covers the partitions `partitions` names (`OPTIMIZE TABLE ... PARTITION ID ... FINAL` each),
/// or with `None` the whole table; [`Rewrite::ApplyTtl`] always covers the whole table.
pub fn rewrite_query(
    database: &str,
    table: &str,
    rewrite: Rewrite,
    partitions: Option<&[PartitionId]>,
) -> String {
    let target = format!("{}.{}", quote_ident(database), quote_ident(table));
    let run = match (rewrite, partitions) {
        (Rewrite::Merge | Rewrite::MergeAfterTtl, None) => {
            vec![format!("OPTIMIZE TABLE {target} FINAL")]
        }
        (Rewrite::Merge | Rewrite::MergeAfterTtl, Some(ids)) => ids
            .iter()
            .map(|id| {
                format!(
                    "OPTIMIZE TABLE {target} PARTITION ID {} FINAL",
                    quote_str(id.as_str())
                )
            })
            .collect(),
        (Rewrite::ApplyTtl, _) => vec![format!(
            "ALTER TABLE {target} MATERIALIZE TTL SETTINGS mutations_sync = 2"
        )],
    };
    std::iter::once(format!("SYSTEM START MERGES {target}"))
        .chain(run)
        .chain([
            format!("SYSTEM STOP MERGES {target}"),
            list_parts(database, table),
        ])
        .collect::<Vec<_>>()
        .join(";\n")
}

/// The partitions `parts` holds several parts of (a build of several inputs or spooled
/// chunks writes one part per partition of each), in order.
pub fn split_partitions(parts: &[BuiltPart]) -> Vec<PartitionId> {
    let mut count = std::collections::BTreeMap::<&PartitionId, usize>::new();
    for part in parts {
        *count.entry(&part.partition_id).or_default() += 1;
    }
    count
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(id, _)| id.clone())
        .collect()
}

/// The active parts, as [`inspect_parts`] reads them.
fn list_parts(database: &str, table: &str) -> String {
    format!(
        "SELECT name, partition_id, rows, hash_of_all_files, path, level, data_version FROM system.parts \
         WHERE database = {} AND table = {} AND active ORDER BY name FORMAT TabSeparated",
        quote_str(database),
        quote_str(table)
    )
}

/// clickhouse-local's arguments for a build session: its data directory and the query.
pub fn local_args(data_path: &Path, query: &str) -> Vec<OsString> {
    vec![
        "--path".into(),
        data_path.into(),
        "--query".into(),
        query.into(),
    ]
}

/// A part clickhouse-local built, as reported by `system.parts` and checked on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltPart {
    /// Its name in the local table (not the name it gets in `detached/`).
    pub local_name: PartName,
    /// Its partition.
    pub partition_id: PartitionId,
    /// Row count (equal to its `count.txt`).
    pub rows: u64,
    /// ClickHouse's `hash_of_all_files` (32 hex digits), which the server reports again after
    /// ATTACH PART: a cheap end-to-end check of the attached part.
    pub hash_of_all_files: String,
    /// The part directory.
    pub dir: PathBuf,
    /// Merge level: 0 unless rewritten by [`Rewrite::Merge`].
    pub level: u32,
}

/// Why the build's output or a built part is not acceptable.
#[derive(Debug, thiserror::Error)]
pub enum PartCheckError {
    /// A line of the `system.parts` output does not have the expected 7 fields.
    #[error(
        "line {line} of clickhouse-local's system.parts output is malformed ({problem}): {text:?}"
    )]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: String,
        /// The line (truncated).
        text: String,
    },
    /// The reported name is not a part name.
    #[error("clickhouse-local reported part {part:?}: {source}")]
    BadName {
        /// The reported name.
        part: String,
        /// Why it is not a part name.
        source: PartNameError,
    },
    /// Something is wrong with one part.
    #[error("part {part} ({}): {problem}", dir.display())]
    Part {
        /// The part's name.
        part: String,
        /// Its directory.
        dir: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Parts of one table reported in different directories.
    #[error("parts {first} and {other} are in different table directories ({} and {})", first_dir.display(), other_dir.display())]
    MixedTableDirs {
        /// A part in the first directory.
        first: String,
        /// Its table directory.
        first_dir: PathBuf,
        /// A part elsewhere.
        other: String,
        /// Its table directory.
        other_dir: PathBuf,
    },
    /// The table directory holds an unfinished part (`tmp_*`).
    #[error("table directory {} holds unfinished part directory {entry:?}: the build did not finish cleanly", table_dir.display())]
    TmpLeftover {
        /// The table's data directory.
        table_dir: PathBuf,
        /// The entry found.
        entry: String,
    },
    /// Listing the table directory failed.
    #[error("cannot list table directory {}: {source}", table_dir.display())]
    ListTableDir {
        /// The table's data directory.
        table_dir: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// Prefixes of directories ClickHouse is still writing (or deleting) in a table directory.
const TMP_PREFIXES: &[&str] = &["tmp_", "tmp-fetch_", "delete_tmp_"];

/// Files every part has and chpart relies on.
const REQUIRED_FILES: &[&str] = &["checksums.txt", "metadata_version.txt", "count.txt"];

/// Reads [`build_query`]'s output (`rewrite` None) or [`rewrite_query`]'s and checks each
/// reported part on disk: the directory exists and is named like the part; the partition in the
/// name is the one reported; the level is 0 (anything after [`Rewrite::Merge`]); there is no
/// mutation (after [`Rewrite::ApplyTtl`], there may be one, and then `data_version` is it,
/// otherwise the part's first block); `checksums.txt` and `metadata_version.txt` exist and
/// `count.txt` equals `rows`; and the table directory (the parts' common parent) holds no
/// `tmp_*` leftovers. Every error names the part and what is wrong. A rewrite may leave parts
/// of 0 rows (every row expired): they are reported like the others.
pub fn inspect_parts(
    system_parts_tsv: &str,
    rewrite: Option<Rewrite>,
) -> Result<Vec<BuiltPart>, PartCheckError> {
    let mut parts = Vec::new();
    let mut table_dir: Option<(String, PathBuf)> = None;
    for (index, line) in system_parts_tsv.lines().enumerate() {
        let malformed = |problem: String| PartCheckError::Malformed {
            line: index + 1,
            problem,
            text: line.chars().take(200).collect(),
        };
        let fields: Vec<String> = line.split('\t').map(unescape_tsv).collect();
        let [name, partition_id, rows, hash, path, level, data_version] = fields.as_slice() else {
            return Err(malformed(format!("{} fields instead of 7", fields.len())));
        };
        let local_name: PartName = name.parse().map_err(|source| PartCheckError::BadName {
            part: name.clone(),
            source,
        })?;
        let dir = PathBuf::from(path.trim_end_matches('/'));
        let fail = |problem: String| PartCheckError::Part {
            part: name.clone(),
            dir: dir.clone(),
            problem,
        };
        let number = |field: &str, text: &str| {
            text.parse::<u64>()
                .map_err(|_| malformed(format!("{field} {text:?} is not a number")))
        };
        let rows = number("rows", rows)?;
        let level = number("level", level)?;
        let data_version = number("data_version", data_version)?;

        if partition_id != local_name.partition_id().as_str() {
            return Err(fail(format!(
                "system.parts reports partition {partition_id:?}, the name says {:?}",
                local_name.partition_id().as_str()
            )));
        }
        if level != u64::from(local_name.level()) {
            return Err(fail(format!(
                "system.parts reports level {level}, the name says {}",
                local_name.level()
            )));
        }
        let expected_version = match (local_name.mutation(), rewrite) {
            (None, _) => local_name.min_block(),
            (Some(mutation), Some(Rewrite::ApplyTtl | Rewrite::MergeAfterTtl)) => mutation,
            (Some(mutation), _) => {
                return Err(fail(format!("it was mutated (mutation version {mutation}); chpart ships freshly written parts only")));
            }
        };
        if level > 0 && !matches!(rewrite, Some(Rewrite::Merge | Rewrite::MergeAfterTtl)) {
            return Err(fail(format!(
                "it is a merged part (level {level}); background merges should have been stopped, and only a build with merge enabled makes merged parts"
            )));
        }
        if data_version != expected_version {
            return Err(fail(format!(
                "data_version {data_version} differs from the part's {} {expected_version}",
                if local_name.mutation().is_some() {
                    "mutation"
                } else {
                    "first block"
                }
            )));
        }
        if hash.len() != 32 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(fail(format!(
                "hash_of_all_files {hash:?} is not 32 hex digits"
            )));
        }
        if !dir.is_absolute() {
            return Err(fail("system.parts reports a relative path".to_string()));
        }
        if dir.file_name().and_then(|n| n.to_str()) != Some(name.as_str()) {
            return Err(fail("the directory is not named like the part".to_string()));
        }
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(fail("the part path is not a directory".to_string())),
            Err(e) => return Err(fail(format!("the part directory is missing: {e}"))),
        }
        for file in REQUIRED_FILES {
            if !dir.join(file).is_file() {
                return Err(fail(format!("{file} is missing")));
            }
        }
        let count_txt = fs::read_to_string(dir.join("count.txt"))
            .map_err(|e| fail(format!("cannot read count.txt: {e}")))?;
        match count_txt.trim().parse::<u64>() {
            Ok(count) if count == rows => {}
            Ok(count) => {
                return Err(fail(format!(
                    "count.txt says {count} rows, system.parts says {rows}"
                )))
            }
            Err(_) => {
                return Err(fail(format!(
                    "count.txt holds {:?}, not a row count",
                    count_txt.chars().take(40).collect::<String>()
                )))
            }
        }

        let parent = dir.parent().map(Path::to_path_buf).unwrap_or_default();
        match &table_dir {
            None => table_dir = Some((name.clone(), parent)),
            Some((first, first_dir)) if *first_dir != parent => {
                return Err(PartCheckError::MixedTableDirs {
                    first: first.clone(),
                    first_dir: first_dir.clone(),
                    other: name.clone(),
                    other_dir: parent,
                })
            }
            Some(_) => {}
        }
        parts.push(BuiltPart {
            partition_id: local_name.partition_id().clone(),
            local_name,
            rows,
            hash_of_all_files: hash.to_ascii_lowercase(),
            dir,
            level: level as u32,
        });
    }
    if let Some((_, table_dir)) = table_dir {
        let entries = fs::read_dir(&table_dir).map_err(|source| PartCheckError::ListTableDir {
            table_dir: table_dir.clone(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| PartCheckError::ListTableDir {
                table_dir: table_dir.clone(),
                source,
            })?;
            let entry = entry.file_name().to_string_lossy().into_owned();
            if TMP_PREFIXES.iter().any(|p| entry.starts_with(p)) {
                return Err(PartCheckError::TmpLeftover { table_dir, entry });
            }
        }
    }
    Ok(parts)
}

/// Whether a part built by [`build_query`] holds rows or column values its table's TTL rules
/// have expired by `now_unix` (seconds), so that [`Rewrite::ApplyTtl`] would change it. Read
/// from the part's `ttl.txt`, where ClickHouse records, per rule, the smallest and largest TTL
/// value of its rows: a rule with `min <= now` has something to remove (`DELETE`, `WHERE`,
/// `GROUP BY`, column TTLs). Moves and recompression change no rows and are not counted. A
/// part without `ttl.txt` belongs to a table without TTL.
pub fn ttl_due(part: &BuiltPart, now_unix: u64) -> Result<bool, PartCheckError> {
    let path = part.dir.join("ttl.txt");
    let fail = |problem: String| PartCheckError::Part {
        part: part.local_name.to_string(),
        dir: part.dir.clone(),
        problem,
    };
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(fail(format!("cannot read ttl.txt: {e}"))),
    };
    ttl_text_due(&text, now_unix).map_err(|problem| fail(format!("ttl.txt: {problem}")))
}

/// [`ttl_due`] on the text of a `ttl.txt` (`ttl format version: 1` and a JSON line).
fn ttl_text_due(text: &str, now_unix: u64) -> Result<bool, String> {
    let json = text
        .strip_prefix("ttl format version: 1")
        .ok_or_else(|| format!("unknown format {:?}", text.lines().next().unwrap_or("")))?;
    let value: serde_json::Value =
        serde_json::from_str(json.trim()).map_err(|e| format!("not JSON: {e}"))?;
    let mut infos = Vec::new();
    for key in ["table", "columns", "group_by", "rows_where"] {
        match value.get(key) {
            None => {}
            Some(serde_json::Value::Array(items)) => infos.extend(items),
            Some(one) => infos.push(one),
        }
    }
    let mut due = false;
    for info in infos {
        let min = info
            .get("min")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| format!("a TTL entry without a numeric min: {info}"))?;
        // ClickHouse's isTTLExpired: a value of 0 means "no TTL".
        due |= min != 0 && min <= now_unix;
    }
    Ok(due)
}

/// A TabSeparated field's value: ClickHouse escapes `\`, tab, newline and a few control
/// characters with a backslash. Unknown escapes keep the escaped character.
fn unescape_tsv(field: &str) -> String {
    if !field.contains('\\') {
        return field.to_string();
    }
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('b') => out.push('\x08'),
            Some('f') => out.push('\x0c'),
            Some('0') => out.push('\0'),
            Some('a') => out.push('\x07'),
            Some('v') => out.push('\x0b'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// Why a part directory cannot be digested.
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    /// The part contains a symlink (or another non-regular entry); chpart copies files and
    /// directories only, and a link could point outside the part.
    #[error("part directory {} contains {kind} {path:?}; only regular files and directories are allowed", dir.display())]
    NotRegular {
        /// The part directory.
        dir: PathBuf,
        /// The entry, relative to it.
        path: String,
        /// "a symlink" or "a special file".
        kind: &'static str,
    },
    /// A file name is not UTF-8 (manifests record paths as strings; ClickHouse never makes such
    /// names).
    #[error("part directory {} contains a path that is not UTF-8: {path:?}", dir.display())]
    NonUtf8 {
        /// The part directory.
        dir: PathBuf,
        /// The path, lossily decoded.
        path: String,
    },
    /// Walking the directory or reading a file failed.
    #[error("cannot digest {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// Every file of the part directory `dir`: path relative to `dir` with `/` separators, size
/// and SHA-256, sorted by path. Files are read in 1 MiB chunks. Symlinks and special files are
/// refused, including `dir` itself being a symlink.
pub fn digest_part(dir: &Path) -> Result<Vec<FileEntry>, DigestError> {
    let meta = fs::symlink_metadata(dir).map_err(|source| DigestError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    if !meta.is_dir() {
        let kind = if meta.file_type().is_symlink() {
            "a symlink"
        } else {
            "a special file"
        };
        return Err(DigestError::NotRegular {
            dir: dir.to_path_buf(),
            path: ".".to_string(),
            kind,
        });
    }
    let mut entries = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    for entry in walkdir::WalkDir::new(dir).follow_links(false).min_depth(1) {
        let entry = entry.map_err(|e| {
            let path = e.path().unwrap_or(dir).to_path_buf();
            DigestError::Io {
                path,
                source: e.into(),
            }
        })?;
        let relative = entry
            .path()
            .strip_prefix(dir)
            .expect("walkdir yields paths under its root");
        let Some(relative) = relative.to_str() else {
            return Err(DigestError::NonUtf8 {
                dir: dir.to_path_buf(),
                path: relative.to_string_lossy().into_owned(),
            });
        };
        let file_type = entry.file_type();
        if file_type.is_dir() {
            continue;
        }
        if !file_type.is_file() {
            let kind = if file_type.is_symlink() {
                "a symlink"
            } else {
                "a special file"
            };
            return Err(DigestError::NotRegular {
                dir: dir.to_path_buf(),
                path: relative.to_string(),
                kind,
            });
        }
        let io_err = |source| DigestError::Io {
            path: entry.path().to_path_buf(),
            source,
        };
        let file = File::open(entry.path()).map_err(io_err)?;
        let (size, sha256) = sha256_of(file, &mut buf).map_err(io_err)?;
        let path = relative
            .split(std::path::MAIN_SEPARATOR)
            .collect::<Vec<_>>()
            .join("/");
        entries.push(FileEntry { path, size, sha256 });
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}

/// The size and hex sha256 of everything `reader` yields, read through `buf`.
pub fn sha256_of(mut reader: impl Read, buf: &mut [u8]) -> io::Result<(u64, String)> {
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    loop {
        let n = match reader.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex::encode(hasher.finalize())))
}

#[cfg(test)]
mod tests;
