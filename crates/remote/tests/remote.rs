//! The RemoteFs contract against both backends, and the SFTP connection's
//! refusals against a real OpenSSH sshd (started per test from
//! deploy/dev/sshd.sh; a missing sshd fails the test with the install command).

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use chpart_core::retry::RetryPolicy;
use chpart_remote::retry::{Connector, Reconnecting};
use chpart_remote::{conformance, FileKind, LocalFs, RemoteError, RemoteFs, SftpConfig, SftpFs};
use chpart_testenv::os_user_ids;
use chpart_testenv::proxy::{FaultProxy, Mode};
use chpart_testenv::sshd::{ensure_system_user, Sshd};

/// The unprivileged user deploy/install.sh creates for permission tests.
const TEST_USER: &str = "chpart-test";

fn config(sshd: &Sshd, user: &str) -> SftpConfig {
    let mut cfg = SftpConfig::new("127.0.0.1", sshd.port, user, &sshd.known_hosts);
    cfg.identity_file = Some(sshd.client_key.clone());
    cfg.connect_timeout_secs = 5;
    cfg.io_timeout_secs = 30;
    cfg
}

fn connect(sshd: &Sshd, user: &str) -> SftpFs {
    SftpFs::connect(&config(sshd, user))
        .unwrap_or_else(|e| panic!("connect as {user}: {e}\nsshd log:\n{}", sshd.log()))
}

fn connect_err(cfg: &SftpConfig) -> RemoteError {
    match SftpFs::connect(cfg) {
        Ok(fs) => panic!("connecting to {} should have failed", fs.describe()),
        Err(e) => e,
    }
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("temp paths are UTF-8").to_string()
}

/// A directory on another filesystem than the tempdir, for EXDEV. /dev/shm is
/// tmpfs on Linux while the tempdir is on the root filesystem; the test
/// fails rather than passes vacuously if that is not so here.
fn other_filesystem_dir(same_as: &Path) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("chpart-xdev-")
        .tempdir_in("/dev/shm")
        .expect("create a tempdir in /dev/shm (tmpfs) for the cross-filesystem test");
    let dev = |p: &Path| {
        fs::metadata(p)
            .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
            .dev()
    };
    assert_ne!(
        dev(dir.path()),
        dev(same_as),
        "{} and {} are on the same filesystem: this machine needs another place for the cross-filesystem test",
        dir.path().display(),
        same_as.display()
    );
    dir
}

/// The conformance suite against `fs_` in fresh scratch directories (sshd runs on this
/// machine, so a local tempdir is also the remote scratch).
fn conformance_in_scratch(fs_: &dyn RemoteFs) {
    let tmp = tempfile::tempdir().unwrap();
    let remote = tmp.path().join("remote");
    let local = tmp.path().join("local");
    fs::create_dir_all(&remote).unwrap();
    fs::create_dir_all(&local).unwrap();
    conformance::run_all(fs_, &path_str(&remote), &local);
}

#[test]
fn local_backend_meets_the_contract() {
    conformance_in_scratch(&LocalFs::new());
}

#[test]
fn reconnecting_local_backend_meets_the_contract() {
    let connector: Connector = Box::new(|| Ok(Arc::new(LocalFs::new()) as Arc<dyn RemoteFs>));
    let fs_ =
        Reconnecting::connect(connector, RetryPolicy::within(Duration::from_secs(5))).unwrap();
    conformance_in_scratch(&fs_);
}

#[test]
fn sftp_backend_meets_the_contract() {
    let sshd = Sshd::start(&[]);
    let fs_ = connect(&sshd, "root");
    assert_eq!(
        fs_.describe(),
        format!("sftp://root@127.0.0.1:{}", sshd.port)
    );
    conformance_in_scratch(&fs_);

    let cfg = config(&sshd, "root");
    let connector: Connector = Box::new(move || Ok(Arc::new(SftpFs::connect(&cfg)?) as _));
    let reconnecting =
        Reconnecting::connect(connector, RetryPolicy::within(Duration::from_secs(5))).unwrap();
    conformance_in_scratch(&reconnecting);
}

