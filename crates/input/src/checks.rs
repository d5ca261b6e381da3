//! Value checks: what the schema check cannot prove and ClickHouse would not report.
//!
//! Two conversions succeed silently in clickhouse-local yet change the data:
//!
//! - a NULL arriving at a position whose ClickHouse type is not `Nullable` (a column, an
//!   `Array` element, a `Map` value, a `Tuple` element) is stored as the type's default
//!   (`0`, `''`, `1970-01-01`) because `input_format_null_as_default` is on;
//! - a timestamp outside `DateTime`'s range (1970-01-01 00:00:00 to 2106-02-07 06:28:15 UTC)
//!   is clamped to the nearest end (Arrow `Timestamp`) or wrapped around modulo 2^32 seconds
//!   (Arrow `Date64`). `DateTime64` has no such problem: it errors on overflow.
//!
//! The schema check records one [`ValueCheck`] per input column where either can happen (the
//! Arrow side is nullable somewhere the ClickHouse side is not, or a timestamp lands in a
//! `DateTime`), and the readers run [`ValueCheck::check_array`] on each batch of that column.
//! Containers in ClickHouse are never `Nullable`, so a NULL list, map or struct is itself an
//! error; once a container level passes, every child element is visible to ClickHouse, which
//! is why children are checked over the whole referenced range.

use std::fmt;

use arrow_array::cast::AsArray;
use arrow_array::types::{Date64Type, TimestampMicrosecondType, TimestampMillisecondType};
use arrow_array::types::{TimestampNanosecondType, TimestampSecondType};
use arrow_array::{Array, ArrayRef, OffsetSizeTrait, PrimitiveArray};
use arrow_schema::{DataType, TimeUnit};
use thiserror::Error;

use crate::chtype::{Backquoted, ChType, SqlName};

/// A column whose values must be checked before clickhouse-local reads them.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueCheck {
    /// Index of the column in the input schema.
    pub input_index: usize,
    /// Column name (the same in input and target).
    pub column: String,
    /// The column's Arrow type in the input.
    pub arrow_type: DataType,
    /// The target column's ClickHouse type.
    pub ch_type: ChType,
    /// Some position may hold NULL in Arrow but not in ClickHouse.
    pub nulls: bool,
    /// Some timestamp position is stored as `DateTime` (clamped outside 1970..2106).
    pub datetime_range: bool,
}

/// What a value check found; the reader adds where (file and row group, or batch).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ValueProblem {
    /// NULLs at a position whose ClickHouse type cannot hold NULL.
    #[error(
        "column `{column}` has {count} NULL value(s) at {position}{}, but ClickHouse type \
         {ch_type} is not Nullable (input Arrow type {arrow_type}, column type {column_type}); \
         ClickHouse would silently store the type's default instead",
        first_row.map(|row| format!(" (first at row {row})")).unwrap_or_default()
    )]
    Null {
        /// Column name.
        column: String,
        /// Where inside the column, e.g. `` `tags`[*] `` for array elements.
        position: String,
        /// How many NULLs were found in this batch or row group.
        count: u64,
        /// The first row with a NULL, for top-level NULLs (counted from the start of the row
        /// group or stream); `None` inside containers.
        first_row: Option<u64>,
        /// The ClickHouse type at that position.
        ch_type: String,
        /// The Arrow type at that position.
        arrow_type: String,
        /// The whole column's ClickHouse type.
        column_type: String,
    },
    /// A timestamp outside `DateTime`'s range.
    #[error(
        "column `{column}` has {count} value(s) at {position} outside ClickHouse DateTime's range \
         1970-01-01 00:00:00 .. 2106-02-07 06:28:15 UTC (first: {first} {unit} since 1970, input \
         Arrow type {arrow_type}, column type {column_type}); ClickHouse would silently clamp \
         or wrap them; use DateTime64 (from an Arrow Timestamp) for such values"
    )]
    DateTimeRange {
        /// Column name.
        column: String,
        /// Where inside the column.
        position: String,
        /// How many values are out of range.
        count: u64,
        /// The first such raw value.
        first: i64,
        /// The raw value's unit (`s`, `ms`, `us`, `ns`).
        unit: &'static str,
        /// The Arrow type at that position.
        arrow_type: String,
        /// The whole column's ClickHouse type.
        column_type: String,
    },
}

