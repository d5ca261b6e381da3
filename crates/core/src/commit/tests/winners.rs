//! Step 1: which manifests are accepted as winners, and how refusals read.

use super::*;

#[test]
fn winners_table() {
    type Lines = Vec<(usize, String)>;
    let base = || lines(&[m0(), m1(), m2()]);
    let with = |edit: fn(&mut Manifest)| {
        let mut m = m1();
        edit(&mut m);
        lines(&[m0(), m, m2()])
    };
    let garbage = || {
        let mut l = base();
        l.push((4, "{\"format\":\"chpart-attempt-manifest\",\"vers".into()));
        l
    };
    // (name, lines, expected_partitions, allow_missing, Ok(partitions) or every problem, in
    // order, by a substring)
    type Row<'a> = (
        &'a str,
        Lines,
        Option<u32>,
        bool,
        Result<Vec<u32>, Vec<&'a str>>,
    );
    let rows: Vec<Row> = vec![
        ("three winners, one without rows", base(), None, false, Ok(vec![0, 1, 2])),
        ("partition count given", base(), Some(3), false, Ok(vec![0, 1, 2])),
        (
            "lines in any order",
            lines(&[m2(), m0(), m1()]),
            Some(3),
            false,
            Ok(vec![0, 1, 2]),
        ),
        (
            "unparsable line",
            garbage(),
            None,
            false,
            Err(vec!["line 4 (partition ?, attempt ?): manifest is not valid JSON: EOF"]),
        ),
        (
            "invalid manifest: reported once, not also as a missing partition",
            {
                let mut l = base();
                l[1].1 = l[1].1.replace(&hash_of(&m1().parts[0].name), "XYZ");
                l
            },
            None,
            false,
            Err(vec![
                "line 2 (partition 1, attempt app.7): manifest of load L attempt app.7: part 202601_",
            ]),
        ),
        (
            "manifest of another load",
            lines(&[m0(), manifest("M", 1, "app.7", &[("202601", 0, 30)]), m2()]),
            None,
            false,
            Err(vec![
                "line 2 (partition 1, attempt app.7): manifest of load M, not of this load; its part 202601_",
                "line 2 (partition 1, attempt app.7): staging_dir /staging/M/app.7 is not /staging/L/app.7",
            ]),
        ),
        (
            "forged manifest pointing at another table",
            with(|m| m.target.table = "events".parse().unwrap()),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): its part 202601_"]),
        ),
        (
            "forged manifest pointing at another table: names both tables",
            with(|m| m.target.table = "events".parse().unwrap()),
            None,
            false,
            Err(vec!["were published into db.events, but this load publishes into db.events_shadow; refusing a manifest that points at another table"]),
        ),
        (
            "built for another table definition",
            with(|m| m.table_fingerprint = fp("ee")),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): its part 202601_"]),
        ),
        (
            "fingerprint named",
            with(|m| m.table_fingerprint = fp("ee")),
            None,
            false,
            Err(vec!["built for table fingerprint sha256:eeee"]),
        ),
        (
            "another data path",
            with(|m| m.target.data_path = "/var/lib/clickhouse/store/fff/ffff".parse().unwrap()),
            None,
            false,
            Err(vec!["published under data path /var/lib/clickhouse/store/fff/ffff, but the publish table's is /var/lib/clickhouse/store/abc/abcd"]),
        ),
        (
            "another host",
            with(|m| m.target.host = "ch-2".into()),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): its part 202601_"]),
        ),
        (
            "host named",
            with(|m| m.target.host = "ch-2".into()),
            None,
            false,
            Err(vec!["published on host ch-2, but this load publishes on ch-1"]),
        ),
        (
            "staging dir under another root",
            with(|m| m.target.staging_dir = "/other/L/app.7".parse().unwrap()),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): staging_dir /other/L/app.7 is not /staging/L/app.7, this attempt's directory under the configured staging root"]),
        ),
        (
            "a part on the load's second disk",
            with(|m| {
                m.target.other_disks.push(OtherDisk {
                    disk: "d2".into(),
                    data_path: "/mnt/d2/store/abc/abcd".parse().unwrap(),
                    staging_dir: "/mnt/d2/staging/L/app.7".parse().unwrap(),
                });
                m.parts[0].disk = Some("d2".into());
            }),
            None,
            false,
            Ok(vec![0, 1, 2]),
        ),
        (
            "a second disk's staging under another root",
            with(|m| {
                m.target.other_disks.push(OtherDisk {
                    disk: "d2".into(),
                    data_path: "/mnt/d2/store/abc/abcd".parse().unwrap(),
                    staging_dir: "/staging/L/app.7".parse().unwrap(),
                });
            }),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): staging_dir /staging/L/app.7 is not /mnt/d2/staging/L/app.7"]),
        ),
        (
            "a disk the load does not publish to",
            with(|m| m.target.disk = "d9".into()),
            None,
            false,
            Err(vec!["published on disk d9, but this load publishes on default, d2"]),
        ),
        (
            "part without rows",
            with(|m| {
                m.parts[0].rows = 0;
                m.parts[0].files[1] = count_txt_entry(0);
                m.parts[0].files[2].size = 0;
                m.parts[0].bytes_on_disk = 11;
            }),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): part 202601_"]),
        ),
        (
            "rows edited in a winners line: one problem, the partition is not also missing",
            with(|m| m.parts[0].rows += 1),
            None,
            false,
            Err(vec!["line 2 (partition 1, attempt app.7): manifest of load L attempt app.7: part 202601_"]),
        ),
        (
            "two winners for one partition",
            lines(&[m0(), m1(), m2(), manifest("L", 1, "app.8", &[("202601", 0, 30)])]),
            None,
            false,
            Err(vec!["partition 1 has two winners: attempt app.7 (line 2) and attempt app.8 (line 4); collect() returns one per partition — pass exactly what it returned"]),
        ),
        (
            "one attempt for two partitions",
            lines(&[m0(), m1(), manifest("L", 2, "app.7", &[("202603", 0, 1)])]),
            None,
            false,
            Err(vec!["attempt app.7 is given as the winner of two partitions: partition 1 (line 2) and partition 2 (line 3)"]),
        ),
        (
            "the same manifest twice: two winners and every part twice",
            lines(&[m0(), m1(), m2(), m0()]),
            None,
            false,
            Err(vec![
                "partition 0 has two winners: attempt app.1 (line 1) and attempt app.1 (line 4)",
                "part 202601_",
                "part 202602_",
            ]),
        ),
        (
            "the same part in two manifests names both",
            lines(&[m0(), m1(), m2(), m1()]),
            None,
            false,
            Err(vec![
                "partition 1 has two winners",
                "is listed by two manifests: partition 1 attempt app.7 (line 2) and partition 1 attempt app.7 (line 4)",
            ]),
        ),
        (
            "a gap is a missing partition",
            lines(&[m0(), m2()]),
            None,
            false,
            Err(vec!["partition 1 has no winner (winners were given for partitions up to 2); its rows would be lost"]),
        ),
        ("a gap, allowed", lines(&[m0(), m2()]), None, true, Ok(vec![0, 2])),
        (
            "last partition missing",
            base(),
            Some(4),
            false,
            Err(vec!["partition 3 has no winner (the job has partitions 0..4)"]),
        ),
        ("last partition missing, allowed", base(), Some(4), true, Ok(vec![0, 1, 2])),
        (
            "partition beyond the count",
            base(),
            Some(2),
            false,
            Err(vec!["line 3 (partition 2, attempt app.9): partition 2 is outside 0..2"]),
        ),
        (
            "partition beyond the count, even when missing ones are allowed",
            base(),
            Some(2),
            true,
            Err(vec!["partition 2 is outside 0..2"]),
        ),
        ("nothing given", vec![], None, false, Err(vec!["no winners were given"])),
        ("nothing given for a job without partitions", vec![], Some(0), false, Ok(vec![])),
        ("nothing given, allowed", vec![], None, true, Ok(vec![])),
        (
            "every problem at once",
            {
                let mut l = garbage();
                let mut m = m1();
                m.target.host = "ch-2".into();
                l[1].1 = m.to_json_line();
                l.push((5, manifest("L", 0, "app.3", &[]).to_json_line()));
                l
            },
            Some(4),
            false,
            Err(vec![
                "line 2 (partition 1, attempt app.7): its part 202601_",
                "line 4 (partition ?, attempt ?)",
                "partition 0 has two winners: attempt app.1 (line 1) and attempt app.3 (line 5)",
                "partition 3 has no winner",
            ]),
        ),
    ];
    for (row, lines, count, allow_missing, want) in rows {
        let got = validate_winners(&load(), &expected(), &lines, count, allow_missing);
        match (got, want) {
            (Ok(w), Ok(partitions)) => {
                assert_eq!(w.load(), &load(), "{row}");
                assert_eq!(
                    w.manifests().keys().copied().collect::<Vec<_>>(),
                    partitions,
                    "{row}"
                );
                for (p, m) in w.manifests() {
                    assert_eq!(m.attempt.partition, *p, "{row}");
                }
            }
            (Err(e), Err(want)) => {
                let got: Vec<String> = e.problems.iter().map(ToString::to_string).collect();
                assert_eq!(got.len(), want.len(), "{row}: {got:#?}");
                for (g, w) in got.iter().zip(&want) {
                    assert!(g.contains(w), "{row}: {g:?} lacks {w:?}");
                }
                // The whole message lists every problem, one per line.
                let msg = e.to_string();
                assert_eq!(msg.lines().count(), want.len() + 1, "{row}: {msg}");
            }
            (Ok(w), Err(want)) => panic!(
                "{row}: accepted {:?}, expected {want:?}",
                w.manifests().keys()
            ),
            (Err(e), Ok(_)) => panic!("{row}: refused: {e}"),
        }
    }
}

#[test]
fn winners_error_message_shape() {
    let err =
        validate_winners(&load(), &expected(), &lines(&[m0(), m2()]), Some(3), false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "refusing the winners of load L: 1 problem\n  - partition 1 has no winner (the job has \
         partitions 0..3); its rows would be lost — pass every manifest collect() returned, or \
         allow missing partitions"
    );
}

#[test]
fn part_lists_are_short() {
    let m = manifest(
        "L",
        0,
        "a",
        &[
            ("1", 0, 1),
            ("2", 1, 1),
            ("3", 2, 1),
            ("4", 3, 1),
            ("5", 4, 1),
        ],
    );
    let text = PartList::of(&m).to_string();
    assert!(text.starts_with("parts 1_"), "{text}");
    assert!(text.ends_with(" and 2 more"), "{text}");
    assert_eq!(PartList(vec![]).to_string(), "no parts");
}
