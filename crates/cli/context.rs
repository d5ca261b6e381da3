//! What every command works with, made once from the validated config: the servers (the
//! ledger's and each host's, with retries), how each host's filesystem is reached, the staging
//! roots, clickhouse-local, the async runtime; the executor's context for builds and the
//! driver's for commit, abort, status and gc.

use std::sync::Arc;

use anyhow::Context;
use chpart_config::{Config, HostSettings, Transport};
use chpart_core::retry::RetryPolicy;
use chpart_core::{RemotePath, StagingLayout, StagingRoots};
use chpart_protocol::build::{BuildEnv, LedgerDirectory};
use chpart_protocol::reach::Reach;
use chpart_protocol::store::Ledger;
use chpart_protocol::FailureKind;
use chpart_remote::retry::{Connector, Reconnecting};
use chpart_remote::{LocalFs, RemoteError, RemoteFs, SftpConfig, SftpFs};
use chpart_server::retry::Retrying;
use chpart_server::{Secret, Server, ServerConfig, SharedServer};

use crate::args::ConfigArg;
use crate::exit::Failure;

/// The command this process runs (`begin`, `build`, ...), named in the `User-Agent` of every
/// statement it sends (`chpart-build/0.1.0 ...` in `system.query_log.http_user_agent`).
static COMMAND: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Records the command this process runs; called once, by `main`.
pub fn set_command(command: &'static str) {
    let _ = COMMAND.set(command);
}

pub fn usage(e: impl Into<anyhow::Error>) -> Failure {
    Failure::new(FailureKind::Usage, e)
}

pub fn load_config(arg: &ConfigArg) -> Result<Config, Failure> {
    Config::load(arg.config.as_deref(), std::env::vars()).map_err(usage)
}

/// The configured clickhouse-local.
pub fn local_command(config: &Config) -> chpart_build::LocalCommand {
    let local = &config.clickhouse_local;
    chpart_build::LocalCommand::new(&local.command, local.timeout).with_args(&local.args)
}

/// The ledger's server (`[clickhouse] url`).
pub fn server_of(config: &Config) -> SharedServer {
    server_at(config, &config.clickhouse.url)
}

/// The server at `url`, with the configured user, password and timeout; transient faults of
/// what may be repeated are retried within `[retry] deadline_secs`.
pub fn server_at(config: &Config, url: &str) -> SharedServer {
    let ch = &config.clickhouse;
    let server = Server::new(&ServerConfig {
        url: url.to_owned(),
        user: ch.user.clone(),
        password: ch.password.as_ref().map(|p| Secret::new(p.expose())),
        request_timeout: ch.request_timeout,
    });
    let product = format!("chpart-{}", COMMAND.get().copied().unwrap_or("cli"));
    let server = Arc::new(server.identified_as(&product, env!("CARGO_PKG_VERSION")));
    Arc::new(Retrying::new(
        server,
        RetryPolicy::within(config.retry_deadline),
    ))
}

pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the async runtime")
        .map_err(|e| Failure::new(FailureKind::Permanent, e))
}

/// This host's clickhouse-local version, recorded by `begin` for operators. The driver need
/// not have one (executors build), so failing to run it is only logged.
pub fn local_version(config: &Config) -> Option<String> {
    match local_command(config).identify() {
        Ok(id) => Some(id.version),
        Err(e) => {
            tracing::warn!("not recording a clickhouse-local version: {e}");
            None
        }
    }
}

/// The config's staging roots, as `begin` resolves them per disk.
pub fn staging_roots(config: &Config) -> Result<StagingRoots, Failure> {
    let path = |key: &str, p: &str| {
        RemotePath::new(p)
            .with_context(|| key.to_owned())
            .map_err(usage)
    };
    Ok(StagingRoots {
        single: path("staging.root", &config.staging_root)?,
        per_disk: config
            .staging_disk_roots
            .iter()
            .map(|(disk, root)| {
                Ok((
                    disk.clone(),
                    path(&format!("staging.disk_roots.{disk}"), root)?,
                ))
            })
            .collect::<Result<_, Failure>>()?,
    })
}

