//! The tunnels between a split engine and its nodes, both ends: in the
//! engine, a private-loopback port per node whose connections go to revisd
//! as descriptors ([`engine_endpoints`]); in revisd, carrying each one to
//! its node under mutual TLS ([`carry_all`]) and remembering why a node was
//! lost, for the error a caller sees.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use revis_trust::{DeviceId, Identity};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

/// A node's server-mode port must answer within this.
pub const NODE_CONNECT: Duration = Duration::from_secs(5);
/// A node that acknowledges nothing for this long is taken for lost.
pub const NODE_SILENCE: Duration = Duration::from_secs(10);
/// Bytes buffered each way in a tunnel.
const TUNNEL_BUFFER: usize = 256 << 10;
/// The most of the first request and answer carried by hand (`carry`).
const FIRST_EXCHANGE: usize = 64 << 10;
/// The variable naming the descriptor of the engine's end of its tunnels
/// socket pair.
pub const TUNNELS_FD: &str = "REVIS_TUNNELS_FD";

/// One node's tunnel: its name and what went wrong reaching it.
pub(super) struct Tunnel {
    pub(super) node: String,
    /// The last failure reaching the node, for the error a caller sees.
    pub(super) broken: Arc<Mutex<Option<String>>>,
}

/// The task carrying an engine's connections (and, in its set, every
/// connection it carries): aborted on drop, so none outlives the engine.
pub(super) struct Carrier(pub(super) JoinHandle<()>);

impl Drop for Carrier {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why an engine is gone, naming the node when a tunnel saw it go.
pub(super) fn loss(tunnels: &[Tunnel]) -> String {
    let broken: Vec<String> = tunnels.iter().filter_map(|t| t.broken.lock().unwrap_or_else(|e| e.into_inner()).clone()).collect();
    if broken.is_empty() {
        let nodes: Vec<&str> = tunnels.iter().map(|t| t.node.as_str()).collect();
        format!("lost {} (its RPC server closed the connection or stopped answering)", nodes.join(", "))
    } else {
        broken.join("; ")
    }
}

/// Makes a TLS connector pinned to one node, presenting this user's identity.
#[derive(Clone)]
pub(super) struct TlsConnectorFor(pub(super) Arc<Identity>);

impl TlsConnectorFor {
    fn to(&self, node: DeviceId) -> Result<TlsConnector, String> {
        revis_trust::lend_client_config(&self.0, node).map(TlsConnector::from).map_err(|e| e.to_string())
    }
}

/// Where one node's connections go.
pub(super) struct Target {
    pub(super) name: String,
    pub(super) device_id: DeviceId,
    pub(super) addr: SocketAddr,
    pub(super) broken: Arc<Mutex<Option<String>>>,
}

/// Receives the engine's RPC connections (a descriptor each, tagged with
/// the node's index) and carries each to its node under mutual TLS, until
/// the engine closes the pair; then waits for the connections to end.
pub(super) async fn carry_all(chan: UnixStream, targets: Vec<Target>, tls: TlsConnectorFor) {
    let targets: Arc<Vec<Target>> = Arc::new(targets);
    let mut carried = tokio::task::JoinSet::new();
    loop {
        let got = chan.async_io(tokio::io::Interest::READABLE, || crate::remote::private_net::recv_fd_raw(chan.as_raw_fd())).await;
        while carried.try_join_next().is_some() {}
        let (index, fd) = match got {
            Ok(Some(x)) => x,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!("split: the engine's tunnels socket: {e}");
                break;
            }
        };
        let Some(inner) = tcp_from(fd) else { continue };
        let Some(_) = targets.get(index as usize) else {
            tracing::warn!(index, "split: the engine named no node of this tier");
            continue;
        };
        let (targets, tls) = (targets.clone(), tls.clone());
        carried.spawn(async move {
            let t = &targets[index as usize];
            if let Err(e) = carry(inner, t.device_id, t.addr, &tls).await {
                let why = format!("{} at {}: {e}", t.name, t.addr);
                tracing::warn!(node = %t.name, "split: {why}");
                *t.broken.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
            }
        });
    }
    while carried.join_next().await.is_some() {}
}

/// A TCP connection the engine handed over, for the runtime.
fn tcp_from(fd: OwnedFd) -> Option<TcpStream> {
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true).ok()?;
    TcpStream::from_std(std).map_err(|e| tracing::warn!("split: a connection from the engine: {e}")).ok()
}

