//! The Admin handlers: Status (the one call a paired device may make),
//! loading, unloading and purging models, and the server-mode controls
//! (the switch, lending, pairing, the paired devices), local socket only.

use std::time::Instant;

use revis_proto::v1 as pb;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::Daemon;
use crate::error::DaemonError;
use crate::remote::{DeviceInfo, PairingOutcome, ServerState};
use crate::transport::peer::{is_remote, local_only};
use crate::validate;

#[tonic::async_trait]
impl pb::admin_server::Admin for Daemon {
    async fn status(&self, req: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        // Paired devices see the tiers and the load, not this machine's
        // pairings, file paths or process ID.
        let remote = is_remote(&req);
        let server = (!remote).then(|| server_status(&self.remote.state()));
        let mut tiers = Vec::new();
        for (t, _) in self.registry.tiers() {
            tiers.push(self.tier_status_live(t, remote).await);
        }
        Ok(Response::new(pb::StatusResponse {
            memory_free_bytes: revis_engine::rpc::local_free_bytes(),
            device_id: self.remote.device_id().to_string(),
            name: self.remote.name().to_owned(),
            server,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            tiers,
            queue_depth: self.queue.len() as u32,
            queue_capacity: self.admission.capacity() as u32,
            rss_bytes: revis_engine::rss_bytes(),
            busy: self.queue.busy(),
            pid: if remote { 0 } else { std::process::id() },
            uptime_s: self.started.elapsed().as_secs(),
        }))
    }

    async fn load_model(&self, req: Request<pb::LoadModelRequest>) -> Result<Response<pb::LoadModelResponse>, Status> {
        local_only(&req, "LoadModel")?;
        let (tier, model) = validate::tier(&self.registry, &req.get_ref().tier)?;
        let t0 = Instant::now();
        match self.split_of(&req.get_ref().tier) {
            Some(engine) => drop(engine.channel().await?),
            None => drop(self.registry.load(model).await.map_err(DaemonError::from)?),
        }
        Ok(Response::new(pb::LoadModelResponse {
            tier: Some(self.tier_status_live(tier, false).await),
            elapsed_ms: t0.elapsed().as_millis() as u64,
        }))
    }

    async fn unload_model(&self, req: Request<pb::UnloadModelRequest>) -> Result<Response<pb::UnloadModelResponse>, Status> {
        local_only(&req, "UnloadModel")?;
        let (tier, model) = validate::tier(&self.registry, &req.get_ref().tier)?;
        let rss_before_bytes = revis_engine::rss_bytes();
        match self.split_of(&req.get_ref().tier) {
            Some(engine) => drop(engine.stop().await),
            None => drop(self.registry.unload(model).await.map_err(DaemonError::from)?),
        }
        Ok(Response::new(pb::UnloadModelResponse {
            tier: Some(self.tier_status(tier, false)),
            rss_before_bytes,
            rss_after_bytes: revis_engine::rss_bytes(),
        }))
    }

    async fn purge(&self, req: Request<pb::PurgeRequest>) -> Result<Response<pb::PurgeResponse>, Status> {
        local_only(&req, "Purge")?;
        // A split tier's caches are in its engine (one tier, or every one that runs).
        let tier = req.get_ref().tier.clone();
        let engines = match self.split_of(&tier) {
            Some(e) => vec![e],
            None if tier.is_empty() => self.splits.engines(),
            None => Vec::new(),
        };
        let (mut n, mut bytes) = (0, 0);
        for engine in &engines {
            if !engine.started() {
                continue;
            }
            let mut admin = pb::admin_client::AdminClient::new(engine.channel().await?);
            match admin.purge(pb::PurgeRequest { tier: tier.clone() }).await {
                Ok(r) => {
                    n += r.get_ref().dropped_prefixes;
                    bytes += r.get_ref().freed_bytes;
                }
                Err(s) => return Err(engine.translate(s).await.into()),
            }
        }
        if self.split_of(&tier).is_some() {
            return Ok(Response::new(pb::PurgeResponse { dropped_prefixes: n, freed_bytes: bytes }));
        }
        let key =
            if req.get_ref().tier.is_empty() { None } else { Some(validate::tier(&self.registry, &req.get_ref().tier)?.1.key.clone()) };
        let (here, here_bytes) = self.registry.engine().purge(key.as_deref()).await.map_err(DaemonError::from)?;
        Ok(Response::new(pb::PurgeResponse { dropped_prefixes: n + here, freed_bytes: bytes + here_bytes }))
    }

