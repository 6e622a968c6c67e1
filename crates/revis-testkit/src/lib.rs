//! Test support: the real models (pulled once into the user's models dir),
//! and [`TestDaemon`], a real `revisd` process on a socket in a temporary
//! directory, killed when the handle drops; or on a socket the test holds
//! the way systemd does ([`HeldSocket`], socket activation).

pub mod netns;

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
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

/// A binary built by this workspace (tests run from `target/<profile>/deps`).
pub fn binary(name: &str) -> PathBuf {
    let p = binary_dir().join(name);
    assert!(p.is_file(), "{} is not built; run the tests with `cargo nextest run --workspace --release`", p.display());
    p
}

/// The Python the tests run (grpcio, openai, ollama): the virtual
/// environment `cargo xtask test` makes in the target directory
/// (`target/python`), never the system Python, which Debian and Ubuntu mark
/// externally managed (PEP 668). Panics, saying how to make it, when missing.
pub fn python() -> PathBuf {
    // Binaries are in target/<profile>/; the venv is target/python.
    let profile = binary_dir();
    let p = profile.parent().expect("the target dir").join("python/bin/python3");
    assert!(p.is_file(), "{} is missing: `cargo xtask test` makes it (a venv with grpcio, grpcio-tools, openai and ollama)", p.display());
    p
}

/// An agent program's binary (`claude`, `codex`): the pinned native builds
/// `cargo xtask test` unpacks in target/agents.
pub fn agent(name: &str) -> PathBuf {
    let inside = match name {
        "claude" => "package/claude",
        "codex" => "package/vendor/x86_64-unknown-linux-musl/bin/codex",
        other => panic!("no agent program {other:?}"),
    };
    let p = binary_dir().parent().expect("the target dir").join("agents").join(name).join(inside);
    assert!(p.is_file(), "{} is missing: `cargo xtask test` fetches it (pinned in xtask's AGENTS)", p.display());
    p
}

/// `target/<profile>`: where the workspace's binaries are.
fn binary_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// A copy of the GGUF at `src` whose `tokenizer.chat_template` is
/// `template` (added when it has none), written to `dst`: what a model
/// file with another's chat template looks like to revisd. The tensors'
/// bytes are copied as they are; the data section moves to the next
/// alignment after the new metadata.
pub fn gguf_with_chat_template(src: &Path, dst: &Path, template: &str) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind, Read, Seek, SeekFrom, Write};
    let bad = |m: &str| Error::new(ErrorKind::InvalidData, format!("{}: {m}", src.display()));
    let mut f = std::io::BufReader::new(std::fs::File::open(src)?);
    let mut head = [0u8; 24];
    f.read_exact(&mut head)?;
    if &head[..4] != b"GGUF" || u32::from_le_bytes(head[4..8].try_into().unwrap()) < 2 {
        return Err(bad("not a GGUF of version 2 or later"));
    }
    let tensors = u64::from_le_bytes(head[8..16].try_into().unwrap());
    let kvs = u64::from_le_bytes(head[16..24].try_into().unwrap());
    // Reads `n` bytes, appended to `out`.
    fn take(f: &mut impl Read, n: u64, out: &mut Vec<u8>) -> std::io::Result<()> {
        let start = out.len();
        out.resize(start + n as usize, 0);
        f.read_exact(&mut out[start..])
    }
    fn u32_of(f: &mut impl Read, out: &mut Vec<u8>) -> std::io::Result<u32> {
        take(f, 4, out)?;
        Ok(u32::from_le_bytes(out[out.len() - 4..].try_into().unwrap()))
    }
    fn u64_of(f: &mut impl Read, out: &mut Vec<u8>) -> std::io::Result<u64> {
        take(f, 8, out)?;
        Ok(u64::from_le_bytes(out[out.len() - 8..].try_into().unwrap()))
    }
    // One value of `ty`, its bytes appended to `out`.
    fn value(f: &mut impl Read, ty: u32, out: &mut Vec<u8>) -> std::io::Result<()> {
        match ty {
            0 | 1 | 7 => take(f, 1, out),
            2 | 3 => take(f, 2, out),
            4..=6 => take(f, 4, out),
            10..=12 => take(f, 8, out),
            8 => {
                let n = u64_of(f, out)?;
                take(f, n, out)
            }
            9 => {
                let item = u32_of(f, out)?;
                let n = u64_of(f, out)?;
                (0..n).try_for_each(|_| value(f, item, out))
            }
            _ => Err(Error::new(ErrorKind::InvalidData, format!("a value of unknown type {ty}"))),
        }
    }
    let string = |s: &str| [(s.len() as u64).to_le_bytes().as_slice(), s.as_bytes()].concat();
    let mut kv_bytes = Vec::new();
    let mut alignment = 32u64;
    let mut had = false;
    for _ in 0..kvs {
        let mut key = Vec::new();
        let n = u64_of(&mut f, &mut Vec::new())?;
        take(&mut f, n, &mut key)?;
        let mut raw = Vec::new();
        let ty = u32_of(&mut f, &mut raw)?;
        value(&mut f, ty, &mut raw)?;
        if key == b"general.alignment" && ty == 4 {
            alignment = u32::from_le_bytes(raw[4..8].try_into().unwrap()) as u64;
        }
        kv_bytes.extend(string(std::str::from_utf8(&key).map_err(|_| bad("a key that is not UTF-8"))?));
        if key == b"tokenizer.chat_template" {
            had = true;
            kv_bytes.extend(8u32.to_le_bytes());
            kv_bytes.extend(string(template));
        } else {
            kv_bytes.extend(raw);
        }
    }
    if !had {
        kv_bytes.extend(string("tokenizer.chat_template"));
        kv_bytes.extend(8u32.to_le_bytes());
        kv_bytes.extend(string(template));
    }
    let mut infos = Vec::new();
    for _ in 0..tensors {
        let n = u64_of(&mut f, &mut infos)?;
        take(&mut f, n, &mut infos)?;
        let dims = u32_of(&mut f, &mut infos)?;
        take(&mut f, 8 * dims as u64 + 4 + 8, &mut infos)?;
    }
    let end_of_infos = f.stream_position()?;
    let data = end_of_infos.div_ceil(alignment) * alignment;
    let mut out = std::io::BufWriter::new(std::fs::File::create(dst)?);
    out.write_all(&head[..16])?;
    out.write_all(&(kvs + u64::from(!had)).to_le_bytes())?;
    out.write_all(&kv_bytes)?;
    out.write_all(&infos)?;
    let written = 24 + kv_bytes.len() as u64 + infos.len() as u64;
    out.write_all(&vec![0u8; (written.div_ceil(alignment) * alignment - written) as usize])?;
    let mut f = f.into_inner();
    f.seek(SeekFrom::Start(data))?;
    std::io::copy(&mut f, &mut out)?;
    out.flush()
}

