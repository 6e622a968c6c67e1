//! macOS: the LaunchAgent, filled in from `launchd/revisd.plist` (embedded
//! here, so the template in the repository is the one installed), and the
//! `launchctl bootstrap`/`bootout` calls in the user's `gui/UID` domain.
//! Not run here (no macOS); the plist itself is tested on every platform.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::{InstallOptions, Layout, ServiceError, check, io_error, run, say, utf8};

/// The job's label, and the plist's file name without `.plist`.
pub const LABEL: &str = "org.revis.revisd";

const TEMPLATE: &str = include_str!("../../../launchd/revisd.plist");

/// The LaunchAgent for the revisd binary and arguments in `layout`.
pub fn plist(layout: &Layout) -> Result<String, ServiceError> {
    let text = |p: &Path| -> Result<String, ServiceError> { xml(utf8(p, "it is not valid UTF-8")?, p) };
    let program = text(&layout.revisd)?;
    let mut arguments = String::new();
    for arg in layout.arguments() {
        arguments.push_str(&format!("\n\t\t<string>{}</string>", text(arg)?));
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
    let filled = TEMPLATE
        .replace("{{LABEL}}", LABEL)
        .replace("{{PROGRAM}}", &program)
        .replace("{{ARGUMENTS}}", &arguments)
        .replace("{{ENVIRONMENT}}", &environment)
        .replace("{{LOG}}", &text(&layout.log())?)
        .replace("{{SOCKET}}", &text(&layout.socket())?);
    debug_assert!(!filled.contains("{{"), "a placeholder of launchd/revisd.plist was not filled in");
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

fn domain(layout: &Layout) -> String {
    format!("gui/{}", layout.uid)
}

fn target(layout: &Layout) -> String {
    format!("gui/{}/{LABEL}", layout.uid)
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
    let (plist_path, _) = layout.files()?.remove(0);
    let plist_path = utf8(&plist_path, "it is not valid UTF-8")?.to_owned();
    let (domain, target) = (domain(layout), target(layout));
    let socket_dir = layout.socket().parent().expect("the socket is in a directory").to_path_buf();
    let log_dir = layout.log().parent().expect("the log is in a directory").to_path_buf();
    if opts.dry_run {
        say!(out, "would create {} and {} (mode 0700)", socket_dir.display(), log_dir.display());
        say!(out, "would run: launchctl enable {target}");
        say!(out, "would run: launchctl bootstrap {domain} {plist_path} (after `launchctl bootout {target}` if it is loaded and changed)");
        return Ok(());
    }
    // launchd creates the socket and opens the log, but not their directories.
    private_dir(&socket_dir)?;
    private_dir(&log_dir)?;
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
    say!(out, "revisd runs as a LaunchAgent ({LABEL}) now, and starts at every login");
    say!(out, "`revisd service status` shows it; `revisd service logs` shows its log ({})", layout.log().display());
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
    say!(out, "stopped and unloaded {LABEL}");
    Ok(())
}

/// What launchd says about the job: loaded or not, its state and pid.
pub(crate) fn report(layout: &Layout, out: &mut dyn Write) {
    match run("launchctl", &["print", &target(layout)]) {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let field =
                |name: &str| text.lines().map(str::trim).find_map(|l| l.strip_prefix(name)?.trim_start().strip_prefix('=')).map(str::trim);
            let state = field("state").unwrap_or("unknown");
            match field("pid") {
                Some(pid) => say!(out, "launchd: {LABEL} is loaded, {state}, pid {pid}"),
                None => say!(out, "launchd: {LABEL} is loaded, {state}"),
            }
        }
        Ok(_) => say!(out, "launchd: {LABEL} is not loaded"),
        Err(e) => say!(out, "launchd: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use plist::Value;

    use super::*;
    use crate::Manager;

    fn layout() -> Layout {
        Layout {
            manager: Manager::Launchd,
            revisd: PathBuf::from("/Applications/R&D <tools>/revisd"),
            config: Some(PathBuf::from("/Users/ada/My Config/revisd.toml")),
            env: vec![("REVIS_DATA_DIR".into(), "/Volumes/Big Disk/revis".into())],
            home: PathBuf::from("/Users/ada"),
            systemd_dir: PathBuf::from("/unused"),
            runtime_dir: PathBuf::from("/unused"),
            uid: 501,
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
        assert_eq!(s("Label"), LABEL);
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

    #[test]
    fn without_arguments_or_environment_the_plist_still_parses() {
        let l = Layout { config: None, env: Vec::new(), ..layout() };
        let value = Value::from_reader_xml(plist(&l).unwrap().as_bytes()).expect("a valid plist");
        let d = value.as_dictionary().unwrap();
        assert_eq!(d["ProgramArguments"].as_array().unwrap().len(), 1);
        assert!(!d.contains_key("EnvironmentVariables"));
    }

    #[test]
    fn a_path_xml_cannot_carry_is_refused() {
        let l = Layout { revisd: PathBuf::from("/a\u{1}b/revisd"), ..layout() };
        assert!(matches!(plist(&l), Err(ServiceError::Unrepresentable { .. })));
    }
}
