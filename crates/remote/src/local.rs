//! [`RemoteFs`] on the local filesystem: for a ClickHouse running on the same
//! machine as chpart, and as the reference the SFTP backend is compared with.
//!
//! The publish rename is `renameat2(RENAME_NOREPLACE)`, so "never overwrite"
//! is enforced by the kernel atomically rather than by a check before the
//! rename. Filesystems without that flag fail loudly instead of falling back
//! to a racy rename. Durability follows the usual recipe: fsync each file,
//! then the directories whose entries changed.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{
    join, split_parent, temp_sibling, DirEntry, FileKind, RemoteError, RemoteFs, Stat, UploadStats,
};

const AT: &str = "local";
const DEFAULT_BUFFER_BYTES: usize = 256 * 1024;

/// The local filesystem as a [`RemoteFs`]; paths are local paths as strings.
#[derive(Debug, Clone)]
pub struct LocalFs {
    buffer_bytes: usize,
}

impl LocalFs {
    pub fn new() -> Self {
        LocalFs {
            buffer_bytes: DEFAULT_BUFFER_BYTES,
        }
    }
}

impl Default for LocalFs {
    fn default() -> Self {
        Self::new()
    }
}

/// Maps an errno to the protocol's meaning. ENOTDIR counts as absence because
/// a path through a file names nothing, and that is how SFTP reports it too.
pub(crate) fn map_io(op: &'static str, path: &str, e: io::Error) -> RemoteError {
    let at = AT.to_string();
    let path = path.to_string();
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => RemoteError::NotFound { at, op, path },
        Some(libc::EEXIST) => RemoteError::AlreadyExists { at, op, path },
        Some(libc::EACCES) | Some(libc::EPERM) => RemoteError::PermissionDenied { at, op, path },
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => RemoteError::NoSpace {
            at,
            op,
            path,
            available_bytes: None,
        },
        _ => RemoteError::Io {
            at,
            op,
            path,
            source: e,
        },
    }
}

fn stat_of(meta: &fs::Metadata) -> Stat {
    let ft = meta.file_type();
    let kind = if ft.is_file() {
        FileKind::File
    } else if ft.is_dir() {
        FileKind::Dir
    } else {
        FileKind::Other
    };
    Stat {
        kind,
        size: meta.len(),
        uid: meta.uid(),
        gid: meta.gid(),
        perm: meta.mode() & 0o7777,
        mtime: meta.mtime(),
    }
}

fn fsync_dir(op: &'static str, path: &str) -> Result<(), RemoteError> {
    fs::File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| map_io(op, path, e))
}

fn c_path(op: &'static str, path: &str) -> Result<CString, RemoteError> {
    CString::new(path).map_err(|_| RemoteError::Unexpected {
        at: AT.to_string(),
        op,
        path: path.escape_debug().to_string(),
        detail: "path contains a NUL byte".into(),
    })
}

fn utf8_name(op: &'static str, dir: &str, name: &std::ffi::OsStr) -> Result<String, RemoteError> {
    name.to_str()
        .map(str::to_string)
        .ok_or_else(|| RemoteError::Unexpected {
            at: AT.to_string(),
            op,
            path: join(dir, &name.to_string_lossy()),
            detail: "file name is not UTF-8".into(),
        })
}

impl LocalFs {
    /// Copies one file into a name that must not exist yet, fsyncs it and
    /// checks the copy's size against what was read.
    fn copy_file(&self, src: &Path, dst: &str) -> Result<u64, RemoteError> {
        let src_str = src.display().to_string();
        let mut input =
            fs::File::open(src).map_err(|e| map_io("read upload source", &src_str, e))?;
        let mut output = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(dst)
            .map_err(|e| map_io("create", dst, e))?;
        let mut buf = vec![0u8; self.buffer_bytes];
        let copied = for_each_chunk(
            &mut input,
            &mut buf,
            "read upload source",
            &src_str,
            |chunk| output.write_all(chunk).map_err(|e| map_io("write", dst, e)),
        )?;
        output.sync_all().map_err(|e| map_io("fsync", dst, e))?;
        let written = fs::metadata(dst).map_err(|e| map_io("stat", dst, e))?.len();
        if written != copied {
            return Err(RemoteError::Unexpected {
                at: AT.to_string(),
                op: "verify upload",
                path: dst.to_string(),
                detail: format!("size is {written} bytes after writing {copied}"),
            });
        }
        Ok(copied)
    }
}

