//! The [`ClickHouseServer`] conformance suite against the real ClickHouse 26.9 engine: every
//! test runs against every implementation (HTTP [`Server`], and [`Faulty`] around it with no
//! fault armed), then the faults themselves.

use std::sync::Arc;
use std::time::Duration;

use chpart_core::retry::RetryPolicy;
use chpart_server::faults::{Effect, Fault, Faulty};
use chpart_server::retry::Retrying;
use chpart_server::{
    ClickHouseServer, ErrorClass, Server, ServerConfig, ServerError, SharedServer, TableToCheck,
};
use chpart_testenv::clickhouse::{shared, ClickHouse, TestDb};

fn client(server: &ClickHouse) -> Server {
    client_at(&server.url(), None)
}

fn client_at(url: &str, password: Option<&str>) -> Server {
    Server::new(&ServerConfig {
        url: url.to_owned(),
        user: "default".into(),
        password: password.map(chpart_server::Secret::new),
        request_timeout: Duration::from_secs(60),
    })
}

/// Every implementation of the trait over `server`, named for messages and database names.
fn implementations(server: Server) -> Vec<(&'static str, SharedServer)> {
    let http: SharedServer = Arc::new(server);
    vec![
        ("http", http.clone()),
        (
            "faulty",
            Arc::new(Faulty::new(http.clone())) as SharedServer,
        ),
        (
            "retrying",
            Arc::new(Retrying::new(
                http,
                RetryPolicy::within(Duration::from_secs(1)),
            )),
        ),
    ]
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
    for (implementation, server) in implementations(client(ch)) {
        reads_definitions_parts_and_detached_parts_on(ch, implementation, server.as_ref());
    }
}

fn reads_definitions_parts_and_detached_parts_on(
    ch: &ClickHouse,
    implementation: &str,
    server: &dyn ClickHouseServer,
) {
    let db = TestDb::new(ch, &format!("server_reads_{implementation}"));
    let d = &db.name;
    ch.q(&format!(
        "CREATE TABLE `{d}`.ev (ts DateTime, id UInt64, name LowCardinality(String) DEFAULT 'x') \
         ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id"
    ));
    ch.q(&format!("INSERT INTO `{d}`.ev (ts, id) VALUES ('2026-01-05 00:00:00', 1), ('2026-02-05 00:00:00', 2)"));
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

        // The one-statement read says what the separate reads say, materialized views too.
        ch.q(&format!(
            "CREATE TABLE `{d}`.ids (id UInt64) ENGINE = MergeTree ORDER BY id"
        ));
        ch.q(&format!(
            "CREATE MATERIALIZED VIEW `{d}`.ev_ids TO `{d}`.ids AS SELECT id FROM `{d}`.ev"
        ));
        let definition = server
            .table_definition(d, "ev")
            .await
            .unwrap()
            .expect("table exists");
        assert_eq!(
            definition.info,
            server.table_info(d, "ev").await.unwrap().unwrap()
        );
        assert_eq!(definition.columns, columns);
        assert_eq!(
            definition.views,
            server.materialized_views(d, "ev").await.unwrap()
        );
        assert_eq!(definition.views, [format!("{d}.ev_ids")]);
        assert_eq!(definition.version, server.version().await.unwrap());
        assert_eq!(definition.timezone, server.timezone().await.unwrap());
        assert!(server
            .table_definition(d, "missing")
            .await
            .unwrap()
            .is_none());
        ch.q(&format!("DROP TABLE `{d}`.ev_ids"));

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
        let checks = server.check_tables(&[check(d, "ev", None)]).await.unwrap();
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
    for (implementation, server) in implementations(client(ch)) {
        table_state_and_check_tables_on(ch, implementation, server.as_ref());
    }
}

