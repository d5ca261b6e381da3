//! The guarantees of [`RemoteFs`], as checks that run against any backend.
//!
//! The publisher relies on these behaviours, so every implementation must
//! pass the same suite: the local one in a tempdir and SFTP against a real
//! sshd (see `crates/remote/tests/`). Each check panics with a message naming
//! the backend and the broken guarantee, and works in its own subdirectory of
//! `scratch`, so checks do not depend on each other. Expected values come from
//! data the checks generate themselves, never from the backend under test.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{join, FileKind, RemoteError, RemoteFs};

/// Runs every check; `scratch` is an existing, empty-enough remote directory
/// and `local_scratch` an existing local directory for generated sources.
pub fn run_all(fs: &dyn RemoteFs, scratch: &str, local_scratch: &Path) {
    stat_absent_is_none(fs, scratch);
    stat_reports_kind_and_size(fs, scratch);
    create_dir_all_is_idempotent(fs, scratch);
    create_dir_is_exclusive(fs, scratch);
    list_dir_of_missing_is_not_found(fs, scratch);
    list_dir_reports_entries_without_dot_entries(fs, scratch);
    read_file_of_missing_is_not_found(fs, scratch);
    upload_then_digest_matches_local(fs, scratch, local_scratch);
    consuming_upload_matches_local(fs, scratch, local_scratch);
    upload_into_existing_fails(fs, scratch, local_scratch);
    upload_into_missing_parent_is_not_found(fs, scratch, local_scratch);
    concurrent_uploads_to_one_name_have_one_winner(fs, scratch, local_scratch);
    rename_moves_a_directory(fs, scratch);
    rename_refuses_existing_target(fs, scratch);
    rename_of_missing_source_is_not_found(fs, scratch);
    write_file_atomic_leaves_no_temp(fs, scratch);
    write_file_atomic_refuses_existing(fs, scratch);
    remove_all_is_idempotent(fs, scratch);
    digest_dir_of_missing_is_not_found(fs, scratch);
}

/// A fresh subdirectory of `scratch` for one check.
fn fresh(fs: &dyn RemoteFs, scratch: &str, check: &str) -> String {
    let dir = join(scratch, check);
    fs.remove_all(&dir)
        .unwrap_or_else(|e| panic!("[{}] {check}: clearing {dir}: {e}", fs.describe()));
    fs.create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("[{}] {check}: creating {dir}: {e}", fs.describe()));
    dir
}

fn ok<T>(fs: &dyn RemoteFs, check: &str, what: &str, r: Result<T, RemoteError>) -> T {
    r.unwrap_or_else(|e| panic!("[{}] {check}: {what}: {e}", fs.describe()))
}

fn names(fs: &dyn RemoteFs, check: &str, dir: &str) -> Vec<String> {
    ok(fs, check, "list_dir", fs.list_dir(dir))
        .into_iter()
        .map(|e| e.name)
        .collect()
}

/// Deterministic bytes that differ per seed, so a swapped or truncated file shows.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A part-like local tree: nested directories, an empty file, an empty
/// directory, and a file spanning several 256 KiB write buffers with a ragged
/// tail. Returns its root and the expected digest, computed from the bytes.
fn make_local_tree(local_scratch: &Path, name: &str) -> (PathBuf, BTreeMap<String, (u64, String)>) {
    let root = local_scratch.join(name);
    let _ = fs::remove_dir_all(&root);
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("checksums.txt", pattern(1, 321)),
        (
            "columns.txt",
            b"columns format version: 1\n2 columns:\n`id` UInt64\n".to_vec(),
        ),
        ("count.txt", Vec::new()),
        ("data.bin", pattern(2, 4 * 256 * 1024 + 17)),
        ("proj.proj/data.bin", pattern(3, 70_000)),
        ("proj.proj/deep/x.idx", pattern(4, 5)),
    ];
    let mut expected = BTreeMap::new();
    for (rel, bytes) in &files {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().expect("tree files have a parent"))
            .unwrap_or_else(|e| panic!("create local dir for {}: {e}", path.display()));
        fs::write(&path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        expected.insert(
            rel.to_string(),
            (bytes.len() as u64, hex::encode(Sha256::digest(bytes))),
        );
    }
    fs::create_dir_all(root.join("empty_dir")).unwrap_or_else(|e| panic!("create empty_dir: {e}"));
    (root, expected)
}

