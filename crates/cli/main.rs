//! The `chpart` command line: parses arguments, loads the config, calls the protocol library
//! and maps its errors to documented exit codes. Nothing else lives here.

mod args;
mod commands;
mod context;
mod exit;
mod report;
mod timeline;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use exit::ExitCodeOf;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    let reporting = match report::Reporting::new(cli.events.as_deref(), cli.metrics_file.as_deref())
    {
        Ok(reporting) => Arc::new(reporting),
        Err(e) => {
            eprintln!("chpart: error: {e}");
            return chpart_protocol::FailureKind::Usage.exit_code();
        }
    };
    if let Some(load) = cli.load() {
        reporting.set_load(load);
    }
    init_logging(cli.verbose, &reporting);
    let command = cli.command_name();
    context::set_command(command);
    let result = run(cli);
    if let Err(e) = reporting.finish(command, result.is_ok()) {
        eprintln!("chpart: warning: {e}");
    }
    match result {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("chpart: error: {}", exit::render(&failure.error));
            failure.kind.exit_code()
        }
    }
}

/// Logs go to stderr (stdout carries only results such as the manifest line), above the
/// progress bar when one is shown; step events go to `reporting`. `CHPART_LOG` takes a tracing
/// filter for the logs, e.g. `CHPART_LOG=debug`.
fn init_logging(verbose: u8, reporting: &Arc<report::Reporting>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("CHPART_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
        // Step events are not log lines.
        .add_directive(
            format!("{}=off", chpart_core::events::TARGET)
                .parse()
                .expect("a valid directive"),
        );
    let bar = reporting.progress().cloned();
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(move || report::LogWriter(bar.clone()))
        .with_target(false)
        .with_filter(filter);
    let steps = report::StepLayer(reporting.clone()).with_filter(
        tracing_subscriber::filter::filter_fn(|meta| meta.target() == chpart_core::events::TARGET),
    );
    tracing_subscriber::registry().with(logs).with(steps).init();
}

/// Runs the command.
fn run(cli: args::Cli) -> Result<ExitCode, exit::Failure> {
    use args::Command;
    match cli.command {
        Command::Begin(args) => commands::begin::run_begin(args),
        Command::Build(args) => commands::build::run_build(args),
        Command::Commit(args) => commands::commit::run_commit(args),
        Command::Abort(args) => commands::abort::run_abort(args),
        Command::Status(args) => commands::status::run_status(args),
        Command::Gc(args) => commands::gc::run_gc(args),
        Command::Plan(args) => commands::plan::run_plan(args),
        Command::Ledger(args) => commands::ledger::run_ledger(args),
        Command::Load(args) => commands::load::run_load(args),
        Command::Config(args) => commands::config::run_config(args),
    }
}
