//! Names of part directories in a table's `detached/` directory.
//!
//! An attempt publishes each part it built by renaming it into `detached/`, and the driver later
//! runs `ALTER TABLE ... ATTACH PART '<name>'` for the winners only. ClickHouse accepts a name
//! there only if it parses as `<partition_id>_<min_block>_<max_block>_<level>[_<mutation>]`
//! with `0 <= min <= max <= i64::MAX`, and ATTACH PART ignores the block numbers (the part gets
//! fresh ones from the table's counter). So a name only has to be valid and *unique*, and
//! chpart derives it from who built the part:
//!
//! ```text
//! <partition_id>_<N>_<N>_0,  N = 2^62 + first 62 bits of
//!     sha256(len-prefixed "chpart-part-name-v1", load, attempt, partition_id, seq)
//! ```
//!
//! `N >= 2^62` keeps chpart's names apart from the block numbers ClickHouse hands out itself
//! (they start at 1 and grow by one per insert), and `N <= 2^63 - 1` keeps them valid. Since the
//! name is a pure function of (load, attempt, partition, seq), the executor, the driver and gc
//! agree on it without talking, and a manifest cannot claim a part it did not build (see
//! `manifest`).
//!
//! Uniqueness is probabilistic: two chpart parts of one partition present in `detached/` at the
//! same time collide with probability about `k^2 / 2^63` for `k` such parts (birthday bound over
//! 62 bits): about `1.1e-7` for a million, `1.1e-11` for ten thousand. A collision cannot corrupt
//! data silently: publishing renames without overwrite, so the second rename fails and the
//! attempt fails with an error.
//!
//! Directories in `detached/` may also carry a reason prefix (`attaching_<name>` while ATTACH
//! PART holds it, `broken_<name>`, `tmp_...`); [`parse_detached_entry`] classifies those.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::canon::Canon;
use crate::ids::{show, AttemptId, IdError, LoadId, PartitionId};

/// The smallest block number chpart puts in a name (2^62).
pub const CHPART_MIN_BLOCK: u64 = 1 << 62;

/// Prefixes ClickHouse gives detached directories to record why they are there (its
/// `DetachedPartInfo::DETACH_REASONS`) plus `tmp`, used by directories still being written.
/// A name with one of these prefixes is a reason followed by a name, never a part name.
const DETACH_REASONS: &[&str] = &[
    "broken",
    "unexpected",
    "noquorum",
    "ignored",
    "broken-on-start",
    "clone",
    "attaching",
    "deleting",
    "tmp-fetch",
    "covered-by-broken",
    "tmp",
];

/// A valid ClickHouse part directory name, kept in canonical form so that parsing and
/// displaying give back the exact directory name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PartName {
    partition_id: PartitionId,
    min_block: u64,
    max_block: u64,
    level: u32,
    mutation: Option<u64>,
}

/// Why a string is not a part name. `name` is the offending string, quoted and truncated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartNameError {
    /// A detach reason prefix such as `attaching_`.
    #[error("part name {name} starts with the detach reason {reason:?}: it names a reason and a part, not a part")]
    ReasonPrefix {
        /// The offending name.
        name: String,
        /// The reason found.
        reason: &'static str,
    },
    /// Not 4 or 5 `_`-separated fields.
    #[error("part name {name} has {found} '_'-separated fields; expected partition_min_max_level or partition_min_max_level_mutation")]
    FieldCount {
        /// The offending name.
        name: String,
        /// How many fields it has.
        found: usize,
    },
    /// The partition field is not a partition id.
    #[error("part name {name}: {source}")]
    PartitionId {
        /// The offending name.
        name: String,
        /// Why the partition field is invalid.
        source: IdError,
    },
    /// A numeric field is malformed or out of range.
    #[error("part name {name}: {field} {value} {problem}")]
    Number {
        /// The offending name.
        name: String,
        /// Which field: "min block", "max block", "level" or "mutation".
        field: &'static str,
        /// The field's text, quoted and truncated.
        value: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// `min_block > max_block`.
    #[error("part name {name}: min block {min} is greater than max block {max}")]
    MinAboveMax {
        /// The offending name.
        name: String,
        /// The min block.
        min: u64,
        /// The max block.
        max: u64,
    },
}

impl PartName {
    /// The partition the part belongs to; ClickHouse refuses to attach a part whose name's
    /// partition differs from the one its data computes.
    pub fn partition_id(&self) -> &PartitionId {
        &self.partition_id
    }

