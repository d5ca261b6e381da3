//! Parquet input: the footer for the schema, and value checks that avoid reading the file.
//!
//! A batch task's Parquet files can be far larger than memory, and clickhouse-local reads
//! them itself; chpart only needs the schema (for [`check_schema`]) and
//! proof that the plan's [`ValueCheck`]s hold. [`ParquetInput::open`] reads the footer alone.
//! [`ParquetInput::check_nulls`] first asks each row group's column statistics (a null count
//! of zero on every leaf of a column proves it has no NULL; `min`/`max` of a flat timestamp
//! column prove its `DateTime` range) and decodes only what the statistics leave open: the
//! needed columns of the needed row groups, one batch at a time.
//!
//! The Arrow schema is derived from the Parquet types alone, ignoring the `ARROW:schema` a
//! writer may embed: ClickHouse reads the Parquet types, and the two can disagree in ways that
//! change data. arrow-rs stores `Date64` and `Timestamp(Second)` as plain `INT64` with no
//! logical type; ClickHouse reads those as numbers of *seconds*, so a `Date64` column would
//! load as dates thousands of years off (clamped). Judged by the Parquet type they are `Int64`
//! and rejected for date/time columns; [`ParquetInput::check_schema`] says why.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_schema::{DataType, SchemaRef, TimeUnit};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::{ProjectionMask, ARROW_SCHEMA_META_KEY};
use parquet::basic::{LogicalType, TimeUnit as ParquetTimeUnit, Type as PhysicalType};
use parquet::file::metadata::RowGroupMetaData;
use parquet::file::statistics::Statistics;

use crate::checks::{datetime_fits, unit_scale, ValueCheck};
use crate::error::InputError;
use crate::schema::{check_schema, InputPlan, SchemaError, SchemaProblem, TargetColumn};

/// Rows decoded per batch when statistics cannot settle a check.
const CHECK_BATCH_ROWS: usize = 8192;

/// An opened Parquet file: its footer, and the Arrow schema derived from it.
#[derive(Debug)]
pub struct ParquetInput {
    path: PathBuf,
    file: File,
    metadata: ArrowReaderMetadata,
    /// The writer's embedded `ARROW:schema`, if any: only for explaining rejections.
    embedded: Option<SchemaRef>,
}

