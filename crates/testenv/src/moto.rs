//! A local S3 endpoint for tests: moto's server (`moto[server]` in `.venv`, installed by
//! `deploy/install.sh`) on 127.0.0.1, which the ClickHouse 26.9 engine accepts as an `s3` disk.
//!
//! The server binds a port of the OS's choosing and prints it, so no port can be taken between
//! picking and binding it. It then blocks reading its stdin pipe, which this harness holds:
//! dropping the handle closes the pipe and the server exits; a test process that dies closes it
//! too. A bucket per test is made by a plain `PUT /<bucket>` (moto checks no signatures), and
//! [`Moto::bucket`] hands out the [`S3Disk`] that [`ServerOptions::tiered_s3`] puts in a
//! server's config.
//!
//! [`ServerOptions::tiered_s3`]: crate::clickhouse::ServerOptions::tiered_s3

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use crate::http::http;
use crate::{log_tail, project_root, scratch_dir, wait_until, INSTALL_HINT};

/// How long moto may take to print its port and answer (about 1 s here; CI is slow).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long moto gets to exit after its stdin pipe closes before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Run by the venv's Python: moto's threaded server on an OS-chosen port, printed on stdout,
/// stopped when stdin reaches EOF (the harness dropped its handle or died).
const LAUNCHER: &str = "\
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
";

/// Where an `s3` disk keeps its objects and the credentials to reach them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Disk {
    /// The disk's root, ending in `/`: `http://127.0.0.1:<port>/<bucket>/<prefix>/`.
    pub endpoint: String,
    /// `access_key_id` (moto takes any).
    pub access_key_id: String,
    /// `secret_access_key` (moto takes any).
    pub secret_access_key: String,
}

/// A running moto server on 127.0.0.1, stopped on drop.
pub struct Moto {
    /// Its port on 127.0.0.1.
    pub port: u16,
    log: PathBuf,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    _scratch: tempfile::TempDir,
}

impl Moto {
    /// Starts moto from `.venv`. Panics with [`INSTALL_HINT`] when moto is not installed, and
    /// with moto's log when it does not come up.
    pub fn start() -> Moto {
        let python = project_root().join(".venv/bin/python");
        let installed = python.exists()
            && Command::new(&python)
                .args(["-c", "import moto.server, flask, flask_cors"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        assert!(
            installed,
            "moto[server] (a local S3 endpoint) is not installed in .venv/: {INSTALL_HINT}"
        );
        let scratch = scratch_dir("moto");
        let log = scratch.path().join("moto.log");
        let log_file = std::fs::File::create(&log).expect("create moto log");
        let mut child = Command::new(&python)
            .args(["-c", LAUNCHER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .expect("spawn moto");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let mut moto = Moto {
            port: 0,
            log,
            child: Some(child),
            stdin,
            _scratch: scratch,
        };
        // The port line, read on a thread of its own so a server that hangs before printing
        // it fails the test after START_TIMEOUT instead of blocking it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(START_TIMEOUT).unwrap_or_default();
        match line.trim().parse() {
            Ok(port) => moto.port = port,
            Err(_) => moto.fail(&format!(
                "printed no port within {START_TIMEOUT:?} ({line:?})"
            )),
        }
        if !wait_until(START_TIMEOUT, || moto.get("/").is_ok_and(|(s, _)| s == 200)) {
            moto.fail(&format!("did not answer GET / within {START_TIMEOUT:?}"));
        }
        moto
    }

    /// Creates bucket `name` (lowercase letters, digits and `-`; other characters become `-`)
    /// and returns an [`S3Disk`] rooted at `<bucket>/data/` in it.
    pub fn bucket(&self, name: &str) -> S3Disk {
        let bucket: String = name
            .chars()
            .map(|c| {
                let c = c.to_ascii_lowercase();
                if c.is_ascii_alphanumeric() {
                    c
                } else {
                    '-'
                }
            })
            .take(63)
            .collect();
        let path = format!("/{bucket}");
        match http(Ipv4Addr::LOCALHOST, self.port, "PUT", &path, b"") {
            Ok((200, _)) => {}
            other => panic!(
                "create bucket {bucket} on moto at {}: {other:?}",
                self.url()
            ),
        }
        S3Disk {
            endpoint: format!("{}/{bucket}/data/", self.url()),
            access_key_id: "test".to_owned(),
            secret_access_key: "test".to_owned(),
        }
    }

    /// The keys of every object in `bucket` (the first 1000), from a ListObjects call.
    pub fn keys(&self, bucket: &str) -> Vec<String> {
        let (status, body) = self
            .get(&format!("/{bucket}"))
            .unwrap_or_else(|e| panic!("list bucket {bucket}: {e}"));
        assert_eq!(status, 200, "list bucket {bucket}: {body}");
        body.split("<Key>")
            .skip(1)
            .filter_map(|s| s.split_once("</Key>").map(|(k, _)| k.to_owned()))
            .collect()
    }

    /// The endpoint, e.g. `http://127.0.0.1:5000`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        http(Ipv4Addr::LOCALHOST, self.port, "GET", path, b"")
    }

    fn fail(&mut self, how: &str) -> ! {
        self.stop();
        panic!(
            "moto {how}; log {}:\n{}",
            self.log.display(),
            log_tail(&self.log, 30)
        );
    }

    /// Stops moto (EOF on its stdin), killing it if it is still running after a few seconds.
    fn stop(&mut self) {
        drop(self.stdin.take());
        if let Some(mut child) = self.child.take() {
            let stopped = wait_until(STOP_TIMEOUT, || matches!(child.try_wait(), Ok(Some(_))));
            if !stopped {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.stop();
    }
}
