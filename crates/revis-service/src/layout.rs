//! Where one service lives on this machine: [`Layout`] (its program,
//! arguments, variables and directories, read from this process), the
//! [`Manager`] this platform has and the [`Probe`] `status` sends.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::error::{ServiceError, io_error, utf8};
use crate::service::{REVISD, SERVE, Service};

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
    pub(crate) fn program_file(&self) -> PathBuf {
        match self.manager {
            Manager::Systemd => self.systemd_dir.join(self.service.units.last().expect("a service has a unit").name),
            Manager::Launchd => self.home.join(format!("Library/LaunchAgents/{}.plist", self.service.label)),
        }
    }
}
