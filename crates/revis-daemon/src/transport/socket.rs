//! The local Unix socket: a safe default path, a 0700 directory, a 0600
//! socket, stale sockets replaced, symlinked or foreign-owned paths refused,
//! and peers with another uid turned away. Or the same socket, already
//! listening, handed over by systemd or launchd (socket activation).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
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
    #[error("the socket handed over by {from}: {message}")]
    Inherited { from: Activation, message: String },
}

/// The user's uid.
pub fn my_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

pub use revis_proto::default_socket_path;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SocketError + '_ {
    move |source| SocketError::Io { path: path.into(), source }
}

fn refuse(path: &Path, message: impl Into<String>) -> SocketError {
    SocketError::Unsafe { path: path.into(), message: message.into() }
}

/// Creates (0700) or checks the socket's directory: a real directory, ours,
/// writable by nobody else. The directory itself is never followed if it is
/// a symbolic link, at any step: `mkdir` does not follow one (it fails with
/// EEXIST), and whatever is there afterwards, made by us or by someone
/// quicker, is judged by `lstat`. No chmod: `mkdir`'s 0700, less the umask,
/// is never open to others. (Its parents are ordinary paths: on macOS /tmp
/// itself is a link.)
fn check_dir(dir: &Path) -> Result<(), SocketError> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(dir)(e)),
    }
    check_existing_dir(dir, std::fs::symlink_metadata(dir))
}

fn check_existing_dir(dir: &Path, meta: std::io::Result<std::fs::Metadata>) -> Result<(), SocketError> {
    match meta {
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

/// The readiness pipe named by `REVIS_READY_FD` (set by `revis` when it
/// starts revisd, see `revis-client`'s spawn), taken at start: the variable
/// is removed from the environment (no child of ours writes to it), and the
/// descriptor is taken only if it is a pipe or FIFO, so a stray number
/// never makes revisd write into, or close, a file or socket of its own.
///
/// # Safety
/// Call it once, while the process has a single thread (it changes the
/// environment and takes ownership of the descriptor).
pub unsafe fn take_ready_pipe() -> Option<std::fs::File> {
    let value = std::env::var("REVIS_READY_FD").ok();
    // SAFETY: single-threaded, by our caller's contract.
    unsafe { std::env::remove_var("REVIS_READY_FD") };
    let fd: RawFd = value?.trim().parse().ok()?;
    // SAFETY: fstat only writes into `st`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if fd < 0 || unsafe { libc::fstat(fd, &mut st) } == -1 {
        tracing::warn!(fd, "REVIS_READY_FD names no open descriptor; not signalling readiness");
        return None;
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        tracing::warn!(fd, "REVIS_READY_FD is not a pipe; leaving that descriptor alone");
        return None;
    }
    // SAFETY: an open pipe our parent passed for exactly this; from here on it is ours only.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Some(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// The Unix socket revisd handed a child it started (the RPC worker's
/// sessions, a split engine's tunnels) under the environment variable `var`,
/// taken at start like [`take_ready_pipe`]: the variable removed, the
/// descriptor taken only if it is a socket, and made close-on-exec.
///
/// # Safety
/// Call it once per variable, while the process has a single thread.
pub unsafe fn take_inherited_socket(var: &str) -> Option<std::os::unix::net::UnixStream> {
    let value = std::env::var(var).ok();
    // SAFETY: single-threaded, by our caller's contract.
    unsafe { std::env::remove_var(var) };
    let fd: RawFd = value?.trim().parse().ok()?;
    // SAFETY: fstat only writes into `st`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if fd < 0 || unsafe { libc::fstat(fd, &mut st) } == -1 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        tracing::warn!(fd, "{var} names no socket; leaving that descriptor alone");
        return None;
    }
    // SAFETY: a socket our parent passed for exactly this; from here on it is ours only.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Some(unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) })
}

/// Which service manager handed the socket over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Systemd,
    Launchd,
}

impl std::fmt::Display for Activation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Activation::Systemd => "systemd",
            Activation::Launchd => "launchd",
        })
    }
}

