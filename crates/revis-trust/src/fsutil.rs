//! Private files: a 0700 directory and atomic 0600 writes (temp file, fsync, rename, fsync dir).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use crate::{Result, TrustError};

/// Creates `dir` (and its parents) as 0700 if it does not exist.
pub(crate) fn ensure_private_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(TrustError::io(dir))
}

/// Replaces `path` with `bytes`, mode 0600: readers see the old file or the
/// new one, never a part.
pub(crate) fn write_private_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    ensure_private_dir(dir)?;
    let mut tmp = tempfile::Builder::new().prefix(".revis-trust-").tempfile_in(dir).map_err(TrustError::io(dir))?;
    let err = TrustError::io(path);
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(0o600))
        .and_then(|()| tmp.write_all(bytes))
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(err)?;
    tmp.persist(path).map_err(|e| TrustError::Io { path: path.to_owned(), source: e.error })?;
    // The rename is durable only once the directory is.
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(TrustError::io(dir))
}

/// Reads `path`, or `None` when it does not exist.
pub(crate) fn read_if_exists(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TrustError::Io { path: path.to_owned(), source: e }),
    }
}