    async fn set_server_mode(&self, req: Request<pb::SetServerModeRequest>) -> Result<Response<pb::ServerModeStatus>, Status> {
        local_only(&req, "SetServerMode")?;
        self.open()?;
        let state = self.remote.set_enabled(req.get_ref().enabled, true).await?;
        Ok(Response::new(server_status(&state)))
    }

    async fn set_lending(&self, req: Request<pb::SetLendingRequest>) -> Result<Response<pb::ServerModeStatus>, Status> {
        local_only(&req, "SetLending")?;
        self.open()?;
        let state = self.remote.set_lending(req.get_ref().enabled, true)?;
        Ok(Response::new(server_status(&state)))
    }

    type OpenPairingStream = tokio_stream::wrappers::ReceiverStream<Result<pb::PairingEvent, Status>>;

    async fn open_pairing(&self, req: Request<pb::OpenPairingRequest>) -> Result<Response<Self::OpenPairingStream>, Status> {
        local_only(&req, "OpenPairing")?;
        self.open()?;
        let window_s = req.get_ref().window_s;
        if window_s > 600 {
            return Err(DaemonError::Invalid(format!("window_s is {window_s}; a pairing window is open for at most 600 s")).into());
        }
        let duration = (window_s > 0).then(|| std::time::Duration::from_secs(window_s.into()));
        let (id, window, mut outcomes) = self.remote.open_window(duration)?;
        let state = self.remote.state();
        let opened = pb::PairingOpened {
            code: window.code().to_string(),
            expires_in_s: window.deadline().saturating_duration_since(Instant::now()).as_secs() as u32,
            listen_address: state.listen.map(|a| a.to_string()).unwrap_or_default(),
            device_id: self.remote.device_id().to_string(),
        };
        let (tx, rx) = mpsc::channel(4);
        let remote = self.remote.clone();
        tokio::spawn(async move {
            use pb::pairing_event::Event;
            let send = |e: Event| pb::PairingEvent { event: Some(e) };
            if tx.send(Ok(send(Event::Opened(opened)))).await.is_err() {
                remote.close_window(id);
                return;
            }
            let last = tokio::select! {
                o = outcomes.recv() => match o {
                    Some(PairingOutcome::Paired { device_id, name }) => {
                        Event::Paired(pb::PairingPaired { device_id: device_id.to_string(), name })
                    }
                    Some(PairingOutcome::Closed(reason)) => Event::Closed(pb::PairingClosed { reason }),
                    None => Event::Closed(pb::PairingClosed { reason: "the window was closed".into() }),
                },
                () = tokio::time::sleep_until(window.deadline().into()) => {
                    Event::Closed(pb::PairingClosed { reason: "the code expired unused; nothing was paired".into() })
                }
                // Nobody shows the code any more: nobody may use it.
                () = tx.closed() => Event::Closed(pb::PairingClosed { reason: String::new() }),
            };
            remote.close_window(id);
            let _ = tx.send(Ok(send(last))).await;
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn list_devices(&self, req: Request<pb::ListDevicesRequest>) -> Result<Response<pb::ListDevicesResponse>, Status> {
        local_only(&req, "ListDevices")?;
        Ok(Response::new(pb::ListDevicesResponse { devices: self.remote.devices().iter().map(device_info).collect() }))
    }

    async fn revoke_device(&self, req: Request<pb::RevokeDeviceRequest>) -> Result<Response<pb::RevokeDeviceResponse>, Status> {
        local_only(&req, "RevokeDevice")?;
        let what = req.get_ref().device.trim();
        if what.is_empty() {
            return Err(DaemonError::Invalid("device is empty; give a paired device's ID or name".into()).into());
        }
        let (device, cut) = self.remote.revoke(what)?;
        Ok(Response::new(pb::RevokeDeviceResponse { device: Some(device_info(&device)), cut_connections: cut as u32 }))
    }
}

fn server_status(s: &ServerState) -> pb::ServerModeStatus {
    pb::ServerModeStatus {
        enabled: s.enabled,
        listen_address: s.listen.map(|a| a.to_string()).unwrap_or_default(),
        advertised: s.advertised,
        remote_connections: s.connections as u32,
        paired_devices: s.paired as u32,
        pairing_open: s.pairing_open,
        lending: s.lending,
        lending_sessions: s.lending_sessions as u32,
        lending_refused: s.lending_refused.clone().unwrap_or_default(),
    }
}

fn device_info(d: &DeviceInfo) -> pb::PairedDeviceInfo {
    pb::PairedDeviceInfo {
        device_id: d.device.device_id.to_string(),
        name: d.device.name.clone(),
        paired_at: d.device.paired_at,
        last_seen: d.device.last_seen.unwrap_or(0),
        connections: d.connections as u32,
    }
}
