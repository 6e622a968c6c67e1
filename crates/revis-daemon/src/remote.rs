//! Server mode: the daemon's TCP side. Mutual TLS only (there is no plain
//! TCP path), pairing on the same port, the mDNS advertisement, and the
//! open connections, which a revoke or switching server mode off cuts.
//!
//! One port serves three protocols, told apart by ALPN before the handshake
//! finishes: `h2` is gRPC for paired devices (client certificate pinned to
//! the trust set), `revis-pair/1` is a pairing attempt (any certificate whose
//! key signs the handshake; the code decides), `revis-rpc/1` is a lending
//! session (paired devices only, while lending is on: spliced to the RPC
//! worker on 127.0.0.1, see `lend.rs`). TLS is terminated here with
//! tokio-rustls and the connections are handed to tonic through
//! `serve_with_incoming`, because tonic's own TLS cannot take a custom
//! verifier.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use revis_trust::{
    ALPN_PAIRING, ALPN_RPC, Advertisement, Advertiser, DeviceId, Identity, Interfaces, MAX_ATTEMPTS, PairedDevice, PairingWindow,
    TrustError, TrustSet, TrustStore,
};
use rustls::server::Acceptor;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::Connected;
use tonic::{Request, Status};

use crate::config::ServerConfig;
use crate::lend::{LendError, Lender};

/// A TLS handshake (pairing or not) must finish within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A pairing exchange must finish within this once its handshake is done.
pub const PAIRING_TIMEOUT: Duration = Duration::from_secs(20);
/// TCP keepalive probes sent before the kernel gives a silent peer up.
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;
/// Calls one paired connection may have in progress at once (a Generate
/// until its stream ends). More wait on that connection, unread and holding
/// no place in the queue (`admission.rs`), so one device cannot take every
/// place and have this machine's own user refused.
pub const CALLS_PER_CONNECTION: usize = 4;
/// The file that remembers the server-mode switch.
const SWITCH_FILE: &str = "server-mode";

/// Who is calling over the network: set on every request that came in over
/// mutual TLS (absent on the local socket).
#[derive(Clone, Debug)]
pub struct RemotePeer {
    pub device_id: DeviceId,
    pub addr: SocketAddr,
    /// This connection's share of the queue: [`CALLS_PER_CONNECTION`]
    /// places, taken in `admission.rs` before a place in the queue.
    pub calls: Arc<tokio::sync::Semaphore>,
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("server mode: {0}")]
    Trust(#[from] TrustError),
    #[error("server mode cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: io::Error },
    #[error("server mode cannot remember its switch in {path}: {source}")]
    Switch { path: PathBuf, source: io::Error },
    #[error("server mode is off; turn it on first (`revisd server on`), then open pairing")]
    Off,
    #[error("no paired device is called or has the ID {0:?}; `revisd devices` lists them")]
    UnknownDevice(String),
    #[error(transparent)]
    Lend(#[from] LendError),
}

impl From<RemoteError> for Status {
    fn from(e: RemoteError) -> Status {
        let msg = e.to_string();
        match e {
            RemoteError::Off => Status::failed_precondition(msg),
            RemoteError::UnknownDevice(_) => Status::not_found(msg),
            RemoteError::Trust(TrustError::InvalidName(_) | TrustError::InvalidDeviceId(_)) => Status::invalid_argument(msg),
            RemoteError::Listen { .. } => Status::failed_precondition(msg),
            RemoteError::Trust(_) | RemoteError::Switch { .. } | RemoteError::Lend(_) => Status::internal(msg),
        }
    }
}

/// What happened to a pairing window, for whoever shows its code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PairingOutcome {
    Paired { device_id: DeviceId, name: String },
    Closed(String),
}

/// Server mode now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerState {
    pub enabled: bool,
    pub listen: Option<SocketAddr>,
    pub advertised: bool,
    pub connections: usize,
    pub paired: usize,
    pub pairing_open: bool,
    pub lending: bool,
    pub lending_sessions: usize,
}

/// A paired device and its open connections.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub device: PairedDevice,
    pub connections: usize,
}

