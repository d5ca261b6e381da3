use super::*;
use crate::local::quote;
use std::process::Command;

#[test]
fn loads_are_cut_into_builds_of_at_most_100_partitions() {
    assert_eq!(
        Shape::for_parts(1000).unwrap(),
        Shape {
            builds: 10,
            per_build: 100
        }
    );
    assert_eq!(
        Shape::for_parts(100).unwrap(),
        Shape {
            builds: 1,
            per_build: 100
        }
    );
    let odd = Shape::for_parts(250).unwrap();
    assert_eq!((odd.builds, odd.per_build, odd.parts()), (3, 84, 252));
    assert_eq!(Shape::for_parts(7).unwrap().parts(), 7);
    assert!(Shape::for_parts(0).is_err());
    assert_eq!(
        Shape::for_parts(1000).unwrap().partition_key(),
        "(toStartOfHour(ts), intDiv(toUnixTimestamp(ts) % 3600 * 100, 3600))"
    );
}

#[test]
fn the_commit_time_is_read_from_chpart_log_line() {
    let log = "2026-11-30T09:00:01Z  INFO verified 100 part(s)\n\
               2026-11-30T09:00:02Z  INFO load bench-x committed into db.t: 10000 rows, 100 \
               part(s) (100 attached by this run), 100 partition(s), 1 winning attempt(s), 0.42s\n";
    assert_eq!(logged_commit_secs(log), Some(0.42));
    assert_eq!(logged_commit_secs("INFO load x is already committed"), None);
}

#[test]
fn failures_are_shortened_to_their_reason() {
    let line = "chpart: error: commit of load L: ledger chpart.ledger: ClickHouse at \
                http://h:1: Code: 1000. HTML Form Exception: Field value too long (while \
                running: INSERT INTO t (a, b) SELECT {l:String}): ClickHouse at http://h:1: \
                Code: 1000. HTML Form Exception: Field value too long (while running: INSERT \
                INTO t (a, b) SELECT {l:String})";
    assert_eq!(
        shorten_error(line),
        "chpart: error: commit of load L: ledger chpart.ledger: ClickHouse at http://h:1: \
         Code: 1000. HTML Form Exception: Field value too long"
    );
    assert_eq!(shorten_error("plain: message"), "plain: message");
    assert_eq!(shorten_error("open foo: o"), "open foo: o");
    assert_eq!(shorten_error("a: b: c: b: c"), "a: b: c");
    assert_eq!(shorten_error("cut (while running: (never closed"), "cut");
}

#[test]
fn the_reader_times_first_and_complete_visibility_and_flags_anomalies() {
    let ms = Duration::from_millis;
    let mut seen = Seen::default();
    seen.observe(ms(5), ms(2), 0, 100);
    seen.observe(ms(10), ms(2), 40, 100);
    seen.observe(ms(15), ms(2), 100, 100);
    seen.observe(ms(20), ms(2), 100, 100);
    assert_eq!(seen.first_rows, Some(ms(10)));
    assert_eq!(seen.all_rows, Some(ms(15)));
    assert_eq!(seen.polls, 4);
    assert_eq!(seen.counts.len(), 3);
    assert!((seen.mean_poll_ms() - 2.0).abs() < 1e-9);
    assert_eq!(seen.anomaly, None);

    let mut shrinking = Seen::default();
    shrinking.observe(ms(1), ms(1), 50, 100);
    shrinking.observe(ms(2), ms(1), 40, 100);
    assert!(shrinking.anomaly.unwrap().contains("after having seen 50"));
    let mut duplicated = Seen::default();
    duplicated.observe(ms(1), ms(1), 150, 100);
    assert!(duplicated
        .anomaly
        .unwrap()
        .contains("more than the load's 100"));
}

const PART: Variant = Variant {
    visibility: "part",
    transport: Transport::Sftp,
};
const PARTITION: Variant = Variant {
    visibility: "partition",
    transport: Transport::Sftp,
};

