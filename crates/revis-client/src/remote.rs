//! Other machines' daemons: this client's identity and the daemons it has
//! paired with ([`Keyring`]), pairing ([`pair`]), finding a paired daemon on
//! the LAN ([`resolve`]), and connecting to it over mutual TLS
//! ([`Client::connect_node`]).
//!
//! mDNS only suggests where a node is. What decides is the pin: the TLS
//! connection succeeds only when the server's certificate has the device ID
//! stored at pairing, so a forged advertisement leads to a refused
//! handshake, never to a call.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use revis_trust::{DeviceId, Discovered, Identity, Interfaces, PairingCode, TrustError, TrustStore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Endpoint, Uri};

use crate::error::NodeError;
use crate::target::{Node, Target};
use crate::{CallError, Client, ClientError};

/// How long a TCP connect plus TLS handshake to a node may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a pairing exchange may take, handshake included.
pub const PAIR_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection to a node pings it (HTTP/2) after this long without a frame
/// from it, busy or idle...
pub const NODE_PING_INTERVAL: Duration = Duration::from_secs(5);
/// ...and is closed when the ping is not acknowledged within this: a node
/// that vanished (powered off, off the network) shows within 10 s as a
/// broken connection, never as a call that hangs.
pub const NODE_PING_TIMEOUT: Duration = Duration::from_secs(5);
/// The kernel's TCP keepalive on a connection to a node, for one gone
/// before HTTP/2 pings start: the first probe after [`NODE_PING_INTERVAL`]
/// of silence, then one every this long...
pub const NODE_TCP_PROBE_INTERVAL: Duration = Duration::from_secs(2);
/// ...and the connection is dropped after this many unanswered probes.
pub const NODE_TCP_PROBES: u32 = 3;

/// This client's identity (created on first use) and the daemons it has
/// paired with, in one directory: [`crate::Paths::keyring`].
pub struct Keyring {
    pub identity: Identity,
    pub store: TrustStore,
    dir: PathBuf,
}

impl Keyring {
    /// The keyring in `dir`, created on first use (0700 directory, 0600 files).
    pub fn open(dir: &Path) -> Result<Keyring, ClientError> {
        Ok(Keyring { identity: Identity::load_or_create(dir)?, store: TrustStore::open(dir)?, dir: dir.into() })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Client {
    /// Connects to a paired daemon over mutual TLS, pinned to its device ID,
    /// and checks that it answers (a Status call), so a refusal shows here
    /// with a clear error rather than on the first real call.
    pub async fn connect_node(keyring: &Keyring, node: &Node) -> Result<Client, ClientError> {
        let config = revis_trust::client_config(&keyring.identity, node.device_id)?;
        let connector = TlsConnector::from(config);
        let (addr, name, expected) = (node.addr, node.name.clone(), node.device_id);
        let channel = Endpoint::from_static("http://revis-node")
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(NODE_PING_INTERVAL)
            .keep_alive_timeout(NODE_PING_TIMEOUT)
            .keep_alive_while_idle(true)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let (connector, name) = (connector.clone(), name.clone());
                async move { dial(&connector, addr, &name, expected).await.map(TokioIo::new) }
            }))
            .await
            .map_err(|e| node_error(&e, node).map_or_else(|| unreachable(node, &e), ClientError::Node))?;
        let client = Client::over(channel, Target::Node(node.clone()));
        match client.answers().await {
            Ok(()) => Ok(client),
            Err(s) => Err(node_error(&s, node).map_or_else(|| ClientError::Call(CallError::from_status(s)), ClientError::Node)),
        }
    }
}

