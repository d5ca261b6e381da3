//! The local scratch directory of one build: clickhouse-local's `--path`, input files, parts.
//!
//! Batch schedulers run the same task attempt twice (speculative execution, a lost executor
//! that is still running), so a directory named after the attempt alone could be shared by two
//! live builders, each deleting or overwriting the other's parts. The name therefore also holds
//! who made it and random characters, and the directory is created exclusively (`mkdir`, which
//! fails if it exists): no two [`WorkDir`]s ever share a directory. It is removed when dropped,
//! including while unwinding from a panic, and [`WorkDir::close`] removes it and reports errors.
//!
//! A builder killed with SIGKILL removes nothing, so the name says who made it, in a form
//! another process can check later: `chpart.<boot>-<pidns>-<pid>-<start>.<random>.<load>.<attempt>`
//! with the boot id, the pid namespace, the pid and the process's start time (clock ticks since
//! boot, from `/proc/<pid>/stat`). [`WorkDir::sweep_stale`] (each build runs it first) removes
//! the directories whose maker is gone: same boot and pid namespace, and no process with that
//! pid and start time (a recycled pid has another start time); or an earlier boot. Directories
//! made in another pid namespace (a container sharing the directory) are never judged.

use std::io;
use std::path::{Path, PathBuf};

use chpart_core::{AttemptId, IdError, LoadId};

/// Why a work directory cannot be created or removed.
#[derive(Debug, thiserror::Error)]
pub enum WorkDirError {
    /// The load or attempt id cannot be part of a directory name.
    #[error("cannot name a work directory after {what} {value:?}: {source}")]
    BadId {
        /// "load" or "attempt".
        what: &'static str,
        /// The value given.
        value: String,
        /// The rule it breaks.
        source: IdError,
    },
    /// Creating the directory failed.
    #[error("cannot create a work directory in {}: {source}", parent.display())]
    Create {
        /// The parent directory.
        parent: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Removing the directory failed.
    #[error("cannot remove work directory {}: {source}", path.display())]
    Remove {
        /// The work directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// Who made a work directory: a process, identified so that pid reuse cannot fool a check.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    /// The first 8 hex digits of the kernel's boot id.
    boot: String,
    /// The inode of the maker's pid namespace.
    pidns: u64,
    pid: u32,
    /// Start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
    start: u64,
}

impl Owner {
    /// This process.
    fn current() -> io::Result<Owner> {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
            .trim()
            .replace('-', "")
            .chars()
            .take(8)
            .collect();
        let ns = std::fs::read_link("/proc/self/ns/pid")?;
        let pidns = ns
            .to_string_lossy()
            .trim_start_matches("pid:[")
            .trim_end_matches(']')
            .parse()
            .map_err(|_| io::Error::other(format!("unexpected pid namespace {}", ns.display())))?;
        let pid = std::process::id();
        let start = start_time(pid)?
            .ok_or_else(|| io::Error::other("this process is missing from /proc"))?;
        Ok(Owner {
            boot,
            pidns,
            pid,
            start,
        })
    }

    fn tag(&self) -> String {
        format!("{}-{}-{}-{}", self.boot, self.pidns, self.pid, self.start)
    }

    /// The owner named by a work directory's name, `None` for other names.
    fn parse(name: &str) -> Option<Owner> {
        let (tag, _) = name.strip_prefix("chpart.")?.split_once('.')?;
        let mut fields = tag.split('-');
        let owner = Owner {
            boot: fields.next()?.to_owned(),
            pidns: fields.next()?.parse().ok()?,
            pid: fields.next()?.parse().ok()?,
            start: fields.next()?.parse().ok()?,
        };
        (fields.next().is_none() && owner.boot.len() == 8).then_some(owner)
    }

    /// Whether the maker of a directory is gone, as `me` sees it; `start_of(pid)` is the start
    /// time of the live process `pid` in `me`'s pid namespace (`None`: no such process).
    fn is_gone(&self, me: &Owner, start_of: impl Fn(u32) -> Option<u64>) -> bool {
        if self.pidns != me.pidns {
            return false; // another namespace's pids mean nothing here
        }
        self.boot != me.boot || start_of(self.pid) != Some(self.start)
    }
}

/// The start time of process `pid` (clock ticks since boot), `None` if there is none.
fn start_time(pid: u32) -> io::Result<Option<u64>> {
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // The command name (field 2) is in parentheses and may hold anything: count after it.
    let start = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .and_then(|field| field.parse().ok())
        .ok_or_else(|| io::Error::other(format!("unexpected /proc/{pid}/stat: {stat:?}")))?;
    Ok(Some(start))
}

/// At most `max` bytes of an ASCII id, from its start or its end.
fn cut(id: &str, max: usize, from_end: bool) -> &str {
    if id.len() <= max {
        id
    } else if from_end {
        &id[id.len() - max..]
    } else {
        &id[..max]
    }
}

/// A directory unique to this process and attempt (see the module docs for its name).
#[derive(Debug)]
pub struct WorkDir {
    dir: tempfile::TempDir,
}

impl WorkDir {
    /// Creates the directory under `parent` (made absolute, so paths derived from it, such as
    /// clickhouse-local's `--path`, do not depend on the current directory). `load` and
    /// `attempt` must be valid [`LoadId`] and [`AttemptId`] values, which are safe in a file name.
    pub fn create(parent: &Path, load: &str, attempt: &str) -> Result<WorkDir, WorkDirError> {
        LoadId::new(load).map_err(|source| WorkDirError::BadId {
            what: "load",
            value: load.to_string(),
            source,
        })?;
        AttemptId::new(attempt).map_err(|source| WorkDirError::BadId {
            what: "attempt",
            value: attempt.to_string(),
            source,
        })?;
        let create_err = |source| WorkDirError::Create {
            parent: parent.to_path_buf(),
            source,
        };
        let parent = std::path::absolute(parent).map_err(create_err)?;
        let owner = Owner::current().map_err(create_err)?;
        // Both ids may be 128 bytes; a file name may be 255. They are for people reading the
        // directory (the owner and the random part make it unique): the load's start and the
        // attempt's end (where a Spark attempt id has its task attempt number) are kept.
        let dir = tempfile::Builder::new()
            .prefix(&format!("chpart.{}.", owner.tag()))
            .rand_bytes(10)
            .suffix(&format!(
                ".{}.{}",
                cut(load, 48, false),
                cut(attempt, 64, true)
            ))
            .tempdir_in(&parent)
            .map_err(create_err)?;
        Ok(WorkDir { dir })
    }

    /// Removes the work directories under `parent` whose maker is gone (see the module docs)
    /// and returns them. Best effort: what cannot be removed is logged and left for the next
    /// sweep; another sweeper removing the same directory at once is no error.
    pub fn sweep_stale(parent: &Path) -> Vec<PathBuf> {
        let me = match Owner::current() {
            Ok(me) => me,
            Err(e) => {
                tracing::warn!("not sweeping {}: {e}", parent.display());
                return Vec::new();
            }
        };
        let Ok(entries) = std::fs::read_dir(parent) else {
            return Vec::new(); // no parent yet: nothing to sweep
        };
        let mut removed = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(owner) = name.to_str().and_then(Owner::parse) else {
                continue;
            };
            let alive = |pid| start_time(pid).ok().flatten();
            if !owner.is_gone(&me, alive) {
                continue;
            }
            let path = entry.path();
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    tracing::info!(
                        "removed the work dir {} of a build that is gone",
                        path.display()
                    );
                    removed.push(path);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(
                    "cannot remove the work dir {} of a build that is gone: {e}",
                    path.display()
                ),
            }
        }
        removed
    }