    /// The first block number (`0..=i64::MAX`).
    pub fn min_block(&self) -> u64 {
        self.min_block
    }

    /// The last block number (`min_block..=i64::MAX`).
    pub fn max_block(&self) -> u64 {
        self.max_block
    }

    /// The merge level.
    pub fn level(&self) -> u32 {
        self.level
    }

    /// The mutation version, when the name has a fifth field.
    pub fn mutation(&self) -> Option<u64> {
        self.mutation
    }

    /// True for the shape chpart generates (`min == max >= 2^62`, level 0, no mutation). ClickHouse
    /// never produces such a name itself, so gc can recognise chpart's parts in `detached/`; it
    /// still has to check the attempt (via manifests or publish intents) before deleting one.
    pub fn is_chpart_name(&self) -> bool {
        self.min_block == self.max_block
            && self.min_block >= CHPART_MIN_BLOCK
            && self.level == 0
            && self.mutation.is_none()
    }
}

/// The name under which `attempt` publishes its part number `seq` of `partition_id` in load
/// `load`. Deterministic; distinct inputs give distinct names except with the probability given
/// in the module doc. `seq` numbers the parts of one attempt and must not repeat within it.
pub fn detached_part_name(
    load: &LoadId,
    attempt: &AttemptId,
    partition_id: &PartitionId,
    seq: u32,
) -> PartName {
    let mut canon = Canon::new("chpart-part-name-v1");
    canon
        .str(load.as_str())
        .str(attempt.as_str())
        .str(partition_id.as_str())
        .u64(seq.into());
    let digest = canon.finish();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let block = CHPART_MIN_BLOCK + (u64::from_be_bytes(first) >> 2);
    PartName {
        partition_id: partition_id.clone(),
        min_block: block,
        max_block: block,
        level: 0,
        mutation: None,
    }
}

/// Parses a decimal field the way it must be spelled to survive a round trip: digits only, no
/// sign, no leading zero.
fn parse_number(
    name: &str,
    field: &'static str,
    text: &str,
    max: u64,
) -> Result<u64, PartNameError> {
    let err = |problem| PartNameError::Number {
        name: show(name),
        field,
        value: show(text),
        problem,
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err("is not a decimal number"));
    }
    if text.len() > 1 && text.starts_with('0') {
        return Err(err("has a leading zero (not how ClickHouse spells it)"));
    }
    match text.parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(err("is out of range")),
    }
}

fn reason_prefix(name: &str) -> Option<(&'static str, &str)> {
    DETACH_REASONS.iter().find_map(|&reason| {
        name.strip_prefix(reason)
            .and_then(|rest| rest.strip_prefix('_'))
            .map(|inner| (reason, inner))
    })
}

impl FromStr for PartName {
    type Err = PartNameError;

    fn from_str(name: &str) -> Result<Self, PartNameError> {
        // Reasons first, as ClickHouse does: "tmp_1_1_1_0" would otherwise read as a part of a
        // partition called "tmp".
        if let Some((reason, _)) = reason_prefix(name) {
            return Err(PartNameError::ReasonPrefix {
                name: show(name),
                reason,
            });
        }
        let fields: Vec<&str> = name.split('_').collect();
        if !(4..=5).contains(&fields.len()) {
            return Err(PartNameError::FieldCount {
                name: show(name),
                found: fields.len(),
            });
        }
        let partition_id =
            PartitionId::new(fields[0]).map_err(|source| PartNameError::PartitionId {
                name: show(name),
                source,
            })?;
        let block_max = i64::MAX as u64;
        let min_block = parse_number(name, "min block", fields[1], block_max)?;
        let max_block = parse_number(name, "max block", fields[2], block_max)?;
        let level = parse_number(name, "level", fields[3], u32::MAX.into())? as u32;
        let mutation = match fields.get(4) {
            Some(text) => Some(parse_number(name, "mutation", text, block_max)?),
            None => None,
        };
        if min_block > max_block {
            return Err(PartNameError::MinAboveMax {
                name: show(name),
                min: min_block,
                max: max_block,
            });
        }
        Ok(PartName {
            partition_id,
            min_block,
            max_block,
            level,
            mutation,
        })
    }
}

impl fmt::Display for PartName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}_{}_{}_{}",
            self.partition_id, self.min_block, self.max_block, self.level
        )?;
        if let Some(mutation) = self.mutation {
            write!(f, "_{mutation}")?;
        }
        Ok(())
    }
}