/// A listening socket that the service manager opened for us.
#[derive(Debug)]
pub struct Inherited {
    /// Non-blocking and close-on-exec. It stays the manager's: whoever serves
    /// it must not remove the socket file.
    pub listener: std::os::unix::net::UnixListener,
    pub path: PathBuf,
    pub from: Activation,
}

/// systemd passes its sockets from descriptor 3 on (sd_listen_fds(3)).
const SD_LISTEN_FDS_START: RawFd = 3;

/// The name of the `Sockets` entry in launchd/revisd.plist.
#[cfg(target_os = "macos")]
const LAUNCHD_SOCKET_NAME: &std::ffi::CStr = c"Listeners";

/// Takes the listening socket that systemd (`LISTEN_FDS`/`LISTEN_PID`,
/// descriptor 3) or launchd (`launch_activate_socket`) handed over, if any,
/// and checks it as strictly as a socket we bind ourselves: a listening
/// Unix stream socket (never TCP) at a path only we can reach. `Ok(None)`:
/// nothing was handed over; bind the socket yourself.
///
/// # Safety
/// Call it once, while the process has a single thread: it removes the
/// `LISTEN_*` variables from the environment (so no child of ours thinks
/// the sockets are its own), and it takes ownership of descriptor 3 when
/// systemd says that descriptor is ours.
pub unsafe fn take_inherited() -> Result<Option<Inherited>, SocketError> {
    // SAFETY: forwarded to our caller.
    if let Some(fd) = unsafe { systemd_socket()? } {
        return check_inherited(fd, Activation::Systemd).map(Some);
    }
    #[cfg(target_os = "macos")]
    if let Some(fd) = launchd::activate(LAUNCHD_SOCKET_NAME)? {
        return check_inherited(fd, Activation::Launchd).map(Some);
    }
    Ok(None)
}

fn inherited_error(from: Activation, message: impl Into<String>) -> SocketError {
    SocketError::Inherited { from, message: message.into() }
}

/// sd_listen_fds(unset_environment = true), for exactly one socket.
///
/// # Safety
/// As for [`take_inherited`].
unsafe fn systemd_socket() -> Result<Option<OwnedFd>, SocketError> {
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    // SAFETY: single-threaded, by our caller's contract.
    unsafe {
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_FDNAMES");
    }
    let (Some(pid), Some(fds)) = (pid, fds) else { return Ok(None) };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        // Meant for another process (we inherited its environment): not ours to touch.
        tracing::debug!(listen_pid = %pid, "LISTEN_PID is not ours; ignoring LISTEN_FDS");
        return Ok(None);
    }
    let err = |m: String| inherited_error(Activation::Systemd, m);
    let n: RawFd = fds.trim().parse().map_err(|_| err(format!("LISTEN_FDS={fds:?} is not a number")))?;
    for fd in SD_LISTEN_FDS_START..SD_LISTEN_FDS_START.saturating_add(n.max(0)) {
        // SAFETY: fcntl on a descriptor number only reads or sets its flags.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
            return Err(err(format!("LISTEN_FDS={n}, but descriptor {fd} is not open")));
        }
    }
    match n {
        n if n < 1 => Ok(None),
        // SAFETY: LISTEN_PID names us, so systemd gave descriptor 3 to this process, and nothing else here owns it.
        1 => Ok(Some(unsafe { OwnedFd::from_raw_fd(SD_LISTEN_FDS_START) })),
        n => Err(err(format!("{n} sockets; revisd.socket must have exactly one ListenStream="))),
    }
}

