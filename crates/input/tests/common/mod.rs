//! Shared helpers of the real-component tests: writing inputs and running clickhouse-local.

#![allow(dead_code)] // each test binary uses a different subset

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use arrow_array::RecordBatch;
use arrow_ipc::writer::StreamWriter;
use chpart_input::{ChType, TargetColumn};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

/// clickhouse-local's input formats the tests use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `Parquet`.
    Parquet,
    /// `ArrowStream`.
    ArrowStream,
}

impl Format {
    /// The `--input-format` name.
    pub fn name(self) -> &'static str {
        match self {
            Format::Parquet => "Parquet",
            Format::ArrowStream => "ArrowStream",
        }
    }
}

/// Target columns from `(name, type, default_kind)`.
pub fn target(columns: &[(&str, &str, &str)]) -> Vec<TargetColumn> {
    columns
        .iter()
        .map(|(name, ty, kind)| TargetColumn {
            name: (*name).into(),
            ch_type: ty.parse::<ChType>().unwrap_or_else(|e| panic!("{e}")),
            default_kind: (*kind).into(),
        })
        .collect()
}

/// Writes `batches` as one Parquet file, one row group per batch, with or without statistics.
pub fn write_parquet(path: &Path, batches: &[RecordBatch], statistics: bool) {
    let level = if statistics {
        EnabledStatistics::Chunk
    } else {
        EnabledStatistics::None
    };
    let props = WriterProperties::builder()
        .set_statistics_enabled(level)
        .build();
    let file = File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batches[0].schema(), Some(props)).unwrap();
    for batch in batches {
        writer.write(batch).unwrap();
        writer.flush().unwrap();
    }
    writer.close().unwrap();
}

/// `batches` as an Arrow IPC stream (with its end-of-stream marker).
pub fn ipc_stream(batches: &[RecordBatch]) -> Vec<u8> {
    let mut writer = StreamWriter::try_new(Vec::new(), &batches[0].schema()).unwrap();
    for batch in batches {
        writer.write(batch).unwrap();
    }
    writer.finish().unwrap();
    writer.into_inner().unwrap()
}

/// Runs clickhouse-local reading `file` as `format` with `structure`; stdout, or stderr as
/// the error.
pub fn clickhouse_local(
    structure: &str,
    format: &str,
    file: &Path,
    query: &str,
) -> Result<Vec<u8>, String> {
    let out = Command::new(chpart_testenv::clickhouse_local())
        .args(["--structure", structure, "--input-format", format, "--file"])
        .arg(file)
        .args(["--query", query])
        .output()
        .expect("run clickhouse-local");
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A scratch directory for one test.
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("chpart-input-")
        .tempdir()
        .unwrap()
}

/// `dir/name`.
pub fn path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}
