//! Pairing over loopback TLS: the right code pairs both ways; wrong codes, spent or expired windows, a relay in the middle and malformed messages pair nothing.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rand::Rng;
use revis_trust::{
    ALPN_PAIRING, ChannelBinding, DEFAULT_WINDOW, DeviceId, Identity, MAX_ATTEMPTS, MAX_ATTEMPTS_PER_ADDRESS, MAX_FRAME, PairingCode,
    PairingWindow, TrustError, TrustStore, client_config, pair_client, pair_client_over, pair_server, pair_server_over,
    pairing_client_config, pairing_server_config, peer_device_id, read_frame, send_frame, server_config, server_name,
};
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// A machine: its identity and its trust store in a temp dir.
struct Node {
    identity: Identity,
    store: TrustStore,
    _dir: tempfile::TempDir,
}

fn node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    Node { identity: Identity::generate().unwrap(), store: TrustStore::open(dir.path()).unwrap(), _dir: dir }
}

impl Node {
    fn id(&self) -> DeviceId {
        self.identity.device_id()
    }
}

type Outcome = (Result<DeviceId, TrustError>, Result<DeviceId, TrustError>);

/// The client's address where the test does not connect for real.
const HERE: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn code(s: &str) -> PairingCode {
    s.parse().unwrap()
}

/// The server side of one pairing connection accepted on `listener`.
async fn serve_one(listener: &TcpListener, server: &mut Node, window: &PairingWindow, now: Instant) -> Result<DeviceId, TrustError> {
    let (tcp, peer) = listener.accept().await.map_err(TrustError::Connection)?;
    let config = pairing_server_config(&server.identity)?;
    let mut tls = TlsAcceptor::from(config).accept(tcp).await.map_err(TrustError::Connection)?;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(ALPN_PAIRING));
    let local = server.id();
    pair_server(&mut tls, local, window, peer.ip(), &mut server.store, now).await
}

/// The client side of one pairing connection to `addr`.
async fn dial_one(from: Ipv4Addr, addr: SocketAddr, client: &mut Node, code: &PairingCode) -> Result<DeviceId, TrustError> {
    let socket = tokio::net::TcpSocket::new_v4().map_err(TrustError::Connection)?;
    socket.bind(SocketAddr::from((from, 0))).map_err(TrustError::Connection)?;
    let tcp = socket.connect(addr).await.map_err(TrustError::Connection)?;
    let config = pairing_client_config(&client.identity)?;
    let mut tls = TlsConnector::from(config).connect(server_name(), tcp).await.map_err(TrustError::Connection)?;
    let local = client.id();
    pair_client(&mut tls, local, code, "laptop", "workstation", &mut client.store).await
}

/// One pairing attempt between `client` and `server` over loopback.
async fn pair(server: &mut Node, client: &mut Node, window: &PairingWindow, code: &PairingCode, now: Instant) -> Outcome {
    pair_from(Ipv4Addr::LOCALHOST, server, client, window, code, now).await
}

/// [`pair`], the client connecting from `from` (an address of `lo`).
async fn pair_from(
    from: Ipv4Addr,
    server: &mut Node,
    client: &mut Node,
    window: &PairingWindow,
    code: &PairingCode,
    now: Instant,
) -> Outcome {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::join!(serve_one(&listener, server, window, now), dial_one(from, addr, client, code))
}