/// The daemon's side of server mode. Created at start (loading or creating
/// the identity), switched on and off at any time.
pub struct Remote {
    config: ServerConfig,
    identity: Identity,
    store: Mutex<TrustStore>,
    trusted: TrustSet,
    rpc_tls: Arc<rustls::ServerConfig>,
    pairing_tls: Arc<rustls::ServerConfig>,
    lend_tls: Arc<rustls::ServerConfig>,
    /// The lending switch and the RPC worker.
    lender: Lender,
    /// The gRPC services, set once by the server before the first switch-on.
    routes: OnceLock<Routes>,
    tiers: Vec<String>,
    state: Mutex<State>,
    /// Switching on and off one at a time.
    switch: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    listening: Option<Listening>,
    window: Option<OpenWindow>,
    conns: HashMap<u64, Conn>,
    /// Connections still in their TLS handshake or pairing, in all and by
    /// peer address (see [`Unsettled`]).
    unsettled: usize,
    unsettled_from: HashMap<IpAddr, usize>,
    next_id: u64,
}

struct Listening {
    addr: SocketAddr,
    stop: CancellationToken,
    advertiser: Option<Advertiser>,
    /// Owns the listening socket: once it has ended, the port is closed.
    accept: JoinHandle<()>,
    server: JoinHandle<()>,
}

struct OpenWindow {
    id: u64,
    window: Arc<PairingWindow>,
    events: mpsc::UnboundedSender<PairingOutcome>,
}

struct Conn {
    device: DeviceId,
    cut: CancellationToken,
    /// A lending session (else gRPC).
    lending: bool,
}

impl Remote {
    /// Loads (or creates) the identity and the paired devices in the
    /// configured state directory.
    pub fn new(config: ServerConfig, tiers: Vec<String>) -> Result<Arc<Remote>, RemoteError> {
        let identity = Identity::load_or_create(&config.state_dir)?;
        let store = TrustStore::open(&config.state_dir)?;
        let trusted = store.trust_set();
        let rpc_tls = revis_trust::server_config(&identity, trusted.clone())?;
        let pairing_tls = revis_trust::pairing_server_config(&identity)?;
        let lend_tls = revis_trust::lend_server_config(&identity, trusted.clone())?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let lender = Lender::new(config.state_dir.clone(), config.lend, cores);
        Ok(Arc::new(Remote {
            lend_tls,
            lender,
            config,
            identity,
            store: Mutex::new(store),
            trusted,
            rpc_tls,
            pairing_tls,
            routes: OnceLock::new(),
            tiers,
            state: Mutex::new(State::default()),
            switch: tokio::sync::Mutex::new(()),
        }))
    }

    /// The services paired devices may call (set once).
    pub fn set_routes(&self, routes: Routes) {
        let _ = self.routes.set(routes);
    }

