//! `revisd pair | server on|off|status | lend on|off|status | devices | revoke` (the README's
//! server-mode quick start) run as the commands a person types, against a
//! running daemon's socket, with a real client pairing through `revis pair`.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use revis_client::Keyring;
use revis_testkit::{Running, TestDaemon, binary};

use crate::server_mode::revis;

/// How long one of these commands may take to say what it has to say.
const ANSWER: Duration = Duration::from_secs(30);

/// A daemon with server mode configured but not switched on (the switch
/// decides), on a free loopback port, not advertised.
fn daemon() -> Running {
    TestDaemon::new().server("listen = \"127.0.0.1:0\"\nadvertise = false\nname = \"desk\"").start()
}

fn revisd_command(socket: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(binary("revisd"));
    c.arg("--socket").arg(socket).args(args).env("REVIS_MDNS_INTERFACES", "none").env_remove("REVIS_CONFIG").env_remove("REVIS_SOCKET");
    c
}

/// Runs `revisd --socket SOCKET ARGS...` to its end.
fn revisd(socket: &Path, args: &[&str]) -> Output {
    revisd_command(socket, args).stdin(Stdio::null()).output().expect("run revisd")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a command that must succeed; returns what it printed.
fn ok(socket: &Path, args: &[&str]) -> String {
    let o = revisd(socket, args);
    assert!(o.status.success(), "revisd {args:?}: {:?}\n{}{}", o.status, stdout(&o), stderr(&o));
    stdout(&o)
}

/// `revisd pair` running: its output line by line as it comes. Killed (by
/// its PID) if the test ends before it does.
struct Pairing {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Pairing {
    fn start(socket: &Path) -> Pairing {
        let mut child = revisd_command(socket, &["pair"]).stdin(Stdio::null()).stdout(Stdio::piped()).spawn().expect("start revisd pair");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Pairing { child, lines }
    }

    /// The value of the line `  {label}:  value`, reading up to it.
    fn field(&self, label: &str) -> String {
        let prefix = format!("  {label}:");
        let deadline = Instant::now() + ANSWER;
        loop {
            let line = self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("revisd pair printed the field");
            if let Some(v) = line.strip_prefix(&prefix) {
                return v.trim().to_owned();
            }
        }
    }

    /// Reads every remaining line, then the exit status.
    fn finish(mut self) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + ANSWER;
        let mut rest = String::new();
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    rest.push_str(&line);
                    rest.push('\n');
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("revisd pair did not end within {ANSWER:?}: {rest}"),
            }
        }
        // Its output is closed: the process is ending.
        let status = self.child.wait().expect("wait for revisd pair");
        (status, rest)
    }
}

