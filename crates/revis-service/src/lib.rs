//! revis's programs as per-user background services: revisd ([`REVISD`],
//! socket-activated: the manager holds its socket and hands it over) and
//! `revis serve` ([`SERVE`], the HTTP APIs, next to revisd). On macOS a
//! LaunchAgent (from a template in `launchd/`), on Linux systemd user
//! units; the manager starts them at login and again when they crash.
//! Each service is described once ([`Service`]: names, files, variables);
//! writing its files and `install`, `uninstall`, `status` and `logs` are
//! the same code for both. This is the only crate that runs launchctl or
//! systemctl.

mod launchd;
mod probe;
mod systemd;

use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use launchd::plist;
pub use systemd::{Unit, unit_file};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot tell where your home directory is (HOME is not set)")]
    NoHome,
    #[error("cannot tell where this {program} binary is: {source}")]
    Binary { program: &'static str, source: std::io::Error },
    #[error("{path:?} cannot be written into the service file: {why}")]
    Unrepresentable { path: PathBuf, why: &'static str },
    #[error("`{command}` failed: {message}")]
    Command { command: String, message: String },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ServiceError + '_ {
    move |source| ServiceError::Io { path: path.into(), source }
}

/// One of revis's services: what the reports call it, its files, and what
/// it takes from the command that installs it. Everything that acts on a
/// service reads it from here; [`REVISD`] and [`SERVE`] are the two there are.
#[derive(Debug)]
pub struct Service {
    /// The program, as the reports name it: `revisd`, `revis serve`.
    pub name: &'static str,
    /// The binary's file name: `revisd`, `revis`.
    pub binary: &'static str,
    /// The command that manages the service, as the reports name it.
    pub command: &'static str,
    /// What `status` advises when the installed file is not the one this command would write.
    pub rewrites: &'static str,
    /// Variables passed on to the service when they are set at install.
    pub env: &'static [Passed],
    /// systemd: the units, each after those it needs (`Requires=`); the
    /// last one runs the program.
    pub units: &'static [Unit],
    /// launchd: the job's label, and the plist's file name without `.plist`.
    pub label: &'static str,
    /// launchd: the LaunchAgent's template (`launchd/*.plist`, embedded).
    pub plist: &'static str,
    /// launchd: the log file's name, in `~/Library/Logs/revis`.
    pub log: &'static str,
    /// Whether the manager holds a socket for it ([`Layout::socket`]).
    pub socket: bool,
}

/// A variable of the installing process that the service gets too.
#[derive(Debug)]
pub struct Passed {
    pub name: &'static str,
    /// A path, made absolute (the service does not run where the install did).
    pub path: bool,
}

/// revisd: `revisd.socket` + `revisd.service`, `org.revis.revisd`.
pub static REVISD: Service = Service {
    name: "revisd",
    binary: "revisd",
    command: "revisd service",
    rewrites: "`revisd service install` rewrites it with this command's revisd, --config and REVIS_DATA_DIR",
    env: &[Passed { name: "REVIS_DATA_DIR", path: true }],
    units: systemd::REVISD_UNITS,
    label: "org.revis.revisd",
    plist: include_str!("../../../launchd/revisd.plist"),
    log: "revisd.log",
    socket: true,
};

/// `revis serve`: `revis-serve.service`, `org.revis.serve`. It reaches
/// revisd on revisd's own socket, so it needs no socket of its own.
pub static SERVE: Service = Service {
    name: "revis serve",
    binary: "revis",
    command: "revis serve",
    rewrites: "`revis serve install` with the same flags rewrites it with this command's revis, REVIS_DATA_DIR and REVIS_MDNS_INTERFACES",
    env: &[Passed { name: "REVIS_DATA_DIR", path: true }, Passed { name: "REVIS_MDNS_INTERFACES", path: false }],
    units: systemd::SERVE_UNITS,
    label: "org.revis.serve",
    plist: include_str!("../../../launchd/revis-serve.plist"),
    log: "serve.log",
    socket: false,
};

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

/// What `status` asks to tell whether the service answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A Status call to revisd on [`Layout::socket`].
    Revisd,
    /// `GET /api/version` at this address, with no key: any HTTP answer
    /// counts (a 401 too). The key is not sent, as whoever listens on the
    /// port now (another user's program, while the service is down) would
    /// be given it. Over HTTPS, trusting only this certificate (PEM), when given.
    Http(SocketAddr, Option<PathBuf>),
}