pub fn stat_absent_is_none(fs: &dyn RemoteFs, scratch: &str) {
    let check = "stat_absent_is_none";
    let dir = fresh(fs, scratch, check);
    for path in [join(&dir, "missing"), join(&dir, "missing/deeper")] {
        let st = ok(fs, check, "stat", fs.stat(&path));
        assert!(
            st.is_none(),
            "[{}] {check}: stat({path}) = {st:?}",
            fs.describe()
        );
    }
}

pub fn stat_reports_kind_and_size(fs: &dyn RemoteFs, scratch: &str) {
    let check = "stat_reports_kind_and_size";
    let dir = fresh(fs, scratch, check);
    let file = join(&dir, "f");
    ok(
        fs,
        check,
        "write_file_atomic",
        fs.write_file_atomic(&file, b"12345"),
    );
    let st = ok(fs, check, "stat file", fs.stat(&file)).expect("written file must exist");
    assert_eq!(
        (st.kind, st.size),
        (FileKind::File, 5),
        "[{}] {check}: {st:?}",
        fs.describe()
    );
    assert!(
        st.mtime > 1_600_000_000,
        "[{}] {check}: implausible mtime {st:?}",
        fs.describe()
    );
    let st = ok(fs, check, "stat dir", fs.stat(&dir)).expect("scratch dir must exist");
    assert_eq!(
        st.kind,
        FileKind::Dir,
        "[{}] {check}: {st:?}",
        fs.describe()
    );
}

pub fn create_dir_all_is_idempotent(fs: &dyn RemoteFs, scratch: &str) {
    let check = "create_dir_all_is_idempotent";
    let dir = fresh(fs, scratch, check);
    let nested = join(&dir, "a/b/c");
    ok(fs, check, "first create", fs.create_dir_all(&nested));
    ok(fs, check, "second create", fs.create_dir_all(&nested));
    let st = ok(fs, check, "stat", fs.stat(&nested));
    assert_eq!(
        st.map(|s| s.kind),
        Some(FileKind::Dir),
        "[{}] {check}",
        fs.describe()
    );

    let file = join(&dir, "file");
    ok(fs, check, "write", fs.write_file_atomic(&file, b"x"));
    let err = fs.create_dir_all(&join(&file, "sub"));
    assert!(
        err.is_err(),
        "[{}] {check}: create_dir_all through a file succeeded",
        fs.describe()
    );
}

/// `create_dir` claims a name: exactly one of concurrent callers wins, anything already there
/// (a directory with content, a file) is refused and left as it was, a missing parent is
/// `NotFound`.
pub fn create_dir_is_exclusive(fs: &dyn RemoteFs, scratch: &str) {
    let check = "create_dir_is_exclusive";
    let dir = fresh(fs, scratch, check);
    let claimed = join(&dir, "claimed");
    ok(fs, check, "first create", fs.create_dir(&claimed));
    ok(
        fs,
        check,
        "write into it",
        fs.write_file_atomic(&join(&claimed, "intent"), b"mine"),
    );
    let file = join(&dir, "file");
    ok(fs, check, "write file", fs.write_file_atomic(&file, b"x"));
    for taken in [&claimed, &file] {
        match fs.create_dir(taken) {
            Err(RemoteError::AlreadyExists { path, .. }) => assert_eq!(&path, taken),
            other => panic!(
                "[{}] {check}: create_dir over {taken}: expected AlreadyExists, got {other:?}",
                fs.describe()
            ),
        }
    }
    assert_eq!(
        ok(
            fs,
            check,
            "read intent",
            fs.read_file(&join(&claimed, "intent"))
        ),
        b"mine",
        "[{}] {check}: a refused create_dir must not touch what is there",
        fs.describe()
    );
    assert_eq!(
        ok(fs, check, "stat file", fs.stat(&file)).map(|s| s.kind),
        Some(FileKind::File),
        "[{}] {check}",
        fs.describe()
    );
    match fs.create_dir(&join(&dir, "missing/child")) {
        Err(RemoteError::NotFound { .. }) => {}
        other => panic!(
            "[{}] {check}: missing parent: expected NotFound, got {other:?}",
            fs.describe()
        ),
    }

    let contended = join(&dir, "contended");
    let (winners, refused, results) = race(4, || fs.create_dir(&contended));
    assert_eq!(
        (winners, refused),
        (1, 3),
        "[{}] {check}: expected one creator and three refusals, got {results:?}",
        fs.describe()
    );
}