impl Drop for Pairing {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The quick start, command by command: server mode on, a code shown, a
/// real client paired with it, listed, seen, revoked, refused after, and
/// server mode off again.
#[test]
fn revisd_pair_server_devices_revoke_as_commands() {
    let d = daemon();
    let s = &d.socket;

    assert_eq!(ok(s, &["server", "status"]), "Server mode is off: no TCP port is open; 0 paired device(s).\n");
    let o = revisd(s, &["pair"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(stderr(&o).contains("server mode is off; turn it on first (`revisd server on`)"), "{}", stderr(&o));

    let on = ok(s, &["server", "on"]);
    let addr: SocketAddr = on
        .strip_prefix("Server mode is on: listening on ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("{on}"))
        .parse()
        .unwrap();
    assert_eq!(
        on,
        format!(
            "Server mode is on: listening on {addr} (mutual TLS), not advertised (server.advertise = false); 0 paired device(s), 0 connected.\n"
        )
    );
    assert_eq!(ok(s, &["server", "status"]), on);
    assert_eq!(ok(s, &["devices"]), "No paired devices. Pair one with `revisd pair` here and `revis pair` there.\n");

    // `revisd pair` shows the code; `revis pair` on "the other machine" types it.
    let pairing = Pairing::start(s);
    let code = pairing.field("Code");
    let desk_id = pairing.field("Device ID");
    assert_eq!(pairing.field("Listening"), addr.to_string());
    let laptop = tempfile::tempdir().unwrap();
    let o = revis(laptop.path(), &["pair", &addr.to_string(), "--code", &code, "--as", "desk", "--name", "laptop"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains(&desk_id), "the client pinned the daemon's device ID: {}", stdout(&o));
    let laptop_id = Keyring::open(&laptop.path().join("client")).unwrap().identity.device_id().to_string();
    let (status, rest) = pairing.finish();
    assert!(status.success(), "{status:?}: {rest}");
    assert!(rest.contains(&format!("Paired with laptop ({laptop_id}).")), "{rest}");

    let listed = ok(s, &["devices"]);
    assert!(listed.starts_with(&format!("laptop  {laptop_id}\n")), "{listed}");
    assert!(listed.contains("never connected, 0 open connection(s)"), "{listed}");
    // The client uses the node: the daemon sees it.
    let o = revis(laptop.path(), &["--node", "desk", "status"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let listed = ok(s, &["devices"]);
    assert!(listed.contains(", last seen ") && !listed.contains("never connected"), "{listed}");
    assert!(ok(s, &["server", "status"]).contains("; 1 paired device(s), "));

    // Revoked: gone from the list, and the client is refused.
    assert_eq!(ok(s, &["revoke", "laptop"]), format!("Unpaired laptop ({laptop_id}); cut 0 open connection(s).\n"));
    assert_eq!(ok(s, &["devices"]), "No paired devices. Pair one with `revisd pair` here and `revis pair` there.\n");
    let o = revis(laptop.path(), &["--node", "desk", "status"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("refused this machine: it is not paired there"), "{}", stderr(&o));
    let o = revisd(s, &["revoke", "laptop"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(stderr(&o).contains("no paired device is called or has the ID \"laptop\"; `revisd devices` lists them"), "{}", stderr(&o));

    assert_eq!(ok(s, &["server", "off"]), "Server mode is off: no TCP port is open; 0 paired device(s).\n");
    let refused = std::net::TcpStream::connect(addr).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    assert_eq!(ok(s, &["server", "status"]), "Server mode is off: no TCP port is open; 0 paired device(s).\n");
}

/// README: "closing `revisd pair` revokes its code at once".
#[test]
fn closing_revisd_pair_revokes_its_code() {
    let d = daemon();
    let on = ok(&d.socket, &["server", "on"]);
    let addr = on.strip_prefix("Server mode is on: listening on ").and_then(|r| r.split_whitespace().next()).unwrap().to_owned();
    let pairing = Pairing::start(&d.socket);
    let code = pairing.field("Code");
    // Ctrl-C.
    // SAFETY: kill with the PID of a child we started and have not reaped.
    unsafe { libc::kill(pairing.child.id() as i32, libc::SIGINT) };
    let (status, _) = pairing.finish();
    assert!(!status.success());
    d.wait_for_log("pairing window closed", 1, Duration::from_secs(10));
    let laptop = tempfile::tempdir().unwrap();
    let o = revis(laptop.path(), &["pair", &addr, "--code", &code, "--as", "desk"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("the pairing window is closed"), "{}", stderr(&o));
    assert_eq!(ok(&d.socket, &["devices"]), "No paired devices. Pair one with `revisd pair` here and `revis pair` there.\n");
}

/// No daemon on the socket: the commands say how to start one and exit 69
/// (EX_UNAVAILABLE).
#[test]
fn revisd_commands_without_a_daemon_exit_69() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("revisd.sock");
    for args in [&["devices"][..], &["server", "status"], &["pair"], &["revoke", "laptop"]] {
        let o = revisd(&socket, args);
        assert_eq!(o.status.code(), Some(69), "revisd {args:?}: {o:?}");
        assert!(stderr(&o).contains("start it first (`revisd`, or `revisd service install`)"), "{}", stderr(&o));
    }
}

/// `revisd lend on|off|status`: off by default, says when server mode must
/// be on too, and is remembered across a restart.
#[test]
fn revisd_lend_switches_and_is_remembered() {
    let mut d = daemon();
    let s = d.socket.clone();
    assert!(ok(&s, &["lend", "status"]).contains("Lending is off"), "off by default");
    let on = ok(&s, &["lend", "on"]);
    assert!(on.contains("server mode is off") && on.contains("revisd server on"), "{on}");
    let both = ok(&s, &["server", "on"]);
    assert!(both.contains("Server mode is on"), "{both}");
    let lending = ok(&s, &["lend", "status"]);
    assert!(lending.contains("Lending is on") && lending.contains("0 session(s)"), "{lending}");
    d.signal(libc::SIGTERM);
    assert!(d.wait_exit(Duration::from_secs(10)).is_some(), "revisd stops on SIGTERM");
    d.restart();
    assert!(ok(&s, &["lend", "status"]).contains("Lending is on"), "remembered");
    assert!(ok(&s, &["lend", "off"]).contains("Lending is off"));
}
