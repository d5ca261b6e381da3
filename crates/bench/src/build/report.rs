//! The build benchmark's report: best-of-rounds tables, what the figures mean, and the targets
//! they are checked against.

use std::fmt::Write as _;

use super::{
    mb, BuildOptions, Phases, Results, Sample, Variant, DEFAULT_SPOOL_CHUNK_BYTES,
    SPOOL_CHUNKS_AT_ONCE,
};
use crate::measure::{self, DiskPeak};

/// The targets the report checks (issue 12, item 3).
const BUILD_TARGET: f64 = 0.95;
const UPLOAD_TARGET: f64 = 1.0;
const RSS_TARGET_MB: f64 = 256.0;

fn kib_mb(kib: Option<u64>) -> String {
    kib.map_or("-".into(), |k| format!("{:.1}", k as f64 * 1024.0 / 1e6))
}

/// The report: tables of best-of-rounds figures, notes on what they mean, and the targets.
pub(super) fn report(options: &BuildOptions, input: &str, results: &Results) -> String {
    let mut out = String::new();
    let rows = options.rows as f64;
    let w = &mut out;
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "chpart-bench build: {} rows in {} file(s), best of {} round(s); ClickHouse 26.9 (chdb) and OpenSSH on 127.0.0.1",
        options.rows, options.files, options.repeat
    );
    let _ = writeln!(w, "input: {input}");
    let _ = writeln!(
        w,
        "parts (raw build): {} part(s), {:.1} MB on disk, {:.1} B/row uncompressed, {:.1} B/row compressed{}",
        results.raw_parts,
        mb(results.raw_part_bytes),
        results.raw_uncompressed as f64 / rows,
        results.raw_part_bytes as f64 / rows,
        results
            .chpart_parts
            .map_or(String::new(), |n| format!("; chpart made {n} part(s)")),
    );

    let _ = writeln!(w);
    let raw_secs = results.best(Variant::Raw).map(|s| s.secs);
    let _ = writeln!(
        w,
        "{:<46} {:>8} {:>11} {:>7} {:>11} {:>12} {:>13}",
        "build: rows -> parts",
        "secs",
        "rows/s",
        "vs (a)",
        "own RSS MB",
        "tree RSS MB",
        "server CPU s"
    );
    for variant in [
        Variant::Raw,
        Variant::RawSync,
        Variant::Local,
        Variant::Sftp,
        Variant::StreamDefault,
        Variant::StreamSmall,
        Variant::RawMerge,
        Variant::LocalMerge,
        Variant::ServerInsert,
    ] {
        let Some(best) = results.best(variant) else {
            continue;
        };
        let ratio = raw_secs.map_or("-".into(), |raw| format!("{:.2}x", raw / best.secs));
        let _ = writeln!(
            w,
            "{:<46} {:>8.2} {:>11.0} {:>7} {:>11} {:>12} {:>13}",
            variant.label(),
            best.secs,
            rows / best.secs,
            ratio,
            kib_mb(best.own_peak_kib),
            kib_mb(best.tree_peak_kib),
            best.server_cpu_secs
                .map_or("-".into(), |c| format!("{c:.2}")),
        );
    }

    let phased: Vec<(Variant, &Sample, Phases)> =
        [Variant::Local, Variant::Sftp, Variant::LocalMerge]
            .into_iter()
            .filter_map(|v| {
                let best = results.best(v)?;
                Some((v, best, best.phases?))
            })
            .collect();
    if !phased.is_empty() {
        let _ = writeln!(w);
        let _ = writeln!(
            w,
            "{:<46} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "chpart's phases (its log), secs", "build", "digest", "upload", "publish", "other"
        );
        for (variant, best, p) in phased {
            let _ = writeln!(
                w,
                "{:<46} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
                variant.label(),
                p.build,
                p.digest,
                p.upload,
                p.publish,
                best.secs - p.total(),
            );
        }
    }

    let streamed = stream_rows(options, results);
    if streamed.iter().any(|row| row.chunk_bytes.is_some()) {
        let _ = writeln!(w);
        let _ = writeln!(
            w,
            "{:<46} {:>7} {:>6} {:>7} {:>9} {:>8} {:>8} {:>8} {:>7} {:>6} {:>8}",
            "Arrow stream on stdin: work dir disk, MB",
            "vs (b)",
            "chunks",
            "at once",
            "chunk MiB",
            "largest",
            "peak",
            "bound",
            "parts",
            "parts#",
            "stream"
        );
        for row in &streamed {
            // (b) spools nothing: its chunk columns are blank.
            let spooled = |text: String| {
                if row.chunk_bytes.is_some() {
                    text
                } else {
                    "-".to_owned()
                }
            };
            let _ = writeln!(
                w,
                "{:<46} {:>7} {:>6} {:>7} {:>9} {:>8} {:>8.1} {:>8} {:>8.1} {:>6} {:>8}",
                row.variant.label(),
                row.vs_local.map_or("-".into(), |r| format!("{r:.2}x")),
                row.chunks.map_or("-".into(), |c| c.to_string()),
                spooled(row.at_once.to_string()),
                spooled((row.chunk_bytes.unwrap_or(0) >> 20).to_string()),
                spooled(format!("{:.1}", mb(row.largest_chunk_bytes))),
                mb(row.peak_bytes),
                row.bound_bytes()
                    .map_or("-".into(), |b| format!("{:.1}", mb(b))),
                mb(row.part_bytes),
                row.parts,
                spooled(format!("{:.1}", mb(results.stream_bytes.unwrap_or(0)))),
            );
        }
    }

    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "{:<46} {:>8} {:>8} {:>8} {:>7}",
        "upload: part directories -> server", "MB", "secs", "MB/s", "vs scp"
    );
    let upload_row = |w: &mut String, label: &str, bytes: u64, secs: f64, scp_rate: Option<f64>| {
        let rate = mb(bytes) / secs;
        let _ = writeln!(
            w,
            "{:<46} {:>8.1} {:>8.2} {:>8.1} {:>7}",
            label,
            mb(bytes),
            secs,
            rate,
            scp_rate.map_or("-".into(), |s| format!("{:.2}x", rate / s)),
        );
    };
    let scp_rate = results
        .best(Variant::Scp)
        .and_then(|s| Some(mb(s.part_bytes?) / s.secs));
    for variant in [Variant::Scp, Variant::ScpSync] {
        if let Some(best) = results.best(variant) {
            let bytes = best.part_bytes.unwrap_or(0);
            upload_row(w, variant.label(), bytes, best.secs, scp_rate);
        }
    }
    if let Some(best) = results.best(Variant::ScpConnect) {
        // A few bytes: the time is SSH's connection set-up, a rate would mean nothing.
        let _ = writeln!(
            w,
            "{:<46} {:>8} {:>8.2} {:>8} {:>7}",
            Variant::ScpConnect.label(),
            "-",
            best.secs,
            "-",
            "-"
        );
    }
    let logged = results.best_logged_upload();
    if let Some((secs, bytes)) = logged {
        upload_row(
            w,
            "(d) chpart SFTP upload phase (its log)",
            bytes,
            secs,
            scp_rate,
        );
    }
    let estimate = upload_estimate(results);
    let estimate_label = "(d) chpart SFTP, (c) - (b) (cross-check)";
    match estimate {
        Some(Estimate::Secs { secs, bytes }) => {
            upload_row(w, estimate_label, bytes, secs, scp_rate)
        }
        Some(Estimate::WithinNoise) => {
            let _ = writeln!(
                w,
                "{estimate_label:<46} (c) <= (b): the upload is lost in the builds' noise"
            );
        }
        None => {}
    }

    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "notes:\n  secs = wall time of the whole command, clickhouse-local's start-up included\n  \
         own RSS = the process's own peak resident set (VmHWM sampled every {} ms; children excluded)\n  \
         tree RSS = wait4's ru_maxrss: the largest of the process and its descendants \
         (clickhouse-local's engine)\n  \
         server CPU = utime+stime of the server process while the variant ran\n  \
         (e) = chpart build --input - fed the same rows as an uncompressed Arrow IPC stream file \
         through a pipe; vs (b) = (b)'s secs over (e)'s\n  \
         work dir disk = the most one walk of chpart's work dir found (every {} ms: spooled \
         chunks, clickhouse-local's data dir with the parts, its temporary files; allocated \
         blocks); bound = {SPOOL_CHUNKS_AT_ONCE} x chunk + parts; at once = most chunk files \
         one walk saw; largest = the largest chunk file seen (a chunk ends after the batch that \
         reaches the bound, so it may pass the bound by one batch)\n  \
         scp -r, then fsync = the same copy, then coreutils `sync` of every file copied, timed \
         together: as durable as chpart's upload (which fsyncs each file it writes) when it ends\n  \
         scp -r includes its SSH set-up (the one-file row); chpart's upload phase does not (it \
         connects earlier)",
        measure::POLL.as_millis(),
        measure::DISK_POLL.as_millis(),
    );

    let _ = writeln!(w);
    let _ = writeln!(w, "targets:");
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    match (raw_secs, results.best(Variant::Local)) {
        (Some(raw), Some(local)) => {
            let ratio = raw / local.secs;
            let _ = writeln!(
                w,
                "  build >= {BUILD_TARGET:.2}x raw clickhouse-local: (a) {raw:.2} s / (b) {:.2} s \
                 = {ratio:.3}x  {}",
                local.secs,
                verdict(ratio >= BUILD_TARGET)
            );
            if let Some(durable) = results.best(Variant::RawSync) {
                let _ = writeln!(
                    w,
                    "    beside it: against (a) made as durable (its parts' files fsynced): {:.2} s \
                     / (b) {:.2} s = {:.3}x",
                    durable.secs,
                    local.secs,
                    durable.secs / local.secs
                );
            }
        }
        _ => {
            let _ = writeln!(
                w,
                "  build >= {BUILD_TARGET:.2}x raw clickhouse-local: not measured (--raw-only)"
            );
        }
    }
    let upload = match (logged, estimate) {
        (Some((secs, bytes)), _) => Some((secs, bytes, "chpart's logged upload phase")),
        (None, Some(Estimate::Secs { secs, bytes })) => {
            Some((secs, bytes, "estimated as (c) - (b)"))
        }
        _ => None,
    };
    match (upload, scp_rate, estimate) {
        (Some((secs, bytes, how)), Some(scp_rate), _) => {
            let ratio = mb(bytes) / secs / scp_rate;
            let _ = writeln!(
                w,
                "  upload >= {UPLOAD_TARGET:.2}x scp: chpart {:.1} MB/s / scp {scp_rate:.1} MB/s = \
                 {ratio:.3}x ({how})  {}",
                mb(bytes) / secs,
                verdict(ratio >= UPLOAD_TARGET)
            );
            if let Some(durable) = results
                .best(Variant::ScpSync)
                .and_then(|s| Some(mb(s.part_bytes?) / s.secs))
            {
                let _ = writeln!(
                    w,
                    "    beside it: against scp -r made as durable (every file fsynced): chpart \
                     {:.1} MB/s / {durable:.1} MB/s = {:.3}x",
                    mb(bytes) / secs,
                    mb(bytes) / secs / durable
                );
            }
        }
        (None, _, Some(Estimate::WithinNoise)) => {
            let _ = writeln!(
                w,
                "  upload >= {UPLOAD_TARGET:.2}x scp: chpart logged no upload phase and the SFTP build \
                 was not slower than the local one; no estimate (rerun with --repeat 3)"
            );
        }
        _ => {
            let _ = writeln!(
                w,
                "  upload >= {UPLOAD_TARGET:.2}x scp: not measured (--raw-only)"
            );
        }
    }
    for row in &streamed {
        let Some(bound) = row.bound_bytes() else {
            continue;
        };
        let whole = results.stream_bytes.unwrap_or(0) + row.part_bytes;
        let _ = writeln!(
            w,
            "  {} disk <= {SPOOL_CHUNKS_AT_ONCE} x spool chunk + parts: peak {:.1} MB (highest of all rounds) <= \
             {SPOOL_CHUNKS_AT_ONCE} x {:.1} + {:.1} = {:.1} MB  {} (the whole stream spooled \
             would be {:.1} + {:.1} = {:.1} MB)",
            row.variant.label(),
            mb(row.peak_bytes),
            mb(row.chunk_bytes.unwrap_or(0)),
            mb(row.part_bytes),
            mb(bound),
            verdict(row.peak_bytes <= bound),
            mb(results.stream_bytes.unwrap_or(0)),
            mb(row.part_bytes),
            mb(whole),
        );
    }
    let chpart_peak = [
        Variant::Local,
        Variant::Sftp,
        Variant::StreamDefault,
        Variant::StreamSmall,
        Variant::LocalMerge,
    ]
    .iter()
    .flat_map(|v| results.samples.get(v).into_iter().flatten())
    .filter_map(|s| s.own_peak_kib)
    .max();
    match chpart_peak {
        Some(kib) => {
            let peak_mb = kib as f64 * 1024.0 / 1e6;
            let _ = writeln!(
                w,
                "  chpart's own peak RSS <= {RSS_TARGET_MB} MB: {peak_mb:.1} MB (highest of all rounds)  {}",
                verdict(peak_mb <= RSS_TARGET_MB)
            );
        }
        None => {
            let _ = writeln!(
                w,
                "  chpart's own peak RSS <= {RSS_TARGET_MB} MB: not measured (--raw-only)"
            );
        }
    }
    out
}