/// A pinned mutual-TLS connection (the one every call after pairing uses):
/// the server's device ID as the client saw it, and the client's as the
/// server saw it.
async fn pinned_connection(server: &Node, client: &Node) -> Result<(DeviceId, DeviceId), String> {
    let server_cfg: Arc<ServerConfig> = server_config(&server.identity, server.store.trust_set()).unwrap();
    let client_cfg: Arc<ClientConfig> = client_config(&client.identity, server.id()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (s, c) = tokio::join!(
        async {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = TlsAcceptor::from(server_cfg).accept(tcp).await.map_err(|e| e.to_string())?;
            let peer = peer_device_id(tls.get_ref().1).unwrap();
            let mut buf = [0u8; 4];
            tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
            tls.write_all(b"pong").await.map_err(|e| e.to_string())?;
            tls.shutdown().await.map_err(|e| e.to_string())?;
            Ok::<_, String>(peer)
        },
        async {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let mut tls = TlsConnector::from(client_cfg).connect(server_name(), tcp).await.map_err(|e| e.to_string())?;
            let peer = peer_device_id(tls.get_ref().1).unwrap();
            tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
            let mut buf = [0u8; 4];
            tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(peer)
        }
    );
    Ok((c?, s?))
}

fn assert_nothing_pinned(nodes: &[&Node]) {
    for n in nodes {
        assert!(n.store.devices().is_empty(), "{:?}", n.store.devices());
    }
}

#[tokio::test]
async fn the_right_code_pairs_both_ways_and_then_pinned_tls_works() {
    let (mut server, mut client) = (node(), node());
    // Before pairing the pinned handshake fails.
    assert!(pinned_connection(&server, &client).await.is_err());

    let now = Instant::now();
    let window = PairingWindow::open(now, DEFAULT_WINDOW);
    let typed = code(&window.code().to_string());
    let (s, c) = pair(&mut server, &mut client, &window, &typed, now).await;
    assert_eq!(s.unwrap(), client.id());
    assert_eq!(c.unwrap(), server.id());

    let on_server = server.store.get(&client.id()).expect("server stores client");
    assert_eq!(on_server.name, "laptop");
    let on_client = client.store.get(&server.id()).expect("client stores server");
    assert_eq!(on_client.name, "workstation");
    assert_eq!(server.store.devices().len(), 1);
    assert_eq!(client.store.devices().len(), 1);
    assert!(!window.is_open(now), "a success closes the window");

    let (seen_server, seen_client) = pinned_connection(&server, &client).await.unwrap();
    assert_eq!(seen_server, server.id());
    assert_eq!(seen_client, client.id());
}

#[tokio::test]
async fn three_wrong_codes_lock_out_their_address_and_the_owner_still_pairs() {
    let (mut server, mut stranger, mut owner) = (node(), node(), node());
    let now = Instant::now();
    let window = PairingWindow::with_code(code("1234 5678"), now, DEFAULT_WINDOW);
    let wrong = code("8765-4321");
    let there = Ipv4Addr::new(127, 0, 0, 2);

    for _ in 0..2 {
        let (s, c) = pair_from(there, &mut server, &mut stranger, &window, &wrong, now).await;
        assert!(matches!(s, Err(TrustError::WrongCode)), "{s:?}");
        assert!(matches!(c, Err(TrustError::WrongCode)), "{c:?}");
    }
    let (s, c) = pair_from(there, &mut server, &mut stranger, &window, &wrong, now).await;
    assert!(matches!(s, Err(TrustError::TooManyAttempts)), "{s:?}");
    assert!(matches!(c, Err(TrustError::TooManyAttempts)), "{c:?}");
    assert_eq!((window.failed_attempts(), window.failed_attempts_from(there.into())), (3, 3));
    // The stranger is locked out, even with the right code...
    let right = window.code().clone();
    let (s, c) = pair_from(there, &mut server, &mut stranger, &window, &right, now).await;
    assert!(matches!(s, Err(TrustError::TooManyAttempts)), "{s:?}");
    let message = c.unwrap_err().to_string();
    assert!(message.contains("too many wrong codes"), "{message}");
    assert_nothing_pinned(&[&stranger]);
    // ...and the window is still open for everyone else: the owner pairs.
    assert!(window.is_open(now));
    let (s, c) = pair(&mut server, &mut owner, &window, &right, now).await;
    assert_eq!(s.unwrap(), owner.id());
    assert_eq!(c.unwrap(), server.id());
    assert!(server.store.get(&stranger.id()).is_none());
}

#[tokio::test]
async fn ten_wrong_codes_in_all_close_the_window_for_good() {
    let (mut server, mut client) = (node(), node());
    let now = Instant::now();
    let window = PairingWindow::with_code(code("1234 5678"), now, DEFAULT_WINDOW);
    let wrong = code("8765-4321");
    // From 127.0.0.1 .. 127.0.0.4: 3 + 3 + 3 + 1 = 10.
    for n in 0..MAX_ATTEMPTS {
        let from = Ipv4Addr::new(127, 0, 0, 1 + (n / MAX_ATTEMPTS_PER_ADDRESS) as u8);
        let (s, _) = pair_from(from, &mut server, &mut client, &window, &wrong, now).await;
        assert!(matches!(s, Err(TrustError::WrongCode | TrustError::TooManyAttempts)), "{s:?}");
    }
    assert_eq!(window.failed_attempts(), 10);
    assert!(!window.is_open(now));
    // Now even the right code from a fresh address is refused.
    let right = window.code().clone();
    let (s, c) = pair_from(Ipv4Addr::new(127, 0, 0, 9), &mut server, &mut client, &window, &right, now).await;
    assert!(matches!(s, Err(TrustError::TooManyAttempts)), "{s:?}");
    assert!(matches!(c, Err(TrustError::TooManyAttempts)), "{c:?}");
    assert_nothing_pinned(&[&server, &client]);
    assert!(pinned_connection(&server, &client).await.is_err());
}

/// One IPv6 host may hold a whole /64: its addresses count as one.
#[tokio::test]
async fn ipv6_addresses_of_one_64_count_as_one_source() {
    let window = PairingWindow::open(Instant::now(), DEFAULT_WINDOW);
    // A hello (version 1, name "x", a SPAKE2 message), then the stream ends:
    // an abandoned attempt, which counts as a wrong code.
    let mut hello = vec![1, 1, 0, 1, b'x'];
    hello.extend_from_slice(&[0; 33]);
    let host = |last: u16| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, last));
    for n in 1..=3 {
        server_fed_from(&framed(&hello), &window, host(n)).await;
    }
    assert_eq!(window.failed_attempts_from(host(99)), 3);
    assert!(matches!(server_fed_from(&framed(&hello), &window, host(99)).await, TrustError::TooManyAttempts));
    let next_64 = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 2, 0, 0, 0, 1));
    assert!(is_protocol(&server_fed_from(&framed(&hello), &window, next_64).await));
    assert_eq!(window.failed_attempts(), 4);
}

