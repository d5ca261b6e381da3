//! The file's schema. Field docs are the reference; deploy/chpart.example.toml shows each one.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The config file as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// The ClickHouse server the loads go into.
    pub clickhouse: RawClickHouse,
    /// How executors reach the server's filesystem.
    pub transport: RawTransport,
    /// SSH settings; required when `transport.kind = "sftp"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssh: Option<RawSsh>,
    /// The clickhouse-local used to build parts.
    pub clickhouse_local: RawClickHouseLocal,
    /// Where parts are staged on the server's filesystem before they are published.
    pub staging: RawStaging,
    /// Where the durable record of loads lives.
    #[serde(default)]
    pub ledger: RawLedger,
    /// Per-host settings for the shards of a cluster, where what `begin` discovers (host names
    /// and HTTP ports from `system.clusters`) is not how this machine reaches them.
    #[serde(default)]
    pub hosts: Vec<RawHost>,
    /// How long transient faults are retried.
    #[serde(default)]
    pub retry: RawRetry,
}

/// `[retry]`: transient faults (connection refused or reset, no answer, DNS failure, a
/// retryable `Code: N`) are retried with exponential backoff and full jitter, for steps that are
/// safe to repeat (reads, ledger writes, DDL that checks before it acts, SFTP connects, one
/// part's upload). `ATTACH PART`, `MOVE PARTITION` and publishing renames are never resent:
/// after an unclear outcome chpart reads back what happened.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    /// No retry of a step starts later than this many seconds after its first try; 0 turns
    /// retries off. Default 30. Example: `deadline_secs = 120` (env `CHPART_RETRY_DEADLINE_SECS`).
    #[serde(default = "default_retry_deadline_secs")]
    pub deadline_secs: u64,
}

impl Default for RawRetry {
    fn default() -> RawRetry {
        RawRetry {
            deadline_secs: default_retry_deadline_secs(),
        }
    }
}

fn default_retry_deadline_secs() -> u64 {
    30
}

/// `[[hosts]]`: how to reach one host of a cluster. Every key but `name` is optional; an unset
/// one falls back to the discovered value or to the `[ssh]` / `[staging]` setting.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHost {
    /// The host as the cluster names it (`system.clusters.host_name`), e.g. `ch-2.dc1`.
    pub name: String,
    /// Its HTTP endpoint. Default: `http://<name>:<its http_port>` (the port as the server
    /// itself reports it, asked through the cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The SSH host name or address. Default: `name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssh_host: Option<String>,
    /// The SSH port. Default: `ssh.port`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssh_port: Option<u16>,
    /// The private key file for this host. Default: `ssh.identity_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity_file: Option<PathBuf>,
    /// The known_hosts file for this host. Default: `ssh.known_hosts`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub known_hosts: Option<PathBuf>,
    /// The staging root on this host for tables on one disk. Default: `staging.root`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staging_root: Option<String>,
}

/// `[clickhouse]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawClickHouse {
    /// HTTP endpoint, e.g. `http://127.0.0.1:8123`.
    pub url: String,
    /// User name. Default `default`.
    #[serde(default = "default_user")]
    pub user: String,
    /// File whose content (trailing newline trimmed) is the password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// Environment variable holding the password. Default `CHPART_CLICKHOUSE_PASSWORD`; when it
    /// is unset and no file is named, the user has no password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
    /// Upper bound on one statement, in seconds. Default 300.
    #[serde(default = "default_request_timeout_secs")]
    pub request_timeout_secs: u64,
    /// The host name recorded in manifests and the ledger. Default: the URL's host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_name: Option<String>,
}

/// `[transport]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTransport {
    /// `sftp` (the server is another host) or `local` (the server's data directory is on this
    /// machine, e.g. the quickstart's embedded server).
    pub kind: TransportKind,
}

/// How parts reach the server's filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// SFTP over SSH (ssh2), host key always verified.
    Sftp,
    /// Plain filesystem calls on this machine.
    Local,
}

