//! Real-component tests of the Arrow stream pump: batches pumped straight into clickhouse-local's
//! stdin load exactly, an empty stream loads nothing, and a pump that fails part-way makes
//! clickhouse-local fail too instead of loading the batches before the failure.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder, StringDictionaryBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow_schema::{Field, Schema};
use chpart_input::{ArrowStreamPump, InputPlan, StreamStats};

use common::{ipc_stream, target};

/// Batch `i` of a Spark-like stream, every field nullable as Spark declares them: dictionary
/// strings (a new dictionary per batch), lists of strings, microsecond UTC timestamps, and `v`
/// (NULL at row 1 of batch `bad`).
fn spark_like(i: i64, bad: Option<i64>) -> RecordBatch {
    let mut k = StringDictionaryBuilder::<Int32Type>::new();
    let mut tags = ListBuilder::new(StringBuilder::new());
    for j in 0..2 {
        k.append_value(format!("k{}", i * 2 + j));
        tags.append_value([Some(format!("t{i}")), Some("ü".to_owned())]);
    }
    let ts = TimestampMicrosecondArray::from(vec![i * 1_000_001, -i]).with_timezone("UTC");
    let v = Int64Array::from(vec![
        Some(i * 2),
        if bad == Some(i) {
            None
        } else {
            Some(i * 2 + 1)
        },
    ]);
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("k", Arc::new(k.finish())),
        ("tags", Arc::new(tags.finish())),
        ("ts", Arc::new(ts)),
        ("v", Arc::new(v)),
    ];
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap()
}

fn table() -> Vec<chpart_input::TargetColumn> {
    target(&[
        ("v", "Int64", ""),
        ("k", "LowCardinality(String)", ""),
        ("tags", "Array(String)", ""),
        ("ts", "DateTime64(6, 'UTC')", ""),
        ("loaded", "UInt8", "DEFAULT"),
    ])
}

/// Pumps `input` into a clickhouse-local reading stdin; the pump's result and clickhouse-local's.
fn pump_into_clickhouse(
    input: &[u8],
) -> (
    Result<StreamStats, chpart_input::InputError>,
    Result<String, String>,
) {
    let pump = ArrowStreamPump::start(input, &table(), "stdin").unwrap();
    let plan: InputPlan = pump.plan().clone();
    let list = plan.insert_column_list();
    let definition = "v Int64, k LowCardinality(String), tags Array(String), ts DateTime64(6, 'UTC'), loaded UInt8 DEFAULT 7";
    let query = format!(
        "CREATE TABLE t ({definition}) ENGINE = MergeTree ORDER BY tuple(); \
         INSERT INTO t ({list}) SELECT {list} FROM table; \
         SELECT * FROM t ORDER BY v FORMAT TSV"
    );
    let mut child = Command::new(chpart_testenv::clickhouse_local())
        .args([
            "--structure",
            &plan.structure,
            "--input-format",
            "ArrowStream",
            "--file",
            "-",
            "--query",
            &query,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run clickhouse-local");
    let stdin = child.stdin.take().unwrap();
    let pumped = pump.pump(stdin, "clickhouse-local");
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let clickhouse = if out.status.success() {
        Ok(stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    };
    (pumped, clickhouse)
}

#[test]
fn pumped_batches_load_exactly() {
    let input = ipc_stream(&[
        spark_like(0, None),
        spark_like(1, None),
        spark_like(2, None),
    ]);
    let (pumped, clickhouse) = pump_into_clickhouse(&input);
    let pumped = pumped.unwrap();
    assert_eq!(
        pumped,
        StreamStats {
            rows: 6,
            batches: 3,
            bytes: input.len() as u64,
            chunks: 1,
            read_wait: pumped.read_wait,
        }
    );
    let expected = [
        "0\tk0\t['t0','ü']\t1970-01-01 00:00:00.000000\t7",
        "1\tk1\t['t0','ü']\t1970-01-01 00:00:00.000000\t7",
        "2\tk2\t['t1','ü']\t1970-01-01 00:00:01.000001\t7",
        "3\tk3\t['t1','ü']\t1969-12-31 23:59:59.999999\t7",
        "4\tk4\t['t2','ü']\t1970-01-01 00:00:02.000002\t7",
        "5\tk5\t['t2','ü']\t1969-12-31 23:59:59.999998\t7",
    ];
    assert_eq!(clickhouse.unwrap().lines().collect::<Vec<_>>(), expected);
}

#[test]
fn empty_stream_loads_no_rows() {
    let schema = spark_like(0, None).schema();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &schema).unwrap();
    writer.finish().unwrap();
    let input = writer.into_inner().unwrap();
    let (pumped, clickhouse) = pump_into_clickhouse(&input);
    let pumped = pumped.unwrap();
    assert_eq!(
        pumped,
        StreamStats {
            rows: 0,
            batches: 0,
            bytes: input.len() as u64,
            chunks: 1,
            read_wait: pumped.read_wait,
        }
    );
    assert_eq!(clickhouse.unwrap(), "");
}

#[test]
fn failed_pump_fails_clickhouse_too() {
    // Batch 1 is fine and already on its way to clickhouse-local when batch 2's NULL is found:
    // the poisoned end of the output must make clickhouse-local fail rather than load batch 1.
    let input = ipc_stream(&[
        spark_like(0, None),
        spark_like(1, Some(1)),
        spark_like(2, None),
    ]);
    let (pumped, clickhouse) = pump_into_clickhouse(&input);
    let e = pumped.expect_err("NULL into Int64").to_string();
    assert!(
        e.contains("stdin, batch 2 (rows 2..4): column `v` has 1 NULL value(s)"),
        "{e}"
    );
    let err = clickhouse.expect_err("clickhouse-local must not load a prefix");
    assert!(err.contains("Code: "), "{err}");
}
