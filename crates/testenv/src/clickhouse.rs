//! The ClickHouse 26.9 engine as a server for tests (`deploy/dev/clickhouse-server serve`).
//!
//! [`ServerOptions`] say how: the loopback address to listen on, fixed ports, extra config
//! (a cluster's `<remote_servers>`), the OS user, the time zone, a JBOD storage policy, a tiered
//! storage policy whose second volume is an `s3` disk (on a [`crate::moto::Moto`] endpoint).
//!
//! The server blocks reading its stdin pipe, which this harness holds: dropping the handle
//! closes the pipe (a clean shutdown) and a test process that dies closes it too, so no server
//! outlives its test run. A small blocking HTTP client ([`ClickHouse::query`]) lets tests check
//! the server independently of chpart's own client.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::http::http;
use crate::moto::S3Disk;
use crate::{deploy_script, free_port_on, log_tail, require_engine, scratch_dir, wait_until};

/// How long a server may take to answer `/ping` (the engine loads in about a second; CI is slow).
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Starts tried before a server that exits at once (a port taken meanwhile) fails the test.
const START_ATTEMPTS: u32 = 3;

/// The storage policy [`ServerOptions::jbod`] adds: one volume of two local disks, `d1` and `d2`.
pub const JBOD_POLICY: &str = "jbod";

/// The storage policy [`ServerOptions::tiered_s3`] adds: volume `hot` (the local disk
/// [`HOT_DISK`]) first, then volume `cold` (the `s3` disk [`COLD_DISK`]).
pub const TIERED_POLICY: &str = "tiered";

/// The storage policy [`ServerOptions::tiered_s3`] adds whose only volume is the `s3` disk
/// [`COLD_DISK`]: no local disk at all.
pub const S3ONLY_POLICY: &str = "s3only";

/// The local disk of [`TIERED_POLICY`]'s first volume.
pub const HOT_DISK: &str = "hot";

/// The `s3` disk of [`TIERED_POLICY`]'s second volume and of [`S3ONLY_POLICY`].
pub const COLD_DISK: &str = "cold";

/// How to start a server. `ServerOptions::default()` is what [`ClickHouse::start`]`(None)` does:
/// 127.0.0.1, fresh ports, the test's own user and time zone, the default disk only.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// The address to listen on (`None`: 127.0.0.1). Any 127.x.y.z is a loopback address on
    /// Linux without setup, so each server can be a "host" of its own.
    pub listen_host: Option<Ipv4Addr>,
    /// Fixed `(http, tcp)` ports instead of fresh ones, for servers whose ports other servers'
    /// configs name (a cluster). Only one start is tried: a taken port fails the test.
    pub ports: Option<(u16, u16)>,
    /// XML elements put inside `<clickhouse>` of the server's config.xml, e.g.
    /// `<remote_servers>...</remote_servers><macros>...</macros>`.
    pub config_extra: Option<String>,
    /// OS user the server runs as (needs root); it then owns the data and disk directories.
    pub user: Option<String>,
    /// The server's time zone (its `TZ`; what `SELECT timezone()` answers and `DateTime`
    /// columns without a zone use), when not the machine's.
    pub tz: Option<String>,
    /// Adds the storage policy [`JBOD_POLICY`] of two local disks `d1` and `d2`, whose
    /// directories ([`ClickHouse::disks`]) are made next to the data directory.
    pub jbod: bool,
    /// Adds the storage policies [`TIERED_POLICY`] (local disk [`HOT_DISK`], whose directory
    /// ([`ClickHouse::hot_disk`]) is made next to the data directory, then the `s3` disk
    /// [`COLD_DISK`] on this endpoint) and [`S3ONLY_POLICY`] (the `s3` disk only). The `s3`
    /// disk's metadata (the files that point at objects) lives under the data directory.
    pub tiered_s3: Option<S3Disk>,
    /// ClickHouse users besides `default` (which keeps every privilege), each with only its
    /// grants: written to a `users.xml` of the server's own (this engine has no SQL-managed
    /// user storage, so `CREATE USER` is refused).
    pub users: Vec<ServerUser>,
}

/// A ClickHouse user of a test server, without a password, holding only `grants`.
#[derive(Debug, Clone)]
pub struct ServerUser {
    /// The user's name.
    pub name: String,
    /// `GRANT` statements without `TO` (`GRANT SELECT, INSERT ON db.*`).
    pub grants: Vec<String>,
}

