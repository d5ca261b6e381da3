//! `chpart-bench gen`: the events table written as Parquet files, streamed batch by batch.
//!
//! The files stand in for what a Spark task hands chpart: zstd-compressed Parquet with row
//! groups of about a million rows. Memory stays bounded for any row count because rows are
//! generated in batches of [`BATCH_ROWS`] and the Parquet writer holds at most one row group's
//! encoded pages. Generating (string formatting) and encoding (dictionary, zstd) each take
//! about half the time, so they run on two threads joined by a two-batch channel: on the
//! two-core machines this project runs on that nearly halves the wall time.
//!
//! Each file is written under a temporary name and renamed when complete, so an interrupted
//! run never leaves a truncated file that looks like a valid input.

use std::fs::{self, File};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use arrow_array::{Array, RecordBatch};
use chpart_core::time::{days_from_civil, days_in_month};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::events::{self, EventGen};
use crate::interrupt;

/// Rows per generated Arrow batch: large enough to amortise per-batch overhead, small enough
/// (about 8 MB) that two batches in flight are nothing next to a row group.
pub const BATCH_ROWS: usize = 65_536;
/// Rows per Parquet row group, the size Spark and pyarrow writers commonly produce.
pub const ROW_GROUP_ROWS: usize = 1_000_000;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenOptions {
    /// Rows in all files together.
    pub rows: u64,
    /// The output file; with several files, `<stem>.<i>.parquet` next to it.
    pub out: PathBuf,
    /// Number of files the rows are split into (consecutive ranges of the same row stream).
    pub files: usize,
    /// Seed of the row stream.
    pub seed: u64,
    /// Start of the hour the events fall in, Unix seconds (UTC).
    pub hour_start_secs: i64,
}

/// What was generated.
#[derive(Clone, Debug)]
pub struct GenReport {
    /// The files written, in row order.
    pub paths: Vec<PathBuf>,
    /// Rows written.
    pub rows: u64,
    /// Size of the files on disk.
    pub file_bytes: u64,
    /// Size of the Arrow data (values, offsets, validity) before encoding.
    pub arrow_bytes: u64,
    /// Wall time of the whole generation.
    pub elapsed: Duration,
}

impl GenReport {
    /// A one-line summary for the terminal.
    pub fn summary(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        let rows = self.rows.max(1) as f64;
        format!(
            "generated {} rows in {} file(s) in {secs:.2} s ({:.0} rows/s): {:.1} MB on disk \
             ({:.1} B/row), Arrow in memory {:.1} B/row",
            self.rows,
            self.paths.len(),
            self.rows as f64 / secs.max(1e-9),
            self.file_bytes as f64 / 1e6,
            self.file_bytes as f64 / rows,
            self.arrow_bytes as f64 / rows,
        )
    }
}

/// The paths `options` writes to, in row order.
pub fn output_paths(out: &Path, files: usize) -> Vec<PathBuf> {
    if files == 1 {
        return vec![out.to_path_buf()];
    }
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "events".into());
    let ext = out
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_else(|| "parquet".into());
    (0..files)
        .map(|i| out.with_file_name(format!("{stem}.{i}.{ext}")))
        .collect()
}

/// Rows of file `i` of `files`: an even split, the first files taking one more when it is
/// uneven.
fn rows_of_file(rows: u64, files: usize, i: usize) -> u64 {
    let files = files as u64;
    rows / files + u64::from((i as u64) < rows % files)
}

/// Writes the files described by `options`.
pub fn generate(options: &GenOptions) -> anyhow::Result<GenReport> {
    if options.rows == 0 {
        bail!("--rows must be at least 1");
    }
    if options.files == 0 || options.files as u64 > options.rows {
        bail!("--files must be between 1 and the number of rows");
    }
    let started = Instant::now();
    if let Some(parent) = options.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    }
    let paths = output_paths(&options.out, options.files);
    let (tx, rx) = mpsc::sync_channel::<(usize, RecordBatch)>(2);
    let options_for_gen = options.clone();
    let (arrow_bytes, written) = std::thread::scope(|scope| {
        let producer = scope.spawn(move || {
            let mut generator = EventGen::new(
                options_for_gen.seed,
                options_for_gen.hour_start_secs,
                options_for_gen.rows,
            );
            for file in 0..options_for_gen.files {
                let mut left = rows_of_file(options_for_gen.rows, options_for_gen.files, file);
                while left > 0 {
                    if interrupt::requested() {
                        return;
                    }
                    let batch = generator.next_batch(BATCH_ROWS.min(left as usize));
                    left -= batch.num_rows() as u64;
                    // A closed channel means the writer failed; it reports why.
                    if tx.send((file, batch)).is_err() {
                        return;
                    }
                }
            }
        });
        let written = write_files(&paths, rx);
        producer
            .join()
            .expect("the generator thread does not panic");
        written
    })?;
    if interrupt::requested() {
        bail!("interrupted");
    }
    if written != options.rows {
        bail!("wrote {written} rows, expected {}", options.rows);
    }
    let file_bytes = paths
        .iter()
        .map(|p| fs::metadata(p).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()
        .context("stat the generated files")?;
    Ok(GenReport {
        paths,
        rows: options.rows,
        file_bytes,
        arrow_bytes,
        elapsed: started.elapsed(),
    })
}

