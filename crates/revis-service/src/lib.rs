//! revisd as a per-user background service: a LaunchAgent on macOS (from
//! the template `launchd/revisd.plist`), a systemd user service plus its
//! socket on Linux. Both managers hold the socket and hand it to revisd
//! (socket activation), start revisd at login and again when it crashes.
//! This crate writes the files and drives the manager (`install`,
//! `uninstall`, `status`, `logs`); it is the only one that runs launchctl
//! or systemctl.

mod launchd;
mod systemd;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use launchd::{LABEL, plist};
pub use systemd::{SERVICE_UNIT, SOCKET_UNIT, service_unit, socket_unit};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot tell where your home directory is (HOME is not set)")]
    NoHome,
    #[error("cannot tell where this revisd binary is: {0}")]
    Binary(std::io::Error),
    #[error("{path:?} cannot be written into the service file: {why}")]
    Unrepresentable { path: PathBuf, why: &'static str },
    #[error("`{command}` failed: {message}")]
    Command { command: String, message: String },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ServiceError + '_ {
    move |source| ServiceError::Io { path: path.into(), source }
}

/// The service manager this platform has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Manager {
    /// macOS: a LaunchAgent in the user's `gui/UID` domain.
    Launchd,
    /// Linux: units for the user's `systemd --user` instance.
    Systemd,
}

impl Manager {
    pub fn current() -> Manager {
        if cfg!(target_os = "macos") { Manager::Launchd } else { Manager::Systemd }
    }
}

/// Everything the service files depend on. [`Layout::from_env`] reads it
/// from this process; tests build one directly.
#[derive(Clone, Debug)]
pub struct Layout {
    pub manager: Manager,
    /// The revisd binary the service runs (absolute).
    pub revisd: PathBuf,
    /// `--config` for the service (absolute), when one was given.
    pub config: Option<PathBuf>,
    /// Variables the service gets: those of this process that say where
    /// revis keeps its data, so the service finds the same models.
    pub env: Vec<(String, String)>,
    pub home: PathBuf,
    /// Where systemd looks for user units: `$XDG_CONFIG_HOME/systemd/user`.
    pub systemd_dir: PathBuf,
    /// systemd's `%t`: `$XDG_RUNTIME_DIR`, else `/run/user/UID`.
    pub runtime_dir: PathBuf,
    pub uid: u32,
}

/// The variables passed on to the service when they are set at install.
const PASSED_ENV: &[&str] = &["REVIS_DATA_DIR"];

impl Layout {
    /// The layout for the revisd binary that is running now.
    pub fn from_env(config: Option<&Path>) -> Result<Layout, ServiceError> {
        // Not canonicalized: a stable link (Homebrew's bin/revisd) must not
        // become the versioned file it points to, which an upgrade removes.
        let exe = std::env::current_exe().map_err(ServiceError::Binary)?;
        let revisd = std::path::absolute(&exe).map_err(ServiceError::Binary)?;
        let absolute = |p: &Path| std::path::absolute(p).map_err(io_error(p));
        let config = config.map(absolute).transpose()?;
        let mut env = Vec::new();
        for name in PASSED_ENV {
            if let Some(v) = std::env::var_os(name).filter(|v| !v.is_empty()) {
                let v = absolute(Path::new(&v))?;
                env.push((name.to_string(), utf8(&v, "it is not valid UTF-8")?.to_owned()));
            }
        }
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from).ok_or(ServiceError::NoHome)?;
        let config_home =
            std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from).filter(|p| p.is_absolute()).unwrap_or_else(|| home.join(".config"));
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| PathBuf::from(format!("/run/user/{uid}")));
        Ok(Layout {
            manager: Manager::current(),
            revisd,
            config,
            env,
            home,
            systemd_dir: config_home.join("systemd/user"),
            runtime_dir,
            uid,
        })
    }

    /// The socket the service listens on; the clients' default on this
    /// platform (`revis_client::default_socket_path` without `REVIS_SOCKET`).
    pub fn socket(&self) -> PathBuf {
        match self.manager {
            Manager::Systemd => self.runtime_dir.join("revis/revisd.sock"),
            Manager::Launchd => self.home.join("Library/Application Support/revis/revisd.sock"),
        }
    }

    /// The daemon's log file, where the manager has none of its own (launchd).
    pub fn log(&self) -> PathBuf {
        self.home.join("Library/Logs/revis/revisd.log")
    }

    /// The arguments after the program.
    fn arguments(&self) -> Vec<&Path> {
        match &self.config {
            Some(c) => vec![Path::new("--config"), c],
            None => Vec::new(),
        }
    }

    /// The files `install` writes, with their contents.
    pub fn files(&self) -> Result<Vec<(PathBuf, String)>, ServiceError> {
        Ok(match self.manager {
            Manager::Systemd => {
                vec![(self.systemd_dir.join(SOCKET_UNIT), socket_unit()), (self.systemd_dir.join(SERVICE_UNIT), service_unit(self)?)]
            }
            Manager::Launchd => vec![(self.home.join(format!("Library/LaunchAgents/{LABEL}.plist")), plist(self)?)],
        })
    }
}