/// The `users.xml` of a server with `users` besides `default`.
fn users_xml(users: &[ServerUser]) -> String {
    let user = |name: &str, body: &str| {
        format!(
            "<{name}><password></password><networks><ip>::/0</ip></networks>\
             <profile>default</profile><quota>default</quota>{body}</{name}>"
        )
    };
    let mut xml = String::from("<clickhouse><users>");
    xml.push_str(&user("default", "<access_management>1</access_management>"));
    for u in users {
        let grants: String = u
            .grants
            .iter()
            .map(|g| format!("<query>{g}</query>"))
            .collect();
        xml.push_str(&user(&u.name, &format!("<grants>{grants}</grants>")));
    }
    xml.push_str(
        "</users><profiles><default></default></profiles><quotas><default></default></quotas></clickhouse>\n",
    );
    xml
}

/// A running ClickHouse server on a loopback address, stopped on drop.
pub struct ClickHouse {
    /// The loopback address it listens on (127.0.0.1 unless [`ServerOptions::listen_host`]).
    pub host: Ipv4Addr,
    /// HTTP port on [`ClickHouse::host`].
    pub http_port: u16,
    /// Native TCP port on [`ClickHouse::host`].
    pub tcp_port: u16,
    /// The server's data directory (`metadata/`, `store/`): its `default` disk.
    pub data_dir: PathBuf,
    /// Directories of the [`JBOD_POLICY`] disks `d1` and `d2` (empty without
    /// [`ServerOptions::jbod`]).
    pub disks: Vec<PathBuf>,
    /// Directory of the [`TIERED_POLICY`]'s local disk [`HOT_DISK`] (`None` without
    /// [`ServerOptions::tiered_s3`]).
    pub hot_disk: Option<PathBuf>,
    /// OS user the server runs as (`None`: the test's own user).
    pub user: Option<String>,
    /// The server's time zone (its `TZ`) when not the machine's.
    pub tz: Option<String>,
    options: ServerOptions,
    run_dir: PathBuf,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    _scratch: Option<tempfile::TempDir>,
}

impl ClickHouse {
    /// Starts a server in fresh directories, as `user` if given (needs root).
    pub fn start(user: Option<&str>) -> ClickHouse {
        ClickHouse::start_with(ServerOptions {
            user: user.map(str::to_owned),
            ..ServerOptions::default()
        })
    }

    /// Starts a server in fresh directories whose default time zone is `tz` (its `TZ`; what
    /// `SELECT timezone()` answers and `DateTime` columns without a zone use).
    pub fn start_in_zone(tz: &str) -> ClickHouse {
        ClickHouse::start_with(ServerOptions {
            tz: Some(tz.to_owned()),
            ..ServerOptions::default()
        })
    }

    /// Starts a server in fresh directories with `options`.
    pub fn start_with(options: ServerOptions) -> ClickHouse {
        let scratch = scratch_dir("clickhouse");
        let mut server = ClickHouse::start_in_with(
            &scratch.path().join("data"),
            &scratch.path().join("run"),
            options,
        );
        server._scratch = Some(scratch);
        server
    }

    /// Starts a server on existing directories (e.g. to restart on the same data).
    pub fn start_in(data_dir: &Path, run_dir: &Path, user: Option<&str>) -> ClickHouse {
        let options = ServerOptions {
            user: user.map(str::to_owned),
            ..ServerOptions::default()
        };
        ClickHouse::start_in_with(data_dir, run_dir, options)
    }

    /// Starts a server with `options` on existing (or new) directories; the local disks of the
    /// [`JBOD_POLICY`] and [`TIERED_POLICY`], if any, are `<data_dir>-disk-d1/`,
    /// `<data_dir>-disk-d2/` and `<data_dir>-disk-hot/` next to `data_dir`.
    pub fn start_in_with(data_dir: &Path, run_dir: &Path, options: ServerOptions) -> ClickHouse {
        require_engine();
        // Fresh ports were free a moment ago; another process may take one before the server
        // binds it, and then the server exits at once: try again on other ports. Fixed ports
        // are named in other servers' configs and cannot change.
        let attempts = if options.ports.is_some() {
            1
        } else {
            START_ATTEMPTS
        };
        for _ in 1..attempts {
            if let Some(server) = ClickHouse::try_start(data_dir, run_dir, &options, false) {
                return server;
            }
        }
        ClickHouse::try_start(data_dir, run_dir, &options, true).expect("the last attempt panics")
    }