/// Everything one service's files depend on. [`Layout::revisd`] and
/// [`Layout::serve`] read it from this process; tests build one directly.
#[derive(Clone, Debug)]
pub struct Layout {
    pub manager: Manager,
    pub service: &'static Service,
    /// The binary the service runs (absolute).
    pub program: PathBuf,
    /// Its arguments (paths among them absolute).
    pub args: Vec<OsString>,
    /// Variables the service gets: those of [`Service::env`] set in this
    /// process, so the service finds the same data.
    pub env: Vec<(String, String)>,
    pub probe: Probe,
    pub home: PathBuf,
    /// Where systemd looks for user units: `$XDG_CONFIG_HOME/systemd/user`.
    pub systemd_dir: PathBuf,
    /// systemd's `%t`: `$XDG_RUNTIME_DIR`, else `/run/user/UID`.
    pub runtime_dir: PathBuf,
    pub uid: u32,
}

impl Layout {
    /// revisd as a service: the revisd binary that is running now, with
    /// `--config` when one is given.
    pub fn revisd(config: Option<&Path>) -> Result<Layout, ServiceError> {
        let mut args = Vec::new();
        if let Some(c) = config {
            args.push(OsString::from("--config"));
            args.push(std::path::absolute(c).map_err(io_error(c))?.into_os_string());
        }
        Layout::from_env(&REVISD, args, Probe::Revisd)
    }

    /// `revis serve` as a service: the revis binary that is running now,
    /// with `args` (`serve` and its flags, paths among them absolute), that
    /// listens on `addr`.
    pub fn serve(args: Vec<OsString>, addr: SocketAddr, tls_trust: Option<PathBuf>) -> Result<Layout, ServiceError> {
        Layout::from_env(&SERVE, args, Probe::Http(addr, tls_trust))
    }

    fn from_env(service: &'static Service, args: Vec<OsString>, probe: Probe) -> Result<Layout, ServiceError> {
        let binary = |source| ServiceError::Binary { program: service.binary, source };
        // Not canonicalized: a stable link (Homebrew's bin/revisd) must not
        // become the versioned file it points to, which an upgrade removes.
        let exe = std::env::current_exe().map_err(binary)?;
        let program = std::path::absolute(&exe).map_err(binary)?;
        let mut env = Vec::new();
        for passed in service.env {
            if let Some(v) = std::env::var_os(passed.name).filter(|v| !v.is_empty()) {
                let v = PathBuf::from(v);
                let v = if passed.path { std::path::absolute(&v).map_err(io_error(&v))? } else { v };
                env.push((passed.name.to_owned(), utf8(&v, "it is not valid UTF-8")?.to_owned()));
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
            service,
            program,
            args,
            env,
            probe,
            home,
            systemd_dir: config_home.join("systemd/user"),
            runtime_dir,
            uid,
        })
    }

    /// revisd's socket, which the manager holds; the clients' default on
    /// this platform (`revis_client::default_socket_path` without `REVIS_SOCKET`).
    pub fn socket(&self) -> PathBuf {
        match self.manager {
            Manager::Systemd => self.runtime_dir.join("revis/revisd.sock"),
            Manager::Launchd => self.home.join("Library/Application Support/revis/revisd.sock"),
        }
    }

    /// The service's log file, where the manager has none of its own (launchd).
    pub fn log(&self) -> PathBuf {
        self.home.join("Library/Logs/revis").join(self.service.log)
    }

    /// The file that says what the service runs: its last systemd unit, or its LaunchAgent.
    fn program_file(&self) -> PathBuf {
        match self.manager {
            Manager::Systemd => self.systemd_dir.join(self.service.units.last().expect("a service has a unit").name),
            Manager::Launchd => self.home.join(format!("Library/LaunchAgents/{}.plist", self.service.label)),
        }
    }

