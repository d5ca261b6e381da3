//! The filesystem on the ClickHouse host, where chpart stages parts and then
//! publishes them into a table's `detached/` directory.
//!
//! chpart's exactly-once guarantee rests on two remote operations: an upload
//! that lands in a fresh staging directory and is verified before anything
//! refers to it, and a rename into `detached/` that never replaces an existing
//! name. [`RemoteFs`] states exactly those guarantees so the publishing logic
//! can be written once and tested against every backend with the same
//! [`conformance`] suite:
//!
//! * [`SftpFs`]: the production backend, SFTP over SSH (libssh2 via `ssh2`),
//!   always verifying the server's host key.
//! * [`LocalFs`]: the same contract on the local filesystem, for a ClickHouse
//!   on the same machine and for tests; its rename is atomic (`renameat2`
//!   with `RENAME_NOREPLACE`).
//!
//! Remote paths are POSIX path strings on the remote host, never local
//! `std::path::Path`s: the client's path rules do not apply to the server.
//! Backend errors are translated at this boundary into [`RemoteError`]s that
//! say what happened in the protocol's terms (a rename onto an existing name
//! is [`RemoteError::AlreadyExists`], whatever status code carried it).

use std::collections::BTreeMap;
use std::path::Path;

pub mod conformance;
mod error;
mod local;
pub mod retry;
mod sftp;

pub use error::RemoteError;
pub use local::LocalFs;
pub use sftp::{SftpConfig, SftpFs};

/// The filesystem on the ClickHouse host where parts are staged and published.
///
/// Guarantees every implementation gives (checked by [`conformance::run_all`]):
/// * [`rename_noreplace`](Self::rename_noreplace) never replaces an existing
///   file or directory; an existing target yields [`RemoteError::AlreadyExists`].
/// * [`create_dir`](Self::create_dir) is exclusive: of any number of callers
///   creating one name, exactly one succeeds; the others (and every later
///   caller) get [`RemoteError::AlreadyExists`].
/// * [`upload_dir`](Self::upload_dir) claims a name that did not exist
///   (creating the top directory is the claim, so two uploads to one name
///   cannot both succeed), writes every file durably (fsync) and checks the
///   remote sizes before returning.
/// * [`write_file_atomic`](Self::write_file_atomic) makes a file appear with
///   its full content or not at all, and leaves no temporary file behind on
///   success.
/// * [`remove_all`](Self::remove_all) is idempotent: removing an absent path succeeds.
/// * Absence is reported as `None` by [`stat`](Self::stat) and as
///   [`RemoteError::NotFound`] by every operation that needs the path.
///
/// Implementations are blocking and may serialize concurrent calls (one SSH
/// connection carries one request at a time); open several for parallelism.
pub trait RemoteFs: Send + Sync {
    /// Where this filesystem is, for messages: `sftp://user@host:port` or `local`.
    fn describe(&self) -> String;

    /// Creates `path` and any missing parents; an existing directory is success.
    fn create_dir_all(&self, path: &str) -> Result<(), RemoteError>;

    /// Creates the directory `path` exclusively: one `mkdir(2)` on the host (over SFTP the
    /// server runs it as one call), so success means this caller created it and nobody else
    /// did. Anything already at `path` (a directory, a file) is
    /// [`RemoteError::AlreadyExists`] and is left untouched; a missing parent is
    /// [`RemoteError::NotFound`]. This is how a writer claims a name it alone may later remove.
    fn create_dir(&self, path: &str) -> Result<(), RemoteError>;

    /// Uploads a local directory tree (files only, recursively) to `remote`,
    /// which must not exist yet ([`RemoteError::AlreadyExists`] otherwise) and
    /// whose parent must exist ([`RemoteError::NotFound`] otherwise). Each file
    /// is written with large writes then fsynced; remote sizes are verified
    /// after upload. Returns bytes and files uploaded. On error a partial
    /// `remote` may remain (it is this call's own claim, so the caller may
    /// remove it). Over SFTP, files are fsynced but directories cannot be:
    /// their entries become durable when the server's filesystem commits them.
    fn upload_dir(&self, local: &Path, remote: &str) -> Result<UploadStats, RemoteError>;

    /// [`RemoteFs::upload_dir`] for a caller that gives `local` up: a backend on the same
    /// machine may move the tree instead of copying it (the local backend renames it when both
    /// are on one filesystem, then fsyncs every file and directory). Same guarantees for
    /// `remote`; afterwards `local` may be gone. By default, a plain upload.
    fn upload_dir_consuming(&self, local: &Path, remote: &str) -> Result<UploadStats, RemoteError> {
        self.upload_dir(local, remote)
    }

