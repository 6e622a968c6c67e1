//! Server mode: switch it, open a pairing window for other devices and
//! follow it, list and revoke the devices paired with this machine.

use std::time::{Duration, Instant};

use super::Io;
use crate::protocol::{Event, PairingEvent};

impl Io {
    pub(super) fn devices(&self) {
        let Some(c) = self.client.clone() else { return };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            match c.list_devices().await {
                Ok(d) => sink.send(Event::Devices(d)),
                Err(e) => sink.error("listing paired devices", e.words()),
            }
        });
    }

    pub(super) fn server_mode(&self, on: bool) {
        let Some(c) = self.client.clone() else { return self.sink.error("switching server mode", "not connected to revisd") };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            match c.set_server_mode(on).await {
                Ok(m) => sink.send(Event::ServerMode(m)),
                Err(e) => sink.error(if on { "turning server mode on" } else { "turning server mode off" }, e.words()),
            }
            if let Ok(s) = c.status().await {
                sink.send(Event::Status(Box::new(s)));
            }
        });
    }

    pub(super) fn open_pairing(&mut self) {
        let Some(c) = self.client.clone() else { return self.sink.error("opening pairing", "not connected to revisd") };
        if let Some(p) = self.pairing.take() {
            p.abort();
        }
        let sink = self.sink.clone();
        let task = tokio::spawn(async move {
            let mut events = match c.open_pairing(0).await {
                Ok(events) => events,
                Err(e) => return sink.error("opening pairing", e.words()),
            };
            loop {
                let ev = match events.next().await {
                    Ok(Some(e)) => match e {
                        revis_client::PairingEvent::Opened { code, expires_in_s, listen_address, device_id } => PairingEvent::Opened {
                            code,
                            expires_at: Instant::now() + Duration::from_secs(expires_in_s.into()),
                            listen_address,
                            device_id,
                        },
                        revis_client::PairingEvent::Paired { name, device_id } => PairingEvent::Paired { name, device_id },
                        revis_client::PairingEvent::Closed { reason } => PairingEvent::Closed { reason },
                    },
                    Ok(None) => PairingEvent::Closed { reason: "revisd closed the window".into() },
                    Err(e) => PairingEvent::Closed { reason: e.words() },
                };
                let end = !matches!(ev, PairingEvent::Opened { .. });
                sink.send(Event::Pairing(ev));
                if end {
                    break;
                }
            }
            if let Ok(d) = c.list_devices().await {
                sink.send(Event::Devices(d));
            }
        });
        self.pairing = Some(task.abort_handle());
    }

    pub(super) fn close_pairing(&mut self) {
        if let Some(p) = self.pairing.take() {
            p.abort();
            self.sink.send(Event::Pairing(PairingEvent::Closed { reason: "closed here".into() }));
        }
    }

    pub(super) fn revoke(&self, device: String) {
        let Some(c) = self.client.clone() else { return };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            if let Err(e) = c.revoke_device(&device).await {
                sink.error("revoking a device", e.words());
            }
            match c.list_devices().await {
                Ok(d) => sink.send(Event::Devices(d)),
                Err(e) => sink.error("listing paired devices", e.words()),
            }
        });
    }
}
