//! Lending: this machine's CPU and memory for the later layers of a paired
//! device's model (`revisd lend on|off`, `server.lend`; off by default).
//!
//! llama.cpp's RPC server does the work, in a child process of its own
//! (`revisd rpc-worker`): it never returns, serves one client at a time,
//! has no authentication or encryption. So the worker moves into a network
//! namespace of its own first (`private_net`) and listens on that private
//! loopback, where no other process can reach or squat it; revisd hands it
//! each session as a descriptor over a socket pair made at spawn. The only
//! way in from another machine is server mode's port under ALPN
//! `revis-rpc/1`, for paired devices (`accept.rs` splices such a connection
//! to a session). Switching lending off ends the worker and cuts its
//! sessions.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::private_net;

/// The variable naming the descriptor of the worker's end of its sessions
/// socket pair.
pub const SESSIONS_FD: &str = "REVIS_SESSIONS_FD";
/// The file that remembers the lending switch (beside server mode's).
const SWITCH_FILE: &str = "lending";
/// Lending sessions one paired device may hold at once (a split tier's
/// engine takes one; the global bound is `server.max_connections`).
pub const MAX_SESSIONS_PER_DEVICE: usize = 4;
/// How long a new RPC worker may take to listen.
pub const WORKER_START: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LendError {
    #[error("lending is off on this machine; its owner can switch it on with `revisd lend on`")]
    Off,
    #[error("the RPC worker could not start: {0}")]
    Worker(String),
    #[error(
        "the RPC worker cannot start here: it would listen on this machine's shared loopback, where any local \
         process could reach it ({0}). Let this user make network namespaces (docs/RELIABILITY.md, \"No private \
         loopback\", says how), or accept the risk with `server.allow_shared_loopback = true`"
    )]
    SharedLoopback(String),
    #[error(
        "this device holds {0} lending sessions here already, the most one device may (a split tier takes one); \
         its others must end first"
    )]
    TooManySessions(usize),
    #[error("cannot remember the lending switch in {path}: {source}")]
    Switch { path: PathBuf, source: std::io::Error },
}

/// The lending switch and the RPC worker behind it.
pub struct Lender {
    state_dir: PathBuf,
    threads: u32,
    /// The worker's address-space limit (`server.lend_memory_mb`).
    memory: u64,
    /// The weight cache's size limit (`server.rpc_cache_mb`).
    cache_limit: u64,
    /// `server.allow_shared_loopback`.
    allow_shared: bool,
    /// Why the last worker start was refused (no private loopback, not
    /// allowed a shared one); None once one starts.
    refused: Mutex<Option<String>>,
    /// The switch, read by Status without waiting behind a worker's start.
    on: AtomicBool,
    /// The worker, held while one starts (up to [`WORKER_START`]).
    worker: Mutex<Option<Worker>>,
}

struct Worker {
    child: Child,
    /// revisd's end of the sessions socket pair: each session travels as a descriptor.
    sessions: UnixStream,
}

impl Lender {
    /// `configured`: `server.lend`, else the saved position, else off.
    pub fn new(state_dir: PathBuf, configured: Option<bool>, threads: u32, memory: u64, cache_limit: u64, allow_shared: bool) -> Lender {
        let on = configured.unwrap_or_else(|| std::fs::read_to_string(state_dir.join(SWITCH_FILE)).is_ok_and(|s| s.trim() == "on"));
        Lender {
            state_dir,
            threads,
            memory,
            cache_limit,
            allow_shared,
            refused: Mutex::new(None),
            on: AtomicBool::new(on),
            worker: Mutex::new(None),
        }
    }

    /// Why lending cannot serve here, when the last try to start its worker
    /// found no private loopback (and a shared one is not allowed).
    pub fn refusal(&self) -> Option<String> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Starts the worker now if it is not running, so that `revisd lend on`
    /// and status say at once whether lending can serve. Blocking (up to
    /// [`WORKER_START`]).
    pub fn check(&self) -> Result<(), LendError> {
        let mut worker = self.lock();
        if !self.is_on() {
            return Err(LendError::Off);
        }
        self.running(&mut worker)?;
        Ok(())
    }

