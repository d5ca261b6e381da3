//! The error of reading an input (Parquet file or Arrow IPC stream).
//!
//! Every variant names the input (path or `stdin`) and where in it the problem is (row group,
//! batch), because the message ends up in a batch job's log, far from the data.

use std::path::PathBuf;

use arrow_schema::ArrowError;
use parquet::errors::ParquetError;
use thiserror::Error;

use crate::checks::ValueProblem;
use crate::schema::SchemaError;

/// Reading an input failed, or its data would not reach ClickHouse unchanged.
#[derive(Debug, Error)]
pub enum InputError {
    /// The file cannot be opened or read.
    #[error("cannot read {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        error: std::io::Error,
    },
    /// The file's footer or metadata does not parse: truncated, corrupt, or not Parquet.
    #[error("{} is not a valid Parquet file: {error}", path.display())]
    NotParquet {
        /// The file.
        path: PathBuf,
        /// What the Parquet reader said.
        #[source]
        error: ParquetError,
    },
    /// A row group's data could not be decoded.
    #[error("{}: cannot decode Parquet row group {row_group} (column(s) {columns}): {error}", path.display())]
    ParquetData {
        /// The file.
        path: PathBuf,
        /// Row group index.
        row_group: usize,
        /// The columns being read, comma-separated.
        columns: String,
        /// What the Parquet reader said.
        #[source]
        error: ArrowError,
    },
    /// A plan made for another schema was applied to this file.
    #[error(
        "{}: the load plan expects column `{column}` of Arrow type {arrow_type}, which this file \
         does not have; plan each file from its own schema", path.display()
    )]
    PlanMismatch {
        /// The file.
        path: PathBuf,
        /// The planned column.
        column: String,
        /// Its planned Arrow type.
        arrow_type: String,
    },
    /// The input's schema does not fit the target table.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// A value check failed: the data would change on its way into ClickHouse.
    #[error("{input}, {location}: {problem}")]
    Value {
        /// The input (path or `stdin`).
        input: String,
        /// `row group N` or `batch N`.
        location: String,
        /// What was found.
        #[source]
        problem: Box<ValueProblem>,
    },
    /// The Arrow IPC stream is not a complete, valid stream.
    #[error("{input}: invalid or truncated Arrow IPC stream at {location}: {reason}")]
    BadStream {
        /// The input (`stdin`).
        input: String,
        /// `the schema message`, `batch N`, or `the end of the stream`.
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// Writing the stream to the consumer (clickhouse-local's stdin) failed.
    #[error("{input}: cannot pass batch {batch} on to {destination}: {error}")]
    Write {
        /// The input (`stdin`).
        input: String,
        /// Batch number (1-based) being written; 0 for the schema message.
        batch: u64,
        /// Who was being written to.
        destination: String,
        /// What the writer said.
        #[source]
        error: ArrowError,
    },
}