/// Every link-local peer shares fe80::/64: a link-local address counts by
/// itself, so a stranger on the link does not lock out the owner.
#[tokio::test]
async fn link_local_ipv6_addresses_count_each_by_itself() {
    let window = PairingWindow::open(Instant::now(), DEFAULT_WINDOW);
    let mut hello = vec![1, 1, 0, 1, b'x'];
    hello.extend_from_slice(&[0; 33]);
    let stranger = IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0x1, 0x2, 0x3, 0x4));
    for _ in 1..=3 {
        server_fed_from(&framed(&hello), &window, stranger).await;
    }
    assert!(matches!(server_fed_from(&framed(&hello), &window, stranger).await, TrustError::TooManyAttempts));
    let owner = IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0xa, 0xb, 0xc, 0xd));
    assert_eq!(window.failed_attempts_from(owner), 0);
    assert!(is_protocol(&server_fed_from(&framed(&hello), &window, owner).await));
}

/// Closing a window (the owner ended `revisd pair`, or opened a new one)
/// refuses an attempt already under way, right code and all.
#[tokio::test]
async fn closing_the_window_refuses_an_attempt_under_way() {
    let (server, client) = (node(), node());
    let dir = tempfile::tempdir().unwrap();
    let mut server_store = TrustStore::open(dir.path()).unwrap();
    let client_dir = tempfile::tempdir().unwrap();
    let mut client_store = TrustStore::open(client_dir.path()).unwrap();
    let now = Instant::now();
    let window = PairingWindow::open(now, DEFAULT_WINDOW);
    let right = window.code().clone();
    let binding = ChannelBinding { exporter: [3; 32], client: client.id(), server: server.id() };
    let (mut a, b) = tokio::io::duplex(4096);
    // The client reads the server's SPAKE2 message (so the server's attempt
    // has begun), then holds its tag until the window is closed.
    let (reached_tx, reached_rx) = tokio::sync::oneshot::channel();
    let (open_tx, open_rx) = tokio::sync::oneshot::channel();
    let mut b = Hold { io: b, read: 0, after: 4 + 1 + 33, reached: Some(reached_tx), gate: Some(open_rx) };
    let (s, c, ()) = tokio::join!(
        pair_server_over(&mut a, &binding, &window, HERE, &mut server_store, now),
        pair_client_over(&mut b, &binding, &right, "laptop", "workstation", &mut client_store),
        async {
            reached_rx.await.unwrap();
            window.close();
            open_tx.send(()).unwrap();
        }
    );
    assert!(matches!(s, Err(TrustError::WindowClosed)), "{s:?}");
    assert!(matches!(c, Err(TrustError::WindowClosed)), "{c:?}");
    assert!(server_store.devices().is_empty() && client_store.devices().is_empty());
}

