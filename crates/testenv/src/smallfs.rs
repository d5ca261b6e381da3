//! A small filesystem of its own mounted over a directory (a `tmpfs` with a size limit), so
//! that a test fills a server's disk for real: once [`SmallFs::fill_leaving`] has taken the
//! space, every write there fails with ENOSPC, for the server, sshd's sftp-server and chpart
//! alike. Needs root (`mount`).
//!
//! The directory's contents are copied in first (owners and modes kept), so a stopped server's
//! data directory can be moved onto it and the server started again on it. Dropping the value
//! unmounts it on every path, a failed assertion included (lazily, should a process still hold
//! a file there): what was written on it is gone, and the directory shows what it held before.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A size-limited tmpfs mounted over a directory; unmounted on drop.
pub struct SmallFs {
    path: PathBuf,
    ballast: PathBuf,
}

/// Runs `cmd`, panicking with its output unless it succeeds.
fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl SmallFs {
    /// Mounts a tmpfs of `size_mib` MiB over `path` (an existing directory), holding a copy of
    /// what `path` held, its root owned like `path`.
    pub fn mount_over(path: &Path, size_mib: u64) -> SmallFs {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let copy = tempfile::Builder::new()
            .prefix("smallfs-copy")
            .tempdir()
            .expect("a temporary directory");
        run(Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", path.display()))
            .arg(copy.path()));
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!(
                "size={size_mib}m,mode={:o},uid={},gid={}",
                meta.mode() & 0o7777,
                meta.uid(),
                meta.gid()
            ))
            .arg("chpart-smallfs")
            .arg(path));
        let fs = SmallFs {
            path: path.to_path_buf(),
            ballast: path.join(".ballast"),
        };
        run(Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", copy.path().display()))
            .arg(path));
        fs
    }

    /// Bytes available to an unprivileged writer (`statvfs`'s `f_bavail`).
    pub fn available_bytes(&self) -> u64 {
        let c = std::ffi::CString::new(self.path.as_os_str().as_encoded_bytes()).unwrap();
        let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid C string and `vfs` a valid out-pointer.
        let rc = unsafe { libc::statvfs(c.as_ptr(), &mut vfs) };
        assert_eq!(rc, 0, "statvfs {}", self.path.display());
        vfs.f_bavail * vfs.f_frsize
    }

    /// Takes the space (a ballast file of zeros) until at most `free_bytes` are left.
    pub fn fill_leaving(&self, free_bytes: u64) {
        let mut ballast = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.ballast)
            .unwrap_or_else(|e| panic!("{}: {e}", self.ballast.display()));
        let chunk = vec![0u8; 64 * 1024];
        while self.available_bytes() > free_bytes {
            let n = (self.available_bytes() - free_bytes).min(chunk.len() as u64) as usize;
            ballast.write_all(&chunk[..n]).expect("write the ballast");
            ballast.sync_data().expect("sync the ballast");
        }
    }

    /// Frees what [`SmallFs::fill_leaving`] took.
    pub fn free(&self) {
        std::fs::remove_file(&self.ballast)
            .unwrap_or_else(|e| panic!("{}: {e}", self.ballast.display()));
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let out = Command::new("umount")
            .arg("--lazy")
            .arg(&self.path)
            .output();
        if !matches!(&out, Ok(o) if o.status.success()) {
            eprintln!("umount {}: {out:?}", self.path.display());
        }
    }
}
