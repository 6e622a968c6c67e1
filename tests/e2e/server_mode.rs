//! Server mode on loopback: pairing, mutual TLS, strangers, revocation, the
//! switch. mDNS stays off here (these run in the machine's own network
//! namespace); discovery is tested in namespaces of its own (lan.rs).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use revis_client::wire::v1 as pb;
use revis_client::{Client, ClientError, Keyring, Node, NodeError};
use revis_daemon::remote::HANDSHAKE_TIMEOUT;
use revis_testkit::{Running, TestDaemon};
use rustls::pki_types::CertificateDer;
use rustls::sign::{CertifiedKey, SigningKey, SingleCertAndKey};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use crate::{ask, generate};

/// A daemon in server mode on a free loopback port, not advertised.
pub fn server_daemon() -> Running {
    TestDaemon::new().server("enabled = true\nlisten = \"127.0.0.1:0\"\nadvertise = false\nname = \"desk\"").start()
}

/// Where server mode listens, from the local Status.
pub async fn listen_addr(c: &mut Client) -> SocketAddr {
    let s = c.status().await.unwrap().server.expect("the local socket sees server mode");
    assert!(s.enabled, "server mode is on");
    s.listen_address.parse().unwrap()
}

/// Opens a pairing window on the local socket: its code and its events.
pub async fn open_pairing(c: &mut Client) -> (String, tonic::Streaming<pb::PairingEvent>) {
    let mut events = c.wire().admin.open_pairing(pb::OpenPairingRequest { window_s: 0 }).await.unwrap().into_inner();
    match events.message().await.unwrap().and_then(|e| e.event) {
        Some(pb::pairing_event::Event::Opened(o)) => (o.code, events),
        other => panic!("expected Opened first, got {other:?}"),
    }
}

/// The last event of a pairing window.
pub async fn pairing_end(events: &mut tonic::Streaming<pb::PairingEvent>) -> pb::pairing_event::Event {
    let e = tokio::time::timeout(Duration::from_secs(30), events.message()).await.expect("an outcome within 30 s");
    e.unwrap().and_then(|e| e.event).expect("an event")
}

/// Runs the `revis` CLI with its own data directory and no mDNS.
pub fn revis(data: &Path, args: &[&str]) -> Output {
    std::process::Command::new(revis_testkit::binary("revis"))
        .args(args)
        .env("REVIS_DATA_DIR", data)
        .env("REVIS_MDNS_INTERFACES", "none")
        .env_remove("REVIS_SOCKET")
        .env_remove("REVIS_NODE")
        .output()
        .expect("run revis")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Pairs a keyring in `dir` with the daemon through the library.
async fn pair_keyring(c: &mut Client, addr: SocketAddr, dir: &Path) -> (Keyring, Node) {
    let (code, mut events) = open_pairing(c).await;
    let mut keyring = Keyring::open(dir).unwrap();
    let id = revis_client::pair(&mut keyring, addr, "desk", &code.parse().unwrap(), "laptop").await.unwrap();
    assert!(matches!(pairing_end(&mut events).await, pb::pairing_event::Event::Paired(p) if p.name == "laptop"));
    (keyring, Node { name: "desk".into(), device_id: id, addr })
}

#[tokio::test]
async fn plain_tcp_cannot_be_configured() {
    let (status, stderr) = TestDaemon::new().server("enabled = true\ntls = false").start_expecting_failure();
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("`server.tls` is false, but revisd never serves plain TCP"), "{stderr}");
    let (status, stderr) = TestDaemon::new().server("listen = \"http://127.0.0.1:8080\"").start_expecting_failure();
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("without a scheme (it is always mutual TLS)"), "{stderr}");
}

