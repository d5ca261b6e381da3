//! Network faults between chpart and the real components, injected by a TCP fault proxy
//! (`chpart_testenv::proxy`) in front of ClickHouse's HTTP port and sshd: the load rides them
//! out on its own when they end within `[retry] deadline_secs`, and fails cleanly (exit 3,
//! nothing visible) when they outlast it; either way the rows end up exactly once and gc leaves
//! nothing.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use chpart_testenv::clickhouse::{shared, ClickHouse};
use chpart_testenv::loss::PacketLoss;
use chpart_testenv::proxy::{FaultProxy, Mode};
use chpart_testenv::sshd::Sshd;

use crate::build::{rows_select, write_rows, Setup};
use crate::cli::text;

/// `setup`'s config with the server reached through `http` and the filesystem over SFTP
/// through `ssh` (a known_hosts that lists sshd's key for the proxy's port), retried for
/// `deadline_secs`.
fn through_proxies(
    setup: &Setup,
    sshd: &Sshd,
    http: &FaultProxy,
    ssh: &FaultProxy,
    deadline_secs: u64,
) {
    over_sftp(setup, sshd, http.port, ssh.port, deadline_secs);
}

/// `setup`'s config with the server reached on 127.0.0.1:`http_port` and the filesystem over
/// SFTP on 127.0.0.1:`ssh_port` (sshd's own port or a proxy's in front of it: known_hosts
/// lists sshd's key for that port), retried for `deadline_secs`.
fn over_sftp(setup: &Setup, sshd: &Sshd, http_port: u16, ssh_port: u16, deadline_secs: u64) {
    let known = std::fs::read_to_string(&sshd.known_hosts)
        .unwrap()
        .replace(&format!("]:{} ", sshd.port), &format!("]:{ssh_port} "));
    let known_hosts = setup.dir.path().join("known_hosts.proxy");
    std::fs::write(&known_hosts, known).unwrap();
    let mut config = std::fs::read_to_string(&setup.config).unwrap();
    let url = config
        .lines()
        .find_map(|l| l.strip_prefix("url = "))
        .unwrap()
        .trim_matches('"')
        .to_owned();
    config = config
        .replace(&url, &format!("http://127.0.0.1:{http_port}"))
        .replace("kind = \"local\"", "kind = \"sftp\"")
        .replace(
            "deadline_secs = 3",
            &format!("deadline_secs = {deadline_secs}"),
        );
    config.push_str(&format!(
        "[ssh]\nhost = \"127.0.0.1\"\nport = {ssh_port}\nuser = \"root\"\nidentity_file = \"{}\"\nknown_hosts = \"{}\"\nconnect_timeout_secs = 2\n",
        sshd.client_key.display(),
        known_hosts.display()
    ));
    std::fs::write(&setup.config, config).unwrap();
}

fn http_addr(ch: &ClickHouse) -> SocketAddr {
    let url = ch.url();
    url.trim_start_matches("http://").parse().unwrap()
}

fn count(ch: &ClickHouse, table: &str) -> String {
    ch.q(&format!("SELECT count(), uniqExact(id) FROM {table}"))
}

