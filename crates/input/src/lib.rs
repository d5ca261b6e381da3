//! Reading a batch task's rows and proving they fit the target table before ClickHouse sees them.
//!
//! Each batch task hands chpart its rows as Parquet files or as an Arrow IPC stream on stdin;
//! chpart feeds them to `clickhouse-local`, which builds the MergeTree parts. clickhouse-local
//! is forgiving in ways an exactly-once loader must not be: it converts between types with
//! `CAST` semantics, stores NULL as the column default when the column is not `Nullable`
//! (`input_format_null_as_default`), clamps out-of-range `DateTime` values, and ignores input
//! columns nobody asked for. This crate closes those gaps up front:
//!
//! - [`chtype`]: the target table's ClickHouse types, parsed from `system.columns.type`.
//! - [`schema`]: [`check_schema`] compares an Arrow schema with the target's columns, accepts
//!   only lossless conversions and produces the [`InputPlan`] (clickhouse-local `--structure`,
//!   the `INSERT` column list, and the value checks the data still needs).
//! - [`checks`]: the value checks themselves (NULLs into non-`Nullable` positions, `DateTime`
//!   range), run on Arrow arrays.
//! - [`parquet`]: [`ParquetInput`] reads a file's footer, and runs the plan's value checks from
//!   row-group statistics where they prove enough, streaming only the needed columns otherwise.
//! - [`arrow_stream`]: [`ArrowStreamPump`] passes an Arrow IPC stream through to
//!   clickhouse-local's stdin one batch at a time, checking schema and values on the way.
//!
//! See the "Type mapping" section of the repository README for the Arrow → ClickHouse type table and its tests.

#![deny(missing_docs)]

pub mod arrow_stream;
pub mod checks;
pub mod chtype;
mod error;
pub mod parquet;
pub mod schema;

pub use arrow_stream::{ArrowStreamPump, ChunkSink, StreamStats};
pub use checks::{ValueCheck, ValueProblem};
pub use chtype::{ChType, TupleElement, TypeParseError};
pub use error::InputError;
pub use parquet::ParquetInput;
pub use schema::{
    check_schema, ColumnMapping, InputPlan, SchemaError, SchemaProblem, TargetColumn,
};
