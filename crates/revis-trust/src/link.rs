//! How a connection between two machines notices that the other one is
//! gone while bytes are in flight: neither TCP keepalive (which waits for
//! an idle connection) nor an HTTP/2 ping (queued behind the unacknowledged
//! data, and a goodbye that blocks on a full send buffer) can tell then.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Has the kernel end the connection on `sock` when data it sent stays
/// unacknowledged for `after` (Linux `TCP_USER_TIMEOUT`; macOS
/// `TCP_RXT_CONNDROPTIME`, whole seconds, rounded up). A blocked read or
/// write then fails instead of waiting for TCP's own limit (about 15
/// minutes on Linux). With keepalive on, it also bounds the probes.
pub fn give_up_unacknowledged(sock: &impl AsRawFd, after: Duration) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let (option, value) = (libc::TCP_USER_TIMEOUT, after.as_millis().clamp(1, libc::c_uint::MAX as u128) as libc::c_uint);
    #[cfg(target_vendor = "apple")]
    let (option, value) = {
        // <netinet/tcp.h>: TCP_RXT_CONNDROPTIME, in seconds.
        const TCP_RXT_CONNDROPTIME: libc::c_int = 0x80;
        (TCP_RXT_CONNDROPTIME, after.as_secs_f64().ceil().clamp(1.0, libc::c_int::MAX as f64) as libc::c_int)
    };
    #[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple")))]
    {
        let _ = (sock, after);
        return Err(io::Error::new(io::ErrorKind::Unsupported, "no TCP user timeout on this OS"));
    }
    #[cfg(any(target_os = "linux", target_os = "android", target_vendor = "apple"))]
    {
        // SAFETY: setsockopt reads `size_of_val(&value)` bytes from a live local.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                option,
                (&raw const value).cast(),
                std::mem::size_of_val(&value) as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_is_set_in_milliseconds() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        give_up_unacknowledged(&tcp, Duration::from_millis(2500)).unwrap();
        let mut got: libc::c_uint = 0;
        let mut len = std::mem::size_of_val(&got) as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into a live local.
        let rc = unsafe { libc::getsockopt(tcp.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, (&raw mut got).cast(), &mut len) };
        assert_eq!(rc, 0);
        assert_eq!(got, 2500);
    }
}
