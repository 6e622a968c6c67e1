//! The holder's side: serving its database to the guests on the socket, one
//! thread each, until the store is closed.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read as _, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::peer::{my_uid, peer, socket_path};
use super::wire::{MAX_LINE, Reply, Request, WireError};
use crate::store::Db;

/// The holder's side: accepts guests on the socket, one thread each, until
/// dropped (the store closed); then the socket goes and every guest's
/// connection is shut, so they take over.
pub(super) struct Server {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    guests: Arc<Mutex<HashMap<u64, UnixStream>>>,
    /// Its other end is the accept loop's; dropping this ends the loop.
    wake: Option<UnixStream>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub(super) fn start(dir: &Path, db: Db) -> std::io::Result<Server> {
        let path = socket_path(dir);
        // sled's lock is ours: a socket left there is a dead holder's.
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        let stop = Arc::new(AtomicBool::new(false));
        let guests: Arc<Mutex<HashMap<u64, UnixStream>>> = Arc::default();
        // Closing `wake` ends the accept loop: not a connection by path,
        // which fails once the socket file is gone (its directory removed
        // while the store was open).
        let (wake, woken) = UnixStream::pair()?;
        let accept = std::thread::Builder::new().name("revis-store-share".into()).spawn({
            let (stop, guests) = (stop.clone(), guests.clone());
            move || accept_guests(listener, &woken, db, stop, guests)
        })?;
        Ok(Server { path, stop, guests, wake: Some(wake), accept: Some(accept) })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop; then nothing new comes in.
        drop(self.wake.take());
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
        for (_, g) in self.guests.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            let _ = g.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Accepts guests on `listener` until `woken`'s other end is closed.
fn accept_guests(listener: UnixListener, woken: &UnixStream, db: Db, stop: Arc<AtomicBool>, guests: Arc<Mutex<HashMap<u64, UnixStream>>>) {
    use std::os::fd::AsRawFd;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    loop {
        let mut fds = [
            libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: woken.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: `fds` is valid for its length; both descriptors are open.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::warn!(
                "the database's socket cannot be watched: {}; other processes can no longer join",
                std::io::Error::last_os_error()
            );
            return;
        }
        if stop.load(Ordering::SeqCst) || fds[1].revents != 0 {
            return;
        }
        if fds[0].revents == 0 {
            continue;
        }
        let Ok((stream, _)) = listener.accept() else { continue };
        // The directory keeps others out; this says so again for each guest.
        match peer(&stream) {
            Ok((uid, _)) if uid == my_uid() => {}
            other => {
                tracing::warn!("refused a connection to the database from {other:?}: not this user's process");
                continue;
            }
        }
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        if let Ok(copy) = stream.try_clone() {
            guests.lock().unwrap_or_else(|e| e.into_inner()).insert(id, copy);
        }
        let (db, guests) = (db.clone(), guests.clone());
        let _ = std::thread::Builder::new().name("revis-store-guest".into()).spawn(move || {
            serve_guest(stream, &db);
            guests.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        });
    }
}

/// One guest's requests, in order, until it closes.
fn serve_guest(stream: UnixStream, db: &Db) {
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match (&mut reader).take(MAX_LINE as u64).read_line(&mut line) {
            Ok(n) if n > 0 && line.ends_with('\n') => {}
            _ => return,
        }
        let reply = match serde_json::from_str::<Request>(&line) {
            Ok(request) => match request.run(db) {
                Ok(v) => Reply::Ok(v),
                Err(e) => Reply::Err(e.into()),
            },
            Err(e) => Reply::Err(WireError::Other(format!("a request this revis does not understand: {e}"))),
        };
        let mut out = serde_json::to_vec(&reply).expect("replies serialize");
        out.push(b'\n');
        if writer.write_all(&out).is_err() {
            return;
        }
    }
}