fn utf8<'a>(p: &'a Path, why: &'static str) -> Result<&'a str, ServiceError> {
    p.to_str().ok_or_else(|| ServiceError::Unrepresentable { path: p.into(), why })
}

/// What `install` does besides writing the files.
#[derive(Clone, Copy, Debug, Default)]
pub struct InstallOptions {
    /// Write the files but do not call the service manager.
    pub no_start: bool,
    /// Print what would be written and run; change nothing.
    pub dry_run: bool,
}

/// Prints a line of the report; a closed stdout is no reason to stop halfway.
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{ let _ = writeln!($out, $($arg)*); }};
}
use say;

/// Writes the service files (only those that changed) and has the manager
/// start the service, or restart it when its files changed. Running it
/// again changes nothing. Where the manager cannot be reached (no
/// `systemd --user`, as in containers and CI), the files are written and
/// the report says so; that is not an error.
pub fn install(layout: &Layout, opts: InstallOptions, out: &mut dyn Write) -> Result<(), ServiceError> {
    let mut changed = Vec::new();
    for (path, content) in layout.files()? {
        let same = std::fs::read(&path).is_ok_and(|old| old == content.as_bytes());
        if opts.dry_run {
            say!(out, "{} {}:\n{content}", if same { "unchanged" } else { "would write" }, path.display());
        } else if same {
            say!(out, "{} is up to date", path.display());
        } else {
            write_file(&path, &content)?;
            say!(out, "wrote {}", path.display());
        }
        if !same {
            changed.push(path);
        }
    }
    match layout.manager {
        Manager::Systemd => systemd::install(layout, opts, &changed, out),
        Manager::Launchd => launchd::install(layout, opts, !changed.is_empty(), out),
    }
}

/// Stops the service and removes its files. Models, configuration, logs and
/// everything else revis keeps are left alone.
pub fn uninstall(layout: &Layout, dry_run: bool, out: &mut dyn Write) -> Result<(), ServiceError> {
    match layout.manager {
        Manager::Systemd => systemd::stop_and_disable(layout, dry_run, out)?,
        Manager::Launchd => launchd::bootout(layout, dry_run, out)?,
    }
    for (path, _) in layout.files()? {
        if !path.exists() {
            say!(out, "{} is not there", path.display());
        } else if dry_run {
            say!(out, "would remove {}", path.display());
        } else {
            std::fs::remove_file(&path).map_err(io_error(&path))?;
            say!(out, "removed {}", path.display());
        }
    }
    if let Manager::Systemd = layout.manager
        && !dry_run
    {
        // So the manager forgets the removed units; where it cannot be reached there is nothing to forget.
        let _ = systemd::systemctl(&["daemon-reload"]);
    }
    say!(out, "your models, configuration and logs are left where they are");
    Ok(())
}