pub fn list_dir_of_missing_is_not_found(fs: &dyn RemoteFs, scratch: &str) {
    let check = "list_dir_of_missing_is_not_found";
    let dir = fresh(fs, scratch, check);
    let missing = join(&dir, "missing");
    match fs.list_dir(&missing) {
        Err(RemoteError::NotFound { path, .. }) => assert_eq!(path, missing),
        other => panic!(
            "[{}] {check}: expected NotFound, got {other:?}",
            fs.describe()
        ),
    }
}

pub fn list_dir_reports_entries_without_dot_entries(fs: &dyn RemoteFs, scratch: &str) {
    let check = "list_dir_reports_entries_without_dot_entries";
    let dir = fresh(fs, scratch, check);
    ok(fs, check, "mkdir", fs.create_dir_all(&join(&dir, "b_dir")));
    ok(
        fs,
        check,
        "write",
        fs.write_file_atomic(&join(&dir, "a_file"), b"abc"),
    );
    let entries = ok(fs, check, "list_dir", fs.list_dir(&dir));
    let got: Vec<(String, FileKind, Option<u64>)> = entries
        .iter()
        .map(|e| {
            let size = (e.stat.kind == FileKind::File).then_some(e.stat.size);
            (e.name.clone(), e.stat.kind, size)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("a_file".to_string(), FileKind::File, Some(3)),
            ("b_dir".to_string(), FileKind::Dir, None)
        ],
        "[{}] {check}",
        fs.describe()
    );
}

pub fn read_file_of_missing_is_not_found(fs: &dyn RemoteFs, scratch: &str) {
    let check = "read_file_of_missing_is_not_found";
    let dir = fresh(fs, scratch, check);
    match fs.read_file(&join(&dir, "missing")) {
        Err(RemoteError::NotFound { .. }) => {}
        other => panic!(
            "[{}] {check}: expected NotFound, got {other:?}",
            fs.describe()
        ),
    }
}

/// `upload_dir_consuming` lands the same tree as `upload_dir` and also refuses an existing
/// target.
pub fn consuming_upload_matches_local(fs: &dyn RemoteFs, scratch: &str, local_scratch: &Path) {
    let check = "consuming_upload_matches_local";
    let dir = fresh(fs, scratch, check);
    let (local, expected) = make_local_tree(local_scratch, check);
    let remote = join(&dir, "part_1_1_0");
    let stats = ok(
        fs,
        check,
        "upload_dir_consuming",
        fs.upload_dir_consuming(&local, &remote),
    );
    let expected_bytes: u64 = expected.values().map(|(size, _)| size).sum();
    assert_eq!(
        (stats.files, stats.bytes),
        (expected.len() as u64, expected_bytes),
        "[{}] {check}: upload stats",
        fs.describe()
    );
    let digest = ok(fs, check, "digest_dir", fs.digest_dir(&remote));
    assert_eq!(
        digest,
        expected,
        "[{}] {check}: remote digest",
        fs.describe()
    );
    let (again, _) = make_local_tree(local_scratch, "consuming_upload_again");
    let err = fs
        .upload_dir_consuming(&again, &remote)
        .expect_err("a second upload onto the name must fail");
    assert!(
        matches!(err, RemoteError::AlreadyExists { .. }),
        "[{}] {check}: expected AlreadyExists, got {err}",
        fs.describe()
    );
    let digest = ok(fs, check, "digest_dir", fs.digest_dir(&remote));
    assert_eq!(
        digest,
        expected,
        "[{}] {check}: the first upload is intact",
        fs.describe()
    );
}

