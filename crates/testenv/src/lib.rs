//! Test support for chpart: starts the real components from `deploy/` for tests.
//!
//! Every real-component test gets its own ports and directories, so tests run in parallel:
//! - [`clickhouse::ClickHouse`]: the ClickHouse 26.9 engine (chdb-core) as an HTTP server on
//!   a loopback address, optionally as a dedicated OS user, with extra config, a JBOD storage
//!   policy or a tiered one with an `s3` disk ([`clickhouse::ServerOptions`]);
//!   [`clickhouse::shared`] is one server per test process and [`clickhouse::TestDb`] a fresh
//!   database per test on it.
//! - [`sshd::Sshd`]: OpenSSH sshd on 127.0.0.1 (or another loopback address) with keys and
//!   `known_hosts` made per run; [`sshd::SshAgent`]: an `ssh-agent` of the test's own.
//! - [`moto::Moto`]: moto's S3 server on 127.0.0.1, a bucket per test, for `s3` disks.
//! - [`loss::PacketLoss`]: real packet loss on loopback ports (iptables `statistic` drops).
//! - [`cluster::Cluster`]: several servers forming one ClickHouse cluster (one shard each,
//!   each on its own loopback address, optionally with an sshd per "host").
//! - [`smallfs::SmallFs`]: a size-limited tmpfs mounted over a directory (a server's data
//!   directory), to fill a disk for real.
//!
//! Servers are child processes that end when their handle is dropped and, because they block
//! on their stdin pipe, also when the test process dies however it dies. A missing component
//! is a panic that names the command installing it: tests never skip silently.

#![warn(missing_docs)]

pub mod clickhouse;
pub mod cluster;
mod http;
pub mod loss;
pub mod moto;
pub mod proxy;
pub mod smallfs;
pub mod sshd;

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The command that installs every component the tests need.
pub const INSTALL_HINT: &str = "run `bash deploy/install.sh` from the repository root";

/// The repository root (where `deploy/` lives).
pub fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// A script of `deploy/dev/` (the test engine's stand-ins and the test sshd), checked to exist.
pub fn deploy_script(name: &str) -> PathBuf {
    let path = project_root().join("deploy").join("dev").join(name);
    assert!(path.exists(), "{} is missing", path.display());
    path
}

/// The clickhouse-local command the tests build parts with (`deploy/dev/clickhouse-local`, backed
/// by chdb-core 26.9). Panics with the install command when the engine is not installed.
pub fn clickhouse_local() -> PathBuf {
    require_engine();
    deploy_script("clickhouse-local")
}

