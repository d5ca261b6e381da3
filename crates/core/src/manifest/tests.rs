use std::fs;
use std::path::{Path, PathBuf};

use super::*;
use crate::ids::AttemptId;
use crate::testutil::expect_row;

fn file(path: &str, size: u64) -> FileEntry {
    FileEntry {
        path: path.into(),
        size,
        sha256: "ab".repeat(32),
    }
}

fn part(load: &LoadId, attempt: &AttemptId, partition: &str, seq: u32) -> PartEntry {
    let partition_id: PartitionId = partition.parse().unwrap();
    let files = vec![
        file("checksums.txt", 300),
        count_txt_entry(100),
        file("data.bin", 1000),
    ];
    PartEntry {
        name: detached_part_name(load, attempt, &partition_id, seq),
        partition_id,
        seq,
        rows: 100,
        bytes_on_disk: 1303,
        hash_of_all_files: "0f".repeat(16),
        files,
        disk: None,
    }
}

fn second_disk(staging_dir: &str) -> OtherDisk {
    OtherDisk {
        disk: "d2".into(),
        data_path: "/mnt/d2/store/abc/abcd/".parse().unwrap(),
        staging_dir: staging_dir.parse().unwrap(),
    }
}

/// A valid manifest of load `L`, attempt `A`, with parts (202601, 0), (202601, 1), (202602, 2).
fn valid() -> Manifest {
    let (load, attempt): (LoadId, AttemptId) = ("L".parse().unwrap(), "A".parse().unwrap());
    let parts = vec![
        part(&load, &attempt, "202601", 0),
        part(&load, &attempt, "202601", 1),
        part(&load, &attempt, "202602", 2),
    ];
    Manifest {
        target: Target {
            database: "db".parse().unwrap(),
            table: "events".parse().unwrap(),
            host: "ch-1".into(),
            disk: "default".into(),
            data_path: "/var/lib/clickhouse/store/abc/abcd/".parse().unwrap(),
            staging_dir: "/staging/L/A".parse().unwrap(),
            other_disks: Vec::new(),
        },
        load,
        attempt: Attempt {
            id: attempt,
            partition: 3,
            stage: None,
            stage_attempt: None,
            attempt_number: None,
        },
        table_fingerprint: format!("sha256:{}", "cd".repeat(32)).parse().unwrap(),
        clickhouse_local_version: "26.9.2.1".into(),
        source_rows: 300,
        ttl_removed_rows: 0,
        folded_rows: 0,
        created_at_unix_ms: 1_764_490_000_000,
        phases: Phases::default(),
        parts,
    }
}

