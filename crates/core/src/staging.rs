//! Remote paths: where an attempt stages its parts, and where they are published.
//!
//! Parts are uploaded to a staging directory on the ClickHouse host first and renamed into
//! `detached/` only when complete, because the rename is the one step that is atomic. Staging
//! must sit on the same filesystem as `detached/` (a rename across filesystems fails), so the
//! staging root is usually a directory next to the server's data, e.g.
//! `/var/lib/clickhouse/chpart-staging`. Every attempt owns one directory below it:
//!
//! ```text
//! <root>/<load>/                                  one load
//! <root>/<load>/<attempt>/                        one attempt; nothing else writes here
//! <root>/<load>/<attempt>/parts/<part name>/      an uploaded part, before publishing
//! <root>/<load>/<attempt>/publish-intent.json     written before parts move into detached/
//! <root>/<load>/<attempt>/.manifest.json.tmp      the manifest being written
//! <root>/<load>/<attempt>/manifest.json           present = the attempt completed
//! ```
//!
//! The publish intent exists so gc can find the published parts of an attempt that died after
//! renaming some of them but before writing its manifest. Since load and attempt ids are single
//! path components (see `ids`), two attempts never share a path and nothing escapes the root.
//!
//! Paths on the remote host are POSIX strings, not [`std::path::Path`]: the host running chpart
//! may not be the ClickHouse host and need not share its path syntax.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ids::{show, AttemptId, LoadId};
use crate::names::{PartName, PartNameError};

/// Why a string is not an acceptable path. `path` is the offending string, quoted and truncated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path is empty.
    #[error("path is empty")]
    Empty,
    /// A remote path that does not start with `/`.
    #[error("remote path {path} is not absolute")]
    NotAbsolute {
        /// The offending path.
        path: String,
    },
    /// A path meant to be relative starts with `/`.
    #[error("path {path} is absolute; expected a path relative to its directory")]
    Absolute {
        /// The offending path.
        path: String,
    },
    /// A `..` component. Refused rather than resolved: with symlinks on the remote host, text
    /// resolution can disagree with the filesystem.
    #[error("path {path} has a '..' component, so it could escape its directory")]
    ParentComponent {
        /// The offending path.
        path: String,
    },
    /// An empty or `.` component in a relative path: it would give one file two spellings.
    #[error("path {path} has an empty or '.' component")]
    NonCanonical {
        /// The offending path.
        path: String,
    },
    /// A backslash: not a separator on POSIX, but one on the host that may have written it.
    #[error("path {path} contains a backslash")]
    Backslash {
        /// The offending path.
        path: String,
    },
    /// A NUL byte, which no POSIX path can contain.
    #[error("path {path} contains a NUL byte")]
    Nul {
        /// The offending path.
        path: String,
    },
}

fn check_chars(path: &str) -> Result<(), PathError> {
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.contains('\0') {
        return Err(PathError::Nul { path: show(path) });
    }
    if path.contains('\\') {
        return Err(PathError::Backslash { path: show(path) });
    }
    Ok(())
}

/// Checks that `path` is a canonical relative path (`a/b.bin`): no leading `/`, no empty, `.`
/// or `..` component, no backslash or NUL. Such a path stays inside any directory it is joined
/// to, and two different strings always name two different files.
pub(crate) fn check_relative(path: &str) -> Result<(), PathError> {
    check_chars(path)?;
    if path.starts_with('/') {
        return Err(PathError::Absolute { path: show(path) });
    }
    // `..` first: escaping is the more serious of the two problems, so it is the one reported.
    if path.split('/').any(|c| c == "..") {
        return Err(PathError::ParentComponent { path: show(path) });
    }
    if path.split('/').any(|c| c.is_empty() || c == ".") {
        return Err(PathError::NonCanonical { path: show(path) });
    }
    Ok(())
}

/// An absolute, normalised POSIX path on a remote host: starts with `/`, no empty or `.`
/// components, no trailing `/` (except the root itself), no `..`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RemotePath(String);

