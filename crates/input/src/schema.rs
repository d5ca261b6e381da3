//! The schema check: does an Arrow schema fit the target table, losslessly?
//!
//! clickhouse-local reads Parquet/Arrow columns by name and converts each to the type given in
//! `--structure` with `CAST`-like rules, so almost anything "works": `Int64` into `Int32` wraps,
//! `Float64` into `Float32` rounds, an extra input column is simply never selected, a missing
//! one gets its default. A loader that promises exactly-once delivery of *the same* data must
//! refuse those cases before building parts, with a message a data engineer can act on. So:
//!
//! - every input column must be an insertable column of the target (not `MATERIALIZED` or
//!   `ALIAS`);
//! - every target column the input lacks must have a default (`DEFAULT`, `MATERIALIZED`,
//!   `ALIAS`, `EPHEMERAL`);
//! - each input column's Arrow type must convert into the target's ClickHouse type without
//!   losing values (the "Type mapping" table in the README), checked recursively through `Nullable`,
//!   `LowCardinality`, `Array`, `Map` and `Tuple`;
//! - what only the data can tell (NULLs into non-`Nullable` positions, timestamps outside
//!   `DateTime`'s range) becomes a [`ValueCheck`] in the plan for the readers to run.
//!
//! All problems are collected, so one run tells the user everything that is wrong.
//!
//! `Enum8`/`Enum16` columns accept strings; a string that is not one of the enum's names is
//! rejected by ClickHouse itself while reading ("Unknown element 'x' for enum"), so no value
//! check is needed for them.

use std::fmt;

use arrow_schema::{DataType, Field, Schema};
use thiserror::Error;

use crate::checks::ValueCheck;
use crate::chtype::{Backquoted, ChType, SqlName};

/// A column of the target table, as `system.columns` lists it (in `position` order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetColumn {
    /// Column name.
    pub name: String,
    /// Column type.
    pub ch_type: ChType,
    /// `system.columns.default_kind`: empty, `DEFAULT`, `MATERIALIZED`, `ALIAS` or `EPHEMERAL`.
    pub default_kind: String,
}

impl TargetColumn {
    /// Whether an `INSERT` may name this column.
    fn insertable(&self) -> bool {
        !matches!(self.default_kind.as_str(), "MATERIALIZED" | "ALIAS")
    }

    /// Whether ClickHouse fills this column when an `INSERT` leaves it out.
    fn has_default(&self) -> bool {
        matches!(
            self.default_kind.as_str(),
            "DEFAULT" | "MATERIALIZED" | "ALIAS" | "EPHEMERAL"
        )
    }
}

/// Where one input column goes in the target table.
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnMapping {
    /// Index in the input schema.
    pub input_index: usize,
    /// Index in the target's column list.
    pub target_index: usize,
    /// Column name (the same on both sides).
    pub name: String,
    /// The input's Arrow type.
    pub arrow_type: DataType,
    /// The target's ClickHouse type.
    pub ch_type: ChType,
}

/// What [`check_schema`] decided: how clickhouse-local must read the input and what to check.
///
/// Use with clickhouse-local as
/// `clickhouse-local --structure "<structure>" --input-format Parquet|ArrowStream --file F
/// --query "INSERT INTO target (<insert list>) SELECT <insert list> FROM table"`: the
/// structure makes ClickHouse convert every input column to the target's exact type while
/// reading (so the conversion is the one checked here, not one chosen by schema inference),
/// and the explicit column list lets the target fill the columns the input leaves out.
#[derive(Clone, Debug, PartialEq)]
pub struct InputPlan {
    /// The input's name (file path or `stdin`), for messages.
    pub source: String,
    /// One entry per input column, in input order.
    pub columns: Vec<ColumnMapping>,
    /// The columns to insert: target order, restricted to those present in the input.
    pub insert_columns: Vec<String>,
    /// clickhouse-local `--structure`: each input column, backquoted, with its *target* type,
    /// in input order, e.g. `` `id` UInt64, `tags` Array(LowCardinality(String)) ``.
    pub structure: String,
    /// Columns whose values must be checked before clickhouse-local reads them.
    pub checks: Vec<ValueCheck>,
}

