//! A ClickHouse user that lacks a privilege a load needs: `begin` refuses it, naming the
//! privilege, the user and the table, before anything is created; it never gets as far as a
//! commit that attaches parts it cannot publish. A user holding exactly what the operations
//! guide lists (which `begin` checks against `chpart_protocol::grants::needed`) loads in every
//! mode; so does `default`.

use std::path::Path;
use std::process::Output;

use chpart_testenv::clickhouse::{ClickHouse, ServerOptions, ServerUser, TestDb};
use chpart_testenv::write_rows;

use crate::build::{rows_select, Setup, COLUMNS, ENGINE};
use crate::cli::text;

/// The test's database and its ledger's.
const DB: &str = "grants";
const LEDGER_DB: &str = "grants_ledger";

/// The GRANT statements the operations guide gives a least-privilege user (its `sql` block),
/// for the test's database and ledger: the test loads with exactly what the guide says.
fn documented_grants() -> Vec<String> {
    let guide = include_str!("../docs/operations.md");
    let section = &guide[guide
        .find("## Least-privilege ClickHouse user")
        .expect("the guide has the section")..];
    let block = section
        .split("```sql\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the section has an sql block");
    let text: String = block
        .lines()
        .map(|l| l.split("--").next().unwrap().trim())
        .collect::<Vec<_>>()
        .join(" ");
    text.split(';')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(|g| {
            g.replace(" ON chpart.*", &format!(" ON {LEDGER_DB}.*"))
                .replace(" ON db.*", &format!(" ON {DB}.*"))
        })
        .collect()
}

/// A user holding what the guide lists, but `lacking` on the test's database.
fn user(name: &str, lacking: Option<&str>) -> ServerUser {
    let on_db = format!(" ON {DB}.*");
    let grants = documented_grants()
        .into_iter()
        .map(|g| match (g.strip_suffix(&on_db), lacking) {
            (Some(privileges), Some(lacking)) => {
                let kept: Vec<&str> = privileges
                    .trim_start_matches("GRANT ")
                    .split(", ")
                    .filter(|p| *p != lacking)
                    .collect();
                assert!(
                    kept.len() < privileges.split(", ").count(),
                    "{lacking} not in {g}"
                );
                format!("GRANT {}{on_db}", kept.join(", "))
            }
            _ => g,
        })
        .collect();
    ServerUser {
        name: name.to_owned(),
        grants,
    }
}

/// `setup`'s config, logging in as `user` (`None`: `default`).
fn as_user(setup: &Setup, user: Option<&str>) {
    let config = std::fs::read_to_string(&setup.config).unwrap();
    let mut lines: Vec<String> = Vec::new();
    for line in config.lines().filter(|l| !l.starts_with("user = ")) {
        lines.push(line.to_owned());
        if let (true, Some(user)) = (line.starts_with("url = "), user) {
            lines.push(format!("user = \"{user}\""));
        }
    }
    std::fs::write(&setup.config, lines.join("\n") + "\n").unwrap();
}