/// The whole contract holds through the deploy guide's least-privilege `authorized_keys` line
/// (`restrict,command="internal-sftp"`): chpart needs nothing but the SFTP subsystem. That the
/// same key cannot run a command is `tests/ssh.rs`'s to show, with the OpenSSH client.
#[test]
fn sftp_backend_meets_the_contract_through_an_sftp_only_key() {
    let sshd = Sshd::start(&[]);
    let line = sshd.restrict_to_sftp();
    assert!(
        line.starts_with("restrict,command=\"internal-sftp\" "),
        "{line}"
    );
    conformance_in_scratch(&connect(&sshd, "root"));
    let log = fs::read_to_string(sshd.dir.join("sshd.log")).unwrap();
    assert!(
        log.contains("forced-command (key-option) 'internal-sftp'"),
        "the session ran under the restricted line:\n{}",
        sshd.log()
    );
}

/// sshd behind a fault proxy, with a known_hosts that lists its key for the proxy's port.
fn sftp_through_proxy(sshd: &Sshd, dir: &Path) -> (FaultProxy, SftpConfig) {
    let proxy = FaultProxy::start(([127, 0, 0, 1], sshd.port).into());
    let known = fs::read_to_string(&sshd.known_hosts)
        .unwrap()
        .replace(&format!("]:{} ", sshd.port), &format!("]:{} ", proxy.port));
    let known_hosts = dir.join("known_hosts.proxy");
    fs::write(&known_hosts, known).unwrap();
    let mut cfg = config(sshd, "root");
    cfg.port = proxy.port;
    cfg.known_hosts = known_hosts;
    cfg.connect_timeout_secs = 2;
    cfg.io_timeout_secs = 5;
    (proxy, cfg)
}

/// The connection cut in the middle of an upload, and the host refusing connections for a
/// while after: the upload starts that part again on a new connection and ends with every
/// file as the local one; a claim (`create_dir`) is sent once, its fault reported.
#[test]
fn an_upload_cut_midway_is_sent_again_on_a_new_connection() {
    let sshd = Sshd::start(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let (proxy, cfg) = sftp_through_proxy(&sshd, tmp.path());
    let connects = Arc::new(AtomicUsize::new(0));
    let counted = connects.clone();
    let connector: Connector = Box::new(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(SftpFs::connect(&cfg)?) as _)
    });
    let fs_ =
        Reconnecting::connect(connector, RetryPolicy::within(Duration::from_secs(30))).unwrap();

    // A part of 24 files of 512 KiB (12 MiB); the cut comes after 4 MiB.
    let part = tmp.path().join("part");
    fs::create_dir_all(&part).unwrap();
    for i in 0..24u32 {
        let bytes: Vec<u8> = (0..512 * 1024u32)
            .map(|b| (b.wrapping_mul(31) ^ i) as u8)
            .collect();
        fs::write(part.join(format!("col{i}.bin")), bytes).unwrap();
    }
    let remote = tmp.path().join("remote");
    fs::create_dir_all(&remote).unwrap();
    let target = path_str(&remote.join("all_1_1_0"));
    proxy.cut_after_bytes(4 * 1024 * 1024);
    // While reconnecting, the host refuses connections for a second.
    let accepted_by_then = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            while proxy.cut_pending() {
                std::thread::sleep(Duration::from_millis(5));
            }
            proxy.set_mode(Mode::Refuse);
            std::thread::sleep(Duration::from_secs(1));
            let accepted = proxy.accepted();
            proxy.set_mode(Mode::Pass);
            accepted
        });
        fs_.upload_dir(&part, &target).unwrap();
        watcher.join().unwrap()
    });
    assert_eq!(proxy.cuts(), 1);
    assert!(
        connects.load(Ordering::SeqCst) >= 2,
        "a new connection after the cut"
    );
    assert!(
        accepted_by_then >= 2,
        "the first connection, then at least one refused while the host was down"
    );
    let digests = fs_.digest_dir(&target).unwrap();
    assert_eq!(digests.len(), 24);
    for (name, (size, _)) in &digests {
        let local = fs::read(part.join(name)).unwrap();
        assert_eq!(*size, local.len() as u64, "{name}");
        assert_eq!(
            fs::read(remote.join("all_1_1_0").join(name)).unwrap(),
            local,
            "{name}"
        );
    }

    // A claim is not resent: the cut is reported, and the next call reconnects.
    let claim = path_str(&remote.join("claim"));
    proxy.cut_all();
    let err = fs_.create_dir(&claim);
    assert!(
        matches!(&err, Err(e) if e.is_transient()) || err.is_ok(),
        "a cut claim is transient (or the cut came before the request): {err:?}"
    );
    fs_.create_dir_all(&path_str(&remote.join("after")))
        .unwrap();
}

