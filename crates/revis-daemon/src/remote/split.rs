//! Tiers split across machines (`tiers.X.split = ["desktop"]`): the model's
//! first layers here, its later layers on paired nodes that lend (`lend.rs`
//! on their side), over llama.cpp's RPC backend.
//!
//! llama.cpp's RPC client aborts its process when a node disappears, so a
//! split model never loads in revisd: it runs in a split engine, a child
//! `revisd split-engine` serving that tier on a private Unix socket, and
//! revisd forwards the tier's calls to it. The engine runs in a network
//! namespace of its own (`private_net`): its RPC client dials ports on that
//! private loopback, where the engine itself accepts and hands each
//! connection to revisd as a descriptor over a socket pair made at spawn;
//! revisd carries it to one node's server-mode port under mutual TLS (ALPN
//! `revis-rpc/1`, pinned to the node's device ID, with this user's client
//! identity). No other local process can reach those ports, so none rides
//! this user's paired identity. A node lost mid-answer ends that
//! engine; the call gets UNAVAILABLE naming the node, every other tier goes
//! on, and the next call starts the engine again.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use revis_proto::Tier;
use revis_proto::v1 as pb;
use revis_trust::{DeviceId, Identity, TrustStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::config::{Config, TierModel};

/// How long a split engine may take to start: connect to every node and
/// load the model, which sends the nodes their layers (once; their weight
/// cache keeps them for the next load).
pub const ENGINE_START: Duration = Duration::from_secs(300);
/// A node's server-mode port must answer within this.
pub const NODE_CONNECT: Duration = Duration::from_secs(5);
/// A node that acknowledges nothing for this long is taken for lost.
pub const NODE_SILENCE: Duration = Duration::from_secs(10);
/// How long Status waits for a running engine's own Status.
const STATUS_WAIT: Duration = Duration::from_secs(2);
/// Bytes buffered each way in a tunnel.
const TUNNEL_BUFFER: usize = 256 << 10;
/// The most of the first request and answer carried by hand (`carry`).
const FIRST_EXCHANGE: usize = 64 << 10;
/// The variable naming the descriptor of the engine's end of its tunnels
/// socket pair.
pub const TUNNELS_FD: &str = "REVIS_TUNNELS_FD";

/// Why a split tier cannot answer now (each becomes its `Status` below).
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// The engine cannot run now: it did not start, or a node was lost.
    #[error("{tier} is split across {nodes} and cannot run now: {why}")]
    Unavailable { tier: Tier, nodes: String, why: String },
    /// This machine has paired with no node yet.
    #[error("{tier} is split across {nodes}, but this machine has paired with no node: pair it first (`revis pair {first}`)")]
    NotPaired { tier: Tier, nodes: String, first: String },
    /// A node the config names is not a paired node.
    #[error(
        "{tier} is split across {nodes}, but no paired node is called {name:?}; `revis nodes` lists them, `revis pair {name}` pairs it"
    )]
    UnknownNode { tier: Tier, nodes: String, name: String },
    /// Where a paired node is has not been seen yet.
    #[error("{tier} is split across {nodes}, but where {name} is has not been seen yet; `revis nodes` finds it")]
    NodeUnseen { tier: Tier, nodes: String, name: String },
    /// The engine's run directory cannot be made.
    #[error("{}: {source}", path.display())]
    RunDir { path: PathBuf, source: std::io::Error },
    /// The pipe the engine says it is ready on.
    #[error("pipe: {0}")]
    Pipe(std::io::Error),
    /// Where revisd's own executable is, to start the engine from.
    #[error("{0}")]
    Exe(std::io::Error),
    #[error("starting the split engine: {0}")]
    Spawn(std::io::Error),
    /// This user's identity or paired nodes (the keyring `revis pair` writes).
    #[error("{0}")]
    Keyring(revis_trust::TrustError),
    /// The engine's own answer to a forwarded call, passed on as it is.
    #[error("{}", .0.message())]
    Engine(Status),
}

