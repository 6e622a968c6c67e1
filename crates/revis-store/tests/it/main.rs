//! Integration tests of revis-store against real sled directories.

mod crash;
mod damage;
mod rewind;
mod roundtrip;
mod schema;
mod trust;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use revis_store::{MessageState, Opened, Store};

/// Opens `dir`, expecting a healthy database.
fn open(dir: &Path) -> Store {
    let Opened { store, recovered } = Store::open(dir).expect("open the store");
    assert_eq!(recovered, None, "a healthy database was reported damaged");
    store
}

/// Waits until sled's I/O threads have let go of a closed database (they
/// hold its file, and lock, a moment after the last handle is dropped), so a
/// test that edits the files races with nothing: blocks on the lock itself
/// (the test runner's time limit ends a test whose sled never lets go).
fn wait_closed(dir: &Path) {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(dir.join("db")).unwrap();
    file.lock().unwrap_or_else(|e| panic!("locking {}: {e}", dir.display()));
    file.unlock().unwrap();
}

/// A temporary directory and the database path inside it.
fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    (tmp, dir)
}

/// Everything in the store, readable and without timestamps, for snapshots.
fn dump(store: &Store) -> String {
    let mut out = String::new();
    for c in store.conversations().unwrap() {
        writeln!(out, "conversation {} {:?} ({} messages)", c.id, c.title, c.message_count).unwrap();
        for m in store.messages(c.id).unwrap() {
            let state = match m.state {
                MessageState::Complete => "",
                MessageState::Incomplete => " [incomplete]",
            };
            let tier = m.tier.map(|t| format!(" ({t})")).unwrap_or_default();
            writeln!(out, "  {} {:?}{tier}{state}: {:?}", m.id, m.role, m.text).unwrap();
        }
        if let Some(s) = store.summary(c.id).unwrap() {
            writeln!(out, "  summary up to {}: {:?}", s.covers_up_to, s.text).unwrap();
        }
    }
    for f in store.facts().unwrap() {
        let source = f.source.map(|s| format!(" (from {s})")).unwrap_or_default();
        writeln!(out, "fact {} {:?}{source}", f.id, f.text).unwrap();
    }
    out
}

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The entries of `dir` other than `keep`, i.e. what was moved aside beside it.
fn siblings(dir: &Path) -> Vec<PathBuf> {
    let parent = dir.parent().unwrap();
    let socket = revis_store::socket_path(dir);
    let mut found: Vec<PathBuf> =
        std::fs::read_dir(parent).unwrap().map(|e| e.unwrap().path()).filter(|p| p != dir && p != &socket).collect();
    found.sort();
    found
}