    /// The directory (absolute).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Removes the directory and everything in it, reporting failure (dropping also removes
    /// it, but can only log).
    pub fn close(self) -> Result<(), WorkDirError> {
        let path = self.dir.path().to_path_buf();
        self.dir
            .close()
            .map_err(|source| WorkDirError::Remove { path, source })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;

    #[test]
    fn concurrent_creations_with_the_same_ids_get_different_directories() {
        let parent = tempfile::tempdir().unwrap();
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let barrier = Arc::clone(&barrier);
                let parent = parent.path().to_path_buf();
                std::thread::spawn(move || {
                    barrier.wait();
                    WorkDir::create(&parent, "load-1", "app_1.task-7").unwrap()
                })
            })
            .collect();
        let dirs: Vec<WorkDir> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let mut paths: Vec<&Path> = dirs.iter().map(WorkDir::path).collect();
        let prefix = format!("chpart.{}.", Owner::current().unwrap().tag());
        for path in &paths {
            assert!(path.is_dir(), "{}", path.display());
            assert_eq!(path.parent(), Some(parent.path()));
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(
                name.starts_with(&prefix)
                    && name.ends_with(".load-1.app_1.task-7")
                    && name.len() == prefix.len() + 10 + ".load-1.app_1.task-7".len(),
                "{name}"
            );
            assert_eq!(Owner::parse(name), Some(Owner::current().unwrap()));
        }
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), 8, "two work directories were shared");
    }

    #[test]
    fn the_longest_ids_still_make_a_valid_name() {
        let parent = tempfile::tempdir().unwrap();
        let (load, attempt) = ("l".repeat(128), format!("{}.42", "a".repeat(125)));
        let work = WorkDir::create(parent.path(), &load, &attempt).unwrap();
        let name = work
            .path()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert!(name.len() <= 200 && name.ends_with("aaa.42"), "{name}");
        work.close().unwrap();
    }

    #[test]
    fn a_directory_is_stale_only_when_its_maker_is_provably_gone() {
        let me = Owner {
            boot: "0123abcd".into(),
            pidns: 4026531836,
            pid: 100,
            start: 5000,
        };
        let other = |f: fn(&mut Owner)| {
            let mut o = Owner {
                pid: 200,
                start: 7000,
                ..me.clone()
            };
            f(&mut o);
            o
        };
        // Live processes: 100 (me) and 200, started at 5000 and 7000.
        let live = |pid| match pid {
            100 => Some(5000),
            200 => Some(7000),
            _ => None,
        };
        let rows: Vec<(&str, Owner, bool)> = vec![
            ("me", me.clone(), false),
            ("another live build", other(|_| {}), false),
            ("its pid is free", other(|o| o.pid = 300), true),
            ("its pid was reused", other(|o| o.start = 6999), true),
            (
                "an earlier boot, pid and start reused",
                other(|o| o.boot = "ffff0000".into()),
                true,
            ),
            (
                "another pid namespace, pid free here",
                other(|o| {
                    o.pidns = 4026532000;
                    o.pid = 300;
                }),
                false,
            ),
        ];
        for (case, owner, gone) in rows {
            assert_eq!(owner.is_gone(&me, live), gone, "{case}");
            let name = format!("chpart.{}.Ab3dE5gH9j.load.attempt", owner.tag());
            assert_eq!(Owner::parse(&name), Some(owner), "{case}: {name}");
        }
        for foreign in [
            "chpart-l-a-1-xyz",
            "chpart.1-2-3.x",
            "other",
            "chpart.0123abcd-1-2-x.r.l.a",
        ] {
            assert_eq!(Owner::parse(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn sweep_removes_what_dead_or_recycled_makers_left_and_keeps_the_rest() {
        let parent = tempfile::tempdir().unwrap();
        let me = Owner::current().unwrap();
        let mine = WorkDir::create(parent.path(), "l", "a").unwrap();
        let recycled = Owner {
            start: me.start + 1,
            ..me.clone()
        };
        let dead = Owner {
            pid: u32::MAX - 1,
            ..me.clone()
        };
        let foreign_ns = Owner {
            pidns: me.pidns + 1,
            pid: u32::MAX - 1,
            ..me.clone()
        };
        let made = |o: &Owner| {
            let path = parent
                .path()
                .join(format!("chpart.{}.Ab3dE5gH9j.l.a", o.tag()));
            std::fs::create_dir_all(path.join("clickhouse/store")).unwrap();
            std::fs::write(path.join("input.arrows"), b"x").unwrap();
            path
        };
        let (recycled, dead, foreign_ns) = (made(&recycled), made(&dead), made(&foreign_ns));
        let unrelated = parent.path().join("not-a-work-dir");
        std::fs::create_dir(&unrelated).unwrap();
        let mut removed = WorkDir::sweep_stale(parent.path());
        removed.sort();
        let mut want = vec![recycled, dead];
        want.sort();
        assert_eq!(removed, want);
        assert!(mine.path().is_dir() && foreign_ns.is_dir() && unrelated.is_dir());
        assert!(WorkDir::sweep_stale(&parent.path().join("missing")).is_empty());
        mine.close().unwrap();
    }

    #[test]
    fn drop_removes_the_directory_even_when_panicking() {
        let parent = tempfile::tempdir().unwrap();
        let mut seen = None;
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let work = WorkDir::create(parent.path(), "l", "a").unwrap();
            // Contents like a build's: nested directories and files.
            std::fs::create_dir_all(work.path().join("store/abc/part_1_1_0")).unwrap();
            std::fs::write(work.path().join("store/abc/part_1_1_0/data.bin"), b"x").unwrap();
            seen = Some(work.path().to_path_buf());
            panic!("build failed");
        }));
        assert!(outcome.is_err());
        let path = seen.expect("the closure ran");
        assert!(!path.exists(), "{} survived the panic", path.display());
    }

    #[test]
    fn close_removes_and_reports() {
        let parent = tempfile::tempdir().unwrap();
        let work = WorkDir::create(parent.path(), "l", "a").unwrap();
        let path = work.path().to_path_buf();
        std::fs::write(path.join("f"), b"x").unwrap();
        work.close().unwrap();
        assert!(!path.exists());

        // A directory that is already gone is an error close() reports, not hides.
        let work = WorkDir::create(parent.path(), "l", "a").unwrap();
        std::fs::remove_dir_all(work.path()).unwrap();
        let err = work.close().unwrap_err();
        assert!(matches!(err, WorkDirError::Remove { .. }), "{err}");
        assert!(
            err.to_string().contains("cannot remove work directory"),
            "{err}"
        );
    }

    #[test]
    fn refuses_ids_unsafe_in_a_file_name_and_a_missing_parent() {
        let parent = tempfile::tempdir().unwrap();
        let cases = [
            ("../x", "a", "load"),
            ("l", "a/b", "attempt"),
            ("", "a", "load"),
            ("l", "..", "attempt"),
        ];
        for (load, attempt, what) in cases {
            let err = WorkDir::create(parent.path(), load, attempt).unwrap_err();
            assert!(
                matches!(&err, WorkDirError::BadId { what: w, .. } if *w == what),
                "{load:?} {attempt:?}: {err}"
            );
        }
        let err = WorkDir::create(&parent.path().join("missing"), "l", "a").unwrap_err();
        assert!(matches!(err, WorkDirError::Create { .. }), "{err}");
        // Relative parents become absolute.
        let work = WorkDir::create(Path::new("."), "l", "a").unwrap();
        assert!(work.path().is_absolute());
        work.close().unwrap();
    }
}