/// The configured server's filesystem.
pub fn remote_fs(config: &Config) -> Result<Arc<dyn RemoteFs>, Failure> {
    let reach = ConfigReach::new(config.clone());
    let host = config.clickhouse.host_name.clone();
    let mut connections = reach.connect(&host, 1).map_err(remote_failure)?;
    Ok(connections.remove(0))
}

pub fn remote_failure(e: RemoteError) -> Failure {
    let kind = if e.is_transient() {
        FailureKind::Retryable
    } else {
        FailureKind::Permanent
    };
    Failure::new(kind, e)
}

/// How chpart reaches every host from this config: the configured server (`[clickhouse]`,
/// `[ssh]`, `[staging]`) and, for the shards of a cluster, the same settings with each host's
/// `[[hosts]]` overrides.
pub struct ConfigReach {
    config: Config,
}

impl ConfigReach {
    pub fn new(config: Config) -> ConfigReach {
        ConfigReach { config }
    }

    fn host(&self, host: &str) -> HostSettings {
        self.config.hosts.get(host).cloned().unwrap_or_default()
    }
}

impl Reach for ConfigReach {
    fn server(&self, url: &str) -> SharedServer {
        server_at(&self.config, url)
    }

    fn connect(
        &self,
        host: &str,
        connections: usize,
    ) -> Result<Vec<Arc<dyn RemoteFs>>, RemoteError> {
        let ssh = match &self.config.transport {
            // The server's data directory is on this machine: every host's is (tests, the
            // embedded quickstart), and moving beats copying.
            Transport::Local => return Ok(vec![Arc::new(LocalFs::new())]),
            Transport::Sftp(ssh) => ssh,
        };
        let over = self.host(host);
        // The configured server's SSH host is `[ssh].host`; any other host is reached by its
        // own name unless `[[hosts]]` says otherwise.
        let ssh_host = over.ssh_host.clone().unwrap_or_else(|| {
            if host == self.config.clickhouse.host_name {
                ssh.host.clone()
            } else {
                host.to_owned()
            }
        });
        let mut cfg = SftpConfig::new(
            &ssh_host,
            over.ssh_port.unwrap_or(ssh.port),
            &ssh.user,
            over.known_hosts.as_ref().unwrap_or(&ssh.known_hosts),
        );
        cfg.identity_file = over
            .identity_file
            .clone()
            .or_else(|| ssh.identity_file.clone());
        cfg.use_agent = ssh.use_agent;
        cfg.connect_timeout_secs = ssh.connect_timeout.as_secs();
        cfg.write_buffer_bytes = ssh.write_buffer_bytes;
        let policy = RetryPolicy::within(self.config.retry_deadline);
        // As many as asked (each caller asks for what its config says: `upload_connections`
        // for a build, `verify_connections` for a commit's verification), at most 16.
        // Each connection's handshake is a few round trips: opened side by side.
        std::thread::scope(|scope| {
            let opening: Vec<_> = (0..connections.clamp(1, 16))
                .map(|_| {
                    let cfg = cfg.clone();
                    scope.spawn(move || {
                        let connector: Connector =
                            Box::new(move || SftpFs::connect(&cfg).map(|fs| Arc::new(fs) as _));
                        Reconnecting::connect(connector, policy).map(|fs| Arc::new(fs) as _)
                    })
                })
                .collect();
            opening
                .into_iter()
                .map(|t| t.join().expect("connecting does not panic"))
                .collect()
        })
    }

    fn staging(&self, host: &str) -> StagingRoots {
        let single = self
            .host(host)
            .staging_root
            .unwrap_or_else(|| self.config.staging_root.clone());
        StagingRoots {
            single: RemotePath::new(&single).expect("the config validated staging roots"),
            per_disk: self
                .config
                .staging_disk_roots
                .iter()
                .map(|(disk, root)| {
                    (
                        disk.clone(),
                        RemotePath::new(root).expect("the config validated staging roots"),
                    )
                })
                .collect(),
        }
    }

