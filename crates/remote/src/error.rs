//! Errors of remote filesystem operations, in the protocol's terms.
//!
//! Backends translate their native failures (errno, SFTP status codes,
//! libssh2 session codes) into these variants, so the publisher reacts to
//! "the name is taken" or "the host key changed" without knowing the
//! transport. Every message names where the operation ran (`at`: the
//! backend's [`describe`](crate::RemoteFs::describe), which carries the host
//! for SFTP), the path and the operation.

use std::io;
use std::path::PathBuf;

/// libssh2 session-level codes that mean the connection or the peer failed
/// rather than the request: retrying on a new connection can succeed.
const TRANSIENT_SESSION_CODES: &[i32] = &[
    -1,  // LIBSSH2_ERROR_SOCKET_NONE
    -2,  // LIBSSH2_ERROR_BANNER_RECV
    -3,  // LIBSSH2_ERROR_BANNER_SEND
    -7,  // LIBSSH2_ERROR_SOCKET_SEND
    -9,  // LIBSSH2_ERROR_TIMEOUT
    -13, // LIBSSH2_ERROR_SOCKET_DISCONNECT
    -26, // LIBSSH2_ERROR_CHANNEL_CLOSED
    -27, // LIBSSH2_ERROR_CHANNEL_EOF_SENT
    -30, // LIBSSH2_ERROR_SOCKET_TIMEOUT
    -37, // LIBSSH2_ERROR_EAGAIN
    -43, // LIBSSH2_ERROR_SOCKET_RECV
];

/// SFTP status codes that report a lost connection, not a refused request.
const SFTP_NO_CONNECTION: i32 = 6;
const SFTP_CONNECTION_LOST: i32 = 7;

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{op} {path} on {at}: already exists")]
    AlreadyExists {
        at: String,
        op: &'static str,
        path: String,
    },

    #[error("{op} {path} on {at}: no such file or directory")]
    NotFound {
        at: String,
        op: &'static str,
        path: String,
    },

    #[error("{op} {path} on {at}: permission denied")]
    PermissionDenied {
        at: String,
        op: &'static str,
        path: String,
    },

    /// The rename crossed filesystems (certain on the local backend; over SFTP
    /// the most likely reading of a generic failure, as `detail` says).
    #[error("rename {from} -> {to} on {at} failed: {detail}")]
    CrossDevice {
        at: String,
        from: String,
        to: String,
        detail: String,
    },

    #[error(
        "host key of {host}:{port} does not match the key recorded for `{}` in {}: refusing to connect \
         (a man-in-the-middle, or the host was reinstalled: verify the new fingerprint out of band, then update the file)",
        known_hosts_name(host, *port), known_hosts.display()
    )]
    HostKeyMismatch {
        host: String,
        port: u16,
        known_hosts: PathBuf,
    },

    #[error(
        "host {host}:{port} is not listed as `{}` in {}: refusing to connect to an unverified host \
         (after checking its fingerprint, add it, e.g. with `ssh-keyscan -p {port} {host} >> {}`)",
        known_hosts_name(host, *port), known_hosts.display(), known_hosts.display()
    )]
    HostKeyUnknown {
        host: String,
        port: u16,
        known_hosts: PathBuf,
    },

    #[error("cannot use known_hosts file {} for {host}:{port}: {detail}", known_hosts.display())]
    KnownHosts {
        host: String,
        port: u16,
        known_hosts: PathBuf,
        detail: String,
    },

    #[error("cannot connect to {host}:{port}: {source}")]
    Connect {
        host: String,
        port: u16,
        #[source]
        source: io::Error,
    },

    #[error("SSH handshake with {host}:{port} failed: {message} (libssh2 code {code})")]
    Handshake {
        host: String,
        port: u16,
        code: i32,
        message: String,
    },

    #[error("authentication as {user} to {host}:{port} failed: {detail}")]
    Auth {
        user: String,
        host: String,
        port: u16,
        detail: String,
    },

    #[error("{op} {path} on {at}: {source}")]
    Io {
        at: String,
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },

    /// An SFTP status without a more specific variant (see `code`, SSH_FX_*).
    #[error("{op} {path} on {at}: SFTP status {code} ({message})")]
    Sftp {
        at: String,
        op: &'static str,
        path: String,
        code: i32,
        message: String,
    },

    /// A libssh2 session-level failure during an operation (`code`,
    /// LIBSSH2_ERROR_*); after a transport failure the connection is unusable.
    #[error("{op} {path} on {at}: SSH session error {code} ({message})")]
    Session {
        at: String,
        op: &'static str,
        path: String,
        code: i32,
        message: String,
    },

    /// The filesystem holding `path` is full: ENOSPC or EDQUOT on the local backend; over
    /// SFTP (whose servers report ENOSPC as a generic failure) a failed write on a filesystem
    /// that reports less space available than one write needs. Not transient: retrying
    /// cannot succeed until someone frees space.
    #[error(
        "{op} {path} on {at}: no space left on device{}",
        available_bytes.map(|b| format!(" ({b} bytes available on its filesystem)")).unwrap_or_default()
    )]
    NoSpace {
        at: String,
        op: &'static str,
        path: String,
        /// What the filesystem reported available after the failure, when it could be asked.
        available_bytes: Option<u64>,
    },

    /// The remote state contradicts what the operation just did or requires:
    /// an uploaded file with the wrong size, an entry that is neither file nor
    /// directory, metadata the server did not send.
    #[error("{op} {path} on {at}: {detail}")]
    Unexpected {
        at: String,
        op: &'static str,
        path: String,
        detail: String,
    },
}