/// Writes the rows of `select` into `dir/name` in `format` (`Parquet`, `ArrowStream`, ...)
/// with the [`clickhouse_local`] command; returns the path.
pub fn write_rows(dir: &Path, name: &str, select: &str, format: &str) -> PathBuf {
    let path = dir.join(name);
    let out = std::process::Command::new(clickhouse_local())
        .args([
            "--query",
            &format!("{select} INTO OUTFILE '{}' FORMAT {format}", path.display()),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "clickhouse-local: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// Runs `query` with the [`clickhouse_local`] command in `work` over `input` on its stdin, read
/// as table `input` of columns `structure` in `input_format`; returns stdout. Panics with the
/// query and clickhouse-local's stderr when it fails.
pub fn clickhouse_local_over(
    work: &Path,
    structure: &str,
    input_format: &str,
    input: &[u8],
    query: &str,
) -> String {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(clickhouse_local())
        .arg("--path")
        .arg(work)
        .args(["--structure", structure, "--input-format", input_format])
        .args(["--table", "input", "--query", query])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn clickhouse-local");
    let mut stdin = child.stdin.take().expect("piped stdin");
    // Written on its own thread: a large input would fill the pipe while the child's output
    // fills the other one.
    let out = std::thread::scope(|scope| {
        let feeder = scope.spawn(move || stdin.write_all(input));
        let out = child.wait_with_output().expect("wait for clickhouse-local");
        feeder
            .join()
            .expect("stdin writer")
            .expect("write clickhouse-local's stdin");
        out
    });
    assert!(
        out.status.success(),
        "clickhouse-local failed ({}) on {query}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("clickhouse-local printed UTF-8")
}

/// Panics with [`INSTALL_HINT`] unless the project's Python environment with chdb exists.
pub fn require_engine() {
    let python = project_root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "the ClickHouse 26.9 engine (chdb-core in .venv/) is not installed: {INSTALL_HINT}"
    );
}

/// A loopback TCP port that was free a moment ago and that this process has not handed out
/// before (the OS may reuse a just-closed ephemeral port; two servers of one test run must not).
pub fn free_port() -> u16 {
    free_port_on(Ipv4Addr::LOCALHOST)
}

/// Like [`free_port`], but free on `addr` (any 127.x.y.z). Ports are never handed out twice in
/// one process, whatever the address: a ClickHouse server counts a replica as itself when the
/// replica's address is local *and* its port is the server's own, so the nodes of one test
/// cluster need distinct ports even on distinct addresses.
pub fn free_port_on(addr: Ipv4Addr) -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    loop {
        let port = TcpListener::bind((addr, 0))
            .and_then(|l| l.local_addr())
            .unwrap_or_else(|e| panic!("bind an ephemeral port on {addr}: {e}"))
            .port();
        if given.insert(port) {
            return port;
        }
    }
}

/// A loopback port that refuses connections for as long as this value lives: the socket is
/// bound (so neither the OS nor another test can hand the port out) but never listens, so a
/// connect gets `ECONNREFUSED`. A port that was merely free a moment ago is not enough: a
/// parallel test may bind it in between.
pub struct ClosedPort {
    fd: libc::c_int,
    /// The port, on 127.0.0.1.
    pub port: u16,
}

impl ClosedPort {
    /// Binds a fresh ephemeral port on 127.0.0.1 without listening on it.
    pub fn new() -> ClosedPort {
        // SAFETY: plain socket calls on a descriptor this value owns; the sockaddr structs are
        // fully initialised and passed with their exact sizes.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            addr.sin_port = 0;
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let rc = libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len);
            assert!(
                rc == 0,
                "bind 127.0.0.1:0: {}",
                std::io::Error::last_os_error()
            );
            let mut bound: libc::sockaddr_in = std::mem::zeroed();
            let mut blen = len;
            let rc = libc::getsockname(fd, &mut bound as *mut _ as *mut libc::sockaddr, &mut blen);
            assert!(rc == 0, "getsockname: {}", std::io::Error::last_os_error());
            ClosedPort {
                fd,
                port: u16::from_be(bound.sin_port),
            }
        }
    }
}

impl Default for ClosedPort {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ClosedPort {
    fn drop(&mut self) {
        // SAFETY: the descriptor is owned by this value and closed exactly once.
        unsafe {
            libc::close(self.fd);
        }
    }
}

/// A scratch directory that other users can traverse (servers may run as `clickhouse`).
pub fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("chpart-{prefix}-"))
        .tempdir()
        .expect("create a temporary directory");
    set_mode(dir.path(), 0o755);
    dir
}

/// chmod, panicking with the path on failure.
pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

/// Polls `ready` every 50 ms until it returns true or `timeout` passes; returns whether it did.
pub fn wait_until(timeout: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// CPU seconds (user + system) of process `pid` so far, from `/proc/<pid>/stat`; with
/// `reaped_children`, also those of the children it has waited for. None if unreadable.
pub(crate) fn process_cpu_seconds(pid: u32, reaped_children: bool) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime, stime, cutime, cstime: fields 14-17 of proc(5), 11-14 after the name.
    let last = if reaped_children { 14 } else { 12 };
    let mut ticks = 0.0;
    for i in 11..=last {
        ticks += fields.get(i)?.parse::<f64>().ok()?;
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz)
}

/// The last `n` lines of a log file, for panic messages.
pub fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Uid and gid of an OS user, via `id`; panics with [`INSTALL_HINT`] when the user is missing.
pub fn os_user_ids(name: &str) -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = std::process::Command::new("id")
            .args([flag, name])
            .output()
            .expect("run id");
        assert!(
            out.status.success(),
            "OS user {name:?} does not exist: {INSTALL_HINT}"
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("numeric id")
    };
    (id("-u"), id("-g"))
}
