//! Scenario tables for the commit decisions, and a small model of the server and ledger in
//! which a driver made only of those decisions is killed at every step, or raced against a
//! second one.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::destination::DiskPlace;
use crate::fingerprint::TableFingerprint;
use crate::ids::{AttemptId, LoadId, PartitionId};
use crate::manifest::{count_txt_entry, FileEntry, Manifest, OtherDisk, PartEntry, Target};
use crate::names::{detached_part_name, PartName};
use crate::testutil::expect_row;
use crate::Attempt;

mod decisions;
mod plan;
mod races;
mod sim;
mod winners;

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

fn load() -> LoadId {
    "L".parse().unwrap()
}

fn fp(byte: &str) -> TableFingerprint {
    format!("sha256:{}", byte.repeat(32)).parse().unwrap()
}

fn expected() -> Expected {
    Expected {
        publish: "db.events_shadow".parse().unwrap(),
        fingerprint: fp("cd"),
        disks: vec![
            DiskPlace {
                disk: "default".into(),
                data_path: "/var/lib/clickhouse/store/abc/abcd".parse().unwrap(),
                staging_root: "/staging".parse().unwrap(),
            },
            DiskPlace {
                disk: "d2".into(),
                data_path: "/mnt/d2/store/abc/abcd".parse().unwrap(),
                staging_root: "/mnt/d2/staging".parse().unwrap(),
            },
        ],
        host: "ch-1".into(),
    }
}

/// A hash unique to a part name: 32 lowercase hex digits.
fn hash_of(name: &PartName) -> String {
    format!("{:032x}", name.min_block())
}

/// A valid manifest of `load` by `attempt` for Spark `partition`, with parts
/// (partition id, seq, rows), published as `expected()` says.
fn manifest(load: &str, partition: u32, attempt: &str, parts: &[(&str, u32, u64)]) -> Manifest {
    let (load, id): (LoadId, AttemptId) = (load.parse().unwrap(), attempt.parse().unwrap());
    let e = expected();
    let parts = parts
        .iter()
        .map(|&(pid, seq, rows)| {
            let partition_id: PartitionId = pid.parse().unwrap();
            let name = detached_part_name(&load, &id, &partition_id, seq);
            let file = |path: &str, size| FileEntry {
                path: path.into(),
                size,
                sha256: "ab".repeat(32),
            };
            PartEntry {
                hash_of_all_files: hash_of(&name),
                name,
                partition_id,
                seq,
                rows,
                bytes_on_disk: 10 + count_txt_entry(rows).size + rows,
                files: vec![
                    file("checksums.txt", 10),
                    count_txt_entry(rows),
                    file("data.bin", rows),
                ],
                disk: None,
            }
        })
        .collect();
    Manifest {
        target: Target {
            database: e.publish.database.clone(),
            table: e.publish.table.clone(),
            host: e.host.clone(),
            disk: "default".into(),
            data_path: e.disks[0].data_path.clone(),
            staging_dir: e.disks[0].staging().attempt(&load, &id).dir().clone(),
            other_disks: Vec::new(),
        },
        load,
        attempt: Attempt {
            id,
            partition,
            stage: Some(1),
            stage_attempt: Some(0),
            attempt_number: Some(0),
        },
        table_fingerprint: e.fingerprint,
        clickhouse_local_version: "26.9.2.1".into(),
        source_rows: 0,
        ttl_removed_rows: 0,
        folded_rows: 0,
        created_at_unix_ms: 1_764_490_000_000,
        phases: Default::default(),
        parts,
    }
}

/// Partition 0: attempt app.1, parts in 202601 (100 rows) and 202602 (50 rows).
fn m0() -> Manifest {
    manifest("L", 0, "app.1", &[("202601", 0, 100), ("202602", 1, 50)])
}

/// Partition 1: attempt app.7, one part in 202601 (30 rows).
fn m1() -> Manifest {
    manifest("L", 1, "app.7", &[("202601", 0, 30)])
}

/// Partition 2: attempt app.9, no rows, no parts.
fn m2() -> Manifest {
    manifest("L", 2, "app.9", &[])
}

fn lines(manifests: &[Manifest]) -> Vec<(usize, String)> {
    manifests
        .iter()
        .enumerate()
        .map(|(i, m)| (i + 1, m.to_json_line()))
        .collect()
}

fn winners(manifests: &[Manifest]) -> Winners {
    validate_winners(&load(), &expected(), &lines(manifests), None, false).unwrap()
}

fn plan(visibility: Visibility, mode: Mode) -> CommitPlan {
    CommitPlan::from_winners(&winners(&[m0(), m1(), m2()]), visibility, mode)
}
