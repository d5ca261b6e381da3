//! One module per command; `main` dispatches to their `run_*` functions.

pub mod abort;
pub mod begin;
pub mod build;
pub mod commit;
pub mod config;
pub mod gc;
pub mod ledger;
pub mod load;
pub mod plan;
pub mod status;

use chpart_protocol::cleanup::Removal;

pub fn describe(r: &Removal) -> String {
    match r {
        Removal::DetachedPart {
            table,
            part,
            attempt,
        } => format!("detached part {part} of attempt {attempt} in {table}"),
        Removal::ShadowTable { table } => format!("shadow table {table}"),
        Removal::Staging { path } => format!("staging {path}"),
    }
}
