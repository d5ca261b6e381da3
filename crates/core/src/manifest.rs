//! The attempt manifest: what one completed attempt built and published.
//!
//! An executor writes it last (to `.manifest.json.tmp`, then renamed to `manifest.json`, see
//! `staging`), so its presence means the attempt finished; its JSON text also travels back to
//! the driver through Spark's `collect()`, which returns exactly one per partition, the first
//! successful attempt's. The driver commits from these manifests, so a manifest is untrusted
//! input until [`Manifest::from_json`] has accepted it:
//!
//! - the `format` and `version` fields are checked first, on the raw JSON, so a manifest from
//!   a newer chpart fails with "unsupported manifest version 2 (this chpart reads 1)" rather
//!   than a complaint about some field;
//! - the document is then read strictly: unknown, missing or duplicate fields and invalid ids
//!   are refused;
//! - finally [`Manifest::validate`] checks the rules that span fields. The most important: every
//!   part name must be the one [`detached_part_name`] derives from this manifest's load, attempt,
//!   partition and seq, so a manifest can never make the driver attach another attempt's part.
//!
//! Every error after the format check starts with "manifest of load L attempt A" (as far as the
//! raw JSON tells them) and names the part, file and field at fault.
//!
//! ```json
//! {"format":"chpart-attempt-manifest","version":1,"load":"L",
//!  "attempt":{"id":"app-1.17","partition":3,"stage":1,"stage_attempt":0,"attempt_number":0},
//!  "target":{"database":"db","table":"events","host":"ch-1","disk":"default",
//!            "data_path":"/var/lib/clickhouse/store/abc/abc…/",
//!            "staging_dir":"/var/lib/clickhouse/chpart-staging/L/app-1.17/"},
//!  "table_fingerprint":"sha256:<64 hex>","clickhouse_local_version":"26.9.2.1",
//!  "source_rows":1000,"created_at_unix_ms":1764490000000,
//!  "parts":[{"name":"202601_N_N_0","partition_id":"202601","seq":0,"rows":1000,
//!            "bytes_on_disk":12345,"hash_of_all_files":"<32 hex>",
//!            "files":[{"path":"data.bin","size":100,"sha256":"<64 hex>"}]}]}
//! ```

use std::collections::{HashMap, HashSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::canon::is_lower_hex;
use crate::fingerprint::TableFingerprint;
use crate::ids::{escape, show, Attempt, DatabaseName, LoadId, PartitionId, TableName};
use crate::names::{detached_part_name, PartName};
use crate::staging::{check_relative, PathError, RemotePath, StagingLayout};

/// The value of the `format` field.
pub const MANIFEST_FORMAT: &str = "chpart-attempt-manifest";

/// The manifest version this chpart writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

/// Files without which ClickHouse cannot attach a part: `checksums.txt` (ATTACH checks file
/// sizes against it) and `count.txt` (the row count).
const REQUIRED_FILES: [&str; 2] = ["checksums.txt", "count.txt"];

/// One attempt's manifest. Build it with struct syntax, check it with [`Manifest::validate`]
/// and write it with [`Manifest::to_json_line`]; read it only with [`Manifest::from_json`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The load this attempt belongs to.
    pub load: LoadId,
    /// The attempt that wrote the manifest.
    pub attempt: Attempt,
    /// Where the parts were published.
    pub target: Target,
    /// The shape of the table the parts were built for.
    pub table_fingerprint: TableFingerprint,
    /// `SELECT version()` of the clickhouse-local that built the parts (a part from a newer
    /// build may not attach to an older server).
    pub clickhouse_local_version: String,
    /// Rows this attempt read from its input. Not compared with the parts' rows here: what a
    /// difference means is the driver's decision.
    pub source_rows: u64,
    /// Of those, rows the table's TTL rules had already removed when the parts were built
    /// (expired by `TTL ... DELETE`, or folded by `TTL ... GROUP BY`), as the server's first TTL
    /// merge after an INSERT would: `build` checks `source_rows` = rows in the parts + this.
    /// Absent from the JSON when 0, so manifests of tables without TTL read as before.
    pub ttl_removed_rows: u64,
    /// Of those, rows the table's engine folded when the parts were built (Replacing,
    /// Summing, Aggregating, Collapsing and VersionedCollapsing fold each attempt's rows as an
    /// INSERT folds its block, `optimize_on_insert`), after the parts were checked to hold
    /// every input row: `build` checks `source_rows` = rows in the parts + TTL-removed rows +
    /// this. Absent from the JSON when 0.
    pub folded_rows: u64,
    /// When the attempt completed, milliseconds since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// When its phases ended, for the load's timeline (`status --timeline`).
    pub phases: Phases,
    /// The parts the attempt published, each in `detached/` under its name.
    pub parts: Vec<PartEntry>,
}

