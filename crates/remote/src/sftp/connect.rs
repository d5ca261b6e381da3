//! Opening a connection: TCP, the host key checked against known_hosts, authentication (key
//! file, then ssh-agent), the SFTP subsystem.

use std::fs;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::Duration;

use ssh2::{CheckResult, ErrorCode, KnownHostFileKind, MethodType, Session};

use super::{Conn, SftpConfig, SftpFs, LIBSSH2_ERROR_SFTP_PROTOCOL};
use crate::error::{is_transient_session_code, known_hosts_name};
use crate::RemoteError;

/// libssh2 codes that mean the server turned the credentials down (as
/// opposed to the connection failing during authentication).
const AUTH_REFUSED_CODES: &[i32] = &[
    -16, // LIBSSH2_ERROR_FILE: the identity file cannot be read or parsed
    -18, // LIBSSH2_ERROR_AUTHENTICATION_FAILED
    -19, // LIBSSH2_ERROR_PUBLICKEY_UNVERIFIED
    -42, // LIBSSH2_ERROR_AGENT_PROTOCOL
    -48, // LIBSSH2_ERROR_KEYFILE_AUTH_FAILED
];

fn secs_to_ms(secs: u64) -> u32 {
    u32::try_from(secs.saturating_mul(1000)).unwrap_or(u32::MAX)
}

impl SftpFs {
    /// Connects, verifies the host key against `cfg.known_hosts`,
    /// authenticates and starts the SFTP subsystem.
    pub fn connect(cfg: &SftpConfig) -> Result<SftpFs, RemoteError> {
        let host = cfg.host.clone();
        let port = cfg.port;
        let handshake_err = |context: &str, e: ssh2::Error| RemoteError::Handshake {
            host: host.clone(),
            port,
            code: session_code(&e),
            message: format!("{context}: {}", e.message()),
        };

        let known_hosts_text =
            fs::read_to_string(&cfg.known_hosts).map_err(|e| RemoteError::KnownHosts {
                host: host.clone(),
                port,
                known_hosts: cfg.known_hosts.clone(),
                detail: e.to_string(),
            })?;
        if known_hosts_text
            .lines()
            .any(|l| l.trim_start().starts_with("@revoked"))
        {
            // libssh2 cannot honour revocations; ignoring one could accept a revoked key.
            return Err(RemoteError::KnownHosts {
                host,
                port,
                known_hosts: cfg.known_hosts.clone(),
                detail: "@revoked entries are not supported; keep them out of the file chpart uses"
                    .into(),
            });
        }

        let tcp = connect_tcp(
            &host,
            port,
            Duration::from_secs(cfg.connect_timeout_secs.max(1)),
        )?;
        let mut session = Session::new().map_err(|e| handshake_err("create session", e))?;
        session.set_tcp_stream(tcp);
        session.set_timeout(secs_to_ms(cfg.connect_timeout_secs.max(1)));

        let name = known_hosts_name(&host, port);
        let types = hostkey_methods_for(&known_hosts_text, &name);
        if !types.is_empty() {
            if let Err(e) = session.method_pref(MethodType::HostKey, &types.join(",")) {
                // Not fatal: negotiation falls back to libssh2's order and the
                // known_hosts check below still decides.
                tracing::debug!(%name, error = %e, "host key algorithms from known_hosts not accepted by libssh2");
            }
        }
        session
            .handshake()
            .map_err(|e| handshake_err("handshake", e))?;

        verify_host_key(&session, cfg, &known_hosts_text)?;
        authenticate(&session, cfg)?;

        session.set_timeout(secs_to_ms(cfg.io_timeout_secs));
        let sftp = session
            .sftp()
            .map_err(|e| handshake_err("start the SFTP subsystem", e))?;
        let at = describe(cfg);
        tracing::debug!(%at, "sftp connected");
        Ok(SftpFs {
            at,
            buffer_bytes: cfg.write_buffer_bytes.max(4096),
            conn: Mutex::new(Conn {
                session,
                sftp,
                broken: None,
            }),
        })
    }
}

fn describe(cfg: &SftpConfig) -> String {
    if cfg.host.contains(':') {
        format!("sftp://{}@[{}]:{}", cfg.user, cfg.host, cfg.port)
    } else {
        format!("sftp://{}@{}:{}", cfg.user, cfg.host, cfg.port)
    }
}

fn session_code(e: &ssh2::Error) -> i32 {
    match e.code() {
        ErrorCode::Session(c) => c,
        ErrorCode::SFTP(_) => LIBSSH2_ERROR_SFTP_PROTOCOL,
    }
}

fn connect_tcp(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, RemoteError> {
    let connect_err = |source: io::Error| RemoteError::Connect {
        host: host.to_string(),
        port,
        source,
    };
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(connect_err)?
        .collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "host name resolved to no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(tcp) => {
                // SFTP is request/response; Nagle would delay the small requests.
                let _ = tcp.set_nodelay(true);
                return Ok(tcp);
            }
            Err(e) => last = e,
        }
    }
    Err(connect_err(last))
}

/// libssh2 host key method names for the key types `known_hosts` lists under
/// `name` (plain entries only: hashed ones do not reveal their host), in file order.
fn hostkey_methods_for(known_hosts: &str, name: &str) -> Vec<&'static str> {
    let mut methods: Vec<&'static str> = Vec::new();
    for line in known_hosts.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('@') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(patterns), Some(key_type)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !patterns.split(',').any(|p| p == name) {
            continue;
        }
        let names: &[&'static str] = match key_type {
            "ssh-ed25519" => &["ssh-ed25519"],
            "ecdsa-sha2-nistp256" => &["ecdsa-sha2-nistp256"],
            "ecdsa-sha2-nistp384" => &["ecdsa-sha2-nistp384"],
            "ecdsa-sha2-nistp521" => &["ecdsa-sha2-nistp521"],
            "ssh-rsa" => &["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"],
            _ => &[],
        };
        for m in names {
            if !methods.contains(m) {
                methods.push(m);
            }
        }
    }
    methods
}

