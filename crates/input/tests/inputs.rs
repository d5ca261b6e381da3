//! The readers on real files and streams: value checks from statistics and from data, and
//! every way an input can be broken. No ClickHouse needed here.

mod common;

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;

use arrow_array::builder::{Int32Builder, ListBuilder, StringDictionaryBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};
use arrow_schema::{Field, Schema};
use chpart_input::{ArrowStreamPump, ChunkSink, InputError, ParquetInput, StreamStats};

use common::{ipc_stream, path, scratch, target, write_parquet};

fn batch(columns: Vec<(&str, ArrayRef, bool)>) -> RecordBatch {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a, null)| Field::new(*n, a.data_type().clone(), *null))
        .collect();
    RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns.into_iter().map(|(_, a, _)| a).collect(),
    )
    .unwrap()
}

/// Three row groups of `id` (never NULL, declared nullable) and `v` (NULL only in the last).
fn id_v_batches() -> Vec<RecordBatch> {
    let rg = |ids: Vec<i32>, v: Vec<Option<i64>>| {
        batch(vec![
            ("id", Arc::new(Int32Array::from(ids)), true),
            ("v", Arc::new(Int64Array::from(v)), true),
        ])
    };
    vec![
        rg(vec![1, 2], vec![Some(1), Some(2)]),
        rg(vec![3, 4], vec![Some(3), Some(4)]),
        rg(vec![5, 6, 7], vec![Some(5), Some(6), None]),
    ]
}

/// Whether every column chunk of the file carries a null count.
fn has_null_counts(input: &std::path::Path) -> bool {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(std::fs::File::open(input).unwrap()).unwrap();
    let meta = reader.metadata();
    meta.row_groups().iter().all(|rg| {
        rg.columns()
            .iter()
            .all(|c| c.statistics().and_then(|s| s.null_count_opt()).is_some())
    })
}

#[test]
fn parquet_null_check_with_and_without_statistics() {
    let dir = scratch();
    let table = target(&[("id", "Int32", ""), ("v", "Int64", "")]);
    // (statistics written, target type of v, expected error substring or None)
    let rows = [
        (true, "Int64", Some("row group 2: column `v` has 1 NULL value(s) at `v` (first at row 2), but ClickHouse type Int64 is not Nullable")),
        (false, "Int64", Some("row group 2: column `v` has 1 NULL value(s) at `v` (first at row 2), but ClickHouse type Int64 is not Nullable")),
        (true, "Nullable(Int64)", None),
        (false, "Nullable(Int64)", None),
    ];
    for (statistics, v_type, expected) in rows {
        let file = path(&dir, &format!("nulls-{statistics}.parquet"));
        write_parquet(&file, &id_v_batches(), statistics);
        assert_eq!(
            has_null_counts(&file),
            statistics,
            "the writer honours the statistics setting"
        );
        let input = ParquetInput::open(&file).unwrap();
        assert_eq!(input.num_rows(), 7);
        assert_eq!(input.num_row_groups(), 3);
        let mut table = table.clone();
        table[1].ch_type = v_type.parse().unwrap();
        let plan = input.check_schema(&table).unwrap();
        assert_eq!(
            plan.null_checks().count(),
            if v_type == "Int64" { 2 } else { 1 }
        );
        match (input.check_nulls(&plan), expected) {
            (Ok(()), None) => {}
            (Err(e), Some(needle)) => {
                let text = e.to_string();
                assert!(matches!(e, InputError::Value { .. }), "{e:?}");
                assert!(
                    text.starts_with(&file.display().to_string()),
                    "names the file: {text}"
                );
                assert!(text.contains(needle), "statistics {statistics}: {text}");
            }
            (got, expected) => {
                panic!("statistics {statistics}, {v_type}: expected {expected:?}, got {got:?}")
            }
        }
    }
}

/// Overwrites the data of every column chunk of column `leaf` with garbage, keeping the footer.
fn corrupt_column_data(file: &std::path::Path, leaf: usize) {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(std::fs::File::open(file).unwrap()).unwrap();
    let ranges: Vec<(u64, u64)> = reader
        .metadata()
        .row_groups()
        .iter()
        .map(|rg| {
            let (start, len) = rg.column(leaf).byte_range();
            (start, len)
        })
        .collect();
    let mut f = OpenOptions::new().write(true).open(file).unwrap();
    for (start, len) in ranges {
        f.seek(SeekFrom::Start(start)).unwrap();
        f.write_all(&vec![0xA5; len as usize]).unwrap();
    }
}