fn table_state_and_check_tables_on(
    ch: &ClickHouse,
    implementation: &str,
    server: &dyn ClickHouseServer,
) {
    let db = TestDb::new(ch, &format!("server_batched_{implementation}"));
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

        // The columns are read only where the caller's definition is not the table's.
        let b_definition = server
            .table_info(d, "b")
            .await
            .unwrap()
            .unwrap()
            .create_table_query;
        let checks = server
            .check_tables(&[
                check(d, "b", Some(&b_definition)),
                check(d, "missing", None),
                check(d, "a", Some("CREATE TABLE an_older_definition")),
            ])
            .await
            .unwrap();
        assert_eq!(checks.len(), 3);
        let (b, missing, a) = (&checks[0], &checks[1], &checks[2]);
        assert_eq!(b.info.as_ref().unwrap().name, "b");
        assert_eq!(b.columns, None, "{b:?}");
        assert_eq!(b.pending_mutations, 1, "{b:?}");
        assert!(
            missing.info.is_none() && missing.columns.is_none(),
            "{missing:?}"
        );
        assert_eq!(a.info, server.table_info(d, "a").await.unwrap());
        assert_eq!(a.columns, Some(server.columns(d, "a").await.unwrap()));
        assert_eq!(a.pending_mutations, 0);

        // No known definition: every existing table's columns are read.
        let checks = server
            .check_tables(&[check(d, "a", None), check(d, "b", None)])
            .await
            .unwrap();
        assert_eq!(
            checks[0].columns,
            Some(server.columns(d, "a").await.unwrap())
        );
        assert_eq!(
            checks[1].columns,
            Some(server.columns(d, "b").await.unwrap())
        );
    });
}

fn check<'a>(
    database: &'a str,
    table: &'a str,
    known_definition: Option<&'a str>,
) -> TableToCheck<'a> {
    TableToCheck {
        database,
        table,
        known_definition,
    }
}

#[test]
fn server_errors_carry_code_name_and_statement() {
    for (implementation, server) in implementations(client(shared())) {
        let err = runtime()
            .block_on(server.execute("SELECT * FROM no_db_xyz.no_table"))
            .unwrap_err();
        server_error_is_typed(implementation, &err);
    }
}

