//! The step events every command reports: one `tracing` event per step with target
//! [`TARGET`], which the CLI writes as one JSON line each (`--events`), sums into a Prometheus
//! text file (`--metrics-file`) and shows as progress on a terminal. The fields (stable; the
//! README lists them) are [`FIELDS`]: a field that does not apply to a step is empty or zero and
//! left out of the JSON line.

/// The `tracing` target of step events.
pub const TARGET: &str = "chpart::event";

/// The fields of a step event, in the order the JSON line has them (after `ts_ms`).
pub const FIELDS: &[&str] = &[
    "load",
    "attempt",
    "shard",
    "part",
    "partition",
    "step",
    "outcome",
    "duration_ms",
    "rows",
    "bytes",
    "parts",
    "attempts",
    "retry",
    "error",
];

/// `outcome` of a step that finished.
pub const OK: &str = "ok";
/// `outcome` of a step that failed (`error` says why).
pub const FAILED: &str = "failed";
/// `outcome` of a `retry` event: the step is tried again after `duration_ms`.
pub const RETRYING: &str = "retrying";