/// One row of the Arrow stream table: a watched chpart build on the local transport, its best
/// round.
struct StreamRow {
    variant: Variant,
    /// (b)'s best time over this row's.
    vs_local: Option<f64>,
    chunks: Option<u64>,
    /// The spool chunk bound; None for (b), which spools nothing.
    chunk_bytes: Option<u64>,
    /// The work dir's peak, highest of all rounds (a bound holds in every round or not at all).
    peak_bytes: u64,
    /// The most chunk files one walk saw, in any round.
    at_once: usize,
    /// The largest chunk file seen, in any round (a chunk ends after the batch that reaches
    /// the bound, so it may exceed the bound by one batch).
    largest_chunk_bytes: u64,
    part_bytes: u64,
    parts: usize,
}

impl StreamRow {
    /// [`SPOOL_CHUNKS_AT_ONCE`] chunk bounds plus the parts.
    fn bound_bytes(&self) -> Option<u64> {
        Some(SPOOL_CHUNKS_AT_ONCE * self.chunk_bytes? + self.part_bytes)
    }
}

/// (b), for reference (a Parquet build's work dir holds only the parts), and the (e) builds.
fn stream_rows(options: &BuildOptions, results: &Results) -> Vec<StreamRow> {
    let local = results.best(Variant::Local);
    [
        (Variant::Local, None),
        (Variant::StreamDefault, Some(DEFAULT_SPOOL_CHUNK_BYTES)),
        (Variant::StreamSmall, Some(options.small_spool_mib << 20)),
    ]
    .into_iter()
    .filter_map(|(variant, chunk_bytes)| {
        let best = results.best(variant)?;
        let disks: Vec<&DiskPeak> = results.samples[&variant]
            .iter()
            .filter_map(|s| s.disk.as_ref())
            .collect();
        Some(StreamRow {
            variant,
            vs_local: local.map(|l| l.secs / best.secs),
            chunks: best.chunks,
            chunk_bytes,
            peak_bytes: disks.iter().map(|d| d.peak_bytes).max()?,
            at_once: disks.iter().map(|d| d.most_marked_at_once).max()?,
            largest_chunk_bytes: disks.iter().map(|d| d.largest_marked_bytes).max()?,
            part_bytes: best.part_bytes?,
            parts: best.parts?,
        })
    })
    .collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Estimate {
    Secs { secs: f64, bytes: u64 },
    WithinNoise,
}

/// chpart's upload time as (c) - (b), with the bytes of the SFTP build's parts.
fn upload_estimate(results: &Results) -> Option<Estimate> {
    let (local, sftp) = (results.best(Variant::Local)?, results.best(Variant::Sftp)?);
    let secs = sftp.secs - local.secs;
    if secs <= 0.0 {
        return Some(Estimate::WithinNoise);
    }
    Some(Estimate::Secs {
        secs,
        bytes: sftp.part_bytes?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rounds of 10M rows with the (e) builds, as the report's tests read them.
    fn options() -> BuildOptions {
        BuildOptions {
            rows: 10_000_000,
            files: 1,
            seed: 1,
            hour_start_secs: 0,
            repeat: 2,
            merge: false,
            server_insert: false,
            raw_only: false,
            stream: true,
            small_spool_mib: 256,
            keep: false,
            chpart: None,
            work_dir: None,
        }
    }

    fn sample(secs: f64, bytes: Option<u64>, upload: Option<f64>) -> Sample {
        Sample {
            secs,
            own_peak_kib: Some(40_000),
            tree_peak_kib: Some(400_000),
            server_cpu_secs: Some(0.01),
            part_bytes: bytes,
            phases: upload.map(|upload| Phases {
                build: secs - upload - 1.0,
                digest: 1.0,
                upload,
                publish: 0.0,
            }),
            parts: Some(10),
            disk: None,
            chunks: None,
        }
    }

    /// A watched build whose work dir peaked at `peak_mb`, with `chunks` spooled chunks.
    fn watched(secs: f64, peak_mb: u64, chunks: Option<u64>) -> Sample {
        Sample {
            disk: Some(DiskPeak {
                peak_bytes: peak_mb * 1_000_000,
                samples: 100,
                most_marked_at_once: if chunks.is_some() { 2 } else { 0 },
                largest_marked_bytes: if chunks.is_some() { 250_000_000 } else { 0 },
                marked_seen: Default::default(),
            }),
            chunks,
            ..sample(secs, Some(300_000_000), None)
        }
    }

    #[test]
    fn the_report_compares_best_rounds_against_the_targets() {
        let mut results = Results {
            raw_parts: 10,
            raw_part_bytes: 300_000_000,
            raw_uncompressed: 900_000_000,
            chpart_parts: Some(10),
            ..Results::default()
        };
        let bytes = Some(300_000_000);
        results.add(Variant::Raw, sample(10.0, bytes, None));
        results.add(Variant::Raw, sample(9.5, bytes, None));
        results.add(Variant::Local, sample(10.0, bytes, Some(0.1)));
        results.add(Variant::Sftp, sample(12.0, bytes, Some(1.6)));
        results.add(Variant::Sftp, sample(12.5, bytes, Some(1.5)));
        results.add(Variant::Scp, sample(1.5, bytes, None));
        let options = options();
        let text = report(&options, "generated ...", &results);
        // The best raw round (9.5 s) against the best local build (10 s); the fastest logged
        // upload (1.5 s) against scp's 1.5 s; the estimate from the best builds, 12 - 10 s.
        assert!(
            text.contains("(a) 9.50 s / (b) 10.00 s = 0.950x  PASS"),
            "{text}"
        );
        assert!(
            text.contains(
                "upload >= 1.00x scp: chpart 200.0 MB/s / scp 200.0 MB/s = 1.000x \
                 (chpart's logged upload phase)  PASS"
            ),
            "{text}"
        );
        // No (e) build ran: no stream table, no disk target.
        assert!(!text.contains("Arrow stream on stdin"), "{text}");
        assert!(
            text.contains("41.0 MB (highest of all rounds)  PASS"),
            "{text}"
        );
        assert_eq!(
            upload_estimate(&results),
            Some(Estimate::Secs {
                secs: 2.0,
                bytes: 300_000_000
            })
        );

        // Without phase timings in chpart's log, the estimate decides.
        for samples in results.samples.values_mut() {
            samples.iter_mut().for_each(|s| s.phases = None);
        }
        let text = report(&options, "generated ...", &results);
        assert!(
            text.contains("= 0.750x (estimated as (c) - (b))  MISS"),
            "{text}"
        );
        results.add(Variant::Sftp, sample(9.5, bytes, None));
        assert_eq!(upload_estimate(&results), Some(Estimate::WithinNoise));
        let text = report(&options, "generated ...", &results);
        assert!(
            text.contains("no estimate (rerun with --repeat 3)"),
            "{text}"
        );
    }

    #[test]
    fn the_report_bounds_the_stream_builds_disk_by_their_worst_round() {
        let mut results = Results {
            raw_parts: 10,
            raw_part_bytes: 300_000_000,
            chpart_parts: Some(10),
            stream_bytes: Some(1_200_000_000),
            ..Results::default()
        };
        results.add(Variant::Raw, sample(9.0, Some(300_000_000), None));
        results.add(Variant::Local, watched(10.0, 300, None));
        // Default chunks (1 GiB): far under 2 x 1073.7 + 300 MB.
        results.add(Variant::StreamDefault, watched(12.5, 1500, Some(2)));
        // 256 MiB chunks: the bound is 2 x 268.4 + 300 = 836.9 MB; the faster round stays
        // under it, the slower does not, and the worse one decides.
        results.add(Variant::StreamSmall, watched(11.0, 800, Some(5)));
        results.add(Variant::StreamSmall, watched(12.0, 900, Some(5)));
        let options = options();
        let text = report(&options, "generated ...", &results);
        assert!(
            text.contains(
                "(e) chpart build < Arrow stream, default spool disk <= 2 x spool chunk + parts: \
                 peak 1500.0 MB (highest of all rounds) <= 2 x 1073.7 + 300.0 = 2447.5 MB  PASS \
                 (the whole stream spooled would be 1200.0 + 300.0 = 1500.0 MB)"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "peak 900.0 MB (highest of all rounds) <= 2 x 268.4 + 300.0 = 836.9 MB  MISS"
            ),
            "{text}"
        );
        // The table: (b) for reference, each (e) with its speed against (b) and its chunks.
        let table = text
            .split_once("Arrow stream on stdin")
            .unwrap_or_else(|| panic!("no stream table in {text}"))
            .1;
        let small = table
            .lines()
            .find(|l| l.starts_with(Variant::StreamSmall.label()))
            .unwrap_or_else(|| panic!("no small spool row in {text}"));
        let fields: Vec<&str> = small.split_whitespace().collect();
        assert_eq!(
            fields[fields.len() - 10..],
            ["0.91x", "5", "2", "256", "250.0", "900.0", "836.9", "300.0", "10", "1200.0"],
            "{small}"
        );
    }
}
