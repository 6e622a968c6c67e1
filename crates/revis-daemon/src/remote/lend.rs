//! Lending: this machine's CPU and memory for the later layers of a paired
//! device's model (`revisd lend on|off`, `server.lend`; off by default).
//!
//! llama.cpp's RPC server does the work, in a child process of its own
//! (`revisd rpc-worker`): it never returns, serves one client at a time,
//! has no authentication or encryption. So it binds 127.0.0.1 only, on a
//! port chosen here, and the only way in from another machine is server
//! mode's port under ALPN `revis-rpc/1`, for paired devices (`accept.rs`
//! splices such a connection to it). Switching lending off ends the worker
//! and cuts its sessions.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The file that remembers the lending switch (beside server mode's).
const SWITCH_FILE: &str = "lending";
/// How long a new RPC worker may take to listen.
pub const WORKER_START: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LendError {
    #[error("lending is off on this machine; its owner can switch it on with `revisd lend on`")]
    Off,
    #[error("the RPC worker could not start: {0}")]
    Worker(String),
    #[error("cannot remember the lending switch in {path}: {source}")]
    Switch { path: PathBuf, source: std::io::Error },
}

/// The lending switch and the RPC worker behind it.
pub struct Lender {
    state_dir: PathBuf,
    threads: u32,
    inner: Mutex<Inner>,
}

struct Inner {
    on: bool,
    worker: Option<Worker>,
}

struct Worker {
    child: Child,
    addr: SocketAddr,
}

impl Lender {
    /// `configured`: `server.lend`, else the saved position, else off.
    pub fn new(state_dir: PathBuf, configured: Option<bool>, threads: u32) -> Lender {
        let on = configured.unwrap_or_else(|| std::fs::read_to_string(state_dir.join(SWITCH_FILE)).is_ok_and(|s| s.trim() == "on"));
        Lender { state_dir, threads, inner: Mutex::new(Inner { on, worker: None }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_on(&self) -> bool {
        self.lock().on
    }

    /// Switches lending; off ends the worker (the caller cuts the sessions).
    pub fn set(&self, on: bool, remember: bool) -> Result<(), LendError> {
        if remember {
            let path = self.state_dir.join(SWITCH_FILE);
            std::fs::write(&path, if on { "on\n" } else { "off\n" }).map_err(|source| LendError::Switch { path, source })?;
        }
        let mut inner = self.lock();
        inner.on = on;
        if !on && let Some(w) = inner.worker.take() {
            end(w);
        }
        tracing::info!(on, "lending switched");
        Ok(())
    }

    /// Where the RPC worker listens (127.0.0.1), started if it is not
    /// running (first use, or it died). Blocking: call it off the runtime.
    pub fn worker(&self) -> Result<SocketAddr, LendError> {
        let mut inner = self.lock();
        if !inner.on {
            return Err(LendError::Off);
        }
        if let Some(w) = inner.worker.as_mut() {
            match w.child.try_wait() {
                Ok(None) => return Ok(w.addr),
                Ok(Some(status)) => tracing::warn!(%status, "the RPC worker had exited; starting another"),
                Err(e) => tracing::warn!("the RPC worker: {e}; starting another"),
            }
            inner.worker = None;
        }
        let w = self.start()?;
        let addr = w.addr;
        inner.worker = Some(w);
        Ok(addr)
    }

    fn start(&self) -> Result<Worker, LendError> {
        let err = |m: String| LendError::Worker(m);
        // A free port on loopback, given to the worker (llama.cpp binds it
        // itself). Another program could take it in between: the worker
        // then fails to listen and the next connection tries again.
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()).map_err(|e| err(e.to_string()))?.port();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let cache = self.state_dir.join("rpc-cache");
        std::fs::create_dir_all(&cache).map_err(|e| err(format!("{}: {e}", cache.display())))?;
        let exe = std::env::current_exe().map_err(|e| err(e.to_string()))?;
        let mut cmd = Command::new(exe);
        cmd.arg("rpc-worker")
            .arg("--endpoint")
            .arg(addr.to_string())
            .arg("--cache-dir")
            .arg(&cache)
            .arg("--threads")
            .arg(self.threads.to_string())
            // llama.cpp prints its banner and each client to stdout: into revisd's log.
            .stdout(std::io::stderr())
            .stderr(std::io::stderr());
        super::child::die_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| err(e.to_string()))?;
        let deadline = Instant::now() + WORKER_START;
        // Ready once it accepts a connection (it serves that one, sees it
        // close, and waits for the next).
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(err(format!("it exited ({status}) before listening on {addr}")));
            }
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                tracing::info!(%addr, pid = child.id(), "RPC worker listening");
                return Ok(Worker { child, addr });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(err(format!("it did not listen on {addr} within {}s", WORKER_START.as_secs())));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Lender {
    fn drop(&mut self) {
        if let Some(w) = self.lock().worker.take() {
            end(w);
        }
    }
}

/// Ends a worker this revisd started (by its own handle: its PID) and reaps it.
fn end(mut w: Worker) {
    let _ = w.child.kill();
    let _ = w.child.wait();
}

/// `revisd rpc-worker`: serves this machine's CPU on `endpoint` until the
/// process ends; returns only when llama.cpp's server could not start.
pub fn run_worker(endpoint: &str, cache_dir: &std::path::Path, threads: u32) -> revis_engine::EngineError {
    if !endpoint.starts_with("127.0.0.1:") {
        return revis_engine::EngineError::Llama(format!("the RPC worker serves loopback only, not {endpoint}"));
    }
    revis_engine::rpc::serve(endpoint, Some(cache_dir), threads)
}