    /// The running worker, started if there is none (first use, or it died).
    fn running<'a>(&self, worker: &'a mut Option<Worker>) -> Result<&'a Worker, LendError> {
        if let Some(w) = worker.as_mut() {
            match w.child.try_wait() {
                Ok(None) => {}
                Ok(Some(status)) => {
                    tracing::warn!(%status, "the RPC worker had exited; starting another");
                    *worker = None;
                }
                Err(e) => {
                    tracing::warn!("the RPC worker: {e}; starting another");
                    *worker = None;
                }
            }
        }
        if worker.is_none() {
            let started = self.start();
            *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = match &started {
                Err(e @ LendError::SharedLoopback(_)) => Some(e.to_string()),
                _ => None,
            };
            *worker = Some(started?);
        }
        Ok(worker.as_ref().expect("started above"))
    }

    /// Trims the weight cache to `server.rpc_cache_mb`, least recently used
    /// first. At each worker start and after each session (llama.cpp writes
    /// the cache itself, while a session sends weights). Blocking.
    pub fn trim_cache(&self) {
        let dir = self.state_dir.join(CACHE_DIR);
        match trim(&dir, self.cache_limit) {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, limit_mb = self.cache_limit >> 20, "trimmed the RPC weight cache to server.rpc_cache_mb"),
            Err(e) => tracing::warn!("trimming the RPC weight cache in {}: {e}", dir.display()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Worker>> {
        self.worker.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }

    /// Switches lending; off ends the worker (the caller cuts the sessions).
    pub fn set(&self, on: bool, remember: bool) -> Result<(), LendError> {
        if remember {
            let path = self.state_dir.join(SWITCH_FILE);
            std::fs::write(&path, if on { "on\n" } else { "off\n" }).map_err(|source| LendError::Switch { path, source })?;
        }
        self.on.store(on, Ordering::SeqCst);
        if !on && let Some(w) = self.lock().take() {
            end(w);
        }
        tracing::info!(on, "lending switched");
        Ok(())
    }

    /// A new session with the RPC worker (started if it is not running:
    /// first use, or it died): a connected socket whose other end the worker
    /// relays to llama.cpp's server on its private loopback. Blocking: call
    /// it off the runtime.
    pub fn session(&self) -> Result<UnixStream, LendError> {
        let mut worker = self.lock();
        if !self.is_on() {
            return Err(LendError::Off);
        }
        let w = self.running(&mut worker)?;
        let (ours, theirs) = UnixStream::pair().map_err(|e| LendError::Worker(format!("a socket pair: {e}")))?;
        if let Err(e) = private_net::send_fd(&w.sessions, 0, theirs.as_fd()) {
            // It is going away: the next session starts another.
            if let Some(w) = worker.take() {
                end(w);
            }
            return Err(LendError::Worker(format!("the RPC worker took no session: {e}")));
        }
        Ok(ours)
    }

    fn start(&self) -> Result<Worker, LendError> {
        let err = |m: String| LendError::Worker(m);
        let cache = self.state_dir.join(CACHE_DIR);
        std::fs::create_dir_all(&cache).map_err(|e| err(format!("{}: {e}", cache.display())))?;
        self.trim_cache();
        let exe = std::env::current_exe().map_err(|e| err(e.to_string()))?;
        let (sessions, theirs) = UnixStream::pair().map_err(|e| err(format!("a socket pair: {e}")))?;
        let (ready_read, ready_write) = UnixStream::pair().map_err(|e| err(format!("a socket pair: {e}")))?;
        let (theirs_fd, ready_fd) = (theirs.as_raw_fd(), ready_write.as_raw_fd());
        let mut cmd = Command::new(exe);
        cmd.arg("rpc-worker")
            .arg("--cache-dir")
            .arg(&cache)
            .arg("--threads")
            .arg(self.threads.to_string())
            .arg("--memory-limit")
            .arg(self.memory.to_string())
            .args(self.allow_shared.then_some("--allow-shared-loopback"))
            .env(SESSIONS_FD, theirs_fd.to_string())
            .env(WORKER_READY_FD, ready_fd.to_string())
            // llama.cpp prints its banner and each client to stdout: into revisd's log.
            .stdout(std::io::stderr())
            .stderr(std::io::stderr());
        // Both descriptors stay open in the parent until spawn returns.
        private_net::pass_to_child(&mut cmd, &[theirs_fd, ready_fd]);
        super::child::die_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| err(e.to_string()))?;
        drop((theirs, ready_write));
        // Ready once its relay reached llama.cpp's server: it says "ready"
        // (and why its loopback is shared, if it is), or closes the pair.
        let said = read_ready(ready_read, WORKER_START);
        match said {
            Some(s) if s.starts_with("ready") => {
                tracing::info!(pid = child.id(), "RPC worker ready {}", s.trim_start_matches("ready").trim());
                Ok(Worker { child, sessions })
            }
            Some(s) if s.starts_with(REFUSED) => {
                let _ = child.wait();
                let why = s[REFUSED.len()..].trim().to_owned();
                tracing::warn!(
                    "lending cannot serve: no private loopback for the RPC worker ({why}), and server.allow_shared_loopback is off"
                );
                Err(LendError::SharedLoopback(why))
            }
            _ => {
                let _ = child.kill();
                let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                Err(err(format!("it did not become ready within {}s ({status}; revisd's log says more)", WORKER_START.as_secs())))
            }
        }
    }
}

