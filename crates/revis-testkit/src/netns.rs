//! [`NetnsPair`]: two network namespaces joined by a veth pair, so a test can use a real network (multicast included) without touching the machine's own.
//! [`Offline`]: one namespace with only loopback, for programs that must
//! reach nothing beyond the test (the agent programs).
//!
//! Needs root and `ip` (iproute2); CI and our sessions run as root. The veth
//! is created inside the namespaces (`ip -n A link add .. peer .. netns B`),
//! so nothing is ever added to, or changed in, the root namespace.

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a new veth may take to come up.
const UP_TIMEOUT: Duration = Duration::from_secs(5);
/// Between two looks at the link state.
const POLL: Duration = Duration::from_millis(10);
/// Namespace names start with this (and the test process's PID), so
/// [`NetnsPair::new`] can tell which ones a dead test process left behind.
const PREFIX: &str = "revis-test-";

/// Pairs made by this process, for unique names.
static PAIRS: AtomicU32 = AtomicU32::new(0);

/// Two network namespaces joined by a veth pair, named after the test
/// process's PID and a counter; both deleted on drop (which removes the
/// veth). Each namespace has `lo` and its veth end up, and an address in a
/// /24 of its own (`10.213.N.1` in `a`, `.2` in `b`).
pub struct NetnsPair {
    pub a: Netns,
    pub b: Netns,
}

/// One namespace of a [`NetnsPair`].
pub struct Netns {
    /// Its name, for `ip netns exec` and `ip -n`.
    pub name: String,
    /// The veth end inside it.
    pub interface: String,
    /// The veth end's address.
    pub addr: Ipv4Addr,
}

impl NetnsPair {
    /// Creates the namespaces and the veth and waits (bounded) until both
    /// ends are up. Panics with the failing `ip` command and its output.
    #[expect(clippy::new_without_default, reason = "creates namespaces: not a default value")]
    pub fn new() -> NetnsPair {
        remove_abandoned();
        let pid = std::process::id();
        let n = PAIRS.fetch_add(1, Ordering::Relaxed);
        let subnet = (n % 256) as u8;
        let end = |side: &str, host: u8| Netns {
            name: format!("{PREFIX}{pid}-{n}{side}"),
            // At most 15 bytes (IFNAMSIZ); they live only in the namespaces.
            interface: format!("rv{n}{side}"),
            addr: Ipv4Addr::new(10, 213, subnet, host),
        };
        // Built before anything is created, so a failure below deletes
        // whatever exists.
        let pair = NetnsPair { a: end("a", 1), b: end("b", 2) };
        ip(&["netns", "add", &pair.a.name]);
        ip(&["netns", "add", &pair.b.name]);
        let (a, b) = (&pair.a, &pair.b);
        let veth = format!("-n {} link add {} type veth peer name {} netns {}", a.name, a.interface, b.interface, b.name);
        ip(&veth.split(' ').collect::<Vec<_>>());
        for ns in [&pair.a, &pair.b] {
            let addr = format!("{}/24", ns.addr);
            ip(&["-n", &ns.name, "addr", "add", &addr, "dev", &ns.interface]);
            ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        }
        pair.set_link(true);
        pair
    }

    /// Sets the veth down or up, both ends; up waits until both are.
    pub fn set_link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        for ns in [&self.a, &self.b] {
            ip(&["-n", &ns.name, "link", "set", &ns.interface, state]);
        }
        if up {
            for ns in [&self.a, &self.b] {
                ns.wait_up();
            }
        }
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            // Deleting a namespace that was never created fails: fine.
            let _ = Command::new("ip").args(["netns", "delete", &ns.name]).output();
        }
    }
}

/// One network namespace with only loopback up: what runs in it reaches
/// nothing but the other processes in it (and Unix sockets on the shared
/// filesystem), as on a machine offline. Deleted on drop.
pub struct Offline(pub Netns);

impl Offline {
    #[expect(clippy::new_without_default, reason = "creates a namespace: not a default value")]
    pub fn new() -> Offline {
        remove_abandoned();
        let n = PAIRS.fetch_add(1, Ordering::Relaxed);
        let ns = Netns { name: format!("{PREFIX}{}-{n}o", std::process::id()), interface: "lo".into(), addr: Ipv4Addr::LOCALHOST };
        let offline = Offline(ns);
        ip(&["netns", "add", &offline.0.name]);
        ip(&["-n", &offline.0.name, "link", "set", "lo", "up"]);
        offline
    }
}

impl Drop for Offline {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "delete", &self.0.name]).output();
    }
}

impl Netns {
    /// `ip netns exec NAME program`: add arguments, then spawn. `ip` execs
    /// the program, so the child's PID is the program's own.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Moves the calling thread into this namespace (`setns`): every socket
    /// it opens and every process it starts from now on lives there, so a
    /// test acts as a machine on the veth. For a test's own thread running a
    /// current-thread runtime only (other threads stay where they were);
    /// the thread never comes back.
    pub fn enter(&self) {
        use std::os::fd::AsRawFd;
        let path = format!("/var/run/netns/{}", self.name);
        let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        // SAFETY: a valid namespace descriptor; setns affects only this thread.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns into {}: {}", self.name, std::io::Error::last_os_error());
    }

    /// Waits until the veth end says it is up (its carrier too).
    fn wait_up(&self) {
        let deadline = Instant::now() + UP_TIMEOUT;
        loop {
            let out = ip(&["-n", &self.name, "link", "show", "dev", &self.interface]);
            if out.contains("state UP") || out.contains("LOWER_UP") {
                return;
            }
            assert!(Instant::now() < deadline, "{} in {} is not up after {UP_TIMEOUT:?}:\n{out}", self.interface, self.name);
            std::thread::sleep(POLL);
        }
    }
}

/// Runs `ip args`; its stdout, or a panic naming the command and its stderr.
fn ip(args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running `ip` (iproute2; needed for network namespace tests): {e}"));
    assert!(
        out.status.success(),
        "`ip {}` failed ({}); network namespace tests need root: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Deletes the namespaces of test processes that died before their
/// [`NetnsPair`] dropped (killed, or a panic that aborted).
fn remove_abandoned() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // `NAME` or `NAME (id: N)`.
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name.strip_prefix(PREFIX).and_then(|rest| rest.split('-').next()) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new("/proc").join(pid).exists() {
            let _ = Command::new("ip").args(["netns", "delete", name]).output();
        }
    }
}
