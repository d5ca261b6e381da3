//! Real-component proof of the Arrow → ClickHouse mapping (the README's "Type mapping"), against clickhouse-local
//! (the ClickHouse 26.9 engine).
//!
//! Every accepted row of the mapping is one column of one record batch, with edge values. The
//! batch is written once as Parquet and once as an Arrow IPC stream; for each, clickhouse-local
//! reads it with the plan's `--structure`, inserts it into a MergeTree table of the target
//! types through the plan's column list, and prints the table. Each printed value is compared
//! with the expected text, so a mapping that ClickHouse reads differently from what the schema
//! check assumes (or rejects) fails here, naming the column.

mod common;

use std::sync::Arc;

use arrow_array::builder::{
    BinaryViewBuilder, Float64Builder, Int16Builder, Int32Builder, Int64Builder, Int8Builder,
    LargeListBuilder, LargeStringBuilder, ListBuilder, MapBuilder, StringBuilder,
};
use arrow_array::types::{Int16Type, Int32Type, Int8Type};
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Date64Array, Decimal128Array,
    Decimal256Array, Decimal32Array, Decimal64Array, DictionaryArray, FixedSizeBinaryArray,
    Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, LargeBinaryArray,
    LargeStringArray, RecordBatch, StringArray, StringViewArray, StructArray,
    TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
    TimestampSecondArray, UInt16Array, UInt32Array, UInt64Array, UInt8Array,
};
use arrow_buffer::i256;
use arrow_schema::{DataType, Field, Schema};
use chpart_input::{check_schema, ParquetInput};

use common::{clickhouse_local, ipc_stream, path, scratch, target, write_parquet, Format};

