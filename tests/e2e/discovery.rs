//! mDNS discovery between two network namespaces joined by a veth: a real advertiser in one, a real browser in the other (`mdns-probe`), never on this machine's own interfaces.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use revis_testkit::netns::{Netns, NetnsPair};
use revis_trust::{DeviceId, Identity};
use serde_json::{Value, json};

/// The advertised port (nothing listens: discovery does not connect).
const PORT: &str = "7443";
/// Longest a probe may take to start, or to finish after it should have.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn a_device_advertised_in_one_namespace_is_found_from_the_other_and_its_withdrawal_seen() {
    let pair = NetnsPair::new();
    let id = Identity::generate().unwrap().device_id();
    let mut advertiser = advertise(&pair.a, &id);

    // Found within 3 s by a browser started just after the advertiser (which
    // probes its names for about a second first), with everything it
    // advertised: the browser itself gives up after 3 s and then reports
    // nothing. (Timed inside the browser: starting and reaping processes
    // through `ip netns exec` on a busy machine is not discovery.)
    let started = Instant::now();
    let browser = browse(&pair.b, &["--wait-ms", "3000", "--id", &id.to_string()]);
    let (status, lines, stderr) = browser.finish();
    let elapsed = started.elapsed();
    assert!(status.success(), "{status}: {stderr}");
    assert_eq!(entries(&lines), [expected(&pair, &id)], "after {elapsed:?}");
    eprintln!("found, browser started and reaped, after {elapsed:?}");

    // A browser that already sees it sees it go when the advertiser stops
    // (stdin closed): goodbye packets, not the two-minute record lifetime.
    let watcher = browse(&pair.b, &["--wait-ms", "5000", "--until-gone", &id.to_string()]);
    let seen: Value = serde_json::from_str(&watcher.line()).unwrap();
    assert_eq!(seen["seen"], expected(&pair, &id), "{seen}");
    eprintln!("a running advertiser was resolved in {} ms", seen["ms"]);
    let withdrawn = Instant::now();
    advertiser.stdin.take();
    assert_eq!(advertiser.line(), "withdrawn");
    let (status, _, stderr) = advertiser.finish();
    assert!(status.success(), "advertiser {status}: {stderr}");
    let (status, lines, stderr) = watcher.finish();
    assert!(status.success(), "{status}: {stderr}");
    assert_eq!(entries(&lines), [] as [Value; 0]);
    eprintln!("withdrawal seen after {:?}", withdrawn.elapsed());
}

#[test]
fn sigterm_withdraws_the_advertisement() {
    let pair = NetnsPair::new();
    let id = Identity::generate().unwrap().device_id();
    let advertiser = advertise(&pair.a, &id);
    let watcher = browse(&pair.b, &["--wait-ms", "5000", "--until-gone", &id.to_string()]);
    watcher.line();
    let withdrawn = Instant::now();
    // SAFETY: kill(2) on the PID of a child this test started and has not
    // reaped (`finish` below does).
    assert_eq!(unsafe { libc::kill(advertiser.child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(advertiser.line(), "withdrawn");
    let (status, _, stderr) = advertiser.finish();
    assert!(status.success(), "advertiser {status}: {stderr}");
    let (status, _, stderr) = watcher.finish();
    assert!(status.success(), "{status}: {stderr}");
    eprintln!("withdrawal seen after {:?}", withdrawn.elapsed());
}

#[test]
fn a_missing_interface_is_an_error_that_names_it() {
    // In a namespace all the same: were the check missing, mDNS would start.
    let pair = NetnsPair::new();
    let id = Identity::generate().unwrap().device_id().to_string();
    for args in [
        &["advertise", "--name", "x", "--id", &id, "--port", PORT, "--interface", "veth9"][..],
        &["browse", "--wait-ms", "3000", "--interface", "veth9"],
    ] {
        let (status, lines, stderr) = Probe::start(&pair.a, args).finish();
        assert_eq!(status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(lines, [] as [String; 0], "{args:?}");
        assert_eq!(stderr.trim(), r#"error: mDNS discovery: no network interface named "veth9""#, "{args:?}");
    }
}

/// An advertiser for `id` in `ns`, started (it said so).
fn advertise(ns: &Netns, id: &DeviceId) -> Probe {
    let id = id.to_string();
    let args = ["advertise", "--name", "Kitchen Mac", "--id", &id, "--port", PORT, "--interface", &ns.interface];
    let probe = Probe::start(ns, &args);
    assert_eq!(probe.line(), "advertising");
    probe
}

/// A browser on `ns`'s veth.
fn browse(ns: &Netns, args: &[&str]) -> Probe {
    let mut all = vec!["browse", "--interface", &ns.interface];
    all.extend_from_slice(args);
    Probe::start(ns, &all)
}

/// What a browser in `b` must report for the advertiser in `a`.
fn expected(pair: &NetnsPair, id: &DeviceId) -> Value {
    json!({
        "name": "Kitchen Mac",
        "id": id.to_string(),
        "addresses": [format!("{}:{PORT}", pair.a.addr)],
        "version": env!("CARGO_PKG_VERSION"),
        "tiers": ["fast", "smart"],
    })
}

fn entries(lines: &[String]) -> Vec<Value> {
    lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `mdns-probe` running in a namespace, its stdout read line by line;
/// killed (by its PID) if the test ends before it does.
struct Probe {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Probe {
    fn start(ns: &Netns, args: &[&str]) -> Probe {
        let mut child = ns
            .command(revis_testkit::binary("mdns-probe"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let stdin = child.stdin.take();
        Probe { child, stdin, lines, stderr: Some(stderr) }
    }

    /// The next line on stdout; panics if none comes in time.
    fn line(&self) -> String {
        self.lines.recv_timeout(PROBE_TIMEOUT).unwrap_or_else(|e| panic!("no line from mdns-probe within {PROBE_TIMEOUT:?}: {e}"))
    }

    /// Waits (bounded) until it exits: its status, the rest of its
    /// stdout, its stderr.
    fn finish(mut self) -> (ExitStatus, Vec<String>, String) {
        let deadline = Instant::now() + PROBE_TIMEOUT;
        let mut rest = Vec::new();
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => rest.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("mdns-probe still running after {PROBE_TIMEOUT:?}; said {rest:?}")
                }
            }
        }
        // Its stdout is closed: it has exited (or is exiting).
        let status = self.child.wait().unwrap();
        let stderr = self.stderr.take().unwrap().join().unwrap();
        (status, rest, stderr)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
