//! Who is on the other end of a call. A connection that came in over the
//! network carries a [`Peer`] as a request extension (server mode fills it
//! in, `remote/conn.rs`); one on the local socket carries none. Admission
//! and the handlers read it from here, so they need not know server mode.

use std::net::SocketAddr;
use std::sync::Arc;

use revis_trust::DeviceId;
use tonic::Request;

use crate::error::DaemonError;

/// Calls one paired device may have in progress at once, across all its
/// connections (a Generate until its stream ends). More wait, unread and
/// holding no place in the queue (`admission.rs`), so opening more
/// connections gains a device nothing.
pub const CALLS_PER_DEVICE: usize = 4;

/// Who is calling over the network: set on every request that came in over
/// mutual TLS (absent on the local socket).
#[derive(Clone, Debug)]
pub struct Peer {
    pub device_id: DeviceId,
    pub addr: SocketAddr,
    /// The device's share of the queue, shared by all its connections:
    /// [`CALLS_PER_DEVICE`] places, taken in `admission.rs` before a place
    /// in the queue.
    pub calls: Arc<tokio::sync::Semaphore>,
}

impl Peer {
    /// A device's places ([`CALLS_PER_DEVICE`]), made once per device and
    /// shared by its connections.
    pub fn device_places() -> Arc<tokio::sync::Semaphore> {
        Arc::new(tokio::sync::Semaphore::new(CALLS_PER_DEVICE))
    }
}

/// Whether a call came in over the network from a paired device.
pub fn is_remote<T>(req: &Request<T>) -> bool {
    req.extensions().get::<Peer>().is_some()
}

/// The Admin calls a paired device may make over the network: Status only.
pub fn local_only<T>(req: &Request<T>, call: &'static str) -> Result<(), DaemonError> {
    match req.extensions().get::<Peer>() {
        None => Ok(()),
        Some(_) => Err(DaemonError::LocalOnly { call }),
    }
}
