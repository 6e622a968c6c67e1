//! Linux: systemd user units, filled in from the templates in `units.rs`. revisd
//! has two: `revisd.socket` holds the socket from login on (socket
//! activation: a connection starts revisd when it is not running), and
//! `revisd.service` runs revisd and restarts it when it fails. `revis serve`
//! has one, `revis-serve.service`, which wants `revisd.socket`. And the
//! `systemctl --user` calls that install, remove and report them.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::command::{and_list, check, run, say};
use crate::error::{ServiceError, utf8};
use crate::layout::Layout;
use crate::options::InstallOptions;
use crate::units::Unit;

/// `unit` for the program, arguments and variables in `layout`.
pub fn unit_file(layout: &Layout, unit: &Unit) -> Result<String, ServiceError> {
    if !unit.template.contains("{{EXEC}}") {
        return Ok(unit.template.to_owned());
    }
    let mut exec = quote(utf8(&layout.program, "it is not valid UTF-8")?, Some(&layout.program), Word::Program)?;
    for arg in &layout.args {
        let p = Path::new(arg);
        exec.push(' ');
        exec.push_str(&quote(utf8(p, "it is not valid UTF-8")?, Some(p), Word::Argument)?);
    }
    let mut env = String::new();
    for (name, value) in &layout.env {
        env.push_str(&format!("Environment={}\n", quote(&format!("{name}={value}"), None, Word::Environment)?));
    }
    let filled = unit.template.replace("{{EXEC}}", &exec).replace("{{ENVIRONMENT}}", &env);
    debug_assert!(!filled.contains("{{"), "a placeholder of {} was not filled in", unit.name);
    Ok(filled)
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

/// The words after the program in the ExecStart= line [`unit_file`]
/// wrote, unquoted; `None` for a line it does not write.
pub(crate) fn exec_arguments(unit: &str) -> Option<Vec<String>> {
    let line = unit.lines().find_map(|l| l.strip_prefix("ExecStart="))?;
    let mut words: Vec<String> = Vec::new();
    let mut chars = line.chars();
    loop {
        match chars.next() {
            None => break,
            Some(' ') => continue,
            Some('"') => {}
            Some(_) => return None,
        }
        // The program's `$` is not doubled (`Word::Program`), the arguments' is.
        let program = words.is_empty();
        let mut word = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => word.push(chars.next()?),
                c @ ('%' | '$') if c == '%' || !program => {
                    if chars.next()? != c {
                        return None;
                    }
                    word.push(c);
                }
                c => word.push(c),
            }
        }
        words.push(word);
    }
    (!words.is_empty()).then(|| words.split_off(1))
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

/// The service's units, in the order they start.
fn units(layout: &Layout) -> Vec<&'static str> {
    layout.service.units.iter().map(|u| u.name).collect()
}

/// The service's units, in the order they stop (and the journal lists them).
fn units_backwards(layout: &Layout) -> Vec<&'static str> {
    layout.service.units.iter().rev().map(|u| u.name).collect()
}