/// TCP, then TLS pinned to `expected`, then the server's first bytes.
///
/// In TLS 1.3 the client's handshake ends before the server has judged the
/// client's certificate, so a refusal would only show as a closed
/// connection on the first call. The server speaks first on a connection
/// it accepts (the HTTP/2 SETTINGS frame), so waiting for its first bytes
/// tells the two apart: bytes mean accepted (they are replayed to tonic),
/// an alert or a close means refused. A pin mismatch becomes
/// [`NodeError::NotThatNode`], a refusal [`NodeError::Refused`].
async fn dial(connector: &TlsConnector, addr: SocketAddr, name: &str, expected: DeviceId) -> std::io::Result<Prefetched> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    // The kernel's probes too, for a node gone before HTTP/2 pings start.
    let probes =
        socket2::TcpKeepalive::new().with_time(NODE_PING_INTERVAL).with_interval(NODE_TCP_PROBE_INTERVAL).with_retries(NODE_TCP_PROBES);
    socket2::SockRef::from(&tcp).set_tcp_keepalive(&probes)?;
    // Bytes in flight that the node never acknowledges end the connection as a silent ping does.
    revis_trust::link::give_up_unacknowledged(&tcp, NODE_PING_INTERVAL + NODE_PING_TIMEOUT)?;
    let mut tls = connector.connect(revis_trust::server_name(), tcp).await.map_err(|e| {
        if is_pin_mismatch(&e) { std::io::Error::other(NodeError::NotThatNode { name: name.into(), addr, expected }) } else { e }
    })?;
    let refused = || std::io::Error::other(NodeError::Refused { name: name.into(), addr });
    let mut first = vec![0u8; 4096];
    let n = match tokio::time::timeout(CONNECT_TIMEOUT, tls.read(&mut first)).await {
        Err(_) => return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the node accepted TLS but said nothing")),
        Ok(Ok(0)) => return Err(refused()),
        Ok(Err(e)) if e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()).is_some() => return Err(refused()),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(n)) => n,
    };
    first.truncate(n);
    Ok(Prefetched { first, at: 0, tls })
}

/// A TLS stream whose first bytes were already read: they come first.
struct Prefetched {
    first: Vec<u8>,
    at: usize,
    tls: tokio_rustls::client::TlsStream<TcpStream>,
}

impl AsyncRead for Prefetched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.at < self.first.len() {
            let n = buf.remaining().min(self.first.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.first[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefetched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

fn is_pin_mismatch(e: &std::io::Error) -> bool {
    matches!(e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()), Some(rustls::Error::InvalidCertificate(_)))
}

/// A [`NodeError`] somewhere in `e`'s sources, or a TLS alert from the
/// server (it did not accept our certificate) turned into one.
fn node_error(e: &(dyn std::error::Error + 'static), node: &Node) -> Option<NodeError> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let inner = err.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()).and_then(|i| i.downcast_ref::<NodeError>());
        if let Some(n) = err.downcast_ref::<NodeError>().or(inner) {
            return Some(n.clone());
        }
        if let Some(rustls::Error::AlertReceived(_)) = err.downcast_ref::<rustls::Error>() {
            return Some(NodeError::Refused { name: node.name.clone(), addr: node.addr });
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(rustls::Error::AlertReceived(_)) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>())
        {
            return Some(NodeError::Refused { name: node.name.clone(), addr: node.addr });
        }
        cur = err.source();
    }
    None
}

fn unreachable(node: &Node, e: &dyn std::error::Error) -> ClientError {
    ClientError::Node(NodeError::Unreachable { name: node.name.clone(), addr: node.addr, reason: crate::error::source_chain(e) })
}

/// Pairs with the daemon at `addr` using the code its screen shows: SPAKE2
/// over TLS, bound to the connection. On success the daemon is stored in
/// the keyring under `server_name` (with `addr` as its last address) and
/// this machine is stored there under `my_name`.
pub async fn pair(
    keyring: &mut Keyring,
    addr: SocketAddr,
    server_name: &str,
    code: &PairingCode,
    my_name: &str,
) -> Result<DeviceId, ClientError> {
    let config = revis_trust::pairing_client_config(&keyring.identity)?;
    let local = keyring.identity.device_id();
    let run = async {
        let tcp = TcpStream::connect(addr).await.map_err(TrustError::Connection)?;
        tcp.set_nodelay(true).map_err(TrustError::Connection)?;
        let mut tls =
            TlsConnector::from(Arc::clone(&config)).connect(revis_trust::server_name(), tcp).await.map_err(TrustError::Connection)?;
        revis_trust::pair_client(&mut tls, local, code, my_name, server_name, &mut keyring.store).await
    };
    let id = match tokio::time::timeout(PAIR_TIMEOUT, run).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(ClientError::Pairing(format!("{server_name} at {addr} did not finish pairing within {}s", PAIR_TIMEOUT.as_secs())));
        }
    };
    keyring.store.set_address(&id, &addr.to_string())?;
    Ok(id)
}

