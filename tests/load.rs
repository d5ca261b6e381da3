//! `chpart load`, the one-command sidecar, as a batch job runs it: files and directories in,
//! exactly once against an INSERT twin, a re-run that finishes an interrupted load (killed in a
//! build, before, inside and after the commit) or changes nothing, other inputs refused, and
//! nothing left behind.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use chpart_testenv::clickhouse::{shared, ClickHouse};

use crate::build::{arrow_stream_of, rows_select, write_rows, Setup, COLUMNS, ENGINE};
use crate::cli::{chpart, text};
use crate::crash::kill_after;
use crate::disks::files_under;

fn fingerprint(ch: &ClickHouse, table: &str) -> String {
    ch.q(&format!(
        "SELECT count(), sum(cityHash64(ts, id, name, score)) FROM {table}"
    ))
}

/// `chpart load` of `table` with these inputs (and `extra` arguments), to its end.
fn load(s: &Setup, table: &str, id: &str, inputs: &[&Path], extra: &[&str]) -> Output {
    load_cmd(s, table, id, inputs, extra).output().unwrap()
}

fn load_cmd(
    s: &Setup,
    table: &str,
    id: &str,
    inputs: &[&Path],
    extra: &[&str],
) -> std::process::Command {
    let mut cmd = chpart();
    cmd.args(["load", "--config"])
        .arg(&s.config)
        .args(["--table", table, "--load", id, "--state-dir"])
        .arg(s.dir.path().join("state"));
    for input in inputs {
        cmd.arg("--input").arg(input);
    }
    cmd.args(extra);
    cmd
}

