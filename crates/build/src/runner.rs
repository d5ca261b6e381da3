//! Running `clickhouse-local` as a child process, the way ripgrep runs external programs.
//!
//! Every part chpart builds comes out of one `clickhouse-local` run, so this module is where a
//! build can hang, deadlock or leak a process. The rules it follows:
//!
//! - stdout and stderr are drained on their own threads while the child runs, so a child that
//!   writes more than a pipe buffer (64 KiB on Linux) to either never blocks on us;
//! - only the last [`STDERR_TAIL_BYTES`] of stderr are kept: enough for ClickHouse's
//!   `Code: N. DB::Exception: ...` message and its context, bounded however chatty the child is;
//! - stdin is `/dev/null`: clickhouse-local reads its input from files (an Arrow stream is
//!   spooled into the work dir first, because the 26.9 engine seeks in it);
//! - the child is killed and reaped on *every* path out of [`LocalCommand::run`] other than its
//!   own exit: the timeout, an I/O error, a panic unwinding through `run` (a drop guard owns the
//!   child). On Linux the child also gets `PR_SET_PDEATHSIG(SIGKILL)`, so even a builder killed
//!   with SIGKILL does not leave clickhouse-local running;
//! - errors say which program failed and how: exit status and the tail of its stderr, or that
//!   the program does not exist and which config key names it.

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How much of the end of stderr is kept for error messages.
pub const STDERR_TAIL_BYTES: usize = 64 * 1024;

/// How many lines of the stderr tail an error's `Display` shows.
pub const STDERR_TAIL_LINES: usize = 20;

/// After the child was killed, how long to wait for its stderr reader to see EOF so the error
/// can include what the child said last.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// Longest sleep between two checks of the child's state. Polling (instead of a blocking
/// `wait` on another thread) keeps the `Child` owned by this thread, so killing it can never
/// hit a recycled pid; 20 ms is nothing next to clickhouse-local's ~0.5 s start-up.
const MAX_POLL: Duration = Duration::from_millis(20);

/// Why a run of the program did not produce its output.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The program does not exist (spawn failed with `ENOENT`).
    #[error(
        "{} was not found (nor, if it is a script, its interpreter): install clickhouse-local, or set `clickhouse_local.command` in the config to the path of a clickhouse-local binary",
        program.display()
    )]
    NotFound {
        /// The program as configured.
        program: PathBuf,
    },
    /// The program exists but could not be started (e.g. not executable).
    #[error("cannot start {}: {source}", program.display())]
    Spawn {
        /// The program as configured.
        program: PathBuf,
        /// The error from spawning it.
        source: io::Error,
    },
    /// The program exited unsuccessfully (non-zero status or killed by a signal).
    #[error("{} failed with {status}{}", program.display(), StderrTail(stderr_tail))]
    Failed {
        /// The program as configured.
        program: PathBuf,
        /// How it exited.
        status: ExitStatus,
        /// The last [`STDERR_TAIL_BYTES`] of its stderr (lossy UTF-8).
        stderr_tail: String,
    },
    /// The program did not finish (or did not close its output) within the timeout; it was
    /// killed.
    #[error("{} did not finish within {timeout:?} and was killed{}", program.display(), StderrTail(stderr_tail))]
    TimedOut {
        /// The program as configured.
        program: PathBuf,
        /// The timeout that passed.
        timeout: Duration,
        /// The last [`STDERR_TAIL_BYTES`] of its stderr so far (lossy UTF-8).
        stderr_tail: String,
    },
    /// An I/O error while supervising the program (checking or killing it, reading its stdout,
    /// starting a thread).
    #[error("{} while running {}: {source}", what, program.display())]
    Io {
        /// The program as configured.
        program: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// `SELECT version(), timezone()` printed something else than a version and a zone.
    #[error("{} printed {output:?} for `SELECT version(), timezone()`, not a version and a time zone", program.display())]
    BadVersion {
        /// The program as configured.
        program: PathBuf,
        /// What it printed (lossy UTF-8, trimmed).
        output: String,
    },
}

/// Formats a stderr tail as its last [`STDERR_TAIL_LINES`] lines, indented, after a colon.
struct StderrTail<'a>(&'a str);

impl fmt::Display for StderrTail<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0.trim_end();
        if text.is_empty() {
            return f.write_str(" (nothing on stderr)");
        }
        let lines: Vec<&str> = text.lines().collect();
        let shown = &lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..];
        if shown.len() < lines.len() {
            write!(f, "; last {} lines of stderr:", shown.len())?;
        } else {
            f.write_str("; stderr:")?;
        }
        for line in shown {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}

