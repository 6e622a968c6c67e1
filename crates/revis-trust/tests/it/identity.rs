//! The identity files: created once with 0600 modes, loaded after, corrupt files named.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use revis_trust::{CERT_FILE, Identity, KEY_FILE, TrustError};

fn mode(path: &std::path::Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn created_on_first_run_then_loaded_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("trust");
    let first = Identity::load_or_create(&dir).unwrap();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
    assert_eq!(mode(&dir.join(CERT_FILE)), 0o600);
    let key = fs::read(dir.join(KEY_FILE)).unwrap();
    let cert = fs::read(dir.join(CERT_FILE)).unwrap();

    let second = Identity::load_or_create(&dir).unwrap();
    assert_eq!(second.device_id(), first.device_id());
    assert_eq!(second.certificate(), first.certificate());
    assert_eq!(fs::read(dir.join(KEY_FILE)).unwrap(), key);
    assert_eq!(fs::read(dir.join(CERT_FILE)).unwrap(), cert);
    second.certified_key().expect("the key matches the certificate");
    assert_ne!(Identity::generate().unwrap().device_id(), first.device_id());
}

#[test]
fn a_corrupt_file_is_an_error_naming_it() {
    for (file, content) in [
        (KEY_FILE, &b"not a key"[..]),
        (CERT_FILE, &b"not a certificate"[..]),
        (CERT_FILE, &b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"[..]),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        Identity::load_or_create(tmp.path()).unwrap();
        let path = tmp.path().join(file);
        fs::write(&path, content).unwrap();
        let err = Identity::load_or_create(tmp.path()).unwrap_err();
        assert!(matches!(err, TrustError::Corrupt { .. }), "{file}: {err:?}");
        assert!(err.to_string().contains(&path.display().to_string()), "{err}");
        assert_eq!(fs::read(&path).unwrap(), content, "left as it was");
    }
}

#[test]
fn another_nodes_certificate_does_not_load_with_this_key() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    Identity::load_or_create(a.path()).unwrap();
    Identity::load_or_create(b.path()).unwrap();
    fs::copy(b.path().join(CERT_FILE), a.path().join(CERT_FILE)).unwrap();
    let err = Identity::load_or_create(a.path()).unwrap_err().to_string();
    assert!(err.contains(CERT_FILE) && err.contains("does not match"), "{err}");
}

#[test]
fn a_key_readable_by_others_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    Identity::load_or_create(tmp.path()).unwrap();
    let key = tmp.path().join(KEY_FILE);
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    let err = Identity::load_or_create(tmp.path()).unwrap_err();
    assert!(matches!(err, TrustError::Permissions { mode: 0o644, .. }), "{err:?}");
}

#[test]
fn a_key_without_its_certificate_gets_a_new_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    Identity::load_or_create(tmp.path()).unwrap();
    let key = fs::read(tmp.path().join(KEY_FILE)).unwrap();
    fs::remove_file(tmp.path().join(CERT_FILE)).unwrap();
    let id = Identity::load_or_create(tmp.path()).unwrap();
    assert_eq!(fs::read(tmp.path().join(KEY_FILE)).unwrap(), key);
    assert_eq!(mode(&tmp.path().join(CERT_FILE)), 0o600);
    assert_eq!(Identity::load_or_create(tmp.path()).unwrap().device_id(), id.device_id());
}

#[test]
fn a_certificate_without_its_key_is_not_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    Identity::load_or_create(tmp.path()).unwrap();
    fs::remove_file(tmp.path().join(KEY_FILE)).unwrap();
    let err = Identity::load_or_create(tmp.path()).unwrap_err();
    assert!(matches!(err, TrustError::MissingKey { .. }), "{err:?}");
    assert!(!tmp.path().join(KEY_FILE).exists());
}
