//! The ClickHouse privileges a load needs, in one list ([`needed`]). `begin` checks every one
//! with `CHECK GRANT` before it creates anything (see `begin::check_grants`: all of them on
//! `*.*` in one question first, then per object, then per privilege where one lacks), so a user who
//! lacks one is refused there, the privilege, the user and the table named, never halfway
//! through a commit with parts attached to a shadow it cannot publish.
//!
//! What each statement needs was seen on 26.9 by running it as users granted everything but
//! one privilege (and read back from the server's own `ACCESS_DENIED` messages):
//!
//! | statement | needs |
//! | --- | --- |
//! | `CREATE DATABASE IF NOT EXISTS L` (the ledger, every `begin`) | `CREATE DATABASE ON L.*`, even when it exists |
//! | `CREATE TABLE IF NOT EXISTS L.ledger ... ENGINE = MergeTree` | `CREATE TABLE`, `TABLE ENGINE ON MergeTree`, even when it exists |
//! | ledger reads and entries | `SELECT`, `INSERT` on the ledger |
//! | `CREATE TABLE IF NOT EXISTS S AS T` (the shadow) | `CREATE TABLE` on S, `TABLE ENGINE` on T's engine |
//! | `SYSTEM STOP/START MERGES S` | `SYSTEM MERGES` |
//! | `ALTER TABLE X ATTACH PART` | `INSERT` on X |
//! | `CHECK TABLE S` | `CHECK` |
//! | `ALTER TABLE S MOVE PARTITION ... TO TABLE T` | `INSERT` on T; `ALTER MOVE PARTITION`, or `SELECT` and `ALTER DELETE`, on S |
//! | `ALTER TABLE T REPLACE PARTITION ... FROM S` | `SELECT` on S; `INSERT`, `ALTER DELETE` on T |
//! | `ALTER TABLE X DROP DETACHED PART` (gc, abort) | `ALTER DELETE` on X |
//! | `RENAME TABLE`, `EXCHANGE TABLES` (overwrite) | `SELECT`, `INSERT`, `CREATE TABLE`, `DROP TABLE` on both |
//! | `DROP TABLE S` (gc) | `DROP TABLE` |
//!
//! Most system tables a load reads need `SELECT` ([`SYSTEM_TABLES`]); `system.tables` needs
//! none but lists only the tables the user holds some privilege on. A Distributed target's
//! `system.clusters` is not in the list (a cluster load's shards each check theirs). Not
//! checked: the name an overwrite commit renames the shadow to before the
//! swap (`<shadow>_x<nonce>`, drawn by each commit), which a grant on the database covers.

use std::fmt;

use chpart_core::TableRef;

use crate::ledger::{Mode, LEDGER_TABLE};

/// The engine of the ledger table (`store::Ledger::ensure`).
pub const LEDGER_ENGINE: &str = "MergeTree";

/// The system tables a load reads on the table's server that are not readable without a grant
/// (`system.tables`, `columns`, `databases` and `one` are), with what reads them.
pub const SYSTEM_TABLES: &[(&str, &str)] = &[
    ("disks", "find the table's disks"),
    ("storage_policies", "find the table's disks"),
    ("parts", "observe attached parts"),
    ("detached_parts", "observe detached parts"),
    ("processes", "see running ATTACHes"),
    ("mutations", "see pending mutations"),
];

/// What a privilege is granted on, as a `GRANT ... ON` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantOn {
    /// A table: `db.table`.
    Table {
        /// The database.
        database: String,
        /// The table.
        table: String,
    },
    /// Every table of a database: `db.*`.
    Database(String),
    /// A table engine (the `TABLE ENGINE` privilege): `MergeTree`.
    Engine(String),
}

impl GrantOn {
    fn table(t: &TableRef) -> GrantOn {
        GrantOn::Table {
            database: t.database.as_str().to_owned(),
            table: t.table.as_str().to_owned(),
        }
    }
}

