//! chpart-server against the real ClickHouse 26.9 engine.

use std::time::Duration;

use chpart_server::{ErrorClass, Server, ServerConfig, ServerError};
use chpart_testenv::clickhouse::{shared, ClickHouse, TestDb};

fn client(server: &ClickHouse) -> Server {
    Server::new(&ServerConfig {
        url: server.url(),
        user: "default".into(),
        password: None,
        request_timeout: Duration::from_secs(60),
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn reads_definitions_parts_and_detached_parts() {
    let ch = shared();
    let db = TestDb::new(ch, "server_reads");
    let d = &db.name;
    ch.q(&format!(
        "CREATE TABLE `{d}`.ev (ts DateTime, id UInt64, name LowCardinality(String) DEFAULT 'x') \
         ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id"
    ));
    ch.q(&format!("INSERT INTO `{d}`.ev (ts, id) VALUES ('2026-01-05 00:00:00', 1), ('2026-02-05 00:00:00', 2)"));
    let server = client(ch);
    runtime().block_on(async {
        assert_eq!(server.version().await.unwrap(), "26.9.2.1");
        assert!(server.database_exists(d).await.unwrap());
        assert!(!server.database_exists("no_such_db_here").await.unwrap());

        let info = server
            .table_info(d, "ev")
            .await
            .unwrap()
            .expect("table exists");
        assert_eq!(info.engine, "MergeTree");
        assert_eq!(info.partition_key, "toYYYYMM(ts)");
        assert_eq!(info.sorting_key, "id");
        assert_eq!(info.data_paths.len(), 1);
        assert!(
            info.data_paths[0].starts_with(ch.data_dir.to_str().unwrap()),
            "{:?}",
            info.data_paths
        );
        assert!(info.create_table_query.starts_with("CREATE TABLE"));
        assert!(server.table_info(d, "missing").await.unwrap().is_none());

        let columns = server.columns(d, "ev").await.unwrap();
        let shape: Vec<(&str, &str, &str)> = columns
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.type_name.as_str(),
                    c.default_kind.as_str(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            [
                ("ts", "DateTime", ""),
                ("id", "UInt64", ""),
                ("name", "LowCardinality(String)", "DEFAULT")
            ]
        );

        let parts: Vec<_> = server
            .table_state(d, "ev")
            .await
            .unwrap()
            .into_iter()
            .filter(|r| !r.detached)
            .collect();
        assert_eq!(parts.len(), 2);
        assert!(parts
            .iter()
            .all(|p| p.rows == 1 && p.hash_of_all_files.len() == 32));
        assert_eq!(server.count(d, "ev").await.unwrap(), 2);
        let checks = server.check_tables(&[(d, "ev")]).await.unwrap();
        assert_eq!(checks[0].pending_mutations, 0);

        // DETACH, see it in detached/, ATTACH it back by exact name, and attach twice fails.
        let jan = parts.iter().find(|p| p.partition_id == "202601").unwrap();
        server
            .execute(&format!("ALTER TABLE `{d}`.ev DETACH PART '{}'", jan.name))
            .await
            .unwrap();
        let detached = server.detached_parts(d, "ev").await.unwrap();
        assert_eq!(detached.len(), 1, "{detached:?}");
        assert_eq!(detached[0].name, jan.name);
        assert_eq!(detached[0].reason, None);
        assert_eq!(detached[0].partition_id.as_deref(), Some("202601"));
        assert_eq!(server.count(d, "ev").await.unwrap(), 1);
        server.attach_part(d, "ev", &jan.name).await.unwrap();
        assert_eq!(server.count(d, "ev").await.unwrap(), 2);
        let again = server.attach_part(d, "ev", &jan.name).await.unwrap_err();
        assert_eq!(again.code(), Some(233), "{again}");
        assert_eq!(again.class(false), ErrorClass::Permanent);
        assert!(again.to_string().contains("ATTACH PART"), "{again}");

        // DROP DETACHED PART removes a detached part for good.
        let feb = parts.iter().find(|p| p.partition_id == "202602").unwrap();
        server
            .execute(&format!("ALTER TABLE `{d}`.ev DETACH PART '{}'", feb.name))
            .await
            .unwrap();
        server.drop_detached_part(d, "ev", &feb.name).await.unwrap();
        assert!(server.detached_parts(d, "ev").await.unwrap().is_empty());
        assert_eq!(server.count(d, "ev").await.unwrap(), 1);
    });
}

#[test]
fn table_state_and_check_tables_answer_for_several_tables_at_once() {
    let ch = shared();
    let db = TestDb::new(ch, "server_batched");
    let d = &db.name;
    for t in ["a", "b"] {
        ch.q(&format!(
            "CREATE TABLE `{d}`.{t} (ts DateTime, id UInt64) ENGINE = MergeTree \
             PARTITION BY toYYYYMM(ts) ORDER BY id"
        ));
    }
    ch.q(&format!(
        "INSERT INTO `{d}`.a VALUES ('2026-01-05 00:00:00', 1), ('2026-02-05 00:00:00', 2), \
         ('2026-02-06 00:00:00', 3)"
    ));
    // A mutation that cannot run while merges are stopped stays pending.
    ch.q(&format!("SYSTEM STOP MERGES `{d}`.b"));
    ch.q(&format!(
        "INSERT INTO `{d}`.b VALUES ('2026-01-05 00:00:00', 1)"
    ));
    ch.q(&format!(
        "ALTER TABLE `{d}`.b DELETE WHERE id = 1 SETTINGS mutations_sync = 0"
    ));
    let server = client(ch);
    runtime().block_on(async {
        let parts = server.table_state(d, "a").await.unwrap();
        let jan = parts.iter().find(|p| p.partition_id == "202601").unwrap();
        server
            .execute(&format!("ALTER TABLE `{d}`.a DETACH PART '{}'", jan.name))
            .await
            .unwrap();

        let mut state = server.table_state(d, "a").await.unwrap();
        state.sort_by(|x, y| (x.detached, &x.name).cmp(&(y.detached, &y.name)));
        let seen: Vec<(bool, &str, &str, u64)> = state
            .iter()
            .map(|r| {
                (
                    r.detached,
                    r.partition_id.as_str(),
                    r.reason.as_str(),
                    r.rows,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [(false, "202602", "", 2), (true, "202601", "", 0)],
            "{state:?}"
        );
        assert_eq!(state[0].hash_of_all_files.len(), 32);
        assert!(state[1].hash_of_all_files.is_empty());

        let checks = server
            .check_tables(&[(d, "b"), (d, "missing"), (d, "a")])
            .await
            .unwrap();
        assert_eq!(checks.len(), 3);
        let (b, missing, a) = (&checks[0], &checks[1], &checks[2]);
        assert_eq!(b.info.as_ref().unwrap().name, "b");
        assert_eq!(b.pending_mutations, 1, "{b:?}");
        assert!(
            missing.info.is_none() && missing.columns.is_empty(),
            "{missing:?}"
        );
        assert_eq!(a.info, server.table_info(d, "a").await.unwrap());
        assert_eq!(a.columns, server.columns(d, "a").await.unwrap());
        assert_eq!(a.pending_mutations, 0);
    });
}

#[test]
fn server_errors_carry_code_name_and_statement() {
    let ch = shared();
    let server = client(ch);
    let err = runtime()
        .block_on(server.execute("SELECT * FROM no_db_xyz.no_table"))
        .unwrap_err();
    match &err {
        ServerError::Server {
            code,
            name,
            statement,
            ..
        } => {
            assert_eq!(*code, 81, "{err}");
            assert_eq!(name.as_deref(), Some("UNKNOWN_DATABASE"));
            assert!(statement.contains("no_db_xyz"));
        }
        other => panic!("expected a server error, got {other:?}"),
    }
    assert_eq!(err.class(true), ErrorClass::Permanent);
}

#[test]
fn unreachable_server_is_a_transport_error() {
    let closed = chpart_testenv::ClosedPort::new();
    let port = closed.port;
    let server = Server::new(&ServerConfig {
        url: format!("http://127.0.0.1:{port}"),
        user: "default".into(),
        password: Some(chpart_server::Secret::new("hunter2-secret")),
        request_timeout: Duration::from_secs(10),
    });
    let err = runtime()
        .block_on(server.attach_part("d", "t", "all_1_1_0"))
        .unwrap_err();
    assert!(matches!(err, ServerError::Transport { .. }), "{err:?}");
    assert_eq!(
        err.class(false),
        ErrorClass::Unknown,
        "ATTACH after a transport error must be reconciled"
    );
    assert_eq!(err.class(true), ErrorClass::Transient);
    let text = format!("{err} {err:?} {server:?}");
    assert!(text.contains(&port.to_string()));
    assert!(!text.contains("hunter2"), "a secret leaked: {text}");
}
