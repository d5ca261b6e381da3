//! Tables whose storage policy reaches object storage (an `s3` disk on a local moto endpoint):
//! chpart stages and publishes parts on the local disk of the policy's first volume only, and
//! the table's own move rules take them to the `s3` disk afterwards, rows unchanged. A policy
//! with no local disk to stage on is refused before anything is written. Against the real
//! ClickHouse 26.9 engine.

use chpart_testenv::clickhouse::{
    ClickHouse, ServerOptions, COLD_DISK, HOT_DISK, S3ONLY_POLICY, TIERED_POLICY,
};
use chpart_testenv::moto::Moto;

use crate::cli::text;
use crate::commit::{build_load, expected_fingerprint, fingerprint_sql};
use crate::disks::{commit_mixed_winners, files_under, open_spec, policy_setup};

/// A moto endpoint with a bucket named after the test, and a server whose `tiered` and
/// `s3only` policies put their `s3` disk in that bucket.
fn tiered_server(test: &str) -> (Moto, ClickHouse) {
    let moto = Moto::start();
    let disk = moto.bucket(test);
    let ch = ClickHouse::start_with(ServerOptions {
        tiered_s3: Some(disk),
        ..ServerOptions::default()
    });
    (moto, ch)
}

/// `disk_name<TAB>count()` of the active parts of `db.table`.
fn active_by_disk(ch: &ClickHouse, db: &str, table: &str) -> String {
    ch.q(&format!(
        "SELECT disk_name, count() FROM system.parts WHERE database = '{db}' AND table = '{table}' AND active GROUP BY disk_name ORDER BY disk_name"
    ))
}

/// `disk<TAB>name` of every entry of `db.table`'s `detached/`, on any disk.
fn detached(ch: &ClickHouse, db: &str, table: &str) -> String {
    ch.q(&format!(
        "SELECT disk, name FROM system.detached_parts WHERE database = '{db}' AND table = '{table}' ORDER BY disk, name"
    ))
}

fn tiered_table_loads_exactly_once_then_moves_to_s3(visibility: &str) {
    let bucket = format!("tiered-{visibility}");
    let (moto, ch) = tiered_server(&bucket);
    let s = policy_setup(&ch, &format!("s3_{visibility}"), TIERED_POLICY);
    let hot = ch.hot_disk.clone().expect("a tiered server has a hot disk");
    let cold_metadata = ch.data_dir.join("disks").join(COLD_DISK);
    let load = format!("s3-{visibility}");
    let begin = ["--visibility", visibility, "--json"];
    // Three Spark partitions of 1000 rows over two months each, each built by two attempts:
    // a loser and the winner, both published.
    let built = build_load(&s, &load, &begin, 3, &["app-a", "app-b"]);
    let (spec, disks, publish) = open_spec(&s, &load, &begin);
    assert_eq!(
        disks,
        [HOT_DISK],
        "only the first volume's local disk: {spec}"
    );
    // Every attempt staged and published on the hot disk's filesystem.
    for m in built.iter().flatten() {
        for (disk, data_path, staging_dir) in m.disks() {
            assert_eq!(disk, HOT_DISK, "{}", m.to_json_line());
            assert!(
                data_path.as_str().starts_with(hot.to_str().unwrap()),
                "{data_path}"
            );
            assert!(
                staging_dir
                    .as_str()
                    .starts_with(hot.join("chpart-staging").to_str().unwrap()),
                "{staging_dir}"
            );
        }
    }
    let published = detached(&ch, &s.db.name, &publish);
    assert_eq!(published.lines().count(), 12, "{published}");
    assert!(
        published.lines().all(|l| l.starts_with("hot\t")),
        "every published part is in the hot disk's detached/: {published}"
    );
    assert_eq!(
        moto.keys(&bucket),
        Vec::<String>::new(),
        "nothing was written to object storage"
    );
    let on_cold: Vec<String> = files_under(&cold_metadata)
        .into_iter()
        .filter(|f| f.contains("/detached/") || f.contains("/chpart-staging/"))
        .collect();
    assert!(
        on_cold.is_empty(),
        "staged or published on the s3 disk: {on_cold:?}"
    );

    commit_mixed_winners(&s, &load, &built);
    let want = expected_fingerprint(&ch, &[0, 1, 2]);
    assert_eq!(
        active_by_disk(&ch, &s.db.name, "events"),
        "hot\t6\n",
        "the winners' parts are on the local disk, as after an INSERT"
    );

    // The table's own rules take the parts on: every partition to the s3 disk.
    let partitions = ch.q(&format!(
        "SELECT DISTINCT partition_id FROM system.parts WHERE database = '{}' AND table = 'events' AND active ORDER BY partition_id",
        s.db.name
    ));
    for id in partitions.lines() {
        ch.q(&format!(
            "ALTER TABLE {} MOVE PARTITION ID '{id}' TO DISK '{COLD_DISK}'",
            s.table
        ));
    }
    assert_eq!(
        active_by_disk(&ch, &s.db.name, "events"),
        "cold\t6\n",
        "every part moved to the s3 disk"
    );
    assert!(!moto.keys(&bucket).is_empty(), "the parts are objects now");
    assert_eq!(
        ch.q(&fingerprint_sql(&s.table)),
        want,
        "the rows are unchanged on the s3 disk"
    );

    // gc removes the losers (from the hot disk's detached/ or the shadow) and the staging.
    let out = s.run(&["gc", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        detached(&ch, &s.db.name, "events"),
        "",
        "nothing in detached/"
    );
    assert_eq!(
        detached(&ch, &s.db.name, &publish),
        "",
        "nothing in detached/"
    );
    let left = files_under(&hot.join("chpart-staging"));
    assert!(left.is_empty(), "staging left: {left:?}");
    let status = s.run(&["status", "--load", &load, "--json"]);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status[0]["gc_pending"], serde_json::json!([]), "{status}");
    assert_eq!(ch.q(&fingerprint_sql(&s.table)), want);
}