#[tokio::test]
async fn a_wrong_code_then_the_right_one_pairs() {
    let (mut server, mut client) = (node(), node());
    let now = Instant::now();
    let window = PairingWindow::with_code(code("123456"), now, DEFAULT_WINDOW);
    let (s, c) = pair(&mut server, &mut client, &window, &code("123457"), now).await;
    assert!(matches!(s, Err(TrustError::WrongCode)), "{s:?}");
    assert!(matches!(c, Err(TrustError::WrongCode)), "{c:?}");
    assert_nothing_pinned(&[&server, &client]);
    let (s, c) = pair(&mut server, &mut client, &window, &code("123 456"), now).await;
    assert_eq!(s.unwrap(), client.id());
    assert_eq!(c.unwrap(), server.id());
}

#[tokio::test]
async fn the_code_is_single_use() {
    let (mut server, mut client, mut other) = (node(), node(), node());
    let now = Instant::now();
    let window = PairingWindow::open(now, DEFAULT_WINDOW);
    let right = window.code().clone();
    let (s, c) = pair(&mut server, &mut client, &window, &right, now).await;
    s.unwrap();
    c.unwrap();

    let (s, c) = pair(&mut server, &mut other, &window, &right, now).await;
    assert!(matches!(s, Err(TrustError::WindowClosed)), "{s:?}");
    assert!(matches!(c, Err(TrustError::WindowClosed)), "{c:?}");
    assert!(server.store.get(&other.id()).is_none());
    assert_nothing_pinned(&[&other]);
    assert_eq!(server.store.devices().len(), 1);
}

#[tokio::test]
async fn an_expired_window_refuses() {
    let (mut server, mut client) = (node(), node());
    let opened = Instant::now();
    let window = PairingWindow::open(opened, Duration::from_secs(120));
    let right = window.code().clone();
    assert!(window.is_open(opened + Duration::from_secs(119)));

    let late = opened + Duration::from_secs(120);
    assert!(!window.is_open(late));
    let (s, c) = pair(&mut server, &mut client, &window, &right, late).await;
    assert!(matches!(s, Err(TrustError::WindowClosed)), "{s:?}");
    assert!(matches!(c, Err(TrustError::WindowClosed)), "{c:?}");
    let message = c.unwrap_err().to_string();
    assert!(message.contains("window is closed"), "{message}");
    assert_nothing_pinned(&[&server, &client]);
    // A refusal of a closed window is not a wrong code.
    assert_eq!(window.failed_attempts(), 0);
}