/// A host down for longer than the deadline: the connect gives up with the transient error.
#[test]
fn a_host_down_past_the_deadline_is_a_transient_connect_error() {
    let sshd = Sshd::start(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let (proxy, cfg) = sftp_through_proxy(&sshd, tmp.path());
    proxy.set_mode(Mode::Refuse);
    let started = Instant::now();
    let connector: Connector = Box::new(move || Ok(Arc::new(SftpFs::connect(&cfg)?) as _));
    let err = match Reconnecting::connect(connector, RetryPolicy::within(Duration::from_secs(2))) {
        Ok(_) => panic!("connected through a proxy that refuses"),
        Err(e) => e,
    };
    assert!(err.is_transient(), "{err}");
    assert!(
        proxy.accepted() >= 2,
        "retried: {} connects",
        proxy.accepted()
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn local_rename_across_filesystems_is_cross_device() {
    let tmp = tempfile::tempdir().unwrap();
    let other = other_filesystem_dir(tmp.path());
    let from = other.path().join("staged");
    fs::create_dir(&from).unwrap();
    let to = tmp.path().join("detached_part");
    match LocalFs::new().rename_noreplace(&path_str(&from), &path_str(&to)) {
        Err(e @ RemoteError::CrossDevice { .. }) => {
            assert!(e.to_string().contains("same filesystem"), "{e}");
            assert!(!e.is_transient());
        }
        other => panic!("expected CrossDevice, got {other:?}"),
    }
    assert!(from.exists() && !to.exists());
}

#[test]
fn sftp_rename_across_filesystems_says_so() {
    let sshd = Sshd::start(&[]);
    let fs_ = connect(&sshd, "root");
    let tmp = tempfile::tempdir().unwrap();
    let other = other_filesystem_dir(tmp.path());
    let from = other.path().join("staged");
    fs::create_dir(&from).unwrap();
    fs::write(from.join("data.bin"), b"x").unwrap();
    let to = tmp.path().join("detached_part");
    match fs_.rename_noreplace(&path_str(&from), &path_str(&to)) {
        Err(e @ RemoteError::CrossDevice { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("different filesystems"), "{msg}");
            assert!(
                msg.contains(&fs_.describe()),
                "message must name the host: {msg}"
            );
        }
        other => panic!("expected CrossDevice, got {other:?}"),
    }
    assert!(from.join("data.bin").exists() && !to.exists());
}

#[test]
fn wrong_host_key_is_refused() {
    let sshd = Sshd::start(&[]);
    let mut cfg = config(&sshd, "root");
    cfg.known_hosts = sshd.wrong_known_hosts();
    match connect_err(&cfg) {
        e @ RemoteError::HostKeyMismatch { .. } => {
            let msg = e.to_string();
            assert!(msg.contains(&format!("127.0.0.1:{}", sshd.port)), "{msg}");
            assert!(
                msg.contains(&cfg.known_hosts.display().to_string()),
                "{msg}"
            );
            assert!(!e.is_transient());
        }
        other => panic!("expected HostKeyMismatch, got {other:?}"),
    }
}

#[test]
fn host_missing_from_known_hosts_is_refused() {
    let sshd = Sshd::start(&[]);
    let mut cfg = config(&sshd, "root");
    let empty = sshd.dir.join("known_hosts.empty");
    fs::write(&empty, "").unwrap();
    cfg.known_hosts = empty.clone();
    match connect_err(&cfg) {
        e @ RemoteError::HostKeyUnknown { .. } => {
            let msg = e.to_string();
            assert!(msg.contains(&format!("[127.0.0.1]:{}", sshd.port)), "{msg}");
            assert!(msg.contains(&empty.display().to_string()), "{msg}");
            assert!(!e.is_transient());
        }
        other => panic!("expected HostKeyUnknown, got {other:?}"),
    }
}

#[test]
fn plain_host_entry_does_not_vouch_for_another_port() {
    // OpenSSH looks a non-22 port up only as `[host]:port`; libssh2's
    // check_port would also accept the bare host, which this must not.
    let sshd = Sshd::start(&[]);
    let right = fs::read_to_string(&sshd.known_hosts).unwrap();
    let key = right
        .split_once(' ')
        .map(|(_, key)| key.to_string())
        .expect("known_hosts line has a key");
    let plain = sshd.dir.join("known_hosts.plain");
    fs::write(&plain, format!("127.0.0.1 {key}")).unwrap();
    let mut cfg = config(&sshd, "root");
    cfg.known_hosts = plain;
    match connect_err(&cfg) {
        RemoteError::HostKeyUnknown { .. } => {}
        other => panic!("expected HostKeyUnknown, got {other:?}"),
    }
}

#[test]
fn missing_known_hosts_file_is_an_error_naming_it() {
    let sshd = Sshd::start(&[]);
    let mut cfg = config(&sshd, "root");
    cfg.known_hosts = sshd.dir.join("no_such_known_hosts");
    match connect_err(&cfg) {
        e @ RemoteError::KnownHosts { .. } => {
            assert!(e.to_string().contains("no_such_known_hosts"), "{e}");
        }
        other => panic!("expected KnownHosts, got {other:?}"),
    }
}

#[test]
fn closed_port_is_a_transient_connect_error() {
    let closed = chpart_testenv::ClosedPort::new();
    let port = closed.port;
    let cfg = SftpConfig::new(
        "127.0.0.1",
        port,
        "root",
        "/nonexistent/but/never/read/first",
    );
    // known_hosts is read before connecting; give it a real (empty) file.
    let tmp = tempfile::tempdir().unwrap();
    let kh = tmp.path().join("known_hosts");
    fs::write(&kh, "").unwrap();
    let cfg = SftpConfig {
        known_hosts: kh,
        ..cfg
    };
    match connect_err(&cfg) {
        e @ RemoteError::Connect { .. } => {
            assert!(e.is_transient(), "{e}");
            assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
        }
        other => panic!("expected Connect, got {other:?}"),
    }
}

#[test]
fn silent_server_is_a_transient_handshake_timeout() {
    // A port from free_port: an ephemeral bind here could take a port another test of this
    // process was handed and is about to use.
    let port = chpart_testenv::free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    // Accept and hold the connection without ever sending an SSH banner.
    let holder = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(4));
        drop(conn);
    });
    let tmp = tempfile::tempdir().unwrap();
    let kh = tmp.path().join("known_hosts");
    fs::write(&kh, "").unwrap();
    let mut cfg = SftpConfig::new("127.0.0.1", port, "root", kh);
    cfg.connect_timeout_secs = 1;
    let started = Instant::now();
    match connect_err(&cfg) {
        e @ RemoteError::Handshake { .. } => assert!(e.is_transient(), "{e}"),
        other => panic!("expected Handshake, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the connect timeout was not applied"
    );
    holder.join().unwrap();
}

#[test]
fn wrong_client_key_is_an_auth_error() {
    let sshd = Sshd::start(&[]);
    let other_key = sshd.dir.join("other_client_key");
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other_key)
        .status()
        .expect("run ssh-keygen");
    assert!(status.success());
    let mut cfg = config(&sshd, "root");
    cfg.identity_file = Some(other_key.clone());
    match connect_err(&cfg) {
        e @ RemoteError::Auth { .. } => {
            let msg = e.to_string();
            assert!(msg.contains("root") && msg.contains("127.0.0.1"), "{msg}");
            assert!(msg.contains(&other_key.display().to_string()), "{msg}");
            assert!(!e.is_transient());
        }
        other => panic!("expected Auth, got {other:?}"),
    }

    cfg.identity_file = Some(sshd.dir.join("no_such_key"));
    match connect_err(&cfg) {
        e @ RemoteError::Auth { .. } => assert!(e.to_string().contains("no_such_key"), "{e}"),
        other => panic!("expected Auth for a missing key file, got {other:?}"),
    }

    cfg.identity_file = None;
    match connect_err(&cfg) {
        e @ RemoteError::Auth { .. } => assert!(e.to_string().contains("no credentials"), "{e}"),
        other => panic!("expected Auth without credentials, got {other:?}"),
    }
}