/// `[ssh]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSsh {
    /// Host name or address of the ClickHouse server's SSH daemon.
    pub host: String,
    /// Port. Default 22.
    #[serde(default = "default_ssh_port")]
    pub port: u16,
    /// Login user; must be the user the ClickHouse server runs as (it must own published parts).
    pub user: String,
    /// Private key file. Either this or `use_agent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity_file: Option<PathBuf>,
    /// Authenticate with the SSH agent (`SSH_AUTH_SOCK`). Default false.
    #[serde(default)]
    pub use_agent: bool,
    /// known_hosts file the host key is verified against (always; there is no way to skip it).
    pub known_hosts: PathBuf,
    /// TCP connect and handshake timeout, in seconds. Default 15.
    #[serde(default = "default_connect_timeout_secs")]
    pub connect_timeout_secs: u64,
    /// SFTP write size, in KiB. Default 256 (large writes let libssh2 pipeline).
    #[serde(default = "default_write_buffer_kib")]
    pub write_buffer_kib: usize,
    /// SSH connections a build uploads parts over in parallel. Default 2.
    #[serde(default = "default_upload_connections")]
    pub upload_connections: usize,
    /// SSH connections `commit` reads waiting parts back over in parallel, when it has at
    /// least 16 to verify. Default 4.
    #[serde(default = "default_verify_connections")]
    pub verify_connections: usize,
}

/// `[clickhouse_local]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawClickHouseLocal {
    /// The clickhouse-local command: a path or a name on PATH, then any arguments, separated by
    /// spaces (a path with a space in it needs a symlink). A relative path resolves in the
    /// working directory of the build, e.g. `ch/clickhouse local` after Spark's
    /// `--archives clickhouse.tgz#ch`. It must be no newer than the server.
    pub command: String,
    /// Local directory under which each attempt gets its own work directory. Default: the
    /// system temp directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_dir: Option<PathBuf>,
    /// Upper bound on one clickhouse-local run, in seconds. Default 3600.
    #[serde(default = "default_build_timeout_secs")]
    pub timeout_secs: u64,
    /// An Arrow stream input (`build --input -`) is spooled into the work directory in chunks
    /// of about this many MiB, each built by its own clickhouse-local run while the next is
    /// written, so the work directory holds at most two chunks. Default 1024 (what one INSERT
    /// squashes into one block, so chunks add no parts). Example: `spool_chunk_mib = 256`.
    #[serde(default = "default_spool_chunk_mib")]
    pub spool_chunk_mib: u64,
    /// Merge each partition a build wrote as several parts (one per 1 GiB block of input: per
    /// spooled chunk of a stream, per Parquet file, two for a large file) into one part before
    /// shipping, on the executor, so the server has none of the build's parts to merge;
    /// partitions the build wrote as one part are shipped as built. Default false (the merge
    /// costs the build about what the server's merge would: 10M rows, 1.2 GB, 14 s became 20 s).
    /// `build --merge` merges every partition.
    #[serde(default)]
    pub merge_split_partitions: bool,
}

/// `[staging]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawStaging {
    /// Absolute path on the server's filesystem, on the same filesystem as the table's data path
    /// (publishing is a rename into `detached/`), e.g. `/var/lib/clickhouse/chpart-staging`.
    /// Used for tables stored on one disk.
    pub root: String,
    /// For tables on several disks (a storage policy with a JBOD volume): the staging root on
    /// each disk's filesystem, by disk name (`system.disks.name`), e.g.
    /// `{ disk2 = "/mnt/disk2/clickhouse/chpart-staging" }`. A disk not listed stages under
    /// `<its path>/chpart-staging` (`system.disks.path`). Default: none listed.
    #[serde(default)]
    pub disk_roots: BTreeMap<String, String>,
}

/// `[ledger]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLedger {
    /// Database holding the ledger table; created on first use. Default `chpart`.
    #[serde(default = "default_ledger_database")]
    pub database: String,
}

impl Default for RawLedger {
    fn default() -> Self {
        RawLedger {
            database: default_ledger_database(),
        }
    }
}

fn default_user() -> String {
    "default".into()
}
fn default_request_timeout_secs() -> u64 {
    300
}
fn default_ssh_port() -> u16 {
    22
}
fn default_connect_timeout_secs() -> u64 {
    15
}
fn default_write_buffer_kib() -> usize {
    256
}
fn default_upload_connections() -> usize {
    2
}
fn default_verify_connections() -> usize {
    4
}
fn default_spool_chunk_mib() -> u64 {
    1024
}

fn default_build_timeout_secs() -> u64 {
    3600
}
fn default_ledger_database() -> String {
    "chpart".into()
}