/// The weight cache's directory in `state_dir`.
const CACHE_DIR: &str = "rpc-cache";

/// Removes the least recently used files of `dir` (by access time, else
/// modification time) until what is left fits in `limit` bytes; how many went.
fn trim(dir: &std::path::Path, limit: u64) -> std::io::Result<usize> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_file() {
            let used = meta.accessed().or_else(|_| meta.modified()).unwrap_or(std::time::UNIX_EPOCH);
            files.push((used, meta.len(), entry.path()));
        }
    }
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    files.sort();
    let mut removed = 0;
    for (_, len, path) in files {
        if total <= limit {
            break;
        }
        std::fs::remove_file(&path)?;
        total -= len;
        removed += 1;
    }
    Ok(removed)
}

/// The variable naming the descriptor the worker says "ready" on.
const WORKER_READY_FD: &str = "REVIS_WORKER_READY_FD";

/// What the worker wrote before closing its end, if it did within `limit`.
fn read_ready(mut from: UnixStream, limit: Duration) -> Option<String> {
    from.set_read_timeout(Some(limit)).ok()?;
    let mut said = String::new();
    from.read_to_string(&mut said).ok()?;
    Some(said)
}

impl Drop for Lender {
    fn drop(&mut self) {
        if let Some(w) = self.lock().take() {
            end(w);
        }
    }
}

/// Ends a worker this revisd started (by its own handle: its PID) and reaps it.
fn end(mut w: Worker) {
    let _ = w.child.kill();
    let _ = w.child.wait();
}

/// What `revisd rpc-worker` takes from its revisd before any thread starts.
pub struct WorkerStart {
    /// The sessions socket pair's worker end.
    pub sessions: UnixStream,
    /// Where to say "ready".
    pub ready: Option<UnixStream>,
    /// Why its loopback is shared with the machine's other processes, when it is.
    pub shared: Option<String>,
}

impl WorkerStart {
    /// Takes the inherited descriptors and moves into a private network
    /// namespace (see [`private_net`]).
    ///
    /// # Safety
    /// Call it first thing, while the process has a single thread.
    pub unsafe fn take() -> Result<WorkerStart, String> {
        // SAFETY: single-threaded, by our caller's contract.
        let sessions = unsafe { crate::transport::socket::take_inherited_socket(SESSIONS_FD) }
            .ok_or_else(|| format!("started without {SESSIONS_FD} (revisd starts it; it is not run by hand)"))?;
        // SAFETY: as above.
        let ready = unsafe { crate::transport::socket::take_inherited_socket(WORKER_READY_FD) };
        // SAFETY: as above.
        let shared = unsafe { private_net::enter() }.err();
        Ok(WorkerStart { sessions, ready, shared })
    }
}

