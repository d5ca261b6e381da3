//! A load's settings, fixed when it begins: what its rows do to the target ([`Mode`]) and
//! when readers see them ([`Visibility`]).

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a load's rows relate to what the target already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Add the load's rows to the target.
    Append,
    /// Replace each partition the load touches, atomically for readers (historical reloads).
    Replace,
    /// Replace the whole table at once: the load's rows become the table's only rows, built
    /// in the shadow and swapped in by one `EXCHANGE TABLES` (a daily snapshot of a dimension).
    Overwrite,
}

/// When the load's rows become visible to readers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Visibility {
    /// Each partition of the load appears at once (parts are attached into a shadow table,
    /// then each partition is moved or replaced into the target).
    Partition,
    /// Each part appears when it is attached into the target; the load as a whole is not
    /// atomic.
    Part,
}

impl Mode {
    /// `append` or `replace`, as in config and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Append => "append",
            Mode::Replace => "replace",
            Mode::Overwrite => "overwrite",
        }
    }
}

impl Visibility {
    /// `partition` or `part`, as in config and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Visibility::Partition => "partition",
            Visibility::Part => "part",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Visibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