    /// Renames `from` to `to`; fails with [`RemoteError::AlreadyExists`] if `to`
    /// exists and never overwrites. Atomic on the local backend (`renameat2`
    /// `RENAME_NOREPLACE`); over SFTP, OpenSSH's server checks the target is
    /// absent and then calls rename(2) for directories, so callers must use
    /// unique names for the check to be sufficient.
    fn rename_noreplace(&self, from: &str, to: &str) -> Result<(), RemoteError>;

    /// Metadata of `path`, following symlinks (a table directory may be a
    /// symlink into ClickHouse's `store/`); `None` when absent.
    fn stat(&self, path: &str) -> Result<Option<Stat>, RemoteError>;

    /// The entries of directory `path` (without `.` and `..`), sorted by name,
    /// each with the metadata of the entry itself (symlinks not followed).
    /// [`RemoteError::NotFound`] when `path` is absent.
    fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, RemoteError>;

    /// The whole content of the file at `path`.
    fn read_file(&self, path: &str) -> Result<Vec<u8>, RemoteError>;

    /// Writes `bytes` to a temp name beside `path`, fsyncs, then renames onto
    /// `path`, which must not exist ([`RemoteError::AlreadyExists`]; the temp
    /// file is removed again).
    fn write_file_atomic(&self, path: &str, bytes: &[u8]) -> Result<(), RemoteError>;

    /// Removes a file or a directory tree; absent is success (idempotent).
    /// Symlinks are removed, not followed.
    fn remove_all(&self, path: &str) -> Result<(), RemoteError>;

    /// sha256 of every regular file under directory `path`, read back over the
    /// transport: relative path (`/`-separated) -> (size, lowercase hex sha256).
    /// Entries that are neither files nor directories are an error, since a
    /// part never contains them.
    fn digest_dir(&self, path: &str) -> Result<BTreeMap<String, (u64, String)>, RemoteError>;
}

/// What [`RemoteFs::upload_dir`] transferred.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UploadStats {
    pub bytes: u64,
    pub files: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    /// Symlinks (when not followed), sockets, devices, fifos.
    Other,
}

/// Metadata of a remote path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub kind: FileKind,
    pub size: u64,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits (`mode & 0o7777`).
    pub perm: u32,
    /// Seconds since the Unix epoch.
    pub mtime: i64,
}

/// One entry of [`RemoteFs::list_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub stat: Stat,
}

/// Joins a remote directory and a relative name with exactly one `/`.
pub fn join(dir: &str, name: &str) -> String {
    let name = name.trim_start_matches('/');
    if dir.is_empty() {
        name.to_string()
    } else if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// Splits a remote path into its parent directory and last component
/// (`"a/b/c"` -> `("a/b", "c")`, `"c"` -> `(".", "c")`, `"/c"` -> `("/", "c")`).
pub fn split_parent(path: &str) -> (&str, &str) {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some(("", name)) => ("/", name),
        Some((parent, name)) => (parent, name),
        None => (".", trimmed),
    }
}

/// A name beside `path` that no other writer uses: pid, time and a process
/// counter keep concurrent writers (threads or processes) apart.
fn temp_sibling(path: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let (parent, name) = split_parent(path);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    join(
        parent,
        &format!(".{name}.tmp-{}-{nanos}-{n}", std::process::id()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_puts_exactly_one_slash() {
        assert_eq!(join("/a/b", "c"), "/a/b/c");
        assert_eq!(join("/a/b/", "c"), "/a/b/c");
        assert_eq!(join("/a", "/c"), "/a/c");
        assert_eq!(join("/", "c"), "/c");
        assert_eq!(join("", "c"), "c");
    }

    #[test]
    fn split_parent_handles_root_relative_and_trailing_slash() {
        assert_eq!(split_parent("/a/b/c"), ("/a/b", "c"));
        assert_eq!(split_parent("/a/b/c/"), ("/a/b", "c"));
        assert_eq!(split_parent("/c"), ("/", "c"));
        assert_eq!(split_parent("c"), (".", "c"));
    }

    #[test]
    fn temp_siblings_are_hidden_unique_and_beside_the_target() {
        let a = temp_sibling("/d/detached/part");
        let b = temp_sibling("/d/detached/part");
        assert_ne!(a, b);
        assert!(a.starts_with("/d/detached/.part.tmp-"), "{a}");
    }
}