    pub fn device_id(&self) -> DeviceId {
        self.identity.device_id()
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn store(&self) -> std::sync::MutexGuard<'_, TrustStore> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the switch was left: the config's `server.enabled` when set,
    /// else the saved position, else off.
    pub fn initial_switch(&self) -> bool {
        if let Some(on) = self.config.enabled {
            return on;
        }
        std::fs::read_to_string(self.config.state_dir.join(SWITCH_FILE)).is_ok_and(|s| s.trim() == "on")
    }

    fn save_switch(&self, on: bool) -> Result<(), RemoteError> {
        let path = self.config.state_dir.join(SWITCH_FILE);
        std::fs::write(&path, if on { "on\n" } else { "off\n" }).map_err(|source| RemoteError::Switch { path, source })
    }

    /// Turns server mode on or off (a no-op when it already is); `remember`
    /// saves the position for the next start.
    pub async fn set_enabled(self: &Arc<Self>, on: bool, remember: bool) -> Result<ServerState, RemoteError> {
        let _one = self.switch.lock().await;
        let running = self.lock().listening.is_some();
        match (on, running) {
            (true, false) => self.start().await?,
            (false, true) => self.stop().await,
            _ => {}
        }
        if remember {
            self.save_switch(on)?;
        }
        Ok(self.state())
    }

    async fn start(self: &Arc<Self>) -> Result<(), RemoteError> {
        let want = self.config.listen;
        let listener = TcpListener::bind(want).await.map_err(|source| RemoteError::Listen { addr: want, source })?;
        let addr = listener.local_addr().map_err(|source| RemoteError::Listen { addr: want, source })?;
        let advertiser = if self.config.advertise {
            let ad = Advertisement {
                name: self.config.name.clone(),
                device_id: self.device_id(),
                port: addr.port(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                tiers: self.tiers.clone(),
            };
            let interfaces =
                if self.config.interfaces.is_empty() { Interfaces::AllLan } else { Interfaces::Named(self.config.interfaces.clone()) };
            Some(Advertiser::start(&ad, &interfaces)?)
        } else {
            None
        };
        let stop = CancellationToken::new();
        let (tx, rx) = mpsc::channel::<io::Result<RemoteIo>>(16);
        let accept = tokio::spawn(self.clone().accept_loop(listener, stop.clone(), tx));
        let routes = self.routes.get().cloned().expect("routes are set before server mode starts");
        let trusted = self.trusted.clone();
        let (ping_interval, ping_timeout) = http2_keepalive(self.config.peer_timeout);
        let serve = Server::builder()
            .max_concurrent_streams(crate::admission::MAX_CONCURRENT_STREAMS)
            .http2_keepalive_interval(Some(ping_interval))
            .http2_keepalive_timeout(Some(ping_timeout))
            .layer(tonic::service::InterceptorLayer::new(still_paired(trusted)))
            .add_routes(routes)
            .serve_with_incoming_shutdown(ReceiverStream::new(rx), stop.clone().cancelled_owned());
        let server = tokio::spawn(async move {
            if let Err(e) = serve.await {
                tracing::error!("server mode stopped: {e}");
            }
        });
        tracing::info!(%addr, advertised = advertiser.is_some(), device_id = %self.device_id(), "server mode on");
        self.lock().listening = Some(Listening { addr, stop, advertiser, accept, server });
        Ok(())
    }

    async fn stop(&self) {
        let (listening, window) = {
            let mut state = self.lock();
            (state.listening.take(), state.window.take())
        };
        if let Some(w) = window {
            w.window.close();
            let _ = w.events.send(PairingOutcome::Closed("server mode was turned off".into()));
        }
        let Some(l) = listening else { return };
        // Withdraw first, so browsers stop listing a node that is leaving.
        if let Some(ad) = l.advertiser {
            match tokio::task::spawn_blocking(move || ad.withdraw()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("withdrawing the mDNS advertisement: {e}"),
                Err(e) => tracing::warn!("withdrawing the mDNS advertisement: {e}"),
            }
        }
        // Cancelling stops the accept loop and cuts every open connection
        // (their tokens are children of this one), so the server's graceful
        // shutdown has nothing left to wait for.
        l.stop.cancel();
        // The port is closed when this returns: the accept loop owns the listener.
        if let Err(e) = l.accept.await {
            tracing::warn!("server mode: the accept loop ended badly: {e}");
        }
        if tokio::time::timeout(Duration::from_secs(3), l.server).await.is_err() {
            tracing::warn!("server mode: connections still closing after 3s");
        }
        tracing::info!("server mode off");
    }

    /// Server mode now.
    pub fn state(&self) -> ServerState {
        let paired = self.store().devices().len();
        let state = self.lock();
        ServerState {
            enabled: state.listening.is_some(),
            listen: state.listening.as_ref().map(|l| l.addr),
            advertised: state.listening.as_ref().is_some_and(|l| l.advertiser.is_some()),
            connections: state.conns.len(),
            paired,
            pairing_open: state.window.as_ref().is_some_and(|w| w.window.is_open(Instant::now())),
            lending: self.lender.is_on(),
            lending_sessions: state.conns.values().filter(|c| c.lending).count(),
        }
    }

    /// Switches lending on or off (saved for the next start when
    /// `remember`); off ends the RPC worker and cuts every lending session.
    pub fn set_lending(&self, on: bool, remember: bool) -> Result<ServerState, RemoteError> {
        let set = || self.lender.set(on, remember);
        let on_workers =
            tokio::runtime::Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if on_workers {
            tokio::task::block_in_place(set)?
        } else {
            set()?
        };
        if !on {
            let mut state = self.lock();
            let ids: Vec<u64> = state.conns.iter().filter(|(_, c)| c.lending).map(|(id, _)| *id).collect();
            for id in ids {
                if let Some(c) = state.conns.remove(&id) {
                    c.cut.cancel();
                }
            }
        }
        Ok(self.state())
    }

    /// The paired devices, with their open connections.
    pub fn devices(&self) -> Vec<DeviceInfo> {
        let devices = self.store().devices().to_vec();
        let state = self.lock();
        devices
            .into_iter()
            .map(|device| {
                let connections = state.conns.values().filter(|c| c.device == device.device_id).count();
                DeviceInfo { device, connections }
            })
            .collect()
    }

    /// Unpairs the device a person named (device ID or name) and cuts its
    /// connections; returns it and how many were cut.
    /// The trust file is written (temp file, fsync, rename, directory
    /// fsync) with the async worker handed over to the runtime's other
    /// threads meanwhile (`block_in_place`), so no other call waits on the disk.
    pub fn revoke(&self, what: &str) -> Result<(DeviceInfo, usize), RemoteError> {
        let write = || -> Result<PairedDevice, RemoteError> {
            let mut store = self.store();
            let device = store.find(what)?.cloned().ok_or_else(|| RemoteError::UnknownDevice(what.to_owned()))?;
            // All or nothing: the file is written first; a failed write
            // leaves the device paired, its connections open, and is the error.
            store.revoke(&device.device_id)?;
            Ok(device)
        };
        let on_workers =
            tokio::runtime::Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let device = if on_workers { tokio::task::block_in_place(write)? } else { write()? };
        let cut = {
            let mut state = self.lock();
            let ids: Vec<u64> = state.conns.iter().filter(|(_, c)| c.device == device.device_id).map(|(id, _)| *id).collect();
            for id in &ids {
                if let Some(c) = state.conns.remove(id) {
                    c.cut.cancel();
                }
            }
            ids.len()
        };
        tracing::info!(device_id = %device.device_id, name = %device.name, cut, "device revoked");
        Ok((DeviceInfo { device, connections: 0 }, cut))
    }

    /// Opens a pairing window (replacing one already open) and returns its
    /// code, its deadline and where its outcome will be sent. The window
    /// stays open until it is used, [`MAX_ATTEMPTS`] codes were wrong, it expires, or
    /// [`Remote::close_window`] is called with its id.
    pub fn open_window(
        &self,
        duration: Option<Duration>,
    ) -> Result<(u64, Arc<PairingWindow>, mpsc::UnboundedReceiver<PairingOutcome>), RemoteError> {
        let mut state = self.lock();
        if state.listening.is_none() {
            return Err(RemoteError::Off);
        }
        let window = Arc::new(PairingWindow::open(Instant::now(), duration.unwrap_or(self.config.pairing_window)));
        let (events, rx) = mpsc::unbounded_channel();
        state.next_id += 1;
        let id = state.next_id;
        if let Some(old) = state.window.replace(OpenWindow { id, window: window.clone(), events }) {
            old.window.close();
            let _ = old.events.send(PairingOutcome::Closed("a newer pairing window replaced this one".into()));
        }
        tracing::info!(expires_in_s = window.deadline().saturating_duration_since(Instant::now()).as_secs(), "pairing window open");
        Ok((id, window, rx))
    }

    /// Closes window `id` if it is still the open one: its code no longer
    /// pairs, not even on a connection that started before.
    pub fn close_window(&self, id: u64) {
        let mut state = self.lock();
        if let Some(w) = state.window.take_if(|w| w.id == id) {
            w.window.close();
            tracing::info!("pairing window closed");
        }
    }

    /// Accepts TCP connections until `stop`, handshaking each on a task of
    /// its own so a slow peer holds up nobody else.
    async fn accept_loop(self: Arc<Self>, listener: TcpListener, stop: CancellationToken, tx: mpsc::Sender<io::Result<RemoteIo>>) {
        loop {
            let (tcp, addr) = tokio::select! {
                () = stop.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors and the like: say so, back off, go on.
                        tracing::warn!("server mode: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            if let Err(e) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&tcp_keepalive(self.config.peer_timeout)) {
                tracing::warn!(%addr, "server mode: cannot set TCP keepalive: {e}");
            }
            let unsettled = match Unsettled::take(&self, addr.ip()) {
                Ok(u) => u,
                Err(why) => {
                    tracing::warn!(%addr, limit = self.config.max_connections, "refusing a connection: {why}");
                    continue;
                }
            };
            let this = self.clone();
            let cut = stop.child_token();
            let tx = tx.clone();
            tokio::spawn(async move {
                // Server mode going off ends handshakes and pairings too.
                let handshake = tokio::select! {
                    () = cut.cancelled() => return,
                    r = tokio::time::timeout(HANDSHAKE_TIMEOUT, this.handshake(tcp)) => r,
                };
                match handshake {
                    Err(_) => {
                        drop(unsettled);
                        tracing::info!(%addr, "TLS handshake timed out");
                    }
                    Ok(Err(e)) => {
                        drop(unsettled);
                        tracing::info!(%addr, "TLS handshake refused: {e}");
                    }
                    Ok(Ok(Handshaken::Pairing(tls))) => {
                        tokio::select! {
                            () = cut.cancelled() => {}
                            () = this.pair(*tls, addr) => {}
                        }
                    }
                    Ok(Ok(Handshaken::Lend(tls))) => {
                        this.lend(*tls, addr, cut, unsettled).await;
                    }
                    Ok(Ok(Handshaken::Rpc(tls))) => {
                        if let Some(io) = this.register(*tls, addr, cut) {
                            drop(unsettled);
                            let _ = tx.send(Ok(io)).await;
                        }
                    }
                }
            });
        }
    }

    async fn handshake(&self, tcp: TcpStream) -> io::Result<Handshaken> {
        let _ = tcp.set_nodelay(true);
        let start = LazyConfigAcceptor::new(Acceptor::default(), tcp).await?;
        let offers = |alpn: &[u8]| start.client_hello().alpn().is_some_and(|mut a| a.any(|p| p == alpn));
        let (pairing, lending) = (offers(ALPN_PAIRING), offers(ALPN_RPC));
        Ok(if pairing {
            Handshaken::Pairing(Box::new(start.into_stream(self.pairing_tls.clone()).await?))
        } else if lending {
            Handshaken::Lend(Box::new(start.into_stream(self.lend_tls.clone()).await?))
        } else {
            Handshaken::Rpc(Box::new(start.into_stream(self.rpc_tls.clone()).await?))
        })
    }

    /// Records a paired device's new connection; None if it was revoked
    /// between its handshake and now.
    fn register(self: &Arc<Self>, tls: TlsStream<TcpStream>, addr: SocketAddr, cut: CancellationToken) -> Option<RemoteIo> {
        let device_id = revis_trust::peer_device_id(tls.get_ref().1)?;
        let id = {
            let mut state = self.lock();
            if !self.trusted.contains(&device_id) {
                return None;
            }
            state.next_id += 1;
            let id = state.next_id;
            state.conns.insert(id, Conn { device: device_id, cut: cut.clone(), lending: false });
            id
        };
        // The file is rewritten at most once a minute per device, not on
        // every connection: "last seen" is for people, to the minute.
        let now = SystemTime::now();
        let stale = |d: &revis_trust::PairedDevice| {
            d.last_seen.is_none_or(|t| now.duration_since(std::time::UNIX_EPOCH).map_or(true, |n| n.as_secs() >= t + 60))
        };
        let mut store = self.store();
        if store.get(&device_id).is_some_and(stale)
            && let Err(e) = store.mark_seen(&device_id, now)
        {
            tracing::warn!("recording when {device_id} was last seen: {e}");
        }
        drop(store);
        tracing::info!(%addr, %device_id, "paired device connected");
        Some(RemoteIo {
            tls,
            peer: RemotePeer { device_id, addr, calls: Arc::new(tokio::sync::Semaphore::new(CALLS_PER_CONNECTION)) },
            cut: Box::pin(cut.cancelled_owned()),
            _guard: ConnGuard { remote: Arc::downgrade(self), id },
        })
    }

    /// Runs one lending session: a paired device's llama.cpp RPC client,
    /// spliced to the RPC worker until either side closes, lending goes
    /// off, the device is revoked, or server mode goes off.
    async fn lend(self: &Arc<Self>, mut tls: TlsStream<TcpStream>, addr: SocketAddr, cut: CancellationToken, unsettled: Unsettled) {
        let Some(device_id) = revis_trust::peer_device_id(tls.get_ref().1) else { return };
        let this = self.clone();
        let worker = match tokio::task::spawn_blocking(move || this.lender.worker()).await {
            Ok(Ok(w)) => w,
            Ok(Err(e)) => {
                tracing::info!(%addr, %device_id, "refusing a lending session: {e}");
                return;
            }
            Err(_) => return,
        };
        let id = {
            let mut state = self.lock();
            if !self.trusted.contains(&device_id) || !self.lender.is_on() {
                return;
            }
            state.next_id += 1;
            let id = state.next_id;
            state.conns.insert(id, Conn { device: device_id, cut: cut.clone(), lending: true });
            id
        };
        let _guard = ConnGuard { remote: Arc::downgrade(self), id };
        drop(unsettled);
        let mut upstream = match TcpStream::connect(worker).await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(%addr, %device_id, "lending: the RPC worker at {worker} refused: {e}");
                return;
            }
        };
        let _ = upstream.set_nodelay(true);
        tracing::info!(%addr, %device_id, "lending session open");
        tokio::select! {
            () = cut.cancelled() => tracing::info!(%addr, %device_id, "lending session cut"),
            r = tokio::io::copy_bidirectional_with_sizes(&mut tls, &mut upstream, LEND_BUFFER, LEND_BUFFER) => match r {
                Ok((up, down)) => tracing::info!(%addr, %device_id, up, down, "lending session closed"),
                Err(e) => tracing::info!(%addr, %device_id, "lending session ended: {e}"),
            },
        }
    }

    /// Runs one pairing attempt against the open window (or a closed one,
    /// so the peer hears "no window" rather than a dropped connection).
    async fn pair(&self, mut tls: TlsStream<TcpStream>, addr: SocketAddr) {
        let now = Instant::now();
        let (id, window) = match self.lock().window.as_ref() {
            Some(w) => (Some(w.id), w.window.clone()),
            None => (None, Arc::new(PairingWindow::open(now, Duration::ZERO))),
        };
        let local = self.device_id();
        let result =
            tokio::time::timeout(PAIRING_TIMEOUT, revis_trust::pair_server(&mut tls, local, &window, addr.ip(), &self.store, now)).await;
        let outcome = match result {
            Ok(Ok(device_id)) => {
                let name = self.store().get(&device_id).map(|d| d.name.clone()).unwrap_or_default();
                tracing::info!(%addr, %device_id, %name, "paired");
                Some(PairingOutcome::Paired { device_id, name })
            }
            Ok(Err(e)) => {
                tracing::info!(%addr, "pairing refused: {e}");
                (window.failed_attempts() >= MAX_ATTEMPTS)
                    .then(|| PairingOutcome::Closed(format!("{MAX_ATTEMPTS} wrong codes were tried; nothing was paired")))
            }
            Err(_) => {
                tracing::info!(%addr, "pairing timed out after {}s", PAIRING_TIMEOUT.as_secs());
                (window.failed_attempts() >= MAX_ATTEMPTS)
                    .then(|| PairingOutcome::Closed(format!("{MAX_ATTEMPTS} wrong or abandoned attempts; nothing was paired")))
            }
        };
        if let (Some(id), Some(outcome)) = (id, outcome) {
            let mut state = self.lock();
            if state.window.as_ref().is_some_and(|w| w.id == id) {
                let w = state.window.take().expect("checked");
                let _ = w.events.send(outcome);
            }
        }
    }
}

/// The HTTP/2 keepalive of a paired connection (ping interval, ack
/// timeout) for `server.peer_timeout_ms` = T: a ping goes out once the peer
/// has sent nothing for T/2, and the connection is closed when the ping is
/// not acknowledged within T/2 more. So a peer that vanished (a laptop
/// asleep, off the network) is dropped at most T after its last frame and
/// its slot under `server.max_connections` comes free; a live peer, busy or
/// idle, acknowledges and stays.
pub fn http2_keepalive(peer_timeout: Duration) -> (Duration, Duration) {
    (peer_timeout / 2, peer_timeout / 2)
}

/// TCP keepalive on every accepted socket, for the time before HTTP/2 pings
/// run (a dead peer between its TLS handshake and its first HTTP/2 frame):
/// first probe after T/2 of silence, then every T/6, given up after
/// [`TCP_KEEPALIVE_RETRIES`] (the kernel counts in whole seconds, at least 1).
pub fn tcp_keepalive(peer_timeout: Duration) -> socket2::TcpKeepalive {
    let second = Duration::from_secs(1);
    socket2::TcpKeepalive::new()
        .with_time((peer_timeout / 2).max(second))
        .with_interval((peer_timeout / 6).max(second))
        .with_retries(TCP_KEEPALIVE_RETRIES)
}

/// Bytes buffered each way in a lending session (weights cross it at load).
const LEND_BUFFER: usize = 256 << 10;

enum Handshaken {
    Rpc(Box<TlsStream<TcpStream>>),
    Lend(Box<TlsStream<TcpStream>>),
    Pairing(Box<TlsStream<TcpStream>>),
}

/// Refuses a call whose device was revoked after its connection opened
/// (its connection is being cut; this closes the gap).
fn still_paired(trusted: TrustSet) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| match req.extensions().get::<RemotePeer>() {
        Some(p) if trusted.contains(&p.device_id) => Ok(req),
        Some(p) => Err(Status::unauthenticated(format!("device {} is no longer paired with this revisd", p.device_id))),
        None => Err(Status::unauthenticated("no paired device on this connection")),
    }
}