impl From<SplitError> for Status {
    fn from(e: SplitError) -> Status {
        let msg = e.to_string();
        match e {
            SplitError::Unavailable { .. } => Status::unavailable(msg),
            SplitError::NotPaired { .. } | SplitError::UnknownNode { .. } | SplitError::NodeUnseen { .. } => {
                Status::failed_precondition(msg)
            }
            SplitError::RunDir { .. } | SplitError::Pipe(_) | SplitError::Exe(_) | SplitError::Spawn(_) | SplitError::Keyring(_) => {
                Status::internal(msg)
            }
            // The engine's own answer, code, message and metadata as they came.
            SplitError::Engine(s) => s,
        }
    }
}

/// The split tiers of this daemon (tiers sharing a model share an engine).
#[derive(Default)]
pub struct Splits {
    tiers: BTreeMap<Tier, Arc<SplitEngine>>,
}

impl Splits {
    pub fn new(config: &Config) -> Splits {
        let mut tiers: BTreeMap<Tier, Arc<SplitEngine>> = BTreeMap::new();
        for (tier, m) in config.tiers.iter().filter(|(_, m)| !m.split.is_empty()) {
            let shared = tiers.values().find(|e| e.model.path == m.path).cloned();
            let engine = shared.unwrap_or_else(|| {
                Arc::new(SplitEngine {
                    tier: *tier,
                    model: m.clone(),
                    keyring: config.server.keyring.clone(),
                    run_dir: config.server.state_dir.join("split"),
                    max_tokens_limit: config.max_tokens_limit,
                    allow_shared_loopback: config.server.allow_shared_loopback,
                    running: tokio::sync::Mutex::new(None),
                    seen: Mutex::new(Seen::Stopped),
                })
            });
            tiers.insert(*tier, engine);
        }
        Splits { tiers }
    }

    pub fn get(&self, tier: Tier) -> Option<&Arc<SplitEngine>> {
        self.tiers.get(&tier)
    }

    /// The engines, once each.
    pub fn engines(&self) -> Vec<Arc<SplitEngine>> {
        let mut out: Vec<Arc<SplitEngine>> = Vec::new();
        for e in self.tiers.values() {
            if !out.iter().any(|o| Arc::ptr_eq(o, e)) {
                out.push(e.clone());
            }
        }
        out
    }
}

/// One split model and, while it runs, its engine process and tunnels.
pub struct SplitEngine {
    /// The first tier that uses it (its engine serves this tier's name).
    tier: Tier,
    model: TierModel,
    keyring: PathBuf,
    run_dir: PathBuf,
    max_tokens_limit: u32,
    /// `server.allow_shared_loopback`.
    allow_shared_loopback: bool,
    running: tokio::sync::Mutex<Option<Running>>,
    /// What Status reads without waiting behind a start (which holds
    /// `running` for up to [`ENGINE_START`]).
    seen: Mutex<Seen>,
}

/// The engine as Status sees it.
#[derive(Clone)]
enum Seen {
    Stopped,
    /// Its last start failed, for this reason (the next call tries again).
    Failed(String),
    Starting,
    Running(Channel),
}

struct Running {
    child: tokio::process::Child,
    channel: Channel,
    tunnels: Vec<Tunnel>,
    /// Receives the engine's connections and carries each; dropped, it ends them all.
    _carrier: Carrier,
}

/// One node's tunnel: its name and what went wrong reaching it.
struct Tunnel {
    node: String,
    /// The last failure reaching the node, for the error a caller sees.
    broken: Arc<Mutex<Option<String>>>,
}

/// The task carrying an engine's connections (and, in its set, every
/// connection it carries): aborted on drop, so none outlives the engine.
struct Carrier(JoinHandle<()>);