    /// One start. `None` if the server exited before answering (unless `last`, which panics
    /// with the server's log instead).
    fn try_start(
        data_dir: &Path,
        run_dir: &Path,
        options: &ServerOptions,
        last: bool,
    ) -> Option<ClickHouse> {
        let host = options.listen_host.unwrap_or(Ipv4Addr::LOCALHOST);
        let (http_port, tcp_port) = options
            .ports
            .unwrap_or_else(|| (free_port_on(host), free_port_on(host)));
        std::fs::create_dir_all(run_dir).expect("create run dir");
        let log = run_dir.join("server.log");
        let log_file = std::fs::File::create(&log).expect("create server log");
        let mut cmd = Command::new(deploy_script("clickhouse-server"));
        cmd.arg("serve")
            .arg("--data")
            .arg(data_dir)
            .arg("--run-dir")
            .arg(run_dir)
            .args(["--http-port", &http_port.to_string()])
            .args(["--tcp-port", &tcp_port.to_string()])
            .arg("--stop-on-stdin-eof")
            .stdin(Stdio::piped())
            .stdout(log_file.try_clone().expect("dup log"))
            .stderr(log_file);
        if options.listen_host.is_some() {
            cmd.args(["--listen-host", &host.to_string()]);
        }
        let ids = options.user.as_deref().map(crate::os_user_ids);
        if let Some(user) = &options.user {
            cmd.args(["--user", user]);
        }
        let disks = if options.jbod {
            local_disks(data_dir, &["d1", "d2"], ids)
        } else {
            Vec::new()
        };
        let hot_disk = options
            .tiered_s3
            .as_ref()
            .map(|_| local_disks(data_dir, &[HOT_DISK], ids).remove(0));
        let mut extra = options.config_extra.clone().unwrap_or_default();
        let mut storage = StorageXml::default();
        if options.jbod {
            storage = storage.jbod(&disks[0], &disks[1]);
        }
        if let (Some(s3), Some(hot)) = (&options.tiered_s3, &hot_disk) {
            storage = storage.tiered(hot, &data_dir.join("disks").join(COLD_DISK), s3);
        }
        extra.push_str(&storage.to_xml());
        if !options.users.is_empty() {
            let path = run_dir.join("users.xml");
            std::fs::write(&path, users_xml(&options.users))
                .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            extra.push_str(&format!(
                "<users_config>{}</users_config>\n",
                path.display()
            ));
        }
        if !extra.is_empty() {
            let path = run_dir.join("config-extra.xml");
            std::fs::write(&path, extra)
                .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            cmd.arg("--config-extra").arg(path);
        }
        if let Some(tz) = &options.tz {
            cmd.env("TZ", tz);
        }
        let mut child = cmd.spawn().expect("spawn deploy/dev/clickhouse-server");
        let stdin = child.stdin.take();
        let mut server = ClickHouse {
            host,
            http_port,
            tcp_port,
            data_dir: data_dir.to_path_buf(),
            disks,
            hot_disk,
            user: options.user.clone(),
            tz: options.tz.clone(),
            options: options.clone(),
            run_dir: run_dir.to_path_buf(),
            child: Some(child),
            stdin,
            _scratch: None,
        };
        let up = wait_until(START_TIMEOUT, || {
            let exited = server
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            exited || server.ping()
        });
        if !up || !server.ping() {
            let how = match server.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(_))) if !last => return None,
                Some(Ok(Some(status))) => format!("exited ({status}) before answering /ping"),
                _ => format!("did not answer /ping within {START_TIMEOUT:?}"),
            };
            panic!(
                "ClickHouse server on {host}:{http_port} {how} (a chdb upgrade may have broken \
                 deploy/dev/chdb_server.py); log {}:\n{}",
                log.display(),
                log_tail(&log, 30)
            );
        }
        Some(server)
    }

    /// The server's HTTP endpoint, e.g. `http://127.0.0.1:8123`.
    pub fn url(&self) -> String {
        format!("http://{}:{}", self.host, self.http_port)
    }

    /// Whether `/ping` answers `Ok.`.
    pub fn ping(&self) -> bool {
        http(self.host, self.http_port, "GET", "/ping", b"")
            .is_ok_and(|(status, body)| status == 200 && body.trim() == "Ok.")
    }

    /// Runs one statement and returns the body (TabSeparated), or the server's error text.
    pub fn query(&self, sql: &str) -> Result<String, String> {
        match http(self.host, self.http_port, "POST", "/", sql.as_bytes()) {
            Ok((200, body)) => Ok(body),
            Ok((status, body)) => Err(format!("HTTP {status}: {}", body.trim())),
            Err(e) => Err(format!(
                "HTTP request to {}:{}: {e}",
                self.host, self.http_port
            )),
        }
    }

    /// Runs one statement with session settings given as URL parameters (`name=value`, no
    /// escaping needed) and panics on error: settings a statement's own `SETTINGS` cannot carry.
    pub fn q_with(&self, settings: &[&str], sql: &str) -> String {
        let path = format!("/?{}", settings.join("&"));
        match http(self.host, self.http_port, "POST", &path, sql.as_bytes()) {
            Ok((200, body)) => body,
            other => panic!("query failed: {sql} (settings {settings:?})\n{other:?}"),
        }
    }

    /// Like [`ClickHouse::query`] but panics on error; for test set-up and checks.
    pub fn q(&self, sql: &str) -> String {
        self.query(sql)
            .unwrap_or_else(|e| panic!("query failed: {sql}\n{e}"))
    }

    /// The server's log (stdout and stderr of the launcher).
    pub fn log(&self) -> PathBuf {
        self.run_dir.join("server.log")
    }

    /// Stops the server cleanly (EOF on its stdin), killing it if it does not stop within 30 s.
    pub fn stop(&mut self) {
        drop(self.stdin.take());
        if let Some(mut child) = self.child.take() {
            let stopped = wait_until(Duration::from_secs(30), || {
                matches!(child.try_wait(), Ok(Some(_)))
            });
            if !stopped {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// Kills the server with SIGKILL (no shutdown of any kind: what a crash or the OOM killer
    /// does) and waits until it is gone. [`ClickHouse::restart`] then starts it again on the
    /// same data. Only for a server of the test's own: never the [`shared`] one.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        drop(self.stdin.take());
    }

    /// Stops the server and starts a new one on the same data directory, with the same
    /// options: new ports unless [`ServerOptions::ports`] fixed them.
    pub fn restart(mut self) -> ClickHouse {
        self.stop();
        let scratch = self._scratch.take();
        let options = std::mem::take(&mut self.options);
        let mut server = ClickHouse::start_in_with(&self.data_dir, &self.run_dir, options);
        server._scratch = scratch;
        server
    }

    /// Stops the server if it runs and starts it again on the same data with the same options,
    /// in place (for a server inside another value, e.g. a cluster's node, whose fixed ports
    /// keep it the same host for the others).
    pub fn start_again(&mut self) {
        self.stop();
        let scratch = self._scratch.take();
        let mut server =
            ClickHouse::start_in_with(&self.data_dir, &self.run_dir, self.options.clone());
        server._scratch = scratch;
        *self = server;
    }

    /// The server process's CPU time so far (user + system), from /proc.
    pub fn cpu_seconds(&self) -> Option<f64> {
        crate::process_cpu_seconds(self.child.as_ref()?.id(), false)
    }
}

impl Drop for ClickHouse {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One server per test process, started on first use, running as the test's own user. It is
/// never dropped; it stops when the process exits and closes its stdin pipe. Its directories
/// live under the system temp dir in `chpart-testenv-shared-<pid>` and are removed by the next
/// run once their process is gone.
pub fn shared() -> &'static ClickHouse {
    static SHARED: OnceLock<ClickHouse> = OnceLock::new();
    SHARED.get_or_init(|| {
        let tmp = std::env::temp_dir();
        if let Ok(entries) = std::fs::read_dir(&tmp) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some(pid) = name.strip_prefix("chpart-testenv-shared-") {
                    if !Path::new("/proc").join(pid).exists() {
                        let _ = std::fs::remove_dir_all(entry.path());
                    }
                }
            }
        }
        let base = tmp.join(format!("chpart-testenv-shared-{}", std::process::id()));
        std::fs::create_dir_all(&base).expect("create shared server dir");
        crate::set_mode(&base, 0o755);
        ClickHouse::start_in(&base.join("data"), &base.join("run"), None)
    })
}

