//! Server mode's shared state as plain data, below every other room of
//! server mode: whether it listens, the pairing window open, the paired
//! connections open and those still in their handshake. `Remote` holds it
//! behind a lock; the rooms that change it (`conn.rs`, `pairing.rs`,
//! `accept.rs`) and the switch (`mod.rs`) all read it from here.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use revis_trust::{Advertiser, DeviceId, PairingWindow};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub(super) struct State {
    pub(super) listening: Option<Listening>,
    pub(super) window: Option<OpenWindow>,
    pub(super) conns: HashMap<u64, Conn>,
    /// Connections still in their TLS handshake or pairing, in all and by
    /// peer address (see [`Unsettled`](super::conn::Unsettled)).
    pub(super) unsettled: usize,
    pub(super) unsettled_from: HashMap<IpAddr, usize>,
    pub(super) next_id: u64,
    /// Each paired device's calls in progress, across all its connections
    /// (`transport::peer::CALLS_PER_DEVICE` places each).
    pub(super) device_calls: HashMap<revis_trust::DeviceId, std::sync::Arc<tokio::sync::Semaphore>>,
}

pub(super) struct Listening {
    pub(super) addr: SocketAddr,
    pub(super) stop: CancellationToken,
    pub(super) advertiser: Option<Advertiser>,
    /// Owns the listening socket: once it has ended, the port is closed.
    pub(super) accept: JoinHandle<()>,
    pub(super) server: JoinHandle<()>,
}

/// An open paired connection, gRPC or lending.
pub(super) struct Conn {
    pub(super) device: DeviceId,
    pub(super) cut: CancellationToken,
    /// A lending session (else gRPC).
    pub(super) lending: bool,
}

/// What happened to a pairing window, for whoever shows its code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PairingOutcome {
    Paired { device_id: DeviceId, name: String },
    Closed(String),
}

/// The pairing window now open, and where its outcome goes.
pub(super) struct OpenWindow {
    pub(super) id: u64,
    pub(super) window: Arc<PairingWindow>,
    pub(super) events: mpsc::UnboundedSender<PairingOutcome>,
}
