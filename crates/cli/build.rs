//! `chpart build`: wiring the executor side's pieces from the config and arguments.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use chpart_build::LocalCommand;
use chpart_config::{Config, Transport};
use chpart_core::{Attempt, AttemptId, LoadId, StagingLayout};
use chpart_protocol::build::{build, BuildEnv, BuildRequest, Input, LedgerDirectory};
use chpart_protocol::store::Ledger;
use chpart_protocol::FailureKind;
use chpart_remote::{LocalFs, RemoteFs, SftpConfig, SftpFs};

use crate::args::{load_config, runtime, server_of, usage, BuildArgs};
use crate::exit::{self, Failure};

/// The server's filesystem as the config describes it.
pub fn remote_fs(config: &Config) -> Result<Arc<dyn RemoteFs>, Failure> {
    Ok(remote_connections(config, 1)?.remove(0))
}

/// `n` connections to the server's filesystem (one for the local transport, which needs no
/// more: it moves parts instead of copying them).
pub fn remote_connections(config: &Config, n: usize) -> Result<Vec<Arc<dyn RemoteFs>>, Failure> {
    match &config.transport {
        Transport::Local => Ok(vec![Arc::new(LocalFs::new())]),
        Transport::Sftp(ssh) => (0..n.max(1)).map(|_| sftp_connection(ssh)).collect(),
    }
}

fn sftp_connection(ssh: &chpart_config::SshSettings) -> Result<Arc<dyn RemoteFs>, Failure> {
    let mut cfg = SftpConfig::new(&ssh.host, ssh.port, &ssh.user, &ssh.known_hosts);
    cfg.identity_file = ssh.identity_file.clone();
    cfg.use_agent = ssh.use_agent;
    cfg.connect_timeout_secs = ssh.connect_timeout.as_secs();
    cfg.write_buffer_bytes = ssh.write_buffer_bytes;
    let fs = SftpFs::connect(&cfg).map_err(|e| {
        let kind = if e.is_transient() {
            FailureKind::Retryable
        } else {
            FailureKind::Permanent
        };
        Failure::new(kind, e)
    })?;
    Ok(Arc::new(fs))
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
    let config = load_config(&args.config)?;
    let staging = StagingLayout::new(&config.staging_root)
        .context("staging.root")
        .map_err(usage)?;
    let rt = runtime()?;
    let loads = LedgerDirectory {
        ledger: Ledger::new(server_of(&config), &config.ledger_database),
        runtime: rt.handle().clone(),
    };
    let streams = match &config.transport {
        Transport::Sftp(ssh) => ssh.upload_connections,
        Transport::Local => 1,
    };
    let connections = remote_connections(&config, streams)?;
    let fs = connections[0].clone();
    let uploaders: Vec<&dyn RemoteFs> = connections.iter().map(|c| c.as_ref()).collect();
    let local = LocalCommand::new(
        &config.clickhouse_local.command,
        config.clickhouse_local.timeout,
    );
    let env = BuildEnv {
        loads: &loads,
        fs: fs.as_ref(),
        uploaders: &uploaders,
        local: &local,
        work_parent: config.clickhouse_local.work_dir.clone(),
        staging,
    };
    let context = format!(
        "load {load} attempt {} (partition {})",
        attempt.id, attempt.partition
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
    let m = &report.manifest;
    tracing::info!(
        "{context}: published {} part(s), {} rows, {:.1} MB (build {:.2}s, digest {:.2}s, upload {:.2}s, publish {:.2}s)",
        m.parts.len(),
        m.total_rows(),
        t.bytes as f64 / 1e6,
        t.build_secs,
        t.digest_secs,
        t.upload_secs,
        t.publish_secs
    );
    println!("{}", m.to_json_line());
    Ok(exit::ok())
}
