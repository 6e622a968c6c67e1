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

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read as _, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::open::{LOCK_POLL, Opened};
use crate::store::Db;
use crate::{Conversation, ConversationId, Fact, FactId, MessageId, StoredMessage, Summary};

/// How long opening waits for a database that is held but not yet served
/// (its holder is starting or ending), and a guest for a holder to take over.
const HOLDER_WAIT: Duration = Duration::from_secs(10);
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
/// The longest request or reply line (a conversation's messages included).
const MAX_LINE: usize = 256 << 20;

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

/// The socket the holder serves the database on: `<dir>/holder.sock`,
/// inside the database's own directory, which is this user's and 0700
/// (checked before connecting), so no other user can put a socket there.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("holder.sock")
}

/// This process's user.
fn my_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// The uid of the process at the other end of `stream` (`SO_PEERCRED` on
/// Linux, `getpeereid` elsewhere), and its pid where the system says it (Linux).
fn peer(stream: &UnixStream) -> std::io::Result<(u32, Option<u32>)> {
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
fn untrusted_dir(dir: &Path) -> Option<String> {
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
fn take_part(dir: &Path) -> Result<(Role, Option<crate::Recovered>)> {
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

/// How a guest's request went wrong on the way.
enum Lost {
    /// Sent, and the holder (this pid) is stopped: it may run it when it
    /// is resumed.
    Stopped(u32),
    /// Not (wholly) sent: the holder cannot have run it.
    Unsent,
    /// Sent, no reply: the holder may have run it.
    Unanswered,
}

/// A guest's connection to the holder.
struct Conn {
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
    fn connect(dir: &Path) -> std::io::Result<Conn> {
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

    fn ask(&mut self, request: &Request) -> std::result::Result<Reply, Lost> {
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

/// One call of [`Store`]'s, as a guest sends it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    Flush,
    CreateConversation {
        title: String,
    },
    Conversations,
    Conversation {
        id: ConversationId,
    },
    SetTitle {
        id: ConversationId,
        title: String,
    },
    DeleteConversation {
        id: ConversationId,
    },
    AppendUser {
        conversation: ConversationId,
        text: String,
    },
    BeginReply {
        conversation: ConversationId,
        tier: String,
    },
    UpdateReply {
        id: MessageId,
        text: String,
    },
    CutReply {
        id: MessageId,
        shown: String,
    },
    CompleteReply {
        id: MessageId,
        text: String,
    },
    Rewind {
        from: MessageId,
    },
    Messages {
        conversation: ConversationId,
    },
    MessagesAfter {
        after: MessageId,
    },
    Message {
        id: MessageId,
    },
    AddFact {
        fact: String,
        source: Option<MessageId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        said: Option<String>,
    },
    Facts,
    RemoveFact {
        id: FactId,
    },
    PutSummary {
        conversation: ConversationId,
        covers_up_to: MessageId,
        text: String,
    },
    Summary {
        conversation: ConversationId,
    },
    SetSetting {
        key: String,
        value: serde_json::Value,
    },
    Setting {
        key: String,
    },
    RemoveSetting {
        key: String,
    },
}

impl Request {
    /// Whether running it twice changes nothing (so it may be asked again).
    fn reads_only(&self) -> bool {
        matches!(
            self,
            Self::Flush
                | Self::Conversations
                | Self::Conversation { .. }
                | Self::Messages { .. }
                | Self::MessagesAfter { .. }
                | Self::Message { .. }
                | Self::Facts
                | Self::Summary { .. }
                | Self::Setting { .. }
        )
    }

    /// Runs it on the holder's database.
    fn run(self, db: &Db) -> Result<serde_json::Value> {
        fn v<T: Serialize>(r: Result<T>) -> Result<serde_json::Value> {
            r.map(|x| serde_json::to_value(x).expect("store values serialize"))
        }
        match self {
            Self::Flush => v(db.flush()),
            Self::CreateConversation { title } => v(db.create_conversation(&title)),
            Self::Conversations => v(db.conversations()),
            Self::Conversation { id } => v(db.conversation(id)),
            Self::SetTitle { id, title } => v(db.set_title(id, &title)),
            Self::DeleteConversation { id } => v(db.delete_conversation(id)),
            Self::AppendUser { conversation, text } => v(db.append_user(conversation, &text)),
            Self::BeginReply { conversation, tier } => v(db.begin_reply(conversation, &tier)),
            Self::UpdateReply { id, text } => v(db.update_reply(id, &text)),
            Self::CutReply { id, shown } => v(db.cut_reply(id, &shown)),
            Self::CompleteReply { id, text } => v(db.complete_reply(id, &text)),
            Self::Rewind { from } => v(db.rewind(from)),
            Self::Messages { conversation } => v(db.messages(conversation)),
            Self::MessagesAfter { after } => v(db.messages_after(after)),
            Self::Message { id } => v(db.message(id)),
            Self::AddFact { fact, source, said } => v(db.add_fact_said(&fact, source, said.as_deref())),
            Self::Facts => v(db.facts()),
            Self::RemoveFact { id } => v(db.remove_fact(id)),
            Self::PutSummary { conversation, covers_up_to, text } => v(db.put_summary(conversation, covers_up_to, &text)),
            Self::Summary { conversation } => v(db.summary(conversation)),
            Self::SetSetting { key, value } => v(db.set_setting(&key, &value)),
            Self::Setting { key } => v(db.setting(&key)),
            Self::RemoveSetting { key } => v(db.remove_setting(&key)),
        }
    }
}

/// The holder's reply: a value, or the error as a guest rebuilds it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reply {
    Ok(serde_json::Value),
    Err(WireError),
}

/// A [`StoreError`] across the socket: the ones a caller may act on by
/// kind, the rest by their words.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum WireError {
    NoConversation(ConversationId),
    NoMessage(MessageId),
    NotAnOpenReply(MessageId),
    WrongConversation { message: MessageId, conversation: ConversationId },
    Other(String),
}

impl From<StoreError> for WireError {
    fn from(e: StoreError) -> WireError {
        match e {
            StoreError::NoConversation(c) => WireError::NoConversation(c),
            StoreError::NoMessage(m) => WireError::NoMessage(m),
            StoreError::NotAnOpenReply(m) => WireError::NotAnOpenReply(m),
            StoreError::WrongConversation { message, conversation } => WireError::WrongConversation { message, conversation },
            other => WireError::Other(other.to_string()),
        }
    }
}

impl Reply {
    fn into_result<T: DeserializeOwned>(self, dir: &Path) -> Result<T> {
        match self {
            Reply::Ok(v) => serde_json::from_value(v)
                .map_err(|e| StoreError::Shared { path: dir.to_path_buf(), message: format!("a reply this revis cannot read: {e}") }),
            Reply::Err(WireError::NoConversation(c)) => Err(StoreError::NoConversation(c)),
            Reply::Err(WireError::NoMessage(m)) => Err(StoreError::NoMessage(m)),
            Reply::Err(WireError::NotAnOpenReply(m)) => Err(StoreError::NotAnOpenReply(m)),
            Reply::Err(WireError::WrongConversation { message, conversation }) => {
                Err(StoreError::WrongConversation { message, conversation })
            }
            Reply::Err(WireError::Other(message)) => Err(StoreError::Shared { path: dir.to_path_buf(), message }),
        }
    }
}

/// The holder's side: accepts guests on the socket, one thread each, until
/// dropped (the store closed); then the socket goes and every guest's
/// connection is shut, so they take over.
struct Server {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    guests: Arc<Mutex<HashMap<u64, UnixStream>>>,
    /// Its other end is the accept loop's; dropping this ends the loop.
    wake: Option<UnixStream>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(dir: &Path, db: Db) -> std::io::Result<Server> {
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

// The calls, each run here when this process holds the database, else by the holder.
impl Store {
    /// Flushes everything written so far to disk.
    pub fn flush(&self) -> Result<()> {
        self.call(Request::Flush, |db| db.flush())
    }

    /// Creates an empty conversation.
    pub fn create_conversation(&self, title: &str) -> Result<ConversationId> {
        self.call(Request::CreateConversation { title: title.into() }, |db| db.create_conversation(title))
    }

    /// Every conversation, most recently updated first.
    pub fn conversations(&self) -> Result<Vec<Conversation>> {
        self.call(Request::Conversations, |db| db.conversations())
    }

    /// One conversation, if it exists.
    pub fn conversation(&self, id: ConversationId) -> Result<Option<Conversation>> {
        self.call(Request::Conversation { id }, |db| db.conversation(id))
    }

    /// Renames a conversation.
    pub fn set_title(&self, id: ConversationId, title: &str) -> Result<()> {
        self.call(Request::SetTitle { id, title: title.into() }, |db| db.set_title(id, title))
    }

    /// Deletes a conversation with its messages and summary; false if there was none.
    pub fn delete_conversation(&self, id: ConversationId) -> Result<bool> {
        self.call(Request::DeleteConversation { id }, |db| db.delete_conversation(id))
    }

    /// Appends a user message (on disk when it returns).
    pub fn append_user(&self, conversation: ConversationId, text: &str) -> Result<MessageId> {
        self.call(Request::AppendUser { conversation, text: text.into() }, |db| db.append_user(conversation, text))
    }

    /// Starts a reply by `tier`, stored [`crate::MessageState::Incomplete`] (on disk when it returns).
    pub fn begin_reply(&self, conversation: ConversationId, tier: &str) -> Result<MessageId> {
        self.call(Request::BeginReply { conversation, tier: tier.into() }, |db| db.begin_reply(conversation, tier))
    }

    /// The text of a reply so far, while it streams (written out by sled within half a second).
    pub fn update_reply(&self, id: MessageId, text_so_far: &str) -> Result<()> {
        self.call(Request::UpdateReply { id, text: text_so_far.into() }, |db| db.update_reply(id, text_so_far))
    }

    /// Ends a reply cut short with the text shown, still incomplete (on disk when it returns).
    pub fn cut_reply(&self, id: MessageId, shown: &str) -> Result<()> {
        self.call(Request::CutReply { id, shown: shown.into() }, |db| db.cut_reply(id, shown))
    }

    /// Completes a reply with its final text (on disk when it returns).
    pub fn complete_reply(&self, id: MessageId, final_text: &str) -> Result<()> {
        self.call(Request::CompleteReply { id, text: final_text.into() }, |db| db.complete_reply(id, final_text))
    }

    /// Removes `from` and every later message of its conversation, with the
    /// summary if it covers any of them, in one transaction (on disk when it
    /// returns); returns the removed messages, in order (none when nothing is
    /// at or after `from`). Their seqs are never given again: the next
    /// message gets a seq above every removed one.
    pub fn rewind(&self, from: MessageId) -> Result<Vec<StoredMessage>> {
        self.call(Request::Rewind { from }, |db| db.rewind(from))
    }

    /// A conversation's messages, in order.
    pub fn messages(&self, conversation: ConversationId) -> Result<Vec<StoredMessage>> {
        self.call(Request::Messages { conversation }, |db| db.messages(conversation))
    }

    /// The messages after `after` in its conversation, in order.
    pub fn messages_after(&self, after: MessageId) -> Result<Vec<StoredMessage>> {
        self.call(Request::MessagesAfter { after }, |db| db.messages_after(after))
    }

    /// One message, if it exists.
    pub fn message(&self, id: MessageId) -> Result<Option<StoredMessage>> {
        self.call(Request::Message { id }, |db| db.message(id))
    }

    /// Adds a fact about the user (on disk when it returns).
    pub fn add_fact(&self, fact: &str, source: Option<MessageId>) -> Result<FactId> {
        self.add_fact_said(fact, source, None)
    }

    /// Adds a fact about the user with the message it came from and the
    /// words of that message it rests on (see [`crate::Fact::said`]).
    pub fn add_fact_said(&self, fact: &str, source: Option<MessageId>, said: Option<&str>) -> Result<FactId> {
        let request = Request::AddFact { fact: fact.into(), source, said: said.map(str::to_owned) };
        self.call(request, |db| db.add_fact_said(fact, source, said))
    }

    /// Every fact, oldest first.
    pub fn facts(&self) -> Result<Vec<Fact>> {
        self.call(Request::Facts, |db| db.facts())
    }

    /// Removes a fact; false if there was none.
    pub fn remove_fact(&self, id: FactId) -> Result<bool> {
        self.call(Request::RemoveFact { id }, |db| db.remove_fact(id))
    }

    /// Sets a conversation's summary, covering its messages up to `covers_up_to`.
    pub fn put_summary(&self, conversation: ConversationId, covers_up_to: MessageId, text: &str) -> Result<()> {
        self.call(Request::PutSummary { conversation, covers_up_to, text: text.into() }, |db| {
            db.put_summary(conversation, covers_up_to, text)
        })
    }

    /// A conversation's summary, if it has one.
    pub fn summary(&self, conversation: ConversationId) -> Result<Option<Summary>> {
        self.call(Request::Summary { conversation }, |db| db.summary(conversation))
    }

    /// Sets a setting (a JSON value by name; on disk when it returns).
    pub fn set_setting(&self, key: &str, value: &serde_json::Value) -> Result<()> {
        self.call(Request::SetSetting { key: key.into(), value: value.clone() }, |db| db.set_setting(key, value))
    }

    /// A setting, if set.
    pub fn setting(&self, key: &str) -> Result<Option<serde_json::Value>> {
        self.call(Request::Setting { key: key.into() }, |db| db.setting(key))
    }

    /// Removes a setting; false if it was not set.
    pub fn remove_setting(&self, key: &str) -> Result<bool> {
        self.call(Request::RemoveSetting { key: key.into() }, |db| db.remove_setting(key))
    }
}
