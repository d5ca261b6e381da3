//! A ClickHouse server killed in the middle of a commit's ATTACHes, against the real 26.9
//! engine: each test runs a server of its own and SIGKILLs it (never the shared one).
//!
//! ATTACH PART claims `detached/<n>` by renaming it to `detached/attaching_<n>`, loads the part
//! from there and renames that directory into the table; a server killed in between keeps
//! `attaching_<n>` after its restart, and the part is not active (seen on this engine by
//! delaying the claiming rename with `strace -e inject=rename:delay_exit=...` and killing the
//! server meanwhile). The tests make that state both ways: by killing the server while a
//! commit runs, and deterministically, by renaming parts to `attaching_<n>` while the server
//! is down.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use chpart_core::Manifest;
use chpart_testenv::clickhouse::ClickHouse;

use crate::build::{manifest_of, rows_select, write_rows, COLUMNS};
use crate::cli::{chpart, local_config, text};

/// Spark partitions per load; each one's 1000 rows spread over `PARTS_PER_PARTITION`
/// ClickHouse partitions, so a load has 50 parts.
const SPARK_PARTITIONS: u32 = 2;
const PARTS_PER_PARTITION: u32 = 25;

/// A server of the test's own, which the test may kill and restart on the same data.
struct Crashable {
    ch: Option<ClickHouse>,
    dir: tempfile::TempDir,
    ledger_db: String,
    config: PathBuf,
}

impl Crashable {
    fn start() -> Crashable {
        let ch = ClickHouse::start(None);
        ch.q("CREATE DATABASE rec");
        let dir = tempfile::tempdir().unwrap();
        let ledger_db = "rec_ledger".to_owned();
        let config = local_config(dir.path(), &ch, &ledger_db);
        Crashable {
            ch: Some(ch),
            dir,
            ledger_db,
            config,
        }
    }

    fn ch(&self) -> &ClickHouse {
        self.ch.as_ref().expect("the server is running")
    }

    /// SIGKILL: no shutdown of any kind.
    fn kill(&mut self) {
        self.ch.as_mut().expect("the server is running").kill();
    }

    /// Starts the server again on the same data (on new ports: the config follows).
    fn restart(&mut self) {
        let ch = self.ch.take().expect("a server to restart").restart();
        self.config = local_config(self.dir.path(), &ch, &self.ledger_db);
        self.ch = Some(ch);
    }

    fn run(&self, args: &[&str]) -> Output {
        crate::cli::run_with(&self.config, args)
    }