/// Raw ticks per second of a timestamp unit, and its short name.
pub(crate) fn unit_scale(unit: TimeUnit) -> (i64, &'static str) {
    match unit {
        TimeUnit::Second => (1, "s"),
        TimeUnit::Millisecond => (1_000, "ms"),
        TimeUnit::Microsecond => (1_000_000, "us"),
        TimeUnit::Nanosecond => (1_000_000_000, "ns"),
    }
}

/// Whether a raw timestamp in ticks of `1/per_second` s fits `DateTime` without clamping:
/// from 1970-01-01 00:00:00 up to (not including) one second after 2106-02-07 06:28:15, since
/// ClickHouse drops the sub-second part.
pub(crate) fn datetime_fits(raw: i64, per_second: i64) -> bool {
    raw >= 0 && (raw / per_second) <= i64::from(u32::MAX)
}

impl ValueCheck {
    /// Checks one batch of this column; `Err` describes the first violated position.
    /// `first_row` is the batch's first row number, to report rows relative to the row group
    /// or stream rather than to the batch.
    pub fn check_array(&self, array: &dyn Array, first_row: u64) -> Result<(), Box<ValueProblem>> {
        self.walk(
            array,
            &self.ch_type,
            &Backquoted(&self.column).to_string(),
            Some(first_row),
        )
    }