impl InputPlan {
    /// [`InputPlan::insert_columns`] as SQL: backquoted, comma-separated.
    pub fn insert_column_list(&self) -> String {
        self.insert_columns
            .iter()
            .map(|c| Backquoted(c).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The checks that look for NULLs (the columns needing a null check).
    pub fn null_checks(&self) -> impl Iterator<Item = &ValueCheck> {
        self.checks.iter().filter(|c| c.nulls)
    }
}

/// One reason an input does not fit the target table.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SchemaProblem {
    /// The input has no columns at all.
    #[error("the input has no columns")]
    NoColumns,
    /// An input column name appears more than once.
    #[error("column `{column}` appears {count} times in the input")]
    DuplicateColumn {
        /// Column name.
        column: String,
        /// How often it appears.
        count: usize,
    },
    /// An input column the target does not have.
    #[error(
        "column `{column}` (Arrow type {arrow_type}) is not a column of the target table{hint}"
    )]
    ExtraColumn {
        /// Column name.
        column: String,
        /// Its Arrow type.
        arrow_type: String,
        /// `"; did you mean `X`?"` when a target column differs only in case, else empty.
        hint: String,
    },
    /// An input column that names a computed target column.
    #[error(
        "column `{column}` (Arrow type {arrow_type}) is a {default_kind} column of the target \
         table (ClickHouse type {ch_type}) and cannot be inserted"
    )]
    NotInsertable {
        /// Column name.
        column: String,
        /// Its Arrow type.
        arrow_type: String,
        /// Its ClickHouse type.
        ch_type: String,
        /// `MATERIALIZED` or `ALIAS`.
        default_kind: String,
    },
    /// A target column without a default that the input lacks.
    #[error(
        "target column `{column}` (ClickHouse type {ch_type}) is missing from the input and has \
         no DEFAULT"
    )]
    MissingColumn {
        /// Column name.
        column: String,
        /// Its ClickHouse type.
        ch_type: String,
    },
    /// An Arrow type that does not convert losslessly to the target type.
    #[error(
        "column `{column}`: Arrow type {arrow_type} cannot be stored losslessly as ClickHouse type \
         {ch_type}{detail}"
    )]
    Incompatible {
        /// Column name.
        column: String,
        /// The column's Arrow type.
        arrow_type: String,
        /// The column's ClickHouse type.
        ch_type: String,
        /// Which nested part and why, e.g. `" (at `c`[*]: Arrow Int64 into Int32: ...)"`.
        detail: String,
    },
}

