use super::*;

fn engine(cluster: &str, database: &str, table: &str, key: Option<&str>) -> DistributedEngine {
    DistributedEngine {
        cluster: cluster.into(),
        database: database.into(),
        table: table.into(),
        sharding_key: key.map(str::to_owned),
        policy: None,
    }
}

#[test]
fn parses_engine_full_as_servers_print_it_and_as_people_write_it() {
    let with_policy = DistributedEngine {
        policy: Some("jbod".into()),
        ..engine("c", "db", "local", Some("rand()"))
    };
    let rows: &[(&str, DistributedEngine)] = &[
        // As system.tables.engine_full prints it (26.9).
        (
            "Distributed('c', 'db', 'local', cityHash64(user_id))",
            engine("c", "db", "local", Some("cityHash64(user_id)")),
        ),
        (
            "Distributed('c', 'db', 'local')",
            engine("c", "db", "local", None),
        ),
        (
            "Distributed(c, db, local, id)",
            engine("c", "db", "local", Some("id")),
        ),
        (
            "Distributed(`my-cluster`, `we``ird`, \"t\\\"x\", id)",
            engine("my-cluster", "we`ird", "t\"x", Some("id")),
        ),
        (
            "Distributed('c', 'db', 'local', rand(), 'jbod')",
            with_policy,
        ),
        (
            "  Distributed ( 'c' ,'db','local' ,  toInt32(id) - 500  )  ",
            engine("c", "db", "local", Some("toInt32(id) - 500")),
        ),
        // Commas, parentheses and escaped quotes inside the key's literals and brackets.
        (
            r"Distributed('c', 'db', 'local', intHash64(id + length('a,)\'')), 'default') SETTINGS fsync_after_insert = 0",
            DistributedEngine {
                policy: Some("default".into()),
                ..engine("c", "db", "local", Some(r"intHash64(id + length('a,)\''))"))
            },
        ),
        (
            "Distributed('c', 'db', 'local', sipHash64(tuple(a, [b, c], {'k': d}), 'x''y'))",
            engine(
                "c",
                "db",
                "local",
                Some("sipHash64(tuple(a, [b, c], {'k': d}), 'x''y')"),
            ),
        ),
        (
            "Distributed('c', 'it''s', 'a\\\\b', id) settings bytes_to_delay_insert = 1",
            engine("c", "it's", "a\\b", Some("id")),
        ),
    ];
    for (text, want) in rows {
        assert_eq!(&DistributedEngine::parse(text).unwrap(), want, "{text}");
    }
}

