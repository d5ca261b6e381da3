//! Every MergeTree-family engine through `chpart begin / build / commit`, compared with a twin
//! table loaded by `INSERT ... SELECT` of the same rows; materialized views and TTL rules.

use std::path::PathBuf;
use std::process::Output;

use chpart_testenv::clickhouse::shared;

use crate::build::{manifest_of, write_rows, Setup};
use crate::cli::{chpart, text};

/// 400 rows, 50 keys (each eight times), two months; `sign` flips every 100 rows and `v`
/// repeats every 100, so rows `n` and `n + 100` are a collapsing pair of one version.
const ROWS: &str = "SELECT toDateTime('2026-01-01 00:00:00', 'UTC') + toIntervalDay(number % 2 * 40) AS ts, \
                    number % 50 AS id, number % 100 AS v, toInt8(if(intDiv(number, 100) % 2 = 0, 1, -1)) AS sign \
                    FROM numbers(400)";

/// A target `events` and its twin `twin` with one definition, a ledger and a config.
fn setup<'a>(
    ch: &'a chpart_testenv::clickhouse::ClickHouse,
    name: &str,
    columns: &str,
    engine: &str,
) -> Setup<'a> {
    Setup::with_tables(ch, name, columns, engine, &["events", "twin"])
}

fn ok(out: &Output, what: &str) {
    assert_eq!(out.status.code(), Some(0), "{what}: {}", text(out));
}

/// begin, one build of `rows`, commit; the manifest.
fn load(s: &Setup, load: &str, begin: &[&str], rows: &str) -> chpart_core::Manifest {
    load_files(s, load, begin, &[rows])
}

/// [`load`] of one build whose input is one Parquet file per query of `files`, with
/// `merge_split_partitions` on (a partition the files split is shipped as one part).
fn load_files(s: &Setup, load: &str, begin: &[&str], files: &[&str]) -> chpart_core::Manifest {
    ok(&s.begin(load, begin), "begin");
    let inputs: Vec<PathBuf> = files
        .iter()
        .enumerate()
        .map(|(i, rows)| {
            write_rows(
                s.dir.path(),
                &format!("{load}-{i}.parquet"),
                rows,
                "Parquet",
            )
        })
        .collect();
    let manifest = manifest_of(
        s.build_cmd(load, &format!("app-1.{load}"), 0)
            .env("CHPART_CLICKHOUSE_LOCAL_MERGE_SPLIT_PARTITIONS", "true")
            .arg("--input")
            .args(&inputs)
            .output()
            .unwrap(),
    )
    .unwrap_or_else(|o| panic!("build: {}", text(&o)));
    let winners: PathBuf = s.dir.path().join(format!("{load}.jsonl"));
    std::fs::write(&winners, manifest.to_json_line() + "\n").unwrap();
    let out = chpart()
        .args(["commit", "--config"])
        .arg(&s.config)
        .args(["--load", load, "--winners"])
        .arg(&winners)
        .output()
        .unwrap();
    ok(&out, "commit");
    manifest
}

fn all_rows(s: &Setup, table: &str, final_: &str) -> String {
    s.db.server.q(&format!(
        "SELECT * FROM `{}`.{table} {final_} ORDER BY ALL FORMAT TabSeparated",
        s.db.name
    ))
}