fn build(s: &Setup, load: &str, input: &Path) -> String {
    let out = s
        .build_cmd(load, &format!("app-{load}.0"), 0)
        .arg("--input")
        .arg(input)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn commit(s: &Setup, load: &str, line: &str) -> Output {
    let winners = s.dir.path().join(format!("{load}.jsonl"));
    std::fs::write(&winners, format!("{line}\n")).unwrap();
    s.run(&[
        "commit",
        "--load",
        load,
        "--winners",
        winners.to_str().unwrap(),
    ])
}

/// Tables of the test's database and the ledger's rows of `load` (0 when the ledger was never
/// created), as `default` sees them.
fn created(ch: &ClickHouse, load: &str) -> (String, String) {
    let tables = ch.q(&format!(
        "SELECT groupArray(name) FROM system.tables WHERE database = '{DB}'"
    ));
    let ledger_exists = ch.q(&format!(
        "SELECT count() FROM system.tables WHERE database = '{LEDGER_DB}' AND name = 'ledger'"
    ));
    let entries = if ledger_exists.trim() == "1" {
        ch.q(&format!(
            "SELECT count() FROM {LEDGER_DB}.ledger WHERE load_id = '{load}'"
        ))
    } else {
        "0\n".to_owned()
    };
    (tables.trim().to_owned(), entries.trim().to_owned())
}

#[test]
fn a_user_lacking_a_grant_the_commit_needs_is_refused_at_begin_with_nothing_created() {
    let ch = ClickHouse::start_with(ServerOptions {
        users: vec![
            user("chpart_no_insert", Some("INSERT")),
            user("chpart_no_check", Some("CHECK")),
            user("chpart_ok", None),
            // Everything on everything but INSERT on the target: `begin` first asks whether
            // the user holds every privilege on `*.*`, which a partial revoke must answer no.
            ServerUser {
                name: "chpart_revoked".to_owned(),
                grants: vec![
                    "GRANT SELECT, INSERT, ALTER, CREATE, DROP, CHECK, SHOW, SYSTEM ON *.*"
                        .to_owned(),
                    "GRANT TABLE ENGINE ON *".to_owned(),
                    format!("REVOKE INSERT ON {DB}.events"),
                ],
            },
        ],
        ..ServerOptions::default()
    });
    // The server is the test's own: its database has the fixed name the grants name.
    ch.q(&format!("CREATE DATABASE {DB}"));
    ch.q(&format!("CREATE TABLE {DB}.events ({COLUMNS}) {ENGINE}"));
    let dir = tempfile::tempdir().unwrap();
    let s = Setup {
        config: crate::cli::local_config(dir.path(), &ch, LEDGER_DB),
        db: TestDb {
            name: DB.to_owned(),
            server: &ch,
        },
        table: format!("{DB}.events"),
        dir,
    };

    // No INSERT on the target's database: ATTACH PART and MOVE PARTITION would fail in the
    // commit, after the plan. Refused at begin, for either visibility, naming what is missing.
    as_user(&s, Some("chpart_no_insert"));
    for visibility in ["partition", "part"] {
        let out = s.begin("g-1", &["--visibility", visibility]);
        assert_eq!(out.status.code(), Some(4), "{}", text(&out));
        let message = text(&out);
        eprintln!("begin as chpart_no_insert, {visibility} visibility: {message}");
        for word in [
            "user chpart_no_insert",
            "INSERT ON grants.events",
            "a load of grants.events",
            "nothing was created",
        ] {
            assert!(message.contains(word), "{word:?} not in: {message}");
        }
        assert!(
            !message.contains("INSERT ON grants_ledger.ledger"),
            "the ledger's INSERT is granted: {message}"
        );
        assert_eq!(
            created(&ch, "g-1"),
            ("['events']".to_owned(), "0".to_owned()),
            "nothing created ({visibility} visibility)"
        );
    }
    // No CHECK: only the shadow's CHECK TABLE needs it (partition visibility).
    as_user(&s, Some("chpart_no_check"));
    let out = s.begin("g-2", &[]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("CHECK ON grants.events__chpart_")
            && text(&out).contains("CHECK TABLE the shadow"),
        "{}",
        text(&out)
    );
    assert_eq!(
        created(&ch, "g-2"),
        ("['events']".to_owned(), "0".to_owned())
    );

    // Everything on `*.*` with INSERT revoked on the target alone: refused, naming it.
    as_user(&s, Some("chpart_revoked"));
    let out = s.begin("g-3", &[]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("INSERT ON grants.events,"),
        "{}",
        text(&out)
    );
    assert_eq!(
        created(&ch, "g-3"),
        ("['events']".to_owned(), "0".to_owned())
    );

    // Exactly the privileges the list names: every mode loads, and gc leaves nothing.
    as_user(&s, Some("chpart_ok"));
    let loads: [(&str, &[&str], u64); 4] = [
        ("ok-part", &["--visibility", "part"], 0),
        ("ok-partition", &[], 1_000),
        ("ok-replace", &["--mode", "replace"], 2_000),
        ("ok-overwrite", &["--mode", "overwrite"], 3_000),
    ];
    for (load, args, from) in loads {
        let begun = s.begin(load, args);
        assert_eq!(begun.status.code(), Some(0), "{load}: {}", text(&begun));
        let input = write_rows(
            s.dir.path(),
            &format!("{load}.parquet"),
            &rows_select(from, 1_000),
            "Parquet",
        );
        let line = build(&s, load, &input);
        let out = commit(&s, load, &line);
        assert_eq!(out.status.code(), Some(0), "{load}: {}", text(&out));
        let rows = ch.q(&format!(
            "SELECT count(), uniqExact(id), min(id) FROM {}",
            s.table
        ));
        let expected = match load {
            "ok-part" => "1000\t1000\t0",
            "ok-partition" => "2000\t2000\t0",
            // The load's rows replace the partitions they fall into: all of the earlier ones.
            _ => &format!("1000\t1000\t{from}")[..],
        };
        assert_eq!(rows.trim(), expected, "{load}");
        let gc = s.run(&["gc"]);
        assert_eq!(gc.status.code(), Some(0), "{load}: {}", text(&gc));
        assert_eq!(s.detached("events"), Vec::<String>::new(), "{load}");
    }
    assert_eq!(
        ch.q(&format!(
            "SELECT count() FROM system.tables WHERE database = '{DB}' AND name != 'events'"
        ))
        .trim(),
        "0",
        "gc left a table of a load"
    );

    // And the default user, which holds everything.
    as_user(&s, None);
    let begun = s.begin("default-1", &[]);
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));
    let input = write_rows(
        s.dir.path(),
        "default.parquet",
        &rows_select(10_000, 500),
        "Parquet",
    );
    let out = commit(&s, "default-1", &build(&s, "default-1", &input));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        ch.q(&format!("SELECT count() FROM {}", s.table)).trim(),
        "1500"
    );
}
