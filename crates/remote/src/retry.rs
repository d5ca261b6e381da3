//! [`Reconnecting`]: a remote filesystem that survives a broken connection. After a transient
//! fault (connection refused or reset, handshake or session failure, a timeout) it connects
//! again and retries, with exponential backoff and full jitter until a deadline, the operations
//! that are safe to repeat: reads, `create_dir_all`, `remove_all`, and an upload (the partial
//! copy, which is the caller's own claim, is removed first, so one part is sent again, not the
//! whole build). The operations whose answer decides ownership, `create_dir` (a claim) and
//! `rename_noreplace` (a publish), and `write_file_atomic` (which fails if the file exists) are
//! sent once: after an unclear outcome the caller looks at what exists.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use chpart_core::events;
use chpart_core::retry::{retry_blocking, GiveUp, Retry, RetryPolicy};

use crate::{DirEntry, RemoteError, RemoteFs, Stat, UploadStats};

/// Opens a new connection to the same host.
pub type Connector = Box<dyn Fn() -> Result<Arc<dyn RemoteFs>, RemoteError> + Send + Sync>;

/// A connection that reconnects and retries what may be repeated.
pub struct Reconnecting {
    connector: Connector,
    current: Mutex<Arc<dyn RemoteFs>>,
    /// A transient fault was seen on `current`: connect again before the next operation.
    broken: AtomicBool,
    policy: RetryPolicy,
}

impl Reconnecting {
    /// Connects with `connector` (retrying a transient failure within `policy`).
    pub fn connect(connector: Connector, policy: RetryPolicy) -> Result<Reconnecting, RemoteError> {
        let first = retry(policy, "connect", "", &connector)?;
        Ok(Reconnecting {
            connector,
            current: Mutex::new(first),
            broken: AtomicBool::new(false),
            policy,
        })
    }

    fn current(&self) -> Result<Arc<dyn RemoteFs>, RemoteError> {
        if self.broken.load(Ordering::Acquire) {
            let fresh = (self.connector)()?;
            *self.current.lock().unwrap_or_else(|p| p.into_inner()) = fresh;
            self.broken.store(false, Ordering::Release);
        }
        Ok(self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone())
    }

    /// `op` once, on a working connection (connecting again first if the last one broke).
    fn once<T>(
        &self,
        op: impl FnOnce(&dyn RemoteFs) -> Result<T, RemoteError>,
    ) -> Result<T, RemoteError> {
        let fs = retry(self.policy, "connect", "", || self.current())?;
        let result = op(fs.as_ref());
        if matches!(&result, Err(e) if e.is_transient()) {
            self.broken.store(true, Ordering::Release);
        }
        result
    }

    /// `op` until it succeeds, fails for good, or the deadline passes; a new connection after
    /// each transient fault.
    fn again<T>(
        &self,
        what: &str,
        path: &str,
        mut op: impl FnMut(&dyn RemoteFs) -> Result<T, RemoteError>,
    ) -> Result<T, RemoteError> {
        retry(self.policy, what, path, || {
            let fs = self.current()?;
            let result = op(fs.as_ref());
            if matches!(&result, Err(e) if e.is_transient()) {
                self.broken.store(true, Ordering::Release);
            }
            result
        })
    }
}

/// Runs `op` until it succeeds, fails with an error that is not transient, or the deadline of
/// `policy` passes; logs each retry with its cause and number.
fn retry<T>(
    policy: RetryPolicy,
    what: &str,
    path: &str,
    op: impl FnMut() -> Result<T, RemoteError>,
) -> Result<T, RemoteError> {
    let log = |retry: Retry<'_, RemoteError>| {
        let error = retry.error;
        tracing::warn!(
            "{what} {path}: retry {} in {:.2} s after a transient fault: {error}",
            retry.number,
            retry.wait.as_secs_f64()
        );
        tracing::info!(
            target: events::TARGET,
            step = "retry",
            outcome = events::RETRYING,
            retry = retry.number,
            duration_ms = retry.wait.as_secs_f64() * 1e3,
            error = format!("{what} {path}: {error}"),
        );
    };
    retry_blocking(policy, RemoteError::is_transient, log, op).map_err(|failed| {
        if failed.why == GiveUp::Deadline && failed.retries > 0 {
            tracing::warn!(
                "{what} {path}: giving up after {} tries in {:.1} s",
                failed.retries + 1,
                failed.elapsed.as_secs_f64()
            );
        }
        failed.error
    })
}

impl RemoteFs for Reconnecting {
    fn describe(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .describe()
    }

    fn create_dir_all(&self, path: &str) -> Result<(), RemoteError> {
        self.again("create_dir_all", path, |fs| fs.create_dir_all(path))
    }

    fn create_dir(&self, path: &str) -> Result<(), RemoteError> {
        self.once(|fs| fs.create_dir(path))
    }

    fn upload_dir(&self, local: &Path, remote: &str) -> Result<UploadStats, RemoteError> {
        let mut first = true;
        self.again("upload", remote, |fs| {
            if !std::mem::take(&mut first) {
                fs.remove_all(remote)?;
            }
            fs.upload_dir(local, remote)
        })
    }

    fn upload_dir_consuming(&self, local: &Path, remote: &str) -> Result<UploadStats, RemoteError> {
        let mut first = true;
        self.again("upload", remote, |fs| {
            if !std::mem::take(&mut first) {
                // A backend that moved `local` away cannot be asked again: that error stands.
                fs.remove_all(remote)?;
            }
            fs.upload_dir_consuming(local, remote)
        })
    }

    fn rename_noreplace(&self, from: &str, to: &str) -> Result<(), RemoteError> {
        self.once(|fs| fs.rename_noreplace(from, to))
    }

    fn stat(&self, path: &str) -> Result<Option<Stat>, RemoteError> {
        self.again("stat", path, |fs| fs.stat(path))
    }

    fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, RemoteError> {
        self.again("list", path, |fs| fs.list_dir(path))
    }

    fn read_file(&self, path: &str) -> Result<Vec<u8>, RemoteError> {
        self.again("read", path, |fs| fs.read_file(path))
    }

    fn write_file_atomic(&self, path: &str, bytes: &[u8]) -> Result<(), RemoteError> {
        self.once(|fs| fs.write_file_atomic(path, bytes))
    }

    fn remove_all(&self, path: &str) -> Result<(), RemoteError> {
        self.again("remove", path, |fs| fs.remove_all(path))
    }

    fn digest_dir(&self, path: &str) -> Result<BTreeMap<String, (u64, String)>, RemoteError> {
        self.again("digest", path, |fs| fs.digest_dir(path))
    }
}