/// One row of the mapping: a column of 3 values, its target type and what ClickHouse prints.
struct Case {
    name: &'static str,
    array: ArrayRef,
    ch_type: &'static str,
    /// What to select instead of the bare column (`{}` = the column), e.g. `hex({})`.
    select: &'static str,
    expected: [&'static str; 3],
    /// Whether the row holds for Parquet too (see `parquet_rejects_what_clickhouse_misreads`).
    parquet: bool,
}

fn case(
    name: &'static str,
    array: ArrayRef,
    ch_type: &'static str,
    expected: [&'static str; 3],
) -> Case {
    Case {
        name,
        array,
        ch_type,
        select: "{}",
        expected,
        parquet: true,
    }
}

fn hex_case(
    name: &'static str,
    array: ArrayRef,
    ch_type: &'static str,
    expected: [&'static str; 3],
) -> Case {
    Case {
        name,
        array,
        ch_type,
        select: "hex({})",
        expected,
        parquet: true,
    }
}

/// A row that holds for the Arrow stream only.
fn stream_only(case: Case) -> Case {
    Case {
        parquet: false,
        ..case
    }
}

fn a<T: arrow_array::Array + 'static>(array: T) -> ArrayRef {
    Arc::new(array)
}

const UUID_BYTES: [u8; 16] = [
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
];
const IPV6_SEQ: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
const IPV6_TRAILING_ZEROS: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
const UUID_TRAILING_ZEROS: [u8; 16] = [
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0,
];
const IPV6_MAPPED: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 1, 2, 3, 4];

fn cases() -> Vec<Case> {
    let d256 = |s: &str| i256::from_string(s).unwrap();
    vec![
        // Integers: same or wider, signedness only towards a wider signed type.
        case(
            "i8_i8",
            a(Int8Array::from(vec![i8::MIN, 0, i8::MAX])),
            "Int8",
            ["-128", "0", "127"],
        ),
        case(
            "i8_i16",
            a(Int8Array::from(vec![i8::MIN, -1, i8::MAX])),
            "Int16",
            ["-128", "-1", "127"],
        ),
        case(
            "i16_i32",
            a(Int16Array::from(vec![i16::MIN, 0, i16::MAX])),
            "Int32",
            ["-32768", "0", "32767"],
        ),
        case(
            "i32_i64",
            a(Int32Array::from(vec![i32::MIN, 0, i32::MAX])),
            "Int64",
            ["-2147483648", "0", "2147483647"],
        ),
        case(
            "i64_i64",
            a(Int64Array::from(vec![i64::MIN, 0, i64::MAX])),
            "Int64",
            ["-9223372036854775808", "0", "9223372036854775807"],
        ),
        case(
            "i64_i128",
            a(Int64Array::from(vec![i64::MIN, -1, i64::MAX])),
            "Int128",
            ["-9223372036854775808", "-1", "9223372036854775807"],
        ),
        case(
            "i64_i256",
            a(Int64Array::from(vec![i64::MIN, -1, i64::MAX])),
            "Int256",
            ["-9223372036854775808", "-1", "9223372036854775807"],
        ),
        case(
            "u8_u8",
            a(UInt8Array::from(vec![0, 1, u8::MAX])),
            "UInt8",
            ["0", "1", "255"],
        ),
        case(
            "u8_i16",
            a(UInt8Array::from(vec![0, 128, u8::MAX])),
            "Int16",
            ["0", "128", "255"],
        ),
        case(
            "u16_u64",
            a(UInt16Array::from(vec![0, 1, u16::MAX])),
            "UInt64",
            ["0", "1", "65535"],
        ),
        case(
            "u16_i32",
            a(UInt16Array::from(vec![0, 32768, u16::MAX])),
            "Int32",
            ["0", "32768", "65535"],
        ),
        case(
            "u32_i64",
            a(UInt32Array::from(vec![0, 1 << 31, u32::MAX])),
            "Int64",
            ["0", "2147483648", "4294967295"],
        ),
        case(
            "u64_u64",
            a(UInt64Array::from(vec![0, 1 << 63, u64::MAX])),
            "UInt64",
            ["0", "9223372036854775808", "18446744073709551615"],
        ),
        case(
            "u64_u128",
            a(UInt64Array::from(vec![0, 1 << 63, u64::MAX])),
            "UInt128",
            ["0", "9223372036854775808", "18446744073709551615"],
        ),
        case(
            "u64_i128",
            a(UInt64Array::from(vec![0, 1 << 63, u64::MAX])),
            "Int128",
            ["0", "9223372036854775808", "18446744073709551615"],
        ),
        case(
            "u64_u256",
            a(UInt64Array::from(vec![0, 1 << 63, u64::MAX])),
            "UInt256",
            ["0", "9223372036854775808", "18446744073709551615"],
        ),
        // Floats.
        case(
            "f32_f32",
            a(Float32Array::from(vec![1.5, -3.25, f32::MAX])),
            "Float32",
            ["1.5", "-3.25", "3.4028235e38"],
        ),
        case(
            "f32_f64",
            a(Float32Array::from(vec![0.1, -1.5, f32::MIN_POSITIVE])),
            "Float64",
            ["0.10000000149011612", "-1.5", "1.1754943508222875e-38"],
        ),
        case(
            "f64_f64",
            a(Float64Array::from(vec![
                f64::MAX,
                f64::NEG_INFINITY,
                f64::NAN,
            ])),
            "Float64",
            ["1.7976931348623157e308", "-inf", "nan"],
        ),
        // Decimals: same scale, enough precision.
        case(
            "d128_5_2",
            a(Decimal128Array::from(vec![-12345, 1, 99999])
                .with_precision_and_scale(5, 2)
                .unwrap()),
            "Decimal(5, 2)",
            ["-123.45", "0.01", "999.99"],
        ),
        case(
            "d128_10_2",
            a(Decimal128Array::from(vec![-9_999_999_999, 0, 123])
                .with_precision_and_scale(10, 2)
                .unwrap()),
            "Decimal(20, 2)",
            ["-99999999.99", "0", "1.23"],
        ),
        case(
            "d128_38_18",
            a(
                Decimal128Array::from(vec![-(10i128.pow(38) - 1), 10i128.pow(18), 5])
                    .with_precision_and_scale(38, 18)
                    .unwrap(),
            ),
            "Decimal(38, 18)",
            [
                "-99999999999999999999.999999999999999999",
                "1",
                "0.000000000000000005",
            ],
        ),
        case(
            "d256_76_10",
            a(Decimal256Array::from(vec![
                d256(
                    "-1234567890123456789012345678901234567890123456789012345678901234567890123456",
                ),
                d256("0"),
                d256("1"),
            ])
            .with_precision_and_scale(76, 10)
            .unwrap()),
            "Decimal(76, 10)",
            [
                "-123456789012345678901234567890123456789012345678901234567890123456.7890123456",
                "0",
                "0.0000000001",
            ],
        ),
        case(
            "d32_9_2",
            a(Decimal32Array::from(vec![-999_999_999, 0, 1])
                .with_precision_and_scale(9, 2)
                .unwrap()),
            "Decimal(9, 2)",
            ["-9999999.99", "0", "0.01"],
        ),
        case(
            "d64_18_4",
            a(
                Decimal64Array::from(vec![-123_456_789_012_345_678, 10_000, 5])
                    .with_precision_and_scale(18, 4)
                    .unwrap(),
            ),
            "Decimal(18, 4)",
            ["-12345678901234.5678", "1", "0.0005"],
        ),
        // Strings and bytes.
        case(
            "utf8",
            a(StringArray::from(vec!["", "héllo wörld", "日本語 🎉"])),
            "String",
            ["", "héllo wörld", "日本語 🎉"],
        ),
        case(
            "large_utf8",
            a(LargeStringArray::from(vec!["a", "ü", "x y"])),
            "String",
            ["a", "ü", "x y"],
        ),
        case(
            "utf8_view",
            a(StringViewArray::from(vec![
                "short",
                "a string longer than twelve bytes",
                "",
            ])),
            "String",
            ["short", "a string longer than twelve bytes", ""],
        ),
        hex_case(
            "binary",
            a(BinaryArray::from(vec![
                &b"\x00\x01"[..],
                &b"\xff\xfe"[..],
                &b""[..],
            ])),
            "String",
            ["0001", "FFFE", ""],
        ),
        hex_case(
            "large_binary",
            a(LargeBinaryArray::from(vec![
                &b"abc"[..],
                &b"\x80"[..],
                &b"\x00"[..],
            ])),
            "String",
            ["616263", "80", "00"],
        ),
        hex_case(
            "binary_view",
            a(binary_view()),
            "String",
            [
                "FF00",
                "",
                "6C6F6E6720656E6F75676820746F20626520696E646972656374",
            ],
        ),
        hex_case(
            "fsb_fixed",
            a(FixedSizeBinaryArray::try_from_iter(
                [b"abc", b"\0\0\0", b"\xff\xfe\xfd"].into_iter(),
            )
            .unwrap()),
            "FixedString(3)",
            ["616263", "000000", "FFFEFD"],
        ),
        case(
            "boolean",
            a(BooleanArray::from(vec![true, false, true])),
            "Bool",
            ["true", "false", "true"],
        ),
        // Dates and times.
        case(
            "date32_date",
            a(Date32Array::from(vec![0, 19_000, 65_535])),
            "Date",
            ["1970-01-01", "2022-01-08", "2149-06-06"],
        ),
        case(
            "date32_date32",
            a(Date32Array::from(vec![-25_567, -1, 120_529])),
            "Date32",
            ["1900-01-01", "1969-12-31", "2299-12-31"],
        ),
        case(
            "ts_us_utc_dt64",
            a(TimestampMicrosecondArray::from(vec![
                -1_000_000_000_000_001,
                -1,
                5_000_000_000_123_456,
            ])
            .with_timezone("UTC")),
            "DateTime64(6, 'UTC')",
            [
                "1938-04-24 22:13:19.999999",
                "1969-12-31 23:59:59.999999",
                "2128-06-11 08:53:20.123456",
            ],
        ),
        case(
            "ts_ns_naive_dt64",
            a(TimestampNanosecondArray::from(vec![
                -1,
                1,
                4_102_444_800_000_000_001,
            ])),
            "DateTime64(9, 'UTC')",
            [
                "1969-12-31 23:59:59.999999999",
                "1970-01-01 00:00:00.000000001",
                "2100-01-01 00:00:00.000000001",
            ],
        ),
        case(
            "ts_ms_offset_dt64",
            a(
                TimestampMillisecondArray::from(vec![0, 1_700_000_000_123, -86_400_000])
                    .with_timezone("+01:00"),
            ),
            "DateTime64(3, 'Asia/Tokyo')",
            [
                "1970-01-01 09:00:00.000",
                "2023-11-15 07:13:20.123",
                "1969-12-31 09:00:00.000",
            ],
        ),
        // Digits beyond the column's precision are cut towards zero (the column's choice).
        case(
            "ts_ns_dt64_3",
            a(
                TimestampNanosecondArray::from(vec![1_500_000_999, -1_500_000_999, 0])
                    .with_timezone("UTC"),
            ),
            "DateTime64(3, 'UTC')",
            [
                "1970-01-01 00:00:01.500",
                "1969-12-31 23:59:58.500",
                "1970-01-01 00:00:00.000",
            ],
        ),
        stream_only(case(
            "ts_s_datetime",
            a(TimestampSecondArray::from(vec![
                0,
                1_700_000_000,
                4_294_967_295,
            ])),
            "DateTime('UTC')",
            [
                "1970-01-01 00:00:00",
                "2023-11-14 22:13:20",
                "2106-02-07 06:28:15",
            ],
        )),
        case(
            "ts_ms_datetime",
            a(TimestampMillisecondArray::from(vec![
                0,
                1_700_000_000_999,
                4_294_967_295_999,
            ])),
            "DateTime('UTC')",
            [
                "1970-01-01 00:00:00",
                "2023-11-14 22:13:20",
                "2106-02-07 06:28:15",
            ],
        ),
        case(
            "ts_us_ny_datetime",
            a(
                TimestampMicrosecondArray::from(vec![0, 1_700_000_000_999_999, 86_400_000_000])
                    .with_timezone("America/New_York"),
            ),
            "DateTime('UTC')",
            [
                "1970-01-01 00:00:00",
                "2023-11-14 22:13:20",
                "1970-01-02 00:00:00",
            ],
        ),
        stream_only(case(
            "date64_datetime",
            a(Date64Array::from(vec![0, 86_400_000, 1_699_920_000_000])),
            "DateTime('UTC')",
            [
                "1970-01-01 00:00:00",
                "1970-01-02 00:00:00",
                "2023-11-14 00:00:00",
            ],
        )),
        // UUID, IPv4, IPv6.
        case(
            "fsb16_uuid",
            a(FixedSizeBinaryArray::try_from_iter(
                [UUID_BYTES, [0; 16], UUID_TRAILING_ZEROS].into_iter(),
            )
            .unwrap()),
            "UUID",
            [
                "01234567-89ab-cdef-0123-456789abcdef",
                "00000000-0000-0000-0000-000000000000",
                "ffffffff-ffff-ffff-0000-000000000000",
            ],
        ),
        case(
            "utf8_uuid",
            a(StringArray::from(vec![
                "01234567-89ab-cdef-0123-456789abcdef",
                "00000000-0000-0000-0000-000000000000",
                "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF",
            ])),
            "UUID",
            [
                "01234567-89ab-cdef-0123-456789abcdef",
                "00000000-0000-0000-0000-000000000000",
                "ffffffff-ffff-ffff-ffff-ffffffffffff",
            ],
        ),
        case(
            "u32_ipv4",
            a(UInt32Array::from(vec![0, 0x01020304, u32::MAX])),
            "IPv4",
            ["0.0.0.0", "1.2.3.4", "255.255.255.255"],
        ),
        case(
            "utf8_ipv4",
            a(StringArray::from(vec![
                "10.0.0.1",
                "0.0.0.0",
                "255.255.255.255",
            ])),
            "IPv4",
            ["10.0.0.1", "0.0.0.0", "255.255.255.255"],
        ),
        case(
            "fsb16_ipv6",
            a(FixedSizeBinaryArray::try_from_iter(
                [IPV6_SEQ, IPV6_TRAILING_ZEROS, IPV6_MAPPED].into_iter(),
            )
            .unwrap()),
            "IPv6",
            [
                "1:203:405:607:809:a0b:c0d:e0f",
                "2001:db8::",
                "::ffff:1.2.3.4",
            ],
        ),
        case(
            "utf8_ipv6",
            a(StringArray::from(vec![
                "2001:db8::ff00:42:8329",
                "::",
                "::ffff:1.2.3.4",
            ])),
            "IPv6",
            ["2001:db8::ff00:42:8329", "::", "::ffff:1.2.3.4"],
        ),
        // Enums and LowCardinality.
        case(
            "utf8_enum8",
            a(StringArray::from(vec!["a", "b", "ü"])),
            "Enum8('a' = 1, 'b' = 2, 'ü' = -3)",
            ["a", "b", "ü"],
        ),
        case(
            "dict_enum16",
            a(DictionaryArray::<Int32Type>::from_iter(["x", "y", "x"])),
            "Enum16('x' = 1000, 'y' = -1000)",
            ["x", "y", "x"],
        ),
        case(
            "utf8_lc",
            a(StringArray::from(vec!["a", "b", "a"])),
            "LowCardinality(String)",
            ["a", "b", "a"],
        ),
        case(
            "dict_lc",
            a(DictionaryArray::<Int8Type>::from_iter(["p", "q", "p"])),
            "LowCardinality(String)",
            ["p", "q", "p"],
        ),
        case(
            "dict_lc_nullable",
            a(DictionaryArray::<Int16Type>::from_iter([
                Some("p"),
                None,
                Some("q"),
            ])),
            "LowCardinality(Nullable(String))",
            ["p", "\\N", "q"],
        ),
        case(
            "dict_string",
            a(DictionaryArray::<Int32Type>::from_iter(["s", "t", "s"])),
            "String",
            ["s", "t", "s"],
        ),
        // Nullable.
        case(
            "i32_nullable",
            a(Int32Array::from(vec![Some(i32::MIN), None, Some(7)])),
            "Nullable(Int64)",
            ["-2147483648", "\\N", "7"],
        ),
        case(
            "utf8_nullable",
            a(StringArray::from(vec![None, Some(""), Some("x")])),
            "Nullable(String)",
            ["\\N", "", "x"],
        ),
        case(
            "ts_nullable",
            a(TimestampMillisecondArray::from(vec![None, Some(0), Some(-1)]).with_timezone("UTC")),
            "Nullable(DateTime64(3, 'UTC'))",
            ["\\N", "1970-01-01 00:00:00.000", "1969-12-31 23:59:59.999"],
        ),
        // Arrays, maps, tuples.
        case(
            "list_i32",
            a(list_i32()),
            "Array(Int64)",
            ["[1,2]", "[]", "[-2147483648]"],
        ),
        case(
            "large_list_utf8",
            a(large_list_utf8()),
            "Array(String)",
            ["['a','ü']", "[]", "['x y']"],
        ),
        case(
            "list_nullable",
            a(list_nullable()),
            "Array(Nullable(Int64))",
            ["[1,NULL]", "[NULL]", "[]"],
        ),
        case(
            "list_list",
            a(list_list()),
            "Array(Array(Int16))",
            ["[[1],[2,3]]", "[[]]", "[]"],
        ),
        case(
            "map_utf8_i64",
            a(map_utf8_i64()),
            "Map(String, Int64)",
            ["{'k':1}", "{}", "{'a':-2,'b':3}"],
        ),
        case(
            "map_nullable",
            a(map_nullable()),
            "Map(LowCardinality(String), Nullable(Float64))",
            ["{'x':NULL}", "{'y':1.5}", "{}"],
        ),
        case(
            "struct_tuple",
            a(struct_xy(false)),
            "Tuple(Int64, String)",
            ["(1,'a')", "(-2,'')", "(3,'ü')"],
        ),
        case(
            "struct_named",
            a(struct_xy(true)),
            "Tuple(x Int32, y String)",
            ["(1,'a')", "(-2,'')", "(3,'ü')"],
        ),
        case(
            "struct_nested",
            a(struct_nested()),
            "Tuple(a Tuple(b Array(Int32)), t DateTime64(6, 'UTC'))",
            [
                "(([1,2]),'1970-01-01 00:00:00.000001')",
                "(([]),'1969-12-31 23:59:59.999999')",
                "(([-7]),'2262-04-11 23:47:16.854775')",
            ],
        ),
    ]
}

fn binary_view() -> arrow_array::BinaryViewArray {
    let mut b = BinaryViewBuilder::new();
    b.append_value(b"\xff\x00");
    b.append_value(b"");
    b.append_value(b"long enough to be indirect");
    b.finish()
}

fn list_i32() -> arrow_array::ListArray {
    let mut b = ListBuilder::new(Int32Builder::new()).with_field(Field::new(
        "item",
        DataType::Int32,
        false,
    ));
    b.append_value([Some(1), Some(2)]);
    b.append_value([]);
    b.append_value([Some(i32::MIN)]);
    b.finish()
}

fn large_list_utf8() -> arrow_array::LargeListArray {
    let mut b = LargeListBuilder::new(LargeStringBuilder::new()).with_field(Field::new(
        "element",
        DataType::LargeUtf8,
        false,
    ));
    b.append_value([Some("a"), Some("ü")]);
    b.append_value(Vec::<Option<&str>>::new());
    b.append_value([Some("x y")]);
    b.finish()
}

fn list_nullable() -> arrow_array::ListArray {
    let mut b = ListBuilder::new(Int64Builder::new());
    b.append_value([Some(1), None]);
    b.append_value([None]);
    b.append_value([]);
    b.finish()
}

fn list_list() -> arrow_array::ListArray {
    let inner =
        ListBuilder::new(Int8Builder::new()).with_field(Field::new("item", DataType::Int8, false));
    let mut b = ListBuilder::new(inner).with_field(Field::new(
        "item",
        DataType::List(Arc::new(Field::new("item", DataType::Int8, false))),
        false,
    ));
    b.values().append_value([Some(1)]);
    b.values().append_value([Some(2), Some(3)]);
    b.append(true);
    b.values().append_value([]);
    b.append(true);
    b.append(true);
    b.finish()
}

fn map_utf8_i64() -> arrow_array::MapArray {
    let mut b = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new())
        .with_values_field(Field::new("value", DataType::Int64, false));
    b.keys().append_value("k");
    b.values().append_value(1);
    b.append(true).unwrap();
    b.append(true).unwrap();
    b.keys().append_value("a");
    b.values().append_value(-2);
    b.keys().append_value("b");
    b.values().append_value(3);
    b.append(true).unwrap();
    b.finish()
}