impl TryFrom<String> for PartName {
    type Error = PartNameError;
    fn try_from(s: String) -> Result<Self, PartNameError> {
        s.parse()
    }
}

impl From<PartName> for String {
    fn from(name: PartName) -> String {
        name.to_string()
    }
}

/// What a directory entry of `detached/` is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DetachedEntry {
    /// A part ATTACH PART can take by this name.
    Part(PartName),
    /// A reason prefix and what follows it, e.g. `attaching` and `202601_..._0` while an ATTACH
    /// PART holds the part, or `broken` and `202601_1_1_0_try1`. `inner` is not necessarily a
    /// valid part name.
    Reason {
        /// The reason (one of ClickHouse's detach reasons, or `tmp`).
        reason: &'static str,
        /// The rest of the name after `<reason>_`.
        inner: String,
    },
    /// Anything else (chpart never creates such entries in `detached/`).
    Other(String),
}

/// Classifies a directory name found in `detached/`.
pub fn parse_detached_entry(name: &str) -> DetachedEntry {
    if let Some((reason, inner)) = reason_prefix(name) {
        return DetachedEntry::Reason {
            reason,
            inner: inner.to_string(),
        };
    }
    match name.parse() {
        Ok(part) => DetachedEntry::Part(part),
        Err(_) => DetachedEntry::Other(name.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;
    use proptest::test_runner::{RngAlgorithm, TestRng};

    use super::*;
    use crate::testutil::expect_row;

    fn name(load: &str, attempt: &str, partition: &str, seq: u32) -> PartName {
        detached_part_name(
            &load.parse().unwrap(),
            &attempt.parse().unwrap(),
            &partition.parse().unwrap(),
            seq,
        )
    }

    #[test]
    fn part_name_table() {
        // (name, input, Ok((partition, min, max, level, mutation)) or an error substring)
        type Parsed = (&'static str, u64, u64, u32, Option<u64>);
        let rows: Vec<(&str, &str, Result<Parsed, &str>)> = vec![
            ("plain", "202601_1_1_0", Ok(("202601", 1, 1, 0, None))),
            ("merged", "all_1_7_2", Ok(("all", 1, 7, 2, None))),
            (
                "mutated",
                "202601-5_3_3_0_9",
                Ok(("202601-5", 3, 3, 0, Some(9))),
            ),
            ("zero block", "all_0_0_0", Ok(("all", 0, 0, 0, None))),
            ("negative partition", "-3_1_1_0", Ok(("-3", 1, 1, 0, None))),
            (
                "i64 max",
                "all_9223372036854775807_9223372036854775807_4294967295",
                Ok(("all", i64::MAX as u64, i64::MAX as u64, u32::MAX, None)),
            ),
            (
                "chpart shaped",
                "202601_4611686018427387904_4611686018427387904_0",
                Ok(("202601", 1 << 62, 1 << 62, 0, None)),
            ),
            (
                "attaching prefix",
                "attaching_202601_1_1_0",
                Err("detach reason \"attaching\""),
            ),
            (
                "ignored prefix",
                "ignored_202601_1_1_0",
                Err("detach reason \"ignored\""),
            ),
            (
                "broken prefix",
                "broken_all_1_1_0",
                Err("detach reason \"broken\""),
            ),
            (
                "tmp looks valid",
                "tmp_1_1_1_0",
                Err("detach reason \"tmp\""),
            ),
            (
                "broken-on-start",
                "broken-on-start_all_1_1_0",
                Err("detach reason \"broken-on-start\""),
            ),
            (
                "foreign prefix",
                "attempt_x_202601_1_1_0",
                Err("has 6 '_'-separated fields"),
            ),
            (
                "too few fields",
                "202601_1_1",
                Err("has 3 '_'-separated fields"),
            ),
            ("empty", "", Err("has 1 '_'-separated fields")),
            ("empty partition", "_1_1_0", Err("partition id is empty")),
            ("bad partition char", "20.26_1_1_0", Err("contains '.'")),
            (
                "min above max",
                "all_5_4_0",
                Err("min block 5 is greater than max block 4"),
            ),
            (
                "negative block",
                "all_-1_1_0",
                Err("min block \"-1\" is not a decimal number"),
            ),
            ("plus sign", "all_+1_1_0", Err("is not a decimal number")),
            (
                "empty field",
                "all__1_0",
                Err("min block \"\" is not a decimal number"),
            ),
            ("leading zero", "all_01_1_0", Err("leading zero")),
            (
                "block beyond i64",
                "all_1_9223372036854775808_0",
                Err("max block \"9223372036854775808\" is out of range"),
            ),
            (
                "level beyond u32",
                "all_1_1_4294967296",
                Err("level \"4294967296\" is out of range"),
            ),
            (
                "mutation garbage",
                "all_1_1_0_x",
                Err("mutation \"x\" is not a decimal number"),
            ),
            ("suffix", "all_1_1_0_try1", Err("mutation \"try1\"")),
            (
                "slash",
                "all_1_1_0/x",
                Err("level \"0/x\" is not a decimal number"),
            ),
        ];
        for (row, input, expected) in rows {
            let parsed = expect_row(row, input.parse::<PartName>(), expected.map(|_| ()));
            if let (Some(p), Ok(want)) = (parsed, expected) {
                let got = (
                    p.partition_id().as_str(),
                    p.min_block(),
                    p.max_block(),
                    p.level(),
                    p.mutation(),
                );
                assert_eq!(got, want, "{row}");
                assert_eq!(p.to_string(), input, "{row}: display round trip");
            }
        }
    }

    #[test]
    fn chpart_name_shape_table() {
        let rows = [
            ("generated", name("l", "a", "202601", 0).to_string(), true),
            (
                "2^62 exactly",
                "all_4611686018427387904_4611686018427387904_0".to_string(),
                true,
            ),
            (
                "below 2^62",
                "all_4611686018427387903_4611686018427387903_0".to_string(),
                false,
            ),
            ("ClickHouse's own", "202601_1_1_0".to_string(), false),
            (
                "range",
                "all_4611686018427387904_4611686018427387905_0".to_string(),
                false,
            ),
            (
                "level",
                "all_4611686018427387904_4611686018427387904_1".to_string(),
                false,
            ),
            (
                "mutation",
                "all_4611686018427387904_4611686018427387904_0_0".to_string(),
                false,
            ),
        ];
        for (row, input, expected) in rows {
            assert_eq!(
                input.parse::<PartName>().unwrap().is_chpart_name(),
                expected,
                "{row}"
            );
        }
    }

    #[test]
    fn detached_entry_table() {
        let part = |s: &str| DetachedEntry::Part(s.parse().unwrap());
        let reason = |r: &'static str, inner: &str| DetachedEntry::Reason {
            reason: r,
            inner: inner.into(),
        };
        let rows = [
            ("part", "202601_1_1_0", part("202601_1_1_0")),
            (
                "claimed by ATTACH",
                "attaching_202601_5_5_0",
                reason("attaching", "202601_5_5_0"),
            ),
            (
                "broken with try suffix",
                "broken_all_1_1_0_try2",
                reason("broken", "all_1_1_0_try2"),
            ),
            (
                "tmp",
                "tmp_clone_all_1_1_0",
                reason("tmp", "clone_all_1_1_0"),
            ),
            (
                "tmp-fetch",
                "tmp-fetch_all_1_1_0",
                reason("tmp-fetch", "all_1_1_0"),
            ),
            (
                "covered-by-broken",
                "covered-by-broken_all_1_1_0",
                reason("covered-by-broken", "all_1_1_0"),
            ),
            ("reason without name", "attaching_", reason("attaching", "")),
            (
                "bare reason word",
                "attaching",
                DetachedEntry::Other("attaching".into()),
            ),
            (
                "junk",
                "lost+found",
                DetachedEntry::Other("lost+found".into()),
            ),
            (
                "unknown prefix",
                "attempt_x_202601_1_1_0",
                DetachedEntry::Other("attempt_x_202601_1_1_0".into()),
            ),
        ];
        for (row, input, expected) in rows {
            assert_eq!(parse_detached_entry(input), expected, "{row}");
        }
    }

    #[test]
    fn names_are_deterministic_and_pinned() {
        let n = name("load-1", "app-1.7", "202601", 0);
        assert_eq!(n, name("load-1", "app-1.7", "202601", 0));
        // Pinned so that a change to the derivation (which would orphan published parts of
        // running loads) cannot go unnoticed.
        assert_eq!(n.to_string(), PINNED_NAME);
    }

    const PINNED_NAME: &str = "202601_6661751251419050227_6661751251419050227_0";

    #[test]
    fn field_splits_do_not_collide() {
        let rows = [
            (
                "load/attempt split",
                ("a.b", "c", "all", 0),
                ("a", "b.c", "all", 0),
            ),
            (
                "attempt/partition split",
                ("l", "a-1", "2", 0),
                ("l", "a", "1-2", 0),
            ),
            (
                "load/attempt swap",
                ("x", "y", "all", 0),
                ("y", "x", "all", 0),
            ),
            (
                "partition/seq digits",
                ("l", "a", "20260", 1),
                ("l", "a", "2026", 1),
            ),
            (
                "attempt/partition digits",
                ("l", "a1", "1", 0),
                ("l", "a", "11", 0),
            ),
        ];
        for (row, (l1, a1, p1, s1), (l2, a2, p2, s2)) in rows {
            assert_ne!(name(l1, a1, p1, s1), name(l2, a2, p2, s2), "{row}");
        }
    }

    fn run_id() -> impl Strategy<Value = String> {
        "[A-Za-z0-9_][A-Za-z0-9._-]{0,24}".prop_filter("no ..", |s| !s.contains(".."))
    }

    fn identity() -> impl Strategy<Value = (String, String, String, u32)> {
        (run_id(), run_id(), "[A-Za-z0-9-]{1,16}", any::<u32>())
    }

    proptest! {
        #[test]
        fn generated_names_parse_back((l, a, p, s) in identity()) {
            let n = name(&l, &a, &p, s);
            let parsed: PartName = n.to_string().parse().unwrap();
            prop_assert!(parsed.is_chpart_name());
            prop_assert_eq!(parsed.partition_id().as_str(), p.as_str());
            prop_assert!(parsed.min_block() <= i64::MAX as u64);
            prop_assert_eq!(parse_detached_entry(&n.to_string()), DetachedEntry::Part(n));
        }

        #[test]
        fn changing_one_component_changes_the_name(
            (l, a, p, s) in identity(),
            (l2, a2, p2, s2) in identity(),
        ) {
            let base = name(&l, &a, &p, s);
            if l2 != l { prop_assert_ne!(&base, &name(&l2, &a, &p, s)); }
            if a2 != a { prop_assert_ne!(&base, &name(&l, &a2, &p, s)); }
            if p2 != p { prop_assert_ne!(&base, &name(&l, &a, &p2, s)); }
            if s2 != s { prop_assert_ne!(&base, &name(&l, &a, &p, s2)); }
        }
    }

    /// A random string over `charset`, 1 to `max_len` bytes long, that `valid` accepts.
    fn random_string(
        rng: &mut TestRng,
        charset: &[u8],
        max_len: usize,
        valid: fn(&str) -> bool,
    ) -> String {
        loop {
            let len = rng.random_range(1..=max_len);
            let s: String = (0..len)
                .map(|_| charset[rng.random_range(0..charset.len())] as char)
                .collect();
            if valid(&s) {
                return s;
            }
        }
    }

    #[test]
    fn no_collisions_among_200k_random_identities() {
        // Drawn straight from a seeded RNG: regex strategies are too slow for 200k draws in a
        // debug build. Half the identities share a few loads and partitions and use small seqs
        // ("one attempt, many parts"), half are fully random ("many attempts").
        const RUN_ID: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
        const PARTITION: &[u8] = b"0123456789abcdef-";
        let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
        let run_id = |rng: &mut TestRng| random_string(rng, RUN_ID, 24, |s| LoadId::new(s).is_ok());
        let mut identities = HashSet::new();
        while identities.len() < 200_000 {
            let identity = if identities.len() % 2 == 0 {
                let partition = random_string(&mut rng, PARTITION, 12, |_| true);
                (
                    run_id(&mut rng),
                    run_id(&mut rng),
                    partition,
                    rng.random::<u32>(),
                )
            } else {
                let load = ["l1", "l2", "l.3"][rng.random_range(0..3)].to_string();
                let partition = ["all", "202601", "202601-5"][rng.random_range(0..3)].to_string();
                (load, run_id(&mut rng), partition, rng.random_range(0..64))
            };
            identities.insert(identity);
        }
        let names: HashSet<String> = identities
            .iter()
            .map(|(l, a, p, s)| name(l, a, p, *s).to_string())
            .collect();
        assert_eq!(names.len(), identities.len());
    }
}