#[test]
fn parquet_statistics_settle_null_checks_without_reading_data() {
    // `id` is declared nullable but has no NULL. With statistics its data is never read, so
    // garbage there goes unnoticed; without, the check must decode it and so hits the garbage.
    let dir = scratch();
    let table = target(&[("id", "Int32", "")]);
    for statistics in [true, false] {
        let file = path(&dir, &format!("corrupt-{statistics}.parquet"));
        let batches: Vec<RecordBatch> = id_v_batches()
            .iter()
            .map(|b| b.project(&[0]).unwrap())
            .collect();
        write_parquet(&file, &batches, statistics);
        corrupt_column_data(&file, 0);
        let input = ParquetInput::open(&file).unwrap();
        let plan = input.check_schema(&table).unwrap();
        assert_eq!(plan.null_checks().count(), 1);
        let result = input.check_nulls(&plan);
        if statistics {
            result.unwrap_or_else(|e| panic!("statistics should have settled it: {e}"));
        } else {
            let e = result.expect_err("decoding garbage must fail");
            let text = e.to_string();
            assert!(
                matches!(e, InputError::ParquetData { row_group: 0, .. }),
                "{e:?}"
            );
            assert!(
                text.contains(&file.display().to_string())
                    && text.contains("row group 0")
                    && text.contains("`id`"),
                "{text}"
            );
        }
    }
}

#[test]
fn parquet_nested_nulls_and_datetime_range() {
    let dir = scratch();
    let mut lists = ListBuilder::new(Int32Builder::new());
    lists.append_value([Some(1)]);
    lists.append_value([Some(2), None]);
    let lists: ArrayRef = Arc::new(lists.finish());
    let ts = |v: Vec<i64>| -> ArrayRef {
        Arc::new(TimestampMillisecondArray::from(v).with_timezone("UTC"))
    };
    let batches = vec![
        batch(vec![
            ("l", lists.slice(0, 1), false),
            ("t", ts(vec![0]), false),
        ]),
        batch(vec![
            ("l", lists.slice(1, 1), false),
            ("t", ts(vec![4_294_967_295_999]), false),
        ]),
        batch(vec![
            ("l", lists.slice(0, 1), false),
            ("t", ts(vec![-1]), false),
        ]),
    ];
    // (statistics, l type, t type, expected error substring or None)
    let rows = [
        (true, "Array(Int32)", "DateTime64(3, 'UTC')", Some("row group 1: column `l` has 1 NULL value(s) at `l`[*], but ClickHouse type Int32 is not Nullable (input Arrow type Int32, column type Array(Int32))")),
        (false, "Array(Int32)", "DateTime64(3, 'UTC')", Some("row group 1: column `l` has 1 NULL value(s) at `l`[*]")),
        (true, "Array(Nullable(Int32))", "DateTime('UTC')", Some("row group 2: column `t` has 1 value(s) at `t` outside ClickHouse DateTime's range 1970-01-01 00:00:00 .. 2106-02-07 06:28:15 UTC (first: -1 ms since 1970")),
        (false, "Array(Nullable(Int32))", "DateTime('UTC')", Some("row group 2: column `t` has 1 value(s) at `t` outside")),
        (true, "Array(Nullable(Int32))", "DateTime64(3, 'UTC')", None),
    ];
    for (statistics, l_type, t_type, expected) in rows {
        let file = path(&dir, &format!("nested-{statistics}.parquet"));
        write_parquet(&file, &batches, statistics);
        let input = ParquetInput::open(&file).unwrap();
        let plan = input
            .check_schema(&target(&[("l", l_type, ""), ("t", t_type, "")]))
            .unwrap();
        let result = input.check_nulls(&plan).map_err(|e| e.to_string());
        match (result, expected) {
            (Ok(()), None) => {}
            (Err(text), Some(needle)) => assert!(
                text.contains(needle),
                "{statistics} {l_type} {t_type}: {text}"
            ),
            (got, expected) => {
                panic!("{statistics} {l_type} {t_type}: expected {expected:?}, got {got:?}")
            }
        }
    }
}

