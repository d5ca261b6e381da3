//! The local scratch directory of one build: clickhouse-local's `--path`, input files, parts.
//!
//! Batch schedulers run the same task attempt twice (speculative execution, a lost executor
//! that is still running), so a directory named after the attempt alone could be shared by two
//! live builders, each deleting or overwriting the other's parts. The name therefore also holds
//! the process id and random characters, and the directory is created exclusively (`mkdir`, which
//! fails if it exists): no two [`WorkDir`]s ever share a directory. It is removed when dropped,
//! including while unwinding from a panic, and [`WorkDir::close`] removes it and reports errors.

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

/// A directory unique to this process and attempt: `<parent>/chpart-<load>-<attempt>-<pid>-<random>`.
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
        let dir = tempfile::Builder::new()
            .prefix(&format!("chpart-{load}-{attempt}-{}-", std::process::id()))
            .rand_bytes(10)
            .tempdir_in(&parent)
            .map_err(create_err)?;
        Ok(WorkDir { dir })
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
        let prefix = format!("chpart-load-1-app_1.task-7-{}-", std::process::id());
        for path in &paths {
            assert!(path.is_dir(), "{}", path.display());
            assert_eq!(path.parent(), Some(parent.path()));
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(
                name.starts_with(&prefix) && name.len() == prefix.len() + 10,
                "{name}"
            );
        }
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), 8, "two work directories were shared");
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