fn winners(dir: &Path, lines: &[&str]) -> std::path::PathBuf {
    let path = dir.join("winners.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn manifest_line(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "{}", text(out));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A build whose SFTP connection is cut in the middle of its upload, then a commit whose
/// server connections are cut and refused for two seconds: both finish in one run, rows once.
/// `rows` generated rows as a Parquet file of the test's dir.
fn input_of(s: &Setup, rows: u64) -> std::path::PathBuf {
    write_rows(
        s.dir.path(),
        "rows.parquet",
        &rows_select(0, rows),
        "Parquet",
    )
}

/// `build` of `input` as `attempt` (Spark partition 0) of `load`.
fn build(s: &Setup, load: &str, attempt: &str, input: &Path) -> Output {
    s.build_cmd(load, attempt, 0)
        .arg("--input")
        .arg(input)
        .output()
        .unwrap()
}

/// `commit` of `load` with the winners file `file`.
fn commit(s: &Setup, load: &str, file: &Path) -> Output {
    s.run(&[
        "commit",
        "--load",
        load,
        "--winners",
        file.to_str().unwrap(),
    ])
}

/// `chpart gc` exits 0 and leaves nothing in the table's `detached/`.
fn assert_gc_leaves_nothing(s: &Setup) {
    let gc = s.run(&["gc"]);
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
    assert!(s.detached("events").is_empty());
}

#[test]
fn a_load_rides_out_cut_connections_and_a_server_down_for_two_seconds() {
    let ch = shared();
    let sshd = Sshd::start(&[]);
    let http = FaultProxy::start(http_addr(ch));
    let ssh = FaultProxy::start(([127, 0, 0, 1], sshd.port).into());
    let s = Setup::new(ch, "faults_ride");
    through_proxies(&s, &sshd, &http, &ssh, 30);
    let begun = s.begin("fr-1", &[]);
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));

    // 600,000 rows: several MB of parts; the upload is cut after 1 MiB.
    let input = input_of(&s, 600_000);
    ssh.cut_after_bytes(1024 * 1024);
    let built = build(&s, "fr-1", "app-1.1", &input);
    let line = manifest_line(&built);
    assert_eq!(ssh.cuts(), 1, "the upload was cut");
    assert!(
        text(&built).contains("retry"),
        "the retry is logged: {}",
        text(&built)
    );

    // The commit: every connection to the server cut once 4 KiB of requests went by, then
    // refused for two seconds.
    let file = winners(s.dir.path(), &[&line]);
    http.cut_after_bytes(4096);
    let commit = std::thread::scope(|scope| {
        let outage = scope.spawn(|| {
            while http.cut_pending() {
                std::thread::sleep(Duration::from_millis(2));
            }
            http.set_mode(Mode::Refuse);
            std::thread::sleep(Duration::from_secs(2));
            http.set_mode(Mode::Pass);
        });
        let out = commit(&s, "fr-1", &file);
        outage.join().unwrap();
        out
    });
    assert_eq!(commit.status.code(), Some(0), "{}", text(&commit));
    assert_eq!(http.cuts(), 1, "the commit's connections were cut");
    assert_eq!(count(ch, &s.table), "600000\t600000\n");

    assert_gc_leaves_nothing(&s);
}

/// A server down for longer than the deadline: the commit stops with exit 3 and nothing
/// visible; once the server is back, the same command finishes exactly once.
#[test]
fn a_server_down_past_the_deadline_fails_cleanly_and_the_rerun_loads_once() {
    let ch = shared();
    let sshd = Sshd::start(&[]);
    let http = FaultProxy::start(http_addr(ch));
    let ssh = FaultProxy::start(([127, 0, 0, 1], sshd.port).into());
    let s = Setup::new(ch, "faults_down");
    through_proxies(&s, &sshd, &http, &ssh, 2);
    let begun = s.begin("fd-1", &[]);
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));
    let input = input_of(&s, 50_000);
    let built = build(&s, "fd-1", "app-2.1", &input);
    let file = winners(s.dir.path(), &[&manifest_line(&built)]);

    http.set_mode(Mode::Refuse);
    let started = std::time::Instant::now();
    let down = commit(&s, "fd-1", &file);
    assert_eq!(down.status.code(), Some(3), "{}", text(&down));
    assert!(text(&down).contains("gave up after"), "{}", text(&down));
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "retried until the deadline: {:?}",
        started.elapsed()
    );
    assert_eq!(count(ch, &s.table), "0\t0\n", "nothing visible");

    http.set_mode(Mode::Pass);
    let up = commit(&s, "fd-1", &file);
    assert_eq!(up.status.code(), Some(0), "{}", text(&up));
    assert_eq!(count(ch, &s.table), "50000\t50000\n");
    assert_gc_leaves_nothing(&s);
}