#[test]
fn validate_table() {
    type Edit = fn(&mut Manifest);
    // (name, edit of a valid manifest, None if still valid or a substring of the error)
    let rows: Vec<(&str, Edit, Option<&str>)> = vec![
        ("unchanged", |_| {}, None),
        ("no parts (empty input)", |m| m.parts.clear(), None),
        ("staging dir under /", |m| m.target.staging_dir = "/L/A".parse().unwrap(), None),
        ("projection file", |m| m.parts[0].files[2].path = "p.proj/data.bin".into(), None),
        (
            "staging dir of another attempt",
            |m| m.target.staging_dir = "/staging/L/B".parse().unwrap(),
            Some("manifest of load L attempt A: target.staging_dir /staging/L/B is not this attempt's staging directory (it must end with /L/A)"),
        ),
        (
            "staging dir of another load",
            |m| m.target.staging_dir = "/staging/M/A".parse().unwrap(),
            Some("target.staging_dir /staging/M/A"),
        ),
        (
            "a part on a second disk",
            |m| {
                m.target.other_disks.push(second_disk("/staging2/L/A"));
                m.parts[1].disk = Some("d2".into());
            },
            None,
        ),
        (
            "a part naming the home disk",
            |m| m.parts[1].disk = Some("default".into()),
            None,
        ),
        (
            "a part on an unlisted disk",
            |m| m.parts[1].disk = Some("d2".into()),
            Some("manifest of load L attempt A: part 202601_"),
        ),
        (
            "a second disk's staging of another attempt",
            |m| m.target.other_disks.push(second_disk("/staging2/L/B")),
            Some("target.staging_dir /staging2/L/B is not this attempt's"),
        ),
        (
            "the home disk listed again",
            |m| {
                let mut d = second_disk("/staging2/L/A");
                d.disk = "default".into();
                m.target.other_disks.push(d);
            },
            Some("disk \"default\" is listed twice"),
        ),
        (
            "ClickHouse-style name",
            |m| m.parts[1].name = "202601_1_1_0".parse().unwrap(),
            Some("manifest of load L attempt A: part 202601_1_1_0: not a name chpart generates"),
        ),
        (
            "partition mismatch",
            |m| m.parts[2].partition_id = "202601".parse().unwrap(),
            Some("its name is in partition 202602, but partition_id is 202601"),
        ),
        (
            "another attempt's part",
            |m| {
                let other: AttemptId = "B".parse().unwrap();
                m.parts[0] = part(&m.load, &other, "202601", 0);
            },
            Some("not the name attempt A derives for seq 0"),
        ),
        (
            "another load's part",
            |m| m.parts[0] = part(&"M".parse().unwrap(), &m.attempt.id, "202601", 0),
            Some("a manifest may only list its own attempt's parts"),
        ),
        ("seq edited", |m| m.parts[1].seq = 7, Some("not the name attempt A derives for seq 7")),
        ("duplicate part", |m| m.parts.push(m.parts[0].clone()), Some("is listed twice")),
        (
            "duplicate seq",
            |m| {
                let p = part(&m.load, &m.attempt.id, "202602", 0);
                m.parts.push(p);
            },
            Some("seq 0 is already used by part 202601_"),
        ),
        (
            "short part hash",
            |m| m.parts[0].hash_of_all_files.pop().map_or((), drop),
            Some("hash_of_all_files \"0f0f"),
        ),
        ("parent path", |m| m.parts[0].files[2].path = "../x".into(), Some("file path \"../x\" has a '..' component")),
        ("absolute path", |m| m.parts[0].files[2].path = "/x".into(), Some("file path \"/x\" is absolute")),
        ("empty path", |m| m.parts[0].files[2].path = String::new(), Some("file path is empty")),
        ("dot path", |m| m.parts[0].files[2].path = "./data.bin".into(), Some("empty or '.' component")),
        ("backslash path", |m| m.parts[0].files[2].path = "a\\b".into(), Some("backslash")),
        ("nul path", |m| m.parts[0].files[2].path = "a\0".into(), Some("NUL")),
        (
            "duplicate file",
            |m| m.parts[0].files[2].path = "count.txt".into(),
            Some("file \"count.txt\" is listed twice"),
        ),
        (
            "uppercase sha256",
            |m| m.parts[0].files[1].sha256 = "AB".repeat(32),
            Some("file \"count.txt\": sha256 \"ABAB"),
        ),
        (
            "missing checksums.txt",
            |m| {
                m.parts[0].files.remove(0);
                m.parts[0].bytes_on_disk -= 300;
            },
            Some("required file checksums.txt is not listed"),
        ),
        (
            "missing count.txt",
            |m| {
                m.parts[0].files.remove(1);
                m.parts[0].bytes_on_disk -= 4;
            },
            Some("required file count.txt is not listed"),
        ),
        (
            "bytes mismatch",
            |m| m.parts[2].bytes_on_disk += 1,
            Some("bytes_on_disk is 1304 but its files add up to 1303"),
        ),
        (
            "huge sizes do not overflow",
            |m| {
                m.parts[0].files[2].size = u64::MAX;
                m.parts[0].files[0].size = u64::MAX;
            },
            Some("its files add up to 36893488147419103233"),
        ),
        (
            "rows edited, count.txt not",
            |m| m.parts[1].rows = 101,
            Some("rows is 101, but its count.txt (3 bytes, sha256 ad57366865126e55649ecb23ae1d48887544976efea46a48eb5d85a6eeb4d306) does not hold 101"),
        ),
        (
            "rows and count.txt's size edited, its digest not",
            |m| {
                m.parts[1].rows = 1000;
                m.parts[1].files[1].size = 4;
                m.parts[1].bytes_on_disk += 1;
            },
            Some("rows is 1000, but its count.txt (4 bytes"),
        ),
    ];
    for (row, edit, expected) in rows {
        let mut m = valid();
        edit(&mut m);
        let result = m.validate();
        if let Err(e) = &result {
            let msg = e.to_string();
            assert!(
                msg.starts_with("manifest of load L attempt A: "),
                "{row}: {msg}"
            );
        }
        expect_row(row, result, expected.map_or(Ok(()), Err));
    }
}

