//! Running a command and measuring it: wall time, the process's own peak RSS, and what
//! `wait4` reports for it and its descendants.
//!
//! The figure the targets are about is chpart's *own* memory, and that is exactly what the
//! usual tools do not give. `wait4`/`getrusage(RUSAGE_CHILDREN)` report `ru_maxrss` as the
//! largest of the child and every descendant it reaped, and chpart's descendant is
//! clickhouse-local, whose engine alone is hundreds of MB. So the child's own peak is read
//! from `/proc/<pid>/status` `VmHWM` (the kernel's high-water mark of that one process's
//! resident set) every [`POLL`] while it runs; the last reading before it exits is the figure.
//! `VmHWM` only grows, so a sample can miss at most the growth of the final [`POLL`], when
//! chpart is writing its manifest. The `wait4` figure is kept too, labelled as the peak of the
//! process tree.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::interrupt;

/// How often the child's `VmHWM` is sampled. Each sample is one small read from procfs, so
/// this costs the measured command nothing noticeable.
pub const POLL: Duration = Duration::from_millis(5);

/// One finished run of a command.
#[derive(Debug)]
pub struct Measured {
    /// The command, for messages.
    pub described: String,
    /// From just before spawning to reaping the child.
    pub wall: Duration,
    /// How it ended.
    pub status: ExitStatus,
    /// Everything it printed on stdout.
    pub stdout: Vec<u8>,
    /// Everything it printed on stderr.
    pub stderr: Vec<u8>,
    /// The child's own peak resident set (`VmHWM`), in KiB; None if it exited before the first
    /// sample.
    pub own_peak_kib: Option<u64>,
    /// `wait4`'s `ru_maxrss`: the largest peak of the child and its reaped descendants, in KiB.
    pub tree_peak_kib: u64,
    /// User + system CPU time of the child and its reaped descendants.
    pub cpu: Duration,
}

impl Measured {
    /// An error naming the command, its exit status and the tail of its stderr, unless it
    /// succeeded.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.status.success() {
            return Ok(());
        }
        bail!(
            "{} failed ({}); stderr ends with:\n{}",
            self.described,
            self.status,
            tail(&self.stderr, 25)
        )
    }

    /// stdout as text.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// The last `lines` lines of `bytes`, as text.
pub fn tail(bytes: &[u8], lines: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs `cmd` to completion with stdin closed and stdout/stderr captured, sampling its
/// `VmHWM`. An interrupt kills the child and returns an error.
pub fn run(cmd: &mut Command) -> anyhow::Result<Measured> {
    let described = describe(cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("start {described}"))?;
    let pid = child.id() as libc::pid_t;
    // Pipes are drained on their own threads: a child that fills one pipe while we wait would
    // otherwise block forever.
    let stdout = drain(child.stdout.take().expect("stdout is piped"));
    let stderr = drain(child.stderr.take().expect("stderr is piped"));
    let mut own_peak_kib = None;
    let mut killed = false;
    let (status, usage) = loop {
        if let Some(kib) = vm_hwm_kib(pid) {
            own_peak_kib = Some(kib);
        }
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: pid is our unreaped child; status and usage are valid for writes. Reaping it
        // here (rather than through `Child::wait`) is what gives us its rusage.
        let reaped = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if reaped == pid {
            break (ExitStatus::from_raw(status), usage);
        }
        if reaped < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e).with_context(|| format!("wait for {described}"));
            }
        }
        if interrupt::requested() && !killed {
            // SAFETY: the child is not reaped yet, so the pid is still ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed = true;
        }
        std::thread::sleep(POLL);
    };
    let wall = started.elapsed();
    let stdout = stdout.join().expect("reader thread does not panic");
    let stderr = stderr.join().expect("reader thread does not panic");
    if killed {
        bail!("interrupted while running {described}");
    }
    let timeval = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Ok(Measured {
        described,
        wall,
        status,
        stdout,
        stderr,
        own_peak_kib,
        tree_peak_kib: usage.ru_maxrss as u64,
        cpu: timeval(usage.ru_utime) + timeval(usage.ru_stime),
    })
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        // A read error just ends the capture; the exit status tells whether the run failed.
        let _ = pipe.read_to_end(&mut out);
        out
    })
}

/// `VmHWM` of a live process, in KiB; None once it has exited (a zombie has no memory map).
pub fn vm_hwm_kib(pid: libc::pid_t) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The command line, shell-like, for messages.
pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| {
            let a = a.to_string_lossy();
            if a.contains(char::is_whitespace) || a.is_empty() {
                format!("'{}'", a.chars().take(120).collect::<String>())
            } else {
                a.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_peak_excludes_a_bigger_descendant() {
        // The shell stays small while `sort`, its child, holds a 64 MiB line (it must keep a
        // line whole to sort it): the tree's peak must be far above the shell's own.
        let measured = run(Command::new("sh").args([
            "-c",
            "head -c 67108864 /dev/zero | sort | wc -c; sleep 0.05",
        ]))
        .unwrap();
        measured.check().unwrap();
        assert_eq!(measured.stdout_text().trim(), "67108865");
        let own = measured.own_peak_kib.expect("sampled at least once");
        assert!(
            measured.tree_peak_kib > 60 * 1024,
            "tree peak {} KiB",
            measured.tree_peak_kib
        );
        assert!(own < 16 * 1024, "the shell's own peak {own} KiB");
        assert!(measured.wall >= Duration::from_millis(50));
    }

    #[test]
    fn failures_name_the_command_and_show_stderr() {
        let measured = run(Command::new("sh").args(["-c", "echo boom >&2; exit 3"])).unwrap();
        let message = measured.check().unwrap_err().to_string();
        assert!(
            message.contains("sh -c 'echo boom >&2; exit 3'"),
            "{message}"
        );
        assert!(
            message.contains("exit status: 3") && message.contains("boom"),
            "{message}"
        );
    }
}
