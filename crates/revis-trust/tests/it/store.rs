//! The trust store: add, list, revoke, last seen; one 0600 JSON file written atomically.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, UNIX_EPOCH};

use revis_trust::{DeviceId, TRUST_FILE, TrustError, TrustStore};

#[test]
fn add_list_revoke_survive_reopening() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (DeviceId::from_bytes([1; 32]), DeviceId::from_bytes([2; 32]));
    let mut store = TrustStore::open(tmp.path()).unwrap();
    assert!(store.devices().is_empty());
    let set = store.trust_set();

    store.add(a, "laptop").unwrap();
    store.add(b, "desk").unwrap();
    assert!(set.contains(&a) && set.contains(&b));
    let path = tmp.path().join(TRUST_FILE);
    assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);

    let at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    assert!(store.mark_seen(&b, at).unwrap());
    assert!(!store.mark_seen(&DeviceId::from_bytes([3; 32]), at).unwrap());

    let reopened = TrustStore::open(tmp.path()).unwrap();
    assert_eq!(reopened.devices(), store.devices());
    let names: Vec<&str> = reopened.devices().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["laptop", "desk"]);
    assert_eq!(reopened.get(&b).unwrap().last_seen, Some(1_800_000_000));
    assert!(reopened.get(&a).unwrap().paired_at > 0);
    assert!(reopened.trust_set().contains(&a));

    assert!(store.revoke(&a).unwrap());
    assert!(!store.revoke(&a).unwrap());
    assert!(!set.contains(&a) && set.contains(&b));
    let reopened = TrustStore::open(tmp.path()).unwrap();
    assert!(reopened.get(&a).is_none());
    assert!(!reopened.trust_set().contains(&a));
    // Only the store file: no temp files left behind.
    let files: Vec<_> = fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files, [TRUST_FILE]);
}

#[test]
fn pairing_again_renames_instead_of_duplicating() {
    let tmp = tempfile::tempdir().unwrap();
    let a = DeviceId::from_bytes([1; 32]);
    let mut store = TrustStore::open(tmp.path()).unwrap();
    store.add(a, "old").unwrap();
    store.add(a, "new").unwrap();
    assert_eq!(store.devices().len(), 1);
    assert_eq!(store.get(&a).unwrap().name, "new");
}

#[test]
fn bad_names_are_refused_and_nothing_is_trusted() {
    let tmp = tempfile::tempdir().unwrap();
    let a = DeviceId::from_bytes([1; 32]);
    let mut store = TrustStore::open(tmp.path()).unwrap();
    for name in ["", "  ", "tab\there", &"x".repeat(65)] {
        let err = store.add(a, name).unwrap_err();
        assert!(matches!(err, TrustError::InvalidName(_)), "{name:?}: {err:?}");
    }
    assert!(!store.trust_set().contains(&a));
    assert!(!tmp.path().join(TRUST_FILE).exists());
}

#[test]
fn a_corrupt_store_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(TRUST_FILE);
    for content in
        ["{", r#"{"version":2,"devices":[]}"#, r#"{"version":1,"devices":[{"device_id":"x","name":"a","paired_at":1,"last_seen":null}]}"#]
    {
        fs::write(&path, content).unwrap();
        let err = TrustStore::open(tmp.path()).unwrap_err();
        assert!(matches!(err, TrustError::Corrupt { .. }), "{content}: {err:?}");
        assert!(err.to_string().contains(&path.display().to_string()), "{err}");
    }
}

/// Revoking is all or nothing: when the file cannot be written, the device
/// stays paired in memory too (it would be trusted again after a restart).
#[test]
fn a_revoke_that_cannot_be_written_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (DeviceId::from_bytes([1; 32]), DeviceId::from_bytes([2; 32]));
    let mut store = TrustStore::open(tmp.path()).unwrap();
    let set = store.trust_set();
    store.add(a, "laptop").unwrap();
    store.add(b, "desk").unwrap();
    let before = store.devices().to_vec();

    // A non-empty directory where the file goes: the atomic rename onto it
    // fails, for root too (chmod would not stop root).
    let path = tmp.path().join(TRUST_FILE);
    let aside = tmp.path().join("aside.json");
    fs::rename(&path, &aside).unwrap();
    fs::create_dir(&path).unwrap();
    fs::write(path.join("keep"), b"x").unwrap();

    let err = store.revoke(&a).unwrap_err();
    assert!(matches!(err, TrustError::Io { .. }), "{err}");
    assert!(err.to_string().contains(TRUST_FILE), "the error names the file: {err}");
    assert_eq!(store.devices(), before, "still listed");
    assert!(set.contains(&a), "still trusted by the live set");

    // The restart sees the same: still paired. Then a write that works revokes.
    fs::remove_dir_all(&path).unwrap();
    fs::rename(&aside, &path).unwrap();
    assert_eq!(TrustStore::open(tmp.path()).unwrap().devices(), before);
    assert!(store.revoke(&a).unwrap());
    assert!(!set.contains(&a) && set.contains(&b));
    assert!(TrustStore::open(tmp.path()).unwrap().get(&a).is_none());
}
