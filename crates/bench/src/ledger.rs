//! `chpart-bench ledger`: what each command costs the ledger when it holds years of hourly
//! loads, beside the same command on a ledger of a few days' loads, in one run on one server.
//!
//! 1. **A real load as the template**: `begin`, one `build` per task, `commit` and `gc` of an
//!    hour of generated events, into a ledger of its own: its entries (the spec, the plan with
//!    the winners' manifests, an intent and an outcome per part and partition, the decision,
//!    the commit, gc's `gc_done` summary) are what every load leaves.
//! 2. **Two ledgers filled from it**: `--small` and `--large` finished loads (default 100 and
//!    100,000: four days and eleven years of hourly loads), each a copy of the template's
//!    entries under its own load id (`events-YYYY-MM-DDTHH`) and body, one hour apart, the
//!    newest a day old, written by one `INSERT ... SELECT ... FROM numbers(N)`; and one gc
//!    checkpoint per load, as an hourly gc leaves them. Both ledgers are merged
//!    (`OPTIMIZE ... FINAL`) as a long-running one is, then `chpart gc` runs once on each.
//! 3. **Each command, on each ledger, `--rounds` times**, a new load per round: `begin`,
//!    `build` (its two fence reads), `commit`, `status --load`, `gc`; and `status` of every
//!    load once (it lists every load: it is meant to grow). For each run, the server's
//!    `system.query_log` gives the statements on the ledger table between the command's start
//!    and end: how many, rows read, the server's CPU time (user + system of the query
//!    threads) and time; beside them the command's wall time. The median of the rounds is
//!    printed for both ledgers and their ratio (target: close to 1). For reference, the
//!    query that read every entry of every load (what `status --load` and `gc` sent before
//!    they read only what they need) is sent once to each ledger.
//!
//! The server runs with `query_log` on (`--config-extra`); nothing else queries it meanwhile.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use chpart_testenv::clickhouse::{ClickHouse, ServerOptions};

use crate::chpart::Chpart;
use crate::events;
use crate::gen::{generate, GenOptions};
use crate::http::sql;

/// The template load's id, replaced by each copy's in ids and bodies.
const TEMPLATE: &str = "template-load";
/// The target table.
const TABLE: &str = "db.events";

/// What `chpart-bench ledger` is asked for.
#[derive(Debug, Clone)]
pub struct LedgerOptions {
    /// Finished loads in the small ledger.
    pub small: u64,
    /// Finished loads in the large ledger.
    pub large: u64,
    /// Tasks (builds) of the template load.
    pub tasks: usize,
    /// Rounds of each command on each ledger (the median is printed).
    pub rounds: usize,
    /// The hour (UTC) of the generated events, seconds since the epoch.
    pub hour_start_secs: i64,
    /// The chpart binary.
    pub chpart: Option<PathBuf>,
    /// Where the benchmark's directory is made.
    pub work_dir: Option<PathBuf>,
}

/// What the ledger's statements of one command cost the server.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    statements: u64,
    read_rows: u64,
    cpu_ms: f64,
    server_ms: f64,
    wall_s: f64,
}

/// The commands measured, in order.
const COMMANDS: &[&str] = &[
    "begin",
    "build (fence reads)",
    "commit",
    "status --load",
    "gc",
];

/// One ledger under test: its database and the config that names it.
struct Ledger {
    loads: u64,
    database: String,
    config: PathBuf,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// A chpart config for `server` with the local transport and `ledger_db`.
fn write_config(dir: &Path, server: &ClickHouse, ledger_db: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("{ledger_db}.toml"));
    fs::write(
        &path,
        format!(
            "[clickhouse]\nurl = \"{}\"\nrequest_timeout_secs = 600\n[transport]\nkind = \"local\"\n\
             [clickhouse_local]\ncommand = \"{}\"\nwork_dir = \"{}\"\n[staging]\nroot = \"{}\"\n\
             [ledger]\ndatabase = \"{ledger_db}\"\n",
            server.url(),
            chpart_testenv::clickhouse_local().display(),
            dir.join("work").display(),
            server.data_dir.join("chpart-staging").display()
        ),
    )?;
    Ok(path)
}

/// One chpart command, checked, with its wall time; its stdout.
fn chpart(bin: &Chpart, config: &Path, args: &[&str]) -> anyhow::Result<(String, f64)> {
    let run = bin.run(config, args)?;
    Ok((run.stdout_text(), run.wall.as_secs_f64()))
}

