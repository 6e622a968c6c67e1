//! Offload applied to this machine: a tier that runs on a node now has its
//! model unloaded here (unless another tier still runs on that model here,
//! or the tier keeps it: `keep_local`), and a tier that came home (offload
//! off, or no node serves it any more) has it loaded here again.

use super::state::Dispatcher;
use super::types::Placement;
use crate::api::{ModelState, Tier};

impl Dispatcher {
    /// Unloads here what runs elsewhere now; loads here what came home.
    pub(super) async fn apply_placement(&self) {
        let placements = self.placements();
        let Ok(local) = self.local.status().await else { return };
        let here = |tier: Tier| {
            let offload = self.offload(tier);
            !matches!(placements.get(&tier), Some(Placement::Node(_))) || offload.keep_local
        };
        for t in &local.tiers {
            let runs_here = here(t.tier);
            // Offloaded, but no node serves it now: it is home, and its
            // model (unloaded when it went away) comes back.
            let stranded = matches!(placements.get(&t.tier), Some(Placement::FallenBack)) && t.state == ModelState::Unloaded;
            let unloaded_by_us = self.lock().unloaded_here.contains(&t.tier) || stranded;
            if !runs_here {
                // A model shared with a tier that still runs here stays.
                let shared_here = t.shared_with.iter().any(|o| here(*o));
                if !shared_here && t.state != ModelState::Unloaded {
                    match self.local.unload_model(t.tier).await {
                        Ok(r) => {
                            tracing::info!(
                                tier = %t.tier,
                                freed_mib = r.rss_before_bytes.saturating_sub(r.rss_after_bytes) >> 20,
                                "offloaded: model unloaded here"
                            );
                            self.lock().unloaded_here.insert(t.tier);
                        }
                        Err(e) => tracing::warn!(tier = %t.tier, "unloading an offloaded tier failed: {e}"),
                    }
                }
            } else if unloaded_by_us {
                match self.local.load_model(t.tier).await {
                    Ok(_) => {
                        tracing::info!(tier = %t.tier, "tier came home: model loaded here again");
                        self.lock().unloaded_here.remove(&t.tier);
                    }
                    Err(e) => tracing::warn!(tier = %t.tier, "loading a tier that came home failed: {e}"),
                }
            }
        }
    }
}