impl RemoteError {
    /// Whether retrying the operation (on a new connection) may succeed:
    /// unreachable hosts, timeouts and broken sessions are transient; refusals
    /// (authentication, host key, permission, existing or missing paths) and
    /// contradictions are permanent.
    pub fn is_transient(&self) -> bool {
        match self {
            RemoteError::Connect { .. } => true,
            RemoteError::Handshake { code, .. } | RemoteError::Session { code, .. } => {
                is_transient_session_code(*code)
            }
            RemoteError::Sftp { code, .. } => {
                *code == SFTP_NO_CONNECTION || *code == SFTP_CONNECTION_LOST
            }
            RemoteError::Io { source, .. } => matches!(
                source.kind(),
                io::ErrorKind::TimedOut
                    | io::ErrorKind::Interrupted
                    | io::ErrorKind::WouldBlock
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
            ),
            RemoteError::AlreadyExists { .. }
            | RemoteError::NotFound { .. }
            | RemoteError::PermissionDenied { .. }
            | RemoteError::CrossDevice { .. }
            | RemoteError::HostKeyMismatch { .. }
            | RemoteError::HostKeyUnknown { .. }
            | RemoteError::KnownHosts { .. }
            | RemoteError::Auth { .. }
            | RemoteError::NoSpace { .. }
            | RemoteError::Unexpected { .. } => false,
        }
    }
}

pub(crate) fn is_transient_session_code(code: i32) -> bool {
    TRANSIENT_SESSION_CODES.contains(&code)
}

/// The host name as OpenSSH writes it in known_hosts: bare for port 22,
/// `[host]:port` otherwise.
pub(crate) fn known_hosts_name(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_location_path_and_operation() {
        let e = RemoteError::PermissionDenied {
            at: "sftp://ch@db1:2222".into(),
            op: "rename",
            path: "/var/lib/clickhouse/detached/x".into(),
        };
        assert_eq!(
            e.to_string(),
            "rename /var/lib/clickhouse/detached/x on sftp://ch@db1:2222: permission denied"
        );
        let e = RemoteError::HostKeyUnknown {
            host: "db1".into(),
            port: 2222,
            known_hosts: "/etc/chpart/known_hosts".into(),
        };
        let msg = e.to_string();
        assert!(
            msg.contains("[db1]:2222") && msg.contains("/etc/chpart/known_hosts"),
            "{msg}"
        );
    }

    #[test]
    fn classification_separates_retryable_from_refusals() {
        let connect = RemoteError::Connect {
            host: "h".into(),
            port: 22,
            source: io::Error::from(io::ErrorKind::ConnectionRefused),
        };
        assert!(connect.is_transient());
        let timeout = RemoteError::Session {
            at: "a".into(),
            op: "read",
            path: "p".into(),
            code: -9,
            message: "timed out".into(),
        };
        assert!(timeout.is_transient());
        let lost = RemoteError::Sftp {
            at: "a".into(),
            op: "read",
            path: "p".into(),
            code: SFTP_CONNECTION_LOST,
            message: "connection lost".into(),
        };
        assert!(lost.is_transient());
        let kex = RemoteError::Handshake {
            host: "h".into(),
            port: 22,
            code: -5,
            message: "kex failure".into(),
        };
        assert!(!kex.is_transient());
        let auth = RemoteError::Auth {
            user: "u".into(),
            host: "h".into(),
            port: 22,
            detail: "denied".into(),
        };
        assert!(!auth.is_transient());
        let exists = RemoteError::AlreadyExists {
            at: "a".into(),
            op: "rename",
            path: "p".into(),
        };
        assert!(!exists.is_transient());
        let full = RemoteError::NoSpace {
            at: "sftp://ch@db1:22".into(),
            op: "write",
            path: "/var/lib/clickhouse/chpart-staging/l/a/parts/p/data.bin".into(),
            available_bytes: Some(0),
        };
        assert!(!full.is_transient(), "nothing frees the space by retrying");
        assert_eq!(
            full.to_string(),
            "write /var/lib/clickhouse/chpart-staging/l/a/parts/p/data.bin on sftp://ch@db1:22: \
             no space left on device (0 bytes available on its filesystem)"
        );
    }

    #[test]
    fn enospc_on_the_local_backend_is_no_space() {
        let e = crate::local::map_io(
            "write",
            "/staging/x",
            io::Error::from_raw_os_error(libc::ENOSPC),
        );
        assert!(matches!(e, RemoteError::NoSpace { .. }), "{e:?}");
        assert!(e.to_string().ends_with("no space left on device"), "{e}");
    }

    #[test]
    fn known_hosts_name_is_bracketed_except_on_port_22() {
        assert_eq!(known_hosts_name("db1", 22), "db1");
        assert_eq!(known_hosts_name("127.0.0.1", 2222), "[127.0.0.1]:2222");
    }
}
