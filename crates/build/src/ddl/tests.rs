use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use crate::runner::LocalCommand;

// Real `system.tables.create_table_query` values, printed by clickhouse-local 26.9 for the
// statements in `ORIGINALS` below (storage_policy/disk 'default' and TO DISK/VOLUME 'default'
// are what exists locally; on a server they would name e.g. 'tiered' and 'cold').
const EVENTS: &str = "CREATE TABLE src.events (`ts` DateTime64(3, 'UTC') CODEC(Delta(8), ZSTD(3)), `id` UInt64, `name` String DEFAULT 'x', `day` Date MATERIALIZED toDate(ts), `n` Nullable(Int32) EPHEMERAL, `arr` Array(String) ALIAS [name], `m` Map(String, UInt64), INDEX idx_name name TYPE bloom_filter GRANULARITY 4, PROJECTION p (SELECT id, name ORDER BY name)) ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id TTL toDateTime(ts) + toIntervalDay(1) TO VOLUME 'default', toDateTime(ts) + toIntervalYear(1) SETTINGS index_granularity = 8192, storage_policy = 'default', min_bytes_for_wide_part = 0";
const EVENTS_COLUMNS: &str = "(`ts` DateTime64(3, 'UTC') CODEC(Delta(8), ZSTD(3)), `id` UInt64, `name` String DEFAULT 'x', `day` Date MATERIALIZED toDate(ts), `n` Nullable(Int32) EPHEMERAL, `arr` Array(String) ALIAS [name], `m` Map(String, UInt64), INDEX idx_name name TYPE bloom_filter GRANULARITY 4, PROJECTION p (SELECT id, name ORDER BY name))";
const REPL: &str = "CREATE TABLE src.repl (`id` UInt64, `ver` UInt32, `s` LowCardinality(String)) ENGINE = ReplacingMergeTree(ver) PARTITION BY id % 4 ORDER BY id SETTINGS disk = 'default', index_granularity = 8192";
const KW: &str = "CREATE TABLE src.kw (`ttl` DateTime, `settings` UInt32, `comment` String, `order` UInt8) ENGINE = MergeTree PARTITION BY settings ORDER BY ttl TTL ttl + toIntervalDay(1) TO DISK 'default' SETTINGS storage_policy = 'default', index_granularity = 8192 COMMENT 'TTL x TO DISK \\'y\\', SETTINGS disk = 1'";
const GRP: &str = "CREATE TABLE src.grp (`d` DateTime, `a` UInt32, `b` UInt32, `x` UInt64, `y` UInt64) ENGINE = SummingMergeTree((x, y)) PARTITION BY toYYYYMM(d) PRIMARY KEY (a, b) ORDER BY (a, b, d) TTL d + toIntervalMonth(1) GROUP BY a, b SET x = max(x), y = sum(y), d + toIntervalWeek(1) TO DISK 'default', d + toIntervalYear(2) WHERE a = 1, d + toIntervalYear(3) RECOMPRESS CODEC(ZSTD(9)) SETTINGS index_granularity = 8192";
const ODD: &str = "CREATE TABLE src.`odd name.x y` (`k` UInt64, `sign` Int8, `ver` UInt8, `v` Float64 CODEC(Gorilla(8), LZ4HC(9)) TTL toDateTime(k) + toIntervalDay(1)) ENGINE = VersionedCollapsingMergeTree(sign, ver) ORDER BY (k, intHash32(ver)) SAMPLE BY intHash32(ver) SETTINGS index_granularity = 8192";
const AGG: &str = "CREATE TABLE src.agg (`k` UInt64, `x` AggregateFunction(uniq, UInt64), `y` SimpleAggregateFunction(sum, UInt64)) ENGINE = AggregatingMergeTree ORDER BY k SETTINGS storage_policy = 'default', index_granularity = 8192";