pub(crate) fn install(layout: &Layout, opts: InstallOptions, changed: &[PathBuf], out: &mut dyn Write) -> Result<(), ServiceError> {
    let (name, command) = (layout.service.name, layout.service.command);
    let units = units(layout);
    // The first unit whose file changed is restarted, the others started: a
    // unit Requires= those before it, so restarting one restarts those after
    // it too (a new socket unit restarts the service).
    let first_changed = units.iter().position(|u| changed.iter().any(|p| p.ends_with(u)));
    let plan: Vec<(&str, &str)> =
        units.iter().enumerate().map(|(i, u)| (if Some(i) == first_changed { "restart" } else { "start" }, *u)).collect();
    let start = format!("systemctl --user daemon-reload && systemctl --user enable --now {}", units.join(" "));
    if opts.dry_run {
        say!(out, "would run: systemctl --user daemon-reload");
        say!(out, "would run: systemctl --user enable {}", units.join(" "));
        for (verb, unit) in plan {
            say!(out, "would run: systemctl --user {verb} {unit}");
        }
        return Ok(());
    }
    if opts.no_start {
        say!(out, "not enabled or started (--no-start); to do that: {start}");
        return Ok(());
    }
    let reached = reload();
    // Enabling only makes links next to the unit files, which systemctl does
    // itself when no manager answers: the service then starts at the next login.
    let enabled = ctl(&[&["enable"], &units[..]].concat());
    match (reached, enabled) {
        (Ok(()), enabled) => {
            enabled?;
            for (verb, unit) in plan {
                ctl(&[verb, unit])?;
            }
            say!(out, "{name} runs as a systemd user service now, and starts at every login");
            say!(out, "`{command} status` shows it; `{command} logs` shows its log");
        }
        (Err(why), enabled) => {
            let one = units.len() == 1;
            match enabled {
                Ok(()) => say!(out, "enabled {}: {} at your next login", and_list(&units), if one { "it starts" } else { "they start" }),
                Err(e) => say!(out, "could not enable {} either: {e}", if one { "the unit" } else { "the units" }),
            }
            say!(out, "not started now: `systemctl --user` cannot reach your service manager ({why})");
            say!(out, "in a login session with systemd, start it with: {start}");
        }
    }
    Ok(())
}

pub(crate) fn stop_and_disable(layout: &Layout, dry_run: bool, out: &mut dyn Write) -> Result<(), ServiceError> {
    if !layout.files()?.iter().any(|(p, _)| p.exists()) {
        return Ok(());
    }
    let units = units_backwards(layout);
    if dry_run {
        say!(out, "would run: systemctl --user disable --now {}", units.join(" "));
        return Ok(());
    }
    match reload() {
        Ok(()) => {
            ctl(&[&["disable", "--now"], &units[..]].concat())?;
            say!(out, "stopped and disabled {}", and_list(&units));
        }
        Err(why) => {
            // Without a manager nothing runs under it; the links go all the same.
            ctl(&[&["disable"], &units[..]].concat())?;
            say!(out, "disabled {} (`systemctl --user` cannot reach your service manager: {why})", and_list(&units));
        }
    }
    Ok(())
}

