//! Schema versions: a new database is stamped, an unstamped one is migrated,
//! a newer one is refused and left exactly as it was.

use expect_test::expect;
use revis_store::{SCHEMA_VERSION, Store, StoreError};

use crate::{dump, files_under, open, siblings, temp_db, wait_closed};

/// sled itself, on a database a [`Store`] may just have closed: sled lets go
/// of its lock when its I/O threads are done with the file, a moment after
/// the close, so this waits for that first.
fn raw_sled(dir: &std::path::Path) -> sled::Db {
    wait_closed(dir);
    sled::open(dir).unwrap()
}

/// The version sled holds, read with sled directly.
fn stamped_version(dir: &std::path::Path) -> Option<u32> {
    let db = raw_sled(dir);
    db.get("schema_version").unwrap().map(|v| serde_json::from_slice(&v).unwrap())
}

fn marker(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("revis-store.json")).unwrap()
}

#[test]
fn a_new_database_gets_the_current_version() {
    let (_tmp, dir) = temp_db();
    drop(open(&dir));
    assert_eq!(stamped_version(&dir), Some(SCHEMA_VERSION));
    assert_eq!(marker(&dir), format!(r#"{{"schema_version":{SCHEMA_VERSION}}}"#));
}

#[test]
fn an_unstamped_database_is_migrated_from_version_0() {
    // Version 0: a sled database revis never stamped (its first open was cut
    // off before the stamp was flushed), here with something left in it.
    let (_tmp, dir) = temp_db();
    {
        let db = sled::open(&dir).unwrap();
        db.insert("left over", "by an interrupted first open").unwrap();
        db.flush().unwrap();
    }
    let store = open(&dir);
    let conv = store.create_conversation("after the migration").unwrap();
    store.append_user(conv, "works").unwrap();
    drop(store);
    assert_eq!(stamped_version(&dir), Some(SCHEMA_VERSION));
    assert_eq!(marker(&dir), format!(r#"{{"schema_version":{SCHEMA_VERSION}}}"#));
    expect![[r#"
        conversation 1 "after the migration" (1 messages)
          1:0 User: "works"
    "#]]
    .assert_eq(&dump(&open(&dir)));
}

#[test]
fn a_newer_version_in_sled_is_refused_and_left_alone() {
    let (_tmp, dir) = temp_db();
    {
        let store = open(&dir);
        store.create_conversation("written by a newer revis").unwrap();
    }
    {
        let db = raw_sled(&dir);
        db.insert("schema_version", format!("{}", SCHEMA_VERSION + 1).as_bytes()).unwrap();
        db.flush().unwrap();
    }
    let err = Store::open(&dir).unwrap_err();
    assert!(
        matches!(err, StoreError::NewerSchema { ref path, found, supported }
            if path == &dir && found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "{err:?}"
    );
    let shown = err.to_string().replace(&dir.display().to_string(), "$DIR");
    expect![[r#"the database at $DIR has schema version 2, newer than the 1 this revis understands; use a newer revis (the database was left as it is)"#]]
        .assert_eq(&shown);
    // Not moved, not migrated back.
    assert!(siblings(&dir).is_empty(), "{:?}", siblings(&dir));
    assert_eq!(stamped_version(&dir), Some(SCHEMA_VERSION + 1));
}

#[test]
fn a_newer_marker_is_refused_before_sled_reads_anything() {
    // A newer revis may use a sled format this one cannot read at all: the
    // marker alone decides, and no file is touched.
    let (_tmp, dir) = temp_db();
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("revis-store.json"), r#"{"schema_version":7}"#).unwrap();
    std::fs::write(dir.join("db"), b"a format from the future").unwrap();
    std::fs::write(dir.join("conf"), b"not sled 0.34's").unwrap();
    let before: Vec<_> = files_under(&dir).into_iter().map(|f| (f.clone(), std::fs::read(f).unwrap())).collect();

    let err = Store::open(&dir).unwrap_err();
    assert!(matches!(err, StoreError::NewerSchema { found: 7, .. }), "{err:?}");
    let after: Vec<_> = files_under(&dir).into_iter().map(|f| (f.clone(), std::fs::read(f).unwrap())).collect();
    assert_eq!(after, before);
    assert!(siblings(&dir).is_empty());
}