pub fn upload_then_digest_matches_local(fs: &dyn RemoteFs, scratch: &str, local_scratch: &Path) {
    let check = "upload_then_digest_matches_local";
    let dir = fresh(fs, scratch, check);
    let (local, expected) = make_local_tree(local_scratch, check);
    let remote = join(&dir, "part_1_1_0");
    let stats = ok(fs, check, "upload_dir", fs.upload_dir(&local, &remote));
    let expected_bytes: u64 = expected.values().map(|(size, _)| size).sum();
    assert_eq!(
        (stats.files, stats.bytes),
        (expected.len() as u64, expected_bytes),
        "[{}] {check}: upload stats",
        fs.describe()
    );
    let digest = ok(fs, check, "digest_dir", fs.digest_dir(&remote));
    assert_eq!(
        digest,
        expected,
        "[{}] {check}: remote digest",
        fs.describe()
    );

    let data = ok(
        fs,
        check,
        "read_file",
        fs.read_file(&join(&remote, "proj.proj/data.bin")),
    );
    assert_eq!(
        data,
        pattern(3, 70_000),
        "[{}] {check}: read_file content",
        fs.describe()
    );
    let empty_dir = ok(
        fs,
        check,
        "stat empty_dir",
        fs.stat(&join(&remote, "empty_dir")),
    );
    assert_eq!(
        empty_dir.map(|s| s.kind),
        Some(FileKind::Dir),
        "[{}] {check}: empty directories are uploaded too",
        fs.describe()
    );
}

pub fn upload_into_existing_fails(fs: &dyn RemoteFs, scratch: &str, local_scratch: &Path) {
    let check = "upload_into_existing_fails";
    let dir = fresh(fs, scratch, check);
    let (local, _) = make_local_tree(local_scratch, check);
    let remote = join(&dir, "taken");
    ok(fs, check, "create target", fs.create_dir_all(&remote));
    ok(
        fs,
        check,
        "write marker",
        fs.write_file_atomic(&join(&remote, "marker"), b"first"),
    );
    match fs.upload_dir(&local, &remote) {
        Err(RemoteError::AlreadyExists { path, .. }) => assert_eq!(path, remote),
        other => panic!(
            "[{}] {check}: expected AlreadyExists, got {other:?}",
            fs.describe()
        ),
    }
    assert_eq!(
        names(fs, check, &remote),
        vec!["marker".to_string()],
        "[{}] {check}: a refused upload must not touch the existing directory",
        fs.describe()
    );
}

pub fn upload_into_missing_parent_is_not_found(
    fs: &dyn RemoteFs,
    scratch: &str,
    local_scratch: &Path,
) {
    let check = "upload_into_missing_parent_is_not_found";
    let dir = fresh(fs, scratch, check);
    let (local, _) = make_local_tree(local_scratch, check);
    match fs.upload_dir(&local, &join(&dir, "missing/part")) {
        Err(RemoteError::NotFound { .. }) => {}
        other => panic!(
            "[{}] {check}: expected NotFound, got {other:?}",
            fs.describe()
        ),
    }
}

pub fn concurrent_uploads_to_one_name_have_one_winner(
    fs: &dyn RemoteFs,
    scratch: &str,
    local_scratch: &Path,
) {
    let check = "concurrent_uploads_to_one_name_have_one_winner";
    let dir = fresh(fs, scratch, check);
    let (local, expected) = make_local_tree(local_scratch, check);
    let remote = join(&dir, "part");
    let (winners, refused, results) = race(3, || fs.upload_dir(&local, &remote));
    assert_eq!(
        (winners, refused),
        (1, 2),
        "[{}] {check}: expected one upload to win and two to be refused, got {results:?}",
        fs.describe()
    );
    let digest = ok(fs, check, "digest_dir", fs.digest_dir(&remote));
    assert_eq!(
        digest,
        expected,
        "[{}] {check}: the winner's content",
        fs.describe()
    );
}

