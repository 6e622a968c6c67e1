//! The local Unix socket: a safe default path, a 0700 directory, a 0600
//! socket, stale sockets replaced, symlinked or foreign-owned paths refused,
//! and peers with another uid turned away.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("{path}: {message}")]
    Unsafe { path: PathBuf, message: String },
    #[error("another revisd is already listening on {0}")]
    InUse(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The user's uid.
pub fn my_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// Where the daemon listens by default: `$XDG_RUNTIME_DIR/revis/revisd.sock`
/// on Linux, `~/Library/Application Support/revis/revisd.sock` on macOS, and
/// `/tmp/revis-$UID/revisd.sock` when neither is available.
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("REVIS_SOCKET").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    #[cfg(target_os = "macos")]
    if let Some(home) = std::env::var_os("HOME") {
        return PathBuf::from(home).join("Library/Application Support/revis/revisd.sock");
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("revis/revisd.sock");
    }
    PathBuf::from(format!("/tmp/revis-{}/revisd.sock", my_uid()))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SocketError + '_ {
    move |source| SocketError::Io { path: path.into(), source }
}

fn refuse(path: &Path, message: impl Into<String>) -> SocketError {
    SocketError::Unsafe { path: path.into(), message: message.into() }
}

/// Creates (0700) or checks the socket's directory: a real directory, ours,
/// writable by nobody else.
fn check_dir(dir: &Path) -> Result<(), SocketError> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io(dir))?;
            // `recursive` applies the mode to the last component only, which is the one we use.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
            Ok(())
        }
        Err(e) => Err(io(dir)(e)),
        Ok(m) if m.file_type().is_symlink() => Err(refuse(dir, "is a symbolic link; refusing to put the socket there")),
        Ok(m) if !m.is_dir() => Err(refuse(dir, "is not a directory")),
        Ok(m) if m.uid() != my_uid() => Err(refuse(dir, format!("belongs to uid {}, not to you (uid {})", m.uid(), my_uid()))),
        Ok(m) if m.mode() & 0o022 != 0 => {
            Err(refuse(dir, format!("is writable by other users (mode {:o}); use a directory only you can write", m.mode() & 0o777)))
        }
        Ok(_) => Ok(()),
    }
}

/// Binds the socket at `path` safely. A socket file left by a daemon that
/// died is replaced; a live one is not.
pub async fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    check_dir(dir)?;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(path)(e)),
        Ok(m) if m.file_type().is_symlink() => return Err(refuse(path, "is a symbolic link; refusing to use it")),
        Ok(m) if !m.file_type().is_socket() => return Err(refuse(path, "exists and is not a socket; refusing to replace it")),
        Ok(m) if m.uid() != my_uid() => return Err(refuse(path, format!("belongs to uid {}, not to you", m.uid()))),
        Ok(_) => {
            if tokio::net::UnixStream::connect(path).await.is_ok() {
                return Err(SocketError::InUse(path.into()));
            }
            tracing::info!(path = %path.display(), "removing a stale socket");
            std::fs::remove_file(path).map_err(io(path))?;
        }
    }
    // umask 077 while binding, so the socket is never open to others, not even briefly.
    // SAFETY: umask only swaps the process's file mode mask.
    let old = unsafe { libc::umask(0o077) };
    let bound = UnixListener::bind(path);
    unsafe { libc::umask(old) };
    let listener = bound.map_err(io(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io(path))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn binds_0600_in_a_0700_dir_and_replaces_a_stale_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("run/revisd.sock");
        let l = bind(&path).await.unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o777, 0o700);
        assert!(matches!(bind(&path).await, Err(SocketError::InUse(_))));
        drop(l); // the file stays behind, like after a crash
        assert!(path.exists());
        bind(&path).await.unwrap();
    }

    #[tokio::test]
    async fn refuses_symlinks_and_plain_files() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("elsewhere.sock");
        let link = tmp.path().join("link.sock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = bind(&link).await.unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let file = tmp.path().join("file.sock");
        std::fs::write(&file, b"data").unwrap();
        let e = bind(&file).await.unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"data", "nothing was overwritten");
    }

    #[tokio::test]
    async fn refuses_a_directory_others_can_write() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("open");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = bind(&dir.join("s.sock")).await.unwrap_err().to_string();
        assert!(e.contains("writable by other users"), "{e}");
    }
}