fn server_error_is_typed(implementation: &str, err: &ServerError) {
    match err {
        ServerError::Server {
            code,
            name,
            statement,
            ..
        } => {
            assert_eq!(*code, 81, "{implementation}: {err}");
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
    let url = format!("http://127.0.0.1:{port}");
    for (implementation, server) in implementations(client_at(&url, Some("hunter2-secret"))) {
        let err = runtime()
            .block_on(server.attach_part("d", "t", "all_1_1_0"))
            .unwrap_err();
        unreachable_is_transport(implementation, port, &err, &format!("{server:?}"));
    }
}

fn unreachable_is_transport(implementation: &str, port: u16, err: &ServerError, server: &str) {
    assert!(
        matches!(err, ServerError::Transport { .. }),
        "{implementation}: {err:?}"
    );
    assert_eq!(
        err.class(false),
        ErrorClass::Unknown,
        "ATTACH after a transport error must be reconciled"
    );
    assert_eq!(err.class(true), ErrorClass::Transient);
    let text = format!("{err} {err:?} {server}");
    assert!(text.contains(&port.to_string()));
    assert!(!text.contains("hunter2"), "a secret leaked: {text}");
}

/// The faults: a refused or excepted call is never sent, a lost answer hides a change the
/// server made, a delay only delays, and each fault fires once, at the matching call it names.
#[test]
fn faults_refuse_lose_answers_and_fire_once_at_their_call() {
    let ch = shared();
    let db = TestDb::new(ch, "server_faults");
    let d = &db.name;
    ch.q(&format!(
        "CREATE TABLE `{d}`.ev (id UInt64) ENGINE = MergeTree ORDER BY id"
    ));
    for id in 1..=3 {
        ch.q(&format!("INSERT INTO `{d}`.ev VALUES ({id})"));
    }
    let faulty = Faulty::new(Arc::new(client(ch)));
    runtime().block_on(async {
        let mut names: Vec<String> = faulty
            .table_state(d, "ev")
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        names.sort();
        for name in &names {
            faulty
                .execute(&format!("ALTER TABLE `{d}`.ev DETACH PART '{name}'"))
                .await
                .unwrap();
        }
        let (a, b, c) = (&names[0], &names[1], &names[2]);

        // Refused: not sent, the part stays detached; the error is a transport error.
        faulty.inject(Fault::on("attach_part", a.as_str(), Effect::Refuse));
        let err = faulty.attach_part(d, "ev", a).await.unwrap_err();
        assert_eq!(err.class(false), ErrorClass::Unknown, "{err}");
        assert_eq!(faulty.count(d, "ev").await.unwrap(), 0);

        // The answer lost: the server attached the part; the caller only sees a transport error.
        faulty.inject(Fault::on("attach_part", a.as_str(), Effect::LoseAnswer));
        let err = faulty.attach_part(d, "ev", a).await.unwrap_err();
        assert!(matches!(err, ServerError::Transport { .. }), "{err:?}");
        assert_eq!(faulty.count(d, "ev").await.unwrap(), 1);

        // An exception: not sent; the code is the one injected. Skipped calls go through.
        faulty.inject(Fault::on("attach_part", "", Effect::Exception { code: 242 }).after(1));
        faulty.attach_part(d, "ev", b).await.unwrap();
        let err = faulty.attach_part(d, "ev", c).await.unwrap_err();
        assert_eq!(err.code(), Some(242));
        assert_eq!(err.class(false), ErrorClass::Transient);
        assert_eq!(faulty.count(d, "ev").await.unwrap(), 2);

        // A delay: sent after it. Every fault has fired once: the next call goes through.
        faulty.inject(Fault::on(
            "attach_part",
            c.as_str(),
            Effect::Delay(Duration::from_millis(300)),
        ));
        let started = std::time::Instant::now();
        faulty.attach_part(d, "ev", c).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(faulty.pending().is_empty());
        assert_eq!(faulty.count(d, "ev").await.unwrap(), 3);

        let faulted: Vec<Option<Effect>> = faulty
            .calls()
            .into_iter()
            .filter(|call| call.method == "attach_part")
            .map(|call| call.fault)
            .collect();
        assert_eq!(
            faulted,
            [
                Some(Effect::Refuse),
                Some(Effect::LoseAnswer),
                None,
                Some(Effect::Exception { code: 242 }),
                Some(Effect::Delay(Duration::from_millis(300))),
            ]
        );
    });
}

/// Retrying: reads and idempotent statements are sent again after a transient fault, until the
/// deadline; a change that is not safe to repeat (ATTACH, a plain statement) is sent once; a
/// permanent error is not retried.
#[test]
fn retrying_repeats_only_what_is_safe_to_repeat() {
    let ch = shared();
    let db = TestDb::new(ch, "server_retrying");
    let d = &db.name;
    // Deduplication, as the ledger has it: an INSERT sent again with its token counts once.
    ch.q(&format!(
        "CREATE TABLE `{d}`.ev (id UInt64) ENGINE = MergeTree ORDER BY id \
         SETTINGS non_replicated_deduplication_window = 100"
    ));
    ch.q(&format!("INSERT INTO `{d}`.ev VALUES (1)"));
    let faulty = Arc::new(Faulty::new(Arc::new(client(ch))));
    let retrying = Retrying::new(faulty.clone(), RetryPolicy::within(Duration::from_secs(20)));
    let calls = |method: &str| faulty.calls().iter().filter(|c| c.method == method).count();
    runtime().block_on(async {
        // A read refused twice, then an exception that says "try later": answered on the 4th try.
        faulty.inject(Fault::on("count", "", Effect::Refuse));
        faulty.inject(Fault::on("count", "", Effect::Refuse));
        faulty.inject(Fault::on("count", "", Effect::Exception { code: 202 }));
        assert_eq!(retrying.count(d, "ev").await.unwrap(), 1);
        assert_eq!(calls("count"), 4);

        // An idempotent statement whose answer was lost: sent again, applied once.
        let insert = format!(
            "INSERT INTO `{d}`.ev SETTINGS insert_deduplicate = 1, \
             insert_deduplication_token = 'retry-test' VALUES (2)"
        );
        faulty.inject(Fault::on("execute", "retry-test", Effect::LoseAnswer));
        retrying.execute_idempotent(&insert).await.unwrap();
        assert_eq!(calls("execute"), 2);
        assert_eq!(retrying.count(d, "ev").await.unwrap(), 2);

        // A plain statement and an ATTACH are sent once, whatever the fault.
        faulty.inject(Fault::on("execute", "retry-test", Effect::Refuse));
        let err = retrying.execute(&insert).await.unwrap_err();
        assert!(matches!(err, ServerError::Transport { .. }), "{err}");
        assert_eq!(calls("execute"), 3);
        faulty.inject(Fault::on("attach_part", "", Effect::Refuse));
        let err = retrying
            .attach_part(d, "ev", "all_9_9_0")
            .await
            .unwrap_err();
        assert_eq!(err.class(false), ErrorClass::Unknown, "{err}");
        assert_eq!(calls("attach_part"), 1);

        // A permanent error is final at once.
        let before = calls("table_info");
        faulty.inject(Fault::on("table_info", "", Effect::Exception { code: 60 }));
        let err = retrying.table_info(d, "ev").await.unwrap_err();
        assert_eq!(err.code(), Some(60));
        assert_eq!(calls("table_info"), before + 1);
    });

    // A fault that lasts past the deadline: the last error, saying how often it was tried.
    let closed = chpart_testenv::ClosedPort::new();
    let down = Retrying::new(
        Arc::new(client_at(
            &format!("http://127.0.0.1:{}", closed.port),
            None,
        )),
        RetryPolicy::within(Duration::from_secs(2)),
    );
    let started = std::time::Instant::now();
    let err = runtime().block_on(down.version()).unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, ServerError::Transport { .. }), "{err:?}");
    assert!(err.to_string().contains("gave up after"), "{err}");
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
}