#[tokio::test]
async fn a_paired_client_runs_the_same_generation_over_mutual_tls() {
    let d = server_daemon();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;
    let (code, mut events) = open_pairing(&mut local).await;
    let data = tempfile::tempdir().unwrap();
    let out = revis(data.path(), &["pair", &addr.to_string(), "--code", &code, "--as", "desk", "--name", "laptop"]);
    assert!(out.status.success(), "{}", text(&out));
    let paired = match pairing_end(&mut events).await {
        pb::pairing_event::Event::Paired(p) => p,
        other => panic!("expected Paired, got {other:?}"),
    };
    assert_eq!(paired.name, "laptop");
    let devices = local.wire().admin.list_devices(pb::ListDevicesRequest {}).await.unwrap().into_inner().devices;
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device_id, paired.device_id);

    // Greedy: the node's answer over TLS is the local socket's answer.
    let prompt = "Name three colours.";
    let want = generate(&mut local, pb::GenerateRequest { max_tokens: 24, ..ask(prompt) }).await.unwrap().done.text;
    let out = revis(data.path(), &["--node", "desk", "run", "--temperature", "0", "--max-tokens", "24", prompt]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), want.trim_end());

    // Admin calls other than Status are for the local socket only.
    let out = revis(data.path(), &["--node", "desk", "load", "tier1"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("LoadModel is for the local socket only"), "{}", text(&out));
    let status = revis(data.path(), &["--node", "desk", "status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["name"], "desk");
    assert!(v["server"].is_null(), "a paired device does not see this machine's pairings: {v}");
}

/// A pairing attempt through the library from `from` (an address of `lo`),
/// with an identity and a keyring of its own; `hold` runs once the daemon's
/// attempt has begun (its SPAKE2 message read) and before the client
/// answers it.
async fn pair_from(
    from: std::net::IpAddr,
    addr: SocketAddr,
    code: &str,
    hold: impl std::future::Future<Output = ()>,
) -> Result<revis_trust::DeviceId, revis_trust::TrustError> {
    let dir = tempfile::tempdir().unwrap();
    let identity = revis_trust::Identity::load_or_create(dir.path()).unwrap();
    let mut store = revis_trust::TrustStore::open(dir.path()).unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let tcp = socket.connect(addr).await.unwrap();
    let config = revis_trust::pairing_client_config(&identity).unwrap();
    let tls = tokio_rustls::TlsConnector::from(config).connect(revis_trust::server_name(), tcp).await.unwrap();
    let binding = revis_trust::ChannelBinding::of_connection(tls.get_ref().1, identity.device_id(), false).unwrap();
    let (reached_tx, reached_rx) = tokio::sync::oneshot::channel();
    let (open_tx, open_rx) = tokio::sync::oneshot::channel();
    // Past the server's SPAKE2 frame (4 + 1 + 33 bytes) the client waits.
    let mut io = Hold { io: tls, read: 0, after: 38, reached: Some(reached_tx), gate: Some(open_rx) };
    let code = code.parse().unwrap();
    let holder = async {
        if reached_rx.await.is_ok() {
            hold.await;
        }
        let _ = open_tx.send(());
        std::future::pending::<()>().await
    };
    // Ends with the pairing, whether or not it got as far as the hold.
    let r = tokio::select! {
        r = revis_trust::pair_client_over(&mut io, &binding, &code, "stranger", "desk", &mut store) => r,
        () = holder => unreachable!("the holder never ends"),
    };
    if r.is_err() {
        assert!(store.devices().is_empty(), "a failed pairing pinned nothing");
    }
    r
}

/// A stream that, once `after` bytes were read from it, holds every write
/// until `gate` opens (and says so on `reached`).
struct Hold<T> {
    io: T,
    read: usize,
    after: usize,
    reached: Option<tokio::sync::oneshot::Sender<()>>,
    gate: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Hold<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        self.read += buf.filled().len() - before;
        if self.read >= self.after
            && let Some(tx) = self.reached.take()
        {
            let _ = tx.send(());
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Hold<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        if self.read >= self.after
            && let Some(gate) = self.gate.as_mut()
        {
            if Pin::new(gate).poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.gate = None;
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

const OWNER: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
const STRANGER: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

fn wrong_code(code: &str) -> &'static str {
    if code.starts_with('1') { "2222 2222" } else { "1111 1111" }
}

#[tokio::test]
async fn a_stranger_s_wrong_codes_lock_out_the_stranger_not_the_owner() {
    let d = server_daemon();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;
    let (code, mut events) = open_pairing(&mut local).await;
    for n in 1..=3 {
        let e = pair_from(STRANGER, addr, wrong_code(&code), async {}).await.unwrap_err();
        let want = if n < 3 { "the code does not match" } else { "too many wrong codes" };
        assert!(e.to_string().contains(want), "try {n}: {e}");
    }
    // A fourth try from there is refused, the right code too.
    let e = pair_from(STRANGER, addr, &code, async {}).await.unwrap_err();
    assert!(e.to_string().contains("too many wrong codes"), "{e}");
    // The owner's own attempt still pairs.
    let data = tempfile::tempdir().unwrap();
    let out = revis(data.path(), &["pair", &addr.to_string(), "--code", &code, "--as", "desk", "--name", "laptop"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(matches!(pairing_end(&mut events).await, pb::pairing_event::Event::Paired(p) if p.name == "laptop"));
    let devices = local.wire().admin.list_devices(pb::ListDevicesRequest {}).await.unwrap().into_inner().devices;
    assert_eq!(devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["laptop"]);
}

#[tokio::test]
async fn ten_wrong_codes_in_all_close_the_window_and_pair_nothing() {
    let d = server_daemon();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;
    let (code, mut events) = open_pairing(&mut local).await;
    // revis_trust::MAX_ATTEMPTS (10) in all, MAX_ATTEMPTS_PER_ADDRESS (3) from each address.
    for n in 0..10u8 {
        let from = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2 + n / 3));
        assert!(pair_from(from, addr, wrong_code(&code), async {}).await.is_err());
    }
    match pairing_end(&mut events).await {
        pb::pairing_event::Event::Closed(c) => assert!(c.reason.contains("wrong codes"), "{}", c.reason),
        other => panic!("expected Closed, got {other:?}"),
    }
    // The right code is no use now, from anywhere.
    let data = tempfile::tempdir().unwrap();
    let out = revis(data.path(), &["pair", &addr.to_string(), "--code", &code]);
    assert!(!out.status.success());
    assert!(text(&out).contains("the pairing window is closed"), "{}", text(&out));
    assert!(local.wire().admin.list_devices(pb::ListDevicesRequest {}).await.unwrap().into_inner().devices.is_empty());
    let keyring = Keyring::open(&data.path().join("client")).unwrap();
    assert!(keyring.store.devices().is_empty(), "the client pinned nothing");
}

// Ctrl-C on `revisd pair` ends its OpenPairing stream; opening another
// window replaces the first. Either way the old code no longer pairs, not
// even on a connection that began before.
#[tokio::test]
async fn a_closed_or_replaced_window_s_code_no_longer_pairs_a_connection_already_open() {
    let d = server_daemon();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;

    let (code, events) = open_pairing(&mut local).await;
    let closed = async {
        drop(events);
        // Awaited, not blocked on: the stream's reset goes out from this thread.
        let t0 = Instant::now();
        while !d.log_text().contains("pairing window closed") {
            assert!(t0.elapsed() < Duration::from_secs(10), "{}", d.log_text());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let e = pair_from(OWNER, addr, &code, closed).await.unwrap_err();
    assert!(e.to_string().contains("the pairing window is closed"), "{e}");

    let (first, mut first_events) = open_pairing(&mut local).await;
    let mut other = local.clone();
    let replaced = async move {
        open_pairing(&mut other).await;
    };
    let e = pair_from(OWNER, addr, &first, replaced).await.unwrap_err();
    assert!(e.to_string().contains("the pairing window is closed"), "{e}");
    match pairing_end(&mut first_events).await {
        pb::pairing_event::Event::Closed(c) => assert!(c.reason.contains("replaced"), "{}", c.reason),
        other => panic!("expected Closed, got {other:?}"),
    }
    assert!(local.wire().admin.list_devices(pb::ListDevicesRequest {}).await.unwrap().into_inner().devices.is_empty());
}

/// A client config that trusts any server and presents `cert` signed by
/// `key` (or no certificate at all).
fn raw_client(cert: Option<(CertificateDer<'static>, Arc<dyn SigningKey>)>) -> Arc<rustls::ClientConfig> {
    let provider = revis_trust::provider();
    let verifier = Arc::new(revis_trust::PeerVerifier::new(revis_trust::Pin::Any, provider.signature_verification_algorithms));
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match cert {
        Some((cert, key)) => builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(CertifiedKey::new(vec![cert], key)))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![revis_trust::ALPN_H2.to_vec()];
    Arc::new(config)
}

/// Connects with `config` and reads what the server sends first: an
/// accepted connection gets the server's HTTP/2 SETTINGS; a refused one an
/// error or nothing.
async fn first_bytes(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Result<usize, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config).connect(revis_trust::server_name(), tcp).await.map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf)).await.expect("an answer within 10 s") {
        Ok(0) => Err("closed".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test]
async fn strangers_are_refused_at_the_handshake() {
    let d = server_daemon();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;
    let dir = tempfile::tempdir().unwrap();
    let (keyring, _) = pair_keyring(&mut local, addr, dir.path()).await;
    let paired_cert = keyring.identity.certificate().clone();
    let paired_key = keyring.identity.signing_key().unwrap();
    let stranger = revis_trust::Identity::generate().unwrap();

    // The paired certificate with its key gets the server's first frame...
    assert!(first_bytes(addr, raw_client(Some((paired_cert.clone(), paired_key)))).await.is_ok());
    // ...no certificate, an unknown one, or the paired one replayed without
    // its key get nothing.
    let refused = [
        ("no certificate", raw_client(None)),
        ("an unknown self-signed certificate", raw_client(Some((stranger.certificate().clone(), stranger.signing_key().unwrap())))),
        ("the paired certificate without its key", raw_client(Some((paired_cert, stranger.signing_key().unwrap())))),
    ];
    for (what, config) in refused {
        let r = first_bytes(addr, config).await;
        assert!(r.is_err(), "{what}: the server sent {r:?}");
    }
    // The daemon logs a refusal after its alert went out, so the client can
    // see the refusal first.
    let log = d.wait_for_log("TLS handshake refused", 3, Duration::from_secs(10));
    assert_eq!(log.matches("TLS handshake refused").count(), 3, "{log}");
    let s = local.status().await.unwrap().server.unwrap();
    assert_eq!(s.paired_devices, 1);
}

#[tokio::test]
async fn idle_connections_from_one_address_cannot_take_every_slot() {
    let d = TestDaemon::new().server("enabled = true\nlisten = \"127.0.0.1:0\"\nadvertise = false\nmax_connections = 20").start();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;
    let per_address = 8; // revis_daemon::remote::HANDSHAKES_PER_ADDRESS
    // A stranger opens connections that never start their handshake...
    let mut idle = Vec::new();
    for _ in 0..per_address {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // ...and one more from that address is closed before a byte is read.
    let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 8];
    let read = tokio::time::timeout(Duration::from_secs(5), over.read(&mut buf)).await.expect("closed at once, not held");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    d.wait_for_log("this address has as many handshakes open as it may", 1, Duration::from_secs(10));
    // Another address still gets its handshake (refused here for want of a
    // certificate: it was heard, not turned away).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let tcp = socket.connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(raw_client(None)).connect(revis_trust::server_name(), tcp).await;
    if let Ok(mut tls) = tls {
        let _ = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf)).await;
    }
    d.wait_for_log("peer sent no certificates addr=127.0.0.2", 1, Duration::from_secs(10));
    // One idle connection goes; once the daemon has let go of it, pairing
    // from the first address gets through.
    drop(idle.pop());
    d.wait_for_log("TLS handshake refused", 2, Duration::from_secs(10));
    let dir = tempfile::tempdir().unwrap();
    pair_keyring(&mut local, addr, dir.path()).await;
    assert_eq!(local.status().await.unwrap().server.unwrap().paired_devices, 1);
}

#[tokio::test]
async fn revoking_a_device_cuts_its_open_stream_and_refuses_it_after() {
    let d = server_daemon();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;
    let dir = tempfile::tempdir().unwrap();
    let (keyring, node) = pair_keyring(&mut local, addr, dir.path()).await;
    let remote = Client::connect_node(&keyring, &node).await.unwrap();
    let req = pb::GenerateRequest { max_tokens: 1000, ..ask("Count from 1 to 400, separated by commas.") };
    let mut stream = remote.wire().inference.generate(req).await.unwrap().into_inner();
    // Wait for the first text, then revoke while the answer streams.
    loop {
        match stream.message().await.unwrap().and_then(|e| e.event) {
            Some(pb::generate_event::Event::Delta(_)) => break,
            Some(pb::generate_event::Event::Started(_)) => {}
            other => panic!("expected text, got {other:?}"),
        }
    }
    let r = local.wire().admin.revoke_device(pb::RevokeDeviceRequest { device: "laptop".into() }).await.unwrap().into_inner();
    assert_eq!(r.cut_connections, 1);
    let t0 = Instant::now();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("the stream ends") {
            Ok(Some(pb::GenerateEvent { event: Some(pb::generate_event::Event::Done(_)) })) => {
                panic!("the answer finished although its device was revoked")
            }
            Ok(Some(_)) => {}
            Ok(None) => break "ended without Done".to_owned(),
            Err(s) => break format!("{s}"),
        }
    };
    assert!(t0.elapsed() < Duration::from_secs(2), "cut after {:?} ({end})", t0.elapsed());
    match Client::connect_node(&keyring, &node).await {
        Err(ClientError::Node(NodeError::Refused { .. })) => {}
        Err(e) => panic!("expected a refusal, got: {e}"),
        Ok(_) => panic!("a revoked device connected again"),
    }
    assert!(local.wire().admin.list_devices(pb::ListDevicesRequest {}).await.unwrap().into_inner().devices.is_empty());
}

// Multi-threaded: the daemon's goodbye to our connections is answered
// while this thread blocks waiting for it to exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_mode_off_closes_the_port_and_the_switch_is_remembered() {
    // No `enabled` in the config: the switch decides, and is remembered.
    let mut d = TestDaemon::new().server("listen = \"127.0.0.1:0\"\nadvertise = false\nname = \"desk\"").start();
    let mut local = d.client().await;
    assert!(!local.status().await.unwrap().server.unwrap().enabled, "off by default");
    let on = local.wire().admin.set_server_mode(pb::SetServerModeRequest { enabled: true }).await.unwrap().into_inner();
    assert!(on.enabled);
    let addr: SocketAddr = on.listen_address.parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (keyring, node) = pair_keyring(&mut local, addr, dir.path()).await;
    let remote = Client::connect_node(&keyring, &node).await.unwrap();
    let denied = remote.wire().admin.set_server_mode(pb::SetServerModeRequest { enabled: false }).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);

    let off = local.wire().admin.set_server_mode(pb::SetServerModeRequest { enabled: false }).await.unwrap().into_inner();
    assert!(!off.enabled && off.listen_address.is_empty());
    let refused = tokio::net::TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(remote.wire().admin.status(pb::StatusRequest {}).await.is_err(), "the open connection was closed");

    // On again, then a restart: still on, the pairing still holds.
    local.wire().admin.set_server_mode(pb::SetServerModeRequest { enabled: true }).await.unwrap();
    // Our connections close first, so the drain has nothing to wait for.
    drop((local, remote));
    d.signal(libc::SIGTERM);
    assert!(d.wait_exit(Duration::from_secs(10)).is_some_and(|s| s.success()));
    d.restart();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;
    let node = Node { addr, ..node };
    let mut remote = Client::connect_node(&keyring, &node).await.unwrap();
    let answer = crate::generate(&mut remote, ask("Hi")).await.unwrap();
    assert!(!answer.done.text.is_empty());
}

/// One paired device cannot take every place in the queue, however many
/// connections it opens: its calls beyond `transport::peer::CALLS_PER_DEVICE`
/// (4, across all its connections) wait unread, paired devices together
/// hold at most half the places, and so none of the device's calls is
/// refused and this machine's own user still gets a place. Before the
/// limits, 12 calls on one connection took all 5 places (queue 4 + the
/// running one) and the other 7 were refused; later, with 4 calls per
/// connection, 5 connections took all 5 places and the owner was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_paired_device_cannot_take_every_place_in_the_queue() {
    let d = TestDaemon::new()
        .daemon("queue_capacity = 4\nstreams = 1")
        .server("enabled = true\nlisten = \"127.0.0.1:0\"\nadvertise = false\nname = \"desk\"")
        .start();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;
    let dir = tempfile::tempdir().unwrap();
    let (keyring, node) = pair_keyring(&mut local, addr, dir.path()).await;
    let mut calls = Vec::new();
    for c in 0..5 {
        let remote = Client::connect_node(&keyring, &node).await.unwrap();
        for i in 0..4 {
            let mut r = remote.clone();
            let req = pb::GenerateRequest { max_tokens: 32, ..ask(&format!("Write a sentence about the number {}.", c * 4 + i)) };
            calls.push(tokio::spawn(async move { generate(&mut r, req).await }));
        }
    }
    // The device's calls hold what paired devices may: half the 5 places,
    // one running and one waiting.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = local.status().await.unwrap();
        assert!(s.queue_depth <= 1, "paired devices hold more than their share: {s:?}");
        if s.busy && s.queue_depth == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the device's calls never took their share: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await; // a polling interval, not a wait for an event
    }
    let mine = generate(&mut local, ask("Name a colour.")).await;
    assert!(mine.is_ok(), "this machine's user was refused while a device held the queue: {:?}", mine.err());
    for (i, call) in calls.into_iter().enumerate() {
        let r = call.await.unwrap();
        assert!(r.is_ok(), "the device's call {i} was refused instead of waiting: {:?}", r.err());
    }
}