/// The inherited descriptor must be a listening Unix stream socket, at a
/// path in a directory that is ours and writable only by us, itself open
/// to nobody else.
fn check_inherited(fd: OwnedFd, from: Activation) -> Result<Inherited, SocketError> {
    let err = |m: String| inherited_error(from, m);
    let raw = fd.as_raw_fd();
    let ty = sockopt(raw, libc::SO_TYPE).map_err(|e| err(format!("descriptor {raw} is not a socket ({e})")))?;
    if ty != libc::SOCK_STREAM {
        return Err(err(format!("descriptor {raw} is not a stream socket")));
    }
    if sockopt(raw, libc::SO_ACCEPTCONN).map_err(|e| err(e.to_string()))? == 0 {
        return Err(err(format!("descriptor {raw} is not listening")));
    }
    let listener = std::os::unix::net::UnixListener::from(fd);
    // std checks the address family: a TCP socket fails here.
    let addr = listener.local_addr().map_err(|e| err(format!("not a Unix socket ({e}); revisd serves only a private socket file")))?;
    let Some(path) = addr.as_pathname().map(Path::to_path_buf) else {
        return Err(err("the socket has no path (abstract or unnamed); revisd serves only a private socket file".into()));
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    check_existing_dir(dir, std::fs::symlink_metadata(dir))?;
    match std::fs::symlink_metadata(&path) {
        Err(e) => return Err(io(&path)(e)),
        Ok(m) if !m.file_type().is_socket() => return Err(refuse(&path, "is not a socket")),
        // Root: the service manager itself may have created it.
        Ok(m) if m.uid() != my_uid() && m.uid() != 0 => return Err(refuse(&path, format!("belongs to uid {}, not to you", m.uid()))),
        Ok(m) if m.mode() & 0o077 != 0 => {
            return Err(refuse(&path, format!("is open to other users (mode {:o}); the socket unit must set mode 0600", m.mode() & 0o777)));
        }
        Ok(_) => {}
    }
    listener.set_nonblocking(true).map_err(io(&path))?;
    // SAFETY: fcntl only sets the flag on a descriptor we own.
    unsafe { libc::fcntl(listener.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(Inherited { listener, path, from })
}

/// An integer SOL_SOCKET option.
fn sockopt(fd: RawFd, name: libc::c_int) -> std::io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: value and len are valid for writes of the sizes given.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, name, (&raw mut value).cast(), &mut len) };
    if r == -1 { Err(std::io::Error::last_os_error()) } else { Ok(value) }
}

/// launchd's socket activation (launch_activate_socket(3), in libSystem).
#[cfg(target_os = "macos")]
mod launchd {
    use std::os::fd::{FromRawFd, OwnedFd};

    use super::{Activation, SocketError, inherited_error};

    unsafe extern "C" {
        /// <launch.h>: the descriptors of the job's `Sockets` entry `name`,
        /// in a malloc'd array the caller frees.
        fn launch_activate_socket(name: *const libc::c_char, fds: *mut *mut libc::c_int, cnt: *mut libc::size_t) -> libc::c_int;
    }

    /// The socket launchd holds for us under `name`; None when we were not
    /// started by launchd (ESRCH) or the job has no such socket (ENOENT).
    pub(super) fn activate(name: &std::ffi::CStr) -> Result<Option<OwnedFd>, SocketError> {
        let mut fds: *mut libc::c_int = std::ptr::null_mut();
        let mut cnt: libc::size_t = 0;
        // SAFETY: name is NUL-terminated; fds and cnt are valid for writes.
        let r = unsafe { launch_activate_socket(name.as_ptr(), &mut fds, &mut cnt) };
        if r == libc::ESRCH || r == libc::ENOENT {
            return Ok(None);
        }
        if r != 0 {
            return Err(inherited_error(Activation::Launchd, std::io::Error::from_raw_os_error(r).to_string()));
        }
        // SAFETY: on success fds points to cnt descriptors that are now ours;
        // the array itself was malloc'd for us to free.
        let owned: Vec<OwnedFd> = (0..cnt).map(|i| unsafe { OwnedFd::from_raw_fd(*fds.add(i)) }).collect();
        unsafe { libc::free(fds.cast()) };
        // One path, one socket; any others are closed here.
        Ok(owned.into_iter().next())
    }
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

    /// What the service manager would hand over: a copy of the descriptor.
    fn handed_over(fd: &impl AsRawFd) -> OwnedFd {
        // SAFETY: dup returns a fresh descriptor that only we own.
        let copy = unsafe { libc::dup(fd.as_raw_fd()) };
        assert!(copy >= 0);
        unsafe { OwnedFd::from_raw_fd(copy) }
    }

    #[tokio::test]
    async fn an_inherited_private_unix_socket_is_served() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("run/revisd.sock");
        let held = bind(&path).await.unwrap();
        let got = check_inherited(handed_over(&held), Activation::Systemd).unwrap();
        assert_eq!(got.path, path);
        let listener = UnixListener::from_std(got.listener).unwrap();
        let (_client, _) = tokio::join!(tokio::net::UnixStream::connect(&path), listener.accept());
        // SAFETY: F_GETFD only reads the flags.
        assert_eq!(unsafe { libc::fcntl(listener.as_raw_fd(), libc::F_GETFD) } & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    }