/// Reports whether the service files are installed (and current), what the
/// manager says, and whether a daemon answers on the service's socket.
/// Returns whether it answers.
pub fn status(layout: &Layout, out: &mut dyn Write) -> Result<bool, ServiceError> {
    for (path, content) in layout.files()? {
        match std::fs::read(&path) {
            Ok(old) if old == content.as_bytes() => say!(out, "{}: installed", path.display()),
            // Usually installed with another binary, --config or REVIS_DATA_DIR than
            // this command has: the lines that differ say which, and an install with
            // this command's would drop them.
            Ok(old) => {
                let old = String::from_utf8_lossy(&old);
                say!(out, "{}: installed, but not as this command would write it; the file has:", path.display());
                for line in old.lines().filter(|l| !content.lines().any(|c| c == *l)) {
                    say!(out, "    {line}");
                }
                say!(out, "  `revisd service install` rewrites it with this command's revisd, --config and REVIS_DATA_DIR");
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => say!(out, "{}: not installed", path.display()),
            Err(e) => return Err(io_error(&path)(e)),
        }
    }
    match layout.manager {
        Manager::Systemd => systemd::report(out),
        Manager::Launchd => launchd::report(layout, out),
    }
    let socket = layout.socket();
    if !socket.exists() {
        say!(out, "{}: no revisd answers (nothing listens there)", socket.display());
        return Ok(false);
    }
    match probe(&socket) {
        Ok(s) => {
            say!(out, "{}: revisd {} answers (pid {}, up {} s)", socket.display(), s.version, s.pid, s.uptime_s);
            Ok(true)
        }
        Err(why) => {
            say!(out, "{}: no revisd answers ({why})", socket.display());
            Ok(false)
        }
    }
}

/// How much of the log to show.
#[derive(Clone, Copy, Debug)]
pub struct LogOptions {
    pub lines: u32,
    pub follow: bool,
}

/// Shows the daemon's log: the user journal on Linux, the log file on
/// macOS. Returns the exit code of the program that showed it.
pub fn logs(layout: &Layout, opts: LogOptions) -> Result<i32, ServiceError> {
    let lines = opts.lines.to_string();
    let mut cmd = match layout.manager {
        Manager::Systemd => {
            let mut c = std::process::Command::new("journalctl");
            c.args(["--user", "-u", SERVICE_UNIT, "-u", SOCKET_UNIT, "--no-pager", "-n", &lines]);
            c
        }
        Manager::Launchd => {
            let mut c = std::process::Command::new("tail");
            c.args(["-n", &lines]).arg(layout.log());
            c
        }
    };
    if opts.follow {
        cmd.arg(if layout.manager == Manager::Systemd { "--follow" } else { "-F" });
    }
    let program = cmd.get_program().to_string_lossy().into_owned();
    let status = cmd.status().map_err(|e| ServiceError::Command { command: program, message: e.to_string() })?;
    Ok(status.code().unwrap_or(1))
}

/// How long `status` waits for the daemon to answer. With socket activation
/// the first connection may start it, which is quick: models load on first use.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Asks the daemon on `socket` for its status.
fn probe(socket: &Path) -> Result<revis_client::DaemonStatus, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let ask = async {
            let c = revis_client::Client::connect(socket).await?;
            c.status().await
        };
        match tokio::time::timeout(PROBE_TIMEOUT, ask).await {
            // The path is said already: only why.
            Ok(r) => r.map_err(|e| match e {
                revis_client::ClientError::NotRunning { reason, .. } => reason,
                e => e.to_string(),
            }),
            Err(_) => Err(format!("no answer within {} s", PROBE_TIMEOUT.as_secs())),
        }
    })
}

/// Writes `content` to `path` through a temporary file and a rename, so the
/// manager never reads half a file.
fn write_file(path: &Path, content: &str) -> Result<(), ServiceError> {
    let dir = path.parent().expect("service files live in a directory");
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let tmp = dir.join(format!(".{}.{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("revisd"), std::process::id()));
    std::fs::write(&tmp, content).map_err(io_error(&tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_error(path)(e)
    })
}

/// The output of a manager command, or why it could not run.
fn run(program: &str, args: &[&str]) -> Result<std::process::Output, ServiceError> {
    let command = || std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
    std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| ServiceError::Command { command: command(), message: e.to_string() })
}

/// Fails with the command's own words unless it succeeded.
fn check(program: &str, args: &[&str], output: std::process::Output) -> Result<std::process::Output, ServiceError> {
    if output.status.success() {
        return Ok(output);
    }
    let command = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    let message = if stderr.is_empty() { output.status.to_string() } else { stderr };
    Err(ServiceError::Command { command, message })
}
