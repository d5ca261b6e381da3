//! The `chpart` command line: parses arguments, loads the config, calls the protocol library
//! and maps its errors to documented exit codes. Nothing else lives here.

mod args;
mod build;
mod driver;
mod exit;

use std::process::ExitCode;

use clap::Parser;
use exit::ExitCodeOf;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    init_logging(cli.verbose);
    match args::run(cli) {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("chpart: error: {}", exit::render(&failure.error));
            failure.kind.exit_code()
        }
    }
}

/// Logs go to stderr (stdout carries only results such as the manifest line). `CHPART_LOG`
/// takes a tracing filter, e.g. `CHPART_LOG=debug`.
fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("CHPART_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}
