//! `revis serve install | status | uninstall | logs`: `revis serve` as a
//! user service next to revisd's, with the real systemctl where no user
//! manager answers, with a stand-in that records what it is asked, and
//! under a real `systemd --user` (the parent module's [`UserManager`]),
//! where it answers HTTP, comes back after kill -9 and goes with uninstall.
//!
//! [`UserManager`]: super::user_manager::UserManager

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use revis_testkit::binary;

use super::{Home, fake_service_manager, stdout};

const UNIT: &str = "revis-serve.service";

impl Home {
    /// `revis ARGS` (`serve ...`) with `runtime` as XDG_RUNTIME_DIR, mDNS off.
    fn revis_in(&self, runtime: &Path, args: &[&str]) -> Output {
        let mut cmd = Command::new(binary("revis"));
        cmd.args(args)
            .env("HOME", self.p("home"))
            .env("XDG_CONFIG_HOME", self.p("config"))
            .env("XDG_RUNTIME_DIR", runtime)
            .env("REVIS_DATA_DIR", self.p("data"))
            .env("REVIS_MDNS_INTERFACES", "none")
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env_remove("REVIS_SOCKET")
            .env_remove("REVIS_NODE");
        if let Some(path) = &self.path {
            cmd.env("PATH", path);
        }
        cmd.output().unwrap()
    }

    fn revis(&self, args: &[&str]) -> Output {
        self.revis_in(&self.p("run"), args)
    }
}