fn map_nullable() -> arrow_array::MapArray {
    let mut b = MapBuilder::new(None, LargeStringBuilder::new(), Float64Builder::new());
    b.keys().append_value("x");
    b.values().append_null();
    b.append(true).unwrap();
    b.keys().append_value("y");
    b.values().append_value(1.5);
    b.append(true).unwrap();
    b.append(true).unwrap();
    b.finish()
}

/// `{x: Int32, y: Utf8}`, or in the order `{y, x}` when `reversed` (to prove by-name matching).
fn struct_xy(reversed: bool) -> StructArray {
    let x: (Arc<Field>, ArrayRef) = (
        Arc::new(Field::new("x", DataType::Int32, false)),
        a(Int32Array::from(vec![1, -2, 3])),
    );
    let y: (Arc<Field>, ArrayRef) = (
        Arc::new(Field::new("y", DataType::Utf8, false)),
        a(StringArray::from(vec!["a", "", "ü"])),
    );
    StructArray::from(if reversed { vec![y, x] } else { vec![x, y] })
}

fn struct_nested() -> StructArray {
    let mut lists = ListBuilder::new(Int16Builder::new()).with_field(Field::new(
        "item",
        DataType::Int16,
        false,
    ));
    lists.append_value([Some(1), Some(2)]);
    lists.append_value([]);
    lists.append_value([Some(-7)]);
    let lists = lists.finish();
    let inner = StructArray::from(vec![(
        Arc::new(Field::new("b", lists.data_type().clone(), false)),
        a(lists),
    )]);
    let ts =
        TimestampMicrosecondArray::from(vec![1, -1, 9_223_372_036_854_775]).with_timezone("UTC");
    StructArray::from(vec![
        (
            Arc::new(Field::new("a", inner.data_type().clone(), false)),
            a(inner),
        ),
        (
            Arc::new(Field::new("t", ts.data_type().clone(), false)),
            a(ts),
        ),
    ])
}

