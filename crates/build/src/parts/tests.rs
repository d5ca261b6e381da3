use std::time::Duration;

use super::*;
use crate::ddl::local_table_ddl;
use crate::runner::LocalCommand;
use crate::workdir::WorkDir;

fn command() -> LocalCommand {
    LocalCommand::new(chpart_testenv::clickhouse_local(), Duration::from_secs(120))
}

/// The target table as a server would print it: tiered storage, a move TTL, a projection (so
/// parts have a subdirectory) and a MATERIALIZED column the input does not provide.
const TARGET: &str = "CREATE TABLE prod.events (`ts` DateTime64(3, 'UTC') CODEC(Delta(8), ZSTD(1)), `id` UInt64, `name` String, `day` Date MATERIALIZED toDate(ts), PROJECTION by_name (SELECT id, name ORDER BY name)) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/prod/events', '{replica}') PARTITION BY toYYYYMM(ts) ORDER BY id TTL toDateTime(ts) + toIntervalDay(30) TO VOLUME 'cold' SETTINGS index_granularity = 8192, storage_policy = 'tiered'";
const STRUCTURE: &str = "ts DateTime64(3, 'UTC'), id UInt64, name String";

fn insert_columns() -> Vec<String> {
    ["ts", "id", "name"].map(String::from).to_vec()
}

/// TSV rows: `n` rows spread over January to March 2026 (ids 0..n).
fn tsv(n: u64) -> String {
    let months = ["2026-01-10", "2026-02-10", "2026-03-10"];
    (0..n)
        .map(|i| {
            format!(
                "{} 12:00:00.000\t{i}\tname-{}\n",
                months[(i % 3) as usize],
                i % 7
            )
        })
        .collect()
}

/// `n` rows of [`tsv`] as a TabSeparated input file in `work`.
fn tsv_file(work: &WorkDir, n: u64) -> Vec<FileSource> {
    let path = work.path().join(format!("input-{n}.tsv"));
    std::fs::write(&path, tsv(n)).unwrap();
    vec![(path, "TabSeparated".into(), STRUCTURE.into())]
}

/// Runs a build of `files` in `work`, returning the system.parts output.
fn build(work: &WorkDir, files: Vec<FileSource>) -> String {
    let ddl = local_table_ddl(TARGET, "chpart", "events").unwrap();
    let query = build_query(&ddl, "chpart", "events", &insert_columns(), files).unwrap();
    let out = command()
        .run(&local_args(&work.path().join("ch"), &query))
        .unwrap_or_else(|e| panic!("{e}\n{query}"));
    String::from_utf8(out).unwrap()
}

