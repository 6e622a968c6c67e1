//! revisd as a background service: socket activation (the socket handed
//! over the way systemd does it), a client that carries on after the daemon
//! was killed and started again, `revisd service install | status |
//! uninstall | logs` against the real systemctl where no user manager
//! answers (a container, CI) and against a stand-in that records what it is
//! asked, and all of it under a real `systemd --user` the test starts.
//! `revis serve` as a service next to revisd: `service/serve.rs`.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use revis_client::Client;
use revis_testkit::{HeldSocket, TestDaemon, activated_revisd, binary};

#[cfg(target_os = "linux")]
mod serve;
#[cfg(target_os = "linux")]
mod user_manager;

/// One whole answer through `Client::generate` (the retrying one).
async fn answer(c: &mut Client, text: &str) -> String {
    let params = revis_client::GenerateParams {
        messages: vec![revis_client::Message::user(text)],
        sampling: revis_client::Sampling { temperature: Some(0.0), ..Default::default() },
        max_tokens: Some(48),
        ..Default::default()
    };
    let stream = c.generate(&params).await.expect("Generate starts");
    let mut out = String::new();
    stream.finish(|t| out.push_str(t)).await.expect("the stream goes on to Done");
    out
}

const CAPITAL: &str = "What is the capital of France?";

// Multi-threaded: the client stays connected while the test blocks in
// `wait_exit`, and must still answer the daemon's shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_activation_serves_through_the_handed_over_socket() {
    let mut d = TestDaemon::new().start_activated(HeldSocket::new());
    let mut c = d.client().await;
    assert_eq!(c.status().await.unwrap().pid, d.pid(), "the PID the test holds is revisd's own");
    let first = answer(&mut c, CAPITAL).await;
    assert!(!first.trim().is_empty(), "an answer through the handed-over socket");
    assert!(d.log_text().contains("activated=true"), "{}", d.log_text());

    // A clean stop leaves the socket to its owner: the file stays, and a
    // connection made while no revisd runs waits for the next one.
    d.signal(libc::SIGTERM);
    assert!(d.wait_exit(Duration::from_secs(10)).expect("exited").success());
    assert!(d.socket.exists(), "revisd removed a socket that systemd owns");
    let waiting = tokio::net::UnixStream::connect(&d.socket).await.expect("the held socket still accepts");
    drop(waiting);
    d.restart();
    assert_eq!(answer(&mut c, CAPITAL).await, first, "greedy: the next revisd on the same socket answers as the first did");
}

#[tokio::test]
async fn a_client_carries_on_after_the_daemon_is_killed_and_started_again() {
    let mut d = TestDaemon::new().start();
    let mut c = d.client().await;
    let first = c.status().await.unwrap().pid;
    let before = answer(&mut c, CAPITAL).await;
    d.signal(libc::SIGKILL);
    d.wait_exit(Duration::from_secs(10)).expect("killed");
    // The next request finds no daemon and says so clearly (nothing listens
    // on the socket; not the broken pipe of the dead connection, which is retried).
    let err = c.status().await.unwrap_err().to_string();
    assert!(err.contains("nothing listens on it"), "{err}");
    // Started again on the same path (KeepAlive, Restart=on-failure): the
    // same client's next requests are served, without a new connect.
    d.restart();
    let second = c.status().await.expect("served by the new daemon").pid;
    assert_ne!(first, second);
    assert_eq!(answer(&mut c, CAPITAL).await, before, "greedy: the restarted daemon's answer is the killed one's");
}

#[tokio::test]
async fn a_request_right_after_a_kill_is_served_by_the_restarted_daemon() {
    let mut d = TestDaemon::new().start_activated(HeldSocket::new());
    let mut c = d.client().await;
    let first = c.status().await.unwrap().pid;
    let before = answer(&mut c, CAPITAL).await;
    d.signal(libc::SIGKILL);
    d.wait_exit(Duration::from_secs(10)).expect("killed");
    d.restart();
    // The connection the client held died with the daemon, and the client
    // has not noticed (its runtime was blocked in the restart): this Generate
    // goes out on it, fails with a broken pipe, and is sent again on a new
    // connection to the restarted daemon, which answers it whole: greedy,
    // as the killed one did.
    assert_eq!(answer(&mut c, CAPITAL).await, before);
    let second = c.status().await.expect("served by the new daemon");
    assert_ne!(first, second.pid);
    assert_eq!(second.pid, d.pid());
}

