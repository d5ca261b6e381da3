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

use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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
    run_fed(cmd, None)
}

/// [`run`], with the file `stdin` (if given) written into the child's stdin through a pipe, as
/// a producer process would: the child gets a pipe it cannot seek in, not the file. The copy
/// runs on its own thread from spawning on, so it is inside the wall time.
pub fn run_fed(cmd: &mut Command, stdin: Option<&Path>) -> anyhow::Result<Measured> {
    let described = describe(cmd);
    let feed = match stdin {
        Some(path) => Some(File::open(path).with_context(|| format!("open {}", path.display()))?),
        None => None,
    };
    cmd.stdin(if feed.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("start {described}"))?;
    let pid = child.id() as libc::pid_t;
    let feeder = feed.map(|mut file| {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        // A child that stops reading early breaks the pipe; its exit status tells why.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut file, &mut pipe);
        })
    });
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
    if let Some(feeder) = feeder {
        feeder.join().expect("feeder thread does not panic");
    }
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

/// How often [`DiskWatch`] walks its directory. A walk of a build's work dir (a few hundred
/// files) takes well under a millisecond of one core; at 50 ms a spooled chunk of 256 MiB,
/// which takes seconds to write and insert, cannot come and go unseen.
pub const DISK_POLL: Duration = Duration::from_millis(50);

/// The local disk a directory tree takes while something runs: a thread walks it every
/// [`DISK_POLL`] and keeps the largest total, and the files named `*.<extension>` it saw (a build's
/// spooled chunks). A file is counted by its allocated blocks (`st_blocks`, what `du` counts), a
/// file with several links once, a symbolic link not followed; a file or directory that vanishes
/// mid-walk is skipped, so one sample may slightly undercount a tree that is being rewritten.
pub struct DiskWatch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<DiskPeak>,
}

/// What a [`DiskWatch`] saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskPeak {
    /// The largest total of one walk, in bytes.
    pub peak_bytes: u64,
    /// Walks made.
    pub samples: u64,
    /// The most `*.<extension>` files one walk found.
    pub most_marked_at_once: usize,
    /// The largest `*.<extension>` file seen, in bytes (its length, not its blocks).
    pub largest_marked_bytes: u64,
    /// The names of every `*.<extension>` file seen.
    pub marked_seen: BTreeSet<String>,
}

impl DiskWatch {
    /// Starts watching `dir` (which may not exist yet), marking files named `*.<extension>`.
    pub fn start(dir: &Path, extension: &'static str) -> DiskWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let (dir, stopping) = (dir.to_path_buf(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut peak = DiskPeak::default();
            loop {
                // One last walk after the stop: the tree as the command left it.
                let last = stopping.load(Ordering::Relaxed);
                let mut marked = Vec::new();
                let bytes = disk_usage(&dir, extension, &mut marked, &mut HashSet::new());
                peak.peak_bytes = peak.peak_bytes.max(bytes);
                peak.samples += 1;
                peak.most_marked_at_once = peak.most_marked_at_once.max(marked.len());
                for (name, len) in marked {
                    peak.largest_marked_bytes = peak.largest_marked_bytes.max(len);
                    peak.marked_seen.insert(name);
                }
                if last {
                    return peak;
                }
                std::thread::sleep(DISK_POLL);
            }
        });
        DiskWatch { stop, thread }
    }

    /// Stops the watch and returns what it saw.
    pub fn stop(self) -> DiskPeak {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the disk watch does not panic")
    }
}

/// Allocated bytes under `path` (see [`DiskWatch`]); the names and lengths of files named
/// `*.<extension>` go into `marked`, and `linked` holds the (device, inode) of multiply linked files counted.
fn disk_usage(
    path: &Path,
    extension: &str,
    marked: &mut Vec<(String, u64)>,
    linked: &mut HashSet<(u64, u64)>,
) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.is_dir() {
        let Ok(entries) = std::fs::read_dir(path) else {
            return 0;
        };
        let mut total = meta.blocks() * 512;
        for entry in entries.flatten() {
            total += disk_usage(&entry.path(), extension, marked, linked);
        }
        return total;
    }
    if path.extension().is_some_and(|e| e == extension) {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        marked.push((name.into_owned(), meta.len()));
    }
    if meta.nlink() > 1 && !linked.insert((meta.dev(), meta.ino())) {
        return 0;
    }
    meta.blocks() * 512
}

/// The filesystem a path lives on, as `/proc/self/mounts` and `/proc/fs/jbd2` tell it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filesystem {
    /// Where it is mounted.
    pub mount_point: String,
    /// Its type (`ext4`, `tmpfs`, ...).
    pub fs_type: String,
    /// The device or source.
    pub device: String,
    /// For ext3/ext4, whether it has a journal (jbd2 lists one for its device); `None` for
    /// other types.
    pub journal: Option<bool>,
}

impl Filesystem {
    /// The filesystem holding `path` (the mount point that is its longest prefix), or `None`
    /// when `/proc/self/mounts` cannot be read.
    pub fn of(path: &Path) -> Option<Filesystem> {
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
        let journals: Vec<String> = std::fs::read_dir("/proc/fs/jbd2")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        Filesystem::from_mounts(&path, &mounts, &journals)
    }

