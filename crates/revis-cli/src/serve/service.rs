//! `revis serve install | uninstall | status | logs`: `revis serve` as a
//! user service next to revisd's, handed to revis-service, and its flags
//! read back from the service installed.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use revis_service::{InstallOptions, Layout, LogOptions};

use super::flags::{Action, EX_USAGE, Flags, ServeArgs};
use crate::cli::{Cli, Cmd};

/// LSB's "program is not running", as `systemctl status` answers.
const EX_NOT_RUNNING: u8 = 3;

/// revis's own flags that the service keeps: where revisd is.
pub(super) struct Globals {
    /// `--socket` (or REVIS_SOCKET), when given.
    pub(super) socket: Option<PathBuf>,
    /// `--node` (or REVIS_NODE), when given.
    pub(super) node: Option<String>,
    /// The data directory (where the HTTPS certificate made here is).
    pub(super) data: PathBuf,
}

pub(super) fn service(globals: &Globals, action: Action) -> anyhow::Result<ExitCode> {
    let out = &mut std::io::stdout();
    Ok(match action {
        Action::Install { flags, no_start, dry_run } => {
            // A service that would only exit 64 again and again is not installed.
            if let Err(e) = flags.check_installable() {
                eprintln!("revis: {e:#}");
                return Ok(ExitCode::from(EX_USAGE));
            }
            revis_service::install(&layout(globals, &flags)?, InstallOptions { no_start, dry_run }, out)?;
            if let Some(trust) = flags.tls_trust(&globals.data) {
                let _ =
                    writeln!(out, "HTTPS clients trust {} (made at the service's first start when it is not there yet)", trust.display());
            }
            ExitCode::SUCCESS
        }
        // What uninstall and logs touch (the unit, the agent, the journal) does not depend on the flags.
        Action::Uninstall { dry_run } => {
            revis_service::uninstall(&layout(globals, &Flags::default())?, dry_run, out)?;
            ExitCode::SUCCESS
        }
        Action::Status => {
            let layout = installed(globals, out)?;
            let answers = revis_service::status(&layout, out)?;
            if answers { ExitCode::SUCCESS } else { ExitCode::from(EX_NOT_RUNNING) }
        }
        Action::Logs { follow, lines } => {
            let code = revis_service::logs(&layout(globals, &Flags::default())?, LogOptions { lines, follow })?;
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
    })
}

/// The service that runs `revis [--socket S] [--node N] serve FLAGS`.
fn layout(globals: &Globals, flags: &Flags) -> anyhow::Result<Layout> {
    let mut args: Vec<OsString> = Vec::new();
    if let Some(s) = &globals.socket {
        args.extend(["--socket".into(), std::path::absolute(s).with_context(|| format!("{}", s.display()))?.into_os_string()]);
    }
    if let Some(n) = &globals.node {
        args.extend(["--node".into(), n.into()]);
    }
    args.push("serve".into());
    args.extend(flags.words()?);
    Ok(Layout::serve(args, flags.addr, flags.tls_trust(&globals.data))?)
}

/// The service as installed: its flags read back from its file, so that
/// `status` asks the address it listens on and compares its file with the
/// one an install with the same flags would write. The defaults when
/// nothing is installed.
fn installed(globals: &Globals, out: &mut dyn Write) -> anyhow::Result<Layout> {
    let default = layout(globals, &Flags::default())?;
    let Some(words) = default.installed_arguments()? else { return Ok(default) };
    match parse_service_words(&words, &globals.data) {
        Ok((globals, flags)) => layout(&globals, &flags),
        Err(why) => {
            let _ =
                writeln!(out, "the installed service runs `{}`, which is not what `revis serve install` writes ({why})", words.join(" "));
            Ok(default)
        }
    }
}

/// The global flags and serve's flags in the words after the program of
/// an installed service.
fn parse_service_words(words: &[String], data: &std::path::Path) -> Result<(Globals, Flags), String> {
    let cli = Cli::try_parse_from(std::iter::once("revis").chain(words.iter().map(String::as_str)))
        .map_err(|e| e.kind().as_str().unwrap_or("it does not parse").to_owned())?;
    match cli.command {
        Cmd::Serve(a) if matches!(*a, ServeArgs { show_key: false, action: None, .. }) => {
            Ok((Globals { socket: cli.socket, node: cli.node, data: data.to_owned() }, a.flags))
        }
        _ => Err("not `revis serve` with flags".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `install` writes after `serve` is read back as the same
    /// flags, the global ones too: `status` finds the address the service listens on.
    #[test]
    fn the_flags_written_into_the_service_read_back_the_same() {
        let flags = Flags {
            addr: "[::1]:8080".parse().unwrap(),
            tls: false,
            tls_cert: Some("/etc/my certs/revis.pem".into()),
            tls_key: Some("/etc/my certs/revis.key".into()),
            no_key: true,
            max_generations: 3,
            max_body_bytes: 1000,
            max_connections: 7,
            header_timeout_ms: 2500,
            write_timeout_ms: 7000,
            allow_origins: vec!["http://localhost:3000".into(), "https://my app.example".into()],
            allow_pull: true,
            max_pull_bytes: Some(5 << 30),
        };
        let data = std::path::Path::new("/home/ada/.local/share/revis");
        let globals =
            Globals { socket: Some("/run/user/1000/my revis/revisd.sock".into()), node: Some("desk".into()), data: data.to_owned() };
        let mut words: Vec<String> = vec!["--socket".into(), "/run/user/1000/my revis/revisd.sock".into(), "--node".into(), "desk".into()];
        words.push("serve".into());
        words.extend(flags.words().unwrap().into_iter().map(|w| w.into_string().unwrap()));
        let (g, f) = parse_service_words(&words, data).unwrap();
        assert_eq!(f, flags);
        assert_eq!((g.socket, g.node), (globals.socket, globals.node));
        let (_, f) = parse_service_words(&["serve".into()], data).unwrap();
        assert_eq!(f, Flags::default(), "clap's defaults and Flags::default agree");
        assert!(parse_service_words(&["serve".into(), "--frobnicate".into()], data).is_err());
        assert!(parse_service_words(&["serve".into(), "status".into()], data).is_err());
        assert!(parse_service_words(&["status".into()], data).is_err());
    }
}