#[test]
fn json_round_trip() {
    let m = valid();
    let line = m.to_json_line();
    assert!(!line.contains('\n'), "{line}");
    assert!(
        line.starts_with(r#"{"format":"chpart-attempt-manifest","version":1,"load":"L","#),
        "{line}"
    );
    assert_eq!(Manifest::from_json(&line).unwrap(), m);
    assert_eq!(m.total_rows(), 300);
}

fn fixtures(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/manifests")
        .join(kind);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    files
}

fn file_name(path: &Path) -> &str {
    path.file_name().unwrap().to_str().unwrap()
}

#[test]
fn valid_fixtures_parse_and_round_trip() {
    let expected_rows = [("multi_partition.json", 53_731), ("one_part.json", 1000)];
    let files = fixtures("valid");
    let names: Vec<&str> = files.iter().map(|p| file_name(p)).collect();
    assert_eq!(
        names,
        expected_rows.map(|(n, _)| n),
        "every valid fixture needs a row here"
    );
    for (path, (_, rows)) in files.iter().zip(expected_rows) {
        let text = fs::read_to_string(path).unwrap();
        let m = Manifest::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(m.total_rows(), rows, "{}", path.display());
        assert_eq!(
            Manifest::from_json(&m.to_json_line()).unwrap(),
            m,
            "{}",
            path.display()
        );
    }
}

#[test]
fn invalid_fixtures_fail_with_their_error() {
    let expected: &[(&str, &str)] = &[
        ("absolute_file_path.json", "file path \"/etc/passwd\" is absolute"),
        ("attaching_prefix.json", "starts with the detach reason \"attaching\""),
        ("backslash_file_path.json", "file path \"..\\\\data.bin\" contains a backslash"),
        ("bad_fingerprint.json", "table fingerprint \"md5:0123\" is not"),
        ("bad_hash_of_all_files.json", "hash_of_all_files"),
        ("bad_load_id.json", "load id \"etl/2026-01-15\" contains '/'"),
        ("bad_sha256.json", "file \"data.bin\": sha256"),
        ("bytes_mismatch.json", "bytes_on_disk is 19048 but its files add up to 19047"),
        ("duplicate_file.json", "file \"columns.txt\" is listed twice"),
        ("duplicate_key.json", "duplicate field `load`"),
        ("duplicate_part.json", "is listed twice"),
        ("duplicate_seq.json", "seq 0 is already used by part 202601_"),
        ("foreign_staging_dir.json", "target.staging_dir /var/lib/clickhouse/chpart-staging/load-2026-01-15/app-20260115093000-0001.18 is not this attempt's"),
        ("forged_part_name.json", "not the name attempt app-20260115093000-0001.17 derives for seq 0"),
        ("missing_checksums.json", "required file checksums.txt is not listed"),
        ("missing_count.json", "required file count.txt is not listed"),
        ("missing_field.json", "missing field `source_rows`"),
        ("missing_version.json", "unsupported manifest version missing (this chpart reads 1)"),
        ("not_an_object.json", "manifest is not a JSON object"),
        ("not_chpart_name.json", "part 202601_1_1_0: not a name chpart generates"),
        ("partition_mismatch.json", "its name is in partition 202601, but partition_id is 202602"),
        ("path_traversal.json", "file path \"../../../../etc/cron.d/chpart\" has a '..' component"),
        ("relative_data_path.json", "remote path \"store/3f2/3f2a9c1e/\" is not absolute"),
        ("truncated.json", "manifest is not valid JSON: EOF while parsing"),
        ("unknown_field.json", "unknown field `compression`"),
        ("unknown_nested_field.json", "unknown field `host`"),
        ("unknown_version.json", "unsupported manifest version 2 (this chpart reads 1)"),
        ("wrong_format.json", "field `format` is \"chpart-manifest\", expected \"chpart-attempt-manifest\""),
    ];
    let files = fixtures("invalid");
    let names: Vec<&str> = files.iter().map(|p| file_name(p)).collect();
    let listed: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names, listed,
        "each invalid fixture needs exactly one row here, in name order"
    );
    for (path, (_, want)) in files.iter().zip(expected) {
        let text = fs::read_to_string(path).unwrap();
        let msg = match Manifest::from_json(&text) {
            Ok(_) => panic!("{} was accepted", path.display()),
            Err(e) => e.to_string(),
        };
        assert!(
            msg.contains(want),
            "{}: {msg:?} lacks {want:?}",
            path.display()
        );
        // Once the header is readable, every message says which manifest it is about.
        if !matches!(file_name(path), "truncated.json" | "not_an_object.json") {
            assert!(
                msg.starts_with("manifest of load "),
                "{}: {msg}",
                path.display()
            );
        }
    }
}
