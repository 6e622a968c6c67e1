//! macOS: the LaunchAgents, filled in from the templates in `launchd/`
//! (embedded here, so the templates in the repository are the ones
//! installed), and the `launchctl bootstrap`/`bootout` calls in the user's
//! `gui/UID` domain. Not run here (no macOS); the plists themselves are
//! tested on every platform.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::command::{and_list, check, run, say};
use crate::error::{ServiceError, io_error, utf8};
use crate::layout::Layout;
use crate::options::InstallOptions;

/// The LaunchAgent for the program, arguments and variables in `layout`.
pub fn plist(layout: &Layout) -> Result<String, ServiceError> {
    let text = |p: &Path| -> Result<String, ServiceError> { xml(utf8(p, "it is not valid UTF-8")?, p) };
    let program = text(&layout.program)?;
    let mut arguments = String::new();
    for arg in &layout.args {
        arguments.push_str(&format!("\n\t\t<string>{}</string>", text(Path::new(arg))?));
    }
    let mut environment = String::new();
    if !layout.env.is_empty() {
        environment.push_str("\n\t<key>EnvironmentVariables</key>\n\t<dict>");
        for (name, value) in &layout.env {
            let (name, value) = (xml(name, Path::new(name))?, xml(value, Path::new(value))?);
            environment.push_str(&format!("\n\t\t<key>{name}</key>\n\t\t<string>{value}</string>"));
        }
        environment.push_str("\n\t</dict>");
    }
    let filled = layout
        .service
        .plist
        .replace("{{LABEL}}", layout.service.label)
        .replace("{{PROGRAM}}", &program)
        .replace("{{ARGUMENTS}}", &arguments)
        .replace("{{ENVIRONMENT}}", &environment)
        .replace("{{LOG}}", &text(&layout.log())?)
        .replace("{{SOCKET}}", &text(&layout.socket())?);
    debug_assert!(!filled.contains("{{"), "a placeholder of the template of {} was not filled in", layout.service.label);
    Ok(filled)
}