    /// `first_row` is `Some` at the top level only, where array index = row.
    fn walk(
        &self,
        array: &dyn Array,
        ch: &ChType,
        position: &str,
        first_row: Option<u64>,
    ) -> Result<(), Box<ValueProblem>> {
        if !ch.is_nullable() {
            if let Some(nulls) = array.logical_nulls().filter(|n| n.null_count() > 0) {
                let first_row = first_row
                    .map(|start| start + nulls.iter().position(|valid| !valid).unwrap_or(0) as u64);
                return Err(Box::new(ValueProblem::Null {
                    column: self.column.clone(),
                    position: position.to_owned(),
                    count: nulls.null_count() as u64,
                    first_row,
                    ch_type: ch.to_string(),
                    arrow_type: array.data_type().to_string(),
                    column_type: self.ch_type.to_string(),
                }));
            }
        }
        let storage = ch.storage();
        match (array.data_type(), storage) {
            (DataType::Timestamp(unit, _), ChType::DateTime(_)) => {
                let (per_second, name) = unit_scale(*unit);
                let raw = match unit {
                    TimeUnit::Second => reinterpret::<TimestampSecondType>(array),
                    TimeUnit::Millisecond => reinterpret::<TimestampMillisecondType>(array),
                    TimeUnit::Microsecond => reinterpret::<TimestampMicrosecondType>(array),
                    TimeUnit::Nanosecond => reinterpret::<TimestampNanosecondType>(array),
                };
                self.range(&raw, per_second, name, array.data_type(), position)
            }
            (DataType::Dictionary(_, _), ChType::DateTime(_)) => {
                // NULLs were counted logically above; only the values' range is left. Checking
                // every dictionary value (referenced or not) errs on the safe side.
                let values = array.as_any_dictionary().values();
                self.walk(
                    values,
                    &ChType::Nullable(Box::new(storage.clone())),
                    position,
                    None,
                )
            }
            (DataType::Date64, ChType::DateTime(_)) => {
                let raw = reinterpret::<Date64Type>(array);
                self.range(&raw, 1_000, "ms", array.data_type(), position)
            }
            (DataType::List(_), ChType::Array(inner)) => {
                let values = referenced(array.as_list::<i32>());
                self.walk(&values, inner, &format!("{position}[*]"), None)
            }
            (DataType::LargeList(_), ChType::Array(inner)) => {
                let values = referenced(array.as_list::<i64>());
                self.walk(&values, inner, &format!("{position}[*]"), None)
            }
            (DataType::Map(_, _), ChType::Map(key, value)) => {
                let map = array.as_map();
                let (start, end) = (map.value_offsets()[0], map.value_offsets()[map.len()]);
                let keys = map.keys().slice(start as usize, (end - start) as usize);
                let values = map.values().slice(start as usize, (end - start) as usize);
                self.walk(&keys, key, &format!("{position}{{key}}"), None)?;
                self.walk(&values, value, &format!("{position}{{value}}"), None)
            }
            (DataType::Struct(fields), ChType::Tuple(elements)) => {
                let columns = array.as_struct().columns();
                for (index, element) in elements.iter().enumerate() {
                    let (child, label) = match &element.name {
                        Some(name) => match fields.iter().position(|f| f.name() == name) {
                            Some(i) => (&columns[i], SqlName(name).to_string()),
                            None => continue,
                        },
                        None => (&columns[index], (index + 1).to_string()),
                    };
                    self.walk(
                        child,
                        &element.ty,
                        &format!("{position}.{label}"),
                        first_row,
                    )?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn range(
        &self,
        raw: &PrimitiveArray<arrow_array::types::Int64Type>,
        per_second: i64,
        unit: &'static str,
        arrow_type: &DataType,
        position: &str,
    ) -> Result<(), Box<ValueProblem>> {
        let mut bad = raw
            .iter()
            .flatten()
            .filter(|v| !datetime_fits(*v, per_second));
        let Some(first) = bad.next() else {
            return Ok(());
        };
        Err(Box::new(ValueProblem::DateTimeRange {
            column: self.column.clone(),
            position: position.to_owned(),
            count: 1 + bad.count() as u64,
            first,
            unit,
            arrow_type: arrow_type.to_string(),
            column_type: self.ch_type.to_string(),
        }))
    }
}

/// A 64-bit temporal array viewed as its raw `i64` ticks (same buffer, no copy).
fn reinterpret<T>(array: &dyn Array) -> PrimitiveArray<arrow_array::types::Int64Type>
where
    T: arrow_array::ArrowPrimitiveType<Native = i64>,
{
    array.as_primitive::<T>().reinterpret_cast()
}

/// The child values a list array's entries reference, `offsets[0]..offsets[len]`: a sliced
/// list's child array still holds the elements outside the slice.
fn referenced<O: OffsetSizeTrait>(list: &arrow_array::GenericListArray<O>) -> ArrayRef {
    let offsets = list.value_offsets();
    let (start, end) = (offsets[0].as_usize(), offsets[list.len()].as_usize());
    list.values().slice(start, end - start)
}

impl fmt::Display for ValueCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut what = Vec::new();
        if self.nulls {
            what.push("no NULL at non-Nullable positions");
        }
        if self.datetime_range {
            what.push("timestamps within DateTime range");
        }
        write!(
            f,
            "column {} (Arrow {} -> ClickHouse {}): {}",
            Backquoted(&self.column),
            self.arrow_type,
            self.ch_type,
            what.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{Int64Builder, ListBuilder, MapBuilder, StringBuilder};
    use arrow_array::types::Int32Type;
    use arrow_array::{
        Date64Array, DictionaryArray, Int32Array, ListArray, StructArray,
        TimestampMicrosecondArray, TimestampSecondArray,
    };
    use arrow_schema::Field;

    use super::*;

    fn check(array: &ArrayRef, ch: &str) -> Result<(), Box<ValueProblem>> {
        let check = ValueCheck {
            input_index: 0,
            column: "c".into(),
            arrow_type: array.data_type().clone(),
            ch_type: ch.parse().unwrap(),
            nulls: true,
            datetime_range: true,
        };
        check.check_array(array.as_ref(), 100)
    }

    fn map_with_null_value() -> ArrayRef {
        let mut builder = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
        builder.keys().append_value("k");
        builder.values().append_null();
        builder.append(true).unwrap();
        Arc::new(builder.finish())
    }

    fn list_with_null_element() -> ArrayRef {
        let mut builder = ListBuilder::new(arrow_array::builder::Int32Builder::new());
        builder.append_value([Some(1), None]);
        builder.append_value([Some(2)]);
        Arc::new(builder.finish())
    }

    #[test]
    fn value_check_table() {
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(3), None]));
        let no_nulls: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
        let dict: ArrayRef = Arc::new(DictionaryArray::<Int32Type>::from_iter([Some("a"), None]));
        let list_nulls = list_with_null_element();
        // The null list entry's range holds a NULL that ClickHouse never sees (it reads []).
        let null_entry: ArrayRef = Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Int32, true)),
            arrow_buffer::OffsetBuffer::new(vec![0, 1, 2].into()),
            Arc::new(Int32Array::from(vec![Some(1), None])),
            Some(vec![true, false].into()),
        ));
        let sliced: ArrayRef = list_nulls.slice(1, 1);
        let tuple: ArrayRef = Arc::new(StructArray::from(vec![(
            Arc::new(Field::new("x", DataType::Int32, true)),
            ints.clone(),
        )]));
        let ts: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![
            Some(0),
            None,
            Some(-1),
            Some(4_294_967_296_000_000),
        ]));
        let ts_ok: ArrayRef =
            Arc::new(TimestampSecondArray::from(vec![0, 4_294_967_295]).with_timezone("UTC"));
        let date64: ArrayRef = Arc::new(Date64Array::from(vec![4_294_967_296_000]));
        let map = map_with_null_value();
        // (name, array, ClickHouse type, Ok or expected message substring)
        let rows: Vec<(&str, &ArrayRef, &str, Result<(), &str>)> = vec![
            ("top-level NULL", &ints, "Int32", Err("column `c` has 2 NULL value(s) at `c` (first at row 101), but ClickHouse type Int32 is not Nullable (input Arrow type Int32, column type Int32)")),
            ("into Nullable", &ints, "Nullable(Int64)", Ok(())),
            ("no NULL", &no_nulls, "Int32", Ok(())),
            ("dictionary NULL", &dict, "LowCardinality(String)", Err("1 NULL value(s) at `c` (first at row 101), but ClickHouse type LowCardinality(String) is not Nullable")),
            ("dictionary NULL allowed", &dict, "LowCardinality(Nullable(String))", Ok(())),
            ("array element", &list_nulls, "Array(Int32)", Err("1 NULL value(s) at `c`[*], but ClickHouse type Int32 is not Nullable (input Arrow type Int32, column type Array(Int32))")),
            ("array element allowed", &list_nulls, "Array(Nullable(Int32))", Ok(())),
            ("outside the slice", &sliced, "Array(Int32)", Ok(())),
            ("null list", &null_entry, "Array(Int32)", Err("1 NULL value(s) at `c` (first at row 101), but ClickHouse type Array(Int32)")),
            ("map value", &map, "Map(String, Int64)", Err("1 NULL value(s) at `c`{value}, but ClickHouse type Int64")),
            ("map value allowed", &map, "Map(String, Nullable(Int64))", Ok(())),
            ("tuple element", &tuple, "Tuple(Int32)", Err("2 NULL value(s) at `c`.1 (first at row 101), but ClickHouse type Int32")),
            ("named tuple element", &tuple, "Tuple(x Int32)", Err("at `c`.x (first at row 101)")),
            ("tuple element allowed", &tuple, "Tuple(x Nullable(Int32))", Ok(())),
            ("DateTime range", &ts, "Nullable(DateTime)", Err("column `c` has 2 value(s) at `c` outside ClickHouse DateTime's range 1970-01-01 00:00:00 .. 2106-02-07 06:28:15 UTC (first: -1 us since 1970")),
            ("DateTime64 has no such range", &ts, "Nullable(DateTime64(6))", Ok(())),
            ("DateTime range edges", &ts_ok, "DateTime('UTC')", Ok(())),
            ("Date64 past 2106", &date64, "DateTime", Err("1 value(s) at `c` outside ClickHouse DateTime's range")),
        ];
        for (name, array, ch, expected) in rows {
            let got = check(array, ch).map_err(|e| e.to_string());
            match (expected, got) {
                (Ok(()), Ok(())) => {}
                (Err(needle), Err(message)) => {
                    assert!(message.contains(needle), "{name}: {message}")
                }
                (expected, got) => panic!("{name}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn datetime_fits_edges() {
        // (raw, ticks per second, fits)
        let rows = [
            (0, 1, true),
            (-1, 1, false),
            (-1, 1_000_000_000, false),
            (4_294_967_295, 1, true),
            (4_294_967_296, 1, false),
            (4_294_967_295_999, 1_000, true),
            (4_294_967_296_000, 1_000, false),
            (i64::MAX, 1_000_000_000, false),
        ];
        for (raw, per_second, fits) in rows {
            assert_eq!(datetime_fits(raw, per_second), fits, "{raw} / {per_second}");
        }
    }
}
