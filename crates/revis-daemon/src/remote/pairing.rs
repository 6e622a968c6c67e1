//! Pairing windows: opening one (its code shown by whoever asked),
//! closing it, and running each pairing attempt that arrives on server
//! mode's port against it (the protocol is `revis_trust::pairing`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use revis_trust::{MAX_ATTEMPTS, PairingWindow};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

use super::state::{OpenWindow, PairingOutcome};
use super::{PAIRING_TIMEOUT, Remote, RemoteError};

impl Remote {
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

    /// so the peer hears "no window" rather than a dropped connection).
    pub(super) async fn pair(&self, mut tls: TlsStream<TcpStream>, addr: SocketAddr) {
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