/// `s` as XML character data. XML 1.0 cannot carry control characters
/// other than tab and newline.
fn xml(s: &str, path: &Path) -> Result<String, ServiceError> {
    if s.chars().any(|c| c.is_control() && c != '\t' && c != '\n') {
        return Err(ServiceError::Unrepresentable { path: path.into(), why: "it contains a control character" });
    }
    Ok(s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;"))
}

/// The words after the program in the ProgramArguments [`plist`] wrote;
/// `None` for a plist it does not write.
pub(crate) fn program_arguments(plist: &str) -> Option<Vec<String>> {
    let (_, rest) = plist.split_once("<key>ProgramArguments</key>")?;
    let array = rest.trim_start().strip_prefix("<array>")?.split_once("</array>")?.0;
    let mut words = Vec::new();
    for item in array.split("</string>").map(str::trim_start).filter(|i| !i.is_empty()) {
        let word = item.strip_prefix("<string>")?;
        words.push(word.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"));
    }
    (!words.is_empty()).then(|| words.split_off(1))
}

fn domain(layout: &Layout) -> String {
    format!("gui/{}", layout.uid)
}

fn target(layout: &Layout) -> String {
    format!("gui/{}/{}", layout.uid, layout.service.label)
}

fn launchctl(args: &[&str]) -> Result<(), ServiceError> {
    check("launchctl", args, run("launchctl", args)?).map(drop)
}

/// Whether the job is loaded in the user's domain.
fn loaded(layout: &Layout) -> bool {
    run("launchctl", &["print", &target(layout)]).is_ok_and(|o| o.status.success())
}

/// `bootout` returns before the job is gone; bootstrapping it again too
/// early fails ("Bootstrap failed: 5"). How long to wait for it to go.
const BOOTOUT_WAIT: Duration = Duration::from_secs(10);

fn wait_unloaded(layout: &Layout) -> Result<(), ServiceError> {
    let deadline = Instant::now() + BOOTOUT_WAIT;
    while loaded(layout) {
        if Instant::now() > deadline {
            return Err(ServiceError::Command {
                command: format!("launchctl bootout {}", target(layout)),
                message: format!("the job was still loaded after {} s", BOOTOUT_WAIT.as_secs()),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Creates `dir` (and its parents) and makes it private.
fn private_dir(dir: &Path) -> Result<(), ServiceError> {
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io_error(dir))
}

pub(crate) fn install(layout: &Layout, opts: InstallOptions, changed: bool, out: &mut dyn Write) -> Result<(), ServiceError> {
    let (name, command, label) = (layout.service.name, layout.service.command, layout.service.label);
    let (plist_path, _) = layout.files()?.remove(0);
    let plist_path = utf8(&plist_path, "it is not valid UTF-8")?.to_owned();
    let (domain, target) = (domain(layout), target(layout));
    // launchd creates the socket and opens the log, but not their directories.
    let mut dirs = Vec::new();
    if layout.service.socket {
        dirs.push(layout.socket().parent().expect("the socket is in a directory").to_path_buf());
    }
    dirs.push(layout.log().parent().expect("the log is in a directory").to_path_buf());
    if opts.dry_run {
        let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        say!(out, "would create {} (mode 0700)", and_list(&dirs));
        say!(out, "would run: launchctl enable {target}");
        say!(out, "would run: launchctl bootstrap {domain} {plist_path} (after `launchctl bootout {target}` if it is loaded and changed)");
        return Ok(());
    }
    for dir in &dirs {
        private_dir(dir)?;
    }
    if opts.no_start {
        say!(out, "not loaded (--no-start); to load it: launchctl bootstrap {domain} {plist_path}");
        return Ok(());
    }
    let was_loaded = loaded(layout);
    if was_loaded && changed {
        launchctl(&["bootout", &target])?;
        wait_unloaded(layout)?;
    }
    // Undoes an earlier `launchctl disable`, which would make bootstrap fail.
    launchctl(&["enable", &target])?;
    if was_loaded && !changed {
        // Loaded and current: start it if it is not running (no -k: a running one is left alone).
        launchctl(&["kickstart", &target])?;
    } else {
        launchctl(&["bootstrap", &domain, &plist_path])?;
    }
    say!(out, "{name} runs as a LaunchAgent ({label}) now, and starts at every login");
    say!(out, "`{command} status` shows it; `{command} logs` shows its log ({})", layout.log().display());
    Ok(())
}

pub(crate) fn bootout(layout: &Layout, dry_run: bool, out: &mut dyn Write) -> Result<(), ServiceError> {
    let target = target(layout);
    if !loaded(layout) {
        return Ok(());
    }
    if dry_run {
        say!(out, "would run: launchctl bootout {target}");
        return Ok(());
    }
    launchctl(&["bootout", &target])?;
    wait_unloaded(layout)?;
    say!(out, "stopped and unloaded {}", layout.service.label);
    Ok(())
}

/// What launchd says about the job: loaded or not, its state and pid.
pub(crate) fn report(layout: &Layout, out: &mut dyn Write) {
    let label = layout.service.label;
    match run("launchctl", &["print", &target(layout)]) {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let field =
                |name: &str| text.lines().map(str::trim).find_map(|l| l.strip_prefix(name)?.trim_start().strip_prefix('=')).map(str::trim);
            let state = field("state").unwrap_or("unknown");
            match field("pid") {
                Some(pid) => say!(out, "launchd: {label} is loaded, {state}, pid {pid}"),
                None => say!(out, "launchd: {label} is loaded, {state}"),
            }
        }
        Ok(_) => say!(out, "launchd: {label} is not loaded"),
        Err(e) => say!(out, "launchd: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::path::PathBuf;

    use plist::Value;

    use super::*;
    use crate::{Manager, Probe, REVISD, SERVE};

    fn layout() -> Layout {
        Layout {
            manager: Manager::Launchd,
            service: &REVISD,
            program: PathBuf::from("/Applications/R&D <tools>/revisd"),
            args: vec!["--config".into(), "/Users/ada/My Config/revisd.toml".into()],
            env: vec![("REVIS_DATA_DIR".into(), "/Volumes/Big Disk/revis".into())],
            probe: Probe::Revisd,
            home: PathBuf::from("/Users/ada"),
            systemd_dir: PathBuf::from("/unused"),
            runtime_dir: PathBuf::from("/unused"),
            uid: 501,
        }
    }

    fn serve_layout() -> Layout {
        Layout {
            service: &SERVE,
            program: PathBuf::from("/Applications/R&D <tools>/revis"),
            args: ["serve", "--addr", "127.0.0.1:11435", "--max-generations", "16"].into_iter().map(OsString::from).collect(),
            env: vec![("REVIS_DATA_DIR".into(), "/Volumes/Big Disk/revis".into()), ("REVIS_MDNS_INTERFACES".into(), "none".into())],
            probe: Probe::Http("127.0.0.1:11435".parse().unwrap(), None),
            ..layout()
        }
    }

    /// The filled-in template parses and says everything launchd needs:
    /// what to run, when, how to restart it, where it logs, and the socket.
    #[test]
    fn the_plist_parses_and_has_every_key() {
        let l = layout();
        let text = plist(&l).unwrap();
        assert!(!text.contains("{{"), "{text}");
        let value = Value::from_reader_xml(text.as_bytes()).expect("a valid plist");
        let d = value.as_dictionary().expect("a dictionary");
        let s = |k: &str| d.get(k).and_then(Value::as_string).unwrap_or_else(|| panic!("{k} is a string"));
        let int = |v: Option<&Value>| v.and_then(Value::as_signed_integer);
        assert_eq!(s("Label"), "org.revis.revisd");
        assert_eq!(s("Program"), "/Applications/R&D <tools>/revisd");
        assert!(Path::new(s("Program")).is_absolute());
        let args: Vec<&str> = d["ProgramArguments"].as_array().unwrap().iter().map(|v| v.as_string().unwrap()).collect();
        assert_eq!(args, ["/Applications/R&D <tools>/revisd", "--config", "/Users/ada/My Config/revisd.toml"]);
        assert_eq!(d["RunAtLoad"].as_boolean(), Some(true));
        let keep_alive = d["KeepAlive"].as_dictionary().expect("KeepAlive is a dictionary");
        assert_eq!(keep_alive["SuccessfulExit"].as_boolean(), Some(false), "restarted after a failure only");
        assert!(int(d.get("ThrottleInterval")).is_some_and(|t| t > 0));
        assert!(int(d.get("ExitTimeOut")).is_some_and(|t| t > 5), "longer than revisd's own drain");
        assert_eq!(s("ProcessType"), "Standard");
        assert_eq!(s("StandardOutPath"), "/Users/ada/Library/Logs/revis/revisd.log");
        assert_eq!(s("StandardErrorPath"), "/Users/ada/Library/Logs/revis/revisd.log");
        let env = d["EnvironmentVariables"].as_dictionary().unwrap();
        assert_eq!(env["REVIS_DATA_DIR"].as_string(), Some("/Volumes/Big Disk/revis"));
        let sockets = d["Sockets"].as_dictionary().unwrap();
        let listeners = sockets["Listeners"].as_dictionary().expect("the socket named in revisd's launch_activate_socket call");
        assert_eq!(listeners["SockPathName"].as_string(), Some("/Users/ada/Library/Application Support/revis/revisd.sock"));
        assert_eq!(int(listeners.get("SockPathMode")), Some(0o600));
        assert_eq!(listeners["SockType"].as_string(), Some("stream"));
        assert_eq!(listeners["SockFamily"].as_string(), Some("Unix"));
        let files = l.files().unwrap();
        assert_eq!(files[0].0, Path::new("/Users/ada/Library/LaunchAgents/org.revis.revisd.plist"));
    }

    /// `revis serve`'s agent parses too: this revis with `serve` and the
    /// flags, at login, again after a failure, its own log, and no socket
    /// (revisd holds the one it talks to).
    #[test]
    fn the_serve_plist_parses_and_runs_revis_serve() {
        let l = serve_layout();
        let text = plist(&l).unwrap();
        assert!(!text.contains("{{"), "{text}");
        let value = Value::from_reader_xml(text.as_bytes()).expect("a valid plist");
        let d = value.as_dictionary().expect("a dictionary");
        let s = |k: &str| d.get(k).and_then(Value::as_string).unwrap_or_else(|| panic!("{k} is a string"));
        let int = |v: Option<&Value>| v.and_then(Value::as_signed_integer);
        assert_eq!(s("Label"), "org.revis.serve");
        assert_eq!(s("Program"), "/Applications/R&D <tools>/revis");
        let args: Vec<&str> = d["ProgramArguments"].as_array().unwrap().iter().map(|v| v.as_string().unwrap()).collect();
        assert_eq!(args, ["/Applications/R&D <tools>/revis", "serve", "--addr", "127.0.0.1:11435", "--max-generations", "16"]);
        assert_eq!(d["RunAtLoad"].as_boolean(), Some(true));
        assert_eq!(d["KeepAlive"].as_dictionary().unwrap()["SuccessfulExit"].as_boolean(), Some(false));
        assert!(int(d.get("ThrottleInterval")).is_some_and(|t| t > 0));
        assert!(int(d.get("ExitTimeOut")).is_some_and(|t| t > 3), "longer than revis serve's own grace");
        assert_eq!(s("ProcessType"), "Standard");
        assert_eq!(s("StandardOutPath"), "/Users/ada/Library/Logs/revis/serve.log");
        assert_eq!(s("StandardErrorPath"), "/Users/ada/Library/Logs/revis/serve.log");
        let env = d["EnvironmentVariables"].as_dictionary().unwrap();
        assert_eq!(env["REVIS_DATA_DIR"].as_string(), Some("/Volumes/Big Disk/revis"));
        assert_eq!(env["REVIS_MDNS_INTERFACES"].as_string(), Some("none"));
        assert!(!d.contains_key("Sockets"), "revis serve listens on its address itself");
        assert_eq!(l.files().unwrap()[0].0, Path::new("/Users/ada/Library/LaunchAgents/org.revis.serve.plist"));
    }

    #[test]
    fn without_arguments_or_environment_the_plist_still_parses() {
        for l in [Layout { args: Vec::new(), env: Vec::new(), ..layout() }, Layout { args: Vec::new(), env: Vec::new(), ..serve_layout() }]
        {
            let value = Value::from_reader_xml(plist(&l).unwrap().as_bytes()).expect("a valid plist");
            let d = value.as_dictionary().unwrap();
            assert_eq!(d["ProgramArguments"].as_array().unwrap().len(), 1);
            assert!(!d.contains_key("EnvironmentVariables"));
        }
    }

    #[test]
    fn a_path_xml_cannot_carry_is_refused() {
        let l = Layout { program: PathBuf::from("/a\u{1}b/revisd"), ..layout() };
        assert!(matches!(plist(&l), Err(ServiceError::Unrepresentable { .. })));
        let l = Layout { args: vec!["serve".into(), "--node".into(), "a\u{1}b".into()], ..serve_layout() };
        assert!(matches!(plist(&l), Err(ServiceError::Unrepresentable { .. })));
    }

    /// `status` reads the installed flags back from the agent: what
    /// `plist` wrote comes back word for word, as the plist crate reads it.
    #[test]
    fn the_arguments_are_read_back_from_the_plist_as_written() {
        let tricky = ["serve", "--node", "R&D <lab> &amp;", " x y ", "", "é€"];
        let l = Layout { args: tricky.iter().map(OsString::from).collect(), ..serve_layout() };
        let text = plist(&l).unwrap();
        assert_eq!(program_arguments(&text).unwrap(), tricky);
        let parsed = Value::from_reader_xml(text.as_bytes()).unwrap();
        let words: Vec<&str> =
            parsed.as_dictionary().unwrap()["ProgramArguments"].as_array().unwrap().iter().map(|v| v.as_string().unwrap()).collect();
        assert_eq!(words[1..], tricky);
        assert_eq!(program_arguments("<plist><dict></dict></plist>"), None);
    }
}