/// An input that does not fit the target table; lists every problem found.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub struct SchemaError {
    /// The input's name (file path or `stdin`).
    pub input: String,
    /// Every problem, input columns first (in input order), then missing target columns.
    pub problems: Vec<SchemaProblem>,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: the input's schema does not fit the target table ({} problem(s)):",
            self.input,
            self.problems.len()
        )?;
        for problem in &self.problems {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

/// Checks `input` against the target's columns (`target`, in table order) and plans the load.
/// `source` names the input (file path or `stdin`) in messages. For a Parquet file, pass the
/// schema of [`ParquetInput::arrow_schema`](crate::ParquetInput::arrow_schema) (or use
/// [`ParquetInput::check_schema`](crate::ParquetInput::check_schema)): it is what ClickHouse
/// reads.
pub fn check_schema(
    input: &Schema,
    target: &[TargetColumn],
    source: &str,
) -> Result<InputPlan, SchemaError> {
    let mut problems = Vec::new();
    let mut columns = Vec::new();
    let mut checks = Vec::new();
    if input.fields().is_empty() {
        problems.push(SchemaProblem::NoColumns);
    }
    for (input_index, field) in input.fields().iter().enumerate() {
        let name = field.name();
        let count = input.fields().iter().filter(|f| f.name() == name).count();
        if count > 1 {
            if input.fields().iter().position(|f| f.name() == name) == Some(input_index) {
                problems.push(SchemaProblem::DuplicateColumn {
                    column: name.clone(),
                    count,
                });
            }
            continue;
        }
        let Some(target_index) = target.iter().position(|c| &c.name == name) else {
            let hint = target
                .iter()
                .find(|c| c.name.eq_ignore_ascii_case(name))
                .map(|c| format!("; did you mean `{}`?", c.name))
                .unwrap_or_default();
            problems.push(SchemaProblem::ExtraColumn {
                column: name.clone(),
                arrow_type: field.data_type().to_string(),
                hint,
            });
            continue;
        };
        let column = &target[target_index];
        if !column.insertable() {
            problems.push(SchemaProblem::NotInsertable {
                column: name.clone(),
                arrow_type: field.data_type().to_string(),
                ch_type: column.ch_type.to_string(),
                default_kind: column.default_kind.clone(),
            });
            continue;
        }
        let top = Backquoted(name).to_string();
        if let Err(mismatch) = compatible(field.data_type(), &column.ch_type, &top) {
            problems.push(SchemaProblem::Incompatible {
                column: name.clone(),
                arrow_type: field.data_type().to_string(),
                ch_type: column.ch_type.to_string(),
                detail: mismatch.detail(&top),
            });
            continue;
        }
        let nulls = null_may_reach_non_nullable(field, &column.ch_type);
        let datetime_range = lands_in_datetime(field.data_type(), &column.ch_type);
        if nulls || datetime_range {
            checks.push(ValueCheck {
                input_index,
                column: name.clone(),
                arrow_type: field.data_type().clone(),
                ch_type: column.ch_type.clone(),
                nulls,
                datetime_range,
            });
        }
        columns.push(ColumnMapping {
            input_index,
            target_index,
            name: name.clone(),
            arrow_type: field.data_type().clone(),
            ch_type: column.ch_type.clone(),
        });
    }
    for column in target {
        let present = input.fields().iter().any(|f| f.name() == &column.name);
        if !present && !column.has_default() {
            problems.push(SchemaProblem::MissingColumn {
                column: column.name.clone(),
                ch_type: column.ch_type.to_string(),
            });
        }
    }
    if !problems.is_empty() {
        return Err(SchemaError {
            input: source.to_owned(),
            problems,
        });
    }
    let mut by_target: Vec<&ColumnMapping> = columns.iter().collect();
    by_target.sort_by_key(|c| c.target_index);
    let insert_columns = by_target.iter().map(|c| c.name.clone()).collect();
    let structure = columns
        .iter()
        .map(|c| format!("{} {}", Backquoted(&c.name), c.ch_type))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(InputPlan {
        source: source.to_owned(),
        columns,
        insert_columns,
        structure,
        checks,
    })
}

/// The innermost place where two types disagree.
#[derive(Debug)]
struct Mismatch {
    /// Position inside the column, e.g. `` `c`[*] ``.
    position: String,
    arrow: String,
    ch: String,
    why: String,
}

impl Mismatch {
    fn new(position: &str, arrow: &DataType, ch: &ChType, why: impl Into<String>) -> Mismatch {
        Mismatch {
            position: position.to_owned(),
            arrow: arrow.to_string(),
            ch: ch.to_string(),
            why: why.into(),
        }
    }

    /// The text after the top-level message: the nested position when the disagreement is
    /// inside a container, and the reason when there is one.
    fn detail(&self, top: &str) -> String {
        let nested = self.position != top;
        match (nested, self.why.is_empty()) {
            (false, true) => String::new(),
            (false, false) => format!(" ({})", self.why),
            (true, true) => format!(
                " (at {}: Arrow {} into {})",
                self.position, self.arrow, self.ch
            ),
            (true, false) => format!(
                " (at {}: Arrow {} into {}: {})",
                self.position, self.arrow, self.ch, self.why
            ),
        }
    }
}

/// Signedness and width of an Arrow integer type.
fn arrow_int(dt: &DataType) -> Option<(bool, u32)> {
    Some(match dt {
        DataType::Int8 => (true, 8),
        DataType::Int16 => (true, 16),
        DataType::Int32 => (true, 32),
        DataType::Int64 => (true, 64),
        DataType::UInt8 => (false, 8),
        DataType::UInt16 => (false, 16),
        DataType::UInt32 => (false, 32),
        DataType::UInt64 => (false, 64),
        _ => return None,
    })
}

/// Signedness and width of a ClickHouse integer type.
fn ch_int(ch: &ChType) -> Option<(bool, u32)> {
    Some(match ch {
        ChType::Int8 => (true, 8),
        ChType::Int16 => (true, 16),
        ChType::Int32 => (true, 32),
        ChType::Int64 => (true, 64),
        ChType::Int128 => (true, 128),
        ChType::Int256 => (true, 256),
        ChType::UInt8 => (false, 8),
        ChType::UInt16 => (false, 16),
        ChType::UInt32 => (false, 32),
        ChType::UInt64 => (false, 64),
        ChType::UInt128 => (false, 128),
        ChType::UInt256 => (false, 256),
        _ => return None,
    })
}

fn is_text(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

fn is_bytes(dt: &DataType) -> bool {
    is_text(dt)
        || matches!(
            dt,
            DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
                | DataType::FixedSizeBinary(_)
        )
}

/// Whether every value of `arrow` converts into `ch` without loss (see the README's "Type mapping").
fn compatible(arrow: &DataType, ch: &ChType, position: &str) -> Result<(), Mismatch> {
    let no = |why: &str| Err(Mismatch::new(position, arrow, ch, why));
    match ch {
        // NULL-ness is a value question (see checks.rs); the type only has to fit inside.
        ChType::Nullable(inner) => return compatible(arrow, inner, position),
        ChType::LowCardinality(inner) => {
            let values = match arrow {
                DataType::Dictionary(_, values) => values,
                other => other,
            };
            return compatible(values, inner, position);
        }
        _ => {}
    }
    if let DataType::Dictionary(_, values) = arrow {
        // ClickHouse reads a dictionary as LowCardinality and converts from there: the same
        // values as the plain type.
        return compatible(values, ch, position);
    }
    if let Some((ch_signed, ch_bits)) = ch_int(ch) {
        let Some((signed, bits)) = arrow_int(arrow) else {
            return no("");
        };
        let fits = if signed == ch_signed {
            ch_bits >= bits
        } else {
            !signed && ch_signed && ch_bits > bits
        };
        return if fits {
            Ok(())
        } else if signed && !ch_signed {
            no("negative values do not fit an unsigned type")
        } else {
            no("the ClickHouse type holds a smaller range")
        };
    }
    match (arrow, ch) {
        (DataType::Float32, ChType::Float32 | ChType::Float64) | (DataType::Float64, ChType::Float64) => Ok(()),
        (DataType::Float64, ChType::Float32) => no("Float64 values would be rounded to Float32"),
        (
            DataType::Decimal32(p, s) | DataType::Decimal64(p, s) | DataType::Decimal128(p, s),
            ChType::Decimal { precision, scale },
        ) => decimal(*p, *s, *precision, *scale).or_else(|why| no(&why)),
        (DataType::Decimal256(p, s), ChType::Decimal { precision, scale }) => {
            decimal(*p, *s, *precision, *scale).or_else(|why| no(&why))
        }
        // ClickHouse's Parquet and Arrow readers both drop trailing zero bytes of fixed-size
        // binary values read as String (b"a\0\0" becomes "a"); FixedString keeps them.
        (DataType::FixedSizeBinary(n), ChType::String) => no(&format!(
            "ClickHouse drops trailing zero bytes of fixed-size binary values read as String; use FixedString({n})"
        )),
        (dt, ChType::String) if is_bytes(dt) => Ok(()),
        (DataType::FixedSizeBinary(n), ChType::FixedString(m)) if i64::from(*n) == i64::from(*m) => Ok(()),
        (DataType::FixedSizeBinary(n), ChType::FixedString(m)) => {
            no(&format!("{n} bytes per value vs FixedString({m})"))
        }
        (DataType::Boolean, ChType::Bool) => Ok(()),
        (DataType::Date32, ChType::Date | ChType::Date32) => Ok(()),
        (DataType::Timestamp(_, _), ChType::DateTime(_) | ChType::DateTime64 { .. }) => Ok(()),
        (DataType::Date64, ChType::DateTime(_)) => Ok(()),
        // ClickHouse's Arrow reader turns Date64 into DateTime (whole seconds, wrapping outside
        // 1970..2106) before any DateTime64 conversion: milliseconds would be lost.
        (DataType::Date64, ChType::DateTime64 { .. }) => no(
            "ClickHouse reads Arrow Date64 as DateTime (whole seconds); use a DateTime column, or send \
             Timestamp(Millisecond)",
        ),
        (DataType::Timestamp(_, _) | DataType::Date64, ChType::Date | ChType::Date32) => {
            no("the time of day would be dropped; use DateTime or DateTime64")
        }
        (DataType::FixedSizeBinary(16), ChType::Uuid | ChType::Ipv6) => Ok(()),
        (dt, ChType::Uuid | ChType::Ipv4 | ChType::Ipv6) if is_text(dt) => Ok(()),
        (DataType::UInt32, ChType::Ipv4) => Ok(()),
        (dt, ChType::Enum8(_) | ChType::Enum16(_)) if is_text(dt) => Ok(()),
        (DataType::List(item) | DataType::LargeList(item), ChType::Array(inner)) => {
            compatible(item.data_type(), inner, &format!("{position}[*]"))
        }
        (DataType::Map(entries, _), ChType::Map(key, value)) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return no("malformed Arrow map");
            };
            if kv.len() != 2 {
                return no("malformed Arrow map");
            }
            compatible(kv[0].data_type(), key, &format!("{position}{{key}}"))?;
            compatible(kv[1].data_type(), value, &format!("{position}{{value}}"))
        }
        (DataType::Struct(fields), ChType::Tuple(elements)) => {
            if fields.len() != elements.len() {
                return no(&format!("the struct has {} field(s), the tuple {} element(s)", fields.len(), elements.len()));
            }
            for (index, element) in elements.iter().enumerate() {
                match &element.name {
                    // Named tuples are matched by name: ClickHouse does the same when reading.
                    Some(name) => {
                        let Some(field) = fields.iter().find(|f| f.name() == name) else {
                            return no(&format!("the struct has no field `{name}`"));
                        };
                        compatible(field.data_type(), &element.ty, &format!("{position}.{}", SqlName(name)))?;
                    }
                    None => {
                        let position = format!("{position}.{}", index + 1);
                        compatible(fields[index].data_type(), &element.ty, &position)?
                    }
                }
            }
            Ok(())
        }
        _ => no(""),
    }
}