/// A paired device's TLS connection (raw, no HTTP/2 from our side) that got
/// the server's first frame: accepted and counted under
/// `server.max_connections`. The error says how it was refused.
async fn open_paired(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config).connect(revis_trust::server_name(), tcp).await.map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf)).await.expect("an answer within 10 s") {
        Ok(0) => Err("closed".into()),
        Ok(_) => Ok(tls),
        Err(e) => Err(e.to_string()),
    }
}

/// A TCP connection from `from` that sends nothing: a handshake that never
/// finishes (it holds one of the daemon's handshake slots).
async fn idle_from(from: std::net::IpAddr, addr: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Whether the daemon closed `tcp` (EOF or reset) within `limit`; false if
/// it still holds it open.
async fn closed_within(tcp: &mut tokio::net::TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(limit, tcp.read(&mut buf)).await {
        Ok(Ok(0) | Err(_)) => true,
        Ok(Ok(n)) => panic!("the daemon sent {n} bytes to a connection that sent nothing"),
        Err(_) => false,
    }
}

/// Waits until the local Status shows `n` paired connections open.
async fn wait_connections(local: &mut Client, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = local.status().await.unwrap().server.unwrap();
        if s.remote_connections == n {
            return;
        }
        assert!(Instant::now() < deadline, "{} paired connections open, waiting for {n}", s.remote_connections);
        tokio::time::sleep(Duration::from_millis(20)).await; // a polling interval, not a wait for an event
    }
}