impl RemoteFs for LocalFs {
    fn describe(&self) -> String {
        AT.to_string()
    }

    fn create_dir_all(&self, path: &str) -> Result<(), RemoteError> {
        fs::create_dir_all(path).map_err(|e| map_io("create_dir_all", path, e))
    }

    fn create_dir(&self, path: &str) -> Result<(), RemoteError> {
        fs::create_dir(path).map_err(|e| map_io("create_dir", path, e))?;
        // The claim must survive a crash of the host as much as the files written into it.
        fsync_dir("fsync", split_parent(path).0)
    }

    fn upload_dir(&self, local: &Path, remote: &str) -> Result<UploadStats, RemoteError> {
        let local_str = local.display().to_string();
        let meta = fs::metadata(local).map_err(|e| map_io("read upload source", &local_str, e))?;
        if !meta.is_dir() {
            return Err(RemoteError::Unexpected {
                at: AT.to_string(),
                op: "read upload source",
                path: local_str,
                detail: "not a directory".into(),
            });
        }
        // create_dir (not _all) is the claim on the name: it fails if another
        // upload got there first.
        fs::create_dir(remote).map_err(|e| map_io("upload_dir", remote, e))?;

        let mut stats = UploadStats::default();
        let mut created_dirs = vec![remote.to_string()];
        for entry in walkdir::WalkDir::new(local)
            .min_depth(1)
            .sort_by_file_name()
        {
            let entry = entry.map_err(|e| walk_error("read upload source", &local_str, e))?;
            let rel = relative_slash_path("read upload source", local, entry.path())?;
            let dst = join(remote, &rel);
            let ft = entry.file_type();
            if ft.is_dir() {
                fs::create_dir(&dst).map_err(|e| map_io("create_dir", &dst, e))?;
                created_dirs.push(dst);
            } else if ft.is_file() {
                stats.bytes += self.copy_file(entry.path(), &dst)?;
                stats.files += 1;
            } else {
                return Err(RemoteError::Unexpected {
                    at: AT.to_string(),
                    op: "read upload source",
                    path: entry.path().display().to_string(),
                    detail: "neither a regular file nor a directory (parts contain only those)"
                        .into(),
                });
            }
        }
        // Entries are durable only once their directory is fsynced; deepest
        // first, then the parent that now holds the new top directory.
        for dir in created_dirs.iter().rev() {
            fsync_dir("fsync", dir)?;
        }
        fsync_dir("fsync", split_parent(remote).0)?;
        Ok(stats)
    }

