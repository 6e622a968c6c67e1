//! One database, any number of client processes: the GUI, several
//! `revis chat`, `revis history`, `revis run` and `revis serve` of one user
//! at once, on sled (which one process at a time may open).
//!
//! The first process to open the database holds it (sled's lock) and serves
//! it to the others over a Unix socket inside it (`<dir>/holder.sock`, mode
//! 0600, in the database's own directory, which must be this user's and
//! writable by nobody else), one JSON line a request and one a
//! reply. The others are guests: each [`Store`] call of theirs is a request
//! the holder runs on its own database, so every process reads every other's
//! writes at once, and a write a guest sees acknowledged is on disk (the
//! holder flushes it before replying, as for its own).
//!
//! When the holder ends (closes its store, exits, or is killed), a guest's
//! next call finds the socket gone and takes over: it opens the database
//! itself (sled's lock is free once the holder's process is gone) and serves
//! the rest, who reconnect. A read interrupted that way is asked again; a
//! write whose reply never came is not (it may have been stored), and the
//! caller gets [`StoreError::HolderGone`] saying so.
//!
//! This file is the handle and who plays which part; the rest is in
//! `share/`: the list of operations (`ops.rs`), what crosses the socket
//! (`wire.rs`), [`Store`]'s calls made from that list (`calls.rs`), the
//! guest's connection (`guest.rs`), the holder's server (`holder.rs`), and
//! who is at the other end (`peer.rs`).

mod calls;
mod guest;
mod holder;
mod ops;
mod peer;
mod wire;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

use self::guest::{Conn, Lost};
use self::holder::Server;
pub use self::peer::socket_path;
use self::peer::{my_uid, untrusted_dir};
use self::wire::Request;
use crate::error::{Result, StoreError};
use crate::open::{LOCK_POLL, Recovered};
use crate::store::Db;

/// How long opening waits for a database that is held but not yet served
/// (its holder is starting or ending), and a guest for a holder to take over.
const HOLDER_WAIT: Duration = Duration::from_secs(10);

/// The client's database: a cheap, `Clone`, thread-safe handle, whichever
/// process holds the database (see the module's docs).
///
/// Every method blocks (sled, fsync for durable writes, or the holder's
/// reply): from async code call it through `spawn_blocking` (or a thread of
/// its own). Every write except [`update_reply`](Store::update_reply) is
/// flushed to disk before it returns.
#[derive(Clone)]
pub struct Store(Arc<Inner>);

struct Inner {
    dir: PathBuf,
    role: RwLock<Role>,
}

/// This process's part: holding the database, or asking the one that does.
enum Role {
    Holder { db: Db, _server: Option<Server> },
    Guest(Mutex<Option<Conn>>),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let holder = matches!(*self.0.role.read().unwrap_or_else(|e| e.into_inner()), Role::Holder { .. });
        f.debug_struct("Store").field("path", &self.0.dir).field("holder", &holder).finish()
    }
}

/// An opened store, and what was done if the old database was damaged.
#[derive(Debug)]
pub struct Opened {
    /// The store, ready.
    pub store: Store,
    /// `Some` when the database found was damaged: it was moved aside and
    /// this store is a fresh, empty one. Tell the user.
    pub recovered: Option<Recovered>,
}

impl Store {
    /// Opens the database in `dir`, creating it (mode 0700) if needed: as
    /// its holder when no other process has it open, else as a guest of the
    /// one that has (see the module's docs).
    ///
    /// - An older schema is migrated; a newer one is refused
    ///   ([`StoreError::NewerSchema`]) and left untouched.
    /// - A damaged database (sled reports corruption or fails inside, a
    ///   record that should be there is not, the version stamp or marker
    ///   file `revis-store.json` is unreadable) is renamed to
    ///   `<dir>.damaged-<unix ms>`, a fresh one is created, and
    ///   [`Opened::recovered`] says so. Nothing is deleted or overwritten.
    /// - A directory that cannot be used (permissions, a regular file in the
    ///   way) is [`StoreError::Io`]; one held by a process that serves no
    ///   socket (an older revis) is [`StoreError::Locked`] after
    ///   [`HOLDER_WAIT`]. Those are never treated as damage.
    ///
    /// Blocking (file I/O and fsync), like every method of [`Store`].
    pub fn open(dir: &Path) -> Result<Opened> {
        let (role, recovered) = take_part(dir)?;
        Ok(Opened { store: Store(Arc::new(Inner { dir: dir.to_path_buf(), role: RwLock::new(role) })), recovered })
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.0.dir
    }