/// The statements that produced the constants above; the real-component test creates them
/// again and compares the adapted tables with them.
const ORIGINALS: &[(&str, &str)] = &[
    ("events", "CREATE TABLE src.events (ts DateTime64(3, 'UTC') CODEC(Delta, ZSTD(3)), id UInt64, name String DEFAULT 'x', day Date MATERIALIZED toDate(ts), n Nullable(Int32) EPHEMERAL, arr Array(String) ALIAS [name], m Map(String, UInt64), INDEX idx_name name TYPE bloom_filter GRANULARITY 4, PROJECTION p (SELECT id, name ORDER BY name)) ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id TTL toDateTime(ts) + INTERVAL 1 DAY TO VOLUME 'default', toDateTime(ts) + INTERVAL 1 YEAR DELETE SETTINGS index_granularity = 8192, storage_policy = 'default', min_bytes_for_wide_part = 0"),
    ("repl", "CREATE TABLE src.repl (id UInt64, ver UInt32, s LowCardinality(String)) ENGINE = ReplacingMergeTree(ver) PARTITION BY id % 4 ORDER BY id SETTINGS disk = 'default'"),
    ("kw", "CREATE TABLE src.kw (ttl DateTime, settings UInt32, comment String, `order` UInt8) ENGINE = MergeTree PARTITION BY settings ORDER BY ttl TTL ttl + INTERVAL 1 DAY TO DISK 'default' SETTINGS storage_policy = 'default' COMMENT 'TTL x TO DISK ''y'', SETTINGS disk = 1'"),
    ("grp", "CREATE TABLE src.grp (d DateTime, a UInt32, b UInt32, x UInt64, y UInt64) ENGINE = SummingMergeTree((x, y)) PARTITION BY toYYYYMM(d) PRIMARY KEY (a, b) ORDER BY (a, b, d) TTL d + INTERVAL 1 MONTH GROUP BY a, b SET x = max(x), y = sum(y), d + INTERVAL 1 WEEK TO DISK 'default', d + INTERVAL 2 YEAR DELETE WHERE a = 1, d + INTERVAL 3 YEAR RECOMPRESS CODEC(ZSTD(9))"),
    ("odd name.x y", "CREATE TABLE src.`odd name.x y` (k UInt64, sign Int8, ver UInt8, v Float64 CODEC(Gorilla, LZ4HC(9)) TTL toDateTime(k) + INTERVAL 1 DAY) ENGINE = VersionedCollapsingMergeTree(sign, ver) ORDER BY (k, intHash32(ver)) SAMPLE BY intHash32(ver)"),
    ("agg", "CREATE TABLE src.agg (k UInt64, x AggregateFunction(uniq, UInt64), y SimpleAggregateFunction(sum, UInt64)) ENGINE = AggregatingMergeTree ORDER BY k SETTINGS storage_policy = 'default'"),
];