impl RemotePath {
    /// Validates and normalises `path`: `//` and `.` components and a trailing `/` are dropped
    /// (`/var/lib/x/` and `/var//lib/./x` both become `/var/lib/x`); relative paths, `..`,
    /// backslashes and NUL are refused.
    pub fn new(path: &str) -> Result<RemotePath, PathError> {
        check_chars(path)?;
        if !path.starts_with('/') {
            return Err(PathError::NotAbsolute { path: show(path) });
        }
        let components: Vec<&str> = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        if components.contains(&"..") {
            return Err(PathError::ParentComponent { path: show(path) });
        }
        Ok(RemotePath(format!("/{}", components.join("/"))))
    }

    /// The path as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path below `self` named by the relative path `relative` (e.g. a file listed in a
    /// manifest, `p.proj/data.bin`). The result is always inside `self`.
    pub fn join(&self, relative: &str) -> Result<RemotePath, PathError> {
        check_relative(relative)?;
        Ok(self.child(relative))
    }

    /// Appends components already known to be valid (validated ids, part names, fixed names).
    fn child(&self, relative: &str) -> RemotePath {
        debug_assert!(
            check_relative(relative).is_ok(),
            "invalid component {relative:?}"
        );
        if self.0 == "/" {
            RemotePath(format!("/{relative}"))
        } else {
            RemotePath(format!("{}/{relative}", self.0))
        }
    }

    /// The containing directory; `None` for `/`.
    pub fn parent(&self) -> Option<RemotePath> {
        let (parent, _) = self.0.rsplit_once('/')?;
        match (parent, self.0.as_str()) {
            (_, "/") => None,
            ("", _) => Some(RemotePath("/".into())),
            _ => Some(RemotePath(parent.into())),
        }
    }

    /// The last component; `None` for `/`.
    pub fn file_name(&self) -> Option<&str> {
        self.0.rsplit('/').next().filter(|name| !name.is_empty())
    }

    /// True when `self` is `dir` or lies below it. Compares whole components, so `/a/bc` is not
    /// inside `/a/b`.
    pub fn is_inside(&self, dir: &RemotePath) -> bool {
        dir.0 == "/"
            || self.0 == dir.0
            || self
                .0
                .strip_prefix(dir.0.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
    }
}

impl FromStr for RemotePath {
    type Err = PathError;
    fn from_str(s: &str) -> Result<Self, PathError> {
        RemotePath::new(s)
    }
}

impl TryFrom<String> for RemotePath {
    type Error = PathError;
    fn try_from(s: String) -> Result<Self, PathError> {
        RemotePath::new(&s)
    }
}

impl From<RemotePath> for String {
    fn from(p: RemotePath) -> String {
        p.0
    }
}

impl fmt::Display for RemotePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for RemotePath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The staging tree under one root (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagingLayout {
    root: RemotePath,
}

impl StagingLayout {
    /// A layout rooted at `root`, which must be an absolute path without `..`.
    pub fn new(root: &str) -> Result<StagingLayout, PathError> {
        Ok(StagingLayout {
            root: RemotePath::new(root)?,
        })
    }

    /// The layout whose attempt directory for (`load`, `attempt`) is `attempt_dir`, if there is
    /// one, i.e. if `attempt_dir` ends with `/<load>/<attempt>`.
    pub fn containing_attempt_dir(
        attempt_dir: &RemotePath,
        load: &LoadId,
        attempt: &AttemptId,
    ) -> Option<StagingLayout> {
        let load_dir = attempt_dir
            .parent()
            .filter(|_| attempt_dir.file_name() == Some(attempt.as_str()))?;
        let root = load_dir
            .parent()
            .filter(|_| load_dir.file_name() == Some(load.as_str()))?;
        Some(StagingLayout { root })
    }

    /// The root directory.
    pub fn root(&self) -> &RemotePath {
        &self.root
    }

    /// `<root>/<load>`: everything staged for one load.
    pub fn load_dir(&self, load: &LoadId) -> RemotePath {
        self.root.child(load.as_str())
    }

    /// The paths of one attempt.
    pub fn attempt(&self, load: &LoadId, attempt: &AttemptId) -> AttemptStaging {
        AttemptStaging {
            dir: self.load_dir(load).child(attempt.as_str()),
        }
    }
}

/// The staging paths owned by one attempt; all lie inside [`AttemptStaging::dir`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptStaging {
    dir: RemotePath,
}

impl AttemptStaging {
    /// The paths inside `dir`, an attempt directory found by listing a load's staging (such as
    /// one gc renamed to take it away from its writer, which no load and attempt id name).
    pub fn in_dir(dir: RemotePath) -> AttemptStaging {
        AttemptStaging { dir }
    }

