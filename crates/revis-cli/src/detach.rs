//! Leaving an interactive `revis chat` at once, while its background work
//! (the profile, summaries, tier3's follow-ups) goes on and is stored.
//!
//! The shell waits for the process it started, so that process must end
//! when the person leaves; the work must not. Before any thread exists
//! (`split`, from `main`), an interactive `revis chat` forks:
//! - the first process (the one the shell waits for) only waits: for a
//!   byte on a pipe, then it exits 0 at once (the chat ended and handed its
//!   work on); or for the pipe to close without one, then it exits with the
//!   second process's own status (an error, Ctrl-C, no background work).
//!   It ignores SIGINT and SIGQUIT: Ctrl-C is the chat's to handle.
//! - the second runs the chat. Leaving with background work outstanding it
//!   calls [`release`]: its standard streams go to /dev/null, it leaves the
//!   terminal's session (a closed terminal sends it no SIGHUP), the byte
//!   goes out, and it finishes the work before it exits. Meanwhile it holds
//!   the database as any revis process does, and others reach it through
//!   the holder's socket.
//!
//! Piped input (`printf 'Hi\n' | revis chat`) is a script's: there revis
//! chat waits for its work, so the command after it sees what it stored.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

/// Descriptors below this are checked for a terminal left open ([`release`]).
const MAX_FD: i32 = 1024;

/// The second process's end of the pipe, until [`release`].
static RELEASE: Mutex<Option<OwnedFd>> = Mutex::new(None);

/// Forks an interactive `revis chat` into a waiter and the chat (see the
/// module doc). Returns in the chat's process (or where no fork could be
/// made: then `revis chat` waits for its work before it exits, as before);
/// the waiter's process never returns from here.
///
/// # Safety
/// No other thread may exist yet: the child of a fork has only the thread
/// that forked.
pub unsafe fn split() {
    // Neither end may leak into what revis starts (revisd, above all: the
    // waiter would wait for it too): std's pipe makes both close-on-exec.
    let Ok((read_end, write_end)) = std::io::pipe() else { return };
    let (read_end, write_end) = (OwnedFd::from(read_end), OwnedFd::from(write_end));
    // SAFETY: the caller promises there is one thread.
    match unsafe { libc::fork() } {
        -1 => {}
        0 => {
            drop(read_end);
            *RELEASE.lock().unwrap_or_else(|e| e.into_inner()) = Some(write_end);
        }
        chat => {
            drop(write_end);
            wait_for(read_end, chat)
        }
    }
}

/// The waiter: exits 0 on the chat's byte, else with the chat's status.
fn wait_for(read_end: OwnedFd, chat: libc::pid_t) -> ! {
    // SAFETY: changing this process's dispositions; it runs no handlers.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
    let mut pipe = std::fs::File::from(read_end);
    let mut byte = [0u8; 1];
    loop {
        match pipe.read(&mut byte) {
            Ok(1) => std::process::exit(0),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            _ => break,
        }
    }
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(chat, &mut status, 0) };
        if r == -1 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if r == -1 {
            std::process::exit(1);
        }
        break;
    }
    if libc::WIFEXITED(status) {
        std::process::exit(libc::WEXITSTATUS(status));
    }
    std::process::exit(128 + if libc::WIFSIGNALED(status) { libc::WTERMSIG(status) } else { 0 })
}

/// Whether [`release`] can give the terminal back (a waiter was made).
pub fn armed() -> bool {
    RELEASE.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}

/// In the chat's process: gives the terminal back (see the module doc) and
/// returns true; false where `split` made no waiter (then the caller waits
/// with the terminal, as before). Call it after the line editor has
/// restored the terminal, with everything meant for the screen written.
pub fn release() -> bool {
    let Some(write_end) = RELEASE.lock().unwrap_or_else(|e| e.into_inner()).take() else { return false };
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        // SAFETY: dup2 onto the standard descriptors, which this process owns.
        unsafe {
            for fd in 0..3 {
                libc::dup2(null.as_raw_fd(), fd);
            }
        }
    }
    // Any other descriptor on a terminal (one a parent left open to us)
    // would keep the terminal from closing: closed too.
    for fd in 3..MAX_FD {
        // SAFETY: isatty reads a descriptor's kind; closing one that is a
        // terminal, which nothing in revis opens.
        unsafe {
            if libc::isatty(fd) == 1 {
                libc::close(fd);
            }
        }
    }
    // SAFETY: setsid has no memory effects; it fails harmlessly for a group leader.
    unsafe { libc::setsid() };
    let mut pipe = std::fs::File::from(write_end);
    let _ = pipe.write_all(&[1]);
    true
}