/// When an attempt started and when its build and upload ended, milliseconds since the Unix
/// epoch on the executor's clock (0: not recorded, e.g. a manifest written before chpart
/// recorded them). Publishing ends at `created_at_unix_ms`. Absent from the JSON when 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phases {
    /// The attempt started.
    pub started_at_unix_ms: u64,
    /// clickhouse-local finished building its parts.
    pub built_at_unix_ms: u64,
    /// Its parts were in staging.
    pub uploaded_at_unix_ms: u64,
}

/// Where an attempt published its parts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// Database of the table the parts are for.
    pub database: DatabaseName,
    /// The table (possibly a shadow table) whose `detached/` holds the parts.
    pub table: TableName,
    /// The ClickHouse host whose disk holds the parts.
    pub host: String,
    /// The ClickHouse disk (`system.disks.name`) whose data path holds the parts.
    pub disk: String,
    /// The table's data path on that disk (`system.tables.data_paths`); parts are in its
    /// `detached/`.
    pub data_path: RemotePath,
    /// The attempt's staging directory: `<staging root>/<load>/<attempt>`.
    pub staging_dir: RemotePath,
    /// The other disks of the table this attempt published parts on (a storage policy of
    /// several disks), each with its own data path and staging directory; the disk above is
    /// the attempt's home, where its manifest is. Absent from the JSON when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_disks: Vec<OtherDisk>,
}

/// A disk other than the home one an attempt published parts on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtherDisk {
    /// The disk (`system.disks.name`).
    pub disk: String,
    /// The table's data path on that disk; these parts are in its `detached/`.
    pub data_path: RemotePath,
    /// The attempt's staging directory on that disk: `<disk's staging root>/<load>/<attempt>`.
    pub staging_dir: RemotePath,
}

/// One published part.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartEntry {
    /// Its directory name in `detached/`, derived from (load, attempt, partition_id, seq).
    pub name: PartName,
    /// The partition its rows belong to.
    pub partition_id: PartitionId,
    /// The attempt's number for this part, unique within the attempt.
    pub seq: u32,
    /// Rows in the part.
    pub rows: u64,
    /// Sum of the sizes of its files.
    pub bytes_on_disk: u64,
    /// ClickHouse's `system.parts.hash_of_all_files` for the part (32 lowercase hex digits); it
    /// survives ATTACH, so the driver can find the part again after attaching it.
    pub hash_of_all_files: String,
    /// Every file of the part.
    pub files: Vec<FileEntry>,
    /// The disk whose `detached/` holds it, when not the target's (home) disk: one of
    /// `target.other_disks`. Absent from the JSON for a part on the home disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
}

/// One file of a part, so a copy can be verified end to end (ATTACH only checks sizes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Path relative to the part directory, e.g. `data.bin` or `p.proj/data.bin`.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the content, 64 lowercase hex digits.
    pub sha256: String,
}

/// The JSON document: header and body together, so that strict reading sees every field and
/// refuses duplicates, which reading into a generic JSON value first would silently merge.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    format: String,
    version: u32,
    load: LoadId,
    attempt: Attempt,
    target: Target,
    table_fingerprint: TableFingerprint,
    clickhouse_local_version: String,
    source_rows: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    ttl_removed_rows: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    folded_rows: u64,
    created_at_unix_ms: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    started_at_unix_ms: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    built_at_unix_ms: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    uploaded_at_unix_ms: u64,
    parts: Vec<PartEntry>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Which manifest an error is about, for the start of its message. Taken from the raw JSON
