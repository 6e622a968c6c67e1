//! revis's programs as per-user background services: revisd ([`REVISD`],
//! socket-activated: the manager holds its socket and hands it over) and
//! `revis serve` ([`SERVE`], the HTTP APIs, next to revisd). On macOS a
//! LaunchAgent (from a template in `launchd/`), on Linux systemd user
//! units; the manager starts them at login and again when they crash.
//! Each service is described once ([`Service`]: names, files, variables);
//! writing its files and `install`, `uninstall`, `status` and `logs` are
//! the same code for both. This is the only crate that runs launchctl or
//! systemctl.

mod command;
mod error;
mod files;
mod launchd;
mod layout;
mod options;
mod probe;
mod service;
mod systemd;
mod units;

use std::io::Write;

use command::say;
use error::io_error;
use files::write_file;

pub use error::ServiceError;
pub use launchd::plist;
pub use layout::{Layout, Manager, Probe};
pub use options::{InstallOptions, LogOptions};
pub use service::{Passed, REVISD, SERVE, Service};
pub use systemd::unit_file;
pub use units::Unit;

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