impl Drop for Carrier {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Running {
    /// Why the engine is gone, naming the node when a tunnel saw it go.
    fn loss(&self) -> String {
        loss(&self.tunnels)
    }
}

fn loss(tunnels: &[Tunnel]) -> String {
    let broken: Vec<String> = tunnels.iter().filter_map(|t| t.broken.lock().unwrap_or_else(|e| e.into_inner()).clone()).collect();
    if broken.is_empty() {
        let nodes: Vec<&str> = tunnels.iter().map(|t| t.node.as_str()).collect();
        format!("lost {} (its RPC server closed the connection or stopped answering)", nodes.join(", "))
    } else {
        broken.join("; ")
    }
}

impl SplitEngine {
    pub fn nodes(&self) -> &[String] {
        &self.model.split
    }

    fn unavailable(&self, why: &str) -> SplitError {
        SplitError::Unavailable { tier: self.tier, nodes: self.model.split.join(", "), why: why.to_owned() }
    }

    /// A channel to the running engine, starting it first when it is not
    /// running (first use, or it ended with a lost node).
    pub async fn channel(&self) -> Result<Channel, SplitError> {
        let mut running = self.running.lock().await;
        if let Some(r) = running.as_mut() {
            match r.child.try_wait() {
                Ok(None) => return Ok(r.channel.clone()),
                _ => {
                    tracing::warn!(tier = %self.tier, "the split engine had ended ({}); starting it again", r.loss());
                    *running = None;
                }
            }
        }
        self.see(Seen::Starting);
        let r = match self.start().await {
            Ok(r) => r,
            Err(e) => {
                self.see(Seen::Failed(e.to_string()));
                return Err(e);
            }
        };
        let channel = r.channel.clone();
        *running = Some(r);
        self.see(Seen::Running(channel.clone()));
        Ok(channel)
    }

    /// Whether its engine runs or is starting (a call then reaches it
    /// without starting one).
    pub fn started(&self) -> bool {
        matches!(*self.seen.lock().unwrap_or_else(|e| e.into_inner()), Seen::Starting | Seen::Running(_))
    }

    fn see(&self, seen: Seen) {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = seen;
    }

    /// After a call failed on the transport: whether the engine ended, and
    /// then why (naming the node), for the caller's UNAVAILABLE.
    pub async fn ended(&self) -> Option<SplitError> {
        let mut running = self.running.lock().await;
        let r = running.as_mut()?;
        // The stream breaks a moment before the process is reaped.
        let exited = tokio::time::timeout(Duration::from_secs(2), r.child.wait()).await.is_ok();
        if !exited {
            return None;
        }
        let why = r.loss();
        *running = None;
        self.see(Seen::Stopped);
        Some(self.unavailable(&format!("its split engine stopped mid-call: {why}")))
    }

    /// Ends the engine (an unload, or revisd stopping).
    pub async fn stop(&self) -> bool {
        let mut running = self.running.lock().await;
        self.see(Seen::Stopped);
        match running.take() {
            Some(mut r) => {
                let _ = r.child.start_kill();
                let _ = r.child.wait().await;
                true
            }
            None => false,
        }
    }

    /// The engine's status of this tier while it runs or starts (None
    /// otherwise). Never waits behind a start: Status must answer while a
    /// split engine loads (up to [`ENGINE_START`]).
    pub async fn status(&self) -> Option<pb::TierStatus> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // Not running: what is known without asking an engine.
        let now = |state: pb::ModelState, what: String| pb::TierStatus {
            tier: self.tier.to_string(),
            state: state as i32,
            split: format!("split across {}: {what}", self.model.split.join(", ")),
            context_tokens: self.model.context,
            ..Default::default()
        };
        let channel = match seen {
            Seen::Stopped => return None,
            Seen::Failed(why) => return Some(now(pb::ModelState::Unloaded, format!("its last start failed: {why}"))),
            Seen::Starting => return Some(now(pb::ModelState::Loading, "its engine is starting".into())),
            Seen::Running(channel) => channel,
        };
        let mut admin = pb::admin_client::AdminClient::new(channel);
        let s = tokio::time::timeout(STATUS_WAIT, admin.status(pb::StatusRequest {})).await.ok()?.ok()?.into_inner();
        s.tiers.into_iter().find(|t| t.tier == self.tier.as_str())
    }