    /// `<root>/<load>/<attempt>`: the attempt's directory.
    pub fn dir(&self) -> &RemotePath {
        &self.dir
    }

    /// `<attempt dir>/parts`: holds uploaded parts until they are published.
    pub fn parts_dir(&self) -> RemotePath {
        self.dir.child("parts")
    }

    /// `<attempt dir>/parts/<name>`: one uploaded part, renamed to `detached/<name>` to publish.
    pub fn part_dir(&self, name: &PartName) -> RemotePath {
        self.parts_dir().child(&name.to_string())
    }

    /// `<attempt dir>/manifest.json`: present only once the attempt completed.
    pub fn manifest(&self) -> RemotePath {
        self.dir.child("manifest.json")
    }

    /// `<attempt dir>/.manifest.json.tmp`: the manifest is written here, then renamed.
    pub fn manifest_tmp(&self) -> RemotePath {
        self.dir.child(".manifest.json.tmp")
    }

    /// `<attempt dir>/publish-intent.json`: lists the parts about to be renamed into `detached/`.
    pub fn publish_intent(&self) -> RemotePath {
        self.dir.child("publish-intent.json")
    }
}

/// The contents of `publish-intent.json`: the parts an attempt is about to rename from one
/// disk's staging into that disk's `detached/`. The writer stores it (atomically) before its
/// first rename; gc drops a part in `detached/` only if an intent lists it, so an intent that
/// exists but does not parse is an error, never an empty list (see [`PublishIntent::from_json`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishIntent {
    /// The load the attempt belongs to.
    pub load: LoadId,
    /// The attempt that writes the intent.
    pub attempt: AttemptId,
    /// Where each part will be once published: `<data_path>/detached/<part name>`.
    pub detached: Vec<RemotePath>,
}

/// Why the contents of a `publish-intent.json` are not a publish intent.
#[derive(Debug, thiserror::Error)]
pub enum IntentError {
    /// Not JSON, or not the intent's schema (a field missing, an invalid id or path).
    #[error("not a publish intent: {0}")]
    Json(#[from] serde_json::Error),
    /// A listed path that does not end in a part name.
    #[error("listed path {path} does not end in a part name: {source}")]
    NotAPart {
        /// The listed path.
        path: RemotePath,
        /// Why its last component is no part name.
        source: PartNameError,
    },
}

impl PublishIntent {
    /// The intent as one line of JSON, as the writer stores it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a publish intent serializes")
    }

    /// Parses a stored intent. Fields other than the schema's are ignored.
    pub fn from_json(bytes: &[u8]) -> Result<PublishIntent, IntentError> {
        let intent: PublishIntent = serde_json::from_slice(bytes)?;
        intent.part_names()?;
        Ok(intent)
    }

    /// The names of the listed parts, in order.
    pub fn part_names(&self) -> Result<Vec<PartName>, IntentError> {
        self.detached
            .iter()
            .map(|path| {
                path.file_name()
                    .unwrap_or_default()
                    .parse()
                    .map_err(|source| IntentError::NotAPart {
                        path: path.clone(),
                        source,
                    })
            })
            .collect()
    }
}