/// Writes the batches arriving on `rx` into `paths[file]`; returns (Arrow bytes, rows).
fn write_files(
    paths: &[PathBuf],
    rx: mpsc::Receiver<(usize, RecordBatch)>,
) -> anyhow::Result<(u64, u64)> {
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build();
    let mut current: Option<(usize, PartialFile)> = None;
    let (mut arrow_bytes, mut rows) = (0u64, 0u64);
    for (file, batch) in rx {
        if current.as_ref().map(|(i, _)| *i) != Some(file) {
            if let Some((_, done)) = current.take() {
                done.finish()?;
            }
            current = Some((file, PartialFile::create(&paths[file], props.clone())?));
        }
        let (_, partial) = current.as_mut().expect("opened above");
        arrow_bytes += batch
            .columns()
            .iter()
            .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0) as u64)
            .sum::<u64>();
        rows += batch.num_rows() as u64;
        partial
            .writer
            .write(&batch)
            .with_context(|| format!("write {}", partial.path.display()))?;
    }
    if let Some((_, done)) = current {
        done.finish()?;
    }
    Ok((arrow_bytes, rows))
}

/// A Parquet file being written under a temporary name in its directory, which is removed
/// if the file is dropped unfinished.
struct PartialFile {
    path: PathBuf,
    tmp: tempfile::NamedTempFile,
    writer: ArrowWriter<BufWriter<File>>,
}

impl PartialFile {
    fn create(path: &Path, props: WriterProperties) -> anyhow::Result<PartialFile> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(".chpart-bench-")
            .suffix(".tmp")
            .tempfile_in(dir)
            .with_context(|| format!("create a temporary file in {}", dir.display()))?;
        let file = tmp.as_file().try_clone()?;
        let writer = ArrowWriter::try_new(
            BufWriter::with_capacity(1 << 20, file),
            events::schema(),
            Some(props),
        )?;
        Ok(PartialFile {
            path: path.to_path_buf(),
            tmp,
            writer,
        })
    }

    fn finish(self) -> anyhow::Result<()> {
        let what = || format!("finish {}", self.path.display());
        let buffered = self.writer.into_inner().with_context(what)?;
        let file = buffered
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(what)?;
        file.sync_all().with_context(what)?;
        self.tmp
            .persist(&self.path)
            .map_err(|e| e.error)
            .with_context(|| format!("rename the finished file to {}", self.path.display()))?;
        Ok(())
    }
}

/// Parses `YYYY-MM-DDTHH` (an hour, UTC) into Unix seconds.
pub fn parse_hour(text: &str) -> anyhow::Result<i64> {
    let bad = || anyhow::anyhow!("--hour {text:?}: expected YYYY-MM-DDTHH, e.g. 2026-11-30T09");
    let b = text.as_bytes();
    if b.len() != 13 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' {
        return Err(bad());
    }
    let num = |range: std::ops::Range<usize>| -> anyhow::Result<i64> {
        let s = &text[range];
        if !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    let (year, month, day, hour) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?);
    let days = days_in_month(year, month).ok_or_else(bad)?;
    if day < 1 || day > days || hour > 23 {
        return Err(bad());
    }
    Ok(days_from_civil(year, month, day) * 86_400 + hour * 3600)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    #[test]
    fn hours_parse_to_unix_seconds() {
        assert_eq!(parse_hour("2026-11-30T09").unwrap(), 1_796_029_200);
        assert_eq!(parse_hour("1970-01-01T00").unwrap(), 0);
        assert_eq!(parse_hour("2024-02-29T23").unwrap(), 1_709_247_600);
        for bad in [
            "2026-11-30",
            "2026-13-01T00",
            "2025-02-29T00",
            "2026-11-30T24",
            "2026-11-3xT09",
            "+026-11-30T09",
        ] {
            assert!(parse_hour(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rows_split_evenly_over_files() {
        assert_eq!(
            (0..3).map(|i| rows_of_file(10, 3, i)).collect::<Vec<_>>(),
            [4, 3, 3]
        );
        assert_eq!(
            output_paths(Path::new("/x/ev.parquet"), 2),
            [
                PathBuf::from("/x/ev.0.parquet"),
                PathBuf::from("/x/ev.1.parquet")
            ]
        );
        assert_eq!(
            output_paths(Path::new("/x/ev.parquet"), 1),
            [PathBuf::from("/x/ev.parquet")]
        );
    }

    fn read_all(paths: &[PathBuf]) -> Vec<RecordBatch> {
        paths
            .iter()
            .flat_map(|p| {
                ParquetRecordBatchReaderBuilder::try_new(File::open(p).unwrap())
                    .unwrap()
                    .with_batch_size(usize::MAX)
                    .build()
                    .unwrap()
                    .map(Result::unwrap)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn files_are_deterministic_and_splitting_keeps_the_rows() {
        let dir = tempfile::tempdir().unwrap();
        let options = |name: &str, files| GenOptions {
            rows: 5_000,
            out: dir.path().join(name),
            files,
            seed: 9,
            hour_start_secs: 1_796_029_200,
        };
        let one = generate(&options("a.parquet", 1)).unwrap();
        let again = generate(&options("b.parquet", 1)).unwrap();
        assert_eq!(
            fs::read(&one.paths[0]).unwrap(),
            fs::read(&again.paths[0]).unwrap()
        );
        let three = generate(&options("c.parquet", 3)).unwrap();
        assert_eq!(three.paths.len(), 3);
        let whole = read_all(&one.paths);
        assert_eq!(
            whole[0].schema(),
            events::schema(),
            "the Parquet round trip keeps the schema"
        );
        let split = read_all(&three.paths);
        let whole_rows: usize = whole.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(whole_rows, 5_000);
        // Same rows in the same order: compare the user ids column end to end.
        let users = |batches: &[RecordBatch]| -> Vec<u64> {
            batches
                .iter()
                .flat_map(|b| {
                    let ids = b.column(1).to_data();
                    ids.buffers()[0].typed_data::<u64>()[ids.offset()..ids.offset() + ids.len()]
                        .to_vec()
                })
                .collect()
        };
        assert_eq!(users(&whole), users(&split));
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