    fn commit_cmd(&self, load: &str, winners: &Path) -> std::process::Command {
        let mut cmd = chpart();
        cmd.args(["commit", "--config"])
            .arg(&self.config)
            .args(["--load", load, "--winners"])
            .arg(winners)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// A table `rec.<table>` and a begun load of 50 parts built by one attempt per Spark
    /// partition (and, with `loser`, a second attempt of partition 0 that lost): the winners
    /// file, the winners' part names and the publish table's `detached/`.
    fn load(&self, table: &str, load: &str, begin: &[&str], loser: bool) -> BuiltLoad {
        self.ch().q(&format!(
            "CREATE TABLE rec.{table} ({COLUMNS}) ENGINE = MergeTree \
             PARTITION BY id % {PARTS_PER_PARTITION} ORDER BY id"
        ));
        let table_arg = format!("rec.{table}");
        let mut args = vec!["begin", "--table", &table_arg, "--load", load];
        args.extend(begin);
        let out = self.run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let mut winners = Vec::new();
        for p in 0..SPARK_PARTITIONS {
            let input = write_rows(
                self.dir.path(),
                &format!("{load}-{p}.parquet"),
                &rows_select(u64::from(p) * 1000, 1000),
                "Parquet",
            );
            let attempts: &[&str] = if loser && p == 0 {
                &["win", "lose"]
            } else {
                &["win"]
            };
            for a in attempts {
                let (attempt, partition) = (format!("{a}.{p}"), p.to_string());
                let input = input.to_str().unwrap();
                let out = self.run(&[
                    "build",
                    "--load",
                    load,
                    "--attempt",
                    &attempt,
                    "--partition",
                    &partition,
                    "--input",
                    input,
                ]);
                let manifest = manifest_of(out).unwrap_or_else(|o| panic!("build: {}", text(&o)));
                if *a == "win" {
                    winners.push(manifest);
                }
            }
        }
        let file = self.dir.path().join(format!("{load}.jsonl"));
        let lines: Vec<String> = winners.iter().map(Manifest::to_json_line).collect();
        std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        let parts: BTreeSet<String> = winners
            .iter()
            .flat_map(|m| m.parts.iter().map(|p| p.name.to_string()))
            .collect();
        assert_eq!(
            parts.len(),
            (SPARK_PARTITIONS * PARTS_PER_PARTITION) as usize
        );
        BuiltLoad {
            table: table_arg,
            load: load.to_owned(),
            winners: file,
            detached: Path::new(winners[0].target.data_path.as_str()).join("detached"),
            parts,
        }
    }

    /// The table holds exactly the load's source rows (count and checksum).
    fn assert_exactly_once(&self, built: &BuiltLoad, row: &str) {
        let sql = |from: &str| {
            format!("SELECT count(), sum(cityHash64(ts, id, name, score)) FROM {from}")
        };
        let source: Vec<String> = (0..SPARK_PARTITIONS)
            .map(|p| rows_select(u64::from(p) * 1000, 1000))
            .collect();
        assert_eq!(
            self.ch().q(&sql(&built.table)),
            self.ch()
                .q(&sql(&format!("({})", source.join(" UNION ALL ")))),
            "{row}: not exactly the source rows"
        );
    }
}

struct BuiltLoad {
    table: String,
    load: String,
    winners: PathBuf,
    /// The publish table's `detached/`.
    detached: PathBuf,
    /// The winners' part names.
    parts: BTreeSet<String>,
}

impl BuiltLoad {
    /// The winners' entries in `detached/` (plain and `attaching_`), by directory name.
    fn left(&self) -> (Vec<String>, Vec<String>) {
        let (mut plain, mut claimed) = (Vec::new(), Vec::new());
        let Ok(entries) = std::fs::read_dir(&self.detached) else {
            return (plain, claimed); // the shadow table is gone
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            match name.strip_prefix("attaching_") {
                Some(inner) if self.parts.contains(inner) => claimed.push(name),
                None if self.parts.contains(&name) => plain.push(name),
                _ => {}
            }
        }
        (plain, claimed)
    }
}

/// Runs a commit and SIGKILLs the server once `after` of the 50 parts have left `detached/`
/// and an ATTACH holds one (`attaching_`), polling the directory as fast as it can. Returns
/// whether the server was killed before the commit ended, and the `attaching_` leftovers the
/// kill left.
fn kill_server_during_commit(
    env: &mut Crashable,
    built: &BuiltLoad,
    after: usize,
) -> (bool, usize) {
    let mut commit = env.commit_cmd(&built.load, &built.winners).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let killed = loop {
        if commit.try_wait().unwrap().is_some() {
            break false;
        }
        assert!(Instant::now() < deadline, "the commit did not end");
        let (plain, claimed) = built.left();
        if built.parts.len() - plain.len() >= after && !claimed.is_empty() {
            env.kill();
            break true;
        }
    };
    let out = commit.wait_with_output().unwrap();
    if killed {
        assert_ne!(
            out.status.code(),
            Some(0),
            "a commit whose server died mid-ATTACH cannot have finished: {}",
            text(&out)
        );
    }
    (killed, built.left().1.len())
}

/// SIGKILL the server while a 50-part commit attaches, at several points, for both
/// visibilities; restart it on the same data and re-run the commit: the rows are exactly the
/// source's, and nothing of the winners is left in `detached/` (plain or `attaching_`).
#[test]
fn a_server_killed_during_the_attaches_resumes_exactly_once() {
    let mut env = Crashable::start();
    let mut leftovers_seen = 0;
    for (i, begin) in [&[][..], &["--visibility", "part"][..]].iter().enumerate() {
        for after in [1, 25, 45] {
            // The kill has to land while an ATTACH holds a claim: try a few loads.
            for round in 0..4 {
                let row = format!("{begin:?} after {after} parts, round {round}");
                let built = env.load(
                    &format!("k_{i}_{after}_{round}"),
                    &format!("rec-kill-{i}-{after}-{round}"),
                    begin,
                    false,
                );
                let (killed, leftovers) = kill_server_during_commit(&mut env, &built, after);
                if killed {
                    env.restart();
                }
                leftovers_seen += leftovers;
                eprintln!("{row}: server killed {killed}, attaching_ leftovers {leftovers}");
                let out = env
                    .commit_cmd(&built.load, &built.winners)
                    .output()
                    .unwrap();
                assert_eq!(out.status.code(), Some(0), "{row}: resume: {}", text(&out));
                env.assert_exactly_once(&built, &row);
                assert_eq!(
                    built.left(),
                    (vec![], vec![]),
                    "{row}: winners' parts left in detached/"
                );
                if leftovers > 0 {
                    break;
                }
            }
        }
    }
    // Each point kills an ATTACH in flight within a round or two here: none in all of them
    // means the test no longer makes the state it is about.
    assert!(
        leftovers_seen > 0,
        "no kill left an attaching_ claim: the test did not test recovery"
    );
}

/// The state a server killed inside ATTACHes leaves, made deterministically: a commit killed
/// after 20 ATTACHes (intents recorded for every part), the server stopped, three of the parts
/// still waiting renamed to `attaching_<n>`, the server started again. Re-running the commit
/// takes the claims back (they predate the server's start and no ATTACH runs) and finishes
/// exactly once; before, every re-run exited 3 ("stays claimed") forever.
#[test]
fn claims_left_by_a_dead_server_are_taken_back_and_attached_once() {
    let mut env = Crashable::start();
    for (i, begin) in [&[][..], &["--visibility", "part"][..]].iter().enumerate() {
        let row = format!("{begin:?}");
        let built = env.load(&format!("d_{i}"), &format!("rec-det-{i}"), begin, false);
        crash_claims(&mut env, &built, "after-attach:20", 3, &row);
        let out = env
            .commit_cmd(&built.load, &built.winners)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{row}: resume: {}", text(&out));
        env.assert_exactly_once(&built, &row);
        assert_eq!(
            built.left(),
            (vec![], vec![]),
            "{row}: winners' parts left in detached/"
        );
    }
}

/// Kills the load's commit at `crash_at` (the test hook), then stops the server, renames `n`
/// of the winners' parts still in `detached/` to `attaching_<part>` (what a SIGKILL inside
/// their ATTACHes leaves), and starts it again.
fn crash_claims(env: &mut Crashable, built: &BuiltLoad, crash_at: &str, n: usize, row: &str) {
    let out = env
        .commit_cmd(&built.load, &built.winners)
        .env("CHPART_TEST_CRASH_AT", crash_at)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        None,
        "{row}: to be killed: {}",
        text(&out)
    );
    env.ch.as_mut().unwrap().stop();
    let (plain, _) = built.left();
    assert!(
        plain.len() >= n,
        "only {} parts still detached",
        plain.len()
    );
    for name in plain.iter().take(n) {
        std::fs::rename(
            built.detached.join(name),
            built.detached.join(format!("attaching_{name}")),
        )
        .unwrap();
    }
    env.restart();
    assert_eq!(built.left().1.len(), n);
}