/// What systemd says about the service's units.
pub(crate) fn report(layout: &Layout, out: &mut dyn Write) {
    let units = units(layout);
    let query = |verb: &str| -> Result<Vec<String>, String> {
        let o = systemctl(&[&[verb], &units[..]].concat()).map_err(|e| e.to_string())?;
        let lines: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(str::to_owned).collect();
        if lines.len() == units.len() { Ok(lines) } else { Err(String::from_utf8_lossy(&o.stderr).trim().to_owned()) }
    };
    let enabled = query("is-enabled");
    let active = query("is-active");
    for (i, unit) in units.iter().enumerate() {
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
    use std::ffi::OsString;

    use super::*;
    use crate::{Manager, Probe, REVISD, SERVE};

    fn layout(revisd: PathBuf, config: Option<PathBuf>) -> Layout {
        Layout {
            manager: Manager::Systemd,
            service: &REVISD,
            program: revisd,
            args: config.map(|c| vec![OsString::from("--config"), c.into()]).unwrap_or_default(),
            env: vec![("REVIS_DATA_DIR".into(), "/home/ada/100% data/revis".into())],
            probe: Probe::Revisd,
            home: "/home/ada".into(),
            systemd_dir: "/home/ada/.config/systemd/user".into(),
            runtime_dir: "/run/user/1000".into(),
            uid: 1000,
        }
    }

    /// `revis serve` as `revis serve install` describes it: the global
    /// flags, `serve`, then serve's own.
    fn serve_layout(revis: PathBuf, args: &[&str]) -> Layout {
        Layout {
            service: &SERVE,
            args: args.iter().map(OsString::from).collect(),
            env: vec![("REVIS_DATA_DIR".into(), "/home/ada/100% data/revis".into()), ("REVIS_MDNS_INTERFACES".into(), "none".into())],
            probe: Probe::Http("127.0.0.1:11435".parse().unwrap(), None),
            ..layout(revis, None)
        }
    }

    /// The text of `unit` for `l`.
    fn file(l: &Layout, unit: &str) -> String {
        unit_file(l, l.service.units.iter().find(|u| u.name == unit).expect("a unit of the service")).unwrap()
    }

    /// `systemd-analyze --user verify` of `units`; Err has what it said.
    #[cfg(target_os = "linux")]
    fn verify(units: &[PathBuf], runtime: &Path) -> Result<(), String> {
        let out = std::process::Command::new("systemd-analyze")
            .args(["--user", "verify"])
            .args(units)
            .env("XDG_RUNTIME_DIR", runtime)
            .output()
            .expect("systemd-analyze runs (Debian: apt-get install systemd)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Unknown keys or bad values are only warnings: none may appear.
        if out.status.success() && stderr.trim().is_empty() { Ok(()) } else { Err(format!("{}\n{stderr}", out.status)) }
    }

    /// A directory for units, an executable `name` in a directory whose
    /// path needs quoting, and a runtime directory (0700).
    #[cfg(target_os = "linux")]
    fn scratch(name: &str) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("my bin 100% $HOME");
        std::fs::create_dir(&bin).unwrap();
        let program = bin.join(name);
        std::fs::write(&program, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let units = tmp.path().join("units");
        let runtime = tmp.path().join("runtime");
        std::fs::create_dir(&units).unwrap();
        std::fs::create_dir(&runtime).unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        (tmp, program, units, runtime)
    }

    /// The units as `install` writes them pass systemd's own checker, with
    /// paths that need quoting (spaces, `%`, `$`, quotes, backslashes). The
    /// program exists, as `verify` checks that it is executable.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_units_pass_systemd_analyze_verify() {
        let (tmp, revisd, units, runtime) = scratch("revisd");
        let l = layout(revisd, Some(tmp.path().join(r#"a "config" \ 100% $HOME.toml"#)));
        let (socket, service) = (units.join("revisd.socket"), units.join("revisd.service"));
        std::fs::write(&socket, file(&l, "revisd.socket")).unwrap();
        std::fs::write(&service, file(&l, "revisd.service")).unwrap();
        verify(&[socket, service.clone()], &runtime).unwrap();

        // And the checker does catch a program that is not there.
        let missing = layout(tmp.path().join("not here/revisd"), None);
        std::fs::write(&service, file(&missing, "revisd.service")).unwrap();
        assert!(verify(&[service], &runtime).is_err());
    }

    /// `revis serve`'s unit passes the checker too, with every flag `revis
    /// serve install` writes and values that need quoting; alone (Wants=
    /// asks nothing of a unit that is not there) and next to revisd's units
    /// (both installed).
    #[cfg(target_os = "linux")]
    #[test]
    fn the_serve_unit_passes_systemd_analyze_verify() {
        let (tmp, revis, units, runtime) = scratch("revis");
        let socket = tmp.path().join(r#"a "run" \ 100% $XDG_RUNTIME_DIR/revisd.sock"#);
        let l = serve_layout(
            revis.clone(),
            &[
                "--socket",
                socket.to_str().unwrap(),
                "--node",
                "desk $USER 100%",
                "serve",
                "--addr",
                "[::1]:11435",
                "--no-key",
                "--max-generations",
                "4",
                "--max-body-bytes",
                "1048576",
                "--max-connections",
                "8",
            ],
        );
        let serve = units.join("revis-serve.service");
        std::fs::write(&serve, file(&l, "revis-serve.service")).unwrap();
        verify(std::slice::from_ref(&serve), &runtime).unwrap();
        let revisd = layout(revis, None);
        let (revisd_socket, revisd_service) = (units.join("revisd.socket"), units.join("revisd.service"));
        std::fs::write(&revisd_socket, file(&revisd, "revisd.socket")).unwrap();
        std::fs::write(&revisd_service, file(&revisd, "revisd.service")).unwrap();
        verify(&[revisd_socket, revisd_service, serve.clone()], &runtime).unwrap();

        // A misspelt key is caught: the checker reads this unit.
        std::fs::write(&serve, file(&l, "revis-serve.service").replace("RestartSec=", "RestartSecs=")).unwrap();
        assert!(verify(&[serve], &runtime).unwrap_err().contains("RestartSecs"));
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
        .assert_eq(&file(&l, "revisd.service"));
        assert!(file(&l, "revisd.socket").contains("ListenStream=%t/revis/revisd.sock\n"));
        assert_eq!(l.socket(), Path::new("/run/user/1000/revis/revisd.sock"));
    }

    /// revis serve's unit: this revis, `serve` and the flags; revisd's
    /// socket wanted and started first; restarted after a crash but not
    /// after a bad command line; no socket of its own.
    #[test]
    fn the_serve_unit_runs_revis_serve_with_its_flags_after_revisd_socket() {
        let l = serve_layout("/opt/revis/bin/revis".into(), &["serve", "--addr", "127.0.0.1:11435", "--max-generations", "16"]);
        expect_test::expect![[r#"
            # revis serve, OpenAI's and Ollama's HTTP APIs over revis, as a systemd user
            # service. Written by `revis serve install`, which rewrites it: put settings
            # of your own in `systemctl --user edit revis-serve.service`.
            [Unit]
            Description=revis serve (OpenAI- and Ollama-compatible HTTP APIs)
            # It answers through revisd: installed as a service too (`revisd service
            # install`), revisd is started by the first request on its socket.
            Wants=revisd.socket
            After=revisd.socket

            [Service]
            Type=simple
            ExecStart="/opt/revis/bin/revis" "serve" "--addr" "127.0.0.1:11435" "--max-generations" "16"
            Environment="REVIS_DATA_DIR=/home/ada/100%% data/revis"
            Environment="REVIS_MDNS_INTERFACES=none"
            # Started again when it crashes or is killed, not after a clean stop. A bad
            # command line (exit 2) or bad flags (exit 64) would fail again: not retried.
            Restart=on-failure
            RestartSec=2
            RestartPreventExitStatus=2 64
            # After SIGTERM answers under way get 3 s to end.
            TimeoutStopSec=15

            [Install]
            WantedBy=default.target
        "#]]
        .assert_eq(&file(&l, "revis-serve.service"));
        let files = l.files().unwrap();
        assert_eq!(files.len(), 1, "no socket unit of its own");
        assert_eq!(files[0].0, Path::new("/home/ada/.config/systemd/user/revis-serve.service"));
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

    /// `status` reads the installed flags back: whatever `unit_file` wrote,
    /// quoted, comes back word for word; a line it does not write gives
    /// nothing rather than wrong words.
    #[test]
    fn the_arguments_are_read_back_from_the_unit_as_written() {
        let tricky = ["serve", "--node", r#"a "b" \c"#, "100%", "$HOME", "$$", "%%", "", "x y", "é€"];
        let l = serve_layout("/opt/100% $x/revis".into(), &tricky);
        assert_eq!(exec_arguments(&file(&l, "revis-serve.service")).unwrap(), tricky);
        let bare = serve_layout("/opt/revis".into(), &[]);
        assert_eq!(exec_arguments(&file(&bare, "revis-serve.service")).unwrap(), Vec::<String>::new());
        for foreign in ["ExecStart=/usr/bin/revis serve", "ExecStart=\"/usr/bin/revis\" \"100%\"", "ExecStart=\"/a\" \"b", "Description=x"]
        {
            assert_eq!(exec_arguments(foreign), None, "{foreign}");
        }
    }
}