/// As written in `GRANT ... ON <this>` (unquoted: for messages; the server side quotes).
impl fmt::Display for GrantOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GrantOn::Table { database, table } => write!(f, "{database}.{table}"),
            GrantOn::Database(database) => write!(f, "{database}.*"),
            GrantOn::Engine(engine) => f.write_str(engine),
        }
    }
}

/// Which server a privilege is needed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnServer {
    /// The ledger's.
    Ledger,
    /// The table's (a shard's, for a shard's sub-load).
    Table,
}

/// One privilege a load needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needed {
    /// The privilege, as `GRANT` spells it (`ALTER DELETE`).
    pub privilege: &'static str,
    /// What on.
    pub on: GrantOn,
    /// Which server.
    pub server: OnServer,
    /// The step that needs it, for the refusal's message.
    pub needed_by: &'static str,
}

/// Every privilege a load of `target` (whose engine is `engine`) in `mode` needs, in the order
/// its steps first need them: on the ledger (database `ledger_db`), the target, and the load's
/// `shadow` table when it publishes through one (partition visibility; `None`: part
/// visibility, parts attached to the target itself).
pub fn needed(
    ledger_db: &str,
    target: &TableRef,
    engine: &str,
    mode: Mode,
    shadow: Option<&TableRef>,
) -> Vec<Needed> {
    let ledger = GrantOn::Table {
        database: ledger_db.to_owned(),
        table: LEDGER_TABLE.to_owned(),
    };
    let mut out = Vec::new();
    let mut need = |privilege, on: &GrantOn, server, needed_by| {
        out.push(Needed {
            privilege,
            on: on.clone(),
            server,
            needed_by,
        })
    };
    use OnServer::{Ledger, Table};
    let l_db = GrantOn::Database(ledger_db.to_owned());
    need(
        "CREATE DATABASE",
        &l_db,
        Ledger,
        "create the ledger's database if missing",
    );
    need(
        "CREATE TABLE",
        &ledger,
        Ledger,
        "create the ledger if missing",
    );
    let l_engine = GrantOn::Engine(LEDGER_ENGINE.to_owned());
    need(
        "TABLE ENGINE",
        &l_engine,
        Ledger,
        "create the ledger if missing",
    );
    need("SELECT", &ledger, Ledger, "read the ledger");
    need("INSERT", &ledger, Ledger, "record the load's steps");
    let t = GrantOn::table(target);
    need("SELECT", &t, Table, "read the target table");
    for (table, needed_by) in SYSTEM_TABLES {
        let on = GrantOn::Table {
            database: "system".to_owned(),
            table: (*table).to_owned(),
        };
        need("SELECT", &on, Table, needed_by);
    }
    match shadow {
        None => {
            need("INSERT", &t, Table, "ATTACH PART the winners' parts");
            need(
                "ALTER DELETE",
                &t,
                Table,
                "DROP DETACHED PART what losers left (gc)",
            );
        }
        Some(shadow) => {
            let s = GrantOn::table(shadow);
            need("CREATE TABLE", &s, Table, "create the shadow table");
            let t_engine = GrantOn::Engine(engine.to_owned());
            need("TABLE ENGINE", &t_engine, Table, "create the shadow table");
            need(
                "SYSTEM MERGES",
                &s,
                Table,
                "stop merges of the shadow table",
            );
            need("INSERT", &s, Table, "ATTACH PART the winners' parts");
            need("SELECT", &s, Table, "check the shadow's rows");
            need("CHECK", &s, Table, "CHECK TABLE the shadow");
            need(
                "ALTER DELETE",
                &s,
                Table,
                "publish from and clean the shadow",
            );
            need("DROP TABLE", &s, Table, "drop the shadow (gc)");
            match mode {
                Mode::Append => {
                    need("INSERT", &t, Table, "MOVE PARTITION into the target");
                }
                Mode::Replace => {
                    need("INSERT", &t, Table, "REPLACE PARTITION in the target");
                    need("ALTER DELETE", &t, Table, "REPLACE PARTITION in the target");
                }
                Mode::Overwrite => {
                    for (privilege, on) in [
                        ("INSERT", &t),
                        ("CREATE TABLE", &t),
                        ("DROP TABLE", &t),
                        ("SYSTEM MERGES", &t),
                    ] {
                        need(
                            privilege,
                            on,
                            Table,
                            "EXCHANGE TABLES the shadow and the target",
                        );
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(needed: &[Needed]) -> Vec<String> {
        needed
            .iter()
            .map(|n| format!("{} ON {}", n.privilege, n.on))
            .collect()
    }

    #[test]
    fn each_mode_and_visibility_needs_what_its_statements_need() {
        let target: TableRef = "db.events".parse().unwrap();
        let shadow: TableRef = "db.events__chpart_0123456789ab".parse().unwrap();
        let ledger = [
            "CREATE DATABASE ON chpart.*",
            "CREATE TABLE ON chpart.ledger",
            "TABLE ENGINE ON MergeTree",
            "SELECT ON chpart.ledger",
            "INSERT ON chpart.ledger",
            "SELECT ON db.events",
            "SELECT ON system.disks",
            "SELECT ON system.storage_policies",
            "SELECT ON system.parts",
            "SELECT ON system.detached_parts",
            "SELECT ON system.processes",
            "SELECT ON system.mutations",
        ];
        let shadow_rows = [
            "CREATE TABLE ON db.events__chpart_0123456789ab",
            "TABLE ENGINE ON ReplacingMergeTree",
            "SYSTEM MERGES ON db.events__chpart_0123456789ab",
            "INSERT ON db.events__chpart_0123456789ab",
            "SELECT ON db.events__chpart_0123456789ab",
            "CHECK ON db.events__chpart_0123456789ab",
            "ALTER DELETE ON db.events__chpart_0123456789ab",
            "DROP TABLE ON db.events__chpart_0123456789ab",
        ];
        let rows: &[(Mode, Option<&TableRef>, &[&str])] = &[
            (
                Mode::Append,
                None,
                &["INSERT ON db.events", "ALTER DELETE ON db.events"],
            ),
            (Mode::Append, Some(&shadow), &["INSERT ON db.events"]),
            (
                Mode::Replace,
                Some(&shadow),
                &["INSERT ON db.events", "ALTER DELETE ON db.events"],
            ),
            (
                Mode::Overwrite,
                Some(&shadow),
                &[
                    "INSERT ON db.events",
                    "CREATE TABLE ON db.events",
                    "DROP TABLE ON db.events",
                    "SYSTEM MERGES ON db.events",
                ],
            ),
        ];
        for (mode, shadow, target_rows) in rows {
            let got = names(&needed(
                "chpart",
                &target,
                "ReplacingMergeTree",
                *mode,
                *shadow,
            ));
            let mut want: Vec<String> = ledger.iter().map(|s| s.to_string()).collect();
            if shadow.is_some() {
                want.extend(shadow_rows.iter().map(|s| s.to_string()));
            }
            want.extend(target_rows.iter().map(|s| s.to_string()));
            assert_eq!(got, want, "{mode}, shadow {shadow:?}");
        }
    }

    #[test]
    fn the_ledger_rows_are_asked_of_the_ledgers_server() {
        let target: TableRef = "db.events".parse().unwrap();
        let all = needed("l", &target, "MergeTree", Mode::Append, None);
        for n in &all {
            let on_ledger = matches!(&n.on, GrantOn::Database(d) if d == "l")
                || matches!(&n.on, GrantOn::Table { database, .. } if database == "l")
                || n.on == GrantOn::Engine(LEDGER_ENGINE.to_owned());
            assert_eq!(n.server == OnServer::Ledger, on_ledger, "{n:?}");
        }
    }
}
