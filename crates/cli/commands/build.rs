//! `chpart build`: one task attempt, on an executor.

use std::process::ExitCode;

use anyhow::Context;
use chpart_core::{Attempt, AttemptId, LoadId, Manifest};
use chpart_protocol::build::{build, BuildRequest, Input};
use chpart_protocol::FailureKind;

use crate::args::BuildArgs;
use crate::context::{load_config, usage, Executor};
use crate::exit::{self, Failure};

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