    fn from_mounts(path: &Path, mounts: &str, journals: &[String]) -> Option<Filesystem> {
        let (device, mount_point, fs_type) = mounts
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let device = fields.next()?;
                // Spaces in mount points are written as \040.
                let mount_point = fields.next()?.replace("\\040", " ");
                let fs_type = fields.next()?;
                path.starts_with(&mount_point)
                    .then(|| (device.to_owned(), mount_point, fs_type.to_owned()))
            })
            .max_by_key(|(_, mount_point, _)| mount_point.len())?;
        let journal = matches!(fs_type.as_str(), "ext3" | "ext4").then(|| {
            // jbd2 names a journal `<device>-<inode of the journal>`, e.g. `vda-8`, `loop0-8`.
            let name = device.rsplit('/').next().unwrap_or(&device);
            journals
                .iter()
                .any(|j| j.rsplit_once('-').is_some_and(|(dev, _)| dev == name))
        });
        Some(Filesystem {
            mount_point,
            fs_type,
            device,
            journal,
        })
    }

    /// A journal-less ext4 (or ext3): file creation there scans for an inode not deleted in
    /// the last seconds, which makes every statement that creates files on a server slower
    /// than on the journaled filesystems ClickHouse data disks use.
    pub fn journal_less_ext(&self) -> bool {
        self.journal == Some(false)
    }
}

impl std::fmt::Display for Filesystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} on {}",
            self.mount_point, self.fs_type, self.device
        )?;
        match self.journal {
            Some(true) => write!(f, ", journaled)"),
            Some(false) => write!(f, ", no journal)"),
            None => write!(f, ")"),
        }
    }
}

/// The line the server benchmarks print about where their server keeps its data, with a
/// warning when that filesystem makes file creation slow (see `deploy/dev/bench-disk.sh`).
pub fn data_disk_line(data_dir: &Path) -> String {
    match Filesystem::of(data_dir) {
        None => format!("server data in {} (filesystem unknown)", data_dir.display()),
        Some(fs) if fs.journal_less_ext() => format!(
            "server data on {fs}: WARNING: a journal-less ext4 scans for a free inode on every \
             file created, so statements that create files (MOVE PARTITION, INSERT, ledger \
             INSERTs) cost several times what they cost on a ClickHouse data disk; for \
             figures that stand for a server, run with TMPDIR=\"$(bash deploy/dev/bench-disk.sh \
             start)\" (a journaled ext4 on a loop device)"
        ),
        Some(fs) => format!("server data on {fs}"),
    }
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
    fn filesystem_of_a_path_from_mounts_and_journals() {
        let mounts = "/dev/vda / ext4 rw,relatime 0 0\n\
                      tmpfs /dev/shm tmpfs rw 0 0\n\
                      /dev/loop0 /mnt/chpart-bench ext4 rw 0 0\n\
                      /dev/loop1 /mnt/with\\040space xfs rw 0 0\n";
        let journals = ["loop0-8".to_owned()];
        // (path, mount point, type, journal)
        let rows = [
            ("/tmp/chpart-x/data", "/", "ext4", Some(false)),
            ("/dev/shm/x", "/dev/shm", "tmpfs", None),
            (
                "/mnt/chpart-bench/tmp/data",
                "/mnt/chpart-bench",
                "ext4",
                Some(true),
            ),
            ("/mnt/chpart-benchmark", "/", "ext4", Some(false)),
            ("/mnt/with space/d", "/mnt/with space", "xfs", None),
        ];
        for (path, mount_point, fs_type, journal) in rows {
            let fs = Filesystem::from_mounts(Path::new(path), mounts, &journals).unwrap();
            assert_eq!(
                (fs.mount_point.as_str(), fs.fs_type.as_str(), fs.journal),
                (mount_point, fs_type, journal),
                "{path}"
            );
        }
        let root = Filesystem::from_mounts(Path::new("/tmp"), mounts, &journals).unwrap();
        assert!(root.journal_less_ext());
        assert_eq!(root.to_string(), "/ (ext4 on /dev/vda, no journal)");
        assert!(Filesystem::from_mounts(Path::new("/x"), "", &journals).is_none());
    }

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
    fn the_disk_watch_keeps_the_peak_and_the_marked_files() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        let watch = DiskWatch::start(&work, "arrows");
        // A chunk of 1 MiB is written, then removed, then a smaller one: the peak is the first.
        let measured = run(Command::new("sh").arg("-c").arg(format!(
            "mkdir -p {w}/sub && head -c 1048576 /dev/urandom > {w}/sub/input-0001.arrows && \
             sleep 0.3 && rm {w}/sub/input-0001.arrows && \
             head -c 4096 /dev/urandom > {w}/input-0002.arrows && ln {w}/input-0002.arrows {w}/link && \
             sleep 0.3",
            w = work.display()
        )))
        .unwrap();
        measured.check().unwrap();
        let peak = watch.stop();
        assert!(
            (1 << 20..(1 << 20) + 64 * 1024).contains(&peak.peak_bytes),
            "{peak:?}"
        );
        assert_eq!(peak.most_marked_at_once, 1);
        assert_eq!(peak.largest_marked_bytes, 1 << 20);
        assert_eq!(
            peak.marked_seen.iter().collect::<Vec<_>>(),
            ["input-0001.arrows", "input-0002.arrows"]
        );
        // At the end: the 4 KiB chunk once (its second link is not counted again) and two
        // directories.
        let mut marked = Vec::new();
        let now = disk_usage(&work, "arrows", &mut marked, &mut HashSet::new());
        assert!((4096..=4096 + 2 * 4096).contains(&now), "{now}");
        assert!(peak.samples >= 4, "{peak:?}");
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
