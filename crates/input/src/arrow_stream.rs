//! Arrow IPC stream input: checked pass-through from the batch job to clickhouse-local.
//!
//! A task that produces rows in memory (Spark's `mapInArrow`, a pyarrow script) pipes them
//! to chpart as an Arrow IPC stream on stdin; chpart pipes them on to clickhouse-local's stdin
//! (`--input-format ArrowStream`). The stream can be larger than memory and can only be read
//! once, so [`ArrowStreamPump`] checks as it goes: [`ArrowStreamPump::start`] reads the schema
//! message and runs [`check_schema`] (so the caller gets the [`InputPlan`]'s `--structure`
//! before starting clickhouse-local), then [`ArrowStreamPump::pump`] moves one batch at a time,
//! running the plan's value checks on each before writing it.
//!
//! Exactly-once needs a *complete* stream, stricter than the IPC reader: a stream that stops
//! without its end-of-stream marker (a producer that died between two batches looks just like
//! a shorter valid stream) is an error, and so is data after the marker (two concatenated
//! streams would otherwise lose the second). When pumping fails after some batches were
//! written, the output is ended with a deliberately broken message header so that the consumer
//! fails too rather than building parts from a prefix; the caller must still treat the pump's
//! error as the task's failure.

use std::io::{BufReader, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{ArrowError, SchemaRef};

use crate::error::InputError;
use crate::schema::{check_schema, InputPlan, TargetColumn};

/// What [`ArrowStreamPump::pump`] moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Rows in all batches.
    pub rows: u64,
    /// Record batches (dictionary batches not counted).
    pub batches: u64,
    /// Bytes of the input stream, end-of-stream marker included.
    pub bytes: u64,
    /// Outputs written (one for [`ArrowStreamPump::pump`]).
    pub chunks: u64,
    /// Time spent in the input's reads: waiting for the producer to write (and copying what
    /// it wrote). Close to the pump's whole time when the producer is the slower side.
    pub read_wait: Duration,
}

/// Where [`ArrowStreamPump::pump_chunked`] writes its chunks.
pub trait ChunkSink {
    /// What one chunk is written to.
    type Output: Write;
    /// Opens chunk `number` (from 1), with its name for messages.
    fn open(&mut self, number: u64) -> Result<(Self::Output, String), InputError>;
    /// Chunk `number` is complete: written, ended and flushed. An error stops the pump.
    fn done(&mut self, number: u64) -> Result<(), InputError>;
}

/// [`ArrowStreamPump::pump`]'s sink: one output, the whole stream.
struct OneOutput<W>(Option<(W, String)>);

impl<W: Write> ChunkSink for OneOutput<W> {
    type Output = W;
    fn open(&mut self, _number: u64) -> Result<(W, String), InputError> {
        Ok(self
            .0
            .take()
            .expect("one output: the bound is never reached"))
    }
    fn done(&mut self, _number: u64) -> Result<(), InputError> {
        Ok(())
    }
}

/// Counts the bytes written through it (a chunk's size).
struct Counted<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Counts bytes and the time spent reading, and notices end of input, beneath the IPC
/// reader's buffer.
struct Tracked<R> {
    inner: R,
    bytes: Arc<AtomicU64>,
    eof: Arc<AtomicBool>,
    read_nanos: Arc<AtomicU64>,
}

impl<R: Read> Read for Tracked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let started = Instant::now();
        let n = self.inner.read(buf);
        self.read_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let n = n?;
        if n == 0 && !buf.is_empty() {
            self.eof.store(true, Ordering::Relaxed);
        }
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A checked Arrow IPC stream between a producer (`R`) and a consumer given to [`pump`].
///
/// [`pump`]: ArrowStreamPump::pump
pub struct ArrowStreamPump<R: Read> {
    reader: StreamReader<BufReader<Tracked<R>>>,
    plan: InputPlan,
    bytes: Arc<AtomicU64>,
    eof: Arc<AtomicBool>,
    read_nanos: Arc<AtomicU64>,
}

/// A message header announcing more metadata than will ever follow: any IPC reader fails on
/// it ("unexpected end of stream") instead of taking what came before as the whole stream.
const POISON: [u8; 8] = [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F];