/// A loopback address nothing listened on a moment ago.
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// `GET path` at `addr`: the status and the body (`Connection: close`, so
/// the body is what follows the head).
fn get(addr: SocketAddr, path: &str, key: Option<&str>) -> std::io::Result<(u16, String)> {
    let mut c = TcpStream::connect(addr)?;
    c.set_read_timeout(Some(Duration::from_secs(30)))?;
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    write!(c, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n")?;
    let mut raw = String::new();
    c.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok((status, body.to_owned()))
}

#[test]
fn serve_install_writes_its_unit_refuses_flags_that_cannot_work_and_status_reads_its_flags_back() {
    let home = Home::new();
    let addr = free_addr();
    let a = addr.to_string();
    let out = home.revis(&["serve", "install", "--addr", &a, "--max-generations", "3"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    // No user manager answers here: written and enabled, and the report says so.
    assert!(text.contains("cannot reach your service manager"), "{text}");
    assert!(text.contains(&format!("enabled {UNIT}: it starts at your next login")), "{text}");
    let unit = std::fs::read_to_string(home.unit(UNIT)).unwrap();
    let exec = format!(
        "ExecStart=\"{}\" \"serve\" \"--addr\" \"{a}\" \"--max-generations\" \"3\" \"--max-body-bytes\" \"4194304\" \"--max-connections\" \"64\" \"--header-timeout-ms\" \"10000\" \"--write-timeout-ms\" \"60000\"\n",
        binary("revis").canonicalize().unwrap().display()
    );
    assert!(unit.contains(&exec), "runs the revis that installed it, with every flag:\n{unit}");
    assert!(unit.contains(&format!("Environment=\"REVIS_DATA_DIR={}\"\n", home.p("data").display())), "{unit}");
    assert!(unit.contains("Environment=\"REVIS_MDNS_INTERFACES=none\"\n"), "{unit}");
    assert!(unit.contains("Wants=revisd.socket\nAfter=revisd.socket\n"), "{unit}");
    assert!(home.p("config/systemd/user/default.target.wants").join(UNIT).exists(), "enabled");
    assert!(!home.unit("revisd.service").exists() && !home.unit("revisd.socket").exists(), "revisd's units are revisd's to install");
    let verify = Command::new("systemd-analyze")
        .args(["--user", "verify"])
        .arg(home.unit(UNIT))
        .env("XDG_RUNTIME_DIR", home.p("run"))
        .output()
        .expect("systemd-analyze (Debian: apt-get install systemd)");
    assert!(verify.status.success() && verify.stderr.is_empty(), "{}", stdout(&verify));

    let again = home.revis(&["serve", "install", "--addr", &a, "--max-generations", "3"]);
    assert!(stdout(&again).contains(&format!("{UNIT} is up to date")), "{}", stdout(&again));

    // A bare `status` reads the flags back from the unit: installed as this
    // command would write it, and asked on the address it listens on.
    let status = home.revis(&["serve", "status"]);
    let text = stdout(&status);
    assert_eq!(status.status.code(), Some(3), "{text}");
    assert!(text.contains(&format!("{}: installed\n", home.unit(UNIT).display())), "{text}");
    assert!(text.contains(&format!("systemd: {UNIT}: enabled")), "{text}");
    assert!(text.contains(&format!("http://{a}: no revis serve answers (nothing listens there)")), "{text}");

    // Flags it could only fail with at every start are not installed (exit 64, as revisd's bad config).
    for (args, says) in [
        (vec!["--addr", "0.0.0.0:11435"], "needs TLS"),
        (vec!["--addr", "127.0.0.1:11435", "--max-connections", "0"], "must be at least 1"),
        (vec!["--addr", "127.0.0.1:0"], "a port of its own"),
    ] {
        let out = home.revis(&[&["serve", "install"], &args[..]].concat());
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stdout(&out));
        assert!(stdout(&out).contains(says), "{args:?}: {}", stdout(&out));
    }
    assert_eq!(std::fs::read_to_string(home.unit(UNIT)).unwrap(), unit, "the installed unit is left as it was");

    // Other flags: rewritten, and status still finds them.
    let out = home.revis(&["serve", "install", "--addr", &a, "--no-key"]);
    assert!(stdout(&out).contains(&format!("wrote {}", home.unit(UNIT).display())), "{}", stdout(&out));
    assert!(std::fs::read_to_string(home.unit(UNIT)).unwrap().contains(&format!("\"--addr\" \"{a}\" \"--no-key\"")));
    let text = stdout(&home.revis(&["serve", "status"]));
    assert!(text.contains(&format!("{}: installed\n", home.unit(UNIT).display())), "{text}");

    // Uninstall removes the unit and its link, and nothing else; twice is fine.
    for _ in 0..2 {
        let out = home.revis(&["serve", "uninstall"]);
        assert!(out.status.success(), "{}", stdout(&out));
    }
    assert!(!home.unit(UNIT).exists());
    assert!(!home.p("config/systemd/user/default.target.wants").join(UNIT).exists());
    assert!(home.p("data/models").read_dir().unwrap().next().is_some(), "the models are still there");
    let text = stdout(&home.revis(&["serve", "status"]));
    assert!(text.contains(&format!("{}: not installed", home.unit(UNIT).display())), "{text}");
}

/// With a manager that answers (a stand-in systemctl that records its
/// arguments), `revis serve install` enables and starts its one unit,
/// restarts it only when it changed, and touches no unit of revisd's.
#[test]
fn serve_service_commands_drive_systemctl_and_journalctl() {
    let mut home = Home::new();
    let take_calls = fake_service_manager(&mut home);
    let run = |args: &[&str]| {
        let out = home.revis(&[&["serve"], args].concat());
        assert!(out.status.success(), "{}", stdout(&out));
        stdout(&out)
    };

    let text = run(&["install", "--addr", "127.0.0.1:11999"]);
    assert!(text.contains("revis serve runs as a systemd user service now"), "{text}");
    assert!(text.contains("`revis serve status` shows it"), "{text}");
    let started = ["systemctl --user daemon-reload", "systemctl --user enable revis-serve.service"];
    assert_eq!(take_calls(), [&started[..], &["systemctl --user restart revis-serve.service"]].concat());
    run(&["install", "--addr", "127.0.0.1:11999"]);
    assert_eq!(
        take_calls(),
        [&started[..], &["systemctl --user start revis-serve.service"]].concat(),
        "nothing changed: nothing restarted"
    );
    run(&["install", "--addr", "127.0.0.1:11998"]);
    assert_eq!(take_calls(), [&started[..], &["systemctl --user restart revis-serve.service"]].concat(), "a new address: restarted");

    run(&["install", "--addr", "127.0.0.1:11998", "--no-start"]);
    run(&["install", "--addr", "127.0.0.1:11997", "--dry-run"]);
    run(&["uninstall", "--dry-run"]);
    assert_eq!(take_calls(), Vec::<String>::new(), "--no-start and --dry-run call nothing");
    assert!(std::fs::read_to_string(home.unit(UNIT)).unwrap().contains("127.0.0.1:11998"), "a dry run writes nothing");

    run(&["uninstall"]);
    assert_eq!(
        take_calls(),
        ["systemctl --user daemon-reload", "systemctl --user disable --now revis-serve.service", "systemctl --user daemon-reload"]
    );
    run(&["logs", "-n", "20", "--follow"]);
    assert_eq!(take_calls(), ["journalctl --user -u revis-serve.service --no-pager -n 20 --follow"]);
}

/// The README's `revis serve install`, under a real `systemd --user` of
/// the test's own, next to revisd installed as a service: it answers HTTP
/// on its address (reaching revisd through revisd's socket, which it starts
/// with it and which starts revisd), `revis serve status` says so, a kill -9 is followed by a
/// restart, and `uninstall` stops it and leaves revisd's units alone.
#[test]
fn under_a_real_systemd_revis_serve_answers_http_and_comes_back_after_a_crash() {
    use std::os::unix::fs::PermissionsExt;

    use super::user_manager::{POLL, UserManager};
    /// A start of revis serve (and of revisd through its socket) takes well
    /// under a second; after a crash RestartSec=2 comes first.
    const UP_TIMEOUT: Duration = Duration::from_secs(30);

    let home = Home::new();
    std::fs::set_permissions(home.p("run"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::create_dir(home.p("home")).unwrap();
    let (user_home, config_home, runtime) = (home.p("home"), home.p("config"), home.p("run"));
    let manager = UserManager::start(
        &[("HOME", &user_home), ("XDG_CONFIG_HOME", &config_home), ("XDG_RUNTIME_DIR", &runtime)],
        home.p("systemd.log"),
    );
    let context = || {
        let units = manager.systemctl(&["status", "--no-pager", "revisd.socket", "revisd.service", UNIT]);
        format!("\n{}\nthe manager's log:\n{}", stdout(&units), manager.log_text())
    };
    let main_pid = || manager.property(UNIT, "MainPID").parse::<u32>().expect("MainPID is a number");
    // revisd installed as a service, then stopped, its socket too: what
    // revis serve's unit wants is started with it.
    let config = super::config(home.dir.path());
    let out = home.service(&["install", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}{}", stdout(&out), context());
    assert!(manager.systemctl(&["stop", "revisd.service", "revisd.socket"]).status.success());
    for unit in ["revisd.service", "revisd.socket"] {
        assert_eq!(manager.property(unit, "ActiveState"), "inactive", "{unit}");
    }

    let addr = free_addr();
    let a = addr.to_string();
    let out = home.revis(&["serve", "install", "--addr", &a]);
    let text = stdout(&out);
    assert!(out.status.success() && text.contains("revis serve runs as a systemd user service now"), "{text}{}", context());
    // Polled until it listens: the service binds a moment after systemd starts it.
    let wait_for = |what: &str, pid_other_than: u32| {
        let deadline = Instant::now() + UP_TIMEOUT;
        loop {
            let pid = main_pid();
            if pid != 0 && pid != pid_other_than && get(addr, "/api/version", None).is_ok() {
                return pid;
            }
            assert!(Instant::now() < deadline, "revis serve does not answer on {addr} {UP_TIMEOUT:?} {what} (MainPID {pid}){}", context());
            std::thread::sleep(POLL);
        }
    };
    let first = wait_for("after install", 0);
    assert!(manager.runs(first), "revis serve {first} runs under the test's systemd");
    // It asks for the key it made in the data dir, and with it answers from revisd.
    assert_eq!(get(addr, "/api/version", None).unwrap().0, 401);
    let key = std::fs::read_to_string(home.p("data/http-api-key")).expect("the service made its key in REVIS_DATA_DIR");
    let (code, models) = get(addr, "/v1/models", Some(key.trim())).unwrap();
    assert_eq!(code, 200, "{models}{}", context());
    assert!(models.contains("\"tier2\""), "{models}");
    assert_eq!(manager.property("revisd.socket", "ActiveState"), "active", "Wants=revisd.socket started it");
    assert_eq!(manager.property("revisd.service", "ActiveState"), "active", "revisd was started through its socket");

    let status = home.revis(&["serve", "status"]);
    let text = stdout(&status);
    assert!(status.status.success(), "{text}");
    assert!(text.contains(&format!("{UNIT}: installed\n")), "{text}");
    assert!(text.contains(&format!("systemd: {UNIT}: enabled, active")), "{text}");
    assert!(text.contains(&format!("http://{a}: revis serve answers (HTTP 401")), "{text}");

    // Crashed (kill -9): systemd starts it again by itself, and it answers.
    // SAFETY: a signal to the revis serve this test's manager started.
    assert_eq!(unsafe { libc::kill(first as libc::pid_t, libc::SIGKILL) }, 0);
    let back = wait_for("after kill -9", first);
    assert_eq!(manager.property(UNIT, "NRestarts"), "1", "restarted by Restart=on-failure");
    assert_eq!(get(addr, "/v1/models", Some(key.trim())).unwrap().0, 200);

    // Uninstall stops it; revisd's units stay.
    let out = home.revis(&["serve", "uninstall"]);
    let text = stdout(&out);
    assert!(out.status.success() && text.contains(&format!("stopped and disabled {UNIT}")), "{text}");
    // SAFETY: signal 0 only checks that the process exists.
    assert!(unsafe { libc::kill(back as libc::pid_t, 0) } != 0, "revis serve {back} still runs after uninstall");
    assert!(get(addr, "/api/version", None).is_err(), "nothing listens on {addr} any more");
    assert!(!home.unit(UNIT).exists());
    assert_eq!(manager.property("revisd.socket", "ActiveState"), "active");
    let status = home.revis(&["serve", "status"]);
    assert_eq!(status.status.code(), Some(3), "{}", stdout(&status));
}
