//! Connecting to this machine's revisd over its Unix socket, and only to a
//! daemon of this user. Every local connection goes through [`dial`] (the
//! first one and each reconnect), so the CLI, the GUI and `revisd`'s own
//! admin commands all get the same two checks before a byte is sent:
//!
//! - the socket's directory is a real directory (not a symbolic link), owned
//!   by this user and writable by nobody else, so no other user can have put
//!   a socket there (the default `/tmp/revis-$UID/` is a name anyone could
//!   create first);
//! - the process that put the socket to listen runs as this user or as
//!   root (`SO_PEERCRED` on Linux, `getpeereid` on macOS). Root, because
//!   under launchd socket activation it is launchd (root) that creates and
//!   listens on the socket it hands to the user's revisd, so the peer
//!   credentials read uid 0; and root can act as any user anyway, so
//!   refusing it would protect nothing.
//!
//! Otherwise the connection is refused with [`ClientError::Untrusted`],
//! which names the path and the reason.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use tokio::net::UnixStream;

use crate::ClientError;

/// How long connecting to the local socket may take.
pub const LOCAL_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// This process's user.
fn my_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// Connects to the socket at `path` once both checks passed (see the module
/// documentation). Nothing has been written to the stream.
pub(crate) async fn dial(path: &Path) -> Result<UnixStream, ClientError> {
    let not_running = |reason: String| ClientError::NotRunning { path: path.into(), reason };
    let untrusted = |reason: String| ClientError::Untrusted { path: path.into(), reason };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let meta = tokio::fs::symlink_metadata(dir).await.map_err(|e| not_running(why_not(&e)))?;
    check_dir(dir, &meta, my_uid()).map_err(untrusted)?;
    let stream = tokio::time::timeout(LOCAL_CONNECT_TIMEOUT, UnixStream::connect(path))
        .await
        .map_err(|_| not_running(format!("it did not accept the connection within {}s", LOCAL_CONNECT_TIMEOUT.as_secs())))?
        .map_err(|e| not_running(why_not(&e)))?;
    let peer =
        stream.peer_cred().map_err(|e| untrusted(format!("the uid of the process listening on it is unknown ({e}); {ANOTHER_SOCKET}")))?;
    if !trusted_peer(peer.uid(), my_uid()) {
        return Err(untrusted(format!(
            "the process listening on it runs as uid {}, not as you ({}); {IMPERSONATION}: stop that process, or {ANOTHER_SOCKET}",
            peer.uid(),
            my_uid()
        )));
    }
    Ok(stream)
}

/// Whether a socket put to listen by `peer` may be `me`'s daemon: `me`'s
/// own, or root's (see the module documentation).
fn trusted_peer(peer: u32, me: u32) -> bool {
    peer == me || peer == 0
}

/// What the refusals of a socket that may belong to someone else say.
const IMPERSONATION: &str = "another user may be impersonating revisd";
/// The way out that every refusal offers.
const ANOTHER_SOCKET: &str = "choose another --socket";