    async fn start(&self) -> Result<Running, SplitError> {
        let (connector, nodes) = self.resolve()?;
        let tunnels: Vec<Tunnel> = nodes.iter().map(|(name, ..)| Tunnel { node: name.clone(), broken: Arc::default() }).collect();
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(SplitError::Pipe)?;
        std::fs::create_dir_all(&self.run_dir).map_err(|source| SplitError::RunDir { path: self.run_dir.clone(), source })?;
        let socket = self.run_dir.join(format!("{}.sock", self.tier));
        let _ = std::fs::remove_file(&socket);
        let (read_end, write_end) = pipe().map_err(SplitError::Pipe)?;
        let exe = std::env::current_exe().map_err(SplitError::Exe)?;
        let m = &self.model;
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("split-engine")
            .arg("--socket")
            .arg(&socket)
            .arg("--tier")
            .arg(self.tier.as_str())
            .arg("--model")
            .arg(&m.path)
            .arg("--context")
            .arg(m.context.to_string())
            .arg("--threads")
            .arg(m.threads.to_string())
            .arg("--batch")
            .arg(m.batch.to_string())
            .arg("--max-tokens-limit")
            .arg(self.max_tokens_limit.to_string())
            .arg("--state-dir")
            .arg(self.run_dir.join(format!("{}-state", self.tier)));
        for name in &m.split {
            cmd.arg("--node").arg(name);
        }
        if let Some(s) = m.split_local {
            cmd.arg("--split-local").arg(s.to_string());
        }
        if self.allow_shared_loopback {
            cmd.arg("--allow-shared-loopback");
        }
        let theirs_fd = theirs.as_raw_fd();
        cmd.env("REVIS_READY_FD", write_end.as_raw_fd().to_string())
            .env(TUNNELS_FD, theirs_fd.to_string())
            .stdout(std::io::stderr())
            .stderr(std::io::stderr());
        // SAFETY: only fcntl between fork and exec; `theirs` stays open until spawn returns.
        unsafe { cmd.pre_exec(move || super::private_net::inherit_in_child(theirs_fd)) };
        super::child::die_with_parent(&mut cmd);
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let mut child = cmd.spawn().map_err(SplitError::Spawn)?;
        drop((write_end, theirs));
        let targets: Vec<Target> = nodes
            .into_iter()
            .zip(&tunnels)
            .map(|((name, device_id, addr), t)| Target { name, device_id, addr, broken: t.broken.clone() })
            .collect();
        let carrier = ours
            .set_nonblocking(true)
            .and_then(|()| UnixStream::from_std(ours))
            .map(|chan| Carrier(tokio::spawn(carry_all(chan, targets, connector))))
            .map_err(SplitError::Pipe)?;
        tracing::info!(tier = %self.tier, pid = child.id(), nodes = %m.split.join(", "), "split engine starting");
        let wait = tokio::task::spawn_blocking(move || {
            let mut f = std::fs::File::from(read_end);
            let mut buf = String::new();
            let _ = f.read_to_string(&mut buf);
            buf
        });
        let said = match tokio::time::timeout(ENGINE_START, wait).await {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => String::new(),
            Err(_) => {
                let _ = child.start_kill();
                return Err(self.unavailable(&format!("its split engine did not load within {}s", ENGINE_START.as_secs())));
            }
        };
        if let Some(why) = said.strip_prefix(super::lend::REFUSED) {
            let _ = child.wait().await;
            return Err(self.unavailable(&format!(
                "its split engine would reach the nodes through this machine's shared loopback, where any local process could \
                 ride its connections under this user's paired identity ({}). Let this user make network namespaces \
                 (docs/RELIABILITY.md, \"No private loopback\", says how), or accept the risk with \
                 `server.allow_shared_loopback = true`",
                why.trim()
            )));
        }
        if !said.starts_with("ready") {
            let _ = child.wait().await;
            let why = loss(&tunnels);
            return Err(self.unavailable(&format!("its split engine could not load the model: {why} (revisd's log says more)")));
        }
        let channel = Endpoint::from_static("http://split-engine")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move { UnixStream::connect(socket).await.map(TokioIo::new) }
            }))
            .await
            .map_err(|e| self.unavailable(&format!("its split engine does not answer: {e}")))?;
        Ok(Running { child, channel, tunnels, _carrier: carrier })
    }

    /// This user's client identity and each node's device ID and address,
    /// from the keyring `revis pair` writes.
    #[allow(clippy::type_complexity)]
    fn resolve(&self) -> Result<(TlsConnectorFor, Vec<(String, DeviceId, SocketAddr)>), SplitError> {
        let nodes = self.model.split.join(", ");
        if !self.keyring.join(revis_trust::TRUST_FILE).is_file() {
            return Err(SplitError::NotPaired { tier: self.tier, nodes, first: self.model.split[0].clone() });
        }
        let identity = Identity::load_or_create(&self.keyring).map_err(SplitError::Keyring)?;
        let store = TrustStore::open(&self.keyring).map_err(SplitError::Keyring)?;
        let mut out = Vec::new();
        for name in &self.model.split {
            let Some(d) = store.find(name).ok().flatten() else {
                return Err(SplitError::UnknownNode { tier: self.tier, nodes, name: name.clone() });
            };
            let Some(addr) = d.address.as_deref().and_then(|a| a.parse::<SocketAddr>().ok()) else {
                return Err(SplitError::NodeUnseen { tier: self.tier, nodes, name: name.clone() });
            };
            out.push((d.name.clone(), d.device_id, addr));
        }
        Ok((TlsConnectorFor(Arc::new(identity)), out))
    }
}

