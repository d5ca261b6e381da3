//! The environment smoke test: every real component in one flow, the way chpart will use them.
//!
//! A MergeTree table partitioned by month on the ClickHouse 26.9 server; a part built from rows
//! on stdin by the `clickhouse-local` command; uploaded over SFTP (ssh2, host key verified) into
//! an attempt's staging directory on the server's data filesystem; renamed into `detached/`
//! under the model's name; `ATTACH PART`; then `count()` and `hash_of_all_files` checked against
//! the builder's. Plus the two ways it must fail: a wrong host key, and a part owned by a user
//! other than the server's.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use chpart_core::{detached_part_name, AttemptId, LoadId, PartName, PartitionId, StagingLayout};
use chpart_remote::{RemoteError, RemoteFs, SftpConfig, SftpFs};
use chpart_server::{ClickHouseServer, Server, ServerConfig};
use chpart_testenv::clickhouse::{shared, ClickHouse, TestDb};
use chpart_testenv::sshd::Sshd;

const COLUMNS: &str = "ts DateTime('UTC'), id UInt64, v String";
const ENGINE: &str = "ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id";
/// Three rows in January 2026, two in February: two parts.
const ROWS: &str =
    "2026-01-01 00:00:00\t1\ta\n2026-01-15 10:00:00\t2\tb\n2026-01-31 23:59:59\t3\tc\n\
                    2026-02-01 00:00:00\t4\td\n2026-02-02 00:00:00\t5\te\n";

/// A part as clickhouse-local built it.
struct BuiltPart {
    partition_id: String,
    rows: u64,
    hash_of_all_files: String,
    dir: std::path::PathBuf,
}

/// Builds parts of `COLUMNS`/`ENGINE` from TSV rows on stdin with the clickhouse-local command.
fn build_parts(work: &Path, rows: &str) -> Vec<BuiltPart> {
    let query = format!(
        "CREATE DATABASE b; CREATE TABLE b.t ({COLUMNS}) {ENGINE}; INSERT INTO b.t SELECT * FROM input; \
         SELECT partition_id, rows, hash_of_all_files, path FROM system.parts \
         WHERE database = 'b' AND table = 't' AND active ORDER BY name"
    );
    let mut child = Command::new(chpart_testenv::clickhouse_local())
        .arg("--path")
        .arg(work)
        .args([
            "--structure",
            COLUMNS,
            "--input-format",
            "TabSeparated",
            "--table",
            "input",
            "--query",
            &query,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn clickhouse-local");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(rows.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "clickhouse-local failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            BuiltPart {
                partition_id: f[0].into(),
                rows: f[1].parse().unwrap(),
                hash_of_all_files: f[2].into(),
                dir: f[3].into(),
            }
        })
        .collect()
}

fn client(server: &ClickHouse) -> Server {
    Server::new(&ServerConfig {
        url: server.url(),
        user: "default".into(),
        password: None,
        request_timeout: Duration::from_secs(60),
    })
}

fn sftp(sshd: &Sshd, user: &str) -> SftpFs {
    let mut cfg = SftpConfig::new("127.0.0.1", sshd.port, user, &sshd.known_hosts);
    cfg.identity_file = Some(sshd.client_key.clone());
    SftpFs::connect(&cfg)
        .unwrap_or_else(|e| panic!("sftp login as {user}: {e}\nsshd log:\n{}", sshd.log()))
}