/// `server.max_connections` bounds the paired connections open at once, and
/// as many again in their handshake (from any addresses together); a slot
/// given back is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_max_connections_bounds_paired_connections_and_handshakes() {
    let max = 2;
    let d = TestDaemon::new()
        .server(&format!("enabled = true\nlisten = \"127.0.0.1:0\"\nadvertise = false\nname = \"desk\"\nmax_connections = {max}"))
        .start();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;
    let dir = tempfile::tempdir().unwrap();
    let (keyring, _) = pair_keyring(&mut local, addr, dir.path()).await;
    let paired = || raw_client(Some((keyring.identity.certificate().clone(), keyring.identity.signing_key().unwrap())));

    // Paired connections: `max` are served, the next is closed before its handshake.
    let mut open = Vec::new();
    for _ in 0..max {
        open.push(open_paired(addr, paired()).await.expect("a paired connection within the limit"));
    }
    wait_connections(&mut local, max).await;
    let over = open_paired(addr, paired()).await;
    assert!(over.is_err(), "a paired connection over server.max_connections = {max} was served");
    d.wait_for_log("refusing a connection: server.max_connections paired connections are open", 1, Duration::from_secs(10));
    // One closes: its slot is taken again.
    drop(open.pop());
    wait_connections(&mut local, max - 1).await;
    open.push(open_paired(addr, paired()).await.expect("the freed slot is served"));
    drop(open);
    wait_connections(&mut local, 0).await;

    // Handshakes: `max` under way from different addresses (each within its
    // own per-address limit), the next, from yet another address, is closed at once.
    let mut idle = Vec::new();
    for n in 0..max {
        idle.push(idle_from(std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2 + n as u8)), addr).await);
    }
    let fresh = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 9));
    let mut over = idle_from(fresh, addr).await;
    // Well within revis_daemon::remote::HANDSHAKE_TIMEOUT: refused, not timed out.
    assert!(closed_within(&mut over, HANDSHAKE_TIMEOUT / 2).await, "a handshake over server.max_connections = {max} was taken");
    d.wait_for_log("refusing a connection: server.max_connections connections are in their handshake", 1, Duration::from_secs(10));
    // One handshake ends (its peer went away): its slot is free again, for any address.
    let ended = d.log_text().matches("TLS handshake refused").count() + 1;
    drop(idle.pop());
    d.wait_for_log("TLS handshake refused", ended, Duration::from_secs(10));
    assert!(open_paired(addr, paired()).await.is_ok(), "a handshake after one ended was refused");
}