#[test]
fn adapts_real_create_table_queries() {
    let events_out = format!(
        "CREATE TABLE `chpart`.`t` {EVENTS_COLUMNS} ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id TTL toDateTime(ts) + toIntervalYear(1) SETTINGS index_granularity = 8192, min_bytes_for_wide_part = 0"
    );
    let cases: &[(&str, &str, String)] = &[
        ("codecs, defaults, MATERIALIZED, EPHEMERAL, ALIAS, index, projection, move + delete TTL, storage_policy among other settings", EVENTS, events_out.clone()),
        (
            "ReplacingMergeTree(ver), disk setting",
            REPL,
            "CREATE TABLE `chpart`.`t` (`id` UInt64, `ver` UInt32, `s` LowCardinality(String)) ENGINE = ReplacingMergeTree(ver) PARTITION BY id % 4 ORDER BY id SETTINGS index_granularity = 8192".into(),
        ),
        (
            "columns named like clause keywords, only a move TTL, keywords inside the comment",
            KW,
            "CREATE TABLE `chpart`.`t` (`ttl` DateTime, `settings` UInt32, `comment` String, `order` UInt8) ENGINE = MergeTree PARTITION BY settings ORDER BY ttl SETTINGS index_granularity = 8192 COMMENT 'TTL x TO DISK \\'y\\', SETTINGS disk = 1'".into(),
        ),
        (
            "GROUP BY ... SET TTL element with commas, WHERE, RECOMPRESS, PRIMARY KEY, Summing((x, y))",
            GRP,
            "CREATE TABLE `chpart`.`t` (`d` DateTime, `a` UInt32, `b` UInt32, `x` UInt64, `y` UInt64) ENGINE = SummingMergeTree((x, y)) PARTITION BY toYYYYMM(d) PRIMARY KEY (a, b) ORDER BY (a, b, d) TTL d + toIntervalMonth(1) GROUP BY a, b SET x = max(x), y = sum(y), d + toIntervalYear(2) WHERE a = 1, d + toIntervalYear(3) RECOMPRESS CODEC(ZSTD(9)) SETTINGS index_granularity = 8192".into(),
        ),
        (
            "backquoted name with dot and space, column TTL, SAMPLE BY, VersionedCollapsing",
            ODD,
            "CREATE TABLE `chpart`.`t` (`k` UInt64, `sign` Int8, `ver` UInt8, `v` Float64 CODEC(Gorilla(8), LZ4HC(9)) TTL toDateTime(k) + toIntervalDay(1)) ENGINE = VersionedCollapsingMergeTree(sign, ver) ORDER BY (k, intHash32(ver)) SAMPLE BY intHash32(ver) SETTINGS index_granularity = 8192".into(),
        ),
        (
            "engine without arguments, storage_policy first",
            AGG,
            "CREATE TABLE `chpart`.`t` (`k` UInt64, `x` AggregateFunction(uniq, UInt64), `y` SimpleAggregateFunction(sum, UInt64)) ENGINE = AggregatingMergeTree ORDER BY k SETTINGS index_granularity = 8192".into(),
        ),
        // Server-side variants of the above (replicated engines and a tiered policy cannot be
        // created in clickhouse-local, so these are the real strings with the server's parts).
        (
            "replicated with macros, tiered policy, cold volume",
            "CREATE TABLE db.events (`ts` DateTime64(3, 'UTC') CODEC(Delta(8), ZSTD(3)), `id` UInt64, `name` String DEFAULT 'x', `day` Date MATERIALIZED toDate(ts), `n` Nullable(Int32) EPHEMERAL, `arr` Array(String) ALIAS [name], `m` Map(String, UInt64), INDEX idx_name name TYPE bloom_filter GRANULARITY 4, PROJECTION p (SELECT id, name ORDER BY name)) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/db/events', '{replica}') PARTITION BY toYYYYMM(ts) ORDER BY id TTL toDateTime(ts) + toIntervalDay(1) TO VOLUME 'cold', toDateTime(ts) + toIntervalYear(1) SETTINGS index_granularity = 8192, storage_policy = 'tiered', min_bytes_for_wide_part = 0",
            events_out,
        ),
        (
            "ReplicatedReplacingMergeTree(path, replica, ver), disk only setting",
            "CREATE TABLE db.repl (`id` UInt64, `ver` UInt32) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}', ver) ORDER BY id SETTINGS disk = 's3_cache'",
            "CREATE TABLE `chpart`.`t` (`id` UInt64, `ver` UInt32) ENGINE = ReplacingMergeTree(ver) ORDER BY id".into(),
        ),
        (
            "Replicated with default path arguments",
            "CREATE TABLE db.c (`k` UInt64, `sign` Int8, `ver` UInt8) ENGINE = ReplicatedVersionedCollapsingMergeTree(sign, ver) ORDER BY k SETTINGS index_granularity = 8192",
            "CREATE TABLE `chpart`.`t` (`k` UInt64, `sign` Int8, `ver` UInt8) ENGINE = VersionedCollapsingMergeTree(sign, ver) ORDER BY k SETTINGS index_granularity = 8192".into(),
        ),
        (
            "ReplicatedMergeTree() and bare Replicated",
            "CREATE TABLE db.t (`k` UInt64) ENGINE = ReplicatedMergeTree() ORDER BY k",
            "CREATE TABLE `chpart`.`t` (`k` UInt64) ENGINE = MergeTree ORDER BY k".into(),
        ),
        (
            "ReplicatedGraphiteMergeTree: a lone argument is the config section",
            "CREATE TABLE db.g (`Path` String, `Time` DateTime, `Value` Float64, `Version` UInt32) ENGINE = ReplicatedGraphiteMergeTree('graphite_rollup') ORDER BY (Path, Time)",
            "CREATE TABLE `chpart`.`t` (`Path` String, `Time` DateTime, `Value` Float64, `Version` UInt32) ENGINE = GraphiteMergeTree('graphite_rollup') ORDER BY (Path, Time)".into(),
        ),
        (
            "hand-written: lower case, ';', a name with '(' in backquotes, UUID, whitespace",
            "create table `my (db)`.`we(ird` UUID '3a5b0c1e-0000-4000-8000-000000000001'\n  (k UInt64, ts DateTime)\n  engine = ReplicatedSummingMergeTree('/p', 'r')\n  order by k\n  ttl ts + interval 1 day to volume 'cold', ts + interval 2 day\n  settings storage_policy = 'tiered' ;",
            "CREATE TABLE `chpart`.`t` (k UInt64, ts DateTime) ENGINE = SummingMergeTree ORDER BY k TTL ts + interval 2 day".into(),
        ),
        (
            "dynamic disk setting with nested arguments",
            "CREATE TABLE db.t (`k` UInt64) ENGINE = MergeTree ORDER BY k SETTINGS disk = disk(type = local, path = '/x/, y'), index_granularity = 1024",
            "CREATE TABLE `chpart`.`t` (`k` UInt64) ENGINE = MergeTree ORDER BY k SETTINGS index_granularity = 1024".into(),
        ),
    ];
    for (what, input, want) in cases {
        let got = local_table_ddl(input, "chpart", "t").unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(&got, want, "{what}");
    }
    // Names are quoted whatever they hold.
    let got = local_table_ddl(AGG, "my db", "a.b`c").unwrap();
    assert!(
        got.starts_with("CREATE TABLE `my db`.`a.b\\`c` (`k` UInt64"),
        "{got}"
    );
}