#[test]
fn broken_parquet_files_are_errors_naming_the_file() {
    let dir = scratch();
    let good = path(&dir, "good.parquet");
    write_parquet(&good, &id_v_batches(), true);
    let bytes = std::fs::read(&good).unwrap();
    let half = path(&dir, "half.parquet");
    std::fs::write(&half, &bytes[..bytes.len() / 2]).unwrap();
    let garbage = path(&dir, "garbage.parquet");
    std::fs::write(
        &garbage,
        b"this is not parquet at all, just text that goes on for a while",
    )
    .unwrap();
    let tiny = path(&dir, "tiny.parquet");
    std::fs::write(&tiny, b"PAR1").unwrap();
    let empty = path(&dir, "empty.parquet");
    std::fs::write(&empty, b"").unwrap();
    let no_footer = path(&dir, "no-footer.parquet");
    std::fs::write(&no_footer, &bytes[..bytes.len() - 1]).unwrap();
    let missing = path(&dir, "missing.parquet");
    for file in [&half, &garbage, &tiny, &empty, &no_footer] {
        let e = ParquetInput::open(file).expect_err("broken file");
        let text = e.to_string();
        assert!(matches!(e, InputError::NotParquet { .. }), "{e:?}");
        assert!(
            text.starts_with(&format!("{} is not a valid Parquet file: ", file.display())),
            "{text}"
        );
    }
    let e = ParquetInput::open(&missing).expect_err("missing file");
    assert!(matches!(e, InputError::Io { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with(&format!("cannot read {}: ", missing.display())),
        "{e}"
    );
}

/// Three batches of `k` (dictionary, replaced between batches) and `v` (NULL in `bad_batch`).
fn stream_batches(bad_batch: Option<usize>) -> Vec<RecordBatch> {
    (0..3)
        .map(|i| {
            let mut k = StringDictionaryBuilder::<Int32Type>::new();
            for j in 0..3 {
                k.append_value(format!("key{}", i * 10 + j));
            }
            let v: Vec<Option<i64>> = (0..3)
                .map(|j| {
                    if Some(i) == bad_batch && j == 1 {
                        None
                    } else {
                        Some((i * 3 + j) as i64)
                    }
                })
                .collect();
            batch(vec![
                ("k", Arc::new(k.finish()), false),
                ("v", Arc::new(Int64Array::from(v)), true),
            ])
        })
        .collect()
}

fn stream_target() -> Vec<chpart_input::TargetColumn> {
    target(&[
        ("k", "LowCardinality(String)", ""),
        ("v", "Int64", ""),
        ("at", "DateTime", "DEFAULT"),
    ])
}

/// A producer that is slow to start: its first read waits `delay`.
struct SlowStart<'a> {
    rest: &'a [u8],
    delay: Option<std::time::Duration>,
}

impl std::io::Read for SlowStart<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(delay) = self.delay.take() {
            std::thread::sleep(delay);
        }
        self.rest.read(buf)
    }
}

#[test]
fn pump_counts_the_time_spent_waiting_for_its_producer() {
    let input = ipc_stream(&stream_batches(None));
    let delay = std::time::Duration::from_millis(200);
    let slow = SlowStart {
        rest: input.as_slice(),
        delay: Some(delay),
    };
    let pump = ArrowStreamPump::start(slow, &stream_target(), "stdin").unwrap();
    let stats = pump.pump(Vec::new(), "a buffer").unwrap();
    assert_eq!(stats.rows, 9);
    assert!(stats.read_wait >= delay, "{stats:?}");
    // Reading a buffer in memory takes next to no time.
    let pump = ArrowStreamPump::start(input.as_slice(), &stream_target(), "stdin").unwrap();
    let stats = pump.pump(Vec::new(), "a buffer").unwrap();
    assert!(stats.read_wait < delay, "{stats:?}");
}