/// At most this many places are tried for one node: its advertised
/// addresses (a forged advertisement may list many) and its last address,
/// which is always among them.
pub const MAX_CANDIDATE_ADDRESSES: usize = 8;

/// Finds the paired daemon a person named (its name or device ID): browses
/// mDNS on `interfaces` for up to `wait` until an advertisement with its
/// device ID shows up, then takes a place whose TLS certificate is pinned
/// to that ID, among every address every such advertisement gives and the
/// address it was last reached at ([`MAX_CANDIDATE_ADDRESSES`] at most). The
/// places are tried all at once, within one [`CONNECT_TIMEOUT`], so
/// unreachable ones cost no more than that. An advertisement is a hint and
/// may be forged; the pin decides (a forged one does not hide the real
/// node). When none passes, the first place is returned, so
/// [`Client::connect_node`] says why. With `interfaces` None (mDNS off),
/// only the last address is tried.
pub async fn resolve(keyring: &Keyring, what: &str, interfaces: Option<&Interfaces>, wait: Duration) -> Result<Node, ClientError> {
    let device = keyring.store.find(what)?.cloned().ok_or_else(|| ClientError::UnknownNode(what.to_owned()))?;
    let id = device.device_id;
    let advertised: Vec<SocketAddr> = match interfaces {
        None => Vec::new(),
        Some(interfaces) => {
            match revis_trust::browse(interfaces, wait, |seen: &[Discovered]| seen.iter().any(|d| d.device_id == id)).await {
                Ok(seen) => seen.into_iter().filter(|d| d.device_id == id).flat_map(|d| d.addresses).collect(),
                Err(e) => {
                    tracing::warn!("mDNS browse failed: {e}");
                    Vec::new()
                }
            }
        }
    };
    let last = device.address.as_deref().and_then(|a| a.parse::<SocketAddr>().ok());
    let places = candidates(advertised, last);
    let Some(&first) = places.first() else {
        return Err(ClientError::Pairing(format!(
            "{} is paired but was not found on the network within {:.1}s and has no known address; is its server mode on?",
            device.name,
            wait.as_secs_f64()
        )));
    };
    let addr = if places.len() > 1 {
        let config = revis_trust::client_config(&keyring.identity, id)?;
        first_pinned(&config, &places).await.unwrap_or(first)
    } else {
        first
    };
    Ok(Node { name: device.name, device_id: id, addr })
}

/// The places to try: the advertised addresses, then `last`, without
/// repeats, at most [`MAX_CANDIDATE_ADDRESSES`]; `last` is kept whatever
/// an advertisement lists.
fn candidates(advertised: Vec<SocketAddr>, last: Option<SocketAddr>) -> Vec<SocketAddr> {
    let mut seen = std::collections::HashSet::new();
    let room = MAX_CANDIDATE_ADDRESSES - usize::from(last.is_some());
    let mut places: Vec<SocketAddr> = advertised.into_iter().filter(|a| Some(*a) != last && seen.insert(*a)).take(room).collect();
    places.extend(last);
    places
}

/// A place of `places` whose server completes a TLS handshake pinned by
/// `config` (its certificate has the paired device ID): all are tried at
/// once, the first to pass wins, and none after [`CONNECT_TIMEOUT`].
async fn first_pinned(config: &Arc<rustls::ClientConfig>, places: &[SocketAddr]) -> Option<SocketAddr> {
    let mut probes = tokio::task::JoinSet::new();
    for &place in places {
        let config = Arc::clone(config);
        probes.spawn(async move { (place, presents_pin(&config, place).await) });
    }
    let first = async {
        while let Some(probe) = probes.join_next().await {
            match probe {
                Ok((place, true)) => return Some(place),
                Ok((place, false)) => tracing::info!(%place, "no TLS pinned to the node's device ID there"),
                Err(e) => tracing::warn!("a probe failed: {e}"),
            }
        }
        None
    };
    // Dropping the set (on return or timeout) ends the probes still running.
    tokio::time::timeout(CONNECT_TIMEOUT, first).await.ok().flatten()
}