/// Uploads every built part into the attempt's staging dir and renames it into `detached/`
/// under the model's name. Returns the names, in the order of `parts`.
fn publish(
    fs: &dyn RemoteFs,
    layout: &StagingLayout,
    data_path: &str,
    load: &LoadId,
    attempt: &AttemptId,
    parts: &[BuiltPart],
) -> Vec<PartName> {
    let staging = layout.attempt(load, attempt);
    fs.create_dir_all(staging.parts_dir().as_str()).unwrap();
    parts
        .iter()
        .enumerate()
        .map(|(seq, part)| {
            let pid: PartitionId = part.partition_id.parse().unwrap();
            let name = detached_part_name(load, attempt, &pid, seq as u32);
            let staged = staging.part_dir(&name);
            let stats = fs.upload_dir(&part.dir, staged.as_str()).unwrap();
            assert!(stats.files >= 5 && stats.bytes > 0, "{stats:?}");
            let target = format!("{}detached/{name}", data_path);
            fs.rename_noreplace(staged.as_str(), &target).unwrap();
            // The name is now taken: a second publish under it is refused, never an overwrite.
            fs.create_dir_all(staged.as_str()).unwrap();
            let again = fs.rename_noreplace(staged.as_str(), &target).unwrap_err();
            assert!(
                matches!(again, RemoteError::AlreadyExists { .. }),
                "{again}"
            );
            fs.remove_all(staged.as_str()).unwrap();
            name
        })
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn build_upload_publish_attach_over_sftp() {
    let ch = shared();
    let sshd = Sshd::start(&[]);
    let db = TestDb::new(ch, "smoke");
    ch.q(&format!(
        "CREATE TABLE `{}`.events ({COLUMNS}) {ENGINE}",
        db.name
    ));
    let server = client(ch);
    let rt = runtime();
    let info = rt
        .block_on(server.table_info(&db.name, "events"))
        .unwrap()
        .unwrap();
    let data_path = &info.data_paths[0];

    let work = tempfile::tempdir().unwrap();
    let parts = build_parts(work.path(), ROWS);
    assert_eq!(
        parts
            .iter()
            .map(|p| (p.partition_id.as_str(), p.rows))
            .collect::<Vec<_>>(),
        [("202601", 3), ("202602", 2)]
    );

    let fs = sftp(&sshd, "root");
    let layout = StagingLayout::new(ch.data_dir.join("chpart-staging").to_str().unwrap()).unwrap();
    let load: LoadId = "smoke-load-1".parse().unwrap();
    let attempt =
        AttemptId::spark("local-1764490000000", "s1764489999000", "9f3a0c1d2e4b", 7).unwrap();
    let names = publish(&fs, &layout, data_path, &load, &attempt, &parts);

    rt.block_on(async {
        let detached = server.detached_parts(&db.name, "events").await.unwrap();
        let mut listed: Vec<String> = detached.iter().map(|d| d.name.clone()).collect();
        listed.sort();
        let mut want: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        want.sort();
        assert_eq!(
            listed, want,
            "system.detached_parts lists exactly the published parts"
        );

        for name in &names {
            server
                .attach_part(&db.name, "events", &name.to_string())
                .await
                .unwrap();
        }
        assert_eq!(server.count(&db.name, "events").await.unwrap(), 5);
        let attached = server.table_state(&db.name, "events").await.unwrap();
        let mut got: Vec<(String, u64, String)> = attached
            .iter()
            .filter(|p| !p.detached)
            .map(|p| (p.partition_id.clone(), p.rows, p.hash_of_all_files.clone()))
            .collect();
        got.sort();
        let want: Vec<(String, u64, String)> = parts
            .iter()
            .map(|p| (p.partition_id.clone(), p.rows, p.hash_of_all_files.clone()))
            .collect();
        assert_eq!(
            got, want,
            "attached parts keep the builder's rows and hash_of_all_files"
        );
        assert!(server
            .detached_parts(&db.name, "events")
            .await
            .unwrap()
            .is_empty());
    });
    assert_eq!(
        ch.q(&format!(
            "SELECT sum(id), groupArray(v) FROM (SELECT * FROM `{}`.events ORDER BY id)",
            db.name
        ))
        .trim(),
        "15\t['a','b','c','d','e']"
    );
}

#[test]
fn a_wrong_host_key_is_refused() {
    let sshd = Sshd::start(&[]);
    let mut cfg = SftpConfig::new("127.0.0.1", sshd.port, "root", sshd.wrong_known_hosts());
    cfg.identity_file = Some(sshd.client_key.clone());
    let err = SftpFs::connect(&cfg).unwrap_err();
    assert!(
        matches!(err, RemoteError::HostKeyMismatch { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains(&sshd.port.to_string()), "{err}");
}

/// The server runs as `clickhouse`, as packaged servers do. A part uploaded as root cannot be
/// attached (the server's error is surfaced); the same part uploaded as `clickhouse` can.
#[test]
fn attach_needs_parts_owned_by_the_server_user() {
    let ch = ClickHouse::start(Some("clickhouse"));
    let sshd = Sshd::start(&["clickhouse"]);
    ch.q("CREATE DATABASE own");
    ch.q(&format!("CREATE TABLE own.events ({COLUMNS}) {ENGINE}"));
    let server = client(&ch);
    let rt = runtime();
    let info = rt
        .block_on(server.table_info("own", "events"))
        .unwrap()
        .unwrap();
    let data_path = &info.data_paths[0];
    let work = tempfile::tempdir().unwrap();
    let parts = build_parts(work.path(), "2026-03-01 00:00:00\t1\tx\n");
    // Each user stages under its own root: a root-owned staging dir is itself a deploy mistake.
    let staging_of = |user: &str| {
        StagingLayout::new(
            ch.data_dir
                .join(format!("staging-{user}"))
                .to_str()
                .unwrap(),
        )
        .unwrap()
    };
    let load: LoadId = "own-load".parse().unwrap();
    let (clickhouse_uid, _) = chpart_testenv::os_user_ids("clickhouse");

    // Uploaded as root: ATTACH fails with the server's own error.
    let as_root = sftp(&sshd, "root");
    let wrong: AttemptId = "app.1".parse().unwrap();
    let names = publish(
        &as_root,
        &staging_of("root"),
        data_path,
        &load,
        &wrong,
        &parts,
    );
    let published = as_root
        .stat(&format!("{data_path}detached/{}", names[0]))
        .unwrap()
        .unwrap();
    assert_eq!(published.uid, 0);
    let err = rt
        .block_on(server.attach_part("own", "events", &names[0].to_string()))
        .unwrap_err();
    let code = err.code();
    assert!(
        matches!(code, Some(481) | Some(76) | Some(1001)),
        "unexpected error for a root-owned part: {err}"
    );
    assert!(err.to_string().contains("ATTACH PART"), "{err}");
    assert_eq!(ch.q("SELECT count() FROM own.events").trim(), "0");

    // Uploaded as the server's user: it attaches.
    let as_server_user = sftp(&sshd, "clickhouse");
    let right: AttemptId = "app.2".parse().unwrap();
    let names = publish(
        &as_server_user,
        &staging_of("clickhouse"),
        data_path,
        &load,
        &right,
        &parts,
    );
    let published = as_server_user
        .stat(&format!("{data_path}detached/{}", names[0]))
        .unwrap()
        .unwrap();
    assert_eq!(published.uid, clickhouse_uid);
    rt.block_on(server.attach_part("own", "events", &names[0].to_string()))
        .unwrap();
    assert_eq!(ch.q("SELECT count() FROM own.events").trim(), "1");
}