/// Makes a TLS connector pinned to one node, presenting this user's identity.
#[derive(Clone)]
struct TlsConnectorFor(Arc<Identity>);

impl TlsConnectorFor {
    fn to(&self, node: DeviceId) -> Result<TlsConnector, String> {
        revis_trust::lend_client_config(&self.0, node).map(TlsConnector::from).map_err(|e| e.to_string())
    }
}

/// Where one node's connections go.
struct Target {
    name: String,
    device_id: DeviceId,
    addr: SocketAddr,
    broken: Arc<Mutex<Option<String>>>,
}

/// Receives the engine's RPC connections (a descriptor each, tagged with
/// the node's index) and carries each to its node under mutual TLS, until
/// the engine closes the pair; then waits for the connections to end.
async fn carry_all(chan: UnixStream, targets: Vec<Target>, tls: TlsConnectorFor) {
    let targets: Arc<Vec<Target>> = Arc::new(targets);
    let mut carried = tokio::task::JoinSet::new();
    loop {
        let got = chan.async_io(tokio::io::Interest::READABLE, || super::private_net::recv_fd_raw(chan.as_raw_fd())).await;
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
/// with the node's index). Returns (endpoint, node) pairs for [`EngineArgs`].
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
                if let Err(e) = super::private_net::send_fd(&chan, tag, conn.as_fd()) {
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
            let refused = super::lend::refusal_said(&answer[..n], &mut outer_r).await;
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

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and ours from here on.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: setting a flag on our own descriptor.
    unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok((r, w))
}

/// A forwarded Generate stream: the engine's events, with a transport
/// failure (the engine ended: a node was lost) turned into UNAVAILABLE
/// naming the node.
pub fn forward_stream(
    engine: Arc<SplitEngine>,
    mut events: tonic::Streaming<pb::GenerateEvent>,
    hold: impl Send + 'static,
) -> ReceiverStream<Result<pb::GenerateEvent, Status>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        // The caller's place in this daemon's queue, held until the stream ends.
        let _hold = hold;
        while let Some(item) = events.next().await {
            let item = match item {
                Ok(e) => Ok(e),
                Err(s) => Err(engine.translate(s).await.into()),
            };
            let end = item.is_err();
            if tx.send(item).await.is_err() || end {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

impl SplitEngine {
    /// A failed forwarded call: the engine's own answer as it is, a broken
    /// engine as UNAVAILABLE naming the node.
    pub async fn translate(&self, s: Status) -> SplitError {
        let transport =
            matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled);
        if transport && let Some(ended) = self.ended().await {
            return ended;
        }
        SplitError::Engine(s)
    }
}

/// What a split engine (`revisd split-engine`) is started with.
#[derive(Clone, Debug)]
pub struct EngineArgs {
    pub tier: Tier,
    pub model: PathBuf,
    pub context: u32,
    pub threads: revis_engine::Threads,
    pub batch: u32,
    pub max_tokens_limit: u32,
    /// (loopback endpoint of a tunnel, the node's name)
    pub rpc: Vec<(String, String)>,
    pub split_local: Option<f64>,
    pub state_dir: PathBuf,
}

/// In the split engine: connects to every node's RPC server (through its
/// tunnel), places the layers, and returns the engine's configuration: the
/// one model on every tier, loaded at start, server mode and lending off.
/// llama.cpp aborts this process if a node cannot be reached; the revisd
/// that started it reports that node.
pub fn engine_config(a: &EngineArgs, models_dir: &std::path::Path) -> Result<Config, String> {
    let mut devices = Vec::new();
    let mut remote_free = 0u64;
    for (endpoint, name) in &a.rpc {
        let found = revis_engine::rpc::connect(endpoint).map_err(|e| format!("{name}: {e}"))?;
        for d in &found {
            tracing::info!(node = %name, free_mb = d.free_bytes >> 20, total_mb = d.total_bytes >> 20, "lent device");
            remote_free += d.free_bytes;
        }
        devices.extend(found.iter().map(|d| d.index));
    }
    let n_layer = revis_engine::rpc::layer_count(&a.model).map_err(|e| e.to_string())?;
    let plan = revis_engine::rpc::SplitPlan::new(n_layer, a.split_local, revis_engine::rpc::local_free_bytes(), remote_free);
    let names: Vec<&str> = a.rpc.iter().map(|(_, n)| n.as_str()).collect();
    let note = describe(&plan, &names);
    tracing::info!(tier = %a.tier, "{note}");
    let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
    let model = quote(&a.model.to_string_lossy());
    let mut text = format!(
        "[daemon]\nload_at_start = true\nspeculate = \"off\"\nstreams = 1\ncontext = {}\nthreads = {}\nbatch = {}\nmax_tokens_limit = {}\n\
         [server]\nenabled = false\nadvertise = false\nlend = false\nstate_dir = {}\n",
        a.context,
        match a.threads {
            revis_engine::Threads::Fixed(n) => n.to_string(),
            t => quote(&t.to_string()),
        },
        a.batch,
        a.max_tokens_limit,
        quote(&a.state_dir.to_string_lossy())
    );
    for t in Tier::ALL {
        text.push_str(&format!("[tiers.{t}]\nmodel = {model}\n"));
    }
    let mut config = Config::parse(&text, std::path::Path::new("(split engine)"), models_dir).map_err(|e| e.to_string())?;
    let split = crate::config::EngineSplit { split: revis_engine::Split { devices, remote_layers: plan.remote_layers }, note };
    for t in config.tiers.values_mut() {
        t.engine_split = Some(split.clone());
    }
    Ok(config)
}

/// "layers 1-15 here, 16-30 on desktop", for Status and the log.
pub fn describe(plan: &revis_engine::rpc::SplitPlan, nodes: &[&str]) -> String {
    let here = plan.local_layers();
    let there = if nodes.len() > 1 { format!("{} (by their free memory)", nodes.join(" and ")) } else { nodes.join("") };
    format!("layers 1-{here} here, {}-{} on {there}", here + 1, plan.n_layer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_the_placement() {
        let plan = revis_engine::rpc::SplitPlan { n_layer: 30, remote_layers: 15 };
        assert_eq!(describe(&plan, &["desktop"]), "layers 1-15 here, 16-30 on desktop");
        assert_eq!(describe(&plan, &["a", "b"]), "layers 1-15 here, 16-30 on a and b (by their free memory)");
    }
}