/// when the manifest could not be read, so the strings are escaped and may be `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestOrigin {
    /// The load id, or `?`.
    pub load: String,
    /// The attempt id, or `?`.
    pub attempt: String,
}

impl ManifestOrigin {
    fn peek(raw: &serde_json::Map<String, Value>) -> ManifestOrigin {
        let text = |v: Option<&Value>| {
            v.and_then(Value::as_str)
                .map_or_else(|| "?".to_string(), escape)
        };
        ManifestOrigin {
            load: text(raw.get("load")),
            attempt: text(raw.get("attempt").and_then(|a| a.get("id"))),
        }
    }

    fn of(m: &Manifest) -> ManifestOrigin {
        ManifestOrigin {
            load: m.load.to_string(),
            attempt: m.attempt.id.to_string(),
        }
    }
}

impl fmt::Display for ManifestOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "manifest of load {} attempt {}", self.load, self.attempt)
    }
}

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON at all, e.g. truncated by a crash while being written.
    #[error("manifest is not valid JSON: {source}")]
    Json {
        /// The parser's error, with line and column.
        source: serde_json::Error,
    },
    /// JSON, but not an object.
    #[error("manifest is not a JSON object")]
    NotAnObject,
    /// `format` is missing or not [`MANIFEST_FORMAT`].
    #[error("{origin}: field `format` is {found}, expected \"{MANIFEST_FORMAT}\"")]
    WrongFormat {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The value found, as JSON, or `missing`.
        found: String,
    },
    /// `version` is missing or not one this chpart reads.
    #[error("{origin}: unsupported manifest version {found} (this chpart reads {supported})")]
    UnsupportedVersion {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The value found, as JSON, or `missing`.
        found: String,
        /// The version this chpart reads.
        supported: u32,
    },
    /// A field is missing, unknown, repeated, of the wrong type or an invalid id.
    #[error("{origin}: {source}")]
    Schema {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The reader's error, naming the field or value, with line and column.
        source: serde_json::Error,
    },
    /// `target.staging_dir` is not `<root>/<load>/<attempt>` for this manifest's ids.
    #[error("{origin}: target.staging_dir {staging_dir} is not this attempt's staging directory (it must end with /{load}/{attempt})", load = .origin.load, attempt = .origin.attempt)]
    StagingDirMismatch {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The directory found.
        staging_dir: RemotePath,
    },
    /// A disk listed twice (the home disk also among `other_disks`, or one of those twice).
    #[error("{origin}: disk {disk} is listed twice in target")]
    DuplicateDisk {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The disk, quoted.
        disk: String,
    },
    /// A part on a disk the target does not list.
    #[error("{origin}: part {part}: disk {disk} is not one of the target's disks")]
    UnknownDisk {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part's name.
        part: String,
        /// The disk, quoted.
        disk: String,
    },
    /// A valid part name, but not of the shape chpart generates.
    #[error("{origin}: part {part}: not a name chpart generates (min block = max block >= 2^62, level 0, no mutation)")]
    NotChpartName {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part's name.
        part: String,
    },
    /// The name's partition differs from the part's `partition_id`.
    #[error("{origin}: part {part}: its name is in partition {in_name}, but partition_id is {partition_id}")]
    PartitionMismatch {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part's name.
        part: String,
        /// The partition in the name.
        in_name: PartitionId,
        /// The `partition_id` field.
        partition_id: PartitionId,
    },
    /// The name is not the one this attempt derives: a forged or copied entry.
    #[error("{origin}: part {part}: not the name attempt {attempt} derives for seq {seq} (that is {expected}); a manifest may only list its own attempt's parts", attempt = .origin.attempt)]
    ForeignPart {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part's name.
        part: String,
        /// Its `seq` field.
        seq: u32,
        /// The name the attempt derives for it.
        expected: String,
    },
    /// The same part name twice.
    #[error("{origin}: part {part} is listed twice")]
    DuplicatePart {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part's name.
        part: String,
    },
    /// Two parts with one seq.
    #[error("{origin}: part {part}: seq {seq} is already used by part {other}")]
    DuplicateSeq {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part listed second.
        part: String,
        /// The seq.
        seq: u32,
        /// The part listed first.
        other: String,
    },
    /// `hash_of_all_files` is not 32 lowercase hex digits.
    #[error("{origin}: part {part}: hash_of_all_files {value} is not 32 lowercase hex digits")]
    BadPartHash {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part's name.
        part: String,
        /// The value, quoted and truncated.
        value: String,
    },
    /// A file path that could escape the part directory or is not canonical.
    #[error("{origin}: part {part}: file {source}")]
    FilePath {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part's name.
        part: String,
        /// What is wrong with the path (the message names the path).
        source: PathError,
    },
    /// The same file twice in one part.
    #[error("{origin}: part {part}: file {file} is listed twice")]
    DuplicateFile {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part's name.
        part: String,
        /// The file, quoted.
        file: String,
    },
    /// A file's `sha256` is not 64 lowercase hex digits.
    #[error("{origin}: part {part}: file {file}: sha256 {value} is not 64 lowercase hex digits")]
    BadFileSha256 {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part's name.
        part: String,
        /// The file, quoted.
        file: String,
        /// The value, quoted and truncated.
        value: String,
    },
    /// A file every part must have is not listed.
    #[error("{origin}: part {part}: required file {file} is not listed")]
    MissingFile {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part's name.
        part: String,
        /// The missing file.
        file: &'static str,
    },
    /// `rows` is not what the part's `count.txt` holds (the manifest pins that file's digest,
    /// and ClickHouse reads the row count from it): an edited manifest.
    #[error("{origin}: part {part}: rows is {rows}, but its count.txt ({size} bytes, sha256 {sha256}) does not hold {rows}; the manifest was edited")]
    RowsMismatch {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part's name.
        part: String,
        /// The `rows` field.
        rows: u64,
        /// The listed size of `count.txt`.
        size: u64,
        /// The listed digest of `count.txt`.
        sha256: String,
    },
    /// `bytes_on_disk` differs from the sum of the file sizes.
    #[error("{origin}: part {part}: bytes_on_disk is {declared} but its files add up to {sum}")]
    BytesMismatch {
        /// Which manifest.
        origin: Box<ManifestOrigin>,
        /// The part's name.
        part: String,
        /// The `bytes_on_disk` field.
        declared: u64,
        /// The sum of the `size` fields.
        sum: u128,
    },
}