/// Builder for a real revisd.
pub struct TestDaemon {
    config: String,
    server: String,
    model: Option<PathBuf>,
    tier_models: Vec<(String, PathBuf)>,
    tier_extra: Vec<(String, String)>,
    netns: Option<String>,
    /// Run revisd where no network namespace can be made (see [`TestDaemon::without_namespaces`]).
    no_namespaces: bool,
    /// Leave `context` unset (each model's own) instead of the tests' 2048.
    own_context: bool,
}

impl Default for TestDaemon {
    fn default() -> Self {
        Self::new()
    }
}

impl TestDaemon {
    pub fn new() -> Self {
        TestDaemon {
            config: String::new(),
            server: String::new(),
            model: None,
            tier_models: Vec::new(),
            tier_extra: Vec::new(),
            netns: None,
            no_namespaces: false,
            own_context: false,
        }
    }

    /// Every tier uses this model file (default: SmolLM2).
    pub fn model(mut self, path: PathBuf) -> Self {
        self.model = Some(path);
        self
    }

    /// This tier uses this model file instead.
    pub fn tier_model(mut self, tier: &str, path: PathBuf) -> Self {
        self.tier_models.push((tier.to_owned(), path));
        self
    }

    /// Extra `[tiers.TIER]` settings, TOML lines such as `split = ["desk"]`.
    pub fn tier(mut self, tier: &str, toml: &str) -> Self {
        self.tier_extra.push((tier.to_owned(), toml.to_owned()));
        self
    }

    /// Sets no `context`, as a person's config does not: each model gets
    /// its own (its trained context, as memory allows). Without this the
    /// tests' daemons hold 2048 tokens, which keeps them small.
    pub fn model_context(mut self) -> Self {
        self.own_context = true;
        self
    }

    /// Extra `[daemon]` settings, TOML lines such as `queue_capacity = 1`.
    pub fn daemon(mut self, toml: &str) -> Self {
        self.config.push_str(toml);
        self.config.push('\n');
        self
    }

    /// Extra `[server]` settings, TOML lines such as `enabled = true`. The
    /// state directory (identity, paired devices) is always the daemon's own
    /// temporary one, never the user's.
    pub fn server(mut self, toml: &str) -> Self {
        self.server.push_str(toml);
        self.server.push('\n');
        self
    }

    /// Runs revisd where it cannot make a network namespace, as on a
    /// system that refuses its user unprivileged user namespaces: without
    /// CAP_SYS_ADMIN in its bounding set (`setpriv`; the tests run as root,
    /// for whom a network namespace needs that capability alone).
    pub fn without_namespaces(mut self) -> Self {
        self.no_namespaces = true;
        self
    }

