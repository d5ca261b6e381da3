//! chpart's pure model: the values every other crate agrees on.
//!
//! chpart loads batch-job output into ClickHouse exactly once: each task attempt builds
//! MergeTree parts outside the server, stages them under an attempt-scoped directory, renames
//! them into the table's `detached/` directory under names unique to the attempt, and writes a
//! manifest; the driver later attaches the winning attempts' parts by exact name. Everything
//! that decides *what* those names, paths and manifests are lives here, as functions from data
//! to data with no I/O, so that executor, driver and gc compute the same answers and the rules
//! can be tested with plain tables of cases.
//!
//! - [`ids`]: validated identifiers (load, attempt, partition, database, table).
//! - [`names`]: part directory names in `detached/`, and classifying what is found there.
//! - [`staging`]: remote POSIX paths, the attempt-scoped staging layout and the publish intent.
//! - [`destination`]: the disks a load publishes to, each with its data path and staging root.
//! - [`fingerprint`]: a digest of a table's shape, to refuse parts built for another schema.
//! - [`manifest`]: the versioned JSON an attempt writes last, and its validation.
//! - [`version`]: which clickhouse-local may build parts for which server.
//! - [`routing`]: a Distributed table's engine arguments, and the SQL that says which shard
//!   each row belongs to, exactly as ClickHouse routes it.
//! - [`time`]: UTC calendar arithmetic for dates given on the command line.
//! - [`text`]: short lists in messages (a few names and how many more).
//! - [`commit`]: the driver's decisions: which manifests win, the commit plan, and what a
//!   (re-)started commit does next from the ledger and fresh observations.

#![deny(missing_docs)]

mod canon;
pub mod commit;
pub mod destination;
pub mod events;
pub mod fingerprint;
pub mod ids;
pub mod manifest;
pub mod names;
pub mod retry;
pub mod routing;
pub mod sql;
pub mod staging;
#[cfg(test)]
mod testutil;
pub mod text;
pub mod time;
pub mod version;

pub use commit::{
    commit_phase, decide_part, decide_partition, plan_matches, reconcile_hashes, reconcile_rows,
    validate_winners, CommitEntry, CommitPhase, CommitPlan, CommitProgress, EntryIdError, Expected,
    ForeignPart, HashMismatch, Mode, PartFacts, PartLost, PartStep, PartitionBroken,
    PartitionFacts, PartitionStep, PlanConflict, PlanError, PlannedPart, PlannedPartition,
    RowMismatch, Visibility, Winners, WinnersError,
};
pub use destination::{
    disk_index, publish_disks, Destination, DestinationError, DiskInfo, DiskName, DiskPlace,
    StagingRoots, VolumeInfo,
};
pub use fingerprint::{ColumnShape, FingerprintError, TableFingerprint, TableShape};
pub use ids::{
    Attempt, AttemptId, DatabaseName, IdError, LoadId, PartitionId, TableName, TableRef,
};
pub use manifest::{
    FileEntry, Manifest, ManifestError, ManifestOrigin, OtherDisk, PartEntry, Phases, Target,
    MANIFEST_FORMAT, MANIFEST_VERSION,
};
pub use names::{detached_part_name, parse_detached_entry, DetachedEntry, PartName, PartNameError};
pub use routing::{DistributedEngine, Routing, RoutingError, ShardWeight, ShardingKey};
pub use staging::{
    attaching_part_path, detached_dir, detached_part_path, AttemptStaging, IntentError, PathError,
    PublishIntent, RemotePath, StagingLayout,
};
pub use version::{check_local_not_newer, VersionError};