    fn url(&self, host: &str) -> Option<String> {
        self.host(host).url
    }
}

/// What builds on this machine work with, from the config: the ledger (for the load's spec
/// and fencing), clickhouse-local, the work and staging places and how hosts are reached.
/// Shared by the attempts of one process (`chpart load` runs several at once).
pub struct Executor {
    /// The runtime `loads` reads the ledger on (kept alive with it).
    _rt: tokio::runtime::Runtime,
    loads: LedgerDirectory,
    reach: ConfigReach,
    local: chpart_build::LocalCommand,
    connections: usize,
    work_parent: std::path::PathBuf,
    staging: StagingLayout,
    spool_chunk_bytes: u64,
    merge_split_partitions: bool,
}

impl Executor {
    pub fn new(config: Config) -> Result<Executor, Failure> {
        let staging = StagingLayout::new(&config.staging_root)
            .context("staging.root")
            .map_err(usage)?;
        let rt = runtime()?;
        let loads = LedgerDirectory {
            ledger: Ledger::new(server_of(&config), &config.ledger_database),
            runtime: rt.handle().clone(),
        };
        Ok(Executor {
            _rt: rt,
            loads,
            connections: match &config.transport {
                Transport::Sftp(ssh) => ssh.upload_connections,
                Transport::Local => 1,
            },
            local: local_command(&config),
            work_parent: config.clickhouse_local.work_dir.clone(),
            spool_chunk_bytes: config.clickhouse_local.spool_chunk_bytes,
            merge_split_partitions: config.clickhouse_local.merge_split_partitions,
            staging,
            reach: ConfigReach::new(config),
        })
    }

    /// What one attempt's build works with.
    pub fn env(&self) -> BuildEnv<'_> {
        BuildEnv {
            loads: &self.loads,
            reach: &self.reach,
            connections: self.connections,
            local: &self.local,
            work_parent: self.work_parent.clone(),
            staging: self.staging.clone(),
            spool_chunk_bytes: self.spool_chunk_bytes,
            merge_split_partitions: self.merge_split_partitions,
        }
    }
}

/// The ledger, the server's filesystem and the staging layout of a config.
pub struct DriverEnv {
    pub rt: tokio::runtime::Runtime,
    pub ledger: Ledger,
    pub fs: std::sync::Arc<dyn chpart_remote::RemoteFs>,
    pub staging: StagingLayout,
    pub reach: ConfigReach,
    /// The configured server's host name, whose filesystem `fs` is.
    pub host: String,
    /// Connections `commit` verifies over (`fs` and more from `reach`).
    pub verify_connections: usize,
    pub retry_deadline: std::time::Duration,
}

pub fn driver_env(config: &crate::args::ConfigArg) -> Result<DriverEnv, Failure> {
    driver_env_of(load_config(config)?)
}

pub fn driver_env_of(config: chpart_config::Config) -> Result<DriverEnv, Failure> {
    let staging = StagingLayout::new(&config.staging_root)
        .context("staging.root")
        .map_err(usage)?;
    Ok(DriverEnv {
        retry_deadline: config.retry_deadline,
        rt: runtime()?,
        ledger: Ledger::new(server_of(&config), &config.ledger_database),
        fs: remote_fs(&config)?,
        staging,
        host: config.clickhouse.host_name.clone(),
        verify_connections: match &config.transport {
            chpart_config::Transport::Sftp(ssh) => ssh.verify_connections,
            // Local files: listing and hashing them is no round trip.
            chpart_config::Transport::Local => 1,
        },
        reach: ConfigReach::new(config),
    })
}

pub fn cleanup_failure(e: chpart_protocol::cleanup::CleanupError) -> Failure {
    let kind = e.kind();
    Failure::new(kind, e)
}
