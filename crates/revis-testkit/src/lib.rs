//! Test support: the real models (pulled once into the user's models dir),
//! and [`TestDaemon`], a real `revisd` process on a socket in a temporary
//! directory, killed when the handle drops.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use revis_client::Client;

/// How long a test daemon may take to say it serves.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The path of a catalog model, pulled first if it is missing.
pub fn model(name: &str) -> PathBuf {
    static PULL: Mutex<()> = Mutex::new(());
    let _g = PULL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = revis_models::models_dir().expect("a models dir");
    let entry = revis_models::find(name).unwrap_or_else(|| panic!("{name} is not in the catalog"));
    let opts = revis_models::PullOptions { progress: revis_models::Progress::Quiet, ..Default::default() };
    revis_models::pull(entry, &dir, &opts).unwrap_or_else(|e| panic!("pulling {name}: {e}"))
}

/// The default test model, SmolLM2-135M-Instruct.
pub fn smollm2() -> PathBuf {
    model("smollm2-135m-instruct")
}

pub fn gemma3() -> PathBuf {
    model("gemma3-270m")
}

/// A binary built by this workspace (tests run from target/<profile>/deps).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let p = dir.join(name);
    assert!(p.is_file(), "{} is not built; run the tests with `cargo nextest run --workspace --release`", p.display());
    p
}

/// Builder for a real revisd.
pub struct TestDaemon {
    config: String,
    model: Option<PathBuf>,
}

impl Default for TestDaemon {
    fn default() -> Self {
        Self::new()
    }
}

impl TestDaemon {
    pub fn new() -> Self {
        TestDaemon { config: String::new(), model: None }
    }

    /// Every tier uses this model file (default: SmolLM2).
    pub fn model(mut self, path: PathBuf) -> Self {
        self.model = Some(path);
        self
    }

    /// Extra `[daemon]` settings, TOML lines such as `queue_capacity = 1`.
    pub fn daemon(mut self, toml: &str) -> Self {
        self.config.push_str(toml);
        self.config.push('\n');
        self
    }

    /// Starts revisd and waits until it serves.
    pub fn start(self) -> Running {
        let model = self.model.unwrap_or_else(smollm2);
        let dir = tempfile::Builder::new().prefix("revisd-test").tempdir().expect("temp dir");
        let mut config = format!("[daemon]\nthreads = 2\ncontext = 2048\n{}", self.config);
        for t in ["tier1", "tier2", "tier3"] {
            config.push_str(&format!("[tiers.{t}]\nmodel = {:?}\n", model.display().to_string()));
        }
        let config_path = dir.path().join("revisd.toml");
        std::fs::write(&config_path, config).expect("write config");
        let socket = dir.path().join("run/revisd.sock");
        Running::spawn(dir, &config_path, &socket)
    }
}

/// A running revisd. Dropping it kills the process (SIGKILL) and removes its directory.
pub struct Running {
    pub socket: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Running {
    fn spawn(dir: tempfile::TempDir, config: &Path, socket: &Path) -> Running {
        let log = dir.path().join("revisd.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        let (read_end, write_end) = pipe();
        let child = Command::new(binary("revisd"))
            .arg("--config")
            .arg(config)
            .arg("--socket")
            .arg(socket)
            .env("REVIS_READY_FD", write_end.as_raw_fd().to_string())
            .env("REVIS_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file)
            .spawn()
            .expect("start revisd");
        drop(write_end);
        let mut running = Running { socket: socket.into(), log, child: Some(child), dir };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::fs::File::from(read_end).read_to_string(&mut s);
            let _ = tx.send(s);
        });
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(s) if s.starts_with("ready") => running,
            other => {
                let status = running.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
                panic!("revisd did not become ready ({other:?}, exit {status:?}); log:\n{}", running.log_text());
            }
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.socket).await.expect("connect to the test daemon")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends a signal to the daemon (by its own PID).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill with the PID of a child we started and have not reaped.
        unsafe { libc::kill(self.pid() as i32, sig) };
    }

    /// Waits up to `limit` for the daemon to exit; None if it is still running.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(limit) {
            Ok(status) => status.ok(),
            Err(_) => {
                // Still running: kill it by its PID so the drop guarantee holds.
                // SAFETY: the waiter thread owns the child and reaps it after this.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                None
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- revisd log ({}) ---\n{}", self.log.display(), self.log_text());
        }
    }
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe fills two fresh descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    (r, w)
}
