//! Replace mode owns the partitions it replaces, against the real ClickHouse 26.9 engine: one
//! open replace load per table, no two plans replacing one partition, and a repair after a
//! crash that never removes rows which arrived from elsewhere.

use chpart_testenv::clickhouse::shared;

use crate::build::Setup;
use crate::cli::text;
use crate::commit::{build_load, commit, fingerprint_sql, partition_select, winners_file};

/// Old rows for January and February 2026 (the partitions the loads below replace).
fn old_rows(s: &Setup) {
    s.db.server.q(&format!(
        "INSERT INTO {} SELECT toDateTime('2026-01-20 00:00:00', 'UTC') + toIntervalDay(number % 40), \
         900000 + number, 'old', NULL FROM numbers(4000)",
        s.table
    ));
}

/// The target's January and February hold exactly the reload of Spark partitions 0 and 1.
fn assert_reloaded(s: &Setup, row: &str) {
    let ch = s.db.server;
    let months = "toYYYYMM(ts) IN (202601, 202602)";
    assert_eq!(
        ch.q(&fingerprint_sql(&format!("{} WHERE {months}", s.table))),
        ch.q(&fingerprint_sql(&format!(
            "({}) WHERE {months}",
            [partition_select(0), partition_select(1)].join(" UNION ALL ")
        ))),
        "{row}: January and February hold exactly the reload"
    );
}

#[test]
fn a_second_replace_load_of_a_table_cannot_begin_while_one_is_open() {
    let ch = shared();
    let s = Setup::new(ch, "replace_begin");
    let out = s.begin("rb-first", &["--mode", "replace"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = s.begin("rb-second", &["--mode", "replace"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("load rb-first is open in replace mode"),
        "the refusal names the open load: {}",
        text(&out)
    );
    // Appending meanwhile is the table's business, not a replace load's.
    let out = s.begin("rb-append", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Once the first is finished, the next replace load begins.
    let abort = crate::cli::chpart()
        .args(["abort", "--config"])
        .arg(&s.config)
        .args(["--load", "rb-first"])
        .output()
        .unwrap();
    assert_eq!(abort.status.code(), Some(0), "{}", text(&abort));
    let out = s.begin("rb-second", &["--mode", "replace"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// Two begins racing both pass the begin check; the second to commit finds the other's plan
/// replacing the same partitions and stops before replacing anything. The race is made by
/// writing the other load's `open` and `plan` entries as a racing driver would have.
#[test]
fn a_replace_commit_refuses_partitions_another_open_load_planned() {
    let ch = shared();
    let s = Setup::new(ch, "replace_overlap");
    old_rows(&s);
    let before = ch.q(&fingerprint_sql(&s.table));
    let built = build_load(&s, "ro-mine", &["--mode", "replace"], 2, &["app-a"]);
    let file = winners_file(&s, "w.jsonl", &[&built[0][0], &built[1][0]]);
    let out = commit(&s, "ro-mine", &file, &[], Some("after-plan"));
    assert_eq!(out.status.code(), None, "to be killed: {}", text(&out));
    // The other driver's load: the same table and mode, a plan of the same partitions.
    let ledger = format!("`{}_ledger`.ledger", s.db.name);
    ch.q(&format!(
        "INSERT INTO {ledger} (load_id, entry_id, kind, written_at, writer, body) \
         SELECT 'ro-other', entry_id, kind, written_at, 'racing-driver', \
         replaceAll(body, '\"ro-mine\"', '\"ro-other\"') FROM {ledger} \
         WHERE load_id = 'ro-mine' AND entry_id IN ('open', 'plan')"
    ));
    let out = commit(&s, "ro-mine", &file, &[], None);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("load ro-other is open in replace mode")
            && text(&out).contains("202601, 202602"),
        "names the other load and the partitions: {}",
        text(&out)
    );
    assert_eq!(
        ch.q(&fingerprint_sql(&s.table)),
        before,
        "nothing was replaced"
    );
    // The other load ends (aborted, as `chpart abort` records it): the commit goes on.
    ch.q(&format!(
        "INSERT INTO {ledger} (load_id, entry_id, kind, written_at, writer, body) \
         VALUES ('ro-other', 'abort', 'load_aborted', now64(3), 'racing-driver', '{{}}')"
    ));
    let out = commit(&s, "ro-mine", &file, &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_reloaded(&s, "after the other load ended");
}

/// Killed right after replacing January; another process then inserts rows into January.
/// The resumed commit must not REPLACE again (that would remove them): it stops with exit 4
/// naming the foreign part, and the rows are still there. Without foreign rows, a merge of the
/// replaced copies since is recognised as the finished REPLACE.
#[test]
fn the_replace_repair_never_removes_rows_it_did_not_plan() {
    let ch = shared();
    for (i, foreign) in [true, false].into_iter().enumerate() {
        let row = if foreign {
            "rows inserted after the REPLACE"
        } else {
            "copies merged after the REPLACE"
        };
        let s = Setup::new(ch, &format!("replace_foreign_{i}"));
        old_rows(&s);
        let load = format!("rf-{i}");
        let built = build_load(&s, &load, &["--mode", "replace"], 2, &["app-a"]);
        let file = winners_file(&s, "w.jsonl", &[&built[0][0], &built[1][0]]);
        let out = commit(&s, &load, &file, &[], Some("after-publish:1"));
        assert_eq!(
            out.status.code(),
            None,
            "{row}: to be killed: {}",
            text(&out)
        );
        let january = |what: &str| {
            ch.q(&format!(
                "SELECT {what} FROM system.parts WHERE database = '{}' AND table = 'events' \
                 AND active AND partition_id = '202601' ORDER BY name FORMAT TSV",
                s.db.name
            ))
        };
        let parts_before: Vec<String> = january("name").lines().map(str::to_owned).collect();
        if foreign {
            ch.q(&format!(
                "INSERT INTO {} SELECT toDateTime('2026-01-05 00:00:00', 'UTC'), 800000 + number, \
                 'foreign', NULL FROM numbers(7)",
                s.table
            ));
        } else {
            ch.q(&format!(
                "OPTIMIZE TABLE {} PARTITION ID '202601' FINAL",
                s.table
            ));
        }
        let out = commit(&s, &load, &file, &[], None);
        if !foreign {
            assert_eq!(out.status.code(), Some(0), "{row}: {}", text(&out));
            assert_reloaded(&s, row);
            continue;
        }
        assert_eq!(
            ch.q(&format!(
                "SELECT count() FROM {} WHERE name = 'foreign'",
                s.table
            ))
            .trim(),
            "7",
            "{row}: the inserted rows are still there"
        );
        let new_parts: Vec<String> = january("name")
            .lines()
            .filter(|p| !parts_before.iter().any(|b| b == p))
            .map(str::to_owned)
            .collect();
        assert_eq!(
            new_parts.len(),
            1,
            "{row}: the inserted part: {new_parts:?}"
        );
        assert_eq!(out.status.code(), Some(4), "{row}: {}", text(&out));
        assert!(
            text(&out).contains(&format!("the target holds part {}", new_parts[0])),
            "{row}: names the foreign part {}: {}",
            new_parts[0],
            text(&out)
        );
    }
}