/// A handshake that does not finish (here: a ClientHello's record header,
/// then nothing) is closed after `HANDSHAKE_TIMEOUT`, not held for ever.
#[tokio::test]
async fn a_handshake_that_stalls_is_closed_after_the_handshake_timeout() {
    let d = server_daemon();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let t0 = Instant::now();
    // A TLS handshake record of 512 bytes begins; none of them follows.
    tokio::io::AsyncWriteExt::write_all(&mut tcp, &[0x16, 0x03, 0x01, 0x02, 0x00]).await.unwrap();
    assert!(closed_within(&mut tcp, HANDSHAKE_TIMEOUT + Duration::from_secs(3)).await, "the stalled handshake was still open");
    let closed_at = t0.elapsed();
    // The daemon's clock started when it accepted, a moment before t0 at most.
    assert!(closed_at >= HANDSHAKE_TIMEOUT - Duration::from_millis(100), "closed after {closed_at:?}, before the handshake timeout");
    d.wait_for_log("TLS handshake timed out", 1, Duration::from_secs(5));
}

/// Switching server mode off ends what is under way on the port, not only
/// the listener: a handshake that has not finished is closed, and a pairing
/// in the middle of its exchange is cut (the connection closed, not answered
/// "window closed" after the peer's next message), its window reported closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_mode_off_ends_handshakes_and_pairings_under_way() {
    let d = server_daemon();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;
    let (code, mut events) = open_pairing(&mut local).await;
    let mut handshaking = idle_from(STRANGER, addr).await;
    let other = local.clone();
    let off = async move {
        let off = other.wire().admin.set_server_mode(pb::SetServerModeRequest { enabled: false }).await.unwrap().into_inner();
        assert!(!off.enabled);
    };
    let t0 = Instant::now();
    // Cut: the connection closes (a reset, or an end of stream where the
    // daemon's next message was due), rather than the daemon answering the
    // client's message with "the pairing window is closed".
    match pair_from(OWNER, addr, &code, off).await {
        Err(revis_trust::TrustError::Connection(_)) => {}
        Err(revis_trust::TrustError::Protocol(e)) if e.contains("closed the connection") => {}
        other => panic!("expected the pairing's connection to be cut, got {other:?}"),
    }
    match pairing_end(&mut events).await {
        pb::pairing_event::Event::Closed(c) => assert!(c.reason.contains("server mode was turned off"), "{}", c.reason),
        other => panic!("expected Closed, got {other:?}"),
    }
    // Well within HANDSHAKE_TIMEOUT from its start: ended by the switch, not timed out.
    let left = HANDSHAKE_TIMEOUT.saturating_sub(t0.elapsed()) / 2;
    assert!(closed_within(&mut handshaking, left).await, "a handshake under way outlived server mode");
    assert!(local.wire().admin.list_devices(pb::ListDevicesRequest {}).await.unwrap().into_inner().devices.is_empty());
}