/// Decimal(p, s) fits Decimal(P, S) when the scale is the same and no digit is lost.
fn decimal(p: u8, s: i8, precision: u8, scale: u8) -> Result<(), String> {
    if i16::from(s) != i16::from(scale) {
        return Err(format!("scale {s} differs from the column's scale {scale}"));
    }
    if p > precision {
        return Err(format!(
            "precision {p} exceeds the column's precision {precision}"
        ));
    }
    Ok(())
}

/// Whether a NULL can occur (per the Arrow field's declared nullability, at any depth) where
/// the ClickHouse type cannot hold it. Only called for compatible pairs.
fn null_may_reach_non_nullable(field: &Field, ch: &ChType) -> bool {
    if field.is_nullable() && !ch.is_nullable() {
        return true;
    }
    match (field.data_type(), ch.storage()) {
        (DataType::List(item) | DataType::LargeList(item), ChType::Array(inner)) => {
            null_may_reach_non_nullable(item, inner)
        }
        (DataType::Map(entries, _), ChType::Map(key, value)) => match entries.data_type() {
            DataType::Struct(kv) => {
                null_may_reach_non_nullable(&kv[0], key)
                    || null_may_reach_non_nullable(&kv[1], value)
            }
            _ => false,
        },
        (DataType::Struct(fields), ChType::Tuple(elements)) => {
            elements.iter().enumerate().any(|(index, element)| {
                let field = match &element.name {
                    Some(name) => fields.iter().find(|f| f.name() == name),
                    None => fields.get(index),
                };
                field.is_some_and(|f| null_may_reach_non_nullable(f, &element.ty))
            })
        }
        _ => false,
    }
}