#[test]
fn pump_passes_a_stream_through_and_counts_it() {
    let input = ipc_stream(&stream_batches(None));
    let pump = ArrowStreamPump::start(input.as_slice(), &stream_target(), "stdin").unwrap();
    assert_eq!(
        pump.plan().structure,
        "`k` LowCardinality(String), `v` Int64"
    );
    assert_eq!(pump.plan().insert_columns, vec!["k", "v"]);
    let mut out = Vec::new();
    let stats = pump.pump(&mut out, "a buffer").unwrap();
    assert_eq!(
        stats,
        StreamStats {
            rows: 9,
            batches: 3,
            bytes: input.len() as u64,
            chunks: 1,
            read_wait: stats.read_wait,
        }
    );
    // What came out is a complete stream with the same rows.
    let reader = arrow_ipc::reader::StreamReader::try_new(out.as_slice(), None).unwrap();
    let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
    assert_eq!(batches, stream_batches(None));
    // A stream with a schema and no batch is a valid, empty input.
    let schema = stream_batches(None)[0].schema();
    let mut empty = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &schema).unwrap();
    empty.finish().unwrap();
    let empty = empty.into_inner().unwrap();
    let pump = ArrowStreamPump::start(empty.as_slice(), &stream_target(), "stdin").unwrap();
    let stats = pump.pump(Vec::new(), "a buffer").unwrap();
    assert_eq!(
        stats,
        StreamStats {
            rows: 0,
            batches: 0,
            bytes: empty.len() as u64,
            chunks: 1,
            read_wait: stats.read_wait,
        }
    );
}

#[test]
fn pump_rejects_nulls_and_broken_streams_naming_stdin_and_batch() {
    let good = ipc_stream(&stream_batches(None));
    let with_null = ipc_stream(&stream_batches(Some(1)));
    // Offsets of message boundaries: cutting the stream there leaves a valid-looking prefix.
    let one_batch = ipc_stream(&stream_batches(None)[..1]);
    let eos = 8;
    let boundary_after_first = one_batch.len() - eos;
    let mut trailing = good.clone();
    trailing.extend_from_slice(&good);
    // (name, input bytes, expected error substring)
    let rows: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "NULL in batch 2",
            with_null,
            "stdin, batch 2 (rows 3..6): column `v` has 1 NULL value(s) at `v` (first at row 4), but ClickHouse type Int64 is not Nullable (input Arrow type Int64, column type Int64)",
        ),
        ("cut inside batch 2", good[..boundary_after_first + 40].to_vec(), "stdin: invalid or truncated Arrow IPC stream at batch 2 (after 3 rows): "),
        (
            "cut between batches",
            good[..boundary_after_first].to_vec(),
            "stdin: invalid or truncated Arrow IPC stream at the end of the stream (after batch 1, 3 rows): the input ended without the end-of-stream marker",
        ),
        (
            "cut inside a length prefix",
            good[..boundary_after_first + 2].to_vec(),
            "the input ended without the end-of-stream marker",
        ),
        ("end-of-stream marker missing", good[..good.len() - eos].to_vec(), "(after batch 3, 9 rows): the input ended without the end-of-stream marker"),
        ("two streams", trailing, "(after batch 3, 9 rows): there is data after the end-of-stream marker"),
        ("empty input", Vec::new(), "stdin: invalid or truncated Arrow IPC stream at the schema message: the input is empty"),
        ("garbage", b"garbage, not an Arrow stream, long enough to be read as a message".to_vec(), "stdin: invalid or truncated Arrow IPC stream at the schema message: "),
        ("cut inside the schema", good[..20].to_vec(), "stdin: invalid or truncated Arrow IPC stream at the schema message: "),
    ];
    for (name, input, needle) in rows {
        let result = ArrowStreamPump::start(input.as_slice(), &stream_target(), "stdin");
        let mut out = Vec::new();
        let result = result.and_then(|pump| pump.pump(&mut out, "a buffer"));
        let text = result.expect_err(name).to_string();
        assert!(text.contains(needle), "{name}: {text}");
        if !out.is_empty() {
            assert!(
                out.ends_with(&[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]),
                "{name}: output poisoned"
            );
        }
    }
}

/// Chunks in memory, with the numbers reported done.
#[derive(Default)]
struct Chunks {
    outputs: Vec<std::rc::Rc<std::cell::RefCell<Vec<u8>>>>,
    done: Vec<u64>,
}