/// A load whose commit can never finish is ended with `abort --force`, and `gc` removes what
/// is left of it: with part visibility (the parts are in the target's `detached/`) that
/// includes the `attaching_` claims a dead server left, which the server itself refuses to
/// drop. With partition visibility dropping the shadow removes them.
#[test]
fn abort_force_and_gc_remove_claims_left_by_a_dead_server() {
    let mut env = Crashable::start();
    for (i, begin) in [&["--visibility", "part"][..], &[][..]].iter().enumerate() {
        let row = format!("{begin:?}");
        let built = env.load(&format!("a_{i}"), &format!("rec-abort-{i}"), begin, true);
        crash_claims(&mut env, &built, "after-attach:5", 2, &row);
        let out = env.run(&["abort", "--load", &built.load, "--force"]);
        assert_eq!(out.status.code(), Some(0), "{row}: abort: {}", text(&out));
        let out = env.run(&["gc"]);
        assert_eq!(out.status.code(), Some(0), "{row}: gc: {}", text(&out));
        let everything: Vec<String> = match std::fs::read_dir(&built.detached) {
            Ok(entries) => entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        };
        assert_eq!(
            everything,
            Vec::<String>::new(),
            "{row}: the load's detached/ after abort --force and gc (winners, claims, the loser)"
        );
    }
}