/// `<data_path>/detached`, for a table data path from `system.tables.data_paths`.
pub fn detached_dir(data_path: &RemotePath) -> RemotePath {
    data_path.child("detached")
}

/// `<data_path>/detached/<name>`: where a published part lives until ATTACH PART takes it.
pub fn detached_part_path(data_path: &RemotePath, name: &PartName) -> RemotePath {
    detached_dir(data_path).child(&name.to_string())
}

/// `<data_path>/detached/attaching_<name>`: where ATTACH PART holds a part while it attaches
/// it (and where a server killed inside that ATTACH leaves it).
pub fn attaching_part_path(data_path: &RemotePath, name: &PartName) -> RemotePath {
    detached_dir(data_path).child(&format!("attaching_{name}"))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::names::detached_part_name;
    use crate::testutil::expect_row;

    #[test]
    fn remote_path_table() {
        let rows: Vec<(&str, &str, Result<&str, &str>)> = vec![
            ("plain", "/var/lib/clickhouse", Ok("/var/lib/clickhouse")),
            (
                "trailing slash",
                "/var/lib/clickhouse/",
                Ok("/var/lib/clickhouse"),
            ),
            ("double slash", "/var//lib", Ok("/var/lib")),
            ("dot", "/var/./lib/.", Ok("/var/lib")),
            ("root", "/", Ok("/")),
            ("root spelled oddly", "//./", Ok("/")),
            ("dot prefix names ok", "/a/.x/..y", Ok("/a/.x/..y")),
            ("empty", "", Err("path is empty")),
            (
                "relative",
                "var/lib",
                Err("remote path \"var/lib\" is not absolute"),
            ),
            ("dot dot", "/var/../etc", Err("has a '..' component")),
            ("trailing dot dot", "/var/..", Err("'..'")),
            ("backslash", "/var\\lib", Err("contains a backslash")),
            ("nul", "/var/\0", Err("contains a NUL byte")),
        ];
        for (row, input, expected) in rows {
            let got = expect_row(row, RemotePath::new(input), expected.map(|_| ()));
            if let (Some(path), Ok(want)) = (got, expected) {
                assert_eq!(path.as_str(), want, "{row}");
            }
        }
    }

    #[test]
    fn join_table() {
        let base = RemotePath::new("/d").unwrap();
        let rows: Vec<(&str, &str, Result<&str, &str>)> = vec![
            ("file", "data.bin", Ok("/d/data.bin")),
            (
                "projection file",
                "p.proj/data.bin",
                Ok("/d/p.proj/data.bin"),
            ),
            ("dotfile", ".hidden", Ok("/d/.hidden")),
            ("empty", "", Err("path is empty")),
            ("absolute", "/etc/passwd", Err("is absolute")),
            ("parent", "../x", Err("'..' component")),
            ("parent inside", "a/../../x", Err("'..' component")),
            ("dot", "./x", Err("empty or '.' component")),
            ("double slash", "a//b", Err("empty or '.' component")),
            ("trailing slash", "a/", Err("empty or '.' component")),
            ("backslash", "..\\x", Err("backslash")),
        ];
        for (row, input, expected) in rows {
            let got = expect_row(row, base.join(input), expected.map(|_| ()));
            if let (Some(path), Ok(want)) = (got, expected) {
                assert_eq!(path.as_str(), want, "{row}");
            }
        }
        let root = RemotePath::new("/").unwrap();
        assert_eq!(root.join("x").unwrap().as_str(), "/x");
    }

    #[test]
    fn parent_file_name_and_inside() {
        let p = |s: &str| RemotePath::new(s).unwrap();
        assert_eq!(p("/a/b").parent(), Some(p("/a")));
        assert_eq!(p("/a").parent(), Some(p("/")));
        assert_eq!(p("/").parent(), None);
        assert_eq!(p("/a/b").file_name(), Some("b"));
        assert_eq!(p("/").file_name(), None);
        let rows = [
            ("same", "/a/b", "/a/b", true),
            ("child", "/a/b/c", "/a/b", true),
            ("sibling with common prefix", "/a/bc", "/a/b", false),
            ("parent", "/a", "/a/b", false),
            ("under root", "/a", "/", true),
        ];
        for (row, path, dir, expected) in rows {
            assert_eq!(p(path).is_inside(&p(dir)), expected, "{row}");
        }
    }

    #[test]
    fn layout_paths() {
        let layout = StagingLayout::new("/var/lib/clickhouse/chpart-staging/").unwrap();
        let load: LoadId = "load-1".parse().unwrap();
        let attempt: AttemptId = "app-1.7".parse().unwrap();
        let a = layout.attempt(&load, &attempt);
        let name = detached_part_name(&load, &attempt, &"202601".parse().unwrap(), 0);
        let base = "/var/lib/clickhouse/chpart-staging/load-1/app-1.7";
        assert_eq!(
            layout.load_dir(&load).as_str(),
            "/var/lib/clickhouse/chpart-staging/load-1"
        );
        assert_eq!(a.dir().as_str(), base);
        assert_eq!(a.part_dir(&name).as_str(), format!("{base}/parts/{name}"));
        assert_eq!(a.manifest().as_str(), format!("{base}/manifest.json"));
        assert_eq!(
            a.manifest_tmp().as_str(),
            format!("{base}/.manifest.json.tmp")
        );
        assert_eq!(
            a.publish_intent().as_str(),
            format!("{base}/publish-intent.json")
        );

        let data = RemotePath::new("/var/lib/clickhouse/store/abc/abcdef/").unwrap();
        assert_eq!(
            detached_dir(&data).as_str(),
            "/var/lib/clickhouse/store/abc/abcdef/detached"
        );
        assert_eq!(
            detached_part_path(&data, &name).as_str(),
            format!("/var/lib/clickhouse/store/abc/abcdef/detached/{name}")
        );
    }

    #[test]
    fn containing_attempt_dir_table() {
        let load: LoadId = "L".parse().unwrap();
        let attempt: AttemptId = "A".parse().unwrap();
        let rows = [
            ("under a root", "/s/L/A", Some("/s")),
            ("under /", "/L/A", Some("/")),
            ("another attempt", "/s/L/B", None),
            ("another load", "/s/M/A", None),
            ("swapped", "/s/A/L", None),
            ("parts dir", "/s/L/A/parts", None),
            ("too short", "/A", None),
        ];
        for (row, dir, expected) in rows {
            let got = StagingLayout::containing_attempt_dir(
                &RemotePath::new(dir).unwrap(),
                &load,
                &attempt,
            );
            assert_eq!(got.as_ref().map(|l| l.root().as_str()), expected, "{row}");
            if let Some(layout) = got {
                assert_eq!(layout.attempt(&load, &attempt).dir().as_str(), dir, "{row}");
            }
        }
    }

    #[test]
    fn publish_intent_round_trips() {
        let load: LoadId = "load-1".parse().unwrap();
        let attempt: AttemptId = "app-1.7".parse().unwrap();
        let name = detached_part_name(&load, &attempt, &"202601".parse().unwrap(), 0);
        let data = RemotePath::new("/var/lib/clickhouse/store/abc/abcdef").unwrap();
        let intent = PublishIntent {
            load,
            attempt,
            detached: vec![detached_part_path(&data, &name)],
        };
        let json = intent.to_json();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&json).unwrap(),
            serde_json::json!({
                "load": "load-1",
                "attempt": "app-1.7",
                "detached": [format!("{data}/detached/{name}")],
            }),
            "the stored schema"
        );
        let read = PublishIntent::from_json(json.as_bytes()).unwrap();
        assert_eq!(read, intent);
        assert_eq!(read.part_names().unwrap(), vec![name]);
    }

    #[test]
    fn corrupt_publish_intent_table() {
        let part = "/d/detached/202601_1_1_0";
        let rows: Vec<(&str, String, Result<usize, &str>)> = vec![
            (
                "valid",
                format!(r#"{{"load":"L","attempt":"A","detached":["{part}"]}}"#),
                Ok(1),
            ),
            (
                "unknown field ignored",
                r#"{"load":"L","attempt":"A","detached":[],"x":1}"#.into(),
                Ok(0),
            ),
            ("empty file", String::new(), Err("not a publish intent")),
            ("garbage", "garbage".into(), Err("not a publish intent")),
            (
                "truncated",
                format!(r#"{{"load":"L","attempt":"A","detached":["{part}"#),
                Err("not a publish intent"),
            ),
            (
                "no detached",
                r#"{"load":"L","attempt":"A"}"#.into(),
                Err("missing field `detached`"),
            ),
            (
                "relative path",
                r#"{"load":"L","attempt":"A","detached":["d/detached/x"]}"#.into(),
                Err("not absolute"),
            ),
            (
                "not a part name",
                r#"{"load":"L","attempt":"A","detached":["/d/detached/x"]}"#.into(),
                Err("listed path /d/detached/x does not end in a part name"),
            ),
        ];
        for (row, json, expected) in rows {
            let got = expect_row(
                row,
                PublishIntent::from_json(json.as_bytes()),
                expected.map(|_| ()),
            );
            if let (Some(intent), Ok(parts)) = (got, expected) {
                assert_eq!(intent.detached.len(), parts, "{row}");
            }
        }
    }

    fn run_id() -> impl Strategy<Value = String> {
        "[A-Za-z0-9_][A-Za-z0-9._-]{0,12}".prop_filter("no ..", |s| !s.contains(".."))
    }

    /// Every path the layout gives one attempt, including a part directory.
    fn attempt_paths(layout: &StagingLayout, load: &str, attempt: &str) -> Vec<RemotePath> {
        let (load, attempt): (LoadId, AttemptId) =
            (load.parse().unwrap(), attempt.parse().unwrap());
        let a = layout.attempt(&load, &attempt);
        let part = detached_part_name(&load, &attempt, &"all".parse().unwrap(), 0);
        vec![
            a.dir().clone(),
            a.parts_dir(),
            a.part_dir(&part),
            a.manifest(),
            a.manifest_tmp(),
            a.publish_intent(),
        ]
    }

    proptest! {
        #[test]
        fn attempts_never_share_a_path(
            root in prop::sample::select(vec!["/", "/staging", "/var/lib/clickhouse/chpart-staging"]),
            (l1, a1) in (run_id(), run_id()),
            (l2, a2) in (run_id(), run_id()),
        ) {
            prop_assume!((&l1, &a1) != (&l2, &a2));
            let layout = StagingLayout::new(root).unwrap();
            let first = attempt_paths(&layout, &l1, &a1);
            let second = attempt_paths(&layout, &l2, &a2);
            for p in &first {
                prop_assert!(!p.is_inside(&second[0]), "{} is inside {}", p, second[0]);
            }
            for p in &second {
                prop_assert!(!p.is_inside(&first[0]), "{} is inside {}", p, first[0]);
            }
        }

        #[test]
        fn paths_stay_inside_their_root_and_attempt(
            root in prop::sample::select(vec!["/", "/staging", "/var/lib/clickhouse/chpart-staging"]),
            (load, attempt) in (run_id(), run_id()),
        ) {
            let layout = StagingLayout::new(root).unwrap();
            let paths = attempt_paths(&layout, &load, &attempt);
            for p in &paths {
                prop_assert!(p.is_inside(&paths[0]), "{} outside attempt dir {}", p, paths[0]);
                prop_assert!(p.is_inside(layout.root()) && p != layout.root(), "{} outside root", p);
                // A produced path is already normal: no `..`, `.`, `//` or trailing `/`.
                prop_assert_eq!(&RemotePath::new(p.as_str()).unwrap(), p);
                prop_assert!(!p.as_str().split('/').any(|c| c == ".."));
            }
        }
    }
}