/// A man in the middle: terminates TLS with its own identity towards both
/// the client and the server and forwards every byte of the pairing.
#[tokio::test]
async fn a_relay_in_the_middle_pairs_nothing() {
    let (mut server, mut client) = (node(), node());
    let relay = Identity::generate().unwrap();
    let now = Instant::now();
    let window = PairingWindow::open(now, DEFAULT_WINDOW);
    let right = window.code().clone();

    let server_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server_addr = server_listener.local_addr().unwrap();
    let relay_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = relay_listener.local_addr().unwrap();
    let relay_server_cfg = pairing_server_config(&relay).unwrap();
    let relay_client_cfg = pairing_client_config(&relay).unwrap();

    let relay_task = async {
        let (tcp, _) = relay_listener.accept().await.unwrap();
        let mut from_client = TlsAcceptor::from(relay_server_cfg).accept(tcp).await.unwrap();
        let upstream = TcpStream::connect(server_addr).await.unwrap();
        let mut to_server = TlsConnector::from(relay_client_cfg).connect(server_name(), upstream).await.unwrap();
        // Forward the pairing messages both ways until either side stops.
        let _ = tokio::io::copy_bidirectional(&mut from_client, &mut to_server).await;
    };
    let (s, c, ()) = tokio::join!(
        serve_one(&server_listener, &mut server, &window, now),
        dial_one(Ipv4Addr::LOCALHOST, relay_addr, &mut client, &right),
        relay_task
    );
    assert!(matches!(s, Err(TrustError::WrongCode)), "{s:?}");
    assert!(matches!(c, Err(TrustError::WrongCode)), "{c:?}");
    assert!(c.unwrap_err().to_string().contains("intercepted"), "the message names the possibility of a relay");
    assert_nothing_pinned(&[&server, &client]);
    assert!(server.store.get(&relay.device_id()).is_none());
    assert_eq!(window.failed_attempts(), 1);
}

/// The exporter value alone decides: the same code, the same device IDs, but
/// two different connections (what each side of a relay that somehow held
/// both keys would see) do not pair.
#[tokio::test]
async fn different_channels_with_the_same_code_pair_nothing() {
    let (server, client) = (node(), node());
    let server_store_dir = tempfile::tempdir().unwrap();
    let mut server_store = TrustStore::open(server_store_dir.path()).unwrap();
    let client_store_dir = tempfile::tempdir().unwrap();
    let mut client_store = TrustStore::open(client_store_dir.path()).unwrap();
    let now = Instant::now();
    let window = PairingWindow::open(now, DEFAULT_WINDOW);
    let right = window.code().clone();
    let bind = |exporter: u8| ChannelBinding { exporter: [exporter; 32], client: client.id(), server: server.id() };
    let (mut a, mut b) = tokio::io::duplex(4096);
    let (sb, cb) = (bind(1), bind(2));
    let (s, c) = tokio::join!(
        pair_server_over(&mut a, &sb, &window, HERE, &mut server_store, now),
        pair_client_over(&mut b, &cb, &right, "laptop", "workstation", &mut client_store)
    );
    assert!(matches!(s, Err(TrustError::WrongCode)), "{s:?}");
    assert!(matches!(c, Err(TrustError::WrongCode)), "{c:?}");
    assert!(server_store.devices().is_empty() && client_store.devices().is_empty());

    // The same binding on both sides pairs (the control).
    let window = PairingWindow::open(now, DEFAULT_WINDOW);
    let right = window.code().clone();
    let (mut a, mut b) = tokio::io::duplex(4096);
    let (s, c) = tokio::join!(
        pair_server_over(&mut a, &sb, &window, HERE, &mut server_store, now),
        pair_client_over(&mut b, &sb, &right, "laptop", "workstation", &mut client_store)
    );
    assert_eq!(s.unwrap(), client.id());
    assert_eq!(c.unwrap(), server.id());
}

fn fake_binding() -> ChannelBinding {
    ChannelBinding { exporter: [7; 32], client: DeviceId::from_bytes([1; 32]), server: DeviceId::from_bytes([2; 32]) }
}