/// A DNS lookup that fails twice, then answers (the system resolver's answer): the failure is a
/// transport error naming the host, retried like any transient fault; once resolved, a name is
/// not looked up again for the rest of the command, however many connections it opens.
#[test]
fn a_host_name_is_resolved_once_and_a_failed_lookup_is_retried() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    let ch = shared();
    let url = ch.url().replace("127.0.0.1", "localhost");
    assert!(url.contains("localhost"), "{url}");
    let lookups = Arc::new(AtomicUsize::new(0));
    let counted = lookups.clone();
    let system = chpart_server::resolve::system_lookup();
    let lookup: chpart_server::resolve::Lookup = Arc::new(move |host: &str| {
        if counted.fetch_add(1, Ordering::SeqCst) < 2 {
            return Err(std::io::Error::other(
                "injected: temporary failure in name resolution",
            ));
        }
        system(host)
    });
    let config = ServerConfig {
        url,
        user: "default".into(),
        password: None,
        request_timeout: Duration::from_secs(30),
    };
    let server: SharedServer = Arc::new(Server::with_lookup(&config, lookup.clone()));
    let err = runtime().block_on(server.version()).unwrap_err();
    assert!(matches!(err, ServerError::Transport { .. }), "{err:?}");
    assert_eq!(err.class(true), ErrorClass::Transient, "{err}");
    assert!(err.to_string().contains("localhost"), "{err}");

    let retrying = Retrying::new(
        Arc::new(Server::with_lookup(&config, lookup)),
        RetryPolicy::within(Duration::from_secs(20)),
    );
    runtime().block_on(async {
        assert_eq!(retrying.version().await.unwrap(), "26.9.2.1");
        assert_eq!(
            lookups.load(Ordering::SeqCst),
            3,
            "two failures, then one answer"
        );
        // Several connections at once: each asks the resolver, none looks the name up again.
        let calls = (0..6).map(|_| retrying.count("system", "one"));
        for n in futures_util::future::join_all(calls).await {
            assert_eq!(n.unwrap(), 1);
        }
    });
    assert_eq!(
        lookups.load(Ordering::SeqCst),
        3,
        "resolved once for the command"
    );
}

/// `identified_as` names the command first in the User-Agent of every statement, which the
/// server keeps in `system.query_log.http_user_agent` (what operators and the end-to-end
/// benchmark tell chpart's commands apart by).
#[test]
fn the_client_names_its_command_in_the_user_agent_the_query_log_keeps() {
    let ch = ClickHouse::start_with(chpart_testenv::clickhouse::ServerOptions {
        config_extra: Some(
            "<query_log><database>system</database><table>query_log</table></query_log>".into(),
        ),
        ..Default::default()
    });
    let server = client(&ch).identified_as("chpart-test", "1.2.3");
    runtime().block_on(async {
        server.version().await.unwrap();
        server.execute("SYSTEM FLUSH LOGS").await.unwrap();
    });
    let agents = ch.q(
        "SELECT DISTINCT splitByChar(' ', http_user_agent)[1] FROM system.query_log \
         WHERE query = 'SELECT version()' AND type = 'QueryFinish'",
    );
    assert_eq!(agents, "chpart-test/1.2.3\n");
}