/// A database of its own for one test, dropped (with its tables) when the test ends.
pub struct TestDb<'a> {
    /// The database name: `t_<test name>_<pid>_<n>`.
    pub name: String,
    /// The server it lives on.
    pub server: &'a ClickHouse,
}

impl<'a> TestDb<'a> {
    /// Creates a fresh database named after the test.
    pub fn new(server: &'a ClickHouse, test_name: &str) -> TestDb<'a> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let clean: String = test_name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(40)
            .collect();
        let name = format!(
            "t_{clean}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        server.q(&format!("CREATE DATABASE `{name}`"));
        TestDb { name, server }
    }
}

impl Drop for TestDb<'_> {
    fn drop(&mut self) {
        let _ = self
            .server
            .query(&format!("DROP DATABASE IF EXISTS `{}` SYNC", self.name));
    }
}

/// Directories for the local disks `names` of a server on `data_dir` (`<data_dir>-disk-<name>`):
/// made if missing, owned by `owner` (uid, gid) when the server runs as another user.
fn local_disks(data_dir: &Path, names: &[&str], owner: Option<(u32, u32)>) -> Vec<PathBuf> {
    let name = data_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    names
        .iter()
        .map(|disk| {
            let dir = data_dir.with_file_name(format!("{name}-disk-{disk}"));
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                    .unwrap_or_else(|e| panic!("chown {}: {e}", dir.display()));
            }
            dir
        })
        .collect()
}

