//! A private OpenSSH sshd per test, started through `deploy/sshd.sh` so tests
//! exercise the same setup a developer gets by hand.
//!
//! Each [`Sshd`] owns a temporary directory (host key, client key,
//! known_hosts, config, log) and the sshd process itself: the script runs
//! with `--foreground` and execs sshd, so the child handle *is* the daemon.
//! Dropping the struct closes sshd's watchdog pipe (`--stop-on-stdin-eof`),
//! which stops it, and kills it if it lingers: teardown happens when a test
//! panics, and the pipe also closes when the whole test process dies. A
//! missing sshd is a panic that names the install command, never a skipped test.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{deploy_script, free_port_on, log_tail, scratch_dir, wait_until, INSTALL_HINT};

/// Where Debian's openssh-server puts the daemon; `deploy/sshd.sh` uses the same path.
pub const SSHD_BIN: &str = "/usr/sbin/sshd";

/// How long sshd may take from spawn to accepting connections.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// Attempts with a fresh port when another process grabbed the one we picked.
const PORT_ATTEMPTS: usize = 3;

/// How long sshd gets to exit after its watchdog pipe closes before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A running sshd on `host:port` (127.0.0.1 unless started with
/// [`Sshd::start_on`]) that accepts `client_key` for root and the users it was
/// started with, and whose host key is in `known_hosts`.
pub struct Sshd {
    /// The loopback address it listens on.
    pub host: Ipv4Addr,
    /// Port on [`Sshd::host`].
    pub port: u16,
    /// Holds the keys, config and `sshd.log` (traversable by other users,
    /// who read `authorized_keys`); deleted when the struct drops.
    pub dir: PathBuf,
    /// Private key (no passphrase) accepted for root and every allowed user.
    pub client_key: PathBuf,
    /// OpenSSH known_hosts with this server's key as `[host]:port`.
    pub known_hosts: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
    _tempdir: tempfile::TempDir,
}

enum StartError {
    PortTaken(String),
    Failed(String),
}

impl Sshd {
    /// Starts sshd allowing root plus `allow_users` to log in with the per-run
    /// client key. Panics (naming the install command) if sshd is not installed
    /// or does not come up.
    pub fn start(allow_users: &[&str]) -> Sshd {
        Sshd::start_on(Ipv4Addr::LOCALHOST, allow_users)
    }