/// Whether the server at `addr` completes a TLS handshake pinned by
/// `config` (its certificate has the paired device ID), within [`CONNECT_TIMEOUT`].
async fn presents_pin(config: &Arc<rustls::ClientConfig>, addr: SocketAddr) -> bool {
    let handshake = async {
        let tcp = TcpStream::connect(addr).await?;
        TlsConnector::from(Arc::clone(config)).connect(revis_trust::server_name(), tcp).await
    };
    matches!(tokio::time::timeout(CONNECT_TIMEOUT, handshake).await, Ok(Ok(_)))
}

/// The interfaces mDNS uses on the client: `$REVIS_MDNS_INTERFACES`
/// (comma-separated names) when set, else every non-loopback interface;
/// None when it is `none` (no mDNS at all: paired nodes are reached at
/// their last address, and pairing needs HOST:PORT).
pub fn interfaces_from_env() -> Option<Interfaces> {
    match std::env::var("REVIS_MDNS_INTERFACES") {
        Ok(v) if v.trim() == "none" => None,
        Ok(v) if !v.trim().is_empty() => Some(Interfaces::Named(v.split(',').map(|s| s.trim().to_owned()).collect())),
        _ => Some(Interfaces::AllLan),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use revis_trust::TrustSet;

    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, 1], port))
    }

    #[test]
    fn candidates_are_capped_and_keep_the_last_address() {
        let advertised: Vec<SocketAddr> = (1..=20).map(addr).collect();
        let places = candidates(advertised.clone(), Some(addr(999)));
        assert_eq!(places.len(), MAX_CANDIDATE_ADDRESSES);
        assert_eq!(places.last(), Some(&addr(999)));
        assert_eq!(places[..MAX_CANDIDATE_ADDRESSES - 1], advertised[..MAX_CANDIDATE_ADDRESSES - 1]);
        // Repeats, and the last address advertised too, count once.
        assert_eq!(candidates(vec![addr(1), addr(1), addr(2)], Some(addr(1))), vec![addr(2), addr(1)]);
        assert_eq!(candidates(advertised, None).len(), MAX_CANDIDATE_ADDRESSES);
        assert_eq!(candidates(Vec::new(), None), Vec::<SocketAddr>::new());
    }

    /// Places that accept TCP and then say nothing (a forged advertisement's
    /// addresses) cost one timeout in all, not one each: the real node,
    /// listed last, is found before the first of them gives up.
    #[tokio::test]
    async fn places_are_tried_at_once() {
        let (node, client) = (Identity::generate().unwrap(), Identity::generate().unwrap());
        let real = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let real_addr = real.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(revis_trust::server_config(&node, TrustSet::new([client.device_id()])).unwrap());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = real.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let _ = tls.read(&mut [0u8; 1]).await;
                    }
                });
            }
        });
        // Listening, never accepting: the kernel completes TCP, TLS waits forever.
        let mut silent = Vec::new();
        for _ in 0..MAX_CANDIDATE_ADDRESSES - 1 {
            silent.push(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        }
        let mut places: Vec<SocketAddr> = silent.iter().map(|l| l.local_addr().unwrap()).collect();
        places.push(real_addr);
        let config = revis_trust::client_config(&client, node.device_id()).unwrap();
        let started = Instant::now();
        assert_eq!(first_pinned(&config, &places).await, Some(real_addr));
        assert!(started.elapsed() < CONNECT_TIMEOUT, "took {:?}", started.elapsed());
        // None passes: one timeout in all.
        let started = Instant::now();
        assert_eq!(first_pinned(&config, &places[..places.len() - 1]).await, None);
        assert!(started.elapsed() < CONNECT_TIMEOUT * 2, "took {:?}", started.elapsed());
    }
}
