//! Two machines on a LAN: two network namespaces joined by a veth, a real
//! revisd in each, the `revis` CLI on the second. mDNS runs only on the
//! veth ends, never on this machine's own interfaces.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use revis_client::wire::v1 as pb;
use revis_client::{Client, Keyring, Node};
use revis_testkit::netns::{Netns, NetnsPair};
use revis_testkit::{Running, TestDaemon};
use serde_json::Value;

use crate::server_mode::{listen_addr, open_pairing, pairing_end};
use crate::{ask, generate};

/// `revis` inside `ns`, with its own data directory, mDNS on the veth only,
/// and `socket` as its local daemon.
fn revis_in(ns: &Netns, data: &Path, socket: &Path, args: &[&str]) -> Output {
    ns.command(revis_testkit::binary("revis"))
        .args(args)
        .env("REVIS_DATA_DIR", data)
        .env("REVIS_MDNS_INTERFACES", &ns.interface)
        .env("REVIS_SOCKET", socket)
        .env_remove("REVIS_NODE")
        .output()
        .expect("run revis")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A daemon in `ns` whose server mode (when on) listens on every address
/// of the namespace and advertises on its veth.
fn daemon_in(ns: &Netns, name: &str, extra: &str) -> TestDaemon {
    TestDaemon::new()
        .netns(&ns.name)
        .server(&format!("listen = \"0.0.0.0:0\"\nname = \"{name}\"\ninterfaces = [\"{}\"]\n{extra}", ns.interface))
}

/// The nodes `revis nodes --json` lists from `ns`.
fn nodes(ns: &Netns, data: &Path, socket: &Path, wait_ms: &str) -> Vec<Value> {
    let out = revis_in(ns, data, socket, &["nodes", "--json", "--wait-ms", wait_ms]);
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["browse_error"].is_null(), "{v}");
    v["nodes"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_second_machine_discovers_pairs_and_generates_and_server_mode_off_withdraws() {
    let net = NetnsPair::new();
    let desk = daemon_in(&net.a, "desk", "enabled = true").start();
    let laptop = daemon_in(&net.b, "laptop", "").start();
    let data = tempfile::tempdir().unwrap();
    let mut local = desk.client().await;
    let desk_id = local.status().await.unwrap().device_id;
    let port = listen_addr(&mut local).await.port();

    // The laptop finds the desk by name (the browse gives up after 3 s) and pairs.
    let (code, mut events) = open_pairing(&mut local).await;
    let t0 = Instant::now();
    let out = revis_in(&net.b, data.path(), &laptop.socket, &["pair", "desk", "--code", &code, "--name", "laptop"]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("discovered and paired in {:?}", t0.elapsed());
    assert!(matches!(pairing_end(&mut events).await, pb::pairing_event::Event::Paired(p) if p.name == "laptop"));

    // `revis nodes` lists it: paired, found on the veth, healthy, with its tiers.
    let listed = nodes(&net.b, data.path(), &laptop.socket, "1500");
    let row = listed.iter().find(|n| n["name"] == "desk").unwrap_or_else(|| panic!("desk not listed: {listed:?}"));
    assert_eq!(row["device_id"], desk_id.as_str());
    assert_eq!((row["paired"].as_bool(), row["discovered"].as_bool()), (Some(true), Some(true)), "{row}");
    assert_eq!(row["address"], format!("{}:{port}", net.a.addr).as_str());
    assert_eq!(row["health"], "ok", "{row}");
    assert_eq!(row["tiers"].as_array().map(Vec::len), Some(3), "{row}");

    // A generation on the desk from the laptop is the desk's own answer;
    // without --node the laptop's own daemon answers.
    let prompt = "What is the capital of France?";
    let want = generate(&mut local, pb::GenerateRequest { max_tokens: 24, ..ask(prompt) }).await.unwrap().done.text;
    let args = ["--node", "desk", "run", "--temperature", "0", "--max-tokens", "24", prompt];
    let out = revis_in(&net.b, data.path(), &laptop.socket, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), want.trim_end());
    let out = revis_in(&net.b, data.path(), &laptop.socket, &["status", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(v["name"], "laptop");

    // Server mode off: the port closes and the advertisement goes.
    local.wire().admin.set_server_mode(pb::SetServerModeRequest { enabled: false }).await.unwrap();
    let listed = nodes(&net.b, data.path(), &laptop.socket, "1500");
    let row = listed.iter().find(|n| n["name"] == "desk").expect("still paired");
    assert_eq!(row["discovered"], false, "{row}");
    assert_ne!(row["health"], "ok", "{row}");
    assert!(listed.iter().all(|n| n["paired"] == true), "nothing else advertised: {listed:?}");
}

/// `mdns-probe advertise` in `ns`: an advertisement saying what we like.
struct Forged(Child);

impl Forged {
    fn start(ns: &Netns, name: &str, id: &str, port: u16) -> Forged {
        let mut child = ns
            .command(revis_testkit::binary("mdns-probe"))
            .args(["advertise", "--name", name, "--id", id, "--port", &port.to_string(), "--interface", &ns.interface])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mdns-probe");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "advertising");
        Forged(child)
    }
}

impl Drop for Forged {
    fn drop(&mut self) {
        // Closing stdin withdraws it; then it exits.
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

// Multi-threaded: the daemon's goodbye to our connections is answered
// while this thread blocks waiting for it to exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_advertisement_is_refused_on_the_pin() {
    let net = NetnsPair::new();
    let mut desk = daemon_in(&net.a, "desk", "enabled = true").start();
    let laptop = daemon_in(&net.b, "laptop", "").start();
    let data = tempfile::tempdir().unwrap();
    let mut local = desk.client().await;
    let desk_id = local.status().await.unwrap().device_id;
    let (code, mut events) = open_pairing(&mut local).await;
    let out = revis_in(&net.b, data.path(), &laptop.socket, &["pair", "desk", "--code", &code]);
    assert!(out.status.success(), "{}", text(&out));
    pairing_end(&mut events).await;

    // The desk goes away; an impostor takes its name, advertising itself,
    // and a forged advertisement claims the desk's device ID for its port.
    drop((local, events));
    desk.signal(libc::SIGTERM);
    assert!(desk.wait_exit(Duration::from_secs(10)).is_some());
    let impostor = daemon_in(&net.a, "desk", "enabled = true").start();
    let mut imp = impostor.client().await;
    let imp_id = imp.status().await.unwrap().device_id;
    let imp_port = listen_addr(&mut imp).await.port();
    let _forged = Forged::start(&net.a, "desk", &desk_id, imp_port);

    let args = ["--node", "desk", "run", "--max-tokens", "8", "Hello"];
    let out = revis_in(&net.b, data.path(), &laptop.socket, &args);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("is not desk: its certificate does not match the one paired (device ID {desk_id})")),
        "{}",
        text(&out)
    );
    assert!(!impostor.log_text().contains("paired device connected"), "{}", impostor.log_text());

    // `revis nodes` shows the impostor's own advertisement as a stranger
    // with the desk's name, and the desk as not healthy.
    let listed = nodes(&net.b, data.path(), &laptop.socket, "2000");
    let stranger = listed.iter().find(|n| n["device_id"] == imp_id.as_str()).unwrap_or_else(|| panic!("{listed:?}"));
    assert_eq!(stranger["paired"], false);
    assert!(stranger["warning"].as_str().is_some_and(|w| w.contains("not that node")), "{stranger}");
    let paired = listed.iter().find(|n| n["device_id"] == desk_id.as_str()).unwrap();
    assert!(paired["health"].as_str().is_some_and(|h| h.contains("is not desk")), "{paired}");
}

/// Open connections of paired devices, as the desk's local Status counts them.
async fn remote_connections(local: &mut Client) -> u32 {
    local.status().await.unwrap().server.unwrap().remote_connections
}

/// Waits (at most `limit`) until the desk counts `want` paired connections;
/// how long that took.
async fn wait_connections(local: &mut Client, want: u32, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let now = remote_connections(local).await;
        if now == want {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < limit, "{now} paired connections still open after {limit:?} (want {want})");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Pairs a new keyring in `dir` with the desk (over the veth); the node to connect to.
async fn pair_with(local: &mut Client, net: &NetnsPair, dir: &Path, my_name: &str) -> (Keyring, Node) {
    let port = listen_addr(local).await.port();
    let addr = std::net::SocketAddr::from((net.a.addr, port));
    let (code, mut events) = open_pairing(local).await;
    let mut keyring = Keyring::open(dir).unwrap();
    let id = revis_client::pair(&mut keyring, addr, "desk", &code.parse().unwrap(), my_name).await.unwrap();
    assert!(matches!(pairing_end(&mut events).await, pb::pairing_event::Event::Paired(p) if p.name == my_name));
    (keyring, Node { name: "desk".into(), device_id: id, addr })
}

/// The desk for the keepalive tests: four connection slots, and a peer
/// that answers nothing for 250 ms is dropped (the default is 20 s).
fn keepalive_desk(net: &NetnsPair) -> Running {
    daemon_in(
        &net.a,
        "desk",
        &format!("enabled = true\nadvertise = false\nmax_connections = 4\npeer_timeout_ms = {}", PEER_TIMEOUT.as_millis()),
    )
    .start()
}

/// `server.peer_timeout_ms` in the keepalive tests.
const PEER_TIMEOUT: Duration = Duration::from_millis(250);
/// What a loaded two-core machine may add to it.
const SLACK: Duration = Duration::from_secs(2);

/// Departures in the keepalive test: several times the desk's 4 slots, so
/// a connection that is never given back locks the next one out.
const DEPARTURES: usize = 16;

/// The median of some durations.
fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

// A laptop that sleeps (or leaves the network) with a connection open: the
// veth is cut under it. The desk must drop the connection within
// `server.peer_timeout_ms`, and DEPARTURES of them with 4 slots must never
// lock out a new connection or a new pairing. Each cycle also measures how
// long the desk takes to accept a connection (TCP, TLS, HTTP/2) on this
// machine now: the slack a cut may take on top of the peer timeout. And a
// clean departure (the client closes) must be seen at once, before any
// keepalive could have noticed it.
#[tokio::test]
async fn a_vanished_device_gives_its_connection_back_and_departures_lock_nobody_out() {
    let net = NetnsPair::new();
    net.b.enter();
    let desk = keepalive_desk(&net);
    let mut local = desk.client().await;
    let dir = tempfile::tempdir().unwrap();
    let (keyring, node) = pair_with(&mut local, &net, &dir.path().join("laptop"), "laptop").await;
    // Every departure, however slow the machine, comes well before the
    // default peer timeout would have ended it: the setting is applied.
    let at_most = Duration::from_millis(revis_daemon::config::DEFAULT_PEER_TIMEOUT_MS) / 2;

    let t0 = Instant::now();
    let (mut connect, mut clean, mut cut) = (Vec::new(), Vec::new(), Vec::new());
    for cycle in 0..DEPARTURES {
        let remote = Client::connect_node(&keyring, &node).await.unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        assert_eq!(remote_connections(&mut local).await, 1, "cycle {cycle}");
        drop(remote);
        clean.push(wait_connections(&mut local, 0, at_most).await);
        let t = Instant::now();
        let remote = Client::connect_node(&keyring, &node).await.unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        connect.push(t.elapsed());
        assert_eq!(remote_connections(&mut local).await, 1, "cycle {cycle}");
        net.set_link(false);
        cut.push(wait_connections(&mut local, 0, at_most).await);
        drop(remote);
        net.set_link(true);
    }
    let slowest = *cut.iter().max().unwrap();
    let (connect, clean, cut) = (median(connect), median(clean), median(cut));
    eprintln!(
        "{DEPARTURES} departures in {:?}; a cut connection dropped after {cut:?} (median; slowest {slowest:?}), a closed one after {clean:?}; connecting took {connect:?}",
        t0.elapsed()
    );
    assert!(clean < PEER_TIMEOUT / 2, "closed connections were counted until {clean:?} (median): noticed by the keepalive, not the close");
    // A ping goes out one interval after the last frame and is given up one
    // timeout later (together PEER_TIMEOUT); a timer on a loaded machine may
    // fire up to one more ping interval late, and the desk takes its time.
    let (ping_interval, _) = revis_daemon::remote::http2_keepalive(PEER_TIMEOUT);
    let bound = PEER_TIMEOUT + ping_interval + 4 * connect;
    assert!(cut < bound, "vanished devices were dropped after {cut:?} (median), not within {bound:?}");

    // Nobody is locked out: a new pairing, and connections from both devices.
    let (phone, phone_node) = pair_with(&mut local, &net, &dir.path().join("phone"), "phone").await;
    let a = Client::connect_node(&keyring, &node).await.unwrap();
    let b = Client::connect_node(&phone, &phone_node).await.unwrap();
    // Both are served and counted at once. With a 250 ms peer timeout a
    // loaded machine may let the desk drop one (a late ping answer): each
    // call reconnects it, so this polls until the desk counts both.
    let deadline = Instant::now() + PEER_TIMEOUT + SLACK;
    loop {
        a.status().await.unwrap();
        b.status().await.unwrap();
        let now = remote_connections(&mut local).await;
        if now == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{now} paired connections open, not 2");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// The other side: a node that vanishes under an open connection. A call on
// it fails within the client's keepalive (NODE_PING_INTERVAL +
// NODE_PING_TIMEOUT), it does not hang until TCP gives up (minutes).
#[tokio::test]
async fn a_call_to_a_vanished_node_fails_within_the_keepalive_not_minutes() {
    let net = NetnsPair::new();
    net.b.enter();
    let desk = daemon_in(&net.a, "desk", "enabled = true\nadvertise = false").start();
    let mut local = desk.client().await;
    let dir = tempfile::tempdir().unwrap();
    let (keyring, node) = pair_with(&mut local, &net, dir.path(), "laptop").await;
    let remote = Client::connect_node(&keyring, &node).await.unwrap();
    net.set_link(false);
    let t0 = Instant::now();
    let window = revis_client::NODE_PING_INTERVAL + revis_client::NODE_PING_TIMEOUT;
    let call = tokio::time::timeout(window + SLACK, remote.wire().admin.status(pb::StatusRequest {})).await;
    let took = t0.elapsed();
    let r = call.unwrap_or_else(|_| panic!("the call still hangs {took:?} after the node vanished"));
    let e = r.expect_err("the node is gone");
    eprintln!("the call failed {took:?} after the node vanished: {e:?}");
    // It failed on the HTTP/2 keepalive: a ping went unanswered for NODE_PING_TIMEOUT.
    let mut causes = Vec::new();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        causes.push(c.to_string());
        cause = c.source();
    }
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(causes.iter().any(|c| c.contains("keep-alive timed out")), "{e:?}: {causes:?}");
    assert!(took >= revis_client::NODE_PING_TIMEOUT, "failed after {took:?}, before a ping could time out");
    net.set_link(true);
}

// A paired device that vanishes mid-answer: the desk has answer bytes in
// flight that nobody acknowledges, so neither TCP keepalive nor an HTTP/2
// ping can tell (pings queue behind the data). The desk still drops the
// connection within `server.peer_timeout_ms` + 2 s and cancels the answer
// (its queue goes idle).
#[tokio::test]
async fn a_device_that_vanishes_mid_answer_is_dropped_and_its_answer_cancelled() {
    const PEER: Duration = Duration::from_secs(2);
    let net = NetnsPair::new();
    net.b.enter();
    // A small send buffer on the desk: a few answer bytes in flight fill it,
    // as a slow link's do, so the desk's writes (its goodbye included) block.
    // (/proc/sys directly: a fresh machine may have no sysctl command.)
    let out = net.a.command("sh").args(["-c", "echo '4096 4096 4096' > /proc/sys/net/ipv4/tcp_wmem"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let desk = daemon_in(&net.a, "desk", &format!("enabled = true\nadvertise = false\npeer_timeout_ms = {}", PEER.as_millis())).start();
    let mut local = desk.client().await;
    let dir = tempfile::tempdir().unwrap();
    let (keyring, node) = pair_with(&mut local, &net, dir.path(), "laptop").await;
    let remote = Client::connect_node(&keyring, &node).await.unwrap();
    let mut answer = remote.wire().inference.generate(crate::long_answer(4000)).await.unwrap().into_inner();
    let mut deltas = 0;
    while deltas < 8 {
        if let Some(pb::generate_event::Event::Delta(_)) = answer.message().await.unwrap().expect("the answer runs").event {
            deltas += 1;
        }
    }
    // The laptop's address goes (as when it sleeps or leaves the network):
    // the desk's packets still leave on a link that is up, and vanish.
    let vanish = |verb: &str| {
        let addr = format!("{}/24", net.b.addr);
        let out =
            std::process::Command::new("ip").args(["-n", &net.b.name, "addr", verb, &addr, "dev", &net.b.interface]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
    };
    vanish("del");
    let t0 = Instant::now();
    let limit = PEER + Duration::from_secs(2);
    loop {
        let s = local.status().await.unwrap();
        if s.server.as_ref().unwrap().remote_connections == 0 && !s.busy {
            break;
        }
        assert!(t0.elapsed() < limit, "{:?} after the cut the desk still counts the device ({s:?})", t0.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("dropped, its answer cancelled, {:?} after the cut", t0.elapsed());
    vanish("add");
    drop(answer);
}

// A forged advertisement with the desk's device ID points at an impostor
// (the real desk does not advertise here): the client tries it and the
// address it last reached the desk at, the pin holds only at the desk, and
// the desk answers. The impostor's log shows the laptop's refused
// handshake, so the forged address was tried, not missed by the browse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_advertisement_does_not_hide_the_real_node() {
    let net = NetnsPair::new();
    let desk = daemon_in(&net.a, "desk", "enabled = true\nadvertise = false").start();
    let impostor = daemon_in(&net.a, "desk", "enabled = true\nadvertise = false").start();
    let laptop = daemon_in(&net.b, "laptop", "").start();
    let data = tempfile::tempdir().unwrap();
    let mut local = desk.client().await;
    let desk_id = local.status().await.unwrap().device_id;
    let addr = format!("{}:{}", net.a.addr, listen_addr(&mut local).await.port());
    let (code, mut events) = open_pairing(&mut local).await;
    let out = revis_in(&net.b, data.path(), &laptop.socket, &["pair", &addr, "--code", &code, "--as", "desk"]);
    assert!(out.status.success(), "{}", text(&out));
    pairing_end(&mut events).await;

    let mut imp = impostor.client().await;
    let imp_port = listen_addr(&mut imp).await.port();
    let _forged = Forged::start(&net.a, "desk", &desk_id, imp_port);
    let refused = "TLS handshake refused";
    assert!(!impostor.log_text().contains(refused), "nothing has tried the impostor yet: {}", impostor.log_text());

    let prompt = "What is the capital of France?";
    let want = generate(&mut local, pb::GenerateRequest { max_tokens: 8, ..ask(prompt) }).await.unwrap().done.text;
    let args = ["--node", "desk", "run", "--temperature", "0", "--max-tokens", "8", prompt];
    let out = revis_in(&net.b, data.path(), &laptop.socket, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), want.trim_end());
    // The impostor logs the refusal after the laptop saw it: wait for it.
    let log = impostor.wait_for_log(refused, 1, Duration::from_secs(10));
    let laptop_addr = format!("{}:", net.b.addr);
    assert!(log.lines().any(|l| l.contains(refused) && l.contains(&laptop_addr)), "the laptop tried the forged address: {log}");
}
