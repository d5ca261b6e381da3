//! `chpart config`: the resolved, validated config, without secrets.

use std::process::ExitCode;

use crate::args::ConfigArgs;
use crate::context::usage;
use crate::exit::{self, Failure};

/// `chpart config`: resolve, validate, print the document (never a secret: the schema has no
/// key for one).
pub fn run_config(args: ConfigArgs) -> Result<ExitCode, Failure> {
    let resolved = chpart_config::Resolved::load(args.config.config.as_deref(), std::env::vars())
        .map_err(usage)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&resolved.document).expect("a config serializes")
        );
    } else {
        print!("{}", resolved.to_toml());
    }
    tracing::debug!("config from {}", resolved.sources.join(" + "));
    Ok(exit::ok())
}
