//! The commit benchmark's report: each figure beside its target, and what it means.

use std::fmt::Write as _;
use std::time::Duration;

use super::{
    CommitRun, CpuRow, Results, Transport, IDLE_WINDOW, POLL_PAUSE, SMALL_LOADS, SMALL_ROWS,
};

/// The targets the report checks.
const ATTACH_RATE_TARGET: f64 = 200.0;
const VISIBLE_TARGET_SECS: f64 = 1.0;
const CPU_RATIO_TARGET: f64 = 100.0;
/// Issue 12: partition visibility attaches into the shadow at least this fast (1000 parts).
const PARTITION_ATTACH_RATE_TARGET: f64 = 500.0;
/// Issue 12: a commit's fixed server cost, CPU seconds.
const FIXED_COST_TARGET: f64 = 0.03;
/// Issue 12: chpart's whole server share (begin, the builds' ledger reads, the commit, the
/// ledger's merges) at most 1/this of INSERT's at the benchmark's size (0.59 GB by default).
const WHOLE_SHARE_TARGET: f64 = 50.0;

/// The label of a figure added up from several commits.
fn split_label(run: &CommitRun) -> String {
    format!(
        "  the same parts as {} loads of {} parts",
        run.loads,
        run.parts / run.loads.max(1) as usize
    )
}

/// Bytes of commit plan per part, from the largest load that committed (a plan also has a
/// fixed part, which small loads would inflate per part).
fn plan_bytes_per_part(results: &Results) -> Option<f64> {
    let attached = results
        .attach
        .iter()
        .flat_map(|a| a.one_load.as_ref().ok().into_iter().chain(a.split.as_ref()));
    attached
        .chain(&results.visible)
        // A split figure's plan is its largest load's.
        .map(|r| (r.parts / r.loads.max(1) as usize, r.plan_bytes))
        .filter(|&(parts, bytes)| parts > 0 && bytes > 0)
        .max_by_key(|&(parts, _)| parts)
        .map(|(parts, bytes)| bytes as f64 / parts as f64)
}

pub(super) fn secs_or_dash(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.3} s", d.as_secs_f64()))
}

fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or("-".into(), |v| format!("{v:.digits$}"))
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

