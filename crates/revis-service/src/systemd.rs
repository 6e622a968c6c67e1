//! Linux: two systemd user units. `revisd.socket` holds the socket from
//! login on (socket activation: a connection starts revisd when it is not
//! running); `revisd.service` runs revisd and restarts it when it fails.
//! And the `systemctl --user` calls that install, remove and report them.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{InstallOptions, Layout, ServiceError, check, run, say, utf8};

pub const SOCKET_UNIT: &str = "revisd.socket";
pub const SERVICE_UNIT: &str = "revisd.service";

/// The socket unit. `%t` is the user's runtime directory, so the path is
/// `$XDG_RUNTIME_DIR/revis/revisd.sock`, the clients' default; systemd
/// creates the directory 0700 and the socket 0600, like revisd itself.
pub fn socket_unit() -> String {
    "\
# The socket of revisd, the revis inference daemon. systemd holds it from
# login on and hands it to revisd (socket activation); a connection starts
# revisd when it is not running.
# Written by `revisd service install`, which rewrites it.
[Unit]
Description=revis inference daemon socket

[Socket]
ListenStream=%t/revis/revisd.sock
SocketMode=0600
DirectoryMode=0700
RemoveOnStop=yes

[Install]
WantedBy=sockets.target
"
    .to_owned()
}

/// The service unit for the revisd binary and arguments in `layout`.
pub fn service_unit(layout: &Layout) -> Result<String, ServiceError> {
    let word = |p: &Path, word| quote(utf8(p, "it is not valid UTF-8")?, Some(p), word);
    let mut exec = word(&layout.revisd, Word::Program)?;
    for arg in layout.arguments() {
        exec.push(' ');
        exec.push_str(&word(arg, Word::Argument)?);
    }
    let mut env = String::new();
    for (name, value) in &layout.env {
        env.push_str(&format!("Environment={}\n", quote(&format!("{name}={value}"), None, Word::Environment)?));
    }
    Ok(format!(
        "\
# revisd, the revis inference daemon, as a systemd user service.
# Written by `revisd service install`, which rewrites it: put settings of
# your own in `systemctl --user edit revisd.service`.
[Unit]
Description=revis inference daemon
Requires={SOCKET_UNIT}
After={SOCKET_UNIT}

[Service]
Type=simple
ExecStart={exec}
{env}\
# Started again when it crashes or is killed, not after a clean stop. A bad
# config (exit 64) or an unusable socket (exit 73) would fail again: not retried.
Restart=on-failure
RestartSec=2
RestartPreventExitStatus=64 73
# After SIGTERM revisd drains and exits within 5 s (2 s grace, then 3 s).
TimeoutStopSec=15

[Install]
WantedBy=default.target
Also={SOCKET_UNIT}
"
    ))
}

/// Where a word goes in the unit file: systemd treats each differently.
#[derive(Clone, Copy, PartialEq)]
enum Word {
    /// ExecStart='s program: `%` specifiers expanded, `$` not; quotes and
    /// backslashes are refused outright ("special characters").
    Program,
    /// ExecStart='s arguments: `%` specifiers and `$` variables expanded.
    Argument,
    /// An Environment= assignment: `%` specifiers expanded.
    Environment,
}

/// One word of a unit file line, double-quoted: backslashes and quotes
/// escaped, `%` doubled, and `$` doubled where variables are expanded.
/// Control characters cannot be written at all.
fn quote(s: &str, path: Option<&Path>, word: Word) -> Result<String, ServiceError> {
    let refuse = |why| ServiceError::Unrepresentable { path: path.map_or_else(|| PathBuf::from(s), Path::to_path_buf), why };
    if s.chars().any(char::is_control) {
        return Err(refuse("it contains a control character"));
    }
    if word == Word::Program && s.contains(['"', '\'', '\\']) {
        return Err(refuse("systemd does not run a program whose path has quotes or backslashes in it"));
    }
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '\\' => q.push_str("\\\\"),
            '"' => q.push_str("\\\""),
            '%' => q.push_str("%%"),
            '$' if word == Word::Argument => q.push_str("$$"),
            c => q.push(c),
        }
    }
    q.push('"');
    Ok(q)
}

/// `systemctl --user ARGS`, whatever its outcome.
pub(crate) fn systemctl(args: &[&str]) -> Result<std::process::Output, ServiceError> {
    run("systemctl", &[&["--user"], args].concat())
}

/// `systemctl --user ARGS`, which must succeed.
fn ctl(args: &[&str]) -> Result<(), ServiceError> {
    let full = [&["--user"], args].concat();
    check("systemctl", &full, run("systemctl", &full)?).map(drop)
}