#[test]
fn builds_from_a_file_checks_and_digests() {
    // A parent whose name needs escaping in TabSeparated output.
    let parent = tempfile::tempdir().unwrap();
    let odd_parent = parent.path().join("we ird\tdir\\x");
    std::fs::create_dir(&odd_parent).unwrap();
    let work = WorkDir::create(&odd_parent, "load-1", "attempt-1").unwrap();
    let out = build(&work, tsv_file(&work, 30_000));
    let parts = inspect_parts(&out, None).unwrap_or_else(|e| panic!("{e}\n{out}"));

    // One part per partition: 30k rows are one insert block.
    let summary: Vec<(String, String, u64, u32)> = parts
        .iter()
        .map(|p| {
            (
                p.local_name.to_string(),
                p.partition_id.to_string(),
                p.rows,
                p.level,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("202601_1_1_0".to_string(), "202601".to_string(), 10_000, 0),
            ("202602_2_2_0".to_string(), "202602".to_string(), 10_000, 0),
            ("202603_3_3_0".to_string(), "202603".to_string(), 10_000, 0),
        ]
    );
    for part in &parts {
        assert!(part.dir.starts_with(work.path()), "{}", part.dir.display());
        assert!(part.dir.ends_with(part.local_name.to_string()));
        assert_eq!(part.hash_of_all_files.len(), 32);

        let files = digest_part(&part.dir).unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        let mut sorted = paths.clone();
        sorted.sort();
        assert_eq!(paths, sorted, "digest is sorted by path");
        for required in [
            "checksums.txt",
            "count.txt",
            "metadata_version.txt",
            "columns.txt",
            "by_name.proj/checksums.txt",
        ] {
            assert!(
                paths.contains(&required),
                "{required} missing from {paths:?}"
            );
        }
        // Every file on disk is listed once, with its size and content hash.
        let on_disk = walkdir::WalkDir::new(&part.dir)
            .into_iter()
            .filter(|e| e.as_ref().unwrap().file_type().is_file())
            .count();
        assert_eq!(files.len(), on_disk);
        for file in &files {
            let content = std::fs::read(part.dir.join(&file.path)).unwrap();
            assert_eq!(file.size, content.len() as u64, "{}", file.path);
            assert_eq!(
                file.sha256,
                hex::encode(Sha256::digest(&content)),
                "{}",
                file.path
            );
        }
        let count = files.iter().find(|f| f.path == "count.txt").unwrap();
        assert_eq!(count.sha256, hex::encode(Sha256::digest(b"10000")));
    }
}

#[test]
fn builds_from_parquet_files_with_absolute_paths() {
    let work = WorkDir::create(&std::env::temp_dir(), "load-1", "attempt-pq").unwrap();
    // Two Parquet files written by clickhouse-local itself; the first spans January and
    // February, the second February and March. The quote in the name exercises quoting.
    let files: Vec<PathBuf> = ["in'put 1.parquet", "input-2.parquet"]
        .iter()
        .map(|n| work.path().join(n))
        .collect();
    for (file, (first, days)) in files.iter().zip([("2026-01-20", 20), ("2026-02-25", 20)]) {
        let query = format!(
            "SELECT toDateTime64('{first} 00:00:00', 3, 'UTC') + toIntervalDay(number) AS ts, number AS id, concat('n', toString(number)) AS name \
             FROM numbers({days}) INTO OUTFILE {} FORMAT Parquet",
            crate::sql::quote_os(file.as_os_str())
        );
        command().run(&["--query".into(), query.into()]).unwrap();
        assert!(file.metadata().unwrap().len() > 0);
    }
    let source: Vec<FileSource> = files
        .iter()
        .map(|f| (f.clone(), "Parquet".to_string(), STRUCTURE.to_string()))
        .collect();
    let out = build(&work, source);
    let parts = inspect_parts(&out, None).unwrap_or_else(|e| panic!("{e}\n{out}"));
    // Each INSERT makes its own parts: file 1 gives Jan (12 days) + Feb (8), file 2 Feb (4) + Mar (16).
    let summary = names_and_rows(&parts);
    assert_eq!(
        summary,
        [
            ("202601_1_1_0".to_string(), 12),
            ("202602_2_2_0".to_string(), 8),
            ("202602_3_3_0".to_string(), 4),
            ("202603_4_4_0".to_string(), 16)
        ]
    );
}

#[test]
fn a_large_input_is_one_part_per_partition() {
    // 2.2M rows, the three months interleaved row by row: two default insert blocks (a block
    // ends once it holds 1,048,449 rows), every block holding rows of every month.
    let work = WorkDir::create(&std::env::temp_dir(), "load-1", "attempt-large").unwrap();
    let file = work.path().join("large.parquet");
    let rows = 2_200_000u64;
    let query = format!(
        "SELECT toDateTime64('2026-01-10 12:00:00', 3, 'UTC') + toIntervalMonth(number % 3) AS ts, number AS id, \
         concat('name-', toString(number % 7)) AS name FROM numbers({rows}) INTO OUTFILE {} FORMAT Parquet",
        crate::sql::quote_os(file.as_os_str())
    );
    command().run(&["--query".into(), query.into()]).unwrap();
    let source = || vec![(file.clone(), "Parquet".to_string(), STRUCTURE.to_string())];

    let out = build(&work, source());
    let parts = inspect_parts(&out, None).unwrap_or_else(|e| panic!("{e}\n{out}"));
    let summary: Vec<(String, u64)> = parts
        .iter()
        .map(|p| (p.partition_id.to_string(), p.rows))
        .collect();
    assert_eq!(
        summary,
        [
            ("202601".to_string(), rows / 3 + 1),
            ("202602".to_string(), rows / 3),
            ("202603".to_string(), rows / 3),
        ],
        "{out}"
    );

    // The same insert without the block settings: a part per partition per default block.
    let ddl = local_table_ddl(TARGET, "chpart", "events").unwrap();
    let query = build_query(&ddl, "chpart", "events", &insert_columns(), source())
        .unwrap()
        .replace(&format!(", {ONE_BLOCK}"), "");
    let out = command()
        .run(&local_args(&work.path().join("ch-default"), &query))
        .unwrap();
    let out = String::from_utf8(out).unwrap();
    let default_parts = inspect_parts(&out, None).unwrap().len();
    assert!(
        default_parts >= 6,
        "{default_parts} parts with the default blocks:\n{out}"
    );
}

/// Two inserts into the same three partitions (January to March 2026) in `work`'s data
/// directory `ch`: six parts, as [`split_partitions`] sees them.
fn two_inserts(work: &WorkDir) -> PathBuf {
    let ddl = local_table_ddl(TARGET, "chpart", "events").unwrap();
    let rows = |from: u64| {
        format!("SELECT toDateTime64('2026-01-01 00:00:00', 3, 'UTC') + toIntervalDay(number * 20) AS ts, number + {from} AS id, 'x' AS name FROM numbers(5)")
    };
    let files: Vec<PathBuf> = (0..2)
        .map(|i| work.path().join(format!("{i}.tsv")))
        .collect();
    for (i, file) in files.iter().enumerate() {
        let query = format!(
            "{} INTO OUTFILE {} FORMAT TabSeparated",
            rows(i as u64 * 100),
            crate::sql::quote_os(file.as_os_str())
        );
        command().run(&["--query".into(), query.into()]).unwrap();
    }
    let source: Vec<FileSource> = files
        .iter()
        .map(|f| (f.clone(), "TabSeparated".to_string(), STRUCTURE.to_string()))
        .collect();
    let query = build_query(&ddl, "chpart", "events", &insert_columns(), source).unwrap();
    let data = work.path().join("ch");
    let out = command().run(&local_args(&data, &query)).unwrap();
    let inserted = inspect_parts(&String::from_utf8(out).unwrap(), None).unwrap();
    assert_eq!(inserted.len(), 6, "two inserts, three partitions each");
    let ids = |v: &[&str]| {
        v.iter()
            .map(|s| s.parse().unwrap())
            .collect::<Vec<PartitionId>>()
    };
    assert_eq!(
        split_partitions(&inserted),
        ids(&["202601", "202602", "202603"])
    );
    assert_eq!(
        split_partitions(&inserted[..3]),
        ids(&["202601"]),
        "{inserted:?}"
    );
    assert_eq!(split_partitions(&inserted[..1]), ids(&[]));
    data
}

#[test]
fn a_merge_of_named_partitions_leaves_the_others_as_built() {
    let work = WorkDir::create(&std::env::temp_dir(), "load-1", "attempt-merge-some").unwrap();
    let data = two_inserts(&work);
    let feb: PartitionId = "202602".parse().unwrap();
    let query = rewrite_query("chpart", "events", Rewrite::Merge, Some(&[feb]));
    assert!(
        query.contains("OPTIMIZE TABLE `chpart`.`events` PARTITION ID '202602' FINAL;\n"),
        "{query}"
    );
    let out = command().run(&local_args(&data, &query)).unwrap();
    let out = String::from_utf8(out).unwrap();
    let parts = inspect_parts(&out, Some(Rewrite::Merge)).unwrap_or_else(|e| panic!("{e}\n{out}"));
    let summary = names_and_rows(&parts);
    assert_eq!(
        summary,
        [
            ("202601_1_1_0".to_string(), 2),
            ("202601_4_4_0".to_string(), 2),
            ("202602_2_5_1".to_string(), 2),
            ("202603_3_3_0".to_string(), 2),
            ("202603_6_6_0".to_string(), 2)
        ]
    );
}

#[test]
fn merged_builds_are_accepted_only_after_a_merge() {
    let work = WorkDir::create(&std::env::temp_dir(), "load-1", "attempt-merge").unwrap();
    // Two inserts into the same partitions, then OPTIMIZE FINAL: one part per partition.
    let data = two_inserts(&work);
    let query = rewrite_query("chpart", "events", Rewrite::Merge, None);
    let out = command().run(&local_args(&data, &query)).unwrap();
    let out = String::from_utf8(out).unwrap();

    for rewrite in [None, Some(Rewrite::ApplyTtl)] {
        let err = inspect_parts(&out, rewrite).unwrap_err().to_string();
        assert!(err.contains("is a merged part (level 1)"), "{err}");
    }
    let parts = inspect_parts(&out, Some(Rewrite::Merge)).unwrap_or_else(|e| panic!("{e}\n{out}"));
    let summary = names_and_rows(&parts);
    // Days 0, 20, 40, 60, 80 from Jan 1: Jan (0, 20), Feb (40), Mar (60, 80), twice each; the
    // first insert takes blocks 1-3, the second 4-6.
    assert_eq!(
        summary,
        [
            ("202601_1_4_1".to_string(), 4),
            ("202602_2_5_1".to_string(), 2),
            ("202603_3_6_1".to_string(), 4)
        ]
    );
    assert!(parts.iter().all(|p| p.level == 1));
}

/// Each part's local name and rows, in order.
fn names_and_rows(parts: &[BuiltPart]) -> Vec<(String, u64)> {
    parts
        .iter()
        .map(|p| (p.local_name.to_string(), p.rows))
        .collect()
}

/// Copies directory trees (no symlinks in parts).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn tampered_parts_fail_with_the_part_and_the_problem() {
    let work = WorkDir::create(&std::env::temp_dir(), "load-1", "attempt-tamper").unwrap();
    let pristine_out = build(&work, tsv_file(&work, 300));
    let pristine = inspect_parts(&pristine_out, None).unwrap();
    let table_dir = pristine[0].dir.parent().unwrap().to_path_buf();
    let part = "202602_2_2_0";

    type Tamper = fn(&Path, &str) -> String;
    // (what, tamper the copied table dir and/or rewrite the TSV, expected message parts)
    let cases: &[(&str, Tamper, &[&str])] = &[
        (
            "count.txt removed",
            |dir, tsv| {
                std::fs::remove_file(dir.join("202602_2_2_0/count.txt")).unwrap();
                tsv.to_string()
            },
            &["part 202602_2_2_0", "count.txt is missing"],
        ),
        (
            "count.txt changed",
            |dir, tsv| {
                std::fs::write(dir.join("202602_2_2_0/count.txt"), "99").unwrap();
                tsv.to_string()
            },
            &[
                "part 202602_2_2_0",
                "count.txt says 99 rows, system.parts says 100",
            ],
        ),
        (
            "count.txt garbage",
            |dir, tsv| {
                std::fs::write(dir.join("202602_2_2_0/count.txt"), "lots").unwrap();
                tsv.to_string()
            },
            &["part 202602_2_2_0", "count.txt holds \"lots\""],
        ),
        (
            "metadata_version.txt removed",
            |dir, tsv| {
                std::fs::remove_file(dir.join("202602_2_2_0/metadata_version.txt")).unwrap();
                tsv.to_string()
            },
            &["part 202602_2_2_0", "metadata_version.txt is missing"],
        ),
        (
            "checksums.txt removed",
            |dir, tsv| {
                std::fs::remove_file(dir.join("202602_2_2_0/checksums.txt")).unwrap();
                tsv.to_string()
            },
            &["part 202602_2_2_0", "checksums.txt is missing"],
        ),
        (
            "part directory missing",
            |dir, tsv| {
                std::fs::remove_dir_all(dir.join("202602_2_2_0")).unwrap();
                tsv.to_string()
            },
            &["part 202602_2_2_0", "the part directory is missing"],
        ),
        (
            "tmp_ leftover",
            |dir, tsv| {
                std::fs::create_dir(dir.join("tmp_insert_202601_9_9_0")).unwrap();
                tsv.to_string()
            },
            &["holds unfinished part directory \"tmp_insert_202601_9_9_0\""],
        ),
        (
            "tmp_merge leftover",
            |dir, tsv| {
                std::fs::create_dir(dir.join("tmp_merge_202601_1_3_1")).unwrap();
                tsv.to_string()
            },
            &["\"tmp_merge_202601_1_3_1\""],
        ),
        (
            "reported partition differs from the name",
            |_, tsv| tsv.replace("202602_2_2_0\t202602\t", "202602_2_2_0\t202603\t"),
            &[
                "part 202602_2_2_0",
                "reports partition \"202603\", the name says \"202602\"",
            ],
        ),
        (
            "mutated part",
            |dir, tsv| {
                std::fs::rename(dir.join("202602_2_2_0"), dir.join("202602_2_2_0_7")).unwrap();
                tsv.replace("202602_2_2_0", "202602_2_2_0_7")
            },
            &["part 202602_2_2_0_7", "mutated (mutation version 7)"],
        ),
        (
            "name not a part name",
            |_, tsv| tsv.replace("202602_2_2_0\t", "202602_2_2\t"),
            &["\"202602_2_2\"", "3 '_'-separated fields"],
        ),
        (
            "rows differ from count.txt",
            |_, tsv| tsv.replace("\t202602\t100\t", "\t202602\t101\t"),
            &[
                "part 202602_2_2_0",
                "count.txt says 100 rows, system.parts says 101",
            ],
        ),
        (
            "truncated output line",
            |_, tsv| tsv.replacen('\t', " ", 1),
            &["line 1", "6 fields instead of 7"],
        ),
    ];
    for (index, (what, tamper, needles)) in cases.iter().enumerate() {
        let copy = work.path().join(format!("case-{index}"));
        copy_dir(&table_dir, &copy);
        let tsv = pristine_out.replace(
            &table_dir.display().to_string(),
            &copy.display().to_string(),
        );
        assert!(
            tsv.contains(&copy.display().to_string()),
            "{what}: paths not rewritten"
        );
        // The untouched copy passes, so any failure below is the tamper's doing.
        inspect_parts(&tsv, None).unwrap_or_else(|e| panic!("{what}: untouched copy fails: {e}"));
        let tsv = tamper(&copy, &tsv);
        let err = inspect_parts(&tsv, None).expect_err(what).to_string();
        for needle in *needles {
            assert!(err.contains(needle), "{what}: {needle:?} not in {err}");
        }
    }

    // Digest refuses symlinks, wherever they are, and a part path that is one.
    let copy = work.path().join("case-symlink");
    copy_dir(&table_dir, &copy);
    let dir = copy.join(part);
    assert!(digest_part(&dir).is_ok());
    std::os::unix::fs::symlink("/etc/passwd", dir.join("by_name.proj/extra.bin")).unwrap();
    let err = digest_part(&dir).unwrap_err().to_string();
    assert!(
        err.contains("contains a symlink \"by_name.proj/extra.bin\""),
        "{err}"
    );
    std::fs::remove_file(dir.join("by_name.proj/extra.bin")).unwrap();
    std::os::unix::fs::symlink(&dir, copy.join("link_0_0_0")).unwrap();
    let err = digest_part(&copy.join("link_0_0_0"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("contains a symlink \".\""), "{err}");
    let err = digest_part(&copy.join("nothing_1_1_0"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot digest") && err.contains("nothing_1_1_0"),
        "{err}"
    );
}

#[test]
fn build_query_statements() {
    let files: Vec<FileSource> = vec![
        (
            PathBuf::from("/data/a b.parquet"),
            "Parquet".into(),
            "id UInt64, `we ird` String".into(),
        ),
        (
            PathBuf::from("/data/it's.arrow"),
            "Arrow".into(),
            "id UInt64, `we ird` String".into(),
        ),
    ];
    let columns = vec!["id".to_string(), "we ird".to_string()];
    let head = format!(
        "CREATE DATABASE `chpart`;\nDDL;\nALTER TABLE `chpart`.`t` MODIFY SETTING {NO_BACKGROUND_MERGES};\n\
         SYSTEM STOP MERGES `chpart`.`t`;\n"
    );
    let list = "SELECT name, partition_id, rows, hash_of_all_files, path, level, data_version FROM system.parts WHERE database = 'chpart' AND table = 't' AND active ORDER BY name FORMAT TabSeparated";
    let one = vec![files[0].clone()];
    type Case<'a> = (&'a str, Vec<FileSource>, &'a [String], String);
    let cases: Vec<Case> = vec![
        (
            "files",
            files,
            &columns,
            format!("{head}\
             INSERT INTO `chpart`.`t` (`id`, `we ird`) SETTINGS optimize_on_insert = 0, min_insert_block_size_rows = 0, min_insert_block_size_bytes = 1073741824 SELECT `id`, `we ird` FROM file('/data/a b.parquet', 'Parquet', 'id UInt64, `we ird` String');\n\
             INSERT INTO `chpart`.`t` (`id`, `we ird`) SETTINGS optimize_on_insert = 0, min_insert_block_size_rows = 0, min_insert_block_size_bytes = 1073741824 SELECT `id`, `we ird` FROM file('/data/it\\'s.arrow', 'Arrow', 'id UInt64, `we ird` String');\n{list}"),
        ),
        (
            "all columns",
            one,
            &[],
            format!("{head}\
             INSERT INTO `chpart`.`t` SETTINGS optimize_on_insert = 0, min_insert_block_size_rows = 0, min_insert_block_size_bytes = 1073741824 SELECT * FROM file('/data/a b.parquet', 'Parquet', 'id UInt64, `we ird` String');\n{list}"),
        ),
    ];
    for (what, source, columns, want) in cases {
        assert_eq!(
            build_query(" DDL ; ", "chpart", "t", columns, source).unwrap(),
            want,
            "{what}"
        );
    }
    for (rewrite, run) in [
        (Rewrite::Merge, "OPTIMIZE TABLE `chpart`.`t` FINAL"),
        (
            Rewrite::ApplyTtl,
            "ALTER TABLE `chpart`.`t` MATERIALIZE TTL SETTINGS mutations_sync = 2",
        ),
    ] {
        assert_eq!(
            rewrite_query("chpart", "t", rewrite, None),
            format!("SYSTEM START MERGES `chpart`.`t`;\n{run};\nSYSTEM STOP MERGES `chpart`.`t`;\n{list}")
        );
    }
    let relative = vec![(
        PathBuf::from("data/x.parquet"),
        "Parquet".into(),
        "id UInt64".into(),
    )];
    let err = build_query("DDL", "chpart", "t", &columns, relative).unwrap_err();
    assert_eq!(
        err,
        QueryError::RelativePath {
            path: PathBuf::from("data/x.parquet")
        }
    );
    assert_eq!(
        build_query("DDL", "chpart", "t", &columns, vec![]).unwrap_err(),
        QueryError::NoFiles
    );
}

#[test]
fn local_args_are_the_data_dir_and_the_query() {
    assert_eq!(
        local_args(Path::new("/w/ch"), "Q"),
        ["--path", "/w/ch", "--query", "Q"]
            .map(OsString::from)
            .to_vec()
    );
}

#[test]
fn tsv_unescaping() {
    let cases = [
        ("plain", "plain"),
        ("a\\tb", "a\tb"),
        ("a\\\\tb", "a\\tb"),
        ("x\\ny\\'z", "x\ny'z"),
        ("end\\", "end\\"),
    ];
    for (field, want) in cases {
        assert_eq!(unescape_tsv(field), want, "{field}");
    }
    assert_eq!(inspect_parts("", None).unwrap(), vec![]);
}

/// Runs `query` in the clickhouse-local data directory `data`, returning its output.
fn run_in(data: &Path, query: &str) -> String {
    let out = command()
        .run(&local_args(data, query))
        .unwrap_or_else(|e| panic!("{e}\n{query}"));
    String::from_utf8(out).unwrap()
}

/// 600 rows over 100 keys (each key six times, so every folding engine has something to fold)
/// in two months, from a `file()` the session writes itself.
fn folding_rows(dir: &Path) -> Vec<FileSource> {
    let file = dir.join("rows.tsv");
    let select = "SELECT toDateTime('2026-01-01 00:00:00', 'UTC') + toIntervalDay(number % 2 * 40) AS ts, \
                  number % 100 AS id, toUInt64(number) AS v, if(number % 4 < 2, 1, -1) AS sign FROM numbers(600)";
    run_in(
        &dir.join("gen"),
        &format!(
            "{select} INTO OUTFILE {} FORMAT TabSeparated",
            crate::sql::quote_os(file.as_os_str())
        ),
    );
    vec![(
        file,
        "TabSeparated".into(),
        "ts DateTime('UTC'), id UInt64, v UInt64, sign Int8".into(),
    )]
}

#[test]
fn every_engine_keeps_every_input_row() {
    // (engine, types of v and sign, sorting key): each would fold some of the 600 rows on
    // insert with optimize_on_insert left on (and mark its parts level 1).
    let engines = [
        ("MergeTree", "UInt64", "Int8", "id"),
        ("ReplacingMergeTree(v)", "UInt64", "Int8", "id"),
        ("SummingMergeTree", "UInt64", "Int8", "id"),
        (
            "AggregatingMergeTree",
            "SimpleAggregateFunction(max, UInt64)",
            "SimpleAggregateFunction(min, Int8)",
            "(id, ts)",
        ),
        ("CollapsingMergeTree(sign)", "UInt64", "Int8", "id"),
        (
            "VersionedCollapsingMergeTree(sign, v)",
            "UInt64",
            "Int8",
            "id",
        ),
    ];
    for (engine, v_type, sign_type, order) in engines {
        let work = WorkDir::create(&std::env::temp_dir(), "load-1", "attempt-engines").unwrap();
        let create = format!(
            "CREATE TABLE prod.t (`ts` DateTime('UTC'), `id` UInt64, `v` {v_type}, `sign` {sign_type}) \
             ENGINE = {engine} PARTITION BY toYYYYMM(ts) ORDER BY {order} SETTINGS index_granularity = 8192"
        );
        let ddl = local_table_ddl(&create, "chpart", "t").unwrap();
        let columns = ["ts", "id", "v", "sign"].map(String::from);
        let query = build_query(&ddl, "chpart", "t", &columns, folding_rows(work.path())).unwrap();
        let out = run_in(&work.path().join("ch"), &query);
        let parts = inspect_parts(&out, None).unwrap_or_else(|e| panic!("{engine}: {e}\n{out}"));
        let rows = names_and_rows(&parts);
        assert_eq!(
            rows,
            [("202601_1_1_0".into(), 300), ("202602_2_2_0".into(), 300)],
            "{engine}"
        );
    }
}

#[test]
fn expired_rows_are_removed_by_materialize_ttl_without_folding() {
    let work = WorkDir::create(&std::env::temp_dir(), "load-1", "attempt-ttl").unwrap();
    // Keys repeat (a merge would fold them); every other row is older than the TTL; a column
    // TTL resets `note` in rows older than 10 days.
    let create = "CREATE TABLE prod.t (`ts` DateTime('UTC'), `id` UInt64, `note` String TTL ts + toIntervalDay(10)) \
                  ENGINE = ReplacingMergeTree PARTITION BY id % 2 ORDER BY id % 10 \
                  TTL ts + toIntervalDay(30) SETTINGS index_granularity = 8192";
    let ddl = local_table_ddl(create, "chpart", "t").unwrap();
    let file = work.path().join("rows.tsv");
    let select = "SELECT now() - toIntervalDay(intDiv(number % 4, 2) * 20 + number % 4 % 2 * 40) AS ts, number AS id, 'n' AS note FROM numbers(400)";
    run_in(
        &work.path().join("gen"),
        &format!(
            "{select} INTO OUTFILE {} FORMAT TabSeparated",
            crate::sql::quote_os(file.as_os_str())
        ),
    );
    // number % 4: 0 -> now (live), 1 -> 40 days (expired), 2 -> 20 days (live, note reset),
    // 3 -> 60 days (expired); partitions by id % 2 = number % 2: partition 1 expires entirely.
    let source = vec![(
        file,
        "TabSeparated".into(),
        "ts DateTime('UTC'), id UInt64, note String".into(),
    )];
    let columns = ["ts", "id", "note"].map(String::from);
    let data = work.path().join("ch");
    let out = run_in(
        &data,
        &build_query(&ddl, "chpart", "t", &columns, source).unwrap(),
    );
    let inserted = inspect_parts(&out, None).unwrap();
    assert_eq!(inserted.iter().map(|p| p.rows).sum::<u64>(), 400);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(inserted.iter().all(|p| ttl_due(p, now).unwrap()));
    assert!(!inserted
        .iter()
        .any(|p| ttl_due(p, now - 100 * 86400).unwrap()));

    let out = run_in(
        &data,
        &rewrite_query("chpart", "t", Rewrite::ApplyTtl, None),
    );
    let err = inspect_parts(&out, None).unwrap_err().to_string();
    assert!(err.contains("it was mutated"), "{err}");
    let parts = inspect_parts(&out, Some(Rewrite::ApplyTtl)).unwrap_or_else(|e| panic!("{e}"));
    let rows: Vec<(String, u64, u32)> = parts
        .iter()
        .map(|p| (p.partition_id.to_string(), p.rows, p.level))
        .collect();
    assert_eq!(
        rows,
        [("0".into(), 200, 0), ("1".into(), 0, 0)],
        "the live half stays, unfolded"
    );
    let notes = run_in(
        &data,
        "SELECT note, count() FROM chpart.t GROUP BY note ORDER BY note FORMAT TabSeparated",
    );
    assert_eq!(notes, "\t100\nn\t100\n", "the column TTL applied too");
    // Then merged (a folding engine's build folds after TTL): merged parts keep the mutation
    // version in their names, which only MergeAfterTtl accepts.
    let out = run_in(
        &data,
        &rewrite_query("chpart", "t", Rewrite::MergeAfterTtl, None),
    );
    for refusing in [None, Some(Rewrite::Merge)] {
        let err = inspect_parts(&out, refusing).unwrap_err().to_string();
        assert!(err.contains("it was mutated"), "{refusing:?}: {err}");
    }
    let merged =
        inspect_parts(&out, Some(Rewrite::MergeAfterTtl)).unwrap_or_else(|e| panic!("{e}"));
    assert!(merged.iter().all(|p| p.level > 0), "{merged:?}");
}

#[test]
fn ttl_txt_says_when_a_rewrite_is_due() {
    let cases = [
        // (ttl.txt JSON, due at 1000)
        (r#"{"table":{"min":1000,"max":2000,"finished":0}}"#, true),
        (r#"{"table":{"min":1001,"max":2000,"finished":0}}"#, false),
        (
            r#"{"columns":[{"name":"c","min":5000,"max":6000},{"name":"d","min":10,"max":20}]}"#,
            true,
        ),
        (
            r#"{"group_by":[{"expression":"x","min":999,"max":999}]}"#,
            true,
        ),
        (
            r#"{"rows_where":[{"expression":"x","min":999,"max":999}]}"#,
            true,
        ),
        (
            r#"{"moves":[{"expression":"x","min":1,"max":1}],"recompression":[{"expression":"y","min":1,"max":1}]}"#,
            false,
        ),
        (r#"{"table":{"min":0,"max":0,"finished":0}}"#, false),
        ("{}", false),
    ];
    for (json, due) in cases {
        let text = format!("ttl format version: 1\n{json}");
        assert_eq!(ttl_text_due(&text, 1000), Ok(due), "{json}");
    }
    assert!(ttl_text_due("ttl format version: 2\n{}", 1000).is_err());
    assert!(ttl_text_due(
        r#"ttl format version: 1
{"table":{"max":1}}"#,
        1000
    )
    .unwrap_err()
    .contains("without a numeric min"));
}
