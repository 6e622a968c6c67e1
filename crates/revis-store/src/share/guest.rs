//! A guest's side: its connection to the holder, one request and its reply
//! at a time, telling a holder that was stopped from a slow one.

use std::io::{BufRead, BufReader, Read as _, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::peer::{my_uid, peer, socket_path, untrusted_dir};
use super::wire::{MAX_LINE, Reply, Request};

/// How long a guest waits for the holder's reply to one request.
const REPLY_WAIT: Duration = Duration::from_secs(60);
/// How often a guest waiting for a reply checks that the holder was not
/// stopped (Linux, where its pid and state are known).
const STOPPED_CHECK: Duration = Duration::from_secs(2);

/// Whether process `pid` is stopped (`T`, or `t` under a tracer), by its
/// `/proc` state; false where that cannot be read.
fn stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_some_and(|s| s == "T" || s == "t")
}

/// How a guest's request went wrong on the way.
pub(super) enum Lost {
    /// Sent, and the holder (this pid) is stopped: it may run it when it
    /// is resumed.
    Stopped(u32),
    /// Not (wholly) sent: the holder cannot have run it.
    Unsent,
    /// Sent, no reply: the holder may have run it.
    Unanswered,
}

/// A guest's connection to the holder.
pub(super) struct Conn {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
    /// The holder's pid, where known: a holder that was stopped (Ctrl-Z)
    /// is told from a slow one by its state.
    holder: Option<u32>,
}

impl Conn {
    /// Connects to the holder's socket, once the directory it is in and
    /// the process listening on it are found to be this user's; otherwise
    /// an error of kind `PermissionDenied` that says why.
    pub(super) fn connect(dir: &Path) -> std::io::Result<Conn> {
        let denied = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
        if let Some(why) = untrusted_dir(dir) {
            return Err(denied(format!("{why}; another user could serve this database in its place, so it is not used")));
        }
        let stream = UnixStream::connect(socket_path(dir))?;
        let (peer, pid) = peer(&stream)?;
        if peer != my_uid() {
            return Err(denied(format!(
                "the process serving {} runs as uid {peer}, not as you ({}); another user may be impersonating revis: nothing was sent to it",
                socket_path(dir).display(),
                my_uid()
            )));
        }
        stream.set_read_timeout(Some(STOPPED_CHECK))?;
        Ok(Conn { reader: BufReader::new(stream.try_clone()?), writer: stream, holder: pid })
    }

    pub(super) fn ask(&mut self, request: &Request) -> std::result::Result<Reply, Lost> {
        let mut line = serde_json::to_vec(request).map_err(|_| Lost::Unsent)?;
        line.push(b'\n');
        self.writer.write_all(&line).map_err(|_| Lost::Unsent)?;
        // Read in steps of STOPPED_CHECK (the socket's read timeout); what
        // a step read stays in `reply`.
        let mut reply = Vec::new();
        let started = Instant::now();
        loop {
            match (&mut self.reader).take((MAX_LINE - reply.len()) as u64).read_until(b'\n', &mut reply) {
                Ok(n) if n > 0 && reply.ends_with(b"\n") => return serde_json::from_slice(&reply).map_err(|_| Lost::Unanswered),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    if let Some(pid) = self.holder.filter(|p| stopped(*p)) {
                        return Err(Lost::Stopped(pid));
                    }
                    if started.elapsed() >= REPLY_WAIT {
                        return Err(Lost::Unanswered);
                    }
                }
                _ => return Err(Lost::Unanswered),
            }
        }
    }
}
