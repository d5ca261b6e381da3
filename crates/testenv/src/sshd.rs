//! A private OpenSSH sshd per test, started through `deploy/dev/sshd.sh` so tests
//! exercise the same setup a developer gets by hand.
//!
//! Each [`Sshd`] owns a temporary directory (host key, client key,
//! known_hosts, config, log) and the sshd process itself: the script runs
//! with `--foreground` and execs sshd, so the child handle *is* the daemon.
//! Dropping the struct closes sshd's watchdog pipe (`--stop-on-stdin-eof`),
//! which stops it, and kills it if it lingers: teardown happens when a test
//! panics, and the pipe also closes when the whole test process dies. A
//! missing sshd is a panic that names the install command, never a skipped test.
//!
//! [`Sshd::restrict_to_sftp`] installs the deploy guide's SFTP-only
//! `authorized_keys` line and [`Sshd::ssh`] runs the OpenSSH client against the
//! daemon (what a stolen key could try); [`SshAgent`] is a real `ssh-agent` of
//! the test's own. A missing client tool is a panic naming its package too.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{deploy_script, free_port_on, log_tail, scratch_dir, wait_until, INSTALL_HINT};

/// Where Debian's openssh-server puts the daemon; `deploy/dev/sshd.sh` uses the same path.
pub const SSHD_BIN: &str = "/usr/sbin/sshd";

/// How long sshd may take from spawn to accepting connections.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// Attempts with a fresh port when another process grabbed the one we picked.
const PORT_ATTEMPTS: usize = 3;