fn run(variant: Variant, parts: usize, secs: f64, all_rows_ms: Option<u64>) -> CommitRun {
    CommitRun {
        variant,
        parts,
        rows: parts as u64 * 100,
        secs,
        logged_secs: Some(secs - 0.1),
        server_cpu: Some(0.5),
        sshd_cpu: Some(0.05),
        ledger_entries: 2 * parts as u64 + 2,
        loads: 1,
        plan_bytes: 150 * parts as u64,
        visible: all_rows_ms.map(|ms| {
            let mut seen = Seen::default();
            seen.observe(
                Duration::from_millis(ms / 2),
                Duration::from_millis(1),
                1,
                2,
            );
            seen.observe(Duration::from_millis(ms), Duration::from_millis(1), 2, 2);
            seen
        }),
    }
}

#[test]
fn variants_name_visibility_and_transport() {
    assert_eq!(
        PART.label(),
        "--visibility part (ATTACH PART into the target), SFTP"
    );
    assert_eq!(PARTITION.slug(), "partition_sftp");
    let local = Variant {
        transport: Transport::Local,
        ..PART
    };
    assert_eq!(local.slug(), "part_local");
    assert!(local.label().ends_with(", local"));
}

#[test]
fn the_report_checks_each_figure_against_its_target() {
    let cpu_row = |server_cpu: f64| CpuRow {
        secs: 1.0,
        server_cpu,
        uncompressed: 500_000_000,
    };
    let results = Results {
        data_disk: "server data on / (ext4 on /dev/vda, no journal)".into(),
        verify_connections: None,
        transport: Some(Transport::Sftp),
        attach_shape: Some(Shape::for_parts(1000).unwrap()),
        load_shape: Some(Shape::for_parts(100).unwrap()),
        rows_per_part: 100,
        attach: vec![
            Attach {
                variant: PART,
                one_load: Ok(run(PART, 1000, 4.0, None)),
                split: None,
            },
            Attach {
                variant: PARTITION,
                one_load: Ok(run(PARTITION, 1000, 8.0, None)),
                split: None,
            },
        ],
        visible: vec![
            run(PART, 100, 0.8, Some(600)),
            run(PARTITION, 100, 1.5, Some(1400)),
        ],
        visible_alone: vec![run(PART, 100, 0.7, None)],
        cpu: Some(CpuResults {
            rows: 5_000_000,
            input: "generated ...".into(),
            insert: cpu_row(4.0),
            begin: cpu_row(0.01),
            build: cpu_row(0.05),
            commit: cpu_row(0.02),
            settle: cpu_row(0.01),
            check: cpu_row(0.005),
            commit_sshd_cpu: Some(0.004),
            full: Some((cpu_row(0.003), Some(0.012))),
            chpart_parts: 5,
            idle_rate: 0.005,
            fixed_commit_cpu: 0.015,
        }),
    };
    let text = report(&results);
    for expected in [
        "(clickhouse-backup: 5-55), --visibility part (ATTACH PART into the target), SFTP: \
         250 parts/s (1000 parts in one commit, whole command)  PASS",
        "--visibility partition (shadow + MOVE PARTITION), SFTP: 125 parts/s (1000 parts in \
         one commit, whole command)  MISS",
        "100 parts, --visibility part (ATTACH PART into the target), SFTP: 0.600 s  PASS",
        "100 parts, --visibility partition (shadow + MOVE PARTITION), SFTP: 1.400 s  MISS",
        "0.0400 vs 8.000 CPU s/GB = 1/200  PASS",
        // (0.02 - 0.015) / 0.5 GB = 0.01 beyond; 0.015 / (8.0 / 100 - 0.01) = 0.21 GB.
        "1000-row loads): 0.015 CPU s; beyond it 0.0100 CPU s/GB; so commit <= 1/100 of \
         INSERT from 0.21 GB per load",
        ": 10 builds (Spark partitions) x 100 partitions",
        // Read back: sshd 0.012 less its 0.004 during (b); host (b) 0.02 + 0.004, (b') 0.003
        // + 0.012.
        "the content check costs the host 0.005 CPU s on the server (CHECK TABLE, of (b)) or \
         0.008 CPU s in sshd reading every byte back ((b') sshd less (b) sshd); the host's whole \
         commit: (b) 0.024 s with the server's check, (b') 0.015 s with the read-back",
    ] {
        assert!(text.contains(expected), "{expected:?} not in:\n{text}");
    }
    // begin 0.01 + build 0.05 + commit 0.02 + settle 0.01 = 0.09 CPU s for 0.5 GB.
    let total = text
        .lines()
        .find(|l| l.starts_with("    chpart, all of the above"))
        .unwrap();
    assert_eq!(
        total.split_whitespace().collect::<Vec<_>>()[5..],
        ["4.00", "0.090", "0.1800", "1/44"],
        "{total}"
    );

    assert!(!text.contains("failed commits:"), "{text}");
    assert!(
        text.lines()
            .any(|l| l == "server data on / (ext4 on /dev/vda, no journal)"),
        "{text}"
    );
    let visible_part = text
        .lines()
        .find(|l| l.starts_with("--visibility part") && l.contains(" 0.600 "))
        .unwrap();
    assert_eq!(
        visible_part.split_whitespace().collect::<Vec<_>>()[8..12],
        ["100", "0.700", "0.800", "0.300"],
        "{visible_part}"
    );

    // A commit that fails is reported with its message, and the split figure beside it.
    let split = (0..10)
        .map(|_| run(PART, 100, 0.4, None))
        .reduce(CommitRun::add)
        .unwrap();
    assert_eq!(
        (split.loads, split.parts, split.plan_bytes),
        (10, 1000, 15_000)
    );
    let failed = Results {
        attach: vec![Attach {
            variant: PART,
            one_load: Err("chpart commit ... (exit status: 3): Field value too long".into()),
            split: Some(split),
        }],
        ..results.clone()
    };
    let text = report(&failed);
    for expected in [
        "SFTP: the commit of 1000 parts failed  MISS",
        "SFTP, the same parts as 10 loads of 100 parts: 250 parts/s  PASS",
        "failed commits:\n  --visibility part (ATTACH PART into the target), SFTP, 1000 parts: \
         chpart commit ... (exit status: 3): Field value too long",
        "takes about 150 bytes per part in the commits that worked: about 150 KB for 1000 parts",
    ] {
        assert!(text.contains(expected), "{expected:?} not in:\n{text}");
    }

    let text = report(&Results {
        cpu: None,
        visible: vec![CommitRun {
            visible: Some(Seen::default()),
            ..run(PARTITION, 100, 1.0, None)
        }],
        ..results
    });
    assert!(text.contains("not measured (--no-cpu)"), "{text}");
    assert!(text.contains("never saw every row  MISS"), "{text}");
}