/// The cases as one record batch, after a row number column `n` to order the output by.
fn batch(cases: &[&Case]) -> RecordBatch {
    let mut fields = vec![Field::new("n", DataType::UInt8, false)];
    let mut columns: Vec<ArrayRef> = vec![a(UInt8Array::from(vec![0, 1, 2]))];
    for c in cases {
        let nullable = c.array.null_count() > 0 || c.ch_type.contains("Nullable");
        fields.push(Field::new(c.name, c.array.data_type().clone(), nullable));
        columns.push(c.array.clone());
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

#[test]
fn every_mapping_row_reads_back_exactly_from_parquet_and_arrow_stream() {
    let all = cases();
    let dir = scratch();
    for format in [Format::Parquet, Format::ArrowStream] {
        let cases: Vec<&Case> = all
            .iter()
            .filter(|c| c.parquet || format == Format::ArrowStream)
            .collect();
        let batch = batch(&cases);
        let mut columns = vec![("n", "UInt8", "")];
        columns.extend(cases.iter().map(|c| (c.name, c.ch_type, "")));
        let table = target(&columns);
        let (file, plan) = match format {
            Format::Parquet => {
                let file = path(&dir, "mapping.parquet");
                write_parquet(&file, std::slice::from_ref(&batch), true);
                let input = ParquetInput::open(&file).unwrap();
                let plan = input
                    .check_schema(&table)
                    .unwrap_or_else(|e| panic!("the schema check rejects a mapping row:\n{e}"));
                input.check_nulls(&plan).unwrap_or_else(|e| panic!("{e}"));
                (file, plan)
            }
            Format::ArrowStream => {
                let file = path(&dir, "mapping.arrows");
                std::fs::write(&file, ipc_stream(std::slice::from_ref(&batch))).unwrap();
                let plan = check_schema(&batch.schema(), &table, "mapping.arrows")
                    .unwrap_or_else(|e| panic!("the schema check rejects a mapping row:\n{e}"));
                (file, plan)
            }
        };
        let definition = columns
            .iter()
            .map(|(name, ty, _)| format!("`{name}` {ty}"))
            .collect::<Vec<_>>()
            .join(", ");
        let select = std::iter::once("n".to_owned())
            .chain(
                cases
                    .iter()
                    .map(|c| c.select.replace("{}", &format!("`{}`", c.name))),
            )
            .collect::<Vec<_>>()
            .join(", ");
        let list = plan.insert_column_list();
        let query = format!(
            "CREATE TABLE t ({definition}) ENGINE = MergeTree ORDER BY tuple(); \
             INSERT INTO t ({list}) SELECT {list} FROM table; \
             SELECT {select} FROM t ORDER BY n FORMAT TSV"
        );
        let out = clickhouse_local(&plan.structure, format.name(), &file, &query)
            .unwrap_or_else(|e| panic!("{format:?}: clickhouse-local failed:\n{e}"));
        let text = String::from_utf8(out).unwrap();
        let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
        assert_eq!(rows.len(), 3, "{format:?}: {text}");
        let mut mismatches = Vec::new();
        for (row, fields) in rows.iter().enumerate() {
            assert_eq!(
                fields.len(),
                cases.len() + 1,
                "{format:?} row {row}: {fields:?}"
            );
            assert_eq!(fields[0], row.to_string());
            for (c, got) in cases.iter().zip(&fields[1..]) {
                if *got != c.expected[row] {
                    mismatches.push(format!(
                        "{format:?} {} ({} -> {}) row {row}: expected {:?}, got {got:?}",
                        c.name,
                        c.array.data_type(),
                        c.ch_type,
                        c.expected[row]
                    ));
                }
            }
        }
        assert!(
            mismatches.is_empty(),
            "{} mismatch(es):\n{}",
            mismatches.len(),
            mismatches.join("\n")
        );
    }
}

/// How chpart refuses a conversion that clickhouse-local would get wrong.
enum Refusal {
    /// The schema check rejects it; the message contains this.
    Schema(&'static str),
    /// The value checks reject these values; the message contains this.
    Values(&'static str),
}

/// A conversion chpart refuses, and what clickhouse-local makes of it when asked anyway.
struct Misread {
    format: Format,
    name: &'static str,
    array: ArrayRef,
    ch_type: &'static str,
    select: &'static str,
    /// What clickhouse-local stores for the two input values: the reason for the refusal.
    clickhouse_stores: [&'static str; 2],
    refusal: Refusal,
}

fn misread(
    format: Format,
    name: &'static str,
    array: ArrayRef,
    ch_type: &'static str,
    clickhouse_stores: [&'static str; 2],
    refusal: Refusal,
) -> Misread {
    Misread {
        format,
        name,
        array,
        ch_type,
        select: "{}",
        clickhouse_stores,
        refusal,
    }
}

fn misreads() -> Vec<Misread> {
    use Format::{ArrowStream as S, Parquet as P};
    use Refusal::{Schema, Values};
    let fsb = || a(FixedSizeBinaryArray::try_from_iter([b"a\0\0", b"\0\0\0"].into_iter()).unwrap());
    let nullable_list = || {
        let mut b = ListBuilder::new(Int32Builder::new());
        b.append_value([Some(1), None]);
        b.append_value([Some(2)]);
        a(b.finish())
    };
    vec![
        misread(
            P,
            "p_date64",
            a(Date64Array::from(vec![86_400_000, 1_699_920_000_000])),
            "DateTime('UTC')",
            ["1972-09-27 00:00:00", "2106-02-07 06:28:15"],
            Schema("the file's embedded Arrow schema declares Date64, but the Parquet column is stored as Int64"),
        ),
        // ClickHouse happens to read these right, but the Parquet type alone (a plain INT64)
        // does not say they are seconds.
        misread(
            P,
            "p_ts_seconds",
            a(TimestampSecondArray::from(vec![0, 1_700_000_000])),
            "DateTime('UTC')",
            ["1970-01-01 00:00:00", "2023-11-14 22:13:20"],
            Schema("declares Timestamp(s), but the Parquet column is stored as Int64"),
        ),
        Misread {
            select: "hex({})",
            ..misread(P, "p_fsb", fsb(), "String", ["61", ""], Schema("drops trailing zero bytes"))
        },
        Misread {
            select: "hex({})",
            ..misread(S, "s_fsb", fsb(), "String", ["61", ""], Schema("use FixedString(3)"))
        },
        misread(
            P,
            "p_null",
            a(Int32Array::from(vec![Some(1), None])),
            "Int32",
            ["1", "0"],
            Values("column `p_null` has 1 NULL value(s) at `p_null` (first at row 1), but ClickHouse type Int32 is not Nullable"),
        ),
        misread(
            S,
            "s_null_list",
            nullable_list(),
            "Array(Int32)",
            ["[1,0]", "[2]"],
            Values("1 NULL value(s) at `s_null_list`[*], but ClickHouse type Int32 is not Nullable"),
        ),
        misread(
            P,
            "p_clamp",
            a(TimestampMillisecondArray::from(vec![-1_000, 4_294_967_296_000]).with_timezone("UTC")),
            "DateTime('UTC')",
            ["1970-01-01 00:00:00", "2106-02-07 06:28:15"],
            Values("2 value(s) at `p_clamp` outside ClickHouse DateTime's range"),
        ),
        misread(
            S,
            "s_date64_wrap",
            a(Date64Array::from(vec![-86_400_000, 4_294_967_296_000])),
            "DateTime('UTC')",
            ["2106-02-06 06:28:16", "1970-01-01 00:00:00"],
            Values("2 value(s) at `s_date64_wrap` outside ClickHouse DateTime's range"),
        ),
        misread(
            S,
            "s_date64_dt64",
            a(Date64Array::from(vec![-86_400_000, 1_700_000_000_123])),
            "DateTime64(3, 'UTC')",
            ["2106-02-06 06:28:16.000", "2023-11-14 22:13:20.000"],
            Schema("reads Arrow Date64 as DateTime (whole seconds)"),
        ),
        misread(
            S,
            "s_narrow",
            a(Int64Array::from(vec![4_294_967_301, -1])),
            "Int32",
            ["5", "-1"],
            Schema("the ClickHouse type holds a smaller range"),
        ),
        misread(
            S,
            "s_unsigned",
            a(Int64Array::from(vec![-1, 1])),
            "UInt64",
            ["18446744073709551615", "1"],
            Schema("negative values do not fit an unsigned type"),
        ),
        Misread {
            select: "toFloat64({})",
            ..misread(
                S,
                "s_float",
                a(Float64Array::from(vec![0.1, 1e300])),
                "Float32",
                ["0.10000000149011612", "inf"],
                Schema("Float64 values would be rounded to Float32"),
            )
        },
    ]
}

/// Every refusal is justified: asked anyway, clickhouse-local stores something other than the
/// input (or, for `p_ts_seconds`, something the Parquet types cannot vouch for); and chpart's
/// checks do refuse it, with the documented message.
#[test]
fn clickhouse_misreads_what_the_checks_refuse() {
    let rows = misreads();
    let dir = scratch();
    for row in &rows {
        let batch = one_column_batch(row.name, &row.array);
        let table = target(&[(row.name, row.ch_type, "")]);
        let refused = match row.format {
            Format::Parquet => {
                let file = path(&dir, &format!("{}.parquet", row.name));
                write_parquet(&file, std::slice::from_ref(&batch), true);
                let input = ParquetInput::open(&file).unwrap();
                match input.check_schema(&table) {
                    Err(e) => (true, e.to_string()),
                    Ok(plan) => (
                        false,
                        input.check_nulls(&plan).expect_err(row.name).to_string(),
                    ),
                }
            }
            Format::ArrowStream => {
                let bytes = ipc_stream(std::slice::from_ref(&batch));
                match chpart_input::ArrowStreamPump::start(bytes.as_slice(), &table, "stdin") {
                    Err(e) => (true, e.to_string()),
                    Ok(pump) => (
                        false,
                        pump.pump(Vec::new(), "a buffer")
                            .expect_err(row.name)
                            .to_string(),
                    ),
                }
            }
        };
        let (needle, by_schema) = match row.refusal {
            Refusal::Schema(needle) => (needle, true),
            Refusal::Values(needle) => (needle, false),
        };
        assert_eq!(
            refused.0, by_schema,
            "{}: refused by the wrong check: {}",
            row.name, refused.1
        );
        assert!(refused.1.contains(needle), "{}: {}", row.name, refused.1);
        assert!(
            refused.1.contains(row.ch_type),
            "{}: the message names the ClickHouse type: {}",
            row.name,
            refused.1
        );
    }
    for format in [Format::Parquet, Format::ArrowStream] {
        let rows: Vec<&Misread> = rows.iter().filter(|r| r.format == format).collect();
        let fields: Vec<Field> = rows
            .iter()
            .map(|r| {
                Field::new(
                    r.name,
                    r.array.data_type().clone(),
                    r.array.null_count() > 0,
                )
            })
            .collect();
        let arrays = rows.iter().map(|r| r.array.clone()).collect();
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap();
        let file = path(&dir, &format!("naive.{}", format.name()));
        match format {
            Format::Parquet => write_parquet(&file, std::slice::from_ref(&batch), true),
            Format::ArrowStream => {
                std::fs::write(&file, ipc_stream(std::slice::from_ref(&batch))).unwrap()
            }
        }
        let structure = rows
            .iter()
            .map(|r| format!("`{}` {}", r.name, r.ch_type))
            .collect::<Vec<_>>()
            .join(", ");
        let select = rows
            .iter()
            .map(|r| r.select.replace("{}", &format!("`{}`", r.name)))
            .collect::<Vec<_>>();
        let query = format!(
            "CREATE TABLE t ({structure}, _n UInt64) ENGINE = MergeTree ORDER BY tuple(); \
             INSERT INTO t SELECT *, rowNumberInAllBlocks() FROM table; \
             SELECT {} FROM t ORDER BY _n FORMAT TSV",
            select.join(", ")
        );
        let out = clickhouse_local(&structure, format.name(), &file, &query)
            .unwrap_or_else(|e| panic!("{format:?}: clickhouse-local failed:\n{e}"));
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
        assert_eq!(lines.len(), 2, "{format:?}: {text}");
        let mut surprises = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            for (n, line) in lines.iter().enumerate() {
                if line[i] != row.clickhouse_stores[n] {
                    surprises.push(format!(
                        "{format:?} {} row {n}: clickhouse-local stored {:?}, not {:?}",
                        row.name, line[i], row.clickhouse_stores[n]
                    ));
                }
            }
        }
        assert!(
            surprises.is_empty(),
            "ClickHouse no longer behaves as the refusals assume (revisit the README's type mapping):\n{}",
            surprises.join("\n")
        );
    }
}

fn one_column_batch(name: &str, array: &ArrayRef) -> RecordBatch {
    let field = Field::new(name, array.data_type().clone(), array.null_count() > 0);
    RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![array.clone()]).unwrap()
}

/// Column names that need quoting reach the right target columns: the plan's `--structure` and
/// insert list are valid SQL for any name.
#[test]
fn awkward_column_names_survive_structure_and_insert_list() {
    let names = ["my col", "tick`s", "select", "a.b", "back\\slash", "ünï"];
    let fields: Vec<Field> = names
        .iter()
        .map(|n| Field::new(*n, DataType::Int32, false))
        .collect();
    let arrays: Vec<ArrayRef> = (0..names.len() as i32)
        .map(|i| a(Int32Array::from(vec![i])))
        .collect();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap();
    // The target lists the columns in reverse, with one more that has a default.
    let mut columns: Vec<(&str, &str, &str)> =
        names.iter().rev().map(|n| (*n, "Int64", "")).collect();
    columns.push(("with default", "Int64", "DEFAULT"));
    let table = target(&columns);
    let dir = scratch();
    let file = path(&dir, "names.parquet");
    write_parquet(&file, std::slice::from_ref(&batch), true);
    let plan = ParquetInput::open(&file)
        .unwrap()
        .check_schema(&table)
        .unwrap();
    let list = plan.insert_column_list();
    let query = format!(
        "CREATE TABLE t (`ünï` Int64, `back\\\\slash` Int64, `a.b` Int64, `select` Int64, `tick\\`s` Int64, \
         `my col` Int64, `with default` Int64 DEFAULT 42) ENGINE = MergeTree ORDER BY tuple(); \
         INSERT INTO t ({list}) SELECT {list} FROM table; SELECT * FROM t FORMAT TSV"
    );
    let out = clickhouse_local(&plan.structure, "Parquet", &file, &query)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(String::from_utf8(out).unwrap(), "5\t4\t3\t2\t1\t0\t42\n");
}

/// The conversions chpart lets through without a value check although some values cannot be
/// stored: ClickHouse itself fails on those values (no silent change), in both readers.
#[test]
fn clickhouse_itself_refuses_values_that_do_not_fit() {
    // (column, array, ClickHouse type, error substring)
    let rows: Vec<(&str, ArrayRef, &str, &str)> = vec![
        (
            "e",
            a(StringArray::from(vec!["a", "zz"])),
            "Enum8('a' = 1)",
            "Unknown element 'zz' for enum",
        ),
        (
            "d",
            a(Date32Array::from(vec![0, -1])),
            "Date",
            "allowed Date range",
        ),
        (
            "d",
            a(Date32Array::from(vec![0, 65_536])),
            "Date",
            "allowed Date range",
        ),
        (
            "u",
            a(StringArray::from(vec!["not-a-uuid"])),
            "UUID",
            "Cannot parse",
        ),
        (
            "t",
            a(TimestampSecondArray::from(vec![0, 11_000_000_000]).with_timezone("UTC")),
            "DateTime64(9, 'UTC')",
            "DateTime64 convert overflow",
        ),
    ];
    let dir = scratch();
    for (i, (name, array, ch_type, needle)) in rows.into_iter().enumerate() {
        let batch = one_column_batch(name, &array);
        let table = target(&[(name, ch_type, "")]);
        let plan = check_schema(&batch.schema(), &table, "test").unwrap_or_else(|e| panic!("{e}"));
        let query = format!(
            "CREATE TABLE t (`{name}` {ch_type}) ENGINE = MergeTree ORDER BY tuple(); \
             INSERT INTO t SELECT * FROM table"
        );
        for format in [Format::Parquet, Format::ArrowStream] {
            if format == Format::Parquet && ch_type.starts_with("DateTime64") {
                // Timestamp(Second) is a plain INT64 in Parquet, refused by the schema check.
                continue;
            }
            let file = path(&dir, &format!("{i}.{}", format.name()));
            match format {
                Format::Parquet => write_parquet(&file, std::slice::from_ref(&batch), true),
                Format::ArrowStream => {
                    std::fs::write(&file, ipc_stream(std::slice::from_ref(&batch))).unwrap()
                }
            }
            let err = clickhouse_local(&plan.structure, format.name(), &file, &query).expect_err(
                &format!("{format:?} {name} {ch_type}: ClickHouse must refuse"),
            );
            assert!(err.contains(needle), "{format:?} {ch_type}: {err}");
        }
    }
}
