//! Who is at the other end: the socket's place in the database's directory,
//! whether that directory can be trusted to hold only this user's socket,
//! and the user (and pid) of the process on a connection.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The socket the holder serves the database on: `<dir>/holder.sock`,
/// inside the database's own directory, which is this user's and 0700
/// (checked before connecting), so no other user can put a socket there.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("holder.sock")
}

/// This process's user.
pub(super) fn my_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// The uid of the process at the other end of `stream` (`SO_PEERCRED` on
/// Linux, `getpeereid` elsewhere), and its pid where the system says it (Linux).
pub(super) fn peer(stream: &UnixStream) -> std::io::Result<(u32, Option<u32>)> {
    use std::os::fd::AsRawFd;
    #[cfg(target_os = "linux")]
    {
        let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: `cred` and `len` are valid for writes of the sizes given.
        let r = unsafe { libc::getsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &raw mut len) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((cred.uid, u32::try_from(cred.pid).ok().filter(|p| *p > 0)))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let (mut uid, mut gid) = (0, 0);
        // SAFETY: `uid` and `gid` are valid for writes.
        if unsafe { libc::getpeereid(stream.as_raw_fd(), &raw mut uid, &raw mut gid) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((uid, None))
    }
}

/// Why the database directory `dir` cannot be trusted to hold only this
/// user's socket, if it cannot: it must be a directory (a link to one is
/// followed: what counts is the directory), this user's, and writable by
/// nobody else.
pub(super) fn untrusted_dir(dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) => return Some(format!("cannot check {}: {e}", dir.display())),
    };
    if !meta.is_dir() {
        return Some(format!("{} is not a directory", dir.display()));
    }
    if meta.uid() != my_uid() {
        return Some(format!("{} belongs to uid {}, not to you ({})", dir.display(), meta.uid(), my_uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Some(format!("{} may be written by others (mode {:o})", dir.display(), meta.mode() & 0o777));
    }
    None
}
