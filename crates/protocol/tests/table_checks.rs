//! A commit goes on only if each table still has the definition the parts were built for and
//! no mutation is pending, over the real 26.9 engine. The columns are read again only when the
//! `CREATE` statement is no longer the one recorded at `begin`, so a change of the statement
//! that leaves the shape alone (a comment) must still commit, and a change of the shape must
//! still be refused.

mod common;

use chpart_protocol::commit::commit;
use chpart_protocol::ledger::Visibility;
use chpart_testenv::clickhouse::{shared, TestDb};

/// What a commit must do after `change` ran on the table between the builds and the commit.
enum Outcome {
    Commits,
    Refused(&'static str),
}

#[test]
fn a_commit_refuses_a_changed_table_and_pending_mutations_and_accepts_a_new_comment() {
    let ch = shared();
    // (case, statements run on the table after the builds, outcome)
    let cases: [(&str, &[&str], Outcome); 4] = [
        ("unchanged", &[], Outcome::Commits),
        (
            "comment",
            &["ALTER TABLE {t} MODIFY COMMENT 'reloaded nightly'"],
            Outcome::Commits,
        ),
        (
            "column",
            &["ALTER TABLE {t} ADD COLUMN extra UInt8"],
            Outcome::Refused("changed since the load began"),
        ),
        (
            "mutation",
            &[
                // A mutation of a part that cannot run while merges are stopped stays pending.
                "INSERT INTO {t} VALUES ('2026-01-01 00:00:00', 0, 'before')",
                "SYSTEM STOP MERGES {t}",
                "ALTER TABLE {t} DELETE WHERE id = 0 SETTINGS mutations_sync = 0",
            ],
            Outcome::Refused("unfinished mutation"),
        ),
    ];
    for (case, changes, outcome) in cases {
        let db = TestDb::new(ch, &format!("table_checks_{case}"));
        let built = common::built_load(&db, "t", 2, 2, Visibility::Partition);
        let table = format!("`{}`.t", db.name);
        for change in changes {
            ch.q(&change.replace("{t}", &table));
        }
        let count = || {
            ch.q(&format!("SELECT count() FROM {table}"))
                .trim()
                .parse::<u64>()
                .unwrap()
        };
        let before = count();
        let result = built.rt.block_on(commit(&built.env(), built.request()));
        let added = count() - before;
        match outcome {
            Outcome::Commits => {
                result.unwrap_or_else(|e| panic!("{case}: {e}"));
                assert_eq!(added, 2000, "{case}");
            }
            Outcome::Refused(said) => {
                let err = result
                    .expect_err(&format!("{case}: the commit must be refused"))
                    .to_string();
                assert!(
                    err.contains(said) && err.contains(&format!("{}.t", db.name)),
                    "{case}: {err}"
                );
                assert_eq!(added, 0, "{case}: nothing may be attached");
            }
        }
    }
}
