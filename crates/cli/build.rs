//! `chpart build`: wiring the executor side's pieces from the config and arguments.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use chpart_config::{Config, HostSettings, Transport};
use chpart_core::retry::RetryPolicy;
use chpart_core::{Attempt, AttemptId, LoadId, Manifest, RemotePath, StagingLayout, StagingRoots};
use chpart_protocol::build::{build, BuildEnv, BuildRequest, Input, LedgerDirectory};
use chpart_protocol::reach::Reach;
use chpart_protocol::store::Ledger;
use chpart_protocol::FailureKind;
use chpart_remote::retry::{Connector, Reconnecting};
use chpart_remote::{LocalFs, RemoteError, RemoteFs, SftpConfig, SftpFs};
use chpart_server::SharedServer;

use crate::args::{load_config, runtime, server_at, server_of, usage, BuildArgs};
use crate::exit::{self, Failure};

/// The configured server's filesystem.
pub fn remote_fs(config: &Config) -> Result<Arc<dyn RemoteFs>, Failure> {
    let reach = ConfigReach::new(config.clone());
    let host = config.clickhouse.host_name.clone();
    let mut connections = reach.connect(&host, 1).map_err(remote_failure)?;
    Ok(connections.remove(0))
}

fn remote_failure(e: RemoteError) -> Failure {
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
            local: crate::args::local_command(&config),
            work_parent: config.clickhouse_local.work_dir.clone(),
            spool_chunk_bytes: config.clickhouse_local.spool_chunk_bytes,
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
        }
    }
}

/// Makes this process die with its parent (the Spark Python worker): a killed task must not
/// leave a builder running. If the parent is already gone, stop now.
fn die_with_parent() -> Result<(), Failure> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid have no memory-safety preconditions.
    let (rc, parent) = unsafe {
        (
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL),
            libc::getppid(),
        )
    };
    if rc != 0 {
        let err =
            anyhow::Error::new(std::io::Error::last_os_error()).context("prctl(PR_SET_PDEATHSIG)");
        return Err(Failure::new(FailureKind::Permanent, err));
    }
    if parent == 1 {
        return Err(Failure::new(
            FailureKind::Permanent,
            anyhow::anyhow!("the parent process is already gone"),
        ));
    }
    Ok(())
}

/// This machine's host name (`gethostname`), or `?` if it has none.
fn this_host() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or fails.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "?".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

pub fn run_build(args: BuildArgs) -> Result<ExitCode, Failure> {
    if args.die_with_parent {
        die_with_parent()?;
    }
    let load: LoadId = args.load.parse().context("--load").map_err(usage)?;
    let id: AttemptId = args.attempt.parse().context("--attempt").map_err(usage)?;
    let attempt = Attempt {
        id,
        partition: args.partition,
        stage: args.stage,
        stage_attempt: args.stage_attempt,
        attempt_number: args.attempt_number,
    };
    let input = match args.input.as_slice() {
        [one] if one.as_os_str() == "-" => Input::ArrowStream(Box::new(std::io::stdin())),
        paths if paths.iter().any(|p| p.as_os_str() == "-") => {
            return Err(usage(anyhow::anyhow!(
                "--input - (stdin) cannot be combined with files"
            )))
        }
        paths => Input::Parquet(paths.to_vec()),
    };
    let executor = Executor::new(load_config(&args.config)?)?;
    let env = executor.env();
    // The host is named: on Spark an executor's clickhouse-local (missing, too new) or its
    // files are what an operator goes to fix.
    let context = format!(
        "load {load} attempt {} (partition {}) on host {}",
        attempt.id,
        attempt.partition,
        this_host()
    );
    let request = BuildRequest {
        load,
        attempt,
        input,
        merge: args.merge,
    };
    let report = build(&env, request).map_err(|e| {
        let kind = e.kind();
        Failure::new(kind, anyhow::Error::new(e).context(context.clone()))
    })?;
    let t = &report.timings;
    let m = &report.manifests;
    tracing::info!(
        "{context}: published {} part(s), {} rows, {:.1} MB{} (build {:.2}s, digest {:.2}s, upload {:.2}s, publish {:.2}s)",
        m.iter().map(|m| m.parts.len()).sum::<usize>(),
        m.iter().map(Manifest::total_rows).sum::<u64>(),
        t.bytes as f64 / 1e6,
        if m.len() > 1 {
            format!(" on {} shards", m.len())
        } else {
            String::new()
        },
        t.build_secs,
        t.digest_secs,
        t.upload_secs,
        t.publish_secs
    );
    println!("{}", report.line);
    Ok(exit::ok())
}