/// How long sshd gets to exit after its watchdog pipe closes before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long [`Sshd::ssh`] and the `ssh-add` of [`SshAgent::add`] may run.
pub const SSH_TIMEOUT: Duration = Duration::from_secs(30);

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
    allow_users: Vec<String>,
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

    /// The daemon dies at once with every session it runs (SIGKILL to the listener and to all
    /// its descendants: the SFTP sessions mid-transfer, and the watchdog), as when the host's
    /// sshd crashes or is restarted with its sessions; after `down` it starts again on the same
    /// address and port with the same host key, so clients that verify the key reconnect.
    /// Panics when the port cannot be bound again.
    pub fn restart(&mut self, down: Duration) {
        kill_tree(self.child.id());
        let _ = self.child.wait();
        // The watchdog is dead too, so closing its pipe can no longer signal a reused pid.
        drop(self.stdin.take());
        let _ = fs::remove_file(self.dir.join("sshd.pid"));
        std::thread::sleep(down);
        let users: Vec<&str> = self.allow_users.iter().map(String::as_str).collect();
        match spawn_daemon(&self.dir, self.host, self.port, &users) {
            Ok((child, stdin)) => {
                self.child = child;
                self.stdin = stdin;
            }
            Err(StartError::PortTaken(log)) | Err(StartError::Failed(log)) => panic!(
                "sshd could not start again on {}:{}: {log}",
                self.host, self.port
            ),
        }
    }

    /// CPU seconds (user + system) of the daemon and of every session it has reaped: what
    /// the host spent serving SFTP (the in-process SFTP server runs inside each session's
    /// process). A session counts only once it has ended: call
    /// [`Sshd::wait_sessions_ended`] first. None if `/proc` cannot be read.
    pub fn cpu_seconds(&self) -> Option<f64> {
        crate::process_cpu_seconds(self.child.id(), true)
    }

    /// Waits until the daemon has no session process left (every client has disconnected and
    /// its session was reaped), up to `timeout`; false if one remains. (The stdin watchdog,
    /// a shell forked before the daemon's exec, stays a child of the daemon: it is not a
    /// session.)
    pub fn wait_sessions_ended(&self, timeout: Duration) -> bool {
        let pid = self.child.id();
        let children = format!("/proc/{pid}/task/{pid}/children");
        let session = |child: &str| {
            fs::read_to_string(format!("/proc/{child}/comm"))
                .is_ok_and(|comm| comm.starts_with("sshd"))
        };
        // An unreadable list ends the wait at once: there is nothing to wait for.
        let mut unreadable = false;
        let ended = wait_until(timeout, || match fs::read_to_string(&children) {
            Ok(list) => !list.split_whitespace().any(session),
            Err(_) => {
                unreadable = true;
                true
            }
        });
        ended && !unreadable
    }

    /// The last lines of the daemon's log (sshd runs with `LogLevel
    /// VERBOSE`), for assertion messages.
    pub fn log(&self) -> String {
        log_tail(&self.dir.join("sshd.log"), 40)
    }

    /// Rewrites `authorized_keys` so that the client key may only use SFTP: the
    /// least-privilege line the README's deploy guide gives,
    /// `restrict,command="internal-sftp" <key>`. OpenSSH runs a forced command of
    /// `internal-sftp` as its in-process SFTP server when the client asks for the
    /// `sftp` subsystem, and refuses a shell or any other command ("This service
    /// allows sftp connections only."); `restrict` also turns off port, agent and X11
    /// forwarding and ptys. sshd reads the file at every login, so this applies to
    /// the next connection. Returns the line written.
    pub fn restrict_to_sftp(&self) -> String {
        let public = fs::read_to_string(self.client_key.with_extension("pub"))
            .unwrap_or_else(|e| panic!("read {}.pub: {e}", self.client_key.display()));
        let line = format!("restrict,command=\"internal-sftp\" {}\n", public.trim());
        let path = self.dir.join("authorized_keys");
        fs::write(&path, &line).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        line
    }

    /// Runs `remote_command` as `user` with the OpenSSH client (`ssh`), the client
    /// key and this server's known_hosts, no agent, no password prompt, stdin
    /// closed; kills it after [`SSH_TIMEOUT`]. What a shell login would look like.
    pub fn ssh(&self, user: &str, remote_command: &str) -> std::process::Output {
        require_tool("ssh");
        let mut cmd = Command::new("ssh");
        cmd.arg("-i")
            .arg(&self.client_key)
            .args(["-p", &self.port.to_string()])
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", self.known_hosts.display()))
            .args([
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "IdentityAgent=none",
                "-o",
                "ConnectTimeout=10",
            ])
            .arg(format!("{user}@{}", self.host))
            .arg(remote_command)
            .env_remove("SSH_AUTH_SOCK");
        output_within(&mut cmd, SSH_TIMEOUT)
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

/// Panics naming the package and [`INSTALL_HINT`] unless the OpenSSH client tool
/// `name` (`ssh`, `ssh-agent`, `ssh-add`, `ssh-keygen`) runs.
fn require_tool(name: &str) {
    let runs = Command::new(name)
        .arg("-?")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !runs {
        panic!("{name} not found (package openssh-client): {INSTALL_HINT}");
    }
}

/// Runs `cmd` with stdin closed and its output captured; kills it and panics if it
/// runs longer than `timeout`.
fn output_within(cmd: &mut Command, timeout: Duration) -> std::process::Output {
    let described = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {described}: {e} ({INSTALL_HINT})"));
    // Read both pipes on threads of their own, so a chatty child cannot block on a full pipe.
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut buf);
        buf
    });
    let exited = wait_until(timeout, || matches!(child.try_wait(), Ok(Some(_))));
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{described} did not finish within {timeout:?}");
    }
    let status = child.wait().expect("reap the child");
    std::process::Output {
        status,
        stdout: out_reader.join().expect("stdout reader"),
        stderr: err_reader.join().expect("stderr reader"),
    }
}

/// A running OpenSSH `ssh-agent` of this test alone, listening on a socket in a
/// directory of its own, stopped on drop. Give [`SshAgent::socket`] to a client as
/// `SSH_AUTH_SOCK` (to a child process: setting the variable in a multi-threaded
/// test process would race with other tests).
pub struct SshAgent {
    /// The agent's socket (what `SSH_AUTH_SOCK` names).
    pub socket: PathBuf,
    child: Child,
    _tempdir: tempfile::TempDir,
}

