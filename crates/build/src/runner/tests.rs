use std::time::{Duration, Instant};

use super::*;

fn clickhouse_local() -> LocalCommand {
    LocalCommand::new(chpart_testenv::clickhouse_local(), Duration::from_secs(120))
}

fn args(list: &[&str]) -> Vec<OsString> {
    list.iter().map(OsString::from).collect()
}

#[test]
fn collects_large_stdout() {
    // stdout far beyond the pipe buffer: drained while the child runs.
    let out = clickhouse_local()
        .run(&args(&["--query", "SELECT number FROM numbers(300000)"]))
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().count(), 300_000);
    assert_eq!(text.lines().last(), Some("299999"));
}

#[test]
fn identify_reports_the_engine_version_and_the_zone_it_was_given() {
    let id = clickhouse_local().identify().unwrap();
    let version = id.version;
    assert!(version.starts_with("26.9."), "{version}");
    for tz in ["Asia/Tokyo", "America/New_York"] {
        let id = clickhouse_local().in_timezone(tz).identify().unwrap();
        assert_eq!(id.timezone, tz);
    }
    let banner = clickhouse_local().run(&args(&["--version"])).unwrap();
    assert!(
        String::from_utf8_lossy(&banner).contains(&version),
        "{version}"
    );
}

#[test]
fn failures_name_the_program_status_and_stderr() {
    let local = chpart_testenv::clickhouse_local();
    let cases: &[(&str, &[&str], i32, &[&str])] = &[
        (
            "syntax error",
            &["--query", "SELEC 1"],
            62,
            &["Code: 62", "SYNTAX_ERROR"],
        ),
        (
            "exception in a query",
            &["--query", "SELECT throwIf(1, 'boom from the test')"],
            395,
            &["Code: 395", "boom from the test"],
        ),
        (
            "unknown table",
            &["--query", "SELECT * FROM db_missing.t"],
            81,
            &["Code: 81"],
        ),
    ];
    for (what, list, code, needles) in cases {
        let err = clickhouse_local().run(&args(list)).unwrap_err();
        let RunError::Failed {
            program,
            status,
            stderr_tail,
        } = &err
        else {
            panic!("{what}: {err}")
        };
        assert_eq!(program, &local, "{what}");
        // clickhouse-local exits with the error code modulo 256.
        assert_eq!(status.code(), Some(code % 256), "{what}: {err}");
        let message = err.to_string();
        assert!(
            message.contains(&local.display().to_string()),
            "{what}: {message}"
        );
        assert!(
            message.contains(&format!("exit status: {}", code % 256)),
            "{what}: {message}"
        );
        for needle in *needles {
            assert!(
                stderr_tail.contains(needle) && message.contains(needle),
                "{what}: {needle:?} missing from {message}"
            );
        }
    }
}

#[test]
fn stderr_is_bounded_and_the_message_shows_its_last_lines() {
    let sh = LocalCommand::new("/bin/sh", Duration::from_secs(60));
    // ~1.3 MB of stderr (the child would block on a full pipe if nobody read it), then exit 3.
    let script = "i=0; while [ $i -lt 100000 ]; do echo \"line $i\"; i=$((i+1)); done >&2; echo last words >&2; exit 3";
    let err = sh.run(&args(&["-c", script])).unwrap_err();
    let RunError::Failed {
        status,
        stderr_tail,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(status.code(), Some(3));
    assert!(
        stderr_tail.len() <= STDERR_TAIL_BYTES && stderr_tail.len() > STDERR_TAIL_BYTES - 20,
        "{}",
        stderr_tail.len()
    );
    assert!(stderr_tail.ends_with("line 99999\nlast words\n"));
    let message = err.to_string();
    let shown: Vec<&str> = message.lines().skip(1).collect();
    assert_eq!(shown.len(), STDERR_TAIL_LINES, "{message}");
    assert_eq!(shown.last(), Some(&"  last words"));
    assert!(
        message.starts_with("/bin/sh failed with exit status: 3; last 20 lines of stderr:"),
        "{message}"
    );

    let err = sh.run(&args(&["-c", "exit 4"])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "/bin/sh failed with exit status: 4 (nothing on stderr)"
    );
}

#[test]
fn missing_or_unrunnable_program() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-clickhouse-local");
    let err = LocalCommand::new(&missing, Duration::from_secs(5))
        .run(&[])
        .unwrap_err();
    assert!(
        matches!(&err, RunError::NotFound { program } if *program == missing),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("no-such-clickhouse-local")
            && message.contains("clickhouse_local.command"),
        "{message}"
    );

    let not_executable = dir.path().join("clickhouse-local");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    let err = LocalCommand::new(&not_executable, Duration::from_secs(5))
        .identify()
        .unwrap_err();
    assert!(
        matches!(&err, RunError::Spawn { source, .. } if source.kind() == io::ErrorKind::PermissionDenied),
        "{err}"
    );
}