/// Takes a connection out of the open list when tonic drops it.
struct ConnGuard {
    remote: std::sync::Weak<Remote>,
    id: u64,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if let Some(r) = self.remote.upgrade() {
            r.lock().conns.remove(&self.id);
        }
    }
}

/// Handshakes (and pairings) at once from one peer address: a stranger's
/// idle connections cannot take every slot.
pub const HANDSHAKES_PER_ADDRESS: usize = 8;

/// A connection still in its TLS handshake or pairing (settled RPC
/// connections are in `conns`). At most `server.max_connections` of these
/// at once, and [`HANDSHAKES_PER_ADDRESS`] from one address.
struct Unsettled {
    remote: Arc<Remote>,
    ip: IpAddr,
}

impl Unsettled {
    /// Why not, when a limit is reached.
    fn take(remote: &Arc<Remote>, ip: IpAddr) -> Result<Unsettled, &'static str> {
        let max = remote.config.max_connections;
        let mut state = remote.lock();
        if state.conns.len() >= max {
            return Err("server.max_connections paired connections are open");
        }
        if state.unsettled >= max {
            return Err("server.max_connections connections are in their handshake");
        }
        let from = state.unsettled_from.entry(ip).or_default();
        if *from >= HANDSHAKES_PER_ADDRESS.min(max) {
            return Err("this address has as many handshakes open as it may");
        }
        *from += 1;
        state.unsettled += 1;
        Ok(Unsettled { remote: remote.clone(), ip })
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        let mut state = self.remote.lock();
        state.unsettled = state.unsettled.saturating_sub(1);
        if let Some(n) = state.unsettled_from.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                state.unsettled_from.remove(&self.ip);
            }
        }
    }
}

