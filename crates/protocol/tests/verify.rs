//! The parts waiting in detached/ are read back over several connections at once when a commit
//! has many (`PARALLEL_VERIFY_MIN` or more), over the real 26.9 engine: the problem reported is
//! still the first in the manifests' order, the same as one connection reading them in turn,
//! and nothing is attached.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::sync::atomic::Ordering::SeqCst;

use chpart_core::{detached_part_path, Manifest};
use chpart_protocol::commit::{commit, PARALLEL_VERIFY_MIN};
use chpart_protocol::ledger::Visibility;
use chpart_protocol::observe::Verify;
use chpart_testenv::clickhouse::{shared, TestDb};

/// Each waiting part's name and directory, in the manifests' order.
fn waiting_parts(built: &common::BuiltLoad) -> Vec<(String, String)> {
    built
        .winners
        .iter()
        .flat_map(|(_, line)| {
            let manifest = Manifest::from_json(line).unwrap();
            manifest
                .parts
                .iter()
                .map(|part| {
                    let dir = detached_part_path(manifest.data_path_of(part), &part.name);
                    (part.name.to_string(), dir.as_str().to_owned())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Overwrites the first byte of `dir`'s `checksums.txt` with another: same size, new content.
fn flip_a_byte(dir: &str) {
    let path = format!("{dir}/checksums.txt");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 0xff;
    let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.seek(SeekFrom::Start(0)).unwrap();
    file.write_all(&bytes[..1]).unwrap();
}

/// Appends a byte to `dir`'s `count.txt`: a size the manifest does not say.
fn grow(dir: &str) {
    let path = format!("{dir}/count.txt");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    file.write_all(b"0").unwrap();
}

#[test]
fn the_first_bad_part_in_the_manifests_order_is_reported_over_any_number_of_connections() {
    let ch = shared();
    let db = TestDb::new(ch, "verify_parallel");
    // 6 Spark partitions x 3 months: 18 parts, enough to be read over several connections.
    let mut built = common::built_load(&db, "t", 6, 3, Visibility::Part);
    let parts = waiting_parts(&built);
    assert!(parts.len() >= PARALLEL_VERIFY_MIN, "{} parts", parts.len());
    // Two parts changed in place (the 11th and the 16th), one grown (the 17th).
    let (first, second, grown) = (&parts[10], &parts[15], &parts[16]);
    flip_a_byte(&first.1);
    flip_a_byte(&second.1);
    grow(&grown.1);

    // (verify mode, connections, the part named, what is said of it)
    let rows = [
        (Verify::Full, 4, first, "changed after upload"),
        (Verify::Full, 1, first, "changed after upload"),
        (Verify::Sizes, 4, grown, "the manifest says"),
        (Verify::Sizes, 1, grown, "the manifest says"),
    ];
    let mut messages = Vec::new();
    for (verify, connections, named, said) in rows {
        built.verify_connections = connections;
        let opened_before = built.reach.opened.load(SeqCst);
        let mut request = built.request();
        request.verify = Some(verify);
        let err = built
            .rt
            .block_on(commit(&built.env(), request))
            .expect_err("a changed part must stop the commit")
            .to_string();
        let row = format!("{verify:?} over {connections} connection(s)");
        // The commit's own connection and the ones it opened for this.
        assert_eq!(
            built.reach.opened.load(SeqCst) - opened_before,
            connections - 1,
            "{row}: connections opened"
        );
        assert!(
            err.contains(&format!("part {} ", named.0)) && err.contains(said),
            "{row}: {err}"
        );
        for (other, _) in parts.iter().filter(|(name, _)| name != &named.0) {
            assert!(
                !err.contains(other.as_str()),
                "{row} names {other} too: {err}"
            );
        }
        messages.push(err);
    }
    // The same message whichever way the parts were read.
    assert_eq!(messages[0], messages[1]);
    assert_eq!(messages[2], messages[3]);

    // Nothing was attached: every part still waits in detached/, the table is empty.
    assert_eq!(
        ch.q(&format!("SELECT count() FROM `{}`.t", db.name)).trim(),
        "0"
    );
    for (name, dir) in &parts {
        assert!(std::path::Path::new(dir).is_dir(), "{name} left detached/");
    }
}
