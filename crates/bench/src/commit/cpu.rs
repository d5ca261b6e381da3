//! Server CPU per GB (figure 3): the same generated rows loaded by HTTP INSERT and by chpart,
//! with the server's CPU around each step.

use std::fs;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};

use super::{
    number, Bench, CpuResults, CpuRow, Prepared, Variant, IDLE_WINDOW, SMALL_LOADS, SMALL_ROWS,
};
use crate::gen::{generate, GenOptions, GenReport};
use crate::http::sql;
use crate::local::DATABASE;
use crate::{events, http};

impl Bench<'_> {
    /// The same rows by HTTP INSERT and by chpart, with the server's CPU around each step.
    pub(super) fn cpu_per_gb(&self) -> anyhow::Result<CpuResults> {
        let gen: GenReport = generate(&GenOptions {
            rows: self.options.rows,
            out: self.root.join("inputs").join("events.parquet"),
            files: 1,
            seed: self.options.seed,
            hour_start_secs: self.options.hour_start_secs,
        })?;
        let input = gen.paths[0].clone();
        let server = self.server;
        let rows = self.options.rows;
        let cpu = || {
            server
                .cpu_seconds()
                .context("the server's CPU time (/proc/<pid>/stat) is not readable")
        };
        // A step from `before` (CPU seconds, and when) to now.
        let step = |before: (f64, Instant), uncompressed: u64| -> anyhow::Result<CpuRow> {
            Ok(CpuRow {
                secs: before.1.elapsed().as_secs_f64(),
                server_cpu: cpu()? - before.0,
                uncompressed,
            })
        };
        let mark = || -> anyhow::Result<(f64, Instant)> { Ok((cpu()?, Instant::now())) };

        // The server's own background, for reading the small figures below.
        self.wait_quiet()?;
        let before = mark()?;
        std::thread::sleep(IDLE_WINDOW);
        let idle = step(before, 0)?;
        let idle_rate = idle.server_cpu / idle.secs;

        // (a) INSERT ... FORMAT Parquet over HTTP.
        let insert_table = format!("{DATABASE}.cpu_insert");
        sql(server, &events::ddl(&insert_table))?;
        self.stop_merges(&insert_table)?;
        self.wait_quiet()?;
        let before = mark()?;
        http::post_file(
            server.http_port,
            &format!("INSERT INTO {insert_table} FORMAT Parquet"),
            &input,
        )?;
        let insert = step(before, 0)?;
        let insert = CpuRow {
            uncompressed: self.uncompressed(&insert_table)?,
            ..insert
        };
        let inserted = number(server, &format!("SELECT count() FROM {insert_table}"))?;
        if inserted != rows {
            bail!("the HTTP INSERT left {inserted} rows of {rows} in {insert_table}");
        }

        // (b) chpart: begin, build (clickhouse-local, outside the server), commit.
        let variant = Variant {
            visibility: "partition",
            transport: self.options.transport,
        };
        let table = format!("{DATABASE}.cpu_chpart");
        sql(server, &events::ddl(&table))?;
        self.stop_merges(&table)?;
        self.wait_quiet()?;
        let before = mark()?;
        let (load, shadow, _) = self.begin(&table, variant)?;
        let begin = step(before, 0)?;
        let before = mark()?;
        let prepared = self.build_one(&table, variant, load, shadow, &input, rows)?;
        let build = step(before, 0)?;
        // Waits for quiet itself, then measures the command alone.
        let committed = self.commit(&prepared, false)?;
        let commit_sshd_cpu = committed.sshd_cpu;
        let uncompressed = self.uncompressed(&table)?;
        let commit = CpuRow {
            secs: committed.secs,
            server_cpu: committed
                .server_cpu
                .context("the server's CPU time is not readable")?,
            uncompressed,
        };
        // What the commit's ledger writes cost afterwards: merging them (measured from the
        // check above, which is a few cheap queries, until the merges are done).
        let before = mark()?;
        self.wait_quiet()?;
        let settle = step(before, uncompressed)?;
        // The content check inside the commit, measured on its own: the same parts, now in
        // the target, checked once more by the server.
        let before = mark()?;
        sql(
            server,
            &format!("CHECK TABLE {table} SETTINGS check_query_single_value_result = 0"),
        )?;
        let check = step(before, uncompressed)?;

        // (b') The same rows again, checked by reading every byte back over SFTP (`--verify
        // full`) instead of by the server: what that costs the server and the host's sshd.
        let full = if self.options.transport == super::Transport::Sftp {
            let table = format!("{DATABASE}.cpu_chpart_full");
            sql(server, &events::ddl(&table))?;
            self.stop_merges(&table)?;
            let (load, shadow, _) = self.begin(&table, variant)?;
            let prepared = Prepared {
                verify: Some("full"),
                ..self.build_one(&table, variant, load, shadow, &input, rows)?
            };
            let committed = self.commit(&prepared, false)?;
            let row = CpuRow {
                secs: committed.secs,
                server_cpu: committed
                    .server_cpu
                    .context("the server's CPU time is not readable")?,
                uncompressed: self.uncompressed(&table)?,
            };
            Some((row, committed.sshd_cpu))
        } else {
            None
        };

        // (c) What a commit costs whatever its size: commits of tiny loads, same steps.
        let small = generate(&GenOptions {
            rows: SMALL_ROWS,
            out: self.root.join("inputs").join("small.parquet"),
            files: 1,
            seed: self.options.seed,
            hour_start_secs: self.options.hour_start_secs,
        })?
        .paths[0]
            .clone();
        let mut fixed = 0.0;
        for k in 0..SMALL_LOADS {
            let name = format!("cpu_small_{k}");
            let table = format!("{DATABASE}.{name}");
            sql(server, &events::ddl(&table))?;
            self.stop_merges(&table)?;
            let (load, shadow, _) = self.begin(&table, variant)?;
            let small_load = self.build_one(&table, variant, load, shadow, &small, SMALL_ROWS)?;
            let run = self.commit(&small_load, false)?;
            fixed += run
                .server_cpu
                .context("the server's CPU time is not readable")?;
        }
        Ok(CpuResults {
            rows,
            input: gen.summary(),
            insert,
            begin: CpuRow {
                uncompressed,
                ..begin
            },
            build: CpuRow {
                uncompressed,
                ..build
            },
            commit,
            settle,
            check,
            commit_sshd_cpu,
            full,
            chpart_parts: prepared.parts,
            idle_rate,
            fixed_commit_cpu: fixed / f64::from(SMALL_LOADS),
        })
    }

    /// Builds `input` (`rows` rows) as the one attempt of the begun `load` and writes its
    /// winners file: the load, ready to commit.
    fn build_one(
        &self,
        table: &str,
        variant: Variant,
        load: String,
        shadow: Option<String>,
        input: &Path,
        rows: u64,
    ) -> anyhow::Result<Prepared> {
        let (_, manifest) = self.chpart.build(
            &self.configs.local,
            &load,
            0,
            "bench.0",
            &[input.to_path_buf()],
            false,
        )?;
        if manifest.rows != rows {
            bail!(
                "chpart build of {load} made {} rows of {rows}",
                manifest.rows
            );
        }
        let (_, name) = table.split_once('.').expect("db.table");
        let winners = self.root.join(format!("winners-{name}.jsonl"));
        fs::write(&winners, format!("{}\n", manifest.line))?;
        Ok(Prepared {
            variant,
            table: table.to_owned(),
            load,
            shadow,
            winners,
            builds: 1,
            parts: manifest.parts,
            rows,
            verify: None,
        })
    }

    /// Uncompressed column bytes of the table's active parts.
    fn uncompressed(&self, table: &str) -> anyhow::Result<u64> {
        let (db, name) = table.split_once('.').expect("db.table");
        number(
            self.server,
            &format!(
                "SELECT sum(data_uncompressed_bytes) FROM system.parts WHERE database = '{db}' \
                 AND table = '{name}' AND active"
            ),
        )
    }
}