    /// Runs revisd inside this network namespace (`ip netns exec`); its
    /// socket stays on the shared filesystem, so the test still reaches it.
    pub fn netns(mut self, name: &str) -> Self {
        self.netns = Some(name.to_owned());
        self
    }

    /// The daemon's directory and its config file.
    fn prepare(&self) -> (tempfile::TempDir, PathBuf) {
        let model = self.model.clone().unwrap_or_else(smollm2);
        let dir = tempfile::Builder::new().prefix("revisd-test").tempdir().expect("temp dir");
        // Defaults for what the test did not set itself. One thread: a
        // fixed count keeps every greedy answer bit-identical run to run
        // (under "auto" a lone answer past 512 cells of cache may change
        // with the load: ARCHITECTURE.md, "Threads"), and one thread keeps
        // its speed when another process wants a core, as the suite must.
        let mut config = format!("[daemon]\n{}", self.config);
        for (key, default) in [("threads", "1"), ("context", "2048")] {
            let unset = !self.config.lines().any(|l| l.trim_start().starts_with(key));
            if unset && (key != "context" || !self.own_context) {
                config.push_str(&format!("{key} = {default}\n"));
            }
        }
        for t in ["tier1", "tier2", "tier3"] {
            let m = self.tier_models.iter().find(|(tier, _)| tier == t).map_or(&model, |(_, p)| p);
            config.push_str(&format!("[tiers.{t}]\nmodel = {:?}\n", m.display().to_string()));
            for (_, extra) in self.tier_extra.iter().filter(|(tier, _)| tier == t) {
                config.push_str(extra);
                config.push('\n');
            }
        }
        let state = dir.path().join("state");
        config.push_str(&format!("[server]\nstate_dir = {:?}\n{}", state.display().to_string(), self.server));
        let config_path = dir.path().join("revisd.toml");
        std::fs::write(&config_path, config).expect("write config");
        (dir, config_path)
    }

    /// Starts revisd and waits until it serves.
    pub fn start(self) -> Running {
        let (dir, config) = self.prepare();
        let socket = dir.path().join("run/revisd.sock");
        let mut running = Running::new(dir, config, socket, None, self.netns);
        running.no_namespaces = self.no_namespaces;
        running.launch();
        running
    }

    /// Writes the config and starts revisd, expecting it to refuse: returns
    /// its exit status and what it printed. Panics if it is still running
    /// after [`READY_TIMEOUT`].
    pub fn start_expecting_failure(self) -> (ExitStatus, String) {
        let (dir, config) = self.prepare();
        let mut child = Command::new(binary("revisd"))
            .arg("--config")
            .arg(&config)
            .arg("--socket")
            .arg(dir.path().join("run/revisd.sock"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start revisd");
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            let _ = tx.send((child.wait(), s));
        });
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok((status, text)) => (status.expect("wait"), text),
            Err(_) => {
                // SAFETY: a child we started; its waiter thread reaps it.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                panic!("revisd did not exit; it was expected to refuse its config");
            }
        }
    }

    /// Starts revisd the way systemd starts a socket-activated service: the
    /// held socket becomes its descriptor 3, with LISTEN_FDS=1 and
    /// LISTEN_PID set to revisd's own PID (and no --socket). The socket
    /// stays with the returned handle, so [`Running::restart`] hands the
    /// same one to the next revisd, as systemd would.
    pub fn start_activated(self, held: HeldSocket) -> Running {
        let (dir, config) = self.prepare();
        Running::spawn(dir, config, held.path.clone(), Some(held), None)
    }
}

/// A listening socket held by the test, as systemd's socket unit holds
/// one: a 0600 socket in a 0700 directory of its own.
pub struct HeldSocket {
    pub path: PathBuf,
    listener: std::os::unix::net::UnixListener,
    _dir: tempfile::TempDir,
}

impl Default for HeldSocket {
    fn default() -> Self {
        Self::new()
    }
}

impl HeldSocket {
    pub fn new() -> HeldSocket {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new().prefix("revisd-socket").tempdir().expect("temp dir");
        let run = dir.path().join("revis");
        std::fs::create_dir(&run).expect("socket dir");
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).expect("chmod 0700");
        let path = run.join("revisd.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind the held socket");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod 0600");
        HeldSocket { path, listener, _dir: dir }
    }
}

impl AsFd for HeldSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