#[test]
fn refuses_what_cannot_be_built() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "CREATE TABLE db.t (`k` UInt64) ENGINE = Log",
            "table engine Log is not a MergeTree-family engine",
            "Log",
        ),
        (
            "CREATE TABLE db.t (`k` UInt64) ENGINE = Distributed('c', 'db', 'local', rand())",
            "engine Distributed is not a MergeTree-family",
            "Distributed",
        ),
        (
            "CREATE TABLE db.t (`k` UInt64) ENGINE = SharedMergeTree('/p', 'r') ORDER BY k",
            "SharedMergeTree is not a MergeTree-family",
            "Shared",
        ),
        (
            "CREATE TABLE db.t (`k` UInt64) ENGINE = ReplicatedMergeTree('/only/path') ORDER BY k",
            "expected the ZooKeeper path and replica name",
            "ReplicatedMergeTree('/only/path')",
        ),
        (
            "CREATE VIEW db.v (`k` UInt64) AS SELECT 1",
            "not a CREATE TABLE statement",
            "CREATE VIEW db.v",
        ),
        (
            "CREATE MATERIALIZED VIEW db.v TO db.t (`k` UInt64) AS SELECT 1",
            "not a CREATE TABLE statement",
            "MATERIALIZED",
        ),
        (
            "CREATE DICTIONARY db.d (`k` UInt64) PRIMARY KEY k",
            "not a CREATE TABLE statement",
            "DICTIONARY",
        ),
        (
            "CREATE TABLE db.t AS db.other ENGINE = MergeTree ORDER BY k",
            "expected the column list",
            "AS db.other",
        ),
        (
            "CREATE TABLE (`k` UInt64) ENGINE = MergeTree ORDER BY k",
            "expected the table name",
            "(`k`",
        ),
        (
            "CREATE TABLE db.t (`k` UInt64) ORDER BY k",
            "expected ENGINE",
            "ORDER BY k",
        ),
        (
            "CREATE TABLE db.t (`k` UInt64) ENGINE MergeTree ORDER BY k",
            "expected '=' after ENGINE",
            "MergeTree ORDER",
        ),
        (
            "CREATE TABLE db.t (`k` UInt64) ENGINE = MergeTree WHATEVER k",
            "expected a table clause",
            "WHATEVER k",
        ),
        (
            "CREATE TABLE db.t (`k` UInt64) ENGINE = MergeTree ORDER BY k ORDER BY k",
            "the ORDER BY clause appears twice",
            "ORDER BY",
        ),
        (
            "CREATE TABLE db.t (`k` UInt64) ENGINE = MergeTree ORDER BY",
            "expected the clause's contents",
            "end of the statement",
        ),
        (
            "CREATE TABLE db.t (`k` UInt64) ENGINE = MergeTree ORDER BY k COMMENT 'x",
            "unterminated string literal",
            "'x",
        ),
        (
            "CREATE TABLE db.t (`k` UInt64 ENGINE = MergeTree ORDER BY k",
            "unclosed bracket",
            "",
        ),
    ];
    for (input, message, detail) in cases {
        let err = local_table_ddl(input, "chpart", "t")
            .expect_err(input)
            .to_string();
        assert!(err.contains(message), "{input}: {err}");
        assert!(
            err.contains(detail),
            "{input}: {err} should mention {detail:?}"
        );
    }
}