    /// Like [`Sshd::start`], listening on the loopback address `host` (any
    /// 127.x.y.z), e.g. the address of one node of a test cluster.
    pub fn start_on(host: Ipv4Addr, allow_users: &[&str]) -> Sshd {
        require_installed();
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            match try_start(host, allow_users) {
                Ok(sshd) => return sshd,
                Err(StartError::PortTaken(log)) => last = log,
                Err(StartError::Failed(msg)) => panic!("{msg}"),
            }
        }
        panic!("sshd could not bind a free port in {PORT_ATTEMPTS} attempts; last log:\n{last}");
    }

    /// The last lines of the daemon's log (sshd runs with `LogLevel
    /// VERBOSE`), for assertion messages.
    pub fn log(&self) -> String {
        log_tail(&self.dir.join("sshd.log"), 40)
    }

    /// Writes a known_hosts file that lists a freshly generated ed25519 key,
    /// not this server's, under this server's `[host]:port`, and returns
    /// its path: a client honouring it must refuse the connection.
    pub fn wrong_known_hosts(&self) -> PathBuf {
        let key = self.dir.join("wrong_host_key");
        let _ = fs::remove_file(&key);
        let _ = fs::remove_file(key.with_extension("pub"));
        run_checked(
            Command::new("ssh-keygen")
                .args([
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    "chpart-wrong-host",
                    "-f",
                ])
                .arg(&key),
        );
        let public = fs::read_to_string(key.with_extension("pub"))
            .unwrap_or_else(|e| panic!("read {}.pub: {e}", key.display()));
        let key_type_and_blob: Vec<&str> = public.split_whitespace().take(2).collect();
        let path = self.dir.join("known_hosts.wrong");
        fs::write(
            &path,
            format!(
                "[{}]:{} {}\n",
                self.host,
                self.port,
                key_type_and_blob.join(" ")
            ),
        )
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // Closing the pipe makes the watchdog stop sshd while sshd is still
        // our unreaped child, so its pid cannot have been reused by then.
        drop(self.stdin.take());
        let exited = wait_until(STOP_TIMEOUT, || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        if !exited {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn require_installed() {
    if !Path::new(SSHD_BIN).exists() {
        panic!("sshd not found at {SSHD_BIN} (package openssh-server): {INSTALL_HINT}");
    }
    if Command::new("ssh-keygen")
        .arg("-?")
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        panic!("ssh-keygen not found (package openssh-client): {INSTALL_HINT}");
    }
}

fn try_start(host: Ipv4Addr, allow_users: &[&str]) -> Result<Sshd, StartError> {
    let tempdir = scratch_dir("sshd");
    let dir = tempdir.path().to_path_buf();
    let port = free_port_on(host);
    let log_path = dir.join("sshd.log");
    let log = fs::File::create(&log_path)
        .map_err(|e| StartError::Failed(format!("create {}: {e}", log_path.display())))?;
    let log_err = log
        .try_clone()
        .map_err(|e| StartError::Failed(format!("clone {}: {e}", log_path.display())))?;

    let mut cmd = Command::new("bash");
    cmd.arg(deploy_script("sshd.sh"))
        .args(["start", "--foreground", "--stop-on-stdin-eof", "--dir"])
        .arg(&dir)
        .args(["--port", &port.to_string()])
        .args(["--listen", &host.to_string()]);
    for user in allow_users {
        cmd.args(["--allow-user", user]);
    }
    let described = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(|e| StartError::Failed(format!("spawn {described}: {e}")))?;
    let stdin = child.stdin.take();

    let read_log = || log_tail(&log_path, 40);
    let pidfile = dir.join("sshd.pid");
    let addr = SocketAddr::from((host, port));
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let log = read_log();
            // Our watchdog pipe is still open, so an exit means sshd failed.
            if log.contains("Address already in use") {
                return Err(StartError::PortTaken(log));
            }
            return Err(StartError::Failed(format!(
                "{described} exited with {status} before sshd listened; log:\n{log}"
            )));
        }
        // sshd writes its pid only after listening, and the pid being our
        // child's proves that the port we then reach is ours, not a squatter's.
        let ours = fs::read_to_string(&pidfile)
            .map(|pid| pid.trim() == child.id().to_string())
            .unwrap_or(false);
        if ours && TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(StartError::Failed(format!(
                "sshd from {described} did not accept connections on {addr} within {START_TIMEOUT:?}; log:\n{}",
                read_log()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    Ok(Sshd {
        host,
        port,
        client_key: dir.join("client_key"),
        known_hosts: dir.join("known_hosts"),
        dir,
        child,
        stdin,
        _tempdir: tempdir,
    })
}

/// Makes sure the unprivileged system user `name` exists and can log in with
/// a key, as `deploy/install.sh` sets it up: created with no home and no
/// shell, and with the password field `*` rather than useradd's `!`, because
/// sshd with `UsePAM no` refuses every login, keys included, to an account
/// whose password field starts with `!` ("account is locked").
pub fn ensure_system_user(name: &str) {
    // Tests run in parallel threads; two useradds of one name would race.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let exists = Command::new("id")
        .arg(name)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !exists {
        run_checked(Command::new("useradd").args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ]));
    }
    let shadow = run_checked(Command::new("getent").args(["shadow", name]));
    let password_field = shadow.split(':').nth(1).unwrap_or("");
    if password_field.starts_with('!') {
        run_checked(Command::new("usermod").args(["-p", "*", name]));
    }
}

fn run_checked(cmd: &mut Command) -> String {
    let described = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {described}: {e} ({INSTALL_HINT})"));
    if !out.status.success() {
        panic!(
            "{described} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}