/// The server SIGKILLed in the middle of a commit's ATTACHes and started again on the same
/// ports a moment later: the commit rides it out on its own, within `[retry] deadline_secs`
/// (reads retried, the commit resumed from the ledger and a fresh observation, claims a dead
/// server left taken back), and exits 0 in that one run, for both visibilities.
#[test]
fn a_server_restarted_mid_commit_is_ridden_out_within_the_deadline() {
    let ports = (chpart_testenv::free_port(), chpart_testenv::free_port());
    let ch = ClickHouse::start_with(chpart_testenv::clickhouse::ServerOptions {
        ports: Some(ports),
        ..Default::default()
    });
    ch.q("CREATE DATABASE rec");
    let dir = tempfile::tempdir().unwrap();
    let config = local_config(dir.path(), &ch, "rec_ledger");
    let mut env = Crashable {
        ch: Some(ch),
        dir,
        ledger_db: "rec_ledger".to_owned(),
        config,
    };
    let mut killed_any = false;
    for (i, begin) in [&[][..], &["--visibility", "part"][..]].iter().enumerate() {
        let row = format!("{begin:?}");
        let built = env.load(&format!("r_{i}"), &format!("rec-ride-{i}"), begin, true);
        let mut commit = env
            .commit_cmd(&built.load, &built.winners)
            .env("CHPART_RETRY_DEADLINE_SECS", "60")
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        // Once a third of the parts left detached/, kill the server and start it again.
        let killed = loop {
            if commit.try_wait().unwrap().is_some() {
                break false;
            }
            assert!(Instant::now() < deadline, "{row}: the commit did not end");
            let (plain, _) = built.left();
            if built.parts.len() - plain.len() >= built.parts.len() / 3 {
                env.kill();
                env.ch.as_mut().unwrap().start_again();
                break true;
            }
        };
        killed_any |= killed;
        let out = commit.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{row}: {}", text(&out));
        if killed {
            // The restart hit the commit in flight: a request was retried, or ATTACHes failed
            // and were decided again from the server (which of the two depends on what was in
            // flight when it died: the ATTACHes are the commit's only statements between two
            // ledger writes).
            let out = text(&out);
            assert!(
                out.contains("retry") || out.contains("deciding again from what the server shows"),
                "{row}: the commit did not see the restart: {out}"
            );
        }
        env.assert_exactly_once(&built, &row);
        assert_eq!(
            built.left(),
            (vec![], vec![]),
            "{row}: winners' parts left in detached/"
        );
    }
    assert!(
        killed_any,
        "no commit was still running when the server was killed"
    );
}