/// A command that runs revisd as systemd runs a socket-activated service:
/// `socket` as descriptor 3, LISTEN_FDS=1, and LISTEN_PID = `listen_pid`,
/// or when None the PID of revisd itself (a shell sets it to its own PID,
/// then execs revisd, which keeps that PID: the PID of the returned child
/// is revisd's). Add revisd's arguments with `.arg`.
pub fn activated_revisd(socket: BorrowedFd<'_>, listen_pid: Option<u32>) -> Command {
    // A copy far above 3, so putting it at 3 in the child cannot overwrite
    // another descriptor the child needs (the readiness pipe is moved up too).
    // SAFETY: F_DUPFD_CLOEXEC returns a fresh descriptor that only we own.
    let high = unsafe { libc::fcntl(socket.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100) };
    assert!(high >= 0, "dup the held socket");
    let high = unsafe { OwnedFd::from_raw_fd(high) };
    let pid = listen_pid.map_or_else(|| "$$".to_owned(), |p| p.to_string());
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg(format!(r#"LISTEN_PID={pid}; LISTEN_FDS=1; export LISTEN_PID LISTEN_FDS; exec "$0" "$@""#));
    cmd.arg(binary("revisd"));
    let raw = high.as_raw_fd();
    // SAFETY: dup2 is async-signal-safe; it runs in the child between fork
    // and exec, and the new descriptor 3 is not close-on-exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            let _keep = &high; // the copy lives as long as the command
            if libc::dup2(raw, 3) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// A running revisd. Dropping it kills the process (SIGKILL) and removes its directory.
pub struct Running {
    pub socket: PathBuf,
    pub log: PathBuf,
    config: PathBuf,
    held: Option<HeldSocket>,
    netns: Option<String>,
    no_namespaces: bool,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Running {
    fn spawn(dir: tempfile::TempDir, config: PathBuf, socket: PathBuf, held: Option<HeldSocket>, netns: Option<String>) -> Running {
        let mut running = Running::new(dir, config, socket, held, netns);
        running.launch();
        running
    }

    fn new(dir: tempfile::TempDir, config: PathBuf, socket: PathBuf, held: Option<HeldSocket>, netns: Option<String>) -> Running {
        let log = dir.path().join("revisd.log");
        Running { socket, log, config, held, netns, no_namespaces: false, child: None, dir }
    }

    /// Starts revisd again after it exited (see [`Running::wait_exit`]), as
    /// the service manager would: the same config, the same socket (the
    /// held one, when it was started activated). Waits until it serves.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart only after wait_exit");
        self.launch();
    }

    fn launch(&mut self) {
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log file");
        let (read_end, write_end) = activation_pipe().expect("the readiness pipe");
        let mut cmd = match &self.held {
            Some(held) => activated_revisd(held.as_fd(), None),
            None => {
                // `ip netns exec` and `setpriv` exec what follows: the child's PID is revisd's own.
                let mut prefix: Vec<&str> = Vec::new();
                if let Some(ns) = &self.netns {
                    prefix.extend(["ip", "netns", "exec", ns]);
                }
                if self.no_namespaces {
                    prefix.extend(["setpriv", "--bounding-set=-sys_admin"]);
                }
                let mut c = match prefix.split_first() {
                    Some((program, args)) => {
                        let mut c = Command::new(program);
                        c.args(args).arg(binary("revisd"));
                        c
                    }
                    None => Command::new(binary("revisd")),
                };
                c.arg("--socket").arg(&self.socket);
                c
            }
        };
        let child = cmd
            .arg("--config")
            .arg(&self.config)
            .env("REVIS_READY_FD", write_end.as_raw_fd().to_string())
            .env("REVIS_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file)
            .spawn()
            .expect("start revisd");
        drop(cmd);
        drop(write_end);
        self.child = Some(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::fs::File::from(read_end).read_to_string(&mut s);
            let _ = tx.send(s);
        });
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(s) if s.starts_with("ready") => {}
            other => {
                let status = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
                panic!("revisd did not become ready ({other:?}, exit {status:?}); log:\n{}", self.log_text());
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

    /// Waits until the daemon's log holds `needle` at least `count` times and
    /// returns the log; panics with the log after `limit`. For events the
    /// daemon logs after the peer already saw their effect (a refused TLS
    /// handshake is logged after the alert went out).
    pub fn wait_for_log(&self, needle: &str, count: usize, limit: Duration) -> String {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let log = self.log_text();
            if log.matches(needle).count() >= count {
                return log;
            }
            if std::time::Instant::now() >= deadline {
                panic!("the log did not show {needle:?} {count} times within {limit:?}:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
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

/// A readiness pipe for a revisd started by [`activated_revisd`]: the read
/// end close-on-exec, the write end inherited and numbered 100 or above
/// (clear of descriptor 3, the held socket).
pub fn activation_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = revis_client::readiness_pipe()?;
    // SAFETY: F_DUPFD returns a fresh descriptor (inherited by children) that only we own.
    let high = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_DUPFD, 100) };
    if high < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `high` is ours alone (just returned by fcntl).
    Ok((r, unsafe { OwnedFd::from_raw_fd(high) }))
}