    #[test]
    fn an_inherited_tcp_or_unlistening_or_abstract_socket_is_refused() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = check_inherited(handed_over(&tcp), Activation::Systemd).unwrap_err().to_string();
        assert!(e.contains("not a Unix socket"), "{e}");

        let tmp = tempfile::tempdir().unwrap();
        let dgram = std::os::unix::net::UnixDatagram::bind(tmp.path().join("d.sock")).unwrap();
        let e = check_inherited(handed_over(&dgram), Activation::Launchd).unwrap_err().to_string();
        assert!(e.contains("launchd") && e.contains("not a stream socket"), "{e}");

        let file = std::fs::File::create(tmp.path().join("plain")).unwrap();
        let e = check_inherited(handed_over(&file), Activation::Systemd).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");

        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            let name = format!("revis-test-{}", std::process::id());
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            let abstract_ = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
            let e = check_inherited(handed_over(&abstract_), Activation::Systemd).unwrap_err().to_string();
            assert!(e.contains("no path"), "{e}");
        }
    }

    #[tokio::test]
    async fn an_inherited_socket_others_can_reach_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("run/revisd.sock");
        let held = bind(&path).await.unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = check_inherited(handed_over(&held), Activation::Systemd).unwrap_err().to_string();
        assert!(e.contains("open to other users"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(path.parent().unwrap(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_inherited(handed_over(&held), Activation::Systemd).unwrap_err().to_string();
        assert!(e.contains("writable by other users"), "{e}");
    }

    /// Whatever stands where the directory goes when revisd creates it (a
    /// link planted between a check and the mkdir) is judged by lstat, and
    /// nothing is created or chmodded through it.
    #[test]
    fn a_link_where_the_directory_goes_is_refused_and_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = tmp.path().join("run");
        std::os::unix::fs::symlink(&target, &dir).unwrap();
        let e = check_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o777, 0o755, "chmodded through the link");
        // A dangling link is not followed to create its target either.
        let dangling = tmp.path().join("dangling");
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), &dangling).unwrap();
        let e = check_dir(&dangling).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(!tmp.path().join("nowhere").exists(), "created through the link");
        // A directory someone else made first with a loose mode is refused, not "fixed".
        let loose = tmp.path().join("loose");
        std::fs::create_dir(&loose).unwrap();
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_dir(&loose).unwrap_err().to_string();
        assert!(e.contains("writable by other users"), "{e}");
        assert_eq!(std::fs::metadata(&loose).unwrap().mode() & 0o777, 0o777);
    }

    /// One test (the environment is the process's): a pipe is taken, a file
    /// or a closed number is not, and the variable is gone each time.
    #[test]
    fn the_ready_fd_is_taken_only_when_it_is_a_pipe_and_never_left_in_the_environment() {
        use std::io::{Read, Write};
        let set = |v: &str| unsafe { std::env::set_var("REVIS_READY_FD", v) };
        let (mut read_end, write_end) = std::io::pipe().unwrap();
        set(&std::os::fd::IntoRawFd::into_raw_fd(write_end).to_string());
        let mut taken = unsafe { take_ready_pipe() }.expect("a pipe is taken");
        assert!(std::env::var_os("REVIS_READY_FD").is_none());
        taken.write_all(b"ready\n").unwrap();
        drop(taken);
        let mut got = String::new();
        read_end.read_to_string(&mut got).unwrap();
        assert_eq!(got, "ready\n");

        let tmp = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(tmp.path().join("log")).unwrap();
        set(&file.as_raw_fd().to_string());
        assert!(unsafe { take_ready_pipe() }.is_none(), "a regular file is not a readiness pipe");
        assert!(std::env::var_os("REVIS_READY_FD").is_none());
        // The file's descriptor is still open and still ours.
        (&file).write_all(b"x").unwrap();

        set("987654");
        assert!(unsafe { take_ready_pipe() }.is_none());
        assert!(std::env::var_os("REVIS_READY_FD").is_none());
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