/// Runs `query` in clickhouse-local with data directory `path`, panicking with the error.
fn local(path: &std::path::Path, query: &str) -> String {
    let command = LocalCommand::new(chpart_testenv::clickhouse_local(), Duration::from_secs(120));
    let args = ["--path".into(), path.into(), "--query".into(), query.into()];
    let out = command
        .run(&args)
        .unwrap_or_else(|e| panic!("{e}\nquery: {query}"));
    String::from_utf8(out).expect("UTF-8 output")
}

/// For each table of `database`: its engine and keys, columns, skipping indices and projections.
fn shape(path: &std::path::Path, database: &str) -> BTreeMap<String, Vec<String>> {
    let db = crate::sql::quote_str(database);
    let query = format!(
        "SELECT name, 'table', concat(engine, ' | ', partition_key, ' | ', sorting_key, ' | ', primary_key, ' | ', sampling_key) FROM system.tables WHERE database = {db} \
         UNION ALL SELECT table, 'column', concat(toString(position), ' ', name, ' ', type, ' | ', default_kind, ' | ', default_expression, ' | ', compression_codec, ' | ', comment) FROM system.columns WHERE database = {db} \
         UNION ALL SELECT table, 'index', concat(name, ' ', type_full, ' ', expr, ' ', toString(granularity)) FROM system.data_skipping_indices WHERE database = {db} \
         UNION ALL SELECT table, 'projection', concat(name, ' ', type, ' ', query) FROM system.projections WHERE database = {db} \
         FORMAT TabSeparated"
    );
    let mut shapes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in local(path, &query).lines() {
        let (table, rest) = line.split_once('\t').expect("tab-separated");
        shapes
            .entry(table.to_string())
            .or_default()
            .push(rest.to_string());
    }
    shapes.values_mut().for_each(|lines| lines.sort());
    shapes
}

#[test]
fn adapted_ddl_creates_the_same_table_in_clickhouse_local() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let mut create = String::from("CREATE DATABASE src; CREATE DATABASE dst;");
    for (_, statement) in ORIGINALS {
        create.push_str(statement);
        create.push(';');
    }
    create.push_str("SELECT name, create_table_query FROM system.tables WHERE database = 'src' ORDER BY name FORMAT TSVRaw");
    let queries: BTreeMap<String, String> = local(&path, &create)
        .lines()
        .map(|line| {
            let (name, query) = line.split_once('\t').expect("tab-separated");
            (name.to_string(), query.to_string())
        })
        .collect();
    assert_eq!(queries.len(), ORIGINALS.len(), "{queries:?}");
    // The constants of the unit test are what this clickhouse-local prints.
    let printed = [
        ("events", EVENTS),
        ("repl", REPL),
        ("kw", KW),
        ("grp", GRP),
        ("odd name.x y", ODD),
        ("agg", AGG),
    ];
    for (name, constant) in printed {
        assert_eq!(
            queries[name], constant,
            "create_table_query of {name} changed"
        );
    }

    let mut adapted = String::new();
    for (name, query) in &queries {
        adapted.push_str(
            &local_table_ddl(query, "dst", name).unwrap_or_else(|e| panic!("{name}: {e}")),
        );
        adapted.push(';');
    }
    adapted.push_str("SELECT count() FROM system.tables WHERE database = 'dst'");
    assert_eq!(local(&path, &adapted).trim(), ORIGINALS.len().to_string());

    let src = shape(&path, "src");
    let dst = shape(&path, "dst");
    assert_eq!(src.len(), ORIGINALS.len());
    for (table, original) in &src {
        assert!(
            original.iter().any(|l| l.starts_with("column")),
            "{table}: no columns read"
        );
        if table == "events" {
            assert!(
                original.iter().any(|l| l.starts_with("index"))
                    && original.iter().any(|l| l.starts_with("projection")),
                "{original:?}"
            );
        }
        assert_eq!(
            dst.get(table),
            Some(original),
            "table {table} differs after adaptation"
        );
    }
    // Sanity: the comparison would notice a difference (the two tables' shapes differ).
    assert_ne!(src["repl"], src["agg"]);
}