/// Feeds `bytes` (then end of stream) to a pairing server; its error.
async fn server_fed(bytes: &[u8], window: &PairingWindow) -> TrustError {
    server_fed_from(bytes, window, HERE).await
}

/// [`server_fed`], the bytes coming from `from`.
async fn server_fed_from(bytes: &[u8], window: &PairingWindow, from: IpAddr) -> TrustError {
    let dir = tempfile::tempdir().unwrap();
    let mut store = TrustStore::open(dir.path()).unwrap();
    let (mut ours, mut theirs) = tokio::io::duplex(64 * 1024);
    ours.write_all(bytes).await.unwrap();
    ours.shutdown().await.unwrap();
    let result = pair_server_over(&mut theirs, &fake_binding(), window, from, &mut store, Instant::now()).await;
    assert!(store.devices().is_empty());
    result.expect_err("garbage must not pair")
}

fn framed(payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

fn is_protocol(e: &TrustError) -> bool {
    matches!(e, TrustError::Protocol(_))
}

#[tokio::test]
async fn malformed_and_oversized_messages_are_errors() {
    let window = PairingWindow::open(Instant::now(), DEFAULT_WINDOW);

    // A length far over the limit: refused before anything is allocated.
    let e = server_fed(&u32::MAX.to_be_bytes(), &window).await;
    assert!(is_protocol(&e) && e.to_string().contains("exceeds"), "{e}");
    let e = server_fed(&((MAX_FRAME + 1) as u32).to_be_bytes(), &window).await;
    assert!(e.to_string().contains("exceeds"), "{e}");
    // Nothing at all, half a length, a frame cut short.
    for bytes in [&[][..], &[0, 0][..], &[0, 0, 0, 9, 1, 1][..]] {
        let e = server_fed(bytes, &window).await;
        assert!(is_protocol(&e), "{bytes:?}: {e}");
    }
    // Well framed but not a hello; a hello cut short; a wrong version; a
    // name longer than the frame; a name that is not UTF-8; a SPAKE2 message
    // of the wrong size.
    let spake = [b'A'; 33];
    let mut bad_utf8 = vec![1, 1, 0, 2, 0xff, 0xfe];
    bad_utf8.extend_from_slice(&spake);
    for payload in [
        vec![],
        vec![9, 9, 9],
        vec![1],
        vec![1, 1, 0],
        vec![1, 2, 0, 0],
        vec![1, 1, 0xff, 0xff, b'x'],
        bad_utf8,
        vec![1, 1, 0, 0, b'A', 1, 2, 3],
    ] {
        let e = server_fed(&framed(&payload), &window).await;
        assert!(is_protocol(&e), "{payload:?}: {e}");
    }
    // None of these reached the code: the window is untouched.
    assert_eq!(window.failed_attempts(), 0);

    // A well-formed hello whose SPAKE2 point is not on the curve: a
    // protocol error that spends an attempt (it reached the code).
    let mut hello = vec![1, 1, 0, 1, b'x', b'A'];
    hello.extend_from_slice(&[0xff; 32]);
    let e = server_fed(&framed(&hello), &window).await;
    assert!(is_protocol(&e), "{e}");
    assert_eq!(window.failed_attempts(), 1);
}

#[tokio::test]
async fn a_client_given_garbage_fails_cleanly() {
    let cases: Vec<Vec<u8>> = vec![
        u32::MAX.to_be_bytes().to_vec(),
        framed(&[]),
        framed(&[2, 1, 2, 3]),
        framed(&[5, 200]),
        framed(&[7; 40]),
        vec![0, 0, 0, 34, 2],
        vec![],
    ];
    for bytes in cases {
        let dir = tempfile::tempdir().unwrap();
        let mut store = TrustStore::open(dir.path()).unwrap();
        let (mut ours, mut theirs) = tokio::io::duplex(64 * 1024);
        ours.write_all(&bytes).await.unwrap();
        ours.shutdown().await.unwrap();
        let result = pair_client_over(&mut theirs, &fake_binding(), &code("12345678"), "laptop", "workstation", &mut store).await;
        let e = result.expect_err("garbage must not pair");
        assert!(is_protocol(&e), "{bytes:?}: {e}");
        assert!(store.devices().is_empty());
    }
}

#[tokio::test]
async fn random_bytes_never_panic_or_pair() {
    let window = PairingWindow::open(Instant::now(), DEFAULT_WINDOW);
    let mut rng = rand::rng();
    for i in 0..300 {
        let len = rng.random_range(0..200);
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        // Half the time a plausible frame around random content.
        if i % 2 == 0 {
            bytes = framed(&bytes);
            if i % 4 == 0 && bytes.len() > 4 {
                bytes[4] = 1; // a hello
            }
        }
        let _ = server_fed(&bytes, &window).await;
    }
}

#[tokio::test]
async fn frames_round_trip_and_are_bounded() {
    let (mut a, mut b) = tokio::io::duplex(8 * 1024);
    send_frame(&mut a, b"hello").await.unwrap();
    assert_eq!(read_frame(&mut b).await.unwrap(), b"hello");
    let big = vec![0u8; MAX_FRAME + 1];
    assert!(matches!(send_frame(&mut a, &big).await, Err(TrustError::Protocol(_))));
}

#[test]
fn codes_are_random_digits_and_parse_leniently() {
    let a = revis_trust::PairingCode::generate();
    assert_eq!(a.digits().len(), revis_trust::CODE_DIGITS);
    assert!(a.digits().chars().all(|c| c.is_ascii_digit()));
    assert_eq!(a.to_string().replace(' ', ""), a.digits());
    assert_eq!(format!("{a:?}"), "PairingCode(..)");
    let many: std::collections::HashSet<String> = (0..50).map(|_| PairingCode::generate().digits().to_owned()).collect();
    assert!(many.len() > 45, "codes repeat: {many:?}");

    assert_eq!(code(" 12-34 56 ").digits(), "123456");
    assert_eq!(code("1234 5678").digits(), "12345678");
    for bad in ["", "12345", "123456789", "12a456", "１２３４５６"] {
        assert!(bad.parse::<PairingCode>().is_err(), "{bad}");
    }
}

#[tokio::test]
async fn an_unusable_client_name_is_refused_before_the_code_is_spent() {
    let window = PairingWindow::open(Instant::now(), DEFAULT_WINDOW);
    let mut hello = vec![1, 1, 0, 3];
    hello.extend_from_slice(b"a\nb");
    hello.extend_from_slice(&[b'A'; 33]);
    let e = server_fed(&framed(&hello), &window).await;
    assert!(e.to_string().contains("name"), "{e}");
    assert_eq!(window.failed_attempts(), 0);

    let dir = tempfile::tempdir().unwrap();
    let mut store = TrustStore::open(dir.path()).unwrap();
    let (_ours, mut theirs) = tokio::io::duplex(1024);
    let e = pair_client_over(&mut theirs, &fake_binding(), &code("123456"), "", "workstation", &mut store).await.unwrap_err();
    assert!(matches!(e, TrustError::InvalidName(_)), "{e}");
}

/// A daemon spawns each pairing connection: the futures must be `Send`.
#[allow(dead_code)]
fn pairing_futures_are_send(
    server_tls: &mut tokio_rustls::server::TlsStream<TcpStream>,
    client_tls: &mut tokio_rustls::client::TlsStream<TcpStream>,
    window: &PairingWindow,
    store: &mut TrustStore,
    code: &PairingCode,
) {
    fn send<T: Send>(_: &T) {}
    let id = DeviceId::from_bytes([0; 32]);
    send(&pair_server(server_tls, id, window, HERE, &mut *store, Instant::now()));
    send(&pair_client(client_tls, id, code, "a", "b", store));
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