/// In the split engine: one private-loopback port per node for llama.cpp's
/// RPC client to dial, each connection handed to revisd over `chan` (tagged
/// with the node's index). Returns (endpoint, node) pairs for [`EngineArgs`](super::EngineArgs).
pub fn engine_endpoints(nodes: &[String], chan: std::os::unix::net::UnixStream) -> std::io::Result<Vec<(String, String)>> {
    let chan = Arc::new(chan);
    let mut out = Vec::new();
    for (index, name) in nodes.iter().enumerate() {
        let tag = u8::try_from(index).map_err(|_| std::io::Error::other("more than 256 nodes"))?;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        out.push((listener.local_addr()?.to_string(), name.clone()));
        let chan = chan.clone();
        std::thread::Builder::new().name(format!("revis-tunnel-{index}")).spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if let Err(e) = crate::remote::private_net::send_fd(&chan, tag, conn.as_fd()) {
                    // revisd is gone: the engine ends with it.
                    tracing::warn!("split engine: cannot hand a connection to revisd: {e}");
                    return;
                }
            }
        })?;
    }
    Ok(out)
}

/// One tunnelled connection, until either side closes.
async fn carry(mut inner: TcpStream, device_id: DeviceId, addr: SocketAddr, tls: &TlsConnectorFor) -> Result<(), String> {
    let _ = inner.set_nodelay(true);
    let tcp = tokio::time::timeout(NODE_CONNECT, TcpStream::connect(addr))
        .await
        .map_err(|_| format!("no answer within {}s", NODE_CONNECT.as_secs()))?
        .map_err(|e| format!("cannot connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    // A node that vanishes (cable out, asleep) must end the session, not
    // hang it: unacknowledged data gives up after NODE_SILENCE, and an idle
    // connection is probed.
    let sock = socket2::SockRef::from(&tcp);
    let _ = sock.set_tcp_keepalive(
        &socket2::TcpKeepalive::new().with_time(Duration::from_secs(2)).with_interval(Duration::from_secs(2)).with_retries(3),
    );
    let _ = revis_trust::link::give_up_unacknowledged(&tcp, NODE_SILENCE);
    let connector = tls.to(device_id)?;
    let mut outer = tokio::time::timeout(NODE_CONNECT, connector.connect(revis_trust::server_name(), tcp))
        .await
        .map_err(|_| "the TLS handshake timed out".to_string())?
        .map_err(|e| format!("TLS: {e} (is this machine still paired there?)"))?;
    // A lender that cannot serve says why before it closes
    // (`lend::REFUSAL_MARK`). llama.cpp's client speaks first and its server
    // only answers, and no answer starts with the mark: so the first
    // exchange is carried by hand, the lender's first bytes read before any
    // reach the engine, and the rest as bytes both ways.
    let mut request = vec![0u8; FIRST_EXCHANGE];
    let mut answer = vec![0u8; FIRST_EXCHANGE];
    let answered = {
        let (mut inner_r, _) = inner.split();
        let (mut outer_r, mut outer_w) = tokio::io::split(&mut outer);
        // The request may come in pieces (llama.cpp sends a command's
        // parts with a write each): carried on until the answer comes. A
        // client waits for that answer before it writes more, so nothing is
        // in flight this way when the loop below stops this.
        let up = async {
            loop {
                let n = inner_r.read(&mut request).await?;
                if n == 0 {
                    return Ok::<(), std::io::Error>(());
                }
                outer_w.write_all(&request[..n]).await?;
                outer_w.flush().await?;
            }
        };
        let down = async {
            let n = outer_r.read(&mut answer).await?;
            let refused = crate::remote::lend::refusal_said(&answer[..n], &mut outer_r).await;
            Ok::<(usize, Option<String>), std::io::Error>((n, refused))
        };
        let got = tokio::select! {
            d = down => d,
            u = up => return match u {
                // The engine closed before it had an answer.
                Ok(()) => Ok(()),
                Err(e) => Err(format!("the engine's connection broke: {e}")),
            },
        };
        match got {
            Err(e) => return Err(format!("the connection broke: {e}")),
            Ok((0, _)) => return Err("it closed the session without a word (lending off there, or this machine not paired there)".into()),
            Ok((_, Some(said))) => return Err(format!("it refused the session: {said}")),
            Ok((n, None)) => n,
        }
    };
    inner.write_all(&answer[..answered]).await.map_err(|e| format!("the engine's connection broke: {e}"))?;
    match tokio::io::copy_bidirectional_with_sizes(&mut inner, &mut outer, TUNNEL_BUFFER, TUNNEL_BUFFER).await {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("the connection broke: {e}")),
    }
}