/// Why a socket in `dir` (whose metadata, not following a link, is `meta`)
/// cannot be trusted to be `uid`'s, if it cannot, and what to do about it:
/// a directory of this user's that is merely too open is made private; one
/// that is someone else's is a possible impersonation.
fn check_dir(dir: &Path, meta: &std::fs::Metadata, uid: u32) -> Result<(), String> {
    let dir = dir.display();
    if meta.file_type().is_symlink() {
        return Err(format!("its directory {dir} is a symbolic link; {IMPERSONATION}: remove the link, or {ANOTHER_SOCKET}"));
    }
    if !meta.is_dir() {
        return Err(format!("its directory {dir} is not a directory; remove it, or {ANOTHER_SOCKET}"));
    }
    if meta.uid() != uid {
        return Err(format!(
            "its directory {dir} is owned by uid {}, not by you ({uid}); {IMPERSONATION}: have it removed, or {ANOTHER_SOCKET}",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "its directory {dir} is writable by other users (mode {:o}); make it private: chmod 700 '{dir}', or {ANOTHER_SOCKET}",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Why connecting failed, in words: the two usual cases (no socket, or a
/// socket left by a daemon that has stopped) said plainly.
fn why_not(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "there is no socket there".into(),
        std::io::ErrorKind::ConnectionRefused => "nothing listens on it (a revisd that stopped left it behind)".into(),
        _ => e.to_string(),
    }
}

/// The error of a call that failed because the socket at `path` could not
/// be dialled again (the channel reconnects on its own): [`dial`]'s own
/// error, found in the status's causes. None when the status is not about
/// dialling: the daemon's own UNAVAILABLE (it has no cause), or a
/// connection that was made and then broke (a reset, a broken pipe), which
/// stays the call's status.
pub(crate) fn undialled(s: &tonic::Status) -> Option<ClientError> {
    let mut cause = std::error::Error::source(s);
    while let Some(e) = cause {
        // `Client::connect`'s connector hands tonic [`dial`]'s error inside an io::Error.
        let dialled = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()).and_then(|inner| inner.downcast_ref::<ClientError>());
        match dialled {
            Some(ClientError::Untrusted { path, reason }) => {
                return Some(ClientError::Untrusted { path: path.clone(), reason: reason.clone() });
            }
            Some(ClientError::NotRunning { path, reason }) => {
                return Some(ClientError::NotRunning { path: path.clone(), reason: reason.clone() });
            }
            _ => cause = e.source(),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_of_this_user_or_of_root_is_trusted() {
        assert!(trusted_peer(501, 501));
        // launchd (root) listens on the socket it hands to the user's revisd.
        assert!(trusted_peer(0, 501));
        assert!(trusted_peer(0, 0));
        assert!(!trusted_peer(502, 501));
        assert!(!trusted_peer(65534, 0));
    }

    #[test]
    fn a_refused_directory_says_what_to_do() {
        use std::os::unix::fs::PermissionsExt;
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("revis");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o775)).unwrap();
        let meta = std::fs::symlink_metadata(&dir).unwrap();
        let mine = meta.uid();
        // Ours, merely too open: make it private; no talk of impersonation.
        let said = check_dir(&dir, &meta, mine).unwrap_err();
        let d = dir.display();
        assert_eq!(
            said,
            format!(
                "its directory {d} is writable by other users (mode 775); make it private: chmod 700 '{d}', or choose another --socket"
            )
        );
        // Someone else's: possibly an impersonation.
        let said = check_dir(&dir, &meta, mine + 1).unwrap_err();
        assert!(said.contains(IMPERSONATION) && said.ends_with("have it removed, or choose another --socket"), "{said}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(check_dir(&dir, &std::fs::symlink_metadata(&dir).unwrap(), mine), Ok(()));
    }

    fn unavailable(cause: std::io::Error) -> tonic::Status {
        let mut s = tonic::Status::unavailable("transport error");
        s.set_source(std::sync::Arc::new(cause));
        s
    }

    #[test]
    fn only_a_failed_dial_reads_as_not_running() {
        let path = Path::new("/run/user/1/revis/revisd.sock");
        // The connector's error: dial's own, inside an io::Error.
        let refused = ClientError::NotRunning { path: path.into(), reason: "nothing listens on it".into() };
        let s = unavailable(std::io::Error::other(refused));
        assert!(matches!(undialled(&s), Some(ClientError::NotRunning { reason, .. }) if reason == "nothing listens on it"));
        let untrusted = ClientError::Untrusted { path: path.into(), reason: "its directory is a symbolic link".into() };
        assert!(matches!(undialled(&unavailable(std::io::Error::other(untrusted))), Some(ClientError::Untrusted { .. })));
        // A live connection that broke is not a daemon that is not running.
        for kind in [std::io::ErrorKind::ConnectionReset, std::io::ErrorKind::BrokenPipe] {
            assert!(undialled(&unavailable(std::io::Error::from(kind))).is_none(), "{kind:?}");
        }
        // The daemon's own UNAVAILABLE has no cause.
        assert!(undialled(&tonic::Status::unavailable("shutting down")).is_none());
    }
}