/// A revisd started by hand whose socket path a service manager took over
/// since (systemd unlinks and binds again) leaves the new socket alone on exit.
#[test]
fn a_daemon_started_by_hand_leaves_a_socket_taken_over_since() {
    let mut d = TestDaemon::new().start();
    std::fs::remove_file(&d.socket).unwrap();
    let _manager = std::os::unix::net::UnixListener::bind(&d.socket).unwrap();
    d.signal(libc::SIGTERM);
    assert!(d.wait_exit(Duration::from_secs(10)).expect("exited").success());
    assert!(d.socket.exists(), "revisd removed a socket it did not bind");
}

/// A config for revisd started by hand: every tier on SmolLM2.
fn config(dir: &Path) -> PathBuf {
    let model = revis_testkit::smollm2();
    let mut text = String::from("[daemon]\nthreads = 2\n");
    for t in ["tier1", "tier2", "tier3"] {
        text.push_str(&format!("[tiers.{t}]\nmodel = {:?}\n", model.display().to_string()));
    }
    let path = dir.join("revisd.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_tcp_socket_or_one_meant_for_another_process_is_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    // Plain TCP is never served, whoever hands it over.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let out = activated_revisd(tcp.as_fd(), None).arg("--config").arg(&config).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(73), "{err}");
    assert!(err.contains("systemd") && err.contains("not a Unix socket"), "{err}");

    // LISTEN_PID names another process: descriptor 3 is not ours, so revisd
    // binds --socket itself, here the held socket's own path, which is live.
    let held = HeldSocket::new();
    let out = activated_revisd(held.as_fd(), Some(1)).arg("--config").arg(&config).arg("--socket").arg(&held.path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(73), "{err}");
    assert!(err.contains("already listening"), "{err}");
}

/// A home for `revisd service`: its own HOME, config, runtime and data
/// directories, and no session bus, so no real service manager is reached.
struct Home {
    dir: tempfile::TempDir,
    path: Option<String>,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let models = dir.path().join("data/models");
        std::fs::create_dir_all(&models).unwrap();
        let model = revis_testkit::smollm2();
        std::os::unix::fs::symlink(&model, models.join(model.file_name().unwrap())).unwrap();
        std::fs::create_dir(dir.path().join("run")).unwrap();
        Home { dir, path: None }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `revisd service ARGS` with `runtime` as XDG_RUNTIME_DIR.
    fn service_in(&self, runtime: &Path, args: &[&str]) -> Output {
        let mut cmd = Command::new(binary("revisd"));
        cmd.arg("service")
            .args(args)
            .env("HOME", self.p("home"))
            .env("XDG_CONFIG_HOME", self.p("config"))
            .env("XDG_RUNTIME_DIR", runtime)
            .env("REVIS_DATA_DIR", self.p("data"))
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env_remove("REVIS_CONFIG")
            .env_remove("REVIS_SOCKET");
        if let Some(path) = &self.path {
            cmd.env("PATH", path);
        }
        cmd.output().unwrap()
    }

    fn service(&self, args: &[&str]) -> Output {
        self.service_in(&self.p("run"), args)
    }

    fn unit(&self, name: &str) -> PathBuf {
        self.p("config/systemd/user").join(name)
    }
}

fn stdout(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[cfg(target_os = "linux")]
#[test]
fn service_install_is_idempotent_and_uninstall_leaves_the_data() {
    let home = Home::new();
    let out = home.service(&["install"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    // No user manager answers here: the files are written and enabled, and the report says so.
    assert!(text.contains("cannot reach your service manager"), "{text}");
    let service = std::fs::read_to_string(home.unit("revisd.service")).unwrap();
    let socket = std::fs::read_to_string(home.unit("revisd.socket")).unwrap();
    let exec = format!("ExecStart=\"{}\"\n", binary("revisd").canonicalize().unwrap().display());
    assert!(service.contains(&exec), "runs the revisd that installed it:\n{service}");
    assert!(service.contains(&format!("Environment=\"REVIS_DATA_DIR={}\"", home.p("data").display())), "{service}");
    assert!(socket.contains("ListenStream=%t/revis/revisd.sock"), "{socket}");
    for link in ["default.target.wants/revisd.service", "sockets.target.wants/revisd.socket"] {
        assert!(home.p("config/systemd/user").join(link).exists(), "{link} (enabled)");
    }
    // What it wrote, with the real binary in ExecStart, passes systemd's checker.
    let verify = Command::new("systemd-analyze")
        .args(["--user", "verify"])
        .arg(home.unit("revisd.socket"))
        .arg(home.unit("revisd.service"))
        .env("XDG_RUNTIME_DIR", home.p("run"))
        .output()
        .expect("systemd-analyze (Debian: apt-get install systemd)");
    assert!(verify.status.success() && verify.stderr.is_empty(), "{}", stdout(&verify));

    // Again: nothing changes.
    let again = home.service(&["install"]);
    assert!(again.status.success(), "{}", stdout(&again));
    assert!(stdout(&again).contains("revisd.service is up to date"), "{}", stdout(&again));
    assert_eq!(std::fs::read_to_string(home.unit("revisd.service")).unwrap(), service);

    // Installed and enabled, but nothing answers: exit 3.
    let status = home.service(&["status"]);
    let text = stdout(&status);
    assert_eq!(status.status.code(), Some(3), "{text}");
    assert!(text.contains("revisd.service: installed") && text.contains("revisd.service: enabled"), "{text}");
    assert!(text.contains("no revisd answers"), "{text}");
    // Asked with another --config than it was installed with: what the
    // installed unit runs is shown, not only that it differs (a bare
    // `install`, once advised here, drops the --config it was installed with).
    let other = config(home.dir.path());
    let text = stdout(&home.service(&["status", "--config", other.to_str().unwrap()]));
    let unit = home.unit("revisd.service");
    assert!(text.contains(&format!("{}: installed, but not as this command would write it", unit.display())), "{text}");
    assert!(text.contains(&format!("    {exec}")), "the installed ExecStart is shown:\n{text}");
    assert!(text.contains(&format!("{}: installed\n", home.unit("revisd.socket").display())), "{text}");

    // A daemon on the socket the units name (%t/revis/revisd.sock), handed
    // over as systemd would: status sees it answer.
    let held = HeldSocket::new();
    let d = TestDaemon::new().start_activated(held);
    let runtime = d.socket.parent().unwrap().parent().unwrap().to_path_buf();
    let status = home.service_in(&runtime, &["status"]);
    let text = stdout(&status);
    assert!(status.status.success(), "{text}");
    assert!(text.contains(&format!("answers (pid {}", d.pid())), "{text}");
    drop(d);

    // Uninstall removes the units and their links, and nothing else; twice is fine.
    let marker = home.p("data/conversations.db");
    std::fs::write(&marker, b"keep me").unwrap();
    std::fs::create_dir_all(home.p("config/revis")).unwrap();
    std::fs::write(home.p("config/revis/revisd.toml"), b"# mine").unwrap();
    for _ in 0..2 {
        let out = home.service(&["uninstall"]);
        assert!(out.status.success(), "{}", stdout(&out));
    }
    assert!(!home.unit("revisd.service").exists() && !home.unit("revisd.socket").exists());
    assert!(!home.p("config/systemd/user/default.target.wants/revisd.service").exists());
    assert_eq!(std::fs::read(&marker).unwrap(), b"keep me");
    assert_eq!(std::fs::read(home.p("config/revis/revisd.toml")).unwrap(), b"# mine");
    assert!(home.p("data/models").read_dir().unwrap().next().is_some(), "the models are still there");
}

/// With a manager that answers (a stand-in systemctl that records its
/// arguments), install enables and starts the units, restarts only what
/// changed, and uninstall stops and disables them; logs asks the journal.
#[cfg(target_os = "linux")]
/// Puts a `systemctl` and a `journalctl` first on `home`'s PATH that only
/// record how they were called; the closure returned takes the calls
/// recorded since it was last called.
fn fake_service_manager(home: &mut Home) -> impl Fn() -> Vec<String> + use<> {
    use std::os::unix::fs::PermissionsExt;
    let bin = home.p("bin");
    std::fs::create_dir(&bin).unwrap();
    let calls = home.p("calls");
    for tool in ["systemctl", "journalctl"] {
        let script = bin.join(tool);
        std::fs::write(&script, format!("#!/bin/sh\necho \"{tool} $*\" >> '{}'\n", calls.display())).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    home.path = Some(format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default()));
    move || {
        let text = std::fs::read_to_string(&calls).unwrap_or_default();
        let _ = std::fs::remove_file(&calls);
        text.lines().map(str::to_owned).collect::<Vec<_>>()
    }
}

#[test]
fn service_commands_drive_systemctl_and_journalctl() {
    let mut home = Home::new();
    let take_calls = fake_service_manager(&mut home);
    let run = |args: &[&str]| {
        let out = home.service(args);
        assert!(out.status.success(), "{}", stdout(&out));
        stdout(&out)
    };

    let text = run(&["install"]);
    assert!(text.contains("runs as a systemd user service"), "{text}");
    assert_eq!(
        take_calls(),
        [
            "systemctl --user daemon-reload",
            "systemctl --user enable revisd.socket revisd.service",
            "systemctl --user restart revisd.socket",
            "systemctl --user start revisd.service",
        ]
    );
    run(&["install"]);
    assert_eq!(
        take_calls(),
        [
            "systemctl --user daemon-reload",
            "systemctl --user enable revisd.socket revisd.service",
            "systemctl --user start revisd.socket",
            "systemctl --user start revisd.service",
        ],
        "nothing changed: nothing restarted"
    );
    // A new config: the service unit changes, the socket does not.
    let config = config(home.dir.path());
    let out = home.service(&["install", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(std::fs::read_to_string(home.unit("revisd.service")).unwrap().contains("\"--config\""));
    assert_eq!(take_calls()[2..], ["systemctl --user start revisd.socket", "systemctl --user restart revisd.service"]);

    // --no-start and --dry-run call nothing.
    run(&["install", "--no-start"]);
    run(&["install", "--dry-run"]);
    run(&["uninstall", "--dry-run"]);
    assert_eq!(take_calls(), Vec::<String>::new());
    assert!(home.unit("revisd.service").exists(), "a dry run removes nothing");

    run(&["uninstall"]);
    assert_eq!(
        take_calls(),
        ["systemctl --user daemon-reload", "systemctl --user disable --now revisd.service revisd.socket", "systemctl --user daemon-reload",]
    );
    run(&["logs", "-n", "20", "--follow"]);
    assert_eq!(take_calls(), ["journalctl --user -u revisd.service -u revisd.socket --no-pager -n 20 --follow"]);
}

#[cfg(target_os = "linux")]
#[test]
fn service_install_refuses_a_bad_config() {
    let home = Home::new();
    let bad = home.p("bad.toml");
    std::fs::write(&bad, "[daemon]\nqueue_capacity = 0\n").unwrap();
    let out = home.service(&["install", "--config", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64), "{}", stdout(&out));
    assert!(stdout(&out).contains("daemon.queue_capacity"));
    assert!(!home.unit("revisd.service").exists(), "nothing was installed");
}

/// The PID of the revisd answering a Status call on `socket`.
#[cfg(target_os = "linux")]
fn answering_pid(socket: &Path) -> Result<u32, String> {
    /// Long enough for a revisd started by this very connection.
    const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let ask = async { Client::connect(socket).await?.status().await };
        match tokio::time::timeout(ANSWER_TIMEOUT, ask).await {
            Ok(r) => r.map(|s| s.pid).map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {ANSWER_TIMEOUT:?}")),
        }
    })
}

/// Whether a process `pid` exists.
#[cfg(target_os = "linux")]
fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

/// The README's "To have `revisd` there after every login, and back when it
/// crashes", under a real `systemd --user` (the test starts one of its own:
/// containers and CI have none). `revisd service install` starts revisd
/// there; with revisd stopped, the first connection starts it through the
/// socket systemd holds; killed (-9), systemd starts it again by itself and
/// it answers the next call, and a call made while it restarts waits for it;
/// `uninstall` stops it all.
#[cfg(target_os = "linux")]
#[test]
fn under_a_real_systemd_the_socket_starts_revisd_and_it_comes_back_after_a_crash() {
    use std::os::unix::fs::PermissionsExt;
    // The names the README and `revisd service logs` give the units.
    const SERVICE_UNIT: &str = "revisd.service";
    const SOCKET_UNIT: &str = "revisd.socket";
    /// revisd.service restarts it after RestartSec=2; a start takes well under a second.
    const BACK_TIMEOUT: Duration = Duration::from_secs(20);

    let home = Home::new();
    std::fs::set_permissions(home.p("run"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::create_dir(home.p("home")).unwrap();
    let (user_home, config_home, runtime) = (home.p("home"), home.p("config"), home.p("run"));
    let manager = user_manager::UserManager::start(
        &[("HOME", &user_home), ("XDG_CONFIG_HOME", &config_home), ("XDG_RUNTIME_DIR", &runtime)],
        home.p("systemd.log"),
    );
    let context = || {
        let units = manager.systemctl(&["status", "--no-pager", SOCKET_UNIT, SERVICE_UNIT]);
        format!("\n{}\nthe manager's log:\n{}", stdout(&units), manager.log_text())
    };
    let main_pid = || manager.property(SERVICE_UNIT, "MainPID").parse::<u32>().expect("MainPID is a number");
    let socket = runtime.join("revis/revisd.sock");

    // Installed into the running manager: started at once.
    let config = config(home.dir.path());
    let out = home.service(&["install", "--config", config.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(out.status.success() && text.contains("runs as a systemd user service now"), "{text}{}", context());
    let installed = answering_pid(&socket).unwrap_or_else(|e| panic!("revisd answers after install: {e}{}", context()));
    assert_eq!(installed, main_pid(), "the answer comes from the service's revisd");
    assert!(manager.runs(installed), "revisd {installed} runs under the test's systemd");
    let status = home.service(&["status", "--config", config.to_str().unwrap()]);
    let text = stdout(&status);
    assert!(status.status.success(), "{text}");
    for unit in [SOCKET_UNIT, SERVICE_UNIT] {
        assert!(text.contains(&format!("{unit}: installed\n")), "{text}");
        assert!(text.contains(&format!("systemd: {unit}: enabled, active")), "{text}");
    }
    assert!(text.contains(&format!("answers (pid {installed},")), "{text}");

    // Stopped: no revisd, and systemd still holds the socket.
    let out = manager.systemctl(&["stop", SERVICE_UNIT]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert_eq!(manager.property(SERVICE_UNIT, "ActiveState"), "inactive");
    assert_eq!(main_pid(), 0);
    assert!(!alive(installed), "revisd {installed} still runs after stop");
    assert_eq!(manager.property(SOCKET_UNIT, "ActiveState"), "active");
    assert!(socket.exists());
    // The first connection starts it (socket activation).
    let activated = answering_pid(&socket).unwrap_or_else(|e| panic!("a connection starts revisd: {e}{}", context()));
    assert_ne!(activated, installed);
    assert_eq!(activated, main_pid(), "the answer comes from the revisd systemd started");
    assert_eq!(manager.property(SERVICE_UNIT, "NRestarts"), "0");

    // Crashed (kill -9): systemd starts it again by itself, no call needed...
    // SAFETY: a signal to the revisd this test's manager started.
    assert_eq!(unsafe { libc::kill(activated as libc::pid_t, libc::SIGKILL) }, 0);
    let deadline = std::time::Instant::now() + BACK_TIMEOUT;
    let back = loop {
        let pid = main_pid();
        if pid != 0 && pid != activated && manager.property(SERVICE_UNIT, "ActiveState") == "active" {
            break pid;
        }
        assert!(std::time::Instant::now() < deadline, "revisd is not back {BACK_TIMEOUT:?} after kill -9 (MainPID {pid}){}", context());
        std::thread::sleep(user_manager::POLL);
    };
    assert_eq!(manager.property(SERVICE_UNIT, "NRestarts"), "1", "restarted by Restart=on-failure");
    // ...and the next call is answered there.
    assert_eq!(answering_pid(&socket).unwrap_or_else(|e| panic!("revisd answers after the crash: {e}{}", context())), back);

    // A call made while it restarts waits for it (systemd holds the socket) instead of failing.
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(back as libc::pid_t, libc::SIGKILL) }, 0);
    let waited = answering_pid(&socket).unwrap_or_else(|e| panic!("a call made during the restart fails: {e}{}", context()));
    assert_ne!(waited, back);
    assert_eq!(waited, main_pid());

    // Uninstall stops the service and the socket.
    let out = home.service(&["uninstall"]);
    let text = stdout(&out);
    assert!(out.status.success() && text.contains("stopped and disabled"), "{text}");
    assert!(!alive(waited), "revisd {waited} still runs after uninstall");
    assert!(!socket.exists(), "the socket is gone with its unit");
    assert_eq!(manager.property(SOCKET_UNIT, "ActiveState"), "inactive");
}