    /// Whether this process holds the database (and serves the others).
    pub fn is_holder(&self) -> bool {
        matches!(*self.0.role.read().unwrap_or_else(|e| e.into_inner()), Role::Holder { .. })
    }

    /// Runs `request`: on the database here when this process holds it,
    /// else by the holder; a holder gone is replaced (this process takes
    /// over, or finds the one that did) and a read asked again.
    fn call<T: DeserializeOwned>(&self, request: Request, here: impl Fn(&Db) -> Result<T>) -> Result<T> {
        let deadline = Instant::now() + HOLDER_WAIT;
        loop {
            {
                let role = self.0.role.read().unwrap_or_else(|e| e.into_inner());
                match &*role {
                    Role::Holder { db, .. } => {
                        let db = db.clone();
                        drop(role);
                        return here(&db);
                    }
                    Role::Guest(conn) => {
                        let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(c) = conn.as_mut() {
                            match c.ask(&request) {
                                Ok(reply) => return reply.into_result(&self.0.dir),
                                Err(Lost::Unsent) => {}
                                Err(Lost::Stopped(pid)) => {
                                    // Its reply may still come: this connection is done.
                                    *conn = None;
                                    return Err(StoreError::Shared {
                                        path: self.0.dir.clone(),
                                        message: format!(
                                            "the revis process holding it (pid {pid}) is stopped (suspended with Ctrl-Z?): resume it (`fg` in its terminal) or end it{}",
                                            if request.reads_only() { "" } else { "; this change may be stored when it resumes" }
                                        ),
                                    });
                                }
                                Err(Lost::Unanswered) if request.reads_only() => {}
                                Err(Lost::Unanswered) => {
                                    *conn = None;
                                    return Err(StoreError::HolderGone { path: self.0.dir.clone() });
                                }
                            }
                        }
                        *conn = None;
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(StoreError::Shared {
                    path: self.0.dir.clone(),
                    message: "no process holds it, and it cannot be opened here".into(),
                });
            }
            self.take_over()?;
        }
    }

    /// After the holder went: hold the database here, or connect to the
    /// process that took it over.
    fn take_over(&self) -> Result<()> {
        let mut role = self.0.role.write().unwrap_or_else(|e| e.into_inner());
        if let Role::Guest(conn) = &*role
            && conn.lock().unwrap_or_else(|e| e.into_inner()).is_none()
        {
            let (new, recovered) = take_part(&self.0.dir)?;
            if let Some(r) = recovered {
                tracing::warn!("{r}");
            }
            if matches!(new, Role::Holder { .. }) {
                tracing::info!(path = %self.0.dir.display(), "the process holding the database ended; this one holds it now");
            }
            *role = new;
        }
        Ok(())
    }
}

/// Holder if the database is free, else guest of the process serving it;
/// waits [`HOLDER_WAIT`] for one that holds it but serves no socket yet.
fn take_part(dir: &Path) -> Result<(Role, Option<Recovered>)> {
    // Someone else's directory (made first in a folder anyone may write):
    // neither held nor joined, whoever serves it.
    if let Ok(meta) = std::fs::metadata(dir)
        && std::os::unix::fs::MetadataExt::uid(&meta) != my_uid()
        && let Some(why) = untrusted_dir(dir)
    {
        return Err(StoreError::Shared { path: dir.to_path_buf(), message: format!("{why}; it is not used") });
    }
    let deadline = Instant::now() + HOLDER_WAIT;
    loop {
        match Db::open_exclusive(dir) {
            Ok((db, recovered)) => {
                // Not served (a path too long for a socket, say): this process
                // still has it, and the others are told it is in use.
                let server = Server::start(dir, db.clone())
                    .map_err(|e| {
                        tracing::warn!(
                            "cannot serve the database to other revis processes at {}: {e}; they cannot open it while this one runs",
                            socket_path(dir).display()
                        )
                    })
                    .ok();
                return Ok((Role::Holder { db, _server: server }, recovered));
            }
            Err(StoreError::Locked { path }) => match Conn::connect(dir) {
                Ok(conn) => return Ok((Role::Guest(Mutex::new(Some(conn))), None)),
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    return Err(StoreError::Shared { path, message: e.to_string() });
                }
                Err(_) if Instant::now() < deadline => std::thread::sleep(LOCK_POLL),
                Err(_) => return Err(StoreError::Locked { path }),
            },
            Err(e) => return Err(e),
        }
    }
}