pub fn rename_moves_a_directory(fs: &dyn RemoteFs, scratch: &str) {
    let check = "rename_moves_a_directory";
    let dir = fresh(fs, scratch, check);
    let from = join(&dir, "staging/part_tmp");
    let to = join(&dir, "detached/part_unique");
    ok(fs, check, "mkdir staging", fs.create_dir_all(&from));
    ok(
        fs,
        check,
        "mkdir detached",
        fs.create_dir_all(&join(&dir, "detached")),
    );
    ok(
        fs,
        check,
        "write",
        fs.write_file_atomic(&join(&from, "data.bin"), b"payload"),
    );
    ok(fs, check, "rename", fs.rename_noreplace(&from, &to));
    assert!(
        ok(fs, check, "stat source", fs.stat(&from)).is_none(),
        "[{}] {check}: source still present after rename",
        fs.describe()
    );
    let moved = ok(
        fs,
        check,
        "read moved",
        fs.read_file(&join(&to, "data.bin")),
    );
    assert_eq!(moved, b"payload", "[{}] {check}", fs.describe());
}

pub fn rename_refuses_existing_target(fs: &dyn RemoteFs, scratch: &str) {
    let check = "rename_refuses_existing_target";
    let dir = fresh(fs, scratch, check);

    // Directory onto a non-empty directory, then onto an empty one: rename(2)
    // itself would replace the empty one.
    let src = join(&dir, "src_dir");
    ok(fs, check, "mkdir src", fs.create_dir_all(&src));
    ok(
        fs,
        check,
        "write src",
        fs.write_file_atomic(&join(&src, "f"), b"new"),
    );
    let full = join(&dir, "full_dir");
    ok(fs, check, "mkdir full", fs.create_dir_all(&full));
    ok(
        fs,
        check,
        "write full",
        fs.write_file_atomic(&join(&full, "f"), b"old"),
    );
    let empty = join(&dir, "empty_dir");
    ok(fs, check, "mkdir empty", fs.create_dir_all(&empty));
    for target in [&full, &empty] {
        match fs.rename_noreplace(&src, target) {
            Err(RemoteError::AlreadyExists { path, .. }) => assert_eq!(&path, target),
            other => panic!(
                "[{}] {check}: dir onto existing dir {target}: expected AlreadyExists, got {other:?}",
                fs.describe()
            ),
        }
    }
    assert_eq!(
        ok(fs, check, "read full", fs.read_file(&join(&full, "f"))),
        b"old"
    );
    assert!(
        names(fs, check, &empty).is_empty(),
        "[{}] {check}: empty target changed",
        fs.describe()
    );
    assert_eq!(
        ok(fs, check, "read src", fs.read_file(&join(&src, "f"))),
        b"new"
    );

    // File onto file, and file onto directory.
    let src_file = join(&dir, "src_file");
    let dst_file = join(&dir, "dst_file");
    ok(
        fs,
        check,
        "write src file",
        fs.write_file_atomic(&src_file, b"new"),
    );
    ok(
        fs,
        check,
        "write dst file",
        fs.write_file_atomic(&dst_file, b"old"),
    );
    for target in [&dst_file, &full] {
        match fs.rename_noreplace(&src_file, target) {
            Err(RemoteError::AlreadyExists { path, .. }) => assert_eq!(&path, target),
            other => panic!(
                "[{}] {check}: file onto {target}: expected AlreadyExists, got {other:?}",
                fs.describe()
            ),
        }
    }
    assert_eq!(
        ok(fs, check, "read dst file", fs.read_file(&dst_file)),
        b"old"
    );
    assert_eq!(
        ok(fs, check, "read src file", fs.read_file(&src_file)),
        b"new"
    );
}

pub fn rename_of_missing_source_is_not_found(fs: &dyn RemoteFs, scratch: &str) {
    let check = "rename_of_missing_source_is_not_found";
    let dir = fresh(fs, scratch, check);
    let from = join(&dir, "missing");
    match fs.rename_noreplace(&from, &join(&dir, "target")) {
        Err(RemoteError::NotFound { path, .. }) => assert_eq!(path, from),
        other => panic!(
            "[{}] {check}: expected NotFound, got {other:?}",
            fs.describe()
        ),
    }
}