/// The statement that prints a run's engine version and time zone, one tab-separated line.
pub const IDENTITY_QUERY: &str = "SELECT version(), timezone() FORMAT TabSeparated";

/// A clickhouse-local command: the program, how long one run may take, and its time zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalCommand {
    /// The program, a path or a name looked up in `PATH` (`clickhouse_local.command`'s first
    /// word); a relative path resolves in this process's working directory.
    pub program: PathBuf,
    /// Arguments every run starts with (`clickhouse_local.command`'s other words, e.g. `local`
    /// of `clickhouse local`).
    pub args: Vec<OsString>,
    /// The longest one run may take, from spawn until its output is collected.
    pub timeout: Duration,
    /// The time zone every run gets as `TZ` (`None`: this process's). ClickHouse takes its
    /// default zone from `TZ`, and that zone is what `DateTime` columns without one (and so
    /// partition keys such as `toYYYYMMDD(ts)`) are computed in.
    pub timezone: Option<String>,
}

/// What a clickhouse-local is, as it says itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalIdentity {
    /// `SELECT version()`, e.g. `26.9.2.1`.
    pub version: String,
    /// `SELECT timezone()`: the zone it computes in, e.g. `Etc/UTC`.
    pub timezone: String,
}

impl LocalCommand {
    /// A command running `program` with `timeout` per run, in this process's time zone.
    pub fn new(program: impl Into<PathBuf>, timeout: Duration) -> LocalCommand {
        LocalCommand {
            program: program.into(),
            args: Vec::new(),
            timeout,
            timezone: None,
        }
    }