/// What a lender that cannot serve a session sends before it closes, the
/// reason after it and a newline: the borrower then says why, instead of
/// "closed without a word". llama.cpp's RPC server never speaks first, and
/// its answers start with a little-endian size, never with 0xFF.
pub const REFUSAL_MARK: &[u8] = b"\xffrevis-refused: ";
/// The most of a refusal's reason a borrower reads.
const REFUSAL_MAX: usize = 1024;

/// The bytes a lender sends to refuse a session because of `e`.
pub fn refusal(e: &LendError) -> Vec<u8> {
    let mut out = REFUSAL_MARK.to_vec();
    let said: String = e.to_string().chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let mut end = said.len().min(REFUSAL_MAX - REFUSAL_MARK.len() - 1);
    while !said.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&said.as_bytes()[..end]);
    out.push(b'\n');
    out
}

/// In a borrower: the reason a lender gave for refusing, when `first` (the
/// first bytes it sent) starts a refusal; reads the rest of it from `more`
/// (at most [`REFUSAL_MAX`] bytes in all, for at most 2 s). None when
/// `first` is an ordinary answer.
pub async fn refusal_said(first: &[u8], more: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let head = &first[..first.len().min(REFUSAL_MARK.len())];
    if head.is_empty() || !REFUSAL_MARK.starts_with(head) {
        return None;
    }
    let mut said = first.to_vec();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut buf = [0u8; 256];
    while !said.contains(&b'\n') && said.len() < REFUSAL_MAX {
        match tokio::time::timeout_at(deadline, more.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => said.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    if !said.starts_with(REFUSAL_MARK) {
        return Some("it sent something that is not an answer".into());
    }
    let text = &said[REFUSAL_MARK.len()..said.len().min(REFUSAL_MAX)];
    let text = text.split(|b| *b == b'\n').next().unwrap_or_default();
    Some(String::from_utf8_lossy(text).trim().to_owned())
}

/// What a worker or split engine says, in place of "ready", when it has no
/// private loopback and may not use the shared one; the reason follows.
pub const REFUSED: &str = "refused:";

/// `revisd rpc-worker`: serves this machine's CPU on its (private) loopback
/// until the process ends, each session relayed from a descriptor revisd
/// sends; returns only when llama.cpp's server could not start, or when it
/// has no private loopback and `allow_shared` (`--allow-shared-loopback`)
/// does not let it use the shared one.
pub fn run_worker(
    start: WorkerStart,
    cache_dir: &std::path::Path,
    threads: u32,
    memory_limit: u64,
    allow_shared: bool,
) -> revis_engine::EngineError {
    let WorkerStart { sessions, ready, shared } = start;
    if let (Some(why), false) = (&shared, allow_shared) {
        if let Some(mut r) = ready {
            let _ = writeln!(r, "{REFUSED} {why}");
        }
        return revis_engine::EngineError::Llama(format!(
            "no private loopback ({why}), and server.allow_shared_loopback is off: not listening on the shared one"
        ));
    }
    // A paired device's request for a buffer past this fails (llama.cpp
    // ends that session) instead of taking this machine's memory.
    let limit = libc::rlimit { rlim_cur: memory_limit as libc::rlim_t, rlim_max: memory_limit as libc::rlim_t };
    // SAFETY: setrlimit reads the struct, which outlives the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) } != 0 {
        tracing::warn!("cannot limit the RPC worker's memory to {memory_limit} bytes: {}", std::io::Error::last_os_error());
    }
    if let Some(why) = &shared {
        tracing::warn!("no private loopback for the RPC worker ({why}): other local processes can reach its port");
    }
    // Alone in its namespace, a port taken and given back stays free.
    let port = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()) {
        Ok(a) => a.port(),
        Err(e) => return revis_engine::EngineError::Llama(format!("no loopback port: {e}")),
    };
    let endpoint = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    std::thread::Builder::new()
        .name("revis-sessions".into())
        .spawn(move || relay_sessions(sessions, ready, endpoint, shared))
        .expect("start the sessions thread");
    revis_engine::rpc::serve(&endpoint.to_string(), Some(cache_dir), threads)
}

