//! Private loopbacks for the RPC worker and the split engines.
//!
//! llama.cpp's RPC server and client speak plain TCP with no authentication.
//! On the shared loopback any local process (another user's, or another of
//! this user's) could connect to the worker, squat its port, or ride a
//! borrower's tunnel under this user's paired identity. So on Linux each of
//! those children moves into a network namespace of its own before it
//! starts a thread ([`enter`]): its 127.0.0.1 is its alone, and the only
//! way in or out is a Unix socket pair revisd created and handed to it at
//! spawn, over which single connections travel as descriptors
//! ([`send_fd`], [`recv_fd`]). Nothing is bound where another process could
//! reach it, so nothing can be squatted either.
//!
//! Where no namespace can be made (macOS; a Linux that refuses unprivileged
//! user namespaces) the child is refused, and says why, unless the owner
//! set `server.allow_shared_loopback`: then it runs on the shared loopback,
//! and ARCHITECTURE.md and docs/RELIABILITY.md say what then holds.

use std::io;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

/// Moves this process into a network namespace of its own with only its
/// loopback, up, and makes it undumpable (no other process of this user can
/// attach to it, or open its namespace through /proc). As root, a network
/// namespace alone; otherwise a user namespace mapping this user to itself
/// as well (so files are read and written as before).
///
/// # Safety
/// Call it while the process has a single thread: a user namespace can only
/// be entered then, and a network namespace entered later would hold only
/// the calling thread.
#[cfg(target_os = "linux")]
pub unsafe fn enter() -> Result<(), String> {
    use nix::sched::{CloneFlags, unshare};
    use nix::unistd::{getegid, geteuid};
    let (uid, gid) = (geteuid(), getegid());
    // Each step that can fail comes before the one that changes the network:
    // a failure leaves this process on the shared loopback, still working
    // (a user namespace alone changes no network and no file access).
    if !uid.is_root() {
        unshare(CloneFlags::CLONE_NEWUSER)
            .map_err(|e| format!("a user namespace: {e} (does this system allow unprivileged user namespaces?)"))?;
        let write = |file: &str, text: String| std::fs::write(file, text).map_err(|e| format!("{file}: {e}"));
        write("/proc/self/setgroups", "deny".into())?;
        write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    unshare(CloneFlags::CLONE_NEWNET).map_err(|e| format!("a network namespace: {e}"))?;
    // From here there is no way back: a namespace whose loopback stays down
    // reaches nothing, so this process cannot go on.
    if let Err(e) = loopback_up() {
        eprintln!("revisd: in a network namespace of its own whose loopback cannot come up ({e}); exiting");
        std::process::exit(1);
    }
    // SAFETY: prctl with an integer argument touches no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(format!("PR_SET_DUMPABLE: {}", io::Error::last_os_error()));
    }
    Ok(())
}

/// No network namespaces here: the caller stays on the shared loopback.
///
/// # Safety
/// None needed; the signature matches Linux's.
#[cfg(not(target_os = "linux"))]
pub unsafe fn enter() -> Result<(), String> {
    Err(format!("{} has no network namespaces", std::env::consts::OS))
}

/// A new network namespace's `lo` is down: sets it up (SIOCSIFFLAGS).
#[cfg(target_os = "linux")]
fn loopback_up() -> Result<(), String> {
    let err = |what: &str| format!("setting lo up ({what}): {}", io::Error::last_os_error());
    // SAFETY: a plain socket call; the descriptor is owned right after.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(err("socket"));
    }
    // SAFETY: a fresh descriptor of ours.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name and writes the flags of `req`, which outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) } < 0 {
        return Err(err("SIOCGIFFLAGS"));
    }
    // SAFETY: the flags member is the one SIOCGIFFLAGS filled in.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &req) } < 0 {
        return Err(err("SIOCSIFFLAGS"));
    }
    Ok(())
}

/// Sends one connection's descriptor over `chan`, with a one-byte `tag`
/// (which node it is for). The caller may close its copy afterwards.
pub fn send_fd(chan: &UnixStream, tag: u8, fd: BorrowedFd<'_>) -> io::Result<()> {
    let fds = [fd.as_raw_fd()];
    let tag = [tag];
    let iov = [IoSlice::new(&tag)];
    sendmsg::<()>(chan.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&fds)], MsgFlags::empty(), None)?;
    Ok(())
}

/// Receives one descriptor [`send_fd`] sent, with its tag; None when the
/// other end has closed. A message that carries no descriptor is an error.
pub fn recv_fd(chan: &UnixStream) -> io::Result<Option<(u8, OwnedFd)>> {
    recv_fd_raw(chan.as_raw_fd())
}

/// [`recv_fd`] on any Unix stream socket's descriptor (a non-blocking one
/// gives `WouldBlock` when nothing has arrived).
pub fn recv_fd_raw(chan: RawFd) -> io::Result<Option<(u8, OwnedFd)>> {
    let mut tag = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut tag)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    #[cfg(target_os = "linux")]
    let flags = MsgFlags::MSG_CMSG_CLOEXEC;
    #[cfg(not(target_os = "linux"))]
    let flags = MsgFlags::empty();
    let msg = recvmsg::<()>(chan, &mut iov, Some(&mut space), flags)?;
    if msg.bytes == 0 {
        return Ok(None);
    }
    let mut got = None;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: the kernel installed these descriptors in this process for us.
                let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                #[cfg(not(target_os = "linux"))]
                // SAFETY: setting a flag on our own descriptor.
                unsafe {
                    libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC)
                };
                // More than one (a confused sender) closes the rest.
                got.get_or_insert(fd);
            }
        }
    }
    match got {
        Some(fd) => Ok(Some((tag[0], fd))),
        None => Err(io::Error::new(io::ErrorKind::InvalidData, "a message without a descriptor")),
    }
}

/// Makes the program `cmd` runs inherit `fds` (and no other child): their
/// close-on-exec is cleared in the child between fork and exec. The caller
/// keeps each descriptor open until the spawn returns.
pub fn pass_to_child(cmd: &mut std::process::Command, fds: &[RawFd]) {
    use std::os::unix::process::CommandExt;
    let fds = fds.to_vec();
    // SAFETY: only fcntl, which is async-signal-safe, runs between fork and
    // exec, on descriptors the parent holds open across the spawn.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        })
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn a_descriptor_crosses_with_its_tag_and_eof_is_none() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut x, y) = UnixStream::pair().unwrap();
        send_fd(&a, 7, y.as_fd()).unwrap();
        drop(y);
        let (tag, fd) = recv_fd(&b).unwrap().expect("one descriptor");
        assert_eq!(tag, 7);
        let mut y = UnixStream::from(fd);
        x.write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        y.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi", "the received descriptor is the same connection");
        drop(a);
        assert!(recv_fd(&b).unwrap().is_none(), "the sender closed");
    }

    #[test]
    fn a_message_without_a_descriptor_is_refused() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&[1]).unwrap();
        assert_eq!(recv_fd(&b).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