    /// The same command with `args` before each run's own.
    pub fn with_args(
        mut self,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> LocalCommand {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// The same command with every run in time zone `tz` (an IANA name such as `Etc/UTC`).
    pub fn in_timezone(mut self, tz: impl Into<String>) -> LocalCommand {
        self.timezone = Some(tz.into());
        self
    }

    /// Runs the program with `args` and returns its stdout if it exits successfully. See the
    /// module docs for the guarantees about the child process.
    pub fn run(&self, args: &[OsString]) -> Result<Vec<u8>, RunError> {
        let deadline = Instant::now() + self.timeout;
        let program = &self.program;
        let io_err = |what| {
            move |source| RunError::Io {
                program: program.clone(),
                what,
                source,
            }
        };

        let mut command = Command::new(program);
        command
            .args(&self.args)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(tz) = &self.timezone {
            command.env("TZ", tz);
        }
        set_parent_death_signal(&mut command);
        let child = command.spawn().map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => RunError::NotFound {
                program: program.clone(),
            },
            _ => RunError::Spawn {
                program: program.clone(),
                source,
            },
        })?;
        // From here on the guard kills and reaps the child on every early return and on unwind.
        let mut guard = ChildGuard(child);
        let child_stdout = guard.0.stdout.take().expect("stdout is piped");
        let child_stderr = guard.0.stderr.take().expect("stderr is piped");

        let stderr = Arc::new(Mutex::new(Tail::default()));
        let stderr_done = spawn_stderr_reader(child_stderr, Arc::clone(&stderr))
            .map_err(io_err("starting the stderr reader"))?;
        let stdout_done =
            spawn_stdout_reader(child_stdout).map_err(io_err("starting the stdout reader"))?;
        let tail =
            |stderr: &Arc<Mutex<Tail>>| stderr.lock().unwrap_or_else(|e| e.into_inner()).text();

        // Phase 1: until the child exits.
        let mut poll = Duration::from_millis(1);
        let status = loop {
            if let Some(status) = guard
                .0
                .try_wait()
                .map_err(io_err("checking on the child"))?
            {
                break status;
            }
            if Instant::now() >= deadline {
                return Err(self.timed_out(&mut guard, &stderr_done, &stderr));
            }
            thread::sleep(poll.min(deadline.saturating_duration_since(Instant::now())));
            poll = (poll * 2).min(MAX_POLL);
        };

        // Phase 2: the child has exited and is reaped. Its pipes close with it unless a process
        // it started still holds them; the deadline bounds that wait too.
        let stderr_complete = wait_for(&stderr_done, deadline);
        if !status.success() {
            return Err(RunError::Failed {
                program: program.clone(),
                status,
                stderr_tail: tail(&stderr),
            });
        }
        let stdout =
            match stdout_done.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(result) => result.map_err(io_err("reading stdout"))?,
                Err(_) => return Err(self.timed_out(&mut guard, &stderr_done, &stderr)),
            };
        if !stderr_complete {
            return Err(self.timed_out(&mut guard, &stderr_done, &stderr));
        }
        let text = tail(&stderr);
        if !text.trim().is_empty() {
            tracing::debug!(program = %program.display(), stderr = %text.trim_end(), "clickhouse-local succeeded with output on stderr");
        }
        Ok(stdout)
    }

    /// The engine version and the time zone a run computes in (one `SELECT version(),
    /// timezone()`), to record in manifests and to check against the server's.
    pub fn identify(&self) -> Result<LocalIdentity, RunError> {
        let out = self.run(&["--query".into(), IDENTITY_QUERY.into()])?;
        self.identity_of(&String::from_utf8_lossy(&out))
    }

    /// The identity in `output`, the first line a run of [`IDENTITY_QUERY`] printed (a build
    /// may run that query first in its own session instead of starting a process for it).
    pub fn identity_of(&self, output: &str) -> Result<LocalIdentity, RunError> {
        let output = output.trim().to_string();
        let bad = || RunError::BadVersion {
            program: self.program.clone(),
            output: output.clone(),
        };
        let (version, timezone) = output.split_once('\t').ok_or_else(bad)?;
        let looks_like_version = !version.is_empty()
            && version.split('.').all(|field| {
                !field.is_empty()
                    && field
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
            && version.as_bytes()[0].is_ascii_digit();
        if !looks_like_version || timezone.is_empty() || timezone.contains(char::is_whitespace) {
            return Err(bad());
        }
        Ok(LocalIdentity {
            version: version.to_owned(),
            timezone: timezone.to_owned(),
        })
    }

    fn timed_out(
        &self,
        guard: &mut ChildGuard,
        stderr_done: &Receiver<()>,
        stderr: &Arc<Mutex<Tail>>,
    ) -> RunError {
        guard.kill_and_reap();
        wait_for(stderr_done, Instant::now() + KILL_GRACE);
        let stderr_tail = stderr.lock().unwrap_or_else(|e| e.into_inner()).text();
        RunError::TimedOut {
            program: self.program.clone(),
            timeout: self.timeout,
            stderr_tail,
        }
    }
}

/// Owns the child: kills and reaps it when dropped. Killing an already reaped child is a no-op
/// in `std` (it remembers the exit status), so this never signals a recycled pid.
struct ChildGuard(Child);

impl ChildGuard {
    fn kill_and_reap(&mut self) {
        if let Err(e) = self.0.kill() {
            tracing::warn!(pid = self.0.id(), error = %e, "cannot kill clickhouse-local");
        }
        if let Err(e) = self.0.wait() {
            tracing::warn!(pid = self.0.id(), error = %e, "cannot reap clickhouse-local");
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // Already exited and reaped on the success path; then this does nothing.
        if let Ok(None) = self.0.try_wait() {
            self.kill_and_reap();
        }
    }
}

/// The last [`STDERR_TAIL_BYTES`] bytes of a stream.
#[derive(Default)]
struct Tail {
    bytes: Vec<u8>,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > STDERR_TAIL_BYTES {
            let excess = self.bytes.len() - STDERR_TAIL_BYTES;
            self.bytes.drain(..excess);
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Reads stderr into `tail` until EOF; signals on the returned channel when done.
fn spawn_stderr_reader(
    mut pipe: impl Read + Send + 'static,
    tail: Arc<Mutex<Tail>>,
) -> io::Result<Receiver<()>> {
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("clickhouse-local-stderr".into())
        .spawn(move || {
            let mut buf = [0u8; 8192];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => tail
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tail.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!("\n(reading stderr failed: {e})").as_bytes());
                        break;
                    }
                }
            }
            let _ = tx.send(());
        })?;
    Ok(rx)
}

/// Reads all of stdout; sends the result on the returned channel.
fn spawn_stdout_reader(
    mut pipe: impl Read + Send + 'static,
) -> io::Result<Receiver<io::Result<Vec<u8>>>> {
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("clickhouse-local-stdout".into())
        .spawn(move || {
            let mut out = Vec::new();
            let result = pipe.read_to_end(&mut out).map(|_| out);
            let _ = tx.send(result);
        })?;
    Ok(rx)
}

/// Waits until `done` signals (or its sender is gone) or `deadline` passes; true if it signalled.
fn wait_for(done: &Receiver<()>, deadline: Instant) -> bool {
    match done.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
        Err(RecvTimeoutError::Timeout) => false,
    }
}

/// Linux: the child gets SIGKILL when the thread that spawned it dies. `run` blocks its thread
/// until the child is reaped, so this only fires when the whole builder process dies.
#[cfg(target_os = "linux")]
fn set_parent_death_signal(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe calls
    // (prctl, getppid) and builds errors without allocating.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl; then no signal would come.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_command: &mut Command) {}

#[cfg(test)]
mod tests;