/// A slow link both ways (every chunk 25 ms late, in both directions, to the server and to
/// sshd): the load is slower, and exactly once. (This machine's kernel has no `tc netem`: the
/// proxy adds the latency.)
#[test]
fn a_load_over_slow_links_finishes_exactly_once() {
    let ch = shared();
    let sshd = Sshd::start(&[]);
    let http = FaultProxy::start(http_addr(ch));
    let ssh = FaultProxy::start(([127, 0, 0, 1], sshd.port).into());
    let s = Setup::new(ch, "faults_slow");
    through_proxies(&s, &sshd, &http, &ssh, 30);
    http.set_mode(Mode::Slow(Duration::from_millis(25)));
    ssh.set_mode(Mode::Slow(Duration::from_millis(25)));
    let begun = s.begin("fs-1", &[]);
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));
    let input = input_of(&s, 20_000);
    let built = build(&s, "fs-1", "app-3.1", &input);
    let file = winners(s.dir.path(), &[&manifest_line(&built)]);
    let out = commit(&s, "fs-1", &file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(count(ch, &s.table), "20000\t20000\n");
    assert!(
        http.accepted() > 0 && ssh.accepted() > 0,
        "both links were used"
    );
    assert_gc_leaves_nothing(&s);
}

/// sshd itself dies in the middle of an upload, with every session it runs (SIGKILL, as when
/// the host's sshd crashes or is restarted), and is started again two seconds later with the
/// same host key: the build resends the part on a new connection once sshd is back, and the
/// load finishes exactly once in one run. The link to sshd is slowed so that the restart
/// lands while part files are being written, not before or after the upload.
#[test]
fn a_build_rides_out_sshd_restarted_in_the_middle_of_its_upload() {
    let ch = shared();
    let mut sshd = Sshd::start(&[]);
    let http = FaultProxy::start(http_addr(ch));
    let ssh = FaultProxy::start(([127, 0, 0, 1], sshd.port).into());
    let s = Setup::new(ch, "faults_sshd_restart");
    through_proxies(&s, &sshd, &http, &ssh, 30);
    let begun = s.begin("fsr-1", &[]);
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));

    let input = input_of(&s, 600_000);
    // Each 64 KiB chunk 20 ms late: the parts (several MB) take seconds to upload.
    ssh.set_mode(Mode::Slow(Duration::from_millis(20)));
    let build = s
        .build_cmd("fsr-1", "app-4.1", 0)
        .arg("--input")
        .arg(&input)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The SSH handshake and the staging directories take a few KiB; 1 MiB sent is part data.
    let mid_upload =
        chpart_testenv::wait_until(Duration::from_secs(120), || ssh.sent_bytes() > 1024 * 1024);
    assert!(mid_upload, "the upload did not start within 120 s");
    let before = ssh.accepted();
    sshd.restart(Duration::from_secs(2));
    ssh.set_mode(Mode::Pass);
    let built = build.wait_with_output().unwrap();
    let line = manifest_line(&built);
    // `upload <remote dir>: retry N ...`: a part's upload was cut by the restart and sent again.
    assert!(
        text(&built)
            .lines()
            .any(|l| l.contains("upload ") && l.contains(": retry ")),
        "the upload's retry is logged: {}",
        text(&built)
    );
    assert!(
        ssh.accepted() > before,
        "the build reconnected after the restart"
    );

    let file = winners(s.dir.path(), &[&line]);
    let out = commit(&s, "fsr-1", &file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(count(ch, &s.table), "600000\t600000\n");
    assert_gc_leaves_nothing(&s);
}