    fn upload_dir_consuming(&self, local: &Path, remote: &str) -> Result<UploadStats, RemoteError> {
        let local_str = local.display().to_string();
        // Count first and refuse what upload_dir refuses, so both report the same.
        let mut stats = UploadStats::default();
        let mut dirs = vec![String::new()];
        let mut files = Vec::new();
        for entry in walkdir::WalkDir::new(local).min_depth(1) {
            let entry = entry.map_err(|e| walk_error("read upload source", &local_str, e))?;
            let rel = relative_slash_path("read upload source", local, entry.path())?;
            let ft = entry.file_type();
            if ft.is_dir() {
                dirs.push(rel);
            } else if ft.is_file() {
                let meta = entry
                    .metadata()
                    .map_err(|e| walk_error("read upload source", &local_str, e))?;
                stats.bytes += meta.len();
                stats.files += 1;
                files.push(rel);
            } else {
                return Err(RemoteError::Unexpected {
                    at: AT.to_string(),
                    op: "read upload source",
                    path: entry.path().display().to_string(),
                    detail: "neither a regular file nor a directory (parts contain only those)"
                        .into(),
                });
            }
        }
        match self.rename_noreplace(&local_str, remote) {
            Ok(()) => {}
            Err(RemoteError::CrossDevice { .. }) => return self.upload_dir(local, remote),
            Err(e) => return Err(e),
        }
        // The writer of `local` may not have synced it; make it as durable as a copy would be.
        for rel in &files {
            let path = join(remote, rel);
            fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| map_io("fsync", &path, e))?;
        }
        for rel in dirs.iter().rev() {
            fsync_dir(
                "fsync",
                &if rel.is_empty() {
                    remote.to_string()
                } else {
                    join(remote, rel)
                },
            )?;
        }
        Ok(stats)
    }

    fn rename_noreplace(&self, from: &str, to: &str) -> Result<(), RemoteError> {
        let c_from = c_path("rename", from)?;
        let c_to = c_path("rename", to)?;
        // The system call, not glibc's renameat2() wrapper: that appeared in glibc 2.28, and the
        // portable build (deploy/spark/build-portable.sh) links against glibc 2.17's symbols.
        // The call itself needs Linux 3.15.
        // SAFETY: both pointers are valid NUL-terminated strings for the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                c_from.as_ptr(),
                libc::AT_FDCWD,
                c_to.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            let at = AT.to_string();
            return Err(match e.raw_os_error() {
                // ENOTEMPTY: some filesystems report an existing directory target this way.
                Some(libc::EEXIST) | Some(libc::ENOTEMPTY) => RemoteError::AlreadyExists {
                    at,
                    op: "rename",
                    path: to.to_string(),
                },
                Some(libc::ENOENT) => {
                    let missing = if fs::symlink_metadata(from).is_err() {
                        from
                    } else {
                        split_parent(to).0
                    };
                    RemoteError::NotFound {
                        at,
                        op: "rename",
                        path: missing.to_string(),
                    }
                }
                Some(libc::EXDEV) => RemoteError::CrossDevice {
                    at,
                    from: from.to_string(),
                    to: to.to_string(),
                    detail: "source and target are on different filesystems (EXDEV); \
                             the staging root and detached/ must be on the same filesystem"
                        .into(),
                },
                Some(libc::EACCES) | Some(libc::EPERM) => RemoteError::PermissionDenied {
                    at,
                    op: "rename",
                    path: format!("{from} -> {to}"),
                },
                Some(libc::EINVAL) => RemoteError::Io {
                    at,
                    op: "rename (RENAME_NOREPLACE)",
                    path: format!("{from} -> {to}"),
                    source: io::Error::new(
                        e.kind(),
                        format!(
                            "{e}: the filesystem may not support RENAME_NOREPLACE, \
                             or the target is inside the source"
                        ),
                    ),
                },
                _ => RemoteError::Io {
                    at,
                    op: "rename",
                    path: format!("{from} -> {to}"),
                    source: e,
                },
            });
        }
        let (to_parent, _) = split_parent(to);
        let (from_parent, _) = split_parent(from);
        fsync_dir("fsync", to_parent)?;
        if from_parent != to_parent {
            fsync_dir("fsync", from_parent)?;
        }
        Ok(())
    }

    fn stat(&self, path: &str) -> Result<Option<Stat>, RemoteError> {
        match fs::metadata(path) {
            Ok(meta) => Ok(Some(stat_of(&meta))),
            Err(e) => match map_io("stat", path, e) {
                RemoteError::NotFound { .. } => Ok(None),
                other => Err(other),
            },
        }
    }

    fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, RemoteError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(path).map_err(|e| map_io("list_dir", path, e))? {
            let entry = entry.map_err(|e| map_io("list_dir", path, e))?;
            let name = utf8_name("list_dir", path, &entry.file_name())?;
            let meta = entry
                .metadata()
                .map_err(|e| map_io("stat", &join(path, &name), e))?;
            out.push(DirEntry {
                name,
                stat: stat_of(&meta),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn read_file(&self, path: &str) -> Result<Vec<u8>, RemoteError> {
        fs::read(path).map_err(|e| map_io("read_file", path, e))
    }

    fn write_file_atomic(&self, path: &str, bytes: &[u8]) -> Result<(), RemoteError> {
        let tmp = temp_sibling(path);
        let written = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(bytes)?;
                f.sync_all()
            })
            .map_err(|e| map_io("write_file_atomic", &tmp, e));
        let result = written.and_then(|()| self.rename_noreplace(&tmp, path));
        if result.is_err() {
            // The temp name is ours alone; leaving it would litter the directory.
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    fn remove_all(&self, path: &str) -> Result<(), RemoteError> {
        let meta = match fs::symlink_metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(map_io("remove_all", path, e)),
        };
        let result = if meta.is_dir() {
            fs::remove_dir_all(path)
        } else {
            fs::remove_file(path)
        };
        match result {
            Ok(()) => Ok(()),
            // Someone else removed it meanwhile: the goal is reached.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(map_io("remove_all", path, e)),
        }
    }

    fn digest_dir(&self, path: &str) -> Result<BTreeMap<String, (u64, String)>, RemoteError> {
        let meta = fs::metadata(path).map_err(|e| map_io("digest_dir", path, e))?;
        if !meta.is_dir() {
            return Err(RemoteError::Unexpected {
                at: AT.to_string(),
                op: "digest_dir",
                path: path.to_string(),
                detail: "not a directory".into(),
            });
        }
        let root = PathBuf::from(path);
        let mut out = BTreeMap::new();
        let mut buf = vec![0u8; self.buffer_bytes];
        for entry in walkdir::WalkDir::new(&root)
            .min_depth(1)
            .sort_by_file_name()
        {
            let entry = entry.map_err(|e| walk_error("digest_dir", path, e))?;
            let ft = entry.file_type();
            if ft.is_dir() {
                continue;
            }
            let file = entry.path().display().to_string();
            if !ft.is_file() {
                return Err(RemoteError::Unexpected {
                    at: AT.to_string(),
                    op: "digest_dir",
                    path: file,
                    detail: "neither a regular file nor a directory".into(),
                });
            }
            let mut input =
                fs::File::open(entry.path()).map_err(|e| map_io("digest_dir", &file, e))?;
            let mut hasher = Sha256::new();
            let size = for_each_chunk(&mut input, &mut buf, "digest_dir", &file, |chunk| {
                hasher.update(chunk);
                Ok(())
            })?;
            let rel = relative_slash_path("digest_dir", &root, entry.path())?;
            out.insert(rel, (size, hex::encode(hasher.finalize())));
        }
        Ok(out)
    }
}

/// Reads `input` to its end through `buf`, handing each chunk to `each`; returns the bytes
/// read. A read error is reported as `op` on `path`.
fn for_each_chunk(
    input: &mut impl Read,
    buf: &mut [u8],
    op: &'static str,
    path: &str,
    mut each: impl FnMut(&[u8]) -> Result<(), RemoteError>,
) -> Result<u64, RemoteError> {
    let mut total = 0u64;
    loop {
        let n = match input.read(buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(map_io(op, path, e)),
        };
        each(&buf[..n])?;
        total += n as u64;
    }
}

fn walk_error(op: &'static str, root: &str, e: walkdir::Error) -> RemoteError {
    let path = e
        .path()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| root.to_string());
    match e.into_io_error() {
        Some(io) => map_io(op, &path, io),
        None => RemoteError::Unexpected {
            at: AT.to_string(),
            op,
            path,
            detail: "filesystem loop while walking the tree".into(),
        },
    }
}

/// `path` relative to `root`, `/`-separated, as a remote relative path.
pub(crate) fn relative_slash_path(
    op: &'static str,
    root: &Path,
    path: &Path,
) -> Result<String, RemoteError> {
    let rel = path
        .strip_prefix(root)
        .map_err(|_| RemoteError::Unexpected {
            at: AT.to_string(),
            op,
            path: path.display().to_string(),
            detail: format!("not under {}", root.display()),
        })?;
    let mut parts = Vec::new();
    for component in rel.components() {
        let bytes = component.as_os_str().as_bytes();
        let part = std::str::from_utf8(bytes).map_err(|_| RemoteError::Unexpected {
            at: AT.to_string(),
            op,
            path: path.display().to_string(),
            detail: "file name is not UTF-8".into(),
        })?;
        parts.push(part);
    }
    Ok(parts.join("/"))
}