impl SshAgent {
    /// Starts `ssh-agent -D -a <socket>` (in the foreground, so this handle owns the
    /// agent process itself) and waits for its socket. Panics, naming the package,
    /// when ssh-agent is not installed.
    pub fn start() -> SshAgent {
        require_tool("ssh-agent");
        let tempdir = scratch_dir("agent");
        let socket = tempdir.path().join("agent.sock");
        let mut child = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn ssh-agent: {e} ({INSTALL_HINT})"));
        let up = wait_until(START_TIMEOUT, || {
            socket.exists() || matches!(child.try_wait(), Ok(Some(_)))
        });
        if !up || !socket.exists() {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "ssh-agent did not create its socket {} within {START_TIMEOUT:?}",
                socket.display()
            );
        }
        SshAgent {
            socket,
            child,
            _tempdir: tempdir,
        }
    }

    /// `ssh-add <key>` into this agent; panics with ssh-add's output when it fails.
    pub fn add(&self, key: &Path) {
        require_tool("ssh-add");
        let out = output_within(
            Command::new("ssh-add")
                .arg(key)
                .env("SSH_AUTH_SOCK", &self.socket),
            SSH_TIMEOUT,
        );
        assert!(
            out.status.success(),
            "ssh-add {} failed ({}): {}{}",
            key.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The public keys the agent holds (`ssh-add -L`), one per line; empty when none.
    pub fn keys(&self) -> Vec<String> {
        require_tool("ssh-add");
        let out = output_within(
            Command::new("ssh-add")
                .arg("-L")
                .env("SSH_AUTH_SOCK", &self.socket),
            SSH_TIMEOUT,
        );
        // Exit status 1 with "The agent has no identities." is an empty agent.
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("ssh-"))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for SshAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
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
    let (child, stdin) = spawn_daemon(&dir, host, port, allow_users)?;
    Ok(Sshd {
        host,
        port,
        client_key: dir.join("client_key"),
        known_hosts: dir.join("known_hosts"),
        dir,
        allow_users: allow_users.iter().map(|u| u.to_string()).collect(),
        child,
        stdin,
        _tempdir: tempdir,
    })
}

/// Starts sshd from `dir` (keys made there on the first start, kept after) on `host:port` and
/// waits until it accepts connections.
fn spawn_daemon(
    dir: &Path,
    host: Ipv4Addr,
    port: u16,
    allow_users: &[&str],
) -> Result<(Child, Option<ChildStdin>), StartError> {
    let log_path = dir.join("sshd.log");
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| StartError::Failed(format!("open {}: {e}", log_path.display())))?;
    let log_err = log
        .try_clone()
        .map_err(|e| StartError::Failed(format!("clone {}: {e}", log_path.display())))?;

    let mut cmd = Command::new("bash");
    cmd.arg(deploy_script("sshd.sh"))
        .args(["start", "--foreground", "--stop-on-stdin-eof", "--dir"])
        .arg(dir)
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
            return Ok((child, stdin));
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
}

/// SIGKILLs `root` and every process descended from it. The tree is walked from /proc's
/// parent links, stopping each process before its children are listed, so none forks a child
/// the walk misses or is re-parented out of reach before the kills.
fn kill_tree(root: u32) {
    let signal = |pid: u32, sig| unsafe { libc::kill(pid as libc::pid_t, sig) };
    let mut pending = vec![root];
    let mut tree = Vec::new();
    while let Some(pid) = pending.pop() {
        signal(pid, libc::SIGSTOP);
        tree.push(pid);
        pending.extend(children_of(pid));
    }
    for pid in tree {
        signal(pid, libc::SIGKILL);
    }
}

/// The pids whose parent is `pid`, from /proc/<pid>/stat (field 4).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|candidate| {
            fs::read_to_string(format!("/proc/{candidate}/stat"))
                .ok()
                .and_then(|stat| {
                    // The command name (field 2) is in parentheses and may hold spaces.
                    let after = &stat[stat.rfind(')')? + 2..];
                    after.split(' ').nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
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