#[test]
fn refuses_what_is_not_a_distributed_engine_clause() {
    let rows: &[(&str, &str)] = &[
        ("MergeTree ORDER BY id", "does not start with Distributed"),
        ("Distributed", "no ( after"),
        ("Distributed('c', 'db')", "2 arguments"),
        ("Distributed('c', 'db', 't', k, 'p', x)", "6 arguments"),
        ("Distributed('c', 'db', 't', f(k)", "no closing )"),
        ("Distributed('c', 'db', 't', f(k)))", "unexpected \")\""),
        ("Distributed('c', 'db', 't', k]) ", "unbalanced ]"),
        ("Distributed('c', 'db', 't', 'k)", "unterminated '-quoted"),
        (
            "Distributed('c', 'db', 't', k) ORDER BY k",
            "unexpected \"ORDER BY k\"",
        ),
        ("Distributed('c', 'db', 't', k) SETTINGSX", "unexpected"),
        ("Distributed('c', 'db', 't', )", "argument 4 is empty"),
        (
            "Distributed(concat('c', 'd'), 'db', 't')",
            "cluster argument",
        ),
        ("Distributed('c', 'db' 'x', 't')", "database argument"),
        ("Distributed('c', 'db', t-1)", "table argument"),
        ("Distributed('c', 'db', 't', k, p + 1)", "policy argument"),
    ];
    for (text, reason) in rows {
        match DistributedEngine::parse(text) {
            Err(RoutingError::Parse {
                engine_full,
                reason: got,
            }) => {
                assert_eq!(&engine_full, text);
                assert!(got.contains(reason), "{text}: {got:?} lacks {reason:?}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
}

/// A sharding key as (SQL, result type), if any.
type Key<'a> = Option<(&'a str, &'a str)>;

fn routing(key: Key<'_>, weights: &[u32]) -> Routing {
    Routing {
        key: key.map(|(sql, type_name)| ShardingKey {
            sql: sql.into(),
            type_name: type_name.into(),
        }),
        shards: weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| ShardWeight {
                shard_num: i as u32 + 1,
                weight,
            })
            .collect(),
    }
}

#[test]
fn slot_sql_reads_the_key_unsigned_at_its_own_width_and_maps_slots_by_cumulative_weight() {
    let rows: &[(Key, &[u32], &str)] = &[
        (
            Some(("id", "UInt64")),
            &[1, 2, 3],
            "multiIf(reinterpretAsUInt64(id) % 6 < 1, 1, reinterpretAsUInt64(id) % 6 < 3, 2, 3)",
        ),
        // Signed keys are read as unsigned of the same width, never with a signed %.
        (
            Some(("k", "Int32")),
            &[1, 1],
            "multiIf(reinterpretAsUInt32(k) % 2 < 1, 1, 2)",
        ),
        // The width is the whole expression's result type: Int32 - 500 is Int64.
        (
            Some(("toInt32(x) - 500", "Int64")),
            &[1, 2, 3],
            "multiIf(reinterpretAsUInt64(toInt32(x) - 500) % 6 < 1, 1, \
             reinterpretAsUInt64(toInt32(x) - 500) % 6 < 3, 2, 3)",
        ),
        (
            Some(("toInt8(x)", "Int8")),
            &[3, 4],
            "multiIf(reinterpretAsUInt8(toInt8(x)) % 7 < 3, 1, 2)",
        ),
        (
            Some(("toInt16(x)", "Int16")),
            &[1, 1],
            "multiIf(reinterpretAsUInt16(toInt16(x)) % 2 < 1, 1, 2)",
        ),
        (
            Some(("b", "Bool")),
            &[1, 1],
            "multiIf(reinterpretAsUInt8(b) % 2 < 1, 1, 2)",
        ),
        (
            Some(("k", "LowCardinality(UInt32)")),
            &[1, 1],
            "multiIf(reinterpretAsUInt32(k) % 2 < 1, 1, 2)",
        ),
        // Weight 0 owns no slot, wherever it is.
        (
            Some(("id", "UInt64")),
            &[2, 0, 3],
            "multiIf(reinterpretAsUInt64(id) % 5 < 2, 1, 3)",
        ),
        (
            Some(("id", "UInt64")),
            &[0, 1, 1],
            "multiIf(reinterpretAsUInt64(id) % 2 < 1, 2, 3)",
        ),
        (Some(("id", "UInt64")), &[0, 4, 0], "2"),
        // One shard takes every row; the server does not evaluate the key then.
        (None, &[1], "1"),
        (Some(("toDate(t)", "Date")), &[5], "1"),
    ];
    for (key, weights, want) in rows {
        let got = routing(*key, weights).slot_sql();
        assert_eq!(got.as_deref(), Ok(*want), "{key:?} {weights:?}");
    }
}

#[test]
fn slot_sql_refuses_what_clickhouse_refuses_to_route() {
    let unsupported = |key: &str, type_name: &str| RoutingError::UnsupportedKeyType {
        key: key.into(),
        type_name: type_name.into(),
    };
    let rows: &[(Key, &[u32], RoutingError)] = &[
        (Some(("id", "UInt64")), &[], RoutingError::NoShards),
        (
            Some(("id", "UInt64")),
            &[0, 0],
            RoutingError::ZeroTotalWeight { shards: 2 },
        ),
        (None, &[0], RoutingError::ZeroTotalWeight { shards: 1 }),
        (None, &[1, 1], RoutingError::NoShardingKey { shards: 2 }),
        (None, &[1, 0], RoutingError::NoShardingKey { shards: 2 }),
        (Some(("s", "String")), &[1, 1], unsupported("s", "String")),
        (Some(("f", "Float64")), &[1, 1], unsupported("f", "Float64")),
        (Some(("d", "Date")), &[1, 1], unsupported("d", "Date")),
        (
            Some(("t", "DateTime")),
            &[1, 1],
            unsupported("t", "DateTime"),
        ),
        (Some(("i", "Int128")), &[1, 1], unsupported("i", "Int128")),
        (Some(("u", "UInt256")), &[1, 1], unsupported("u", "UInt256")),
        (Some(("ip", "IPv4")), &[1, 1], unsupported("ip", "IPv4")),
        (
            Some(("e", "Enum8('a' = 0, 'b' = 1)")),
            &[1, 1],
            unsupported("e", "Enum8('a' = 0, 'b' = 1)"),
        ),
        (
            Some(("n", "Nullable(UInt64)")),
            &[1, 1],
            unsupported("n", "Nullable(UInt64)"),
        ),
        (
            Some(("n", "LowCardinality(Nullable(UInt64))")),
            &[1, 1],
            unsupported("n", "LowCardinality(Nullable(UInt64))"),
        ),
    ];
    for (key, weights, want) in rows {
        assert_eq!(
            &routing(*key, weights).slot_sql().unwrap_err(),
            want,
            "{key:?} {weights:?}"
        );
    }
    let message = unsupported("lower(s)", "String").to_string();
    assert!(
        message.contains("lower(s)") && message.contains("String"),
        "{message}"
    );
}