fn summary(out: &Output) -> serde_json::Value {
    assert_eq!(out.status.code(), Some(0), "{}", text(out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().expect("a summary line"))
        .unwrap_or_else(|e| panic!("--json prints one summary line ({e}): {}", text(out)))
}

/// What a finished load may not leave: parts in `detached/` of the database's tables, shadow
/// tables, staged files of the load, its state directory.
fn leftovers(s: &Setup, load: &str) -> Vec<String> {
    let ch = s.db.server;
    let mut left: Vec<String> = ch
        .q(&format!(
            "SELECT concat(table, ': detached ', name) FROM system.detached_parts WHERE database = '{}' ORDER BY 1",
            s.db.name
        ))
        .lines()
        .map(str::to_owned)
        .collect();
    left.extend(
        ch.q(&format!(
            "SELECT concat('shadow table ', name) FROM system.tables WHERE database = '{}' AND name LIKE '%__chpart_%'",
            s.db.name
        ))
        .lines()
        .map(str::to_owned),
    );
    let staging = ch.data_dir.join("chpart-staging").join(load);
    left.extend(
        files_under(&staging)
            .into_iter()
            .map(|path| format!("staged {path}")),
    );
    let state = s.dir.path().join("state").join(load);
    if state.exists() {
        left.push(format!("state directory {}", state.display()));
    }
    left
}

/// The rows of the first `n` files [`inputs`] writes, for an INSERT twin.
fn twin_rows(n: u64) -> String {
    (0..n)
        .map(|i| rows_select(i * 1000, 1000))
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

/// Input files of 1000 rows each, `n` of them, under `dir`.
fn inputs(dir: &Path, n: u64) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    (0..n)
        .map(|i| {
            write_rows(
                dir,
                &format!("part-{i}.parquet"),
                &rows_select(i * 1000, 1000),
                "Parquet",
            )
        })
        .collect()
}

#[test]
fn load_reads_files_and_directories_once_and_a_rerun_changes_nothing() {
    let ch = shared();
    let s = Setup::with_tables(ch, "load_once", COLUMNS, ENGINE, &["events", "twin"]);
    let twin = format!("{}.twin", s.db.name);
    ch.q(&format!("INSERT INTO {twin} {}", twin_rows(3)));
    let dir = s.dir.path().join("in");
    let files = inputs(&dir.join("a"), 2);
    // What Spark and Hive leave beside the data is not read (a .crc or _temporary file that
    // were read would fail the build: they are not Parquet).
    std::fs::write(dir.join("a/_SUCCESS"), b"").unwrap();
    std::fs::write(dir.join("a/.part-0.parquet.crc"), b"crc").unwrap();
    std::fs::create_dir_all(dir.join("a/_temporary")).unwrap();
    std::fs::write(dir.join("a/_temporary/part-9.parquet"), b"not parquet").unwrap();
    let single = write_rows(&dir, "b.parquet", &rows_select(2000, 1000), "Parquet");
    // The same file twice (in its directory and by name) is read once.
    let given = [dir.join("a"), single.clone(), files[0].clone()];
    let given: Vec<&Path> = given.iter().map(PathBuf::as_path).collect();

    let out = load(&s, &s.table, "once-1", &given, &["--jobs", "2", "--json"]);
    let first = summary(&out);
    assert_eq!(first["rows"], 3000, "{first}");
    assert_eq!(first["inputs"]["files"], 3, "{first}");
    assert_eq!(first["inputs"]["builds"], 2, "--jobs 2: {first}");
    assert_eq!(first["built_now"], 2, "{first}");
    assert_eq!(first["already_committed"], false, "{first}");
    assert_eq!(fingerprint(ch, &s.table), fingerprint(ch, &twin));
    assert_eq!(leftovers(&s, "once-1"), Vec::<String>::new());

    // The same command again: nothing is built or attached.
    let again = summary(&load(&s, &s.table, "once-1", &given, &["--json"]));
    assert_eq!(again["already_committed"], true, "{again}");
    assert_eq!(again["built_now"], 0, "{again}");
    assert_eq!(again["rows"], 3000, "{again}");
    assert_eq!(fingerprint(ch, &s.table), fingerprint(ch, &twin));

    // The same files elsewhere are the same inputs (a retry on another machine).
    let copy = s.dir.path().join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    for (i, f) in [&files[0], &files[1], &single].iter().enumerate() {
        std::fs::copy(f, copy.join(format!("{i}.parquet"))).unwrap();
    }
    let moved = summary(&load(&s, &s.table, "once-1", &[&copy], &["--json"]));
    assert_eq!(moved["already_committed"], true, "{moved}");

    // Other inputs under the load's id are refused, naming both, and change nothing.
    let out = load(&s, &s.table, "once-1", &[&dir.join("a")], &[]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("was begun for 3 file(s)") && text(&out).contains("2 file(s)"),
        "{}",
        text(&out)
    );
    assert_eq!(fingerprint(ch, &s.table), fingerprint(ch, &twin));

    // Inputs that name nothing are usage errors naming the path.
    let missing = dir.join("missing.parquet");
    let out = load(&s, &s.table, "once-2", &[&missing], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("missing.parquet"), "{}", text(&out));
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = load(&s, &s.table, "once-2", &[&empty], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no *.parquet file"), "{}", text(&out));
}

/// A re-run that reads the load as open and finds it committed when it begins (committed in
/// between by another run, or by the last request of a killed run that the server carried out
/// after the kill) reports it committed: exit 0, nothing built, the rows once.
#[test]
fn a_load_committed_between_a_reruns_reads_is_reported_committed() {
    let ch = shared();
    let s = Setup::with_tables(ch, "load_race", COLUMNS, ENGINE, &["events"]);
    let files = inputs(&s.dir.path().join("in"), 2);
    let given: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    // The first run builds and stops before its commit (the debug build's crash hook): open.
    let first = load_cmd(&s, &s.table, "race-1", &given, &["--json"])
        .env("CHPART_TEST_CRASH_AT", "load-before-commit")
        .output()
        .unwrap();
    assert_ne!(first.status.code(), Some(0), "{}", text(&first));
    // A second run reads the ledger (open) and waits before it begins.
    let pause = s.dir.path().join("pause");
    std::fs::create_dir_all(&pause).unwrap();
    let second = load_cmd(&s, &s.table, "race-1", &given, &["--json"])
        .env("CHPART_TEST_PAUSE_AT", "load-before-begin")
        .env("CHPART_TEST_PAUSE_DIR", &pause)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let paused =
        chpart_testenv::wait_until(Duration::from_secs(60), || pause.join("paused").exists());
    assert!(paused, "the second run did not reach its begin within 60 s");
    // A third run commits the load meanwhile.
    let third = summary(&load(&s, &s.table, "race-1", &given, &["--json"]));
    assert_eq!(third["rows"], 2000, "{third}");
    std::fs::write(pause.join("resume"), b"").unwrap();
    let second = summary(&second.wait_with_output().unwrap());
    assert_eq!(second["already_committed"], true, "{second}");
    assert_eq!(second["built_now"], 0, "{second}");
    assert_eq!(second["rows"], 2000, "{second}");
    assert_eq!(ch.q(&format!("SELECT count() FROM {}", s.table)), "2000\n");
    assert!(
        leftovers(&s, "race-1").is_empty(),
        "{:?}",
        leftovers(&s, "race-1")
    );
}

#[test]
fn a_bad_input_file_is_named_nothing_is_attached_and_the_load_is_aborted() {
    let ch = shared();
    let s = Setup::new(ch, "load_bad");
    let dir = s.dir.path().join("in");
    let mut files = inputs(&dir, 2);
    files.push(write_rows(
        &dir,
        "wrong.parquet",
        "SELECT number AS id, 'x' AS other FROM numbers(10)",
        "Parquet",
    ));
    let given: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let out = load(&s, &s.table, "bad-1", &given, &["--jobs", "3"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("wrong.parquet"), "{}", text(&out));
    assert!(text(&out).contains("aborted"), "{}", text(&out));
    assert_eq!(
        ch.q(&format!("SELECT count() FROM {}", s.table)).trim(),
        "0"
    );
    assert_eq!(leftovers(&s, "bad-1"), Vec::<String>::new());
    // The aborted load is not begun again.
    let out = load(&s, &s.table, "bad-1", &given[..2], &[]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
}

#[test]
fn a_load_killed_anywhere_finishes_exactly_once_when_the_command_is_run_again() {
    let ch = shared();
    let s = Setup::with_tables(ch, "load_kill", COLUMNS, ENGINE, &["events", "twin"]);
    let twin = format!("{}.twin", s.db.name);
    ch.q(&format!("INSERT INTO {twin} {}", twin_rows(4)));
    let files = inputs(&s.dir.path().join("in"), 4);
    let given: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();

    // Where the first run stops: at a named point of the load or the commit (the debug
    // build's crash hook aborts the process there), or SIGKILLed after a delay.
    enum Stop {
        At(&'static str),
        KillAfterMs(u64),
    }
    // SIGKILLs at fractions of how long an uninterrupted load of the same inputs takes here.
    let timed = format!("{}.timed", s.db.name);
    ch.q(&format!("CREATE TABLE {timed} ({COLUMNS}) {ENGINE}"));
    let started = Instant::now();
    summary(&load(
        &s,
        &timed,
        "timed",
        &given,
        &["--jobs", "4", "--json"],
    ));
    let whole = started.elapsed().as_millis() as u64;
    let mut rows: Vec<(String, Stop)> = [15, 35, 55, 75, 90]
        .iter()
        .map(|pct| {
            (
                format!("SIGKILL at {pct}% of {whole} ms"),
                Stop::KillAfterMs(whole * pct / 100),
            )
        })
        .collect();
    rows.extend(
        vec![
            (
                "after the first build kept its line",
                Stop::At("load-after-build"),
            ),
            ("after the third build", Stop::At("load-after-build:3")),
            (
                "every build done, commit not begun",
                Stop::At("load-before-commit"),
            ),
            (
                "commit decided, nothing attached",
                Stop::At("before-attach"),
            ),
            ("after the second ATTACH", Stop::At("after-attach:2")),
            (
                "before a partition is published",
                Stop::At("before-publish"),
            ),
            ("committed, gc not run", Stop::At("load-before-gc")),
        ]
        .into_iter()
        .map(|(what, stop)| (what.to_owned(), stop)),
    );
    let mut killed = 0;
    for (i, (what, stop)) in rows.iter().enumerate() {
        let table = format!("{}.k{i}", s.db.name);
        ch.q(&format!("CREATE TABLE {table} ({COLUMNS}) {ENGINE}"));
        let id = format!("kill-{i}");
        let mut cmd = load_cmd(&s, &table, &id, &given, &["--jobs", "4"]);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let stopped = match stop {
            Stop::At(point) => {
                let out = cmd.env("CHPART_TEST_CRASH_AT", point).output().unwrap();
                let (name, _) = point.split_once(':').unwrap_or((point, ""));
                assert!(
                    text(&out).contains(&format!("CHPART_TEST_CRASH_AT={name}")),
                    "{what}: the run was to stop at {point}: {}",
                    text(&out)
                );
                true
            }
            Stop::KillAfterMs(ms) => {
                let mut child = cmd.spawn().unwrap();
                let stopped = kill_after(&mut child, Duration::from_millis(*ms));
                killed += u32::from(stopped);
                stopped
            }
        };
        let out = load(&s, &table, &id, &given, &["--jobs", "4", "--json"]);
        let done = summary(&out);
        assert_eq!(
            fingerprint(ch, &table),
            fingerprint(ch, &twin),
            "{what} (stopped: {stopped}): not exactly the source rows; {done}"
        );
        assert_eq!(leftovers(&s, &id), Vec::<String>::new(), "{what}");
        eprintln!("{what}: stopped {stopped}, re-run {done}");
    }
    assert!(
        killed > 0,
        "no SIGKILL landed before the load ended: the kill rows tested nothing"
    );
}

#[test]
fn an_arrow_stream_on_stdin_is_one_build_and_a_rerun_does_not_read_it() {
    let ch = shared();
    let s = Setup::with_tables(ch, "load_stdin", COLUMNS, ENGINE, &["events", "twin"]);
    let twin = format!("{}.twin", s.db.name);
    ch.q(&format!("INSERT INTO {twin} {}", rows_select(0, 2500)));
    let stream = arrow_stream_of(&s, 2500);
    let run = |stdin: Stdio| {
        load_cmd(&s, &s.table, "stdin-1", &[Path::new("-")], &["--json"])
            .stdin(stdin)
            .output()
            .unwrap()
    };
    let first = summary(&run(Stdio::from(std::fs::File::open(&stream).unwrap())));
    assert_eq!(first["rows"], 2500, "{first}");
    assert_eq!(first["inputs"]["digest"], "stdin", "{first}");
    assert_eq!(fingerprint(ch, &s.table), fingerprint(ch, &twin));
    // Committed: the re-run reads nothing (stdin is empty now) and changes nothing.
    let again = summary(&run(Stdio::null()));
    assert_eq!(again["already_committed"], true, "{again}");
    assert_eq!(fingerprint(ch, &s.table), fingerprint(ch, &twin));
    assert_eq!(leftovers(&s, "stdin-1"), Vec::<String>::new());
}
