//! chpart's load protocol, generic over the ClickHouse server and the remote filesystem.
//!
//! ```text
//!  driver: begin ──► ledger: load_opened(spec) ─┐
//!                                                │  executors read the spec
//!  executor (per task attempt): build ──► parts ──► staging/<load>/<attempt>/ ──► fence? ──► detached/
//!                                                                      └─► manifest (last)
//!  driver: commit(winning manifests) ──► ledger: plan, attach steps, load_committed
//! ```
//!
//! The modules form layers; each uses only the modules before it (a test, `layers`, holds the
//! code to this order):
//!
//! 1. **The model**, pure: [`shards`] (a cluster load's shards, sub-load names, cluster
//!    manifest and plan), [`snapshot`] (what `begin` records about the target table), [`ledger`]
//!    (the entries, the load spec and the replay that derives a load's state), [`grants`] (the
//!    privileges a load needs).
//! 2. **Ports**, the side effects the stages go through: [`events`] (step events), [`hooks`]
//!    (test fault injection), [`reach`] (a host's server and filesystem), [`store`] (the ledger
//!    table in ClickHouse), [`observe`] (what the server and the filesystem hold, and
//!    verification), [`staging`] (what attempts left in staging).
//! 3. **Stages of a load of one table on one server**: [`begin`], [`build`] (one task attempt,
//!    from rows to published parts and a manifest), [`commit`], [`cleanup`] (abort, gc,
//!    status), [`retention`] (pruning the ledger), [`timeline`].
//! 4. **The cluster layer**: [`cluster`] (a load into a Distributed table as one sub-load per
//!    shard), [`topology`] (what a load would use: `chpart plan`).
//! 5. **The entry point**, [`api`]: what each command does, whatever the table is.

#![warn(missing_docs)]

// The model: pure, no I/O.
pub mod grants;
pub mod ledger;
pub mod shards;
pub mod snapshot;
// Ports: the side effects the stages go through.
pub mod events;
pub mod hooks;
pub mod observe;
pub mod reach;
pub mod staging;
pub mod store;
// Stages of a load of one table on one server.
pub mod begin;
pub mod build;
pub mod cleanup;
pub mod commit;
pub mod retention;
pub mod timeline;
// The cluster layer: a load into a Distributed table, composed of one per shard.
pub mod cluster;
pub mod topology;
// The entry point the CLI calls.
pub mod api;

/// What a failure means for whoever runs chpart (and so its exit status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The command line or the configuration is wrong.
    Usage,
    /// A transient fault (network, server busy): running the same command again may succeed.
    Retryable,
    /// Running it again cannot succeed: bad input, schema mismatch, refused request.
    Permanent,
    /// The load is no longer open (committed or aborted): this attempt must stop.
    Fenced,
}

pub(crate) fn server_failure(e: &chpart_server::ServerError) -> FailureKind {
    match e.class(true) {
        chpart_server::ErrorClass::Transient => FailureKind::Retryable,
        _ => FailureKind::Permanent,
    }
}

impl store::LedgerStoreError {
    /// The failure kind.
    pub fn kind(&self) -> FailureKind {
        self.server_error()
            .map_or(FailureKind::Permanent, server_failure)
    }
}

impl begin::BeginError {
    /// The failure kind.
    pub fn kind(&self) -> FailureKind {
        match self {
            begin::BeginError::NotOpen { .. } => FailureKind::Fenced,
            begin::BeginError::Shard { source, .. } => source.kind(),
            begin::BeginError::ShardUnreachable { .. } => FailureKind::Retryable,
            begin::BeginError::Server(e) => server_failure(e),
            begin::BeginError::Ledger(e) => e.kind(),
            _ => FailureKind::Permanent,
        }
    }
}

pub use ledger::KNOWN_KINDS;

#[cfg(test)]
mod layers {
    /// Every module, lowest layer first, with its source.
    const ORDER: &[(&str, &str)] = &[
        ("shards", include_str!("shards.rs")),
        ("snapshot", include_str!("snapshot.rs")),
        ("ledger", include_str!("ledger.rs")),
        ("grants", include_str!("grants.rs")),
        ("events", include_str!("events.rs")),
        ("hooks", include_str!("hooks.rs")),
        ("reach", include_str!("reach.rs")),
        ("store", include_str!("store.rs")),
        ("observe", include_str!("observe.rs")),
        ("staging", include_str!("staging.rs")),
        ("begin", include_str!("begin.rs")),
        (
            "build",
            concat!(
                include_str!("build/mod.rs"),
                include_str!("build/error.rs"),
                include_str!("build/local.rs"),
                include_str!("build/cluster.rs"),
                include_str!("build/publish.rs"),
            ),
        ),
        (
            "commit",
            concat!(
                include_str!("commit/mod.rs"),
                include_str!("commit/error.rs"),
                include_str!("commit/record.rs"),
                include_str!("commit/checks.rs"),
                include_str!("commit/verify.rs"),
                include_str!("commit/publish.rs"),
                // Last: the scan of a module's code stops at its tests module.
                include_str!("commit/attach.rs"),
            ),
        ),
        (
            "cleanup",
            concat!(
                include_str!("cleanup.rs"),
                include_str!("cleanup/status.rs")
            ),
        ),
        ("retention", include_str!("retention.rs")),
        ("timeline", include_str!("timeline.rs")),
        ("cluster", include_str!("cluster.rs")),
        ("topology", include_str!("topology.rs")),
        ("api", include_str!("api.rs")),
    ];

    /// The modules `source` uses (`crate::<module>` outside comments and its tests module).
    fn uses(source: &str) -> Vec<String> {
        let lines: Vec<&str> = source.lines().collect();
        let code = lines
            .windows(2)
            .position(|w| w[0] == "#[cfg(test)]" && w[1].contains("mod tests"))
            .map_or(&lines[..], |end| &lines[..end]);
        let mut out = Vec::new();
        for line in code {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for (i, _) in line.match_indices("crate::") {
                let name: String = line[i + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if ORDER.iter().any(|(m, _)| *m == name) && !out.contains(&name) {
                    out.push(name);
                }
            }
        }
        out
    }

    #[test]
    fn each_module_uses_only_modules_before_it() {
        let mut problems = Vec::new();
        for (i, (module, source)) in ORDER.iter().enumerate() {
            for used in uses(source) {
                let at = ORDER.iter().position(|(m, _)| *m == used).unwrap();
                if at >= i {
                    problems.push(format!("{module} uses {used}, which is not below it"));
                }
            }
        }
        assert!(problems.is_empty(), "{problems:#?}");
    }

    #[test]
    fn every_module_is_in_the_order() {
        let declared: Vec<&str> = include_str!("lib.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("pub mod "))
            .map(|l| l.trim_end_matches(';'))
            .collect();
        let ordered: Vec<&str> = ORDER.iter().map(|(m, _)| *m).collect();
        let mut a = declared.clone();
        a.sort();
        let mut b = ordered.clone();
        b.sort();
        assert_eq!(a, b, "lib.rs declares {declared:?}");
    }

    #[test]
    fn the_check_sees_a_use_that_goes_up() {
        assert_eq!(uses("use crate::cluster::Reach;\n"), ["cluster"]);
        assert!(uses("/// see [`crate::cluster`]\n").is_empty());
        assert!(uses("fn a() {}\n#[cfg(test)]\nmod tests {\n use crate::api::x;\n}").is_empty());
    }
}