#[test]
fn every_engine_folds_the_loaded_rows_as_after_an_insert() {
    let ch = shared();
    let partition = "PARTITION BY toYYYYMM(ts)";
    // (name, columns, engine clause, visibilities)
    let plain = "ts DateTime('UTC'), id UInt64, v UInt64, sign Int8";
    let cases = [
        (
            "replacing",
            plain,
            format!("ENGINE = ReplacingMergeTree(v) {partition} ORDER BY id"),
            &["partition", "part"][..],
        ),
        (
            "summing",
            plain,
            format!("ENGINE = SummingMergeTree {partition} ORDER BY id"),
            &["partition"][..],
        ),
        (
            "aggregating",
            "ts DateTime('UTC'), id UInt64, v SimpleAggregateFunction(max, UInt64), sign SimpleAggregateFunction(sum, Int64)",
            format!("ENGINE = AggregatingMergeTree {partition} ORDER BY (id, ts)"),
            &["partition"][..],
        ),
        (
            "collapsing",
            plain,
            format!("ENGINE = CollapsingMergeTree(sign) {partition} ORDER BY id"),
            &["partition", "part"][..],
        ),
        (
            "versioned",
            plain,
            format!("ENGINE = VersionedCollapsingMergeTree(sign, v) {partition} ORDER BY id"),
            &["partition"][..],
        ),
    ];
    for (name, columns, engine, visibilities) in cases {
        for visibility in visibilities {
            let s = setup(ch, &format!("engine_{name}_{visibility}"), columns, &engine);
            let manifest = load(
                &s,
                &format!("e-{name}-{visibility}"),
                &["--visibility", visibility],
                ROWS,
            );
            let what = format!("{name}, --visibility {visibility}");
            // Every source row went into the parts, which then folded as an INSERT folds its
            // block: the manifest accounts for each row.
            assert_eq!(manifest.source_rows, 400, "{what}");
            assert!(manifest.folded_rows > 0, "{what}: the build folded nothing");
            assert_eq!(
                manifest.total_rows() + manifest.folded_rows + manifest.ttl_removed_rows,
                400,
                "{what}: parts + folded rows = source rows"
            );
            ch.q(&format!("INSERT INTO `{}`.twin {ROWS}", s.db.name));
            // What a reader sees right after the commit without FINAL (as most dashboards
            // query) is what it sees right after an INSERT of the same rows in one block.
            assert_eq!(
                all_rows(&s, "events", ""),
                all_rows(&s, "twin", ""),
                "{what}: without FINAL, right after the load"
            );
            // With FINAL, before any merge and after OPTIMIZE FINAL.
            let twin_final = all_rows(&s, "twin", "FINAL");
            assert_eq!(all_rows(&s, "events", "FINAL"), twin_final, "{what}: FINAL");
            for table in ["events", "twin"] {
                ch.q(&format!("OPTIMIZE TABLE `{}`.{table} FINAL", s.db.name));
            }
            let twin = all_rows(&s, "twin", "");
            assert_eq!(
                all_rows(&s, "events", ""),
                twin,
                "{what}: after OPTIMIZE FINAL"
            );
            let folded = twin.lines().count();
            assert!(
                folded < 400,
                "{what}: the engine folded nothing ({folded} rows)"
            );
        }
    }
}

#[test]
fn merge_folds_as_the_build_does_and_aggregate_states_are_refused_at_begin() {
    let ch = shared();
    let s = setup(
        ch,
        "engine_merge_folding",
        "ts DateTime('UTC'), id UInt64, v UInt64, sign Int8",
        "ENGINE = ReplacingMergeTree(v) PARTITION BY toYYYYMM(ts) ORDER BY id",
    );
    // A folding engine's build folds and merges each partition anyway: --merge changes nothing.
    ok(&s.begin("merge-folding-1", &[]), "begin");
    let input = write_rows(s.dir.path(), "m.parquet", ROWS, "Parquet");
    let manifests: Vec<chpart_core::Manifest> = [("app-1.1", true), ("app-2.1", false)]
        .iter()
        .map(|(attempt, merge)| {
            let mut cmd = s.build_cmd("merge-folding-1", attempt, 0);
            cmd.arg("--input").arg(&input);
            if *merge {
                cmd.arg("--merge");
            }
            manifest_of(cmd.output().unwrap()).unwrap_or_else(|o| panic!("build: {}", text(&o)))
        })
        .collect();
    let counts = |m: &chpart_core::Manifest| (m.parts.len(), m.total_rows(), m.folded_rows);
    assert_eq!(counts(&manifests[0]), counts(&manifests[1]));
    assert_eq!(manifests[0].parts.len(), 2, "one part per partition");

    let s = setup(
        ch,
        "engine_states_refused",
        "id UInt64, total AggregateFunction(sum, UInt64)",
        "ENGINE = AggregatingMergeTree ORDER BY id",
    );
    let out = s.begin("states-refused-1", &[]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("column `total` AggregateFunction(sum, UInt64)"),
        "{}",
        text(&out)
    );
}