impl<R: Read> ArrowStreamPump<R> {
    /// Reads the stream's schema message from `input` and checks it against `target`;
    /// `source` names the input in messages (`stdin`).
    pub fn start(
        input: R,
        target: &[TargetColumn],
        source: &str,
    ) -> Result<ArrowStreamPump<R>, InputError> {
        let bytes = Arc::new(AtomicU64::new(0));
        let eof = Arc::new(AtomicBool::new(false));
        let read_nanos = Arc::new(AtomicU64::new(0));
        let tracked = Tracked {
            inner: input,
            bytes: bytes.clone(),
            eof: eof.clone(),
            read_nanos: read_nanos.clone(),
        };
        let reader = StreamReader::try_new(BufReader::new(tracked), None).map_err(|e| {
            let reason = if bytes.load(Ordering::Relaxed) == 0 {
                "the input is empty (not even a schema message)".to_owned()
            } else {
                e.to_string()
            };
            InputError::BadStream {
                input: source.to_owned(),
                location: "the schema message".into(),
                reason,
            }
        })?;
        let plan = check_schema(&reader.schema(), target, source)?;
        Ok(ArrowStreamPump {
            reader,
            plan,
            bytes,
            eof,
            read_nanos,
        })
    }

    /// The plan for clickhouse-local (`--structure`, insert columns), known before pumping.
    pub fn plan(&self) -> &InputPlan {
        &self.plan
    }

    /// The stream's Arrow schema.
    pub fn schema(&self) -> SchemaRef {
        self.reader.schema()
    }

    /// Moves every batch to `output` as an Arrow IPC stream, checking each on the way, and
    /// ends it with the end-of-stream marker. `destination` names `output` in messages.
    /// Holds one batch at a time. On error the output is poisoned (see the module docs).
    pub fn pump<W: Write>(self, output: W, destination: &str) -> Result<StreamStats, InputError> {
        let mut sink = OneOutput(Some((output, destination.to_owned())));
        self.pump_chunked(u64::MAX, &mut sink)
    }

    /// Like [`pump`](Self::pump), into a series of outputs from `sink`: each chunk is a
    /// complete Arrow IPC stream (the schema, whole batches, the end-of-stream marker) of about
    /// `chunk_bytes` (a chunk ends after the batch that reaches it, so one batch larger than
    /// the bound is a chunk of its own). A chunk is handed to `sink` as done only once it is
    /// complete; the last one only once the input is known to have ended cleanly, so a
    /// consumer that takes done chunks never sees a chunk of a stream that turns out to be
    /// broken after it: the chunk that fails is poisoned and never reported done. Holds at
    /// most two batches at a time (one read ahead at a chunk's end, to tell the last chunk).
    pub fn pump_chunked<S: ChunkSink>(
        mut self,
        chunk_bytes: u64,
        sink: &mut S,
    ) -> Result<StreamStats, InputError> {
        let input = self.plan.source.clone();
        let schema = self.reader.schema();
        let mut stats = StreamStats::default();
        let mut pending: Option<RecordBatch> = None;
        let mut number = 1;
        loop {
            let (output, destination) = sink.open(number)?;
            let write_error = |batch: u64, error: ArrowError| InputError::Write {
                input: input.clone(),
                batch,
                destination: destination.clone(),
                error,
            };
            let counted = Counted {
                inner: output,
                bytes: 0,
            };
            let mut writer = StreamWriter::try_new_buffered(counted, &schema)
                .map_err(|e| write_error(stats.batches, e))?;
            let result = self
                .pump_batches(
                    &mut writer,
                    &mut stats,
                    &destination,
                    chunk_bytes,
                    &mut pending,
                )
                .and_then(|more| {
                    if more {
                        Ok(true)
                    } else {
                        self.expect_clean_end(&stats).map(|()| false)
                    }
                });
            let more = match result {
                Ok(more) => more,
                Err(error) => {
                    let sink = writer.get_mut();
                    // Best effort: the consumer may already be gone, and the caller has the
                    // real error.
                    let _ = sink.write_all(&POISON).and_then(|()| sink.flush());
                    return Err(error);
                }
            };
            writer.finish().map_err(|e| write_error(stats.batches, e))?;
            writer
                .into_inner()
                .and_then(|mut w| Ok(w.flush()?))
                .map_err(|e| write_error(stats.batches, e))?;
            sink.done(number)?;
            if !more {
                stats.bytes = self.bytes.load(Ordering::Relaxed);
                stats.chunks = number;
                stats.read_wait = Duration::from_nanos(self.read_nanos.load(Ordering::Relaxed));
                return Ok(stats);
            }
            number += 1;
        }
    }