struct Shared(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ChunkSink for Chunks {
    type Output = Shared;
    fn open(&mut self, number: u64) -> Result<(Shared, String), InputError> {
        assert_eq!(
            number as usize,
            self.outputs.len() + 1,
            "chunks open in order"
        );
        self.outputs.push(Default::default());
        Ok((
            Shared(self.outputs.last().unwrap().clone()),
            format!("chunk {number}"),
        ))
    }
    fn done(&mut self, number: u64) -> Result<(), InputError> {
        self.done.push(number);
        Ok(())
    }
}

/// Each chunk is a complete stream of whole batches: with a 1-byte bound, one batch each, and
/// no empty chunk after the last; a stream that breaks in batch 2 leaves chunk 1 done and
/// chunk 2 poisoned, never done; a bound above the stream is one chunk, as `pump`.
#[test]
fn pump_chunked_cuts_the_stream_into_complete_streams_at_batch_boundaries() {
    let batches = stream_batches(None);
    let input = ipc_stream(&batches);
    let mut sink = Chunks::default();
    let pump = ArrowStreamPump::start(input.as_slice(), &stream_target(), "stdin").unwrap();
    let stats = pump.pump_chunked(1, &mut sink).unwrap();
    assert_eq!((stats.rows, stats.batches, stats.chunks), (9, 3, 3));
    assert_eq!(sink.done, vec![1, 2, 3]);
    for (i, chunk) in sink.outputs.iter().enumerate() {
        let chunk = chunk.borrow();
        let reader = arrow_ipc::reader::StreamReader::try_new(chunk.as_slice(), None).unwrap();
        let read: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
        assert_eq!(read, vec![batches[i].clone()], "chunk {}", i + 1);
    }

    let broken = ipc_stream(&stream_batches(Some(1)));
    let mut sink = Chunks::default();
    let pump = ArrowStreamPump::start(broken.as_slice(), &stream_target(), "stdin").unwrap();
    let err = pump.pump_chunked(1, &mut sink).unwrap_err().to_string();
    assert!(err.contains("batch 2 (rows 3..6)"), "{err}");
    assert_eq!(sink.done, vec![1]);
    assert_eq!(sink.outputs.len(), 2);
    assert!(sink.outputs[1]
        .borrow()
        .ends_with(&[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]));

    let mut sink = Chunks::default();
    let pump = ArrowStreamPump::start(input.as_slice(), &stream_target(), "stdin").unwrap();
    let stats = pump.pump_chunked(1 << 30, &mut sink).unwrap();
    assert_eq!((stats.batches, stats.chunks), (3, 1));
    assert_eq!(sink.done, vec![1]);
}

#[test]
fn pump_checks_the_schema_first() {
    let input = ipc_stream(&[batch(vec![
        ("k", Arc::new(StringArray::from(vec!["a"])), false),
        ("extra", Arc::new(Int32Array::from(vec![1])), false),
    ])]);
    let Err(e) = ArrowStreamPump::start(input.as_slice(), &stream_target(), "stdin") else {
        panic!("an extra column and a missing one must be refused");
    };
    assert!(matches!(e, InputError::Schema(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "stdin: the input's schema does not fit the target table (2 problem(s)):\n  \
         - column `extra` (Arrow type Int32) is not a column of the target table\n  \
         - target column `v` (ClickHouse type Int64) is missing from the input and has no DEFAULT"
    );
}

#[test]
fn parquet_check_with_another_files_plan_is_an_error() {
    let dir = scratch();
    let a = path(&dir, "a.parquet");
    write_parquet(&a, &id_v_batches(), true);
    let b = path(&dir, "b.parquet");
    let other = batch(vec![(
        "v",
        Arc::new(Int32Array::from(vec![Some(1), None])),
        true,
    )]);
    write_parquet(&b, &[other], true);
    let table = target(&[("id", "Int32", "DEFAULT"), ("v", "Int64", "")]);
    let plan = ParquetInput::open(&a)
        .unwrap()
        .check_schema(&table)
        .unwrap();
    let e = ParquetInput::open(&b)
        .unwrap()
        .check_nulls(&plan)
        .expect_err("b has no `id` and another `v`");
    assert!(matches!(e, InputError::PlanMismatch { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("b.parquet: the load plan expects column `id` of Arrow type Int32"),
        "{e}"
    );
}