#[test]
fn materialized_views_are_refused_unless_allowed() {
    let ch = shared();
    let s = setup(
        ch,
        "engine_mv",
        "ts DateTime('UTC'), id UInt64, v UInt64, sign Int8",
        "ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id",
    );
    ch.q(&format!(
        "CREATE MATERIALIZED VIEW `{0}`.by_id ENGINE = SummingMergeTree ORDER BY id AS SELECT id, count() AS n FROM `{0}`.events GROUP BY id",
        s.db.name
    ));
    let out = s.begin("mv-allowed-1", &[]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let message = text(&out);
    assert!(
        message.contains(&format!("{}.by_id", s.db.name))
            && message.contains("never see rows that arrive by ATTACH PART")
            && message.contains("--allow-materialized-views"),
        "{message}"
    );
    let manifest = load(&s, "mv-allowed-1", &["--allow-materialized-views"], ROWS);
    assert_eq!(manifest.total_rows(), 400);
    assert_eq!(
        ch.q(&format!("SELECT count() FROM `{}`.events", s.db.name)),
        "400\n"
    );
    assert_eq!(
        ch.q(&format!("SELECT count() FROM `{}`.by_id", s.db.name)),
        "0\n",
        "the view saw none of the attached rows (what the flag accepts)"
    );
}

#[test]
fn expired_rows_are_gone_right_after_the_commit_as_after_an_insert() {
    let ch = shared();
    // Half the rows expired long ago, half never expire; `note` has a column TTL.
    let select = |numbers: &str| {
        format!("SELECT if(number % 2 = 0, toDateTime('2001-01-01 00:00:00', 'UTC'), toDateTime('2100-01-01 00:00:00', 'UTC')) + toIntervalSecond(number) AS ts, \
                number AS id, 'n' AS note FROM {numbers}")
    };
    let rows = &select("numbers(800)");
    // In two files, so the build writes each of the two months as two parts: the expired rows
    // go first (MATERIALIZE TTL), then each month is merged into one part.
    let files = [select("numbers(0, 400)"), select("numbers(400, 400)")];
    for engine in ["MergeTree", "ReplacingMergeTree"] {
        let s = setup(
            ch,
            &format!("engine_ttl_{engine}"),
            "ts DateTime('UTC'), id UInt64, note String",
            &format!("ENGINE = {engine} PARTITION BY toYYYYMM(ts) ORDER BY id TTL ts + toIntervalDay(30)"),
        );
        let manifest = load_files(
            &s,
            &format!("ttl-{engine}"),
            &[],
            &files.each_ref().map(String::as_str),
        );
        assert_eq!(
            (
                manifest.source_rows,
                manifest.total_rows(),
                manifest.ttl_removed_rows,
                manifest.parts.len()
            ),
            (800, 400, 400, 1),
            "{engine}: the manifest accounts for the expired rows; the unexpired month is one part"
        );
        // Right after the commit, before any merge of the target.
        let loaded = all_rows(&s, "events", "");
        ch.q(&format!("INSERT INTO `{}`.twin {rows}", s.db.name));
        ch.q(&format!("OPTIMIZE TABLE `{}`.twin FINAL", s.db.name));
        assert_eq!(loaded, all_rows(&s, "twin", ""), "{engine}");
        assert_eq!(loaded.lines().count(), 400, "{engine}");
    }
}