/// The report: one table per figure, notes, and the targets.
pub(super) fn report(results: &Results) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "chpart-bench commit: ClickHouse 26.9 (chdb) on 127.0.0.1; chpart commit verifies parts \
         over {} unless a row says local; builds (not timed) use the local transport",
        results.transport.map_or("?", Transport::label)
    );
    let _ = writeln!(w, "{}", results.data_disk);
    let _ = writeln!(
        w,
        "SFTP verification over {} per commit (`[ssh] verify_connections`)",
        match results.verify_connections {
            Some(n) => format!("{n} connection(s), --verify-connections"),
            None => "chpart's default number of connections".to_owned(),
        }
    );

    if !results.attach.is_empty() {
        let _ = writeln!(w);
        if let Some(shape) = results.attach_shape {
            let _ = writeln!(
                w,
                "(1) ATTACH rate: loads of {} parts: {} builds (Spark partitions) x {} partitions \
                 of one hour each, about {} rows per part",
                shape.parts(),
                shape.builds,
                shape.per_build,
                results.rows_per_part
            );
        }
        let _ = writeln!(
            w,
            "{:<58} {:>6} {:>7} {:>7} {:>8} {:>9} {:>10} {:>7} {:>8} {:>11} {:>12}",
            "chpart commit",
            "parts",
            "rows",
            "secs",
            "parts/s",
            "logged s",
            "logged p/s",
            "ledger",
            "plan KB",
            "server CPU",
            "CPU ms/part"
        );
        let row = |w: &mut String, label: &str, run: &CommitRun| {
            let _ = writeln!(
                w,
                "{:<58} {:>6} {:>7} {:>7.2} {:>8.0} {:>9} {:>10} {:>7} {:>8.1} {:>11} {:>12}",
                label,
                run.parts,
                run.rows,
                run.secs,
                run.parts_per_sec(),
                opt(run.logged_secs, 2),
                opt(run.logged_secs.map(|s| run.parts as f64 / s), 0),
                run.ledger_entries,
                run.plan_bytes as f64 / 1e3,
                opt(run.server_cpu, 2),
                opt(run.server_cpu.map(|c| c * 1e3 / run.parts as f64), 1),
            );
        };
        let mut failures = Vec::new();
        for attach in &results.attach {
            let label = attach.variant.label();
            match &attach.one_load {
                Ok(run) => row(w, &label, run),
                Err(message) => {
                    let parts = results.attach_shape.map_or(0, |s| s.parts());
                    let _ = writeln!(w, "{label:<58} {parts:>6}   FAILED (see below)");
                    failures.push((label.clone(), parts, message));
                }
            }
            if let Some(run) = &attach.split {
                row(w, &split_label(run), run);
            }
        }
        if !failures.is_empty() {
            let _ = writeln!(w, "failed commits:");
            for (label, parts, message) in failures {
                let _ = writeln!(w, "  {label}, {parts} parts: {message}");
            }
            // The plan is one ledger entry; how big it grows per part, from the commits that
            // worked, tells whether its size is what failed.
            if let Some(per_part) = plan_bytes_per_part(results) {
                let parts = results.attach_shape.map_or(0, |s| s.parts());
                let _ = writeln!(
                    w,
                    "  the commit plan (one ledger entry) takes about {per_part:.0} bytes per \
                     part in the commits that worked: about {:.0} KB for {parts} parts",
                    per_part * parts as f64 / 1e3
                );
            }
        }
    }

    if !results.visible.is_empty() {
        let _ = writeln!(w);
        if let Some(shape) = results.load_shape {
            let _ = writeln!(
                w,
                "(2) time to visible: loads of {} parts ({} build(s)); a reader polls SELECT \
                 count() on the target (pause {} ms + the query's round trip)",
                shape.parts(),
                shape.builds,
                POLL_PAUSE.as_millis()
            );
        }
        let _ = writeln!(
            w,
            "{:<58} {:>6} {:>9} {:>9} {:>11} {:>9} {:>6} {:>8} {:>7}",
            "chpart commit, reader polling",
            "parts",
            "alone s",
            "commit s",
            "first rows",
            "all rows",
            "polls",
            "poll ms",
            "counts"
        );
        for run in &results.visible {
            let Some(seen) = &run.visible else { continue };
            let alone = results
                .visible_alone
                .iter()
                .find(|a| a.variant == run.variant)
                .map(|a| a.secs);
            let _ = writeln!(
                w,
                "{:<58} {:>6} {:>9} {:>9.3} {:>11} {:>9} {:>6} {:>8.2} {:>7}",
                run.variant.label(),
                run.parts,
                opt(alone, 3),
                run.secs,
                opt(seen.first_rows.map(|d| d.as_secs_f64()), 3),
                opt(seen.all_rows.map(|d| d.as_secs_f64()), 3),
                seen.polls,
                seen.mean_poll_ms(),
                seen.counts.len(),
            );
        }
    }

    if let Some(cpu) = &results.cpu {
        let _ = writeln!(w);
        let _ = writeln!(
            w,
            "(3) server CPU per GB: {} rows, {:.3} GB uncompressed by INSERT, {:.3} GB by chpart \
             ({} part(s)); {}",
            cpu.rows,
            cpu.insert.uncompressed as f64 / 1e9,
            cpu.commit.uncompressed as f64 / 1e9,
            cpu.chpart_parts,
            cpu.input
        );
        let _ = writeln!(
            w,
            "{:<58} {:>8} {:>13} {:>9} {:>10}",
            "load of the same rows", "secs", "server CPU s", "CPU s/GB", "vs INSERT"
        );
        let insert_per_gb = cpu.insert.per_gb();
        let row = |w: &mut String, label: &str, r: &CpuRow| {
            let per_gb = r.per_gb();
            let _ = writeln!(
                w,
                "{:<58} {:>8.2} {:>13.3} {:>9.4} {:>10}",
                label,
                r.secs,
                r.server_cpu,
                per_gb,
                if per_gb > 0.0 {
                    format!("1/{:.0}", insert_per_gb / per_gb)
                } else {
                    "0".into()
                }
            );
        };
        row(w, "(a) INSERT ... FORMAT Parquet (HTTP)", &cpu.insert);
        row(
            w,
            "(b) chpart commit (attach + MOVE PARTITION)",
            &cpu.commit,
        );
        row(
            w,
            "    chpart begin (snapshot, ledger, shadow table)",
            &cpu.begin,
        );
        row(
            w,
            "    chpart build (clickhouse-local, not the server)",
            &cpu.build,
        );
        row(
            w,
            "    after the commit: merges of its ledger entries",
            &cpu.settle,
        );
        row(
            w,
            "    of (b): the content check (one CHECK TABLE of its parts)",
            &cpu.check,
        );
        row(w, "    chpart, all of the above", &cpu.whole());
        let sshd_row = |cpu_secs: f64, of: &CpuRow| CpuRow {
            server_cpu: cpu_secs,
            ..of.clone()
        };
        if let Some(sshd) = cpu.commit_sshd_cpu {
            row(
                w,
                "    the host's sshd during (b) (file sizes over SFTP)",
                &sshd_row(sshd, &cpu.commit),
            );
        }
        if let Some((full, sshd)) = &cpu.full {
            row(
                w,
                "(b') the same rows, --verify full (read back over SFTP)",
                full,
            );
            if let Some(sshd) = sshd {
                row(
                    w,
                    "    the host's sshd during (b') (every byte sent back)",
                    &sshd_row(*sshd, full),
                );
                let _ = writeln!(
                    w,
                    "the content check costs the host {:.3} CPU s on the server (CHECK TABLE, of (b)) \
                     or {:.3} CPU s in sshd reading every byte back ((b') sshd less (b) sshd); \
                     the host's whole commit: (b) {:.3} s with the server's check, (b') {:.3} s \
                     with the read-back",
                    cpu.check.server_cpu,
                    sshd - cpu.commit_sshd_cpu.unwrap_or(0.0),
                    cpu.commit.server_cpu + cpu.commit_sshd_cpu.unwrap_or(0.0),
                    full.server_cpu + sshd
                );
            }
        }
        // commit = fixed + marginal * GB: the load size from which commit <= INSERT / target.
        let gb = cpu.commit.uncompressed as f64 / 1e9;
        let marginal = ((cpu.commit.server_cpu - cpu.fixed_commit_cpu) / gb).max(0.0);
        let allowed = insert_per_gb / CPU_RATIO_TARGET;
        let _ = writeln!(
            w,
            "(c) a commit's fixed cost (mean of {SMALL_LOADS} commits of {SMALL_ROWS}-row loads): \
             {:.3} CPU s; beyond it {:.4} CPU s/GB; so commit <= 1/{CPU_RATIO_TARGET:.0} of \
             INSERT from {} per load",
            cpu.fixed_commit_cpu,
            marginal,
            if marginal < allowed {
                format!("{:.2} GB", cpu.fixed_commit_cpu / (allowed - marginal))
            } else {
                "no load size".to_owned()
            }
        );
        let _ = writeln!(
            w,
            "server background while idle: {:.4} CPU s per s (over {} s), included in every row",
            cpu.idle_rate,
            IDLE_WINDOW.as_secs()
        );
    }

    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "notes:\n  secs = wall time of the whole chpart command (process start, config, \
         verification of every part's files, ledger writes, ATTACH, MOVE)\n  \
         logged s = the time chpart commit logs for itself (from reading the ledger to the \
         commit entry)\n  \
         ledger = entries the load has in the ledger after the commit, each one INSERT (with \
         fsync)\n  \
         first rows / all rows = seconds from the start of chpart commit to the first poll \
         answering with rows / with every row of the load (when the answer arrived)\n  \
         alone s = the commit of another load of the same size without the reader; commit s \
         = with it (the reader's queries compete for the server's CPU)\n  \
         counts = distinct row counts the reader saw (1 + the steps the load appeared in)\n  \
         server CPU = utime+stime of the server process (/proc/<pid>/stat) around the step, \
         started once the server has no merge running; merges are stopped on the target and \
         shadow tables"
    );

    let _ = writeln!(w);
    let _ = writeln!(w, "targets:");
    if results.attach.is_empty() {
        let _ = writeln!(
            w,
            "  ATTACH rate >= {ATTACH_RATE_TARGET:.0} parts/s: not measured"
        );
    }
    for attach in &results.attach {
        let label = attach.variant.label();
        match &attach.one_load {
            Ok(run) => {
                let rate = run.parts_per_sec();
                let target = match attach.variant.visibility {
                    "partition" => PARTITION_ATTACH_RATE_TARGET,
                    _ => ATTACH_RATE_TARGET,
                };
                let _ = writeln!(
                    w,
                    "  ATTACH rate >= {target:.0} parts/s (clickhouse-backup: 5-55), \
                     {label}: {rate:.0} parts/s ({} parts in one commit, whole command)  {}",
                    run.parts,
                    verdict(rate >= target)
                );
            }
            Err(_) => {
                let _ = writeln!(
                    w,
                    "  ATTACH rate >= {ATTACH_RATE_TARGET:.0} parts/s (clickhouse-backup: 5-55), \
                     {label}: the commit of {} parts failed  MISS",
                    results.attach_shape.map_or(0, |s| s.parts())
                );
            }
        }
        if let Some(run) = &attach.split {
            let rate = run.parts_per_sec();
            let _ = writeln!(
                w,
                "  ATTACH rate >= {ATTACH_RATE_TARGET:.0} parts/s, {label}, {}: {rate:.0} \
                 parts/s  {}",
                split_label(run).trim(),
                verdict(rate >= ATTACH_RATE_TARGET)
            );
        }
    }
    for run in &results.visible {
        let Some(seen) = &run.visible else { continue };
        match seen.all_rows {
            Some(at) => {
                let secs = at.as_secs_f64();
                let _ = writeln!(
                    w,
                    "  time to visible <= {VISIBLE_TARGET_SECS:.0} s, {} parts, {}: {secs:.3} s  {}",
                    run.parts,
                    run.variant.label(),
                    verdict(secs <= VISIBLE_TARGET_SECS)
                );
            }
            None => {
                let _ = writeln!(
                    w,
                    "  time to visible <= {VISIBLE_TARGET_SECS:.0} s, {} parts, {}: the reader \
                     never saw every row  MISS",
                    run.parts,
                    run.variant.label(),
                );
            }
        }
    }
    match &results.cpu {
        Some(cpu) => {
            let ratio = cpu.insert.per_gb() / cpu.commit.per_gb();
            let _ = writeln!(
                w,
                "  server CPU per GB, chpart commit <= 1/{CPU_RATIO_TARGET:.0} of INSERT: \
                 {:.4} vs {:.3} CPU s/GB = 1/{ratio:.0}  {}",
                cpu.commit.per_gb(),
                cpu.insert.per_gb(),
                verdict(ratio >= CPU_RATIO_TARGET)
            );
            let _ = writeln!(
                w,
                "  a commit's fixed server cost <= {FIXED_COST_TARGET} CPU s (row (c)): {:.3} CPU s  {}",
                cpu.fixed_commit_cpu,
                verdict(cpu.fixed_commit_cpu <= FIXED_COST_TARGET)
            );
            let whole = cpu.whole().per_gb();
            let share = cpu.insert.per_gb() / whole;
            let _ = writeln!(
                w,
                "  chpart's whole server share <= 1/{WHOLE_SHARE_TARGET:.0} of INSERT at {:.2} GB \
                 (begin, builds, commit, ledger merges): {whole:.4} vs {:.3} CPU s/GB = 1/{share:.0}  {}",
                cpu.insert.uncompressed as f64 / 1e9,
                cpu.insert.per_gb(),
                verdict(share >= WHOLE_SHARE_TARGET)
            );
        }
        None => {
            let _ = writeln!(
                w,
                "  server CPU per GB <= 1/{CPU_RATIO_TARGET:.0} of INSERT: not measured (--no-cpu)"
            );
        }
    }
    out
}