/// Pids of this process's children whose command name is `comm`, zombies included.
fn children_named(comm: &str) -> Vec<u32> {
    children_of(std::process::id(), comm)
}

/// State letter (`R`, `S`, `Z`, ...) and parent of process `pid`, or None if it is gone.
fn process_state(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// Pids of the children of `parent` whose command name is `comm`, zombies included.
fn children_of(parent: u32, comm: &str) -> Vec<u32> {
    let me = parent;
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "<pid> (<comm>) <state> <ppid> ..."; comm may hold spaces, so split at the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if &stat[open + 1..close] == comm && ppid == Some(me) {
            found.push(stat[..open].trim().parse().unwrap());
        }
    }
    found
}

#[test]
fn timeouts_kill_and_reap_the_child() {
    // The only test that runs `sleep`, so the child check below sees no other test's children.
    let sleep = LocalCommand::new("/bin/sleep", Duration::from_millis(400));
    let started = Instant::now();
    let err = sleep.run(&args(&["30"])).unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(err, RunError::TimedOut { timeout, .. } if timeout == Duration::from_millis(400)),
        "{err}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        err.to_string()
            .starts_with("/bin/sleep did not finish within 400ms and was killed"),
        "{err}"
    );
    assert_eq!(
        children_named("sleep"),
        Vec::<u32>::new(),
        "a sleep child survived (or was not reaped)"
    );
}

#[test]
fn a_killed_builder_does_not_leave_the_child_running() {
    // The test binary runs this very test again as the "builder" (selected by the variable);
    // it starts a long `sleep` through `run` and is then killed with SIGKILL, which gives it
    // no chance to clean up: only PR_SET_PDEATHSIG can end the sleep.
    const HELPER: &str = "CHPART_BUILD_TEST_KILLED_BUILDER";
    if std::env::var_os(HELPER).is_some() {
        let result = LocalCommand::new("/bin/sleep", Duration::from_secs(120)).run(&args(&["117"]));
        panic!("the builder should have been killed, but run returned {result:?}");
    }
    let mut builder = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "runner::tests::a_killed_builder_does_not_leave_the_child_running",
            "--test-threads=1",
        ])
        .env(HELPER, "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let sleep_pid = loop {
        if let Some(&pid) = children_of(builder.id(), "sleep").first() {
            break pid;
        }
        assert!(Instant::now() < deadline, "the builder did not start sleep");
        assert!(
            builder.try_wait().unwrap().is_none(),
            "the builder exited early"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    builder.kill().unwrap();
    builder.wait().unwrap();
    let gone = chpart_testenv::wait_until(Duration::from_secs(10), || {
        // Gone, or a zombie waiting for its new parent to reap it: either way not running.
        process_state(sleep_pid).is_none_or(|(state, _)| state == 'Z')
    });
    assert!(
        gone,
        "sleep {sleep_pid} kept running after its builder was killed: {:?}",
        process_state(sleep_pid)
    );
}