/// The partition key really cuts one generated hour into `per_build` partitions, so a build
/// of one input makes `per_build` parts, within clickhouse-local's partition limit.
#[test]
fn one_hour_of_events_makes_one_part_per_partition_with_clickhouse_local() {
    let dir = tempfile::tempdir().unwrap();
    let shape = Shape::for_parts(100).unwrap();
    let report = generate(&GenOptions {
        rows: 10_000,
        out: dir.path().join("hour.parquet"),
        files: 1,
        seed: 1,
        hour_start_secs: 1_796_029_200,
    })
    .unwrap();
    let run = measure::run(
        Command::new(chpart_testenv::clickhouse_local())
            .arg("--path")
            .arg(dir.path().join("ch"))
            .arg("--query")
            .arg(format!(
                "CREATE DATABASE db; {}; SYSTEM STOP MERGES db.t; \
                 INSERT INTO db.t SELECT * FROM file({}, Parquet); \
                 SELECT count(), uniqExact(partition_id), sum(rows), min(rows) > 0 \
                 FROM system.parts WHERE database = 'db' AND table = 't' AND active",
                events::ddl_partitioned("db.t", &shape.partition_key()),
                quote(report.paths[0].to_str().unwrap())
            )),
    )
    .unwrap();
    run.check().unwrap();
    assert_eq!(run.stdout_text(), "100\t100\t10000\t1\n");
}