/// Reloads the user manager's units; Err says why the manager cannot be
/// reached (no `systemd --user`: containers, CI, a session without systemd).
fn reload() -> Result<(), String> {
    match systemctl(&["daemon-reload"]) {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

const START: &str = "systemctl --user daemon-reload && systemctl --user enable --now revisd.socket revisd.service";

pub(crate) fn install(_: &Layout, opts: InstallOptions, changed: &[PathBuf], out: &mut dyn Write) -> Result<(), ServiceError> {
    let socket_changed = changed.iter().any(|p| p.ends_with(SOCKET_UNIT));
    let service_changed = changed.iter().any(|p| p.ends_with(SERVICE_UNIT));
    // A new socket unit: restarting the socket restarts the service too (it Requires= the socket).
    let plan: [(&str, &str); 2] = match (socket_changed, service_changed) {
        (true, _) => [("restart", SOCKET_UNIT), ("start", SERVICE_UNIT)],
        (false, true) => [("start", SOCKET_UNIT), ("restart", SERVICE_UNIT)],
        (false, false) => [("start", SOCKET_UNIT), ("start", SERVICE_UNIT)],
    };
    if opts.dry_run {
        say!(out, "would run: systemctl --user daemon-reload");
        say!(out, "would run: systemctl --user enable {SOCKET_UNIT} {SERVICE_UNIT}");
        for (verb, unit) in plan {
            say!(out, "would run: systemctl --user {verb} {unit}");
        }
        return Ok(());
    }
    if opts.no_start {
        say!(out, "not enabled or started (--no-start); to do that: {START}");
        return Ok(());
    }
    let reached = reload();
    // Enabling only makes links next to the unit files, which systemctl does
    // itself when no manager answers: the service then starts at the next login.
    let enabled = ctl(&["enable", SOCKET_UNIT, SERVICE_UNIT]);
    match (reached, enabled) {
        (Ok(()), enabled) => {
            enabled?;
            for (verb, unit) in plan {
                ctl(&[verb, unit])?;
            }
            say!(out, "revisd runs as a systemd user service now, and starts at every login");
            say!(out, "`revisd service status` shows it; `revisd service logs` shows its log");
        }
        (Err(why), enabled) => {
            match enabled {
                Ok(()) => say!(out, "enabled {SOCKET_UNIT} and {SERVICE_UNIT}: they start at your next login"),
                Err(e) => say!(out, "could not enable the units either: {e}"),
            }
            say!(out, "not started now: `systemctl --user` cannot reach your service manager ({why})");
            say!(out, "in a login session with systemd, start it with: {START}");
        }
    }
    Ok(())
}

pub(crate) fn stop_and_disable(layout: &Layout, dry_run: bool, out: &mut dyn Write) -> Result<(), ServiceError> {
    if !layout.files()?.iter().any(|(p, _)| p.exists()) {
        return Ok(());
    }
    if dry_run {
        say!(out, "would run: systemctl --user disable --now {SERVICE_UNIT} {SOCKET_UNIT}");
        return Ok(());
    }
    match reload() {
        Ok(()) => {
            ctl(&["disable", "--now", SERVICE_UNIT, SOCKET_UNIT])?;
            say!(out, "stopped and disabled {SERVICE_UNIT} and {SOCKET_UNIT}");
        }
        Err(why) => {
            // Without a manager nothing runs under it; the links go all the same.
            ctl(&["disable", SERVICE_UNIT, SOCKET_UNIT])?;
            say!(out, "disabled {SERVICE_UNIT} and {SOCKET_UNIT} (`systemctl --user` cannot reach your service manager: {why})");
        }
    }
    Ok(())
}

/// What systemd says about the two units.
pub(crate) fn report(out: &mut dyn Write) {
    let query = |verb: &str| -> Result<Vec<String>, String> {
        let o = systemctl(&[verb, SOCKET_UNIT, SERVICE_UNIT]).map_err(|e| e.to_string())?;
        let lines: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(str::to_owned).collect();
        if lines.len() == 2 { Ok(lines) } else { Err(String::from_utf8_lossy(&o.stderr).trim().to_owned()) }
    };
    let enabled = query("is-enabled");
    let active = query("is-active");
    for (i, unit) in [SOCKET_UNIT, SERVICE_UNIT].into_iter().enumerate() {
        let e = enabled.as_ref().map_or("enabled state unknown", |l| l[i].as_str());
        let a = active.as_ref().map_or("running state unknown", |l| l[i].as_str());
        say!(out, "systemd: {unit}: {e}, {a}");
    }
    if let Err(why) = active.as_ref() {
        say!(out, "systemd: `systemctl --user` cannot reach your service manager ({why})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Manager;

    fn layout(revisd: PathBuf, config: Option<PathBuf>) -> Layout {
        Layout {
            manager: Manager::Systemd,
            revisd,
            config,
            env: vec![("REVIS_DATA_DIR".into(), "/home/ada/100% data/revis".into())],
            home: "/home/ada".into(),
            systemd_dir: "/home/ada/.config/systemd/user".into(),
            runtime_dir: "/run/user/1000".into(),
            uid: 1000,
        }
    }

    /// The units as `install` writes them pass systemd's own checker, with
    /// paths that need quoting (spaces, `%`, `$`, quotes, backslashes). The
    /// program exists, as `verify` checks that it is executable.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_units_pass_systemd_analyze_verify() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("my bin 100% $HOME");
        std::fs::create_dir(&bin).unwrap();
        let revisd = bin.join("revisd");
        std::fs::write(&revisd, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&revisd, std::fs::Permissions::from_mode(0o755)).unwrap();
        let units = tmp.path().join("units");
        let runtime = tmp.path().join("runtime");
        std::fs::create_dir(&units).unwrap();
        std::fs::create_dir(&runtime).unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        let l = layout(revisd, Some(tmp.path().join(r#"a "config" \ 100% $HOME.toml"#)));
        std::fs::write(units.join(SOCKET_UNIT), socket_unit()).unwrap();
        std::fs::write(units.join(SERVICE_UNIT), service_unit(&l).unwrap()).unwrap();
        let out = std::process::Command::new("systemd-analyze")
            .args(["--user", "verify"])
            .arg(units.join(SOCKET_UNIT))
            .arg(units.join(SERVICE_UNIT))
            .env("XDG_RUNTIME_DIR", &runtime)
            .output()
            .expect("systemd-analyze runs (Debian: apt-get install systemd)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Unknown keys or bad values are only warnings: none may appear.
        assert!(out.status.success() && stderr.trim().is_empty(), "{}\n{stderr}", out.status);

        // And the checker does catch a program that is not there.
        let missing = layout(tmp.path().join("not here/revisd"), None);
        std::fs::write(units.join(SERVICE_UNIT), service_unit(&missing).unwrap()).unwrap();
        let out = std::process::Command::new("systemd-analyze")
            .args(["--user", "verify"])
            .arg(units.join(SERVICE_UNIT))
            .env("XDG_RUNTIME_DIR", &runtime)
            .output()
            .unwrap();
        assert!(!out.status.success());
    }

    #[test]
    fn the_service_unit_runs_this_revisd_and_restarts_it() {
        let l = layout("/opt/revis/bin/revisd".into(), Some("/home/ada/revisd.toml".into()));
        expect_test::expect![[r#"
            # revisd, the revis inference daemon, as a systemd user service.
            # Written by `revisd service install`, which rewrites it: put settings of
            # your own in `systemctl --user edit revisd.service`.
            [Unit]
            Description=revis inference daemon
            Requires=revisd.socket
            After=revisd.socket

            [Service]
            Type=simple
            ExecStart="/opt/revis/bin/revisd" "--config" "/home/ada/revisd.toml"
            Environment="REVIS_DATA_DIR=/home/ada/100%% data/revis"
            # Started again when it crashes or is killed, not after a clean stop. A bad
            # config (exit 64) or an unusable socket (exit 73) would fail again: not retried.
            Restart=on-failure
            RestartSec=2
            RestartPreventExitStatus=64 73
            # After SIGTERM revisd drains and exits within 5 s (2 s grace, then 3 s).
            TimeoutStopSec=15

            [Install]
            WantedBy=default.target
            Also=revisd.socket
        "#]]
        .assert_eq(&service_unit(&l).unwrap());
        assert!(socket_unit().contains("ListenStream=%t/revis/revisd.sock\n"));
        assert_eq!(l.socket(), Path::new("/run/user/1000/revis/revisd.sock"));
    }

    #[test]
    fn words_are_quoted_for_systemd() {
        let q = |s: &str, w| quote(s, None, w).unwrap();
        assert_eq!(q("/usr/bin/revisd", Word::Program), r#""/usr/bin/revisd""#);
        assert_eq!(q("/a b/100%/$HOME", Word::Program), r#""/a b/100%%/$HOME""#);
        assert_eq!(q(r#"/a b/100%/$HOME/"x"\y"#, Word::Argument), r#""/a b/100%%/$$HOME/\"x\"\\y""#);
        assert_eq!(q("A=$x%", Word::Environment), r#""A=$x%%""#);
        assert!(quote("a\nb", None, Word::Argument).is_err());
        assert!(quote("/a'b/revisd", None, Word::Program).is_err());
    }
}
