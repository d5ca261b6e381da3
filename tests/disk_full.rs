//! One shard's disk full during a publish: shard 3's server runs on a filesystem of its own (a
//! 64 MiB tmpfs, `chpart_testenv::smallfs`) that holds its data, its tables' `detached/` and
//! chpart's staging, and that is filled but for 32 KiB before the build uploads over SFTP.
//! The build fails naming the shard, the host, the path and "no space left on device" (the
//! SFTP server's generic failure, read back as ENOSPC from the filesystem's free space), and
//! undoes what it published on every shard; nothing is attached. Once space is freed, a new
//! attempt loads exactly once and gc leaves nothing.

use std::path::Path;
use std::process::Output;

use chpart_testenv::cluster::Cluster;
use chpart_testenv::smallfs::SmallFs;

use crate::build::{rows_select, write_rows, COLUMNS};
use crate::cli::{chpart, text};
use crate::distributed::{cluster_config, fingerprint, leftovers, over_sftp_config};

const ENGINE: &str = "ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id";

fn run(config: &Path, args: &[&str]) -> Output {
    crate::cli::run_with(config, args)
}

fn build(config: &Path, attempt: &str, input: &Path) -> Output {
    chpart()
        .args(["build", "--config"])
        .arg(config)
        .args(["--load", "full-1", "--attempt", attempt, "--partition", "0"])
        .arg("--input")
        .arg(input)
        .output()
        .unwrap()
}

#[test]
fn a_full_disk_on_one_shard_fails_the_build_cleanly_and_a_rerun_after_freeing_space_loads_once() {
    chpart_testenv::sshd::ensure_system_user("clickhouse");
    let mut cluster = Cluster::start_with_sshd("dfull", &[1, 1, 1], Some("clickhouse"));
    // Shard 3's server moves onto a filesystem of its own: stopped, its data copied onto the
    // tmpfs mounted over its data directory, started again (same ports).
    let node = &mut cluster.nodes[2];
    let data_dir = node.data_dir().to_path_buf();
    node.server.stop();
    let disk = SmallFs::mount_over(&data_dir, 64);
    node.server.start_again();

    for node in &cluster.nodes {
        let ch = &node.server;
        ch.q("CREATE DATABASE db");
        ch.q(&format!("CREATE TABLE db.local ({COLUMNS}) {ENGINE}"));
        ch.q(&format!("CREATE TABLE db.twin_local ({COLUMNS}) {ENGINE}"));
    }
    let entry = &cluster.nodes[0].server;
    entry.q("CREATE TABLE db.events AS db.local ENGINE = Distributed(dfull, db, local, id)");
    entry
        .q("CREATE TABLE db.twin AS db.twin_local ENGINE = Distributed(dfull, db, twin_local, id)");
    let dir = tempfile::tempdir().unwrap();
    let config = cluster_config(&cluster, dir.path(), 3, None);
    over_sftp_config(&cluster, &config);

    let begun = run(
        &config,
        &["begin", "--table", "db.events", "--load", "full-1"],
    );
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));
    // 300,000 rows, a third of them for shard 3: far more than the 32 KiB left there.
    let rows = rows_select(0, 300_000);
    let input = write_rows(dir.path(), "in.parquet", &rows, "Parquet");
    disk.fill_leaving(32 * 1024);

    let failed = build(&config, "app-f.0", &input);
    let message = text(&failed);
    eprintln!("the build on a full disk: {message}");
    assert_eq!(failed.status.code(), Some(4), "{message}");
    let shard3 = &cluster.nodes[2];
    for word in [
        "shard 3".to_owned(),
        shard3.address.to_string(),
        data_dir.join("chpart-staging").display().to_string(),
        "no space left on device".to_owned(),
    ] {
        assert!(message.contains(&word), "{word:?} not in: {message}");
    }
    for node in &cluster.nodes {
        assert_eq!(
            node.server.q("SELECT count() FROM db.local").trim(),
            "0",
            "nothing attached on shard {}",
            node.shard_num
        );
    }
    assert_eq!(
        leftovers(&cluster),
        Vec::<String>::new(),
        "what the attempt published was undone on every shard, its staging removed"
    );

    // Space freed: a new attempt (the task's retry) publishes on every shard, and the commit
    // loads every row once, on the shard ClickHouse's own INSERT sends it to.
    disk.free();
    let built = build(&config, "app-f.1", &input);
    assert_eq!(built.status.code(), Some(0), "{}", text(&built));
    let line = String::from_utf8_lossy(&built.stdout)
        .lines()
        .last()
        .unwrap()
        .to_owned();
    let winners = dir.path().join("winners.jsonl");
    std::fs::write(&winners, line + "\n").unwrap();
    let committed = run(
        &config,
        &[
            "commit",
            "--load",
            "full-1",
            "--winners",
            winners.to_str().unwrap(),
        ],
    );
    assert_eq!(committed.status.code(), Some(0), "{}", text(&committed));
    entry.q(&format!(
        "INSERT INTO db.twin SELECT * FROM ({rows}) SETTINGS insert_distributed_sync = 1"
    ));
    for node in &cluster.nodes {
        assert_eq!(
            node.server.q(&fingerprint("db.local")),
            node.server.q(&fingerprint("db.twin_local")),
            "shard {} differs from its INSERT twin",
            node.shard_num
        );
    }
    assert_eq!(
        entry.q("SELECT count(), uniqExact(id) FROM db.events"),
        "300000\t300000\n"
    );
    let gc = run(&config, &["gc"]);
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
    assert_eq!(leftovers(&cluster), Vec::<String>::new());
    drop(disk);
}