/// The ledger statements (on `<database>.ledger`) that started between `from_us` and `to_us`.
fn ledger_cost(
    server: &ClickHouse,
    database: &str,
    from_us: i64,
    to_us: i64,
) -> anyhow::Result<Cost> {
    sql(server, "SYSTEM FLUSH LOGS")?;
    let text = sql(
        server,
        &format!(
            "SELECT count(), sum(read_rows), \
             sum(ProfileEvents['UserTimeMicroseconds'] + ProfileEvents['SystemTimeMicroseconds']) / 1000, \
             sum(query_duration_us) / 1000 \
             FROM (SELECT read_rows, ProfileEvents, \
                   dateDiff('microsecond', query_start_time_microseconds, event_time_microseconds) AS query_duration_us \
                   FROM system.query_log WHERE type = 'QueryFinish' \
                   AND query_start_time_microseconds >= fromUnixTimestamp64Micro(toInt64({from_us})) \
                   AND query_start_time_microseconds <= fromUnixTimestamp64Micro(toInt64({to_us})) \
                   AND has(tables, '{database}.ledger'))"
        ),
    )?;
    let fields: Vec<&str> = text.split_whitespace().collect();
    let number = |i: usize| -> anyhow::Result<f64> {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .with_context(|| format!("unexpected query_log answer {text:?}"))
    };
    Ok(Cost {
        statements: number(0)? as u64,
        read_rows: number(1)? as u64,
        cpu_ms: number(2)?,
        server_ms: number(3)?,
        wall_s: 0.0,
    })
}

/// Runs one chpart command on `ledger` and measures it.
fn measured(
    server: &ClickHouse,
    bin: &Chpart,
    ledger: &Ledger,
    args: &[&str],
) -> anyhow::Result<(String, Cost)> {
    let from = now_us();
    let (out, wall) = chpart(bin, &ledger.config, args)?;
    let to = now_us();
    let mut cost = ledger_cost(server, &ledger.database, from, to)?;
    cost.wall_s = wall;
    Ok((out, cost))
}