fn verify_host_key(
    session: &Session,
    cfg: &SftpConfig,
    known_hosts_text: &str,
) -> Result<(), RemoteError> {
    let host = cfg.host.clone();
    let port = cfg.port;
    let kh_err = |detail: String| RemoteError::KnownHosts {
        host: host.clone(),
        port,
        known_hosts: cfg.known_hosts.clone(),
        detail,
    };
    let mut known = session.known_hosts().map_err(|e| kh_err(e.to_string()))?;
    // Line by line so one entry libssh2 cannot parse (e.g. a security-key
    // type) does not make the whole file unusable.
    for (n, line) in known_hosts_text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if let Err(e) = known.read_str(trimmed, KnownHostFileKind::OpenSSH) {
            tracing::debug!(file = %cfg.known_hosts.display(), line = n + 1, error = %e, "skipping known_hosts line libssh2 cannot parse");
        }
    }
    let (key, _) = session
        .host_key()
        .ok_or_else(|| kh_err("the server sent no host key".into()))?;
    // check() with the OpenSSH-style name (not check_port): libssh2's
    // check_port also accepts a plain `host` entry for a non-22 port, which
    // OpenSSH does not.
    match known.check(&known_hosts_name(&host, port), key) {
        CheckResult::Match => Ok(()),
        CheckResult::Mismatch => Err(RemoteError::HostKeyMismatch {
            host,
            port,
            known_hosts: cfg.known_hosts.clone(),
        }),
        CheckResult::NotFound => Err(RemoteError::HostKeyUnknown {
            host,
            port,
            known_hosts: cfg.known_hosts.clone(),
        }),
        CheckResult::Failure => Err(kh_err("libssh2 failed to check the host key".into())),
    }
}

fn authenticate(session: &Session, cfg: &SftpConfig) -> Result<(), RemoteError> {
    let auth_err = |detail: String| RemoteError::Auth {
        user: cfg.user.clone(),
        host: cfg.host.clone(),
        port: cfg.port,
        detail,
    };
    let classify = |what: String, e: ssh2::Error| -> RemoteError {
        let code = session_code(&e);
        if AUTH_REFUSED_CODES.contains(&code) || !is_transient_session_code(code) {
            auth_err(format!("{what}: {}", e.message()))
        } else {
            RemoteError::Handshake {
                host: cfg.host.clone(),
                port: cfg.port,
                code,
                message: format!(
                    "connection failed during authentication ({what}): {}",
                    e.message()
                ),
            }
        }
    };
    let mut refusals = Vec::new();
    if let Some(key) = &cfg.identity_file {
        // Only the path is ever reported, never key material.
        match session.userauth_pubkey_file(&cfg.user, None, key, None) {
            Ok(()) if session.authenticated() => return Ok(()),
            Ok(()) => refusals.push(format!("key {} not accepted", key.display())),
            Err(e) => {
                let err = classify(format!("key {}", key.display()), e);
                if !matches!(err, RemoteError::Auth { .. }) {
                    return Err(err);
                }
                refusals.push(err_detail(err));
            }
        }
    }
    if cfg.use_agent {
        match session.userauth_agent(&cfg.user) {
            Ok(()) if session.authenticated() => return Ok(()),
            Ok(()) => refusals.push("no ssh-agent key accepted".into()),
            Err(e) => {
                let err = classify("ssh-agent".into(), e);
                if !matches!(err, RemoteError::Auth { .. }) {
                    return Err(err);
                }
                refusals.push(err_detail(err));
            }
        }
    }
    if refusals.is_empty() {
        return Err(auth_err(
            "no credentials configured: set an identity file or enable the ssh-agent".into(),
        ));
    }
    Err(auth_err(refusals.join("; ")))
}

fn err_detail(e: RemoteError) -> String {
    match e {
        RemoteError::Auth { detail, .. } => detail,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostkey_methods_follow_the_entries_for_this_host_only() {
        let file = "\
# comment
[db1]:2222 ssh-ed25519 AAAA1
db1 ecdsa-sha2-nistp256 AAAA2
other,[db1]:2222 ssh-rsa AAAA3
[db1]:2200 ecdsa-sha2-nistp384 AAAA4
@cert-authority [db1]:2222 ssh-ed25519 AAAA5
|1|c2FsdA==|aGFzaA== ecdsa-sha2-nistp521 AAAA6
";
        assert_eq!(
            hostkey_methods_for(file, "[db1]:2222"),
            vec!["ssh-ed25519", "rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]
        );
        assert_eq!(
            hostkey_methods_for(file, "db1"),
            vec!["ecdsa-sha2-nistp256"]
        );
        assert!(hostkey_methods_for(file, "db2").is_empty());
    }

    #[test]
    fn describe_brackets_ipv6_hosts() {
        let cfg = SftpConfig::new("::1", 22, "ch", "/kh");
        assert_eq!(describe(&cfg), "sftp://ch@[::1]:22");
        let cfg = SftpConfig::new("db1", 2222, "ch", "/kh");
        assert_eq!(describe(&cfg), "sftp://ch@db1:2222");
    }
}
