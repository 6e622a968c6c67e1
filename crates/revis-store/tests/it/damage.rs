//! Damaged and unusable databases: damage is moved aside (never deleted or
//! overwritten), replaced by a fresh database and reported with both paths;
//! a path that cannot be used at all is an error naming it.

use std::path::{Path, PathBuf};

use expect_test::expect;
use revis_store::{Opened, Store, StoreError};

use crate::{dump, files_under, open, siblings, temp_db, wait_closed};

/// A database with one conversation in it, closed.
fn written(dir: &Path) {
    let store = open(dir);
    let conv = store.create_conversation("precious").unwrap();
    store.append_user(conv, "remember this").unwrap();
    drop(store);
    wait_closed(dir);
}

/// Overwrites every byte of `file` with a pattern that is not sled's.
fn scribble(file: &Path) {
    let len = std::fs::metadata(file).unwrap().len() as usize;
    let garbage: Vec<u8> = (0..len).map(|i| (i * 7 + 13) as u8).collect();
    std::fs::write(file, garbage).unwrap();
}

/// Opens a damaged `dir`: checks the report, that the damage was kept beside
/// it, and that the fresh database is empty and works. Returns the report's
/// text with the paths replaced, and where the damage went.
fn recover(dir: &Path) -> (String, PathBuf) {
    let Opened { store, recovered } = Store::open(dir).unwrap();
    let recovered = recovered.expect("the damage was not reported");
    assert_eq!(recovered.path, dir);
    let moved = recovered.damaged_path_moved_to.clone();
    assert_eq!(moved.parent(), dir.parent());
    assert!(moved.file_name().unwrap().to_str().unwrap().starts_with("db.damaged-"), "{}", moved.display());
    assert!(siblings(dir).contains(&moved), "{} is not beside {}", moved.display(), dir.display());
    assert!(moved.join("db").is_file(), "the damaged files were not kept");

    assert_eq!(dump(&store), "");
    let conv = store.create_conversation("fresh").unwrap();
    store.append_user(conv, "works").unwrap();
    drop(store);
    assert_eq!(open(dir).messages(conv).unwrap().len(), 1);

    let shown = recovered.to_string().replace(&moved.display().to_string(), "$MOVED").replace(&dir.display().to_string(), "$DIR");
    (shown, moved)
}

#[test]
fn garbage_over_every_file_is_moved_aside_and_replaced() {
    let (_tmp, dir) = temp_db();
    written(&dir);
    let names: Vec<PathBuf> = files_under(&dir).iter().map(|f| f.strip_prefix(&dir).unwrap().to_owned()).collect();
    for file in files_under(&dir) {
        scribble(&file);
    }
    let (shown, moved) = recover(&dir);
    expect![[r#"the database at $DIR could not be read (sled: Unsupported: failed to open database that may have been created using a sled version earlier than 0.29); it was moved to $MOVED and a new, empty database was created"#]]
        .assert_eq(&shown);
    // Kept whole: the same files, the configuration still the garbage found.
    let kept: Vec<PathBuf> = files_under(&moved).iter().map(|f| f.strip_prefix(&moved).unwrap().to_owned()).collect();
    assert_eq!(kept, names);
    let conf = std::fs::read(moved.join("conf")).unwrap();
    assert_eq!(conf.first(), Some(&13));
}

#[test]
fn a_log_zeroed_under_its_snapshot_is_found_by_sled() {
    let (_tmp, dir) = temp_db();
    written(&dir);
    // Opening again makes sled write a snapshot that points into the log.
    drop(open(&dir));
    wait_closed(&dir);
    assert!(files_under(&dir).iter().any(|f| { f.file_name().unwrap().to_str().unwrap().starts_with("snap.") }));
    let log = dir.join("db");
    let len = std::fs::metadata(&log).unwrap().len() as usize;
    std::fs::write(&log, vec![0; len]).unwrap();
    let (shown, _) = recover(&dir);
    // (The offset sled names depends on the timestamps' lengths.)
    assert!(shown.contains("could not be read (sled: Read corrupted data at file offset"), "{shown}");
}

#[test]
fn a_damaged_log_that_sled_opens_as_empty_is_caught() {
    // Without a snapshot, sled reads a log scribbled from its start as a new,
    // empty database; the marker says there was one, so this is damage.
    let (_tmp, dir) = temp_db();
    written(&dir);
    for file in files_under(&dir) {
        let name = file.file_name().unwrap().to_str().unwrap().to_owned();
        if name.starts_with("snap.") {
            std::fs::remove_file(&file).unwrap();
        } else if name == "db" {
            scribble(&file);
        }
    }
    let (shown, _) = recover(&dir);
    expect![[r#"the database at $DIR could not be read (revis-store.json says schema version 1 but the database has none: its contents are gone); it was moved to $MOVED and a new, empty database was created"#]]
        .assert_eq(&shown);
}

#[test]
fn a_scribbled_marker_is_damage() {
    let (_tmp, dir) = temp_db();
    written(&dir);
    scribble(&dir.join("revis-store.json"));
    let (shown, _) = recover(&dir);
    expect![[r#"the database at $DIR could not be read (revis-store.json is unreadable: expected value at line 1 column 2); it was moved to $MOVED and a new, empty database was created"#]]
        .assert_eq(&shown);
}

#[test]
fn damage_twice_keeps_both_copies() {
    let (_tmp, dir) = temp_db();
    let mut moved = Vec::new();
    for _ in 0..2 {
        written(&dir);
        scribble(&dir.join("revis-store.json"));
        moved.push(recover(&dir).1);
    }
    assert_ne!(moved[0], moved[1]);
    assert!(moved.iter().all(|m| m.join("db").is_file()));
}

#[test]
fn a_database_open_elsewhere_is_never_moved() {
    // sled reads its config before taking its lock, so a second opener can
    // see "damage" in a database that is in use. It must not move it.
    let (_tmp, dir) = temp_db();
    let first = open(&dir);
    scribble(&dir.join("conf"));
    let second = Store::open(&dir).expect("shared through the first");
    assert_eq!(second.recovered, None);
    assert!(siblings(&dir).is_empty(), "{:?}", siblings(&dir));
    // Both handles still work.
    first.create_conversation("still here").unwrap();
    second.store.create_conversation("and here").unwrap();
}

#[test]
fn a_regular_file_in_the_way_is_an_error_naming_it() {
    // (Tests run as root, where chmod 000 blocks nothing; a file where the
    // directory should be is unusable for everyone.)
    let (_tmp, dir) = temp_db();
    std::fs::write(&dir, b"not a directory").unwrap();
    let err = Store::open(&dir).unwrap_err();
    assert!(matches!(&err, StoreError::Io { path, .. } if path == &dir), "{err:?}");
    let shown = err.to_string().replace(&dir.display().to_string(), "$DIR");
    expect![[r#"cannot use the database directory $DIR: File exists (os error 17)"#]].assert_eq(&shown);
    // Left alone, nothing moved.
    assert_eq!(std::fs::read(&dir).unwrap(), b"not a directory");
    assert!(siblings(&dir).is_empty());

    // Same when the file is further up.
    let below = dir.join("db");
    let err = Store::open(&below).unwrap_err();
    assert!(matches!(&err, StoreError::Io { path, .. } if path == &below), "{err:?}");
}