/// One `<storage_configuration>` (the engine reads a single one) built from the disks and
/// policies of each option that asks for some.
#[derive(Default)]
struct StorageXml {
    disks: String,
    policies: String,
}

impl StorageXml {
    /// Local disks `d1`, `d2` in the one volume of [`JBOD_POLICY`].
    fn jbod(mut self, d1: &Path, d2: &Path) -> StorageXml {
        self.disks.push_str(&format!(
            "<d1><path>{}/</path></d1><d2><path>{}/</path></d2>",
            d1.display(),
            d2.display()
        ));
        self.policies.push_str(&format!(
            "<{JBOD_POLICY}><volumes><main><disk>d1</disk><disk>d2</disk></main></volumes>\
             </{JBOD_POLICY}>"
        ));
        self
    }

    /// The local disk [`HOT_DISK`] at `hot` and the `s3` disk [`COLD_DISK`] on `s3` (its
    /// metadata under `metadata`), in [`TIERED_POLICY`] and [`S3ONLY_POLICY`].
    fn tiered(mut self, hot: &Path, metadata: &Path, s3: &S3Disk) -> StorageXml {
        self.disks.push_str(&format!(
            "<{HOT_DISK}><path>{}/</path></{HOT_DISK}>\
             <{COLD_DISK}><type>s3</type><endpoint>{}</endpoint>\
             <access_key_id>{}</access_key_id><secret_access_key>{}</secret_access_key>\
             <metadata_path>{}/</metadata_path></{COLD_DISK}>",
            hot.display(),
            s3.endpoint,
            s3.access_key_id,
            s3.secret_access_key,
            metadata.display()
        ));
        // move_factor 0: the server never moves parts on to the next volume by itself because
        // the hot disk is short of space (by default when under 10% is free, which a shared
        // test machine can be): the tests move them, as a table's rules would.
        self.policies.push_str(&format!(
            "<{TIERED_POLICY}><volumes><hot><disk>{HOT_DISK}</disk></hot>\
             <cold><disk>{COLD_DISK}</disk></cold></volumes><move_factor>0</move_factor>\
             </{TIERED_POLICY}>\
             <{S3ONLY_POLICY}><volumes><main><disk>{COLD_DISK}</disk></main></volumes>\
             </{S3ONLY_POLICY}>"
        ));
        self
    }

    /// The `<storage_configuration>` element, or nothing when no option asked for disks.
    fn to_xml(&self) -> String {
        if self.disks.is_empty() {
            return String::new();
        }
        format!(
            "<storage_configuration><disks>{}</disks><policies>{}</policies>\
             </storage_configuration>\n",
            self.disks, self.policies
        )
    }
}
