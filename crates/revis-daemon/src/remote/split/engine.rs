//! The split engines as revisd sees them: which tiers share one, starting
//! a tier's engine as a child (`revisd split-engine`) and waiting for it,
//! restarting it after a lost node, stopping it, its Status, and forwarding
//! the tier's calls to it.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use revis_proto::Tier;
use revis_proto::v1 as pb;
use revis_trust::{DeviceId, Identity, TrustStore};
use tokio::net::UnixStream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::transport::{Channel, Endpoint, Uri};

use super::error::SplitError;
use super::flags::EngineFlags;
use super::tunnel::{Carrier, TUNNELS_FD, Target, TlsConnectorFor, Tunnel, carry_all, loss};
use crate::config::{Config, TierModel};
use crate::remote::private_net;

/// How long a split engine may take to start: connect to every node and
/// load the model, which sends the nodes their layers (once; their weight
/// cache keeps them for the next load).
pub const ENGINE_START: Duration = Duration::from_secs(300);
/// How long Status waits for a running engine's own Status.
const STATUS_WAIT: Duration = Duration::from_secs(2);

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

impl Running {
    /// Why the engine is gone, naming the node when a tunnel saw it go.
    fn loss(&self) -> String {
        loss(&self.tunnels)
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
        let (read_end, write_end) = std::io::pipe().map_err(SplitError::Pipe)?;
        let exe = std::env::current_exe().map_err(SplitError::Exe)?;
        let m = &self.model;
        let flags = EngineFlags {
            socket: socket.clone(),
            tier: self.tier.as_str().to_owned(),
            model: m.path.clone(),
            context: m.context,
            threads: m.threads,
            batch: m.batch,
            max_tokens_limit: self.max_tokens_limit,
            nodes: m.split.clone(),
            split_local: m.split_local,
            state_dir: self.run_dir.join(format!("{}-state", self.tier)),
            allow_shared_loopback: self.allow_shared_loopback,
        };
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("split-engine").args(flags.to_args());
        let (theirs_fd, ready_fd) = (theirs.as_raw_fd(), write_end.as_raw_fd());
        cmd.env("REVIS_READY_FD", ready_fd.to_string())
            .env(TUNNELS_FD, theirs_fd.to_string())
            .stdout(std::io::stderr())
            .stderr(std::io::stderr());
        // `theirs` and `write_end` stay open until spawn returns.
        private_net::pass_to_child(&mut cmd, &[theirs_fd, ready_fd]);
        crate::remote::child::die_with_parent(&mut cmd);
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
            let mut f = read_end;
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
        if let Some(why) = said.strip_prefix(crate::remote::lend::REFUSED) {
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