/// Whether some timestamp of the input is stored as `DateTime` (32-bit, clamped).
fn lands_in_datetime(arrow: &DataType, ch: &ChType) -> bool {
    match (arrow, ch.storage()) {
        (DataType::Timestamp(_, _) | DataType::Date64, ChType::DateTime(_)) => true,
        (DataType::Dictionary(_, values), storage) => lands_in_datetime(values, storage),
        (DataType::List(item) | DataType::LargeList(item), ChType::Array(inner)) => {
            lands_in_datetime(item.data_type(), inner)
        }
        (DataType::Map(entries, _), ChType::Map(key, value)) => match entries.data_type() {
            DataType::Struct(kv) => {
                lands_in_datetime(kv[0].data_type(), key)
                    || lands_in_datetime(kv[1].data_type(), value)
            }
            _ => false,
        },
        (DataType::Struct(fields), ChType::Tuple(elements)) => {
            elements.iter().enumerate().any(|(index, element)| {
                let field = match &element.name {
                    Some(name) => fields.iter().find(|f| f.name() == name),
                    None => fields.get(index),
                };
                field.is_some_and(|f| lands_in_datetime(f.data_type(), &element.ty))
            })
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::{Field, Fields, TimeUnit};

    use super::*;

    fn target(columns: &[(&str, &str, &str)]) -> Vec<TargetColumn> {
        columns
            .iter()
            .map(|(name, ty, kind)| TargetColumn {
                name: (*name).into(),
                ch_type: ty.parse().unwrap_or_else(|e| panic!("{e}")),
                default_kind: (*kind).into(),
            })
            .collect()
    }

    fn list(item: DataType, nullable: bool) -> DataType {
        DataType::List(Arc::new(Field::new("item", item, nullable)))
    }

    fn large_list(item: DataType) -> DataType {
        DataType::LargeList(Arc::new(Field::new("element", item, true)))
    }

    fn map(key: DataType, value: DataType, value_nullable: bool) -> DataType {
        let entries = Fields::from(vec![
            Field::new("key", key, false),
            Field::new("value", value, value_nullable),
        ]);
        DataType::Map(
            Arc::new(Field::new("entries", DataType::Struct(entries), false)),
            false,
        )
    }

    fn strukt(fields: &[(&str, DataType, bool)]) -> DataType {
        DataType::Struct(
            fields
                .iter()
                .map(|(n, t, null)| Field::new(*n, t.clone(), *null))
                .collect(),
        )
    }

    fn dict(key: DataType, value: DataType) -> DataType {
        DataType::Dictionary(Box::new(key), Box::new(value))
    }

    fn ts(unit: TimeUnit, tz: Option<&str>) -> DataType {
        DataType::Timestamp(unit, tz.map(Into::into))
    }

    /// Plans one column `c` of `arrow` (non-nullable unless said) into a table `c ch`.
    fn plan_one(arrow: DataType, nullable: bool, ch: &str) -> Result<InputPlan, SchemaError> {
        let schema = Schema::new(vec![Field::new("c", arrow, nullable)]);
        check_schema(&schema, &target(&[("c", ch, "")]), "in.parquet")
    }

    #[test]
    fn accepted_type_pairs() {
        use DataType as A;
        use TimeUnit::*;
        // (Arrow type, ClickHouse type): every row of the README's type mapping table.
        let rows: Vec<(DataType, &str)> = vec![
            (A::Int8, "Int8"),
            (A::Int8, "Int16"),
            (A::Int16, "Int32"),
            (A::Int32, "Int64"),
            (A::Int64, "Int64"),
            (A::Int64, "Int128"),
            (A::Int64, "Int256"),
            (A::UInt8, "UInt8"),
            (A::UInt8, "Int16"),
            (A::UInt16, "UInt64"),
            (A::UInt16, "Int32"),
            (A::UInt32, "Int64"),
            (A::UInt64, "UInt64"),
            (A::UInt64, "UInt128"),
            (A::UInt64, "Int128"),
            (A::UInt64, "UInt256"),
            (A::Float32, "Float32"),
            (A::Float32, "Float64"),
            (A::Float64, "Float64"),
            (A::Decimal32(9, 2), "Decimal(9, 2)"),
            (A::Decimal64(18, 4), "Decimal(18, 4)"),
            (A::Decimal128(5, 2), "Decimal(5, 2)"),
            (A::Decimal128(10, 2), "Decimal(20, 2)"),
            (A::Decimal128(38, 18), "Decimal(38, 18)"),
            (A::Decimal256(76, 10), "Decimal(76, 10)"),
            (A::Utf8, "String"),
            (A::LargeUtf8, "String"),
            (A::Utf8View, "String"),
            (A::Binary, "String"),
            (A::LargeBinary, "String"),
            (A::BinaryView, "String"),
            (A::FixedSizeBinary(3), "FixedString(3)"),
            (A::Boolean, "Bool"),
            (A::Date32, "Date"),
            (A::Date32, "Date32"),
            (ts(Second, None), "DateTime"),
            (ts(Microsecond, Some("UTC")), "DateTime('Europe/Berlin')"),
            (ts(Nanosecond, Some("+01:00")), "DateTime64(9, 'UTC')"),
            (ts(Millisecond, None), "DateTime64(3)"),
            (A::Date64, "DateTime('UTC')"),
            (A::FixedSizeBinary(16), "UUID"),
            (A::Utf8, "UUID"),
            (A::UInt32, "IPv4"),
            (A::Utf8, "IPv4"),
            (A::FixedSizeBinary(16), "IPv6"),
            (A::LargeUtf8, "IPv6"),
            (A::Utf8, "Enum8('a' = 1, 'b' = 2)"),
            (dict(A::Int32, A::Utf8), "Enum16('a' = 1000)"),
            (A::Utf8, "LowCardinality(String)"),
            (dict(A::Int8, A::Utf8), "LowCardinality(String)"),
            (
                dict(A::Int32, A::LargeUtf8),
                "LowCardinality(Nullable(String))",
            ),
            (dict(A::Int32, A::Utf8), "String"),
            (A::Int32, "Nullable(Int64)"),
            (A::Utf8, "Nullable(String)"),
            (list(A::Int32, true), "Array(Int64)"),
            (large_list(A::LargeUtf8), "Array(String)"),
            (list(list(A::Int8, false), false), "Array(Array(Int16))"),
            (map(A::Utf8, A::Int64, true), "Map(String, Int64)"),
            (
                map(A::LargeUtf8, A::Decimal128(5, 2), true),
                "Map(LowCardinality(String), Nullable(Decimal(9, 2)))",
            ),
            (
                strukt(&[("x", A::Int32, false), ("y", A::Utf8, true)]),
                "Tuple(Int32, String)",
            ),
            (
                strukt(&[("y", A::Utf8, false), ("x", A::Int32, false)]),
                "Tuple(x Int32, y String)",
            ),
            (
                strukt(&[("a", strukt(&[("b", list(A::Int16, true), true)]), true)]),
                "Tuple(a Tuple(b Array(Nullable(Int32))))",
            ),
        ];
        for (arrow, ch) in rows {
            let plan = plan_one(arrow.clone(), false, ch)
                .unwrap_or_else(|e| panic!("{arrow} -> {ch}: {e}"));
            assert_eq!(plan.structure, format!("`c` {ch}"), "{arrow} -> {ch}");
        }
    }

    #[test]
    fn rejected_type_pairs_name_column_and_both_types() {
        use DataType as A;
        use TimeUnit::*;
        // (Arrow type, ClickHouse type, expected detail substring)
        let rows: Vec<(DataType, &str, &str)> = vec![
            (A::Int64, "Int32", "holds a smaller range"),
            (A::Int64, "UInt64", "negative values do not fit an unsigned type"),
            (A::Int8, "UInt256", "negative values do not fit"),
            (A::UInt32, "Int32", "holds a smaller range"),
            (A::UInt64, "Int64", "holds a smaller range"),
            (A::Utf8, "Int64", ""),
            (A::Float64, "Int64", ""),
            (A::Int32, "Float64", ""),
            (A::Float64, "Float32", "rounded to Float32"),
            (A::Decimal128(10, 2), "Decimal(9, 2)", "precision 10 exceeds the column's precision 9"),
            (A::Decimal128(10, 2), "Decimal(20, 3)", "scale 2 differs from the column's scale 3"),
            (A::Decimal256(40, 0), "Int128", ""),
            (A::Int64, "String", ""),
            (A::FixedSizeBinary(4), "FixedString(3)", "4 bytes per value vs FixedString(3)"),
            (A::Binary, "FixedString(3)", ""),
            (A::FixedSizeBinary(3), "String", "drops trailing zero bytes of fixed-size binary values read as String; use FixedString(3)"),
            (A::FixedSizeBinary(16), "Nullable(String)", "drops trailing zero bytes"),
            (list(A::FixedSizeBinary(2), false), "Array(LowCardinality(String))", "at `c`[*]: Arrow FixedSizeBinary(2) into String: ClickHouse drops"),
            (A::Date64, "DateTime64(3, 'UTC')", "reads Arrow Date64 as DateTime (whole seconds)"),
            (A::Int8, "Bool", ""),
            (A::Boolean, "UInt8", ""),
            (A::Date32, "DateTime", ""),
            (ts(Microsecond, Some("UTC")), "Date", "time of day would be dropped"),
            (A::Date64, "Date32", "time of day would be dropped"),
            (A::Int64, "DateTime64(3)", ""),
            (A::FixedSizeBinary(15), "UUID", ""),
            (A::Binary, "UUID", ""),
            (A::Int64, "IPv4", ""),
            (A::FixedSizeBinary(4), "IPv6", ""),
            (A::Int8, "Enum8('a' = 1)", ""),
            (A::Int64, "LowCardinality(String)", ""),
            (dict(A::Int8, A::Int64), "String", ""),
            (A::Int64, "Nullable(Int8)", "holds a smaller range"),
            (A::Int32, "Array(Int32)", ""),
            (list(A::Int64, true), "Array(Int32)", "at `c`[*]: Arrow Int64 into Int32: the ClickHouse type holds a smaller range"),
            (list(A::Int64, true), "Int64", ""),
            (map(A::Utf8, A::Int64, true), "Map(String, String)", "at `c`{value}: Arrow Int64 into String"),
            (map(A::Int64, A::Int64, true), "Map(String, Int64)", "at `c`{key}: Arrow Int64 into String"),
            (strukt(&[("x", A::Int32, false)]), "Tuple(Int32, String)", "the struct has 1 field(s), the tuple 2 element(s)"),
            (strukt(&[("x", A::Int32, false), ("z", A::Utf8, false)]), "Tuple(x Int32, y String)", "the struct has no field `y`"),
            (strukt(&[("x", A::Int64, false)]), "Tuple(x Int32)", "at `c`.x: Arrow Int64 into Int32"),
            (strukt(&[("x", A::Utf8, false)]), "Tuple(Int32)", "at `c`.1: Arrow Utf8 into Int32"),
            (A::Duration(Second), "Int64", ""),
            (A::Time64(Microsecond), "Int64", ""),
            (A::Float16, "Float32", ""),
        ];
        for (arrow, ch, detail) in rows {
            let err = plan_one(arrow.clone(), false, ch).expect_err(&format!("{arrow} -> {ch}"));
            let text = err.to_string();
            let head = format!("column `c`: Arrow type {arrow} cannot be stored losslessly as ClickHouse type {ch}");
            assert!(text.contains(&head), "{arrow} -> {ch}: {text}");
            assert!(text.contains(detail), "{arrow} -> {ch}: {text}");
            assert!(text.starts_with("in.parquet: "), "{text}");
        }
    }

    #[test]
    fn column_set_problems_are_all_reported() {
        let table = target(&[
            ("id", "UInt64", ""),
            ("name", "String", ""),
            ("created", "DateTime", "DEFAULT"),
            ("day", "Date", "MATERIALIZED"),
            ("upper", "String", "ALIAS"),
            ("raw", "String", "EPHEMERAL"),
            ("amount", "Decimal(9, 2)", ""),
            ("Label", "String", "DEFAULT"),
        ]);
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("extra", DataType::Utf8, true),
            Field::new("day", DataType::Date32, false),
            Field::new("label", DataType::Utf8, false),
            Field::new("dup", DataType::Int8, false),
            Field::new("dup", DataType::Int8, false),
        ]);
        let err = check_schema(&schema, &table, "stdin").unwrap_err();
        let expected = "stdin: the input's schema does not fit the target table (7 problem(s)):\n  \
            - column `id`: Arrow type Int64 cannot be stored losslessly as ClickHouse type UInt64 (negative values do not fit an unsigned type)\n  \
            - column `extra` (Arrow type Utf8) is not a column of the target table\n  \
            - column `day` (Arrow type Date32) is a MATERIALIZED column of the target table (ClickHouse type Date) and cannot be inserted\n  \
            - column `label` (Arrow type Utf8) is not a column of the target table; did you mean `Label`?\n  \
            - column `dup` appears 2 times in the input\n  \
            - target column `name` (ClickHouse type String) is missing from the input and has no DEFAULT\n  \
            - target column `amount` (ClickHouse type Decimal(9, 2)) is missing from the input and has no DEFAULT";
        assert_eq!(err.to_string(), expected);
        let empty = check_schema(
            &Schema::empty(),
            &target(&[("a", "Int8", "DEFAULT")]),
            "x.parquet",
        )
        .unwrap_err();
        assert_eq!(empty.problems, vec![SchemaProblem::NoColumns]);
    }

    #[test]
    fn plan_orders_insert_columns_by_target_and_structure_by_input() {
        let table = target(&[
            ("id", "UInt64", ""),
            ("created", "DateTime", "DEFAULT"),
            ("my col", "Nullable(String)", ""),
            ("day", "Date", "MATERIALIZED"),
            ("tick`s", "Array(Int32)", ""),
            ("raw", "String", "EPHEMERAL"),
        ]);
        let schema = Schema::new(vec![
            Field::new("tick`s", list(DataType::Int16, false), false),
            Field::new("my col", DataType::LargeUtf8, true),
            Field::new("id", DataType::UInt32, false),
        ]);
        let plan = check_schema(&schema, &table, "f.parquet").unwrap();
        assert_eq!(plan.insert_columns, vec!["id", "my col", "tick`s"]);
        assert_eq!(plan.insert_column_list(), r"`id`, `my col`, `tick\`s`");
        assert_eq!(
            plan.structure,
            r"`tick\`s` Array(Int32), `my col` Nullable(String), `id` UInt64"
        );
        let mapping: Vec<(usize, usize, &str)> = plan
            .columns
            .iter()
            .map(|c| (c.input_index, c.target_index, c.name.as_str()))
            .collect();
        assert_eq!(
            mapping,
            vec![(0, 4, "tick`s"), (1, 2, "my col"), (2, 0, "id")]
        );
        assert!(plan.checks.is_empty(), "{:?}", plan.checks);
    }

    #[test]
    fn value_checks_are_planned_where_data_can_change() {
        use DataType as A;
        use TimeUnit::*;
        // (Arrow type, field nullable, ClickHouse type, expect null check, expect DateTime range check)
        let rows: Vec<(DataType, bool, &str, bool, bool)> = vec![
            (A::Int32, false, "Int32", false, false),
            (A::Int32, true, "Int32", true, false),
            (A::Int32, true, "Nullable(Int32)", false, false),
            (A::Utf8, true, "LowCardinality(String)", true, false),
            (
                A::Utf8,
                true,
                "LowCardinality(Nullable(String))",
                false,
                false,
            ),
            (list(A::Int32, true), false, "Array(Int32)", true, false),
            (
                list(A::Int32, true),
                false,
                "Array(Nullable(Int32))",
                false,
                false,
            ),
            (list(A::Int32, false), false, "Array(Int32)", false, false),
            (list(A::Int32, false), true, "Array(Int32)", true, false),
            (
                map(A::Utf8, A::Int64, true),
                false,
                "Map(String, Int64)",
                true,
                false,
            ),
            (
                map(A::Utf8, A::Int64, false),
                false,
                "Map(String, Int64)",
                false,
                false,
            ),
            (
                map(A::Utf8, A::Int64, true),
                false,
                "Map(String, Nullable(Int64))",
                false,
                false,
            ),
            (
                strukt(&[("x", A::Int32, true)]),
                false,
                "Tuple(Int32)",
                true,
                false,
            ),
            (
                strukt(&[("x", A::Int32, true)]),
                false,
                "Tuple(x Nullable(Int32))",
                false,
                false,
            ),
            (
                ts(Microsecond, Some("UTC")),
                false,
                "DateTime64(6, 'UTC')",
                false,
                false,
            ),
            (
                ts(Microsecond, Some("UTC")),
                false,
                "DateTime('UTC')",
                false,
                true,
            ),
            (
                ts(Microsecond, Some("UTC")),
                true,
                "Nullable(DateTime)",
                false,
                true,
            ),
            (A::Date64, true, "DateTime", true, true),
            (
                list(ts(Second, None), false),
                false,
                "Array(DateTime)",
                false,
                true,
            ),
            (
                strukt(&[("t", A::Date64, false)]),
                false,
                "Tuple(t DateTime)",
                false,
                true,
            ),
        ];
        for (arrow, nullable, ch, nulls, range) in rows {
            let plan = plan_one(arrow.clone(), nullable, ch).unwrap_or_else(|e| panic!("{e}"));
            let found = plan
                .checks
                .first()
                .map(|c| (c.nulls, c.datetime_range))
                .unwrap_or((false, false));
            assert_eq!(
                found,
                (nulls, range),
                "{arrow} (nullable {nullable}) -> {ch}"
            );
            assert_eq!(
                plan.null_checks().count(),
                usize::from(nulls),
                "{arrow} -> {ch}"
            );
        }
    }
}
