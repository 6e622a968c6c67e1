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
//!
//! The room: the switch, the devices and revoking here; the server's state
//! as plain data in `state.rs`; listening, the accept loop and the three
//! protocols in `accept.rs`; connection accounting (the open and the
//! unsettled connections, cutting them) in `conn.rs`; pairing windows in
//! `pairing.rs`. Beside it, the rest of the multi-machine family, each of
//! which crosses to another machine: `lend.rs` (this machine's CPU for a
//! paired device's model), `split/` (a tier run across paired nodes), and
//! `child.rs` (the child processes both start, ended with revisd). Server
//! mode fills in the transport's neutral
//! [`Peer`](crate::transport::peer::Peer) on every call it carries; the
//! transport (`crate::transport`) knows nothing of this room.

mod accept;
pub mod child;
mod conn;
pub mod lend;
mod pairing;
pub mod private_net;
pub mod split;
mod state;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use revis_trust::{DeviceId, Identity, PairedDevice, TrustError, TrustSet, TrustStore};
use tonic::service::Routes;

use self::lend::{LendError, Lender};
pub use self::state::PairingOutcome;
use self::state::State;
use crate::config::ServerConfig;

/// A TLS handshake (pairing or not) must finish within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A pairing exchange must finish within this once its handshake is done.
pub const PAIRING_TIMEOUT: Duration = Duration::from_secs(20);
/// TCP keepalive probes sent before the kernel gives a silent peer up.
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;
/// The file that remembers the server-mode switch.
const SWITCH_FILE: &str = "server-mode";
/// Handshakes (and pairings) at once from one peer address: a stranger's
/// idle connections cannot take every slot.
pub const HANDSHAKES_PER_ADDRESS: usize = 8;

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
    /// A call on a connection whose device was revoked since it opened.
    #[error("device {0} is no longer paired with this revisd")]
    NoLongerPaired(DeviceId),
    /// A call on a server-mode connection with no paired device.
    #[error("no paired device on this connection")]
    NoPeer,
}

/// Server mode's errors as a caller sees them (the daemon's own errors map
/// in `error.rs`).
impl From<RemoteError> for tonic::Status {
    fn from(e: RemoteError) -> tonic::Status {
        use tonic::Status;
        let msg = e.to_string();
        match e {
            RemoteError::Off => Status::failed_precondition(msg),
            RemoteError::UnknownDevice(_) => Status::not_found(msg),
            RemoteError::Trust(TrustError::InvalidName(_) | TrustError::InvalidDeviceId(_)) => Status::invalid_argument(msg),
            RemoteError::Listen { .. } => Status::failed_precondition(msg),
            RemoteError::Trust(_) | RemoteError::Switch { .. } | RemoteError::Lend(_) => Status::internal(msg),
            RemoteError::NoLongerPaired(_) | RemoteError::NoPeer => Status::unauthenticated(msg),
        }
    }
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
    /// Why lending cannot serve here although it is on (no private
    /// loopback for the RPC worker, and a shared one not allowed).
    pub lending_refused: Option<String>,
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
        let lender =
            Lender::new(config.state_dir.clone(), config.lend, cores, config.lend_memory, config.rpc_cache, config.allow_shared_loopback);
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
            lending_refused: self.lender.refusal().filter(|_| self.lender.is_on()),
        }
    }

    /// With lending on, starts the RPC worker now, off the runtime, so that
    /// a refusal (no private loopback) shows in status from the start
    /// rather than at a paired device's first session.
    pub fn check_lending(self: &Arc<Self>) {
        if !self.lender.is_on() {
            return;
        }
        let this = self.clone();
        let _ = std::thread::Builder::new().name("revis-lend-check".into()).spawn(move || {
            if let Err(e) = this.lender.check() {
                tracing::warn!("{e}");
            }
        });
    }

    /// Switches lending on or off (saved for the next start when
    /// `remember`); off ends the RPC worker and cuts every lending session.
    pub fn set_lending(&self, on: bool, remember: bool) -> Result<ServerState, RemoteError> {
        // Switched on, the worker starts at once: `revisd lend on` then says
        // whether lending can serve here, not a paired device's first session.
        let set = || {
            self.lender.set(on, remember)?;
            if on && let Err(e) = self.lender.check() {
                tracing::warn!("{e}");
            }
            Ok::<(), LendError>(())
        };
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