/// A paired device's TLS connection as tonic sees it. Once its token is
/// cancelled (revoked, or server mode off) every read and write fails, so
/// hyper closes the connection and the calls on it end.
pub struct RemoteIo {
    tls: TlsStream<TcpStream>,
    peer: RemotePeer,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    _guard: ConnGuard,
}

impl RemoteIo {
    fn check_cut(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.cut.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(io::ErrorKind::ConnectionAborted, "connection cut by revisd")),
            Poll::Pending => Ok(()),
        }
    }
}

impl Connected for RemoteIo {
    type ConnectInfo = RemotePeer;

    fn connect_info(&self) -> RemotePeer {
        self.peer.clone()
    }
}

impl AsyncRead for RemoteIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Err(e) = self.check_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for RemoteIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Err(e) = self.check_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        if let Err(e) = self.check_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.tls).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

/// Whether a call came in over the network from a paired device.
pub fn is_remote<T>(req: &Request<T>) -> bool {
    req.extensions().get::<RemotePeer>().is_some()
}

/// The Admin calls a paired device may make over the network: Status only.
pub fn local_only<T>(req: &Request<T>, call: &str) -> Result<(), Status> {
    match req.extensions().get::<RemotePeer>() {
        None => Ok(()),
        Some(_) => Err(Status::permission_denied(format!(
            "{call} is for the local socket only; paired devices may run tasks and read Status, nothing else"
        ))),
    }
}
