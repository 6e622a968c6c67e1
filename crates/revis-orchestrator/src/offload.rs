//! Where the user's offload choices live: one store setting per tier
//! (`offload/<tier>`), read by the CLI and the GUI into the dispatcher
//! ([`revis_client::dispatch::Offload`]) and written when the user changes
//! them (`revis offload`, the GUI's Tiers view).

use std::collections::BTreeMap;

use revis_client::Tier;
use revis_client::dispatch::Offload;
use revis_store::Store;

/// The settings key of a tier's offload in the store.
pub fn key(tier: Tier) -> String {
    format!("offload/{tier}")
}

/// The offload of every tier the user set.
pub fn load_all(store: &Store) -> BTreeMap<Tier, Offload> {
    Tier::ALL
        .into_iter()
        .filter_map(|t| {
            let v = store.setting(&key(t)).ok().flatten()?;
            Some((t, Offload::from_json(&v)))
        })
        .collect()
}

/// Keeps a tier's offload.
pub fn save(store: &Store, tier: Tier, offload: &Offload) -> Result<(), revis_store::StoreError> {
    store.set_setting(&key(tier), &offload.to_json())
}