    /// Writes batches into `writer` until the input ends (`Ok(false)`) or `chunk_bytes` are
    /// written and another batch follows (`Ok(true)`, that batch left in `pending`).
    fn pump_batches<W: Write>(
        &mut self,
        writer: &mut StreamWriter<std::io::BufWriter<Counted<W>>>,
        stats: &mut StreamStats,
        destination: &str,
        chunk_bytes: u64,
        pending: &mut Option<RecordBatch>,
    ) -> Result<bool, InputError> {
        loop {
            let number = stats.batches + 1;
            let batch = match pending.take() {
                Some(batch) => batch,
                None => match self.next_batch(stats)? {
                    None => return Ok(false),
                    Some(batch) => batch,
                },
            };
            self.check_batch(&batch, number, stats.rows)?;
            writer.write(&batch).map_err(|error| InputError::Write {
                input: self.plan.source.clone(),
                batch: number,
                destination: destination.to_owned(),
                error,
            })?;
            stats.batches = number;
            stats.rows += batch.num_rows() as u64;
            let buffered = writer.get_ref();
            if buffered.get_ref().bytes + buffered.buffer().len() as u64 >= chunk_bytes {
                // Full: another chunk only if another batch comes.
                return match self.next_batch(stats)? {
                    None => Ok(false),
                    Some(next) => {
                        *pending = Some(next);
                        Ok(true)
                    }
                };
            }
        }
    }

    /// The next batch of the input, `None` at its end.
    fn next_batch(&mut self, stats: &StreamStats) -> Result<Option<RecordBatch>, InputError> {
        match self.reader.next() {
            None => Ok(None),
            Some(Ok(batch)) => Ok(Some(batch)),
            Some(Err(e)) => Err(self.bad(
                format!("batch {} (after {} rows)", stats.batches + 1, stats.rows),
                e.to_string(),
            )),
        }
    }

    fn check_batch(
        &self,
        batch: &RecordBatch,
        number: u64,
        first_row: u64,
    ) -> Result<(), InputError> {
        for check in &self.plan.checks {
            check
                .check_array(batch.column(check.input_index), first_row)
                .map_err(|problem| InputError::Value {
                    input: self.plan.source.clone(),
                    location: format!(
                        "batch {number} (rows {first_row}..{})",
                        first_row + batch.num_rows() as u64
                    ),
                    problem,
                })?;
        }
        Ok(())
    }

    /// The reader stopped: it must have been at an end-of-stream marker with nothing after it.
    fn expect_clean_end(&mut self, stats: &StreamStats) -> Result<(), InputError> {
        let location = format!(
            "the end of the stream (after batch {}, {} rows)",
            stats.batches, stats.rows
        );
        if self.eof.load(Ordering::Relaxed) {
            return Err(self.bad(
                location,
                "the input ended without the end-of-stream marker; the producer may have stopped early".into(),
            ));
        }
        let mut probe = [0u8; 1];
        match self.reader.get_mut().read(&mut probe) {
            Ok(0) => Ok(()),
            Ok(_) => Err(self.bad(
                location,
                "there is data after the end-of-stream marker".into(),
            )),
            Err(e) => Err(self.bad(
                location,
                format!("reading past the end-of-stream marker failed: {e}"),
            )),
        }
    }

    fn bad(&self, location: String, reason: String) -> InputError {
        InputError::BadStream {
            input: self.plan.source.clone(),
            location,
            reason,
        }
    }
}