/// Fills `ledger` with `loads` copies of the template load's entries, the newest a day old, one
/// hour apart, and a gc checkpoint an hour after each; then merges it.
fn fill(server: &ClickHouse, template_db: &str, ledger: &Ledger) -> anyhow::Result<()> {
    let db = &ledger.database;
    sql(server, &format!("CREATE DATABASE IF NOT EXISTS {db}"))?;
    sql(
        server,
        &format!("CREATE TABLE {db}.ledger AS {template_db}.ledger"),
    )?;
    let n = ledger.loads;
    // Load k (0 = oldest) began (n - k) hours and a day before the template did, and is named
    // for that hour, as hourly loads are.
    let back = format!("- toIntervalHour({n} - k.number) - toIntervalDay(1)");
    let began = sql(
        server,
        &format!(
            "SELECT toUnixTimestamp64Milli(min(written_at)) FROM {template_db}.ledger WHERE load_id = '{TEMPLATE}'"
        ),
    )?;
    let began: i64 = began
        .trim()
        .parse()
        .with_context(|| format!("the template's first write time: {began:?}"))?;
    let load_id = format!(
        "concat('events-', formatDateTime(fromUnixTimestamp64Milli(toInt64({began}), 'UTC') {back}, '%Y-%m-%dT%H'))"
    );
    let started = Instant::now();
    sql(
        server,
        &format!(
            "INSERT INTO {db}.ledger (load_id, entry_id, kind, written_at, writer, body) \
             SELECT {load_id} AS id, replaceAll(t.entry_id, '{TEMPLATE}', id), t.kind, \
                    t.written_at {back}, t.writer, replaceAll(t.body, '{TEMPLATE}', id) \
             FROM {template_db}.ledger AS t CROSS JOIN numbers({n}) AS k \
             WHERE t.load_id = '{TEMPLATE}' \
             SETTINGS max_insert_threads = 2, max_threads = 2"
        ),
    )?;
    sql(
        server,
        &format!(
            "INSERT INTO {db}.ledger (load_id, entry_id, kind, written_at, writer, body) \
             SELECT '.gc', concat('checkpoint:', toString(number)), 'gc_checkpoint', \
                    now64(3) - toIntervalHour({n} - number) - toIntervalDay(1) + toIntervalMinute(30), \
                    'bench:1', '{{\"pending\":[],\"looked_ms_before_written\":40}}' \
             FROM numbers({n})"
        ),
    )?;
    sql(server, &format!("OPTIMIZE TABLE {db}.ledger FINAL"))?;
    let rows = sql(server, &format!("SELECT count() FROM {db}.ledger"))?;
    let size = sql(
        server,
        &format!(
            "SELECT formatReadableSize(sum(bytes_on_disk)) FROM system.parts \
             WHERE database = '{db}' AND table = 'ledger' AND active"
        ),
    )?;
    eprintln!(
        "ledger {db}: {n} finished loads, {} entries, {} on disk, written in {:.1}s",
        rows.trim(),
        size.trim(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Median of each figure over rounds.
fn median_cost(costs: &[Cost]) -> Cost {
    let m = |f: fn(&Cost) -> f64| median(costs.iter().map(f).collect());
    Cost {
        statements: m(|c| c.statements as f64).round() as u64,
        read_rows: m(|c| c.read_rows as f64).round() as u64,
        cpu_ms: m(|c| c.cpu_ms),
        server_ms: m(|c| c.server_ms),
        wall_s: m(|c| c.wall_s),
    }
}

fn ratio(large: f64, small: f64) -> String {
    if small > 0.0 {
        format!("{:.2}x", large / small)
    } else {
        "-".into()
    }
}

/// Runs the benchmark and prints its report.
pub fn run(options: &LedgerOptions) -> anyhow::Result<()> {
    if options.small == 0 || options.large == 0 || options.rounds == 0 || options.tasks == 0 {
        bail!("--small, --large, --rounds and --tasks must be at least 1");
    }
    let root = match &options.work_dir {
        Some(dir) => tempfile::Builder::new()
            .prefix("chpart-bench-ledger-")
            .tempdir_in(dir)?,
        None => tempfile::Builder::new()
            .prefix("chpart-bench-ledger-")
            .tempdir()?,
    };
    let bin = Chpart::find(
        options.chpart.as_deref(),
        &["begin", "build", "commit", "status", "gc"],
        "",
    )?;
    let server = ClickHouse::start_with(ServerOptions {
        config_extra: Some(
            "<query_log><database>system</database><table>query_log</table>\
             <flush_interval_milliseconds>500</flush_interval_milliseconds></query_log>"
                .into(),
        ),
        ..ServerOptions::default()
    });
    sql(&server, "CREATE DATABASE db")?;
    sql(&server, &events::ddl(TABLE))?;

    // 1. The template: a real load of `tasks` builds.
    let inputs = generate(&GenOptions {
        rows: 5_000 * options.tasks as u64,
        out: root.path().join("template.parquet"),
        files: options.tasks,
        seed: 1,
        hour_start_secs: options.hour_start_secs,
    })?
    .paths;
    let template_db = "ledger_template";
    let template = write_config(root.path(), &server, template_db)?;
    chpart(
        &bin,
        &template,
        &["begin", "--table", TABLE, "--load", TEMPLATE],
    )?;
    let winners = build_all(&bin, &template, TEMPLATE, &inputs)?;
    commit(&bin, &template, TEMPLATE, &winners, root.path())?;
    chpart(&bin, &template, &["gc"])?;
    let shape = sql(
        &server,
        &format!(
            "SELECT count(), sum(length(body)) FROM {template_db}.ledger WHERE load_id = '{TEMPLATE}'"
        ),
    )?;
    eprintln!(
        "template load: {} entries, {} bytes of bodies",
        shape.split_whitespace().next().unwrap_or("?"),
        shape.split_whitespace().nth(1).unwrap_or("?")
    );

    // 2. The two ledgers.
    let ledgers: Vec<Ledger> = [options.small, options.large]
        .into_iter()
        .map(|loads| {
            let database = format!("ledger_{loads}");
            Ok(Ledger {
                loads,
                config: write_config(root.path(), &server, &database)?,
                database,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    for ledger in &ledgers {
        fill(&server, template_db, ledger)?;
        chpart(&bin, &ledger.config, &["gc"])?;
    }

    // 3. The commands, a new load per round, the ledgers taking turns.
    let round_input = generate(&GenOptions {
        rows: 20_000,
        out: root.path().join("round.parquet"),
        files: 1,
        seed: 2,
        hour_start_secs: options.hour_start_secs,
    })?
    .paths;
    let mut costs: Vec<Vec<Vec<Cost>>> = vec![vec![Vec::new(); COMMANDS.len()]; ledgers.len()];
    let mut status_all = vec![Cost::default(); ledgers.len()];
    for round in 0..options.rounds {
        for (l, ledger) in ledgers.iter().enumerate() {
            let load = format!("bench-{round}");
            let mut step = 0;
            let mut record = |cost: Cost| {
                costs[l][step].push(cost);
                step += 1;
            };
            record(
                measured(
                    &server,
                    &bin,
                    ledger,
                    &["begin", "--table", TABLE, "--load", &load],
                )?
                .1,
            );
            let input = round_input[0].display().to_string();
            let (out, cost) = measured(
                &server,
                &bin,
                ledger,
                &[
                    "build",
                    "--load",
                    &load,
                    "--partition",
                    "0",
                    "--attempt",
                    &format!("bench.{round}"),
                    "--input",
                    &input,
                ],
            )?;
            record(cost);
            let winners = root
                .path()
                .join(format!("{}-{load}.jsonl", ledger.database));
            fs::write(
                &winners,
                out.lines().last().unwrap_or_default().to_owned() + "\n",
            )?;
            record(
                measured(
                    &server,
                    &bin,
                    ledger,
                    &[
                        "commit",
                        "--load",
                        &load,
                        "--winners",
                        &winners.display().to_string(),
                    ],
                )?
                .1,
            );
            record(
                measured(
                    &server,
                    &bin,
                    ledger,
                    &["status", "--load", &load, "--json"],
                )?
                .1,
            );
            record(measured(&server, &bin, ledger, &["gc"])?.1);
        }
    }
    for (l, ledger) in ledgers.iter().enumerate() {
        let (out, cost) = measured(&server, &bin, ledger, &["status", "--json"])?;
        let listed = serde_json::from_str::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| v.as_array().map(Vec::len))
            .context("status --json printed no array")?;
        let expected = ledger.loads as usize + options.rounds;
        if listed != expected {
            bail!(
                "status of {} listed {listed} loads, not {expected}",
                ledger.database
            );
        }
        status_all[l] = cost;
    }

    // The reference: what `status --load` and `gc` read before they read only their loads
    // (every entry of every load, in one query), sent as chpart sent it.
    let mut everything = vec![Cost::default(); ledgers.len()];
    for (l, ledger) in ledgers.iter().enumerate() {
        let from = now_us();
        let started = Instant::now();
        sql(
            &server,
            &format!(
                "SELECT load_id, entry_id, toString(kind) AS kind, \
                 toInt64(toUnixTimestamp64Milli(written_at)) AS written_at_ms, writer, body \
                 FROM {}.ledger ORDER BY load_id, written_at, entry_id FORMAT Null",
                ledger.database
            ),
        )?;
        let wall = started.elapsed().as_secs_f64();
        everything[l] = ledger_cost(&server, &ledger.database, from, now_us())?;
        everything[l].wall_s = wall;
    }

    println!(
        "\nper-command ledger cost: {} vs {} finished loads in the ledger (median of {} rounds; \
         server figures are the ledger table's statements in system.query_log)\n",
        options.small, options.large, options.rounds
    );
    println!("| command | statements | rows read | server CPU ms | server ms | command wall s |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let row = |name: &str, small: Cost, large: Cost| {
        println!(
            "| {name} | {} / {} | {} / {} ({}) | {:.1} / {:.1} ({}) | {:.1} / {:.1} ({}) | {:.2} / {:.2} ({}) |",
            small.statements,
            large.statements,
            small.read_rows,
            large.read_rows,
            ratio(large.read_rows as f64, small.read_rows as f64),
            small.cpu_ms,
            large.cpu_ms,
            ratio(large.cpu_ms, small.cpu_ms),
            small.server_ms,
            large.server_ms,
            ratio(large.server_ms, small.server_ms),
            small.wall_s,
            large.wall_s,
            ratio(large.wall_s, small.wall_s),
        );
    };
    for (c, name) in COMMANDS.iter().enumerate() {
        row(name, median_cost(&costs[0][c]), median_cost(&costs[1][c]));
    }
    row(
        "status (every load, once; grows with loads by design)",
        status_all[0],
        status_all[1],
    );
    row(
        "reference: every entry of every load, what status --load and gc read before (one query)",
        everything[0],
        everything[1],
    );
    let projection = sql(
        &server,
        &format!(
            "SELECT countIf(has(projections, '{db}.ledger.by_written_at')), count() FROM system.query_log \
             WHERE type = 'QueryFinish' AND has(tables, '{db}.ledger') AND query LIKE '%max(written_at) AS last%'",
            db = ledgers[1].database
        ),
    )?;
    println!(
        "\ngc's reads of loads written since its checkpoint that used the by_written_at projection (large ledger): {}",
        projection.trim().replace('\t', " of ")
    );
    Ok(())
}

/// One build per input (Spark partition `i`, attempt `bench.<i>`); the winners' lines.
fn build_all(
    bin: &Chpart,
    config: &Path,
    load: &str,
    inputs: &[PathBuf],
) -> anyhow::Result<String> {
    let mut lines = Vec::new();
    for (p, input) in inputs.iter().enumerate() {
        let (out, _) = chpart(
            bin,
            config,
            &[
                "build",
                "--load",
                load,
                "--partition",
                &p.to_string(),
                "--attempt",
                &format!("bench.{p}"),
                "--input",
                &input.display().to_string(),
            ],
        )?;
        lines.push(out.lines().last().unwrap_or_default().to_owned());
    }
    Ok(lines.join("\n") + "\n")
}

fn commit(
    bin: &Chpart,
    config: &Path,
    load: &str,
    winners: &str,
    dir: &Path,
) -> anyhow::Result<()> {
    let path = dir.join(format!("{load}.winners.jsonl"));
    fs::write(&path, winners)?;
    chpart(
        bin,
        config,
        &[
            "commit",
            "--load",
            load,
            "--winners",
            &path.display().to_string(),
        ],
    )?;
    Ok(())
}