/// Real packet loss (this machine's kernel has no `netem`; netfilter's random drop stands in):
/// 5% of the packets to and from the server's HTTP port and sshd's port are dropped, both ways,
/// for the whole load. TCP retransmits, and lost SYNs delay connects by seconds (past the 2 s
/// SSH connect timeout, which is retried): the load is slower, and exactly once. The server is
/// the test's own, so no other test's traffic is dropped.
#[test]
fn a_load_over_lossy_links_finishes_exactly_once() {
    let ch = ClickHouse::start(None);
    let sshd = Sshd::start(&[]);
    let s = Setup::new(&ch, "faults_loss");
    over_sftp(&s, &sshd, ch.http_port, sshd.port, 60);
    let loss = PacketLoss::start(&[ch.http_port, sshd.port], 5);
    let begun = s.begin("fl-1", &[]);
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));
    let input = input_of(&s, 300_000);
    let built = build(&s, "fl-1", "app-5.1", &input);
    let file = winners(s.dir.path(), &[&manifest_line(&built)]);
    let out = commit(&s, "fl-1", &file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let dropped = loss.dropped();
    eprintln!("lossy links: {dropped} packets dropped");
    assert!(
        dropped > 0,
        "no packet was dropped: the test tested nothing"
    );
    drop(loss);
    assert_eq!(count(&ch, &s.table), "300000\t300000\n");
    assert_gc_leaves_nothing(&s);
}

/// The server's host cut off in the middle of a commit: every packet to and from its HTTP port
/// dropped for 5 s (no RST: requests in flight hang past the 3 s request timeout, so whether
/// the statement they carried was applied is unknown), starting right after the first
/// `ATTACH PART` of two. The commit establishes what happened by reading the server back once
/// it answers again, and finishes in one run: rows exactly once, nothing left after gc.
#[test]
fn a_commit_rides_out_the_server_cut_off_for_five_seconds() {
    let ch = ClickHouse::start(None);
    let sshd = Sshd::start(&[]);
    let s = Setup::new(&ch, "faults_cut_off");
    over_sftp(&s, &sshd, ch.http_port, sshd.port, 60);
    let config = std::fs::read_to_string(&s.config).unwrap();
    std::fs::write(
        &s.config,
        config.replace("request_timeout_secs = 60", "request_timeout_secs = 3"),
    )
    .unwrap();
    let begun = s.begin("fc-1", &[]);
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));
    // 20 days over January and February: two parts, two ATTACHes.
    let input = input_of(&s, 100_000);
    let built = build(&s, "fc-1", "app-6.1", &input);
    let file = winners(s.dir.path(), &[&manifest_line(&built)]);
    // The commit pauses after its first ATTACH (the debug build's test hook) until the cut is
    // in place, so the cut always meets the commit's next statements: a 2-part commit is over
    // in about 0.1 s, sooner than a cut started after watching its events.
    let pause = s.dir.path().join("pause");
    std::fs::create_dir_all(&pause).unwrap();
    let commit = crate::cli::chpart()
        .args(["commit", "--config"])
        .arg(&s.config)
        .args(["--load", "fc-1", "--winners"])
        .arg(&file)
        .env("CHPART_TEST_PAUSE_AT", "after-attach:1")
        .env("CHPART_TEST_PAUSE_DIR", &pause)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let attached =
        chpart_testenv::wait_until(Duration::from_secs(60), || pause.join("paused").exists());
    assert!(attached, "no ATTACH within 60 s");
    let cut = PacketLoss::start(&[ch.http_port], 100);
    std::fs::write(pause.join("resume"), b"").unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let dropped = cut.dropped();
    drop(cut);
    let out = commit.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        dropped > 0,
        "the cut dropped nothing: the commit had ended before it"
    );
    // A statement that may be resent was retried, an ATTACH whose answer was lost was decided
    // again from what the server shows, or a statement that may not be resent (a MOVE) ended
    // the attempt and the commit resumed from the ledger and a fresh observation: which one
    // depends on the statement in flight when the cut began.
    let out = text(&out);
    assert!(
        out.contains(": retry ")
            || out.contains("deciding again from what the server shows")
            || out.contains("resuming (1)"),
        "the commit did not ride out the cut: {out}"
    );
    assert_eq!(count(&ch, &s.table), "100000\t100000\n");
    assert_gc_leaves_nothing(&s);
}