/// The file entry of a part's `count.txt` holding `rows`: ClickHouse writes the row count in
/// decimal and nothing else, so a manifest's `rows` is checked against the digest it lists.
pub fn count_txt_entry(rows: u64) -> FileEntry {
    let text = rows.to_string();
    FileEntry {
        path: "count.txt".into(),
        size: text.len() as u64,
        sha256: hex::encode(Sha256::digest(text.as_bytes())),
    }
}

/// A raw JSON value for an error message: its JSON text (already escaped), truncated, or
/// `missing`.
fn describe(value: Option<&Value>) -> String {
    const MAX_CHARS: usize = 80;
    let Some(value) = value else {
        return "missing".to_string();
    };
    let text = value.to_string();
    match text.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

impl Manifest {
    /// Reads and validates a manifest (see the module doc for the order of checks).
    pub fn from_json(text: &str) -> Result<Manifest, ManifestError> {
        let raw: Value =
            serde_json::from_str(text).map_err(|source| ManifestError::Json { source })?;
        let Value::Object(raw) = raw else {
            return Err(ManifestError::NotAnObject);
        };
        let origin = Box::new(ManifestOrigin::peek(&raw));
        let format = raw.get("format");
        if format.and_then(Value::as_str) != Some(MANIFEST_FORMAT) {
            return Err(ManifestError::WrongFormat {
                origin,
                found: describe(format),
            });
        }
        let version = raw.get("version");
        if version.and_then(Value::as_u64) != Some(MANIFEST_VERSION.into()) {
            let found = describe(version);
            return Err(ManifestError::UnsupportedVersion {
                origin,
                found,
                supported: MANIFEST_VERSION,
            });
        }
        let Document {
            format: _,
            version: _,
            load,
            attempt,
            target,
            table_fingerprint,
            clickhouse_local_version,
            source_rows,
            ttl_removed_rows,
            folded_rows,
            created_at_unix_ms,
            started_at_unix_ms,
            built_at_unix_ms,
            uploaded_at_unix_ms,
            parts,
        } = serde_json::from_str(text)
            .map_err(|source| ManifestError::Schema { origin, source })?;
        let manifest = Manifest {
            load,
            attempt,
            target,
            table_fingerprint,
            clickhouse_local_version,
            source_rows,
            ttl_removed_rows,
            folded_rows,
            created_at_unix_ms,
            phases: Phases {
                started_at_unix_ms,
                built_at_unix_ms,
                uploaded_at_unix_ms,
            },
            parts,
        };
        manifest.validate()?;
        Ok(manifest)
    }

    /// The manifest as one line of JSON (no newline inside or at the end), header first.
    /// Writers should [`validate`](Manifest::validate) first: readers will.
    pub fn to_json_line(&self) -> String {
        // Destructured so that a field added to `Manifest` but not to `Document` cannot compile.
        let Manifest {
            load,
            attempt,
            target,
            table_fingerprint,
            clickhouse_local_version,
            source_rows,
            ttl_removed_rows,
            folded_rows,
            created_at_unix_ms,
            phases,
            parts,
        } = self.clone();
        let doc = Document {
            format: MANIFEST_FORMAT.to_string(),
            version: MANIFEST_VERSION,
            load,
            attempt,
            target,
            table_fingerprint,
            clickhouse_local_version,
            source_rows,
            ttl_removed_rows,
            folded_rows,
            created_at_unix_ms,
            started_at_unix_ms: phases.started_at_unix_ms,
            built_at_unix_ms: phases.built_at_unix_ms,
            uploaded_at_unix_ms: phases.uploaded_at_unix_ms,
            parts,
        };
        // Cannot fail: every map key is a string and there are no floats.
        serde_json::to_string(&doc).expect("a manifest always serializes")
    }

    /// Every disk the attempt published on: (disk, the table's data path there, the attempt's
    /// staging directory there), the home disk first.
    pub fn disks(&self) -> impl Iterator<Item = (&str, &RemotePath, &RemotePath)> {
        let t = &self.target;
        std::iter::once((t.disk.as_str(), &t.data_path, &t.staging_dir)).chain(
            t.other_disks
                .iter()
                .map(|d| (d.disk.as_str(), &d.data_path, &d.staging_dir)),
        )
    }

    /// The table's data path on the disk that holds `part` (its `detached/` has the part).
    /// A part naming a disk the target does not list (which [`Manifest::validate`] refuses)
    /// gets the home disk's.
    pub fn data_path_of(&self, part: &PartEntry) -> &RemotePath {
        part.disk
            .as_deref()
            .and_then(|disk| self.disks().find(|(d, _, _)| *d == disk))
            .map_or(&self.target.data_path, |(_, data_path, _)| data_path)
    }

    /// Rows in all parts.
    pub fn total_rows(&self) -> u64 {
        self.parts
            .iter()
            .fold(0u64, |sum, p| sum.saturating_add(p.rows))
    }

    /// Checks the rules that span fields: the staging directory belongs to this attempt, each
    /// part name is the one this attempt derives for its partition and seq, names and seqs are
    /// unique, and each part's file list is safe, complete and adds up.
    pub fn validate(&self) -> Result<(), ManifestError> {
        let origin = || Box::new(ManifestOrigin::of(self));
        let attempt = &self.attempt.id;
        let mut disks = HashSet::new();
        for (disk, _, staging_dir) in self.disks() {
            if StagingLayout::containing_attempt_dir(staging_dir, &self.load, attempt).is_none() {
                return Err(ManifestError::StagingDirMismatch {
                    origin: origin(),
                    staging_dir: staging_dir.clone(),
                });
            }
            if !disks.insert(disk) {
                return Err(ManifestError::DuplicateDisk {
                    origin: origin(),
                    disk: show(disk),
                });
            }
        }
        let mut names = HashSet::new();
        let mut seqs: HashMap<u32, &PartName> = HashMap::new();
        for p in &self.parts {
            let part = || p.name.to_string();
            if !p.name.is_chpart_name() {
                return Err(ManifestError::NotChpartName {
                    origin: origin(),
                    part: part(),
                });
            }
            if p.name.partition_id() != &p.partition_id {
                return Err(ManifestError::PartitionMismatch {
                    origin: origin(),
                    part: part(),
                    in_name: p.name.partition_id().clone(),
                    partition_id: p.partition_id.clone(),
                });
            }
            let expected = detached_part_name(&self.load, attempt, &p.partition_id, p.seq);
            if p.name != expected {
                return Err(ManifestError::ForeignPart {
                    origin: origin(),
                    part: part(),
                    seq: p.seq,
                    expected: expected.to_string(),
                });
            }
            if let Some(disk) = p.disk.as_deref().filter(|d| !disks.contains(d)) {
                return Err(ManifestError::UnknownDisk {
                    origin: origin(),
                    part: part(),
                    disk: show(disk),
                });
            }
            if !names.insert(&p.name) {
                return Err(ManifestError::DuplicatePart {
                    origin: origin(),
                    part: part(),
                });
            }
            if let Some(other) = seqs.insert(p.seq, &p.name) {
                let other = other.to_string();
                return Err(ManifestError::DuplicateSeq {
                    origin: origin(),
                    part: part(),
                    seq: p.seq,
                    other,
                });
            }
            if !is_lower_hex(&p.hash_of_all_files, 32) {
                let value = show(&p.hash_of_all_files);
                return Err(ManifestError::BadPartHash {
                    origin: origin(),
                    part: part(),
                    value,
                });
            }
            let mut paths = HashSet::new();
            let mut sum: u128 = 0;
            for f in &p.files {
                check_relative(&f.path).map_err(|source| ManifestError::FilePath {
                    origin: origin(),
                    part: part(),
                    source,
                })?;
                if !paths.insert(f.path.as_str()) {
                    let file = show(&f.path);
                    return Err(ManifestError::DuplicateFile {
                        origin: origin(),
                        part: part(),
                        file,
                    });
                }
                if !is_lower_hex(&f.sha256, 64) {
                    let (file, value) = (show(&f.path), show(&f.sha256));
                    return Err(ManifestError::BadFileSha256 {
                        origin: origin(),
                        part: part(),
                        file,
                        value,
                    });
                }
                sum += u128::from(f.size);
            }
            if let Some(file) = REQUIRED_FILES.into_iter().find(|f| !paths.contains(f)) {
                return Err(ManifestError::MissingFile {
                    origin: origin(),
                    part: part(),
                    file,
                });
            }
            // ClickHouse writes count.txt as the row count in decimal, nothing else.
            if let Some(count) = p.files.iter().find(|f| f.path == "count.txt") {
                let want = count_txt_entry(p.rows);
                if (count.size, &count.sha256) != (want.size, &want.sha256) {
                    return Err(ManifestError::RowsMismatch {
                        origin: origin(),
                        part: part(),
                        rows: p.rows,
                        size: count.size,
                        sha256: count.sha256.clone(),
                    });
                }
            }
            if sum != u128::from(p.bytes_on_disk) {
                let declared = p.bytes_on_disk;
                return Err(ManifestError::BytesMismatch {
                    origin: origin(),
                    part: part(),
                    declared,
                    sum,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
