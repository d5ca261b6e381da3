//! chpart's benchmarks: what it costs to turn a batch task's rows into parts on the server and
//! make them visible, compared with the tools a user would otherwise reach for.
//!
//! - [`events`] and [`gen`]: a deterministic, realistic hourly events table (the shapes and
//!   value distributions of a real one: low-cardinality keys, URLs, maps, arrays, mostly-NULL
//!   columns) written as Parquet, the input a Spark task hands chpart; [`rng`] is the
//!   generator's own stable random stream.
//! - [`local`]: the raw clickhouse-local build of the same table, the baseline.
//! - [`build`]: the executor-side benchmark (raw clickhouse-local vs `chpart build` over the
//!   local and SFTP transports, scp as the upload baseline), with [`measure`] for wall time
//!   and a process's own peak memory, and [`http`] for the server-side INSERT reference.
//! - [`commit`]: the driver-side benchmark (`chpart commit`'s ATTACH rate, time to visible
//!   under a polling reader, server CPU per GB against `INSERT ... FORMAT Parquet`).
//! - [`chpart`]: running the chpart binary under test (configs, begin, build, commit).
//! - [`ledger`]: what each command costs the ledger with years of hourly loads in it, beside
//!   a ledger of a few days' loads (`system.query_log` of the ledger's statements).
//!
//! Figures are printed side by side from one run and compared as ratios: the machines this
//! runs on are shared, so absolute timings vary and nothing here asserts one.

pub mod build;
pub mod chpart;
pub mod cluster;
pub mod commit;
pub mod events;
pub mod gen;
pub mod http;
pub mod interrupt;
pub mod ledger;
pub mod local;
pub mod measure;
pub mod rng;
