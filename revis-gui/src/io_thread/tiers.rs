//! The tiers: load and unload one, switch its offload, set its ensemble
//! (its members checked first), and where each one runs.

use std::collections::BTreeMap;
use std::path::PathBuf;

use revis_client::dispatch::{Dispatcher, Offload, Placement};
use revis_client::ensemble::{EnsembleSpec, MemberProblem, MemberSpec};
use revis_client::{Keyring, Tier};

use super::Io;
use crate::protocol::{Event, TierPlacement};

/// Where each tier runs, for the Tiers panel.
pub(super) fn placements(d: &Dispatcher) -> BTreeMap<Tier, TierPlacement> {
    d.placements()
        .into_iter()
        .map(|(tier, p)| {
            let offloaded = d.offload(tier).enabled;
            let runs_on = match p {
                Placement::Local => "this machine".to_owned(),
                Placement::Node(name) => name,
                Placement::FallenBack => "this machine (no node answers)".to_owned(),
            };
            (tier, TierPlacement { offloaded, runs_on })
        })
        .collect()
}

impl Io {
    /// Switches a tier's offload: saved in the store, applied now (the
    /// model unloaded here, or loaded again when it comes home).
    pub(super) fn offload(&self, tier: Tier, on: bool) {
        let (Some(d), Some(store)) = (self.dispatcher.clone(), self.store.clone()) else {
            return self.sink.error("switching offload", "not connected to revisd yet");
        };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            let setting = Offload { enabled: on, ..d.offload(tier) };
            let saved = setting.clone();
            match tokio::task::spawn_blocking(move || revis_orchestrator::offload::save(&store, tier, &saved)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return sink.error("saving the offload setting", e.to_string()),
                Err(e) => return sink.error("saving the offload setting", e.to_string()),
            }
            d.set_offload(tier, setting);
            d.refresh().await;
            if !on && let Err(e) = d.local().load_model(tier).await {
                sink.error("loading the tier here again", e.words());
            }
            sink.send(Event::Placements(placements(&d)));
            if let Ok(s) = d.local().status().await {
                sink.send(Event::Status(Box::new(s)));
            }
        });
    }

    /// Sets a tier's ensemble: checked (its settings; each member a tier
    /// this machine's revisd serves or a tier of a paired node), saved in
    /// the store, then handed to the dispatcher, so the tier's next answer
    /// comes from it. One that is refused changes nothing.
    pub(super) fn ensemble(&self, tier: Tier, spec: EnsembleSpec) {
        let (Some(d), Some(store)) = (self.dispatcher.clone(), self.store.clone()) else {
            return self.sink.send(Event::EnsembleSet { tier, result: Err("not connected to revisd yet".into()) });
        };
        let (sink, keyring) = (self.sink.clone(), self.keyring_dir());
        tokio::spawn(async move {
            let result = async {
                spec.check()?;
                if spec.enabled {
                    check_members(&d, keyring, &spec.members).await?;
                }
                let saved = spec.clone();
                match tokio::task::spawn_blocking(move || revis_orchestrator::ensemble::save(&store, tier, &saved)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(format!("the ensemble could not be saved: {e}")),
                    Err(e) => return Err(format!("the ensemble could not be saved: {e}")),
                }
                d.set_ensemble(tier, spec.clone());
                Ok(spec)
            }
            .await;
            sink.send(Event::EnsembleSet { tier, result });
        });
    }

    pub(super) fn tier(&self, tier: Tier, load: bool) {
        let Some(c) = self.client.clone() else {
            return self.sink.send(Event::TierDone { tier, message: Err("not connected to revisd".into()) });
        };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            let message = if load {
                c.load_model(tier)
                    .await
                    .map(|r| format!("{} ready in {} ms ({} MiB)", r.tier.model, r.elapsed_ms, r.tier.memory_bytes >> 20))
            } else {
                c.unload_model(tier).await.map(|r| {
                    format!(
                        "{} unloaded; revisd now uses {} MiB (was {} MiB)",
                        r.tier.model,
                        r.rss_after_bytes >> 20,
                        r.rss_before_bytes >> 20
                    )
                })
            };
            sink.send(Event::TierDone { tier, message: message.map_err(|e| e.words()) });
            if let Ok(s) = c.status().await {
                sink.send(Event::Status(Box::new(s)));
            }
        });
    }
}

/// An ensemble's member on a node names a paired node; a member here names a
/// tier this machine's revisd serves (as `revis ensemble` checks them).
async fn check_members(d: &Dispatcher, keyring: PathBuf, members: &[MemberSpec]) -> Result<(), String> {
    let nodes: Vec<String> = members.iter().filter_map(|m| m.node.clone()).collect();
    let paired = tokio::task::spawn_blocking(move || -> Result<Vec<String>, String> {
        if nodes.is_empty() {
            return Ok(nodes);
        }
        let keyring = Keyring::open(&keyring).map_err(|e| e.words())?;
        let mut paired = Vec::new();
        for n in nodes {
            if keyring.store.find(&n).map_err(|e| e.to_string())?.is_some() {
                paired.push(n);
            }
        }
        Ok(paired)
    })
    .await
    .map_err(|e| e.to_string())??;
    let served = if members.iter().any(|m| m.node.is_none()) {
        d.local().status().await.map_err(|e| e.words())?.tiers.iter().map(|t| t.tier).collect()
    } else {
        Vec::new()
    };
    revis_client::ensemble::check_members(members, |n| paired.iter().any(|p| p == n), || served).map_err(|e| match e {
        MemberProblem::NotPaired(_) => format!("{e}; the Nodes view lists them and pairs one"),
        _ => e.to_string(),
    })
}