#[test]
fn user_outside_allow_users_is_an_auth_error() {
    ensure_system_user(TEST_USER);
    let sshd = Sshd::start(&[]);
    match connect_err(&config(&sshd, TEST_USER)) {
        RemoteError::Auth { user, .. } => assert_eq!(user, TEST_USER),
        other => panic!("expected Auth, got {other:?}"),
    }
}

#[test]
fn permission_denied_is_reported_as_such() {
    ensure_system_user(TEST_USER);
    let sshd = Sshd::start(&[TEST_USER]);
    let fs_ = connect(&sshd, TEST_USER);

    // The unprivileged user must be able to reach the base, not the locked dir.
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let base = tmp.path();
    let locked = base.join("locked");
    fs::create_dir(&locked).unwrap();
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(locked.join("secret"), b"s").unwrap();
    let read_only = base.join("read_only");
    fs::create_dir(&read_only).unwrap();
    fs::set_permissions(&read_only, fs::Permissions::from_mode(0o755)).unwrap();
    let source = base.join("source");
    fs::create_dir(&source).unwrap();
    fs::write(source.join("data.bin"), b"payload").unwrap();
    let owned = base.join("owned");
    fs::create_dir(&owned).unwrap();
    std::os::unix::fs::chown(&owned, Some(os_user_ids(TEST_USER).0), None).unwrap();

    let expect_denied = |what: &str, r: Result<(), RemoteError>, path: &str| match r {
        Err(e @ RemoteError::PermissionDenied { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(path), "{what}: {msg}");
            assert!(msg.contains(&fs_.describe()), "{what}: {msg}");
            assert!(!e.is_transient(), "{what}");
        }
        other => panic!("{what}: expected PermissionDenied, got {other:?}"),
    };
    let locked_s = path_str(&locked);
    expect_denied(
        "upload_dir into a 0700 root dir",
        fs_.upload_dir(&source, &format!("{locked_s}/part"))
            .map(|_| ()),
        &locked_s,
    );
    expect_denied(
        "stat inside it",
        fs_.stat(&format!("{locked_s}/secret")).map(|_| ()),
        &locked_s,
    );
    expect_denied(
        "read_file inside it",
        fs_.read_file(&format!("{locked_s}/secret")).map(|_| ()),
        &locked_s,
    );
    expect_denied(
        "list_dir of it",
        fs_.list_dir(&locked_s).map(|_| ()),
        &locked_s,
    );
    let ro = path_str(&read_only);
    expect_denied(
        "write_file_atomic into a root-owned 0755 dir",
        fs_.write_file_atomic(&format!("{ro}/marker"), b"x"),
        &ro,
    );
    expect_denied(
        "create_dir_all under it",
        fs_.create_dir_all(&format!("{ro}/sub")),
        &ro,
    );

    // What the user may do, it does, and files end up owned by that user:
    // ClickHouse must be able to take over what chpart uploads.
    let owned_s = path_str(&owned);
    let part = format!("{owned_s}/part");
    fs_.upload_dir(&source, &part).unwrap();
    let st = fs_.stat(&format!("{part}/data.bin")).unwrap().unwrap();
    assert_eq!(
        (st.kind, st.size, st.uid),
        (FileKind::File, 7, os_user_ids(TEST_USER).0)
    );
    expect_denied(
        "rename out of reach into the locked dir",
        fs_.rename_noreplace(&part, &format!("{locked_s}/part")),
        &locked_s,
    );
    assert!(Path::new(&part).join("data.bin").exists());
}

#[test]
fn sftp_connection_is_shareable_across_threads() {
    let sshd = Sshd::start(&[]);
    let fs_: std::sync::Arc<dyn RemoteFs> = std::sync::Arc::new(connect(&sshd, "root"));
    let tmp = tempfile::tempdir().unwrap();
    let base = path_str(tmp.path());
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let fs_ = fs_.clone();
            let path = format!("{base}/f{i}");
            std::thread::spawn(move || {
                fs_.write_file_atomic(&path, format!("content {i}").as_bytes())
                    .unwrap();
                fs_.read_file(&path).unwrap()
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), format!("content {i}").into_bytes());
    }
    let names: Vec<PathBuf> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(names.len(), 4, "no temp files may remain: {names:?}");
}
