//! Building native MergeTree parts with `clickhouse-local`, outside the ClickHouse server.
//!
//! Each batch task attempt of a chpart load turns its rows into parts here: it creates, in a
//! private clickhouse-local data directory, a table with exactly the target table's shape,
//! inserts its rows, and hands over the part directories clickhouse-local wrote, checked and
//! digested, for shipping to the server's `detached/` and a later `ATTACH PART`. Building with
//! the server's own engine (rather than writing the format ourselves) is what makes the parts
//! byte-compatible with the server; the cost is running an external program, which
//! [`runner`] does carefully.
//!
//! - [`runner`]: runs clickhouse-local with bounded stderr, a timeout, and no orphaned or
//!   zombie children.
//! - [`local`]: one attempt's build: input checked (and an Arrow stream spooled), sessions run,
//!   the engine and the built rows checked.
//! - [`ddl`]: adapts the target's `create_table_query` for clickhouse-local.
//! - [`parts`]: the build session's SQL, the checks each built part must pass, and file digests.
//! - [`workdir`]: the scratch directory of one build, unique per process and attempt.

#![deny(missing_docs)]

pub mod ddl;
pub mod local;
pub mod parts;
pub mod runner;
mod sql;
pub mod workdir;

pub use ddl::{local_table_ddl, DdlError};
pub use local::{Built, Input, LocalBuild, LocalError};
pub use parts::{
    build_query, build_query_routed, digest_part, inspect_parts, local_args, rewrite_query,
    sha256_of, split_listings, ttl_due, BuildSession, BuiltPart, DigestError, FileSource,
    PartCheckError, QueryError, Rewrite, NO_BACKGROUND_MERGES,
};
pub use runner::{LocalCommand, LocalIdentity, RunError};
pub use sql::{quote_ident, quote_str};
pub use workdir::{WorkDir, WorkDirError};