    /// The files `install` writes, with their contents.
    pub fn files(&self) -> Result<Vec<(PathBuf, String)>, ServiceError> {
        match self.manager {
            Manager::Systemd => {
                self.service.units.iter().map(|u| unit_file(self, u).map(|text| (self.systemd_dir.join(u.name), text))).collect()
            }
            Manager::Launchd => Ok(vec![(self.program_file(), plist(self)?)]),
        }
    }

    /// The arguments the installed service runs its program with, read back
    /// from its file (the unit's ExecStart, the LaunchAgent's
    /// ProgramArguments). `None` when it is not installed, or its file is
    /// not one `install` writes.
    pub fn installed_arguments(&self) -> Result<Option<Vec<String>>, ServiceError> {
        let path = self.program_file();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidData) => return Ok(None),
            Err(e) => return Err(io_error(&path)(e)),
        };
        Ok(match self.manager {
            Manager::Systemd => systemd::exec_arguments(&text),
            Manager::Launchd => launchd::program_arguments(&text),
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
/// manager says, and whether the service answers ([`Probe`]). Returns
/// whether it answers.
pub fn status(layout: &Layout, out: &mut dyn Write) -> Result<bool, ServiceError> {
    for (path, content) in layout.files()? {
        match std::fs::read(&path) {
            Ok(old) if old == content.as_bytes() => say!(out, "{}: installed", path.display()),
            // Usually installed with another binary, arguments or variables than
            // this command has: the lines that differ say which, and an install with
            // this command's would drop them.
            Ok(old) => {
                let old = String::from_utf8_lossy(&old);
                say!(out, "{}: installed, but not as this command would write it; the file has:", path.display());
                for line in old.lines().filter(|l| !content.lines().any(|c| c == *l)) {
                    say!(out, "    {line}");
                }
                say!(out, "  {}", layout.service.rewrites);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => say!(out, "{}: not installed", path.display()),
            Err(e) => return Err(io_error(&path)(e)),
        }
    }
    match layout.manager {
        Manager::Systemd => systemd::report(layout, out),
        Manager::Launchd => launchd::report(layout, out),
    }
    Ok(probe::report(layout, out))
}

/// How much of the log to show.
#[derive(Clone, Copy, Debug)]
pub struct LogOptions {
    pub lines: u32,
    pub follow: bool,
}

/// Shows the service's log: the user journal on Linux, the log file on
/// macOS. Returns the exit code of the program that showed it.
pub fn logs(layout: &Layout, opts: LogOptions) -> Result<i32, ServiceError> {
    let lines = opts.lines.to_string();
    let mut cmd = match layout.manager {
        Manager::Systemd => {
            let mut c = std::process::Command::new("journalctl");
            c.arg("--user");
            for unit in layout.service.units.iter().rev() {
                c.args(["-u", unit.name]);
            }
            c.args(["--no-pager", "-n", &lines]);
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

/// Writes `content` to `path` through a temporary file and a rename, so the
/// manager never reads half a file.
fn write_file(path: &Path, content: &str) -> Result<(), ServiceError> {
    let dir = path.parent().expect("service files live in a directory");
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let tmp = dir.join(format!(".{}.{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("revis"), std::process::id()));
    std::fs::write(&tmp, content).map_err(io_error(&tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_error(path)(e)
    })
}

/// `a`, `a and b`, `a, b and c`.
fn and_list<S: AsRef<str>>(items: &[S]) -> String {
    match items {
        [] => String::new(),
        [one] => one.as_ref().to_owned(),
        [rest @ .., last] => format!("{} and {}", rest.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(", "), last.as_ref()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_as_english() {
        assert_eq!(and_list(&["a"]), "a");
        assert_eq!(and_list(&["a", "b"]), "a and b");
        assert_eq!(and_list(&["a", "b", "c"]), "a, b and c");
    }
}