pub fn write_file_atomic_leaves_no_temp(fs: &dyn RemoteFs, scratch: &str) {
    let check = "write_file_atomic_leaves_no_temp";
    let dir = fresh(fs, scratch, check);
    let path = join(&dir, "manifest.json");
    let content = pattern(5, 300_000);
    ok(fs, check, "write", fs.write_file_atomic(&path, &content));
    assert_eq!(
        ok(fs, check, "read", fs.read_file(&path)),
        content,
        "[{}] {check}",
        fs.describe()
    );
    assert_eq!(
        names(fs, check, &dir),
        vec!["manifest.json".to_string()],
        "[{}] {check}: only the target may remain",
        fs.describe()
    );
}

pub fn write_file_atomic_refuses_existing(fs: &dyn RemoteFs, scratch: &str) {
    let check = "write_file_atomic_refuses_existing";
    let dir = fresh(fs, scratch, check);
    let path = join(&dir, "marker");
    ok(
        fs,
        check,
        "first write",
        fs.write_file_atomic(&path, b"first"),
    );
    match fs.write_file_atomic(&path, b"second") {
        Err(RemoteError::AlreadyExists { path: p, .. }) => assert_eq!(p, path),
        other => panic!(
            "[{}] {check}: expected AlreadyExists, got {other:?}",
            fs.describe()
        ),
    }
    assert_eq!(
        ok(fs, check, "read", fs.read_file(&path)),
        b"first",
        "[{}] {check}",
        fs.describe()
    );
    assert_eq!(
        names(fs, check, &dir),
        vec!["marker".to_string()],
        "[{}] {check}: a refused write must remove its temp file",
        fs.describe()
    );
}

pub fn remove_all_is_idempotent(fs: &dyn RemoteFs, scratch: &str) {
    let check = "remove_all_is_idempotent";
    let dir = fresh(fs, scratch, check);
    let tree = join(&dir, "tree");
    ok(fs, check, "mkdir", fs.create_dir_all(&join(&tree, "a/b")));
    ok(
        fs,
        check,
        "write",
        fs.write_file_atomic(&join(&tree, "a/b/f"), b"x"),
    );
    ok(
        fs,
        check,
        "write",
        fs.write_file_atomic(&join(&tree, "g"), b"y"),
    );
    let file = join(&dir, "single");
    ok(fs, check, "write", fs.write_file_atomic(&file, b"z"));
    for path in [&tree, &file] {
        ok(fs, check, "first remove", fs.remove_all(path));
        assert!(
            ok(fs, check, "stat", fs.stat(path)).is_none(),
            "[{}] {check}: {path} still present",
            fs.describe()
        );
        ok(fs, check, "second remove", fs.remove_all(path));
    }
    assert!(
        names(fs, check, &dir).is_empty(),
        "[{}] {check}",
        fs.describe()
    );
}

pub fn digest_dir_of_missing_is_not_found(fs: &dyn RemoteFs, scratch: &str) {
    let check = "digest_dir_of_missing_is_not_found";
    let dir = fresh(fs, scratch, check);
    match fs.digest_dir(&join(&dir, "missing")) {
        Err(RemoteError::NotFound { .. }) => {}
        other => panic!(
            "[{}] {check}: expected NotFound, got {other:?}",
            fs.describe()
        ),
    }
}

/// Runs `op` on `n` threads at once: how many succeeded, how many were refused with
/// `AlreadyExists`, and every result (for messages).
fn race<T: Send + std::fmt::Debug>(
    n: usize,
    op: impl Fn() -> Result<T, RemoteError> + Sync,
) -> (usize, usize, Vec<Result<T, RemoteError>>) {
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n).map(|_| s.spawn(&op)).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a racing thread panicked"))
            .collect()
    });
    let winners = results.iter().filter(|r| r.is_ok()).count();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(RemoteError::AlreadyExists { .. })))
        .count();
    (winners, refused, results)
}