#[test]
fn a_tiered_table_loads_exactly_once_with_part_visibility_then_moves_to_s3() {
    tiered_table_loads_exactly_once_then_moves_to_s3("part");
}

#[test]
fn a_tiered_table_loads_exactly_once_with_partition_visibility_then_moves_to_s3() {
    tiered_table_loads_exactly_once_then_moves_to_s3("partition");
}

/// `begin` of a table under [`S3ONLY_POLICY`] (no local disk anywhere) with `visibility`:
/// refused with exit code 4 naming the policy, and nothing written: no table in the test's
/// database, no ledger entry for the load, nothing staged, no object.
fn no_local_disk_is_refused_and_nothing_is_written(visibility: &str) {
    let bucket = format!("s3only-{visibility}");
    let (moto, ch) = tiered_server(&bucket);
    let s = policy_setup(&ch, &format!("s3only_{visibility}"), S3ONLY_POLICY);
    let tables = format!(
        "SELECT name FROM system.tables WHERE database = '{}' ORDER BY name",
        s.db.name
    );
    // The table itself keeps a file on its disk (format_version.txt): an object already.
    let objects = moto.keys(&bucket);
    let out = s.begin("s3-only", &["--visibility", visibility]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let message = text(&out);
    assert!(
        message.contains(&format!("storage policy {S3ONLY_POLICY}:"))
            && message.contains("no local disk to stage parts on"),
        "{message}"
    );
    assert_eq!(ch.q(&tables), "events\n", "no shadow table was made");
    let status = s.run(&["status", "--load", "s3-only", "--json"]);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(
        status,
        serde_json::json!([]),
        "no ledger entry for the load"
    );
    let staged = files_under(&ch.data_dir.join("chpart-staging"));
    assert!(staged.is_empty(), "{staged:?}");
    assert_eq!(moto.keys(&bucket), objects, "no object written");
}

#[test]
fn a_table_with_no_local_disk_is_refused_with_part_visibility() {
    no_local_disk_is_refused_and_nothing_is_written("part");
}

#[test]
fn a_table_with_no_local_disk_is_refused_with_partition_visibility() {
    no_local_disk_is_refused_and_nothing_is_written("partition");
}