impl ParquetInput {
    /// Opens `path` and reads its footer; no row data is read.
    pub fn open(path: impl AsRef<Path>) -> Result<ParquetInput, InputError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|error| InputError::Io {
            path: path.clone(),
            error,
        })?;
        let metadata = ArrowReaderMetadata::load(&file, reader_options()).map_err(|error| {
            InputError::NotParquet {
                path: path.clone(),
                error,
            }
        })?;
        let has_embedded = metadata
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .is_some_and(|kv| kv.iter().any(|e| e.key == ARROW_SCHEMA_META_KEY));
        let embedded = has_embedded
            .then(|| {
                ArrowReaderMetadata::try_new(metadata.metadata().clone(), ArrowReaderOptions::new())
                    .ok()
            })
            .flatten()
            .map(|m| m.schema().clone());
        Ok(ParquetInput {
            path,
            file,
            metadata,
            embedded,
        })
    }

    /// [`check_schema`] of this file as clickhouse-local's Parquet reader will see it; where a
    /// column is rejected and the file's embedded Arrow schema declares a different type, the
    /// message says so (e.g. `Date64` stored as a plain `INT64`).
    pub fn check_schema(&self, target: &[TargetColumn]) -> Result<InputPlan, SchemaError> {
        let source = self.path.display().to_string();
        let mut error = match check_schema(self.arrow_schema(), target, &source) {
            Ok(plan) => return Ok(plan),
            Err(error) => error,
        };
        let Some(embedded) = &self.embedded else {
            return Err(error);
        };
        for problem in &mut error.problems {
            let SchemaProblem::Incompatible {
                column,
                arrow_type,
                detail,
                ..
            } = problem
            else {
                continue;
            };
            let Ok(declared) = embedded.field_with_name(column) else {
                continue;
            };
            if declared.data_type().to_string() != *arrow_type {
                detail.push_str(&format!(
                    "; the file's embedded Arrow schema declares {}, but the Parquet column is stored \
                     as {arrow_type}, which is what ClickHouse reads",
                    declared.data_type()
                ));
            }
        }
        Err(error)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's schema as Arrow types derived from the Parquet types (the embedded
    /// `ARROW:schema` is ignored), for [`check_schema`].
    pub fn arrow_schema(&self) -> &SchemaRef {
        self.metadata.schema()
    }

    /// Rows in the file, from the footer.
    pub fn num_rows(&self) -> u64 {
        u64::try_from(self.metadata.metadata().file_metadata().num_rows()).unwrap_or(0)
    }

    /// Row groups in the file.
    pub fn num_row_groups(&self) -> usize {
        self.metadata.metadata().num_row_groups()
    }

    /// Runs every [`ValueCheck`] of `plan` (NULLs into non-`Nullable` positions, and the
    /// `DateTime` range) over the whole file, from statistics where they suffice and by
    /// streaming only the checked columns otherwise. The error names the file, row group,
    /// column and types.
    /// `plan` must have been made from this file's schema (any file with the same schema).
    pub fn check_nulls(&self, plan: &InputPlan) -> Result<(), InputError> {
        let parquet_schema = self.metadata.parquet_schema();
        let mut planned = Vec::with_capacity(plan.checks.len());
        for check in &plan.checks {
            let root = self.arrow_schema().index_of(&check.column).ok();
            let field = root.map(|i| self.arrow_schema().field(i));
            match (root, field) {
                (Some(root), Some(f)) if *f.data_type() == check.arrow_type => {
                    planned.push((root, check))
                }
                _ => {
                    return Err(InputError::PlanMismatch {
                        path: self.path.clone(),
                        column: check.column.clone(),
                        arrow_type: check.arrow_type.to_string(),
                    })
                }
            }
        }
        for (row_group, rg_meta) in self.metadata.metadata().row_groups().iter().enumerate() {
            let open: Vec<(usize, &ValueCheck)> = planned
                .iter()
                .copied()
                .filter(|&(root, check)| !self.settled_by_statistics(root, check, rg_meta))
                .collect();
            if open.is_empty() {
                continue;
            }
            let mut roots: Vec<usize> = open.iter().map(|&(root, _)| root).collect();
            roots.sort_unstable();
            roots.dedup();
            let columns = open
                .iter()
                .map(|(_, c)| format!("`{}`", c.column))
                .collect::<Vec<_>>()
                .join(", ");
            let data_error = |error| InputError::ParquetData {
                path: self.path.clone(),
                row_group,
                columns: columns.clone(),
                error,
            };
            let file = self.file.try_clone().map_err(|error| InputError::Io {
                path: self.path.clone(),
                error,
            })?;
            let reader =
                ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.metadata.clone())
                    .with_projection(ProjectionMask::roots(parquet_schema, roots))
                    .with_row_groups(vec![row_group])
                    .with_batch_size(CHECK_BATCH_ROWS)
                    .build()
                    .map_err(|e| data_error(e.into()))?;
            let mut first_row = 0u64;
            for batch in reader {
                let batch = batch.map_err(data_error)?;
                for (_, check) in &open {
                    // Projected, and unique: the plan passed the schema check.
                    let Some(array) = batch.column_by_name(&check.column) else {
                        return Err(InputError::PlanMismatch {
                            path: self.path.clone(),
                            column: check.column.clone(),
                            arrow_type: check.arrow_type.to_string(),
                        });
                    };
                    check
                        .check_array(array, first_row)
                        .map_err(|problem| InputError::Value {
                            input: self.path.display().to_string(),
                            location: format!("row group {row_group}"),
                            problem,
                        })?;
                }
                first_row += batch.num_rows() as u64;
            }
        }
        Ok(())
    }

    /// Whether the row group's statistics prove `check` holds without decoding data.
    /// `root` is the column's index among the file's top-level columns.
    fn settled_by_statistics(
        &self,
        root: usize,
        check: &ValueCheck,
        row_group: &RowGroupMetaData,
    ) -> bool {
        let parquet_schema = self.metadata.parquet_schema();
        let leaves: Vec<usize> = (0..parquet_schema.num_columns())
            .filter(|&leaf| parquet_schema.get_column_root_idx(leaf) == root)
            .collect();
        let stats = |leaf: usize| row_group.column(leaf).statistics();
        // A leaf's null count includes NULLs at every nesting level above it (and empty lists),
        // so zero on all leaves proves there is no NULL anywhere in the column.
        let no_nulls = || {
            leaves
                .iter()
                .all(|&leaf| stats(leaf).and_then(Statistics::null_count_opt) == Some(0))
        };
        if check.nulls && !no_nulls() {
            return false;
        }
        if check.datetime_range {
            // Only a flat INT64 column whose raw unit is known: nested ones are decoded.
            let [leaf] = leaves[..] else {
                return false;
            };
            let Some(per_second) = self.raw_unit(leaf, &check.arrow_type) else {
                return false;
            };
            let Some(Statistics::Int64(values)) = stats(leaf) else {
                return false;
            };
            // With no non-NULL value there is nothing to clamp.
            if values.null_count_opt() == Some(row_group.num_rows() as u64) {
                return true;
            }
            let (Some(&min), Some(&max)) = (values.min_opt(), values.max_opt()) else {
                return false;
            };
            return datetime_fits(min, per_second) && datetime_fits(max, per_second);
        }
        true
    }

    /// Ticks per second of a flat INT64 timestamp leaf's stored values, when the Parquet
    /// schema pins it down and agrees with the Arrow type the data is decoded as.
    fn raw_unit(&self, leaf: usize, arrow_type: &DataType) -> Option<i64> {
        let column = self.metadata.parquet_schema().column(leaf);
        if column.physical_type() != PhysicalType::INT64 || column.max_rep_level() != 0 {
            return None;
        }
        let stored = match column.logical_type_ref() {
            Some(LogicalType::Timestamp(timestamp)) => match timestamp.unit {
                ParquetTimeUnit::MILLIS => TimeUnit::Millisecond,
                ParquetTimeUnit::MICROS => TimeUnit::Microsecond,
                ParquetTimeUnit::NANOS => TimeUnit::Nanosecond,
            },
            _ => return None,
        };
        match arrow_type {
            DataType::Timestamp(unit, _) if *unit == stored => Some(unit_scale(stored).0),
            _ => None,
        }
    }
}

/// How the footer becomes an Arrow schema (shared by `open` and the decoding in checks): from
/// the Parquet types, as ClickHouse sees them (see the module docs).
fn reader_options() -> ArrowReaderOptions {
    ArrowReaderOptions::new().with_skip_arrow_metadata(true)
}
