//! The API key: made on first use (32 random bytes, hex), kept in the data
//! directory as [`KEY_FILE`], 0600, and refused when anyone else could read
//! or replace it.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::error::HttpError;

/// The key's file, in revis's data directory.
pub const KEY_FILE: &str = "http-api-key";

/// The key in `data_dir` (made there when it is missing).
pub fn load_or_create_key(data_dir: &Path) -> Result<String, HttpError> {
    let path = data_dir.join(KEY_FILE);
    let io = |source| HttpError::Io { path: path.clone(), source };
    std::fs::create_dir_all(data_dir).map_err(|source| HttpError::Io { path: data_dir.into(), source })?;
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
        Ok(mut f) => {
            let bytes: [u8; 32] = rand::random();
            let key: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let key = format!("revis-{key}");
            f.write_all(key.as_bytes()).and_then(|()| f.sync_all()).map_err(io)?;
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(&path).map_err(io)?;
            // SAFETY: geteuid has no preconditions and cannot fail.
            let me = unsafe { libc::geteuid() };
            if !meta.file_type().is_file() || meta.uid() != me || meta.permissions().mode() & 0o077 != 0 {
                return Err(HttpError::Refused(format!(
                    "{}: the API key must be a file of yours readable by you only (mode 0600); it is not, so it may be known to others: remove it and a new one is made",
                    path.display()
                )));
            }
            let key = std::fs::read_to_string(&path).map_err(io)?.trim().to_owned();
            if key.len() < 32 {
                return Err(HttpError::Refused(format!(
                    "{}: the API key is shorter than 32 characters: remove it and a new one is made",
                    path.display()
                )));
            }
            Ok(key)
        }
        Err(e) => Err(io(e)),
    }
}

/// `given == key`, in time that does not depend on where they differ.
pub(crate) fn same(given: &str, key: &str) -> bool {
    let (a, b) = (given.as_bytes(), key.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_made_once_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let key = load_or_create_key(dir.path()).unwrap();
        assert!(key.starts_with("revis-") && key.len() == 6 + 64, "{key}");
        let mode = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(load_or_create_key(dir.path()).unwrap(), key);
    }

    #[test]
    fn a_key_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        load_or_create_key(dir.path()).unwrap();
        std::fs::set_permissions(dir.path().join(KEY_FILE), std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_create_key(dir.path()).unwrap_err().to_string();
        assert!(e.contains("readable by you only"), "{e}");
    }

    #[test]
    fn keys_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abd", "abc"));
        assert!(!same("ab", "abc"));
        assert!(!same("", "abc"));
    }
}