/// In the worker: waits until llama.cpp listens, says "ready", then relays
/// each session revisd sends; exits the process when revisd closes the pair.
fn relay_sessions(sessions: UnixStream, ready: Option<UnixStream>, endpoint: SocketAddr, shared: Option<String>) {
    let deadline = Instant::now() + WORKER_START;
    // Ready once it accepts a connection (it serves that one, sees it close,
    // and waits for the next).
    while TcpStream::connect_timeout(&endpoint, Duration::from_millis(200)).is_err() {
        if Instant::now() > deadline {
            eprintln!("revisd rpc-worker: llama.cpp's server did not listen on {endpoint} within {}s", WORKER_START.as_secs());
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(mut r) = ready {
        let loopback = match &shared {
            None => "private loopback".to_owned(),
            Some(why) => format!("shared loopback: {why}"),
        };
        let _ = writeln!(r, "ready ({loopback})");
    }
    loop {
        match private_net::recv_fd(&sessions) {
            Ok(Some((_, fd))) => {
                let session = UnixStream::from(fd);
                let _ = std::thread::Builder::new().name("revis-session".into()).spawn(move || relay(session, endpoint));
            }
            Ok(None) => std::process::exit(0),
            Err(e) => {
                eprintln!("revisd rpc-worker: the sessions socket: {e}");
                std::process::exit(1);
            }
        }
    }
}

/// One session: bytes both ways between revisd's socket and llama.cpp's
/// server, each direction's end passed on, until both have ended.
fn relay(session: UnixStream, endpoint: SocketAddr) {
    let Ok(tcp) = TcpStream::connect(endpoint) else { return };
    let _ = tcp.set_nodelay(true);
    let (Ok(mut session_r), Ok(mut tcp_r)) = (session.try_clone(), tcp.try_clone()) else { return };
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = std::io::copy(&mut session_r, &mut &tcp);
            let _ = tcp.shutdown(Shutdown::Write);
        });
        let _ = std::io::copy(&mut tcp_r, &mut &session);
        let _ = session.shutdown(Shutdown::Both);
        let _ = tcp.shutdown(Shutdown::Both);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refusal_reads_back_as_its_reason_and_an_answer_is_not_one() {
        let sent = refusal(&LendError::SharedLoopback("a user namespace: EPERM\nsecond line".into()));
        assert!(sent.len() <= REFUSAL_MAX && sent.ends_with(b"\n"));
        // In one piece, and in two.
        let said = refusal_said(&sent, &mut &b""[..]).await.expect("a refusal");
        assert!(said.starts_with("the RPC worker cannot start here") && said.contains("EPERM second line"), "{said}");
        assert_eq!(refusal_said(&sent[..3], &mut &sent[3..]).await.as_deref(), Some(said.as_str()));
        // HELLO's answer: a 28-byte size first.
        let mut answer = 28u64.to_le_bytes().to_vec();
        answer.extend_from_slice(&[3, 0, 0, 0]);
        assert_eq!(refusal_said(&answer, &mut &b""[..]).await, None);
        assert_eq!(refusal_said(b"", &mut &b""[..]).await, None);
        let long = refusal(&LendError::Worker("x".repeat(5000)));
        assert_eq!(long.len(), REFUSAL_MAX, "a long reason is cut to the bound");
    }

    #[test]
    fn the_cache_keeps_the_most_recently_used_within_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = std::time::SystemTime::now() - Duration::from_secs(3600);
        for (i, name) in ["old", "mid", "new"].iter().enumerate() {
            let path = dir.path().join(name);
            std::fs::write(&path, vec![0u8; 1000]).unwrap();
            let at = t0 + Duration::from_secs(60 * i as u64);
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_times(std::fs::FileTimes::new().set_accessed(at).set_modified(at))
                .unwrap();
        }
        assert_eq!(trim(dir.path(), 3000).unwrap(), 0, "within the limit: nothing goes");
        assert_eq!(trim(dir.path(), 2500).unwrap(), 1);
        assert!(!dir.path().join("old").exists() && dir.path().join("mid").exists() && dir.path().join("new").exists());
        assert_eq!(trim(dir.path(), 0).unwrap(), 2, "a limit below every file empties it");
    }
}
