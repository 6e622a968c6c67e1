//! Where the user's ensembles live: one store setting per tier
//! (`ensemble/<tier>`, [`EnsembleSpec`] as JSON), like a tier's offload;
//! read by the CLI and the GUI into the dispatcher ([`apply`]) and written
//! when the user changes them (`revis ensemble`, the GUI's Tiers view).

use std::collections::BTreeMap;

use revis_client::Tier;
use revis_client::dispatch::Dispatcher;
use revis_client::ensemble::EnsembleSpec;
use revis_store::Store;

/// The settings key of a tier's ensemble in the store.
pub fn key(tier: Tier) -> String {
    format!("ensemble/{tier}")
}

/// The ensemble of every tier the user set one for (on or off). Settings
/// that no longer pass [`EnsembleSpec::check`] come back switched off.
pub fn load_all(store: &Store) -> BTreeMap<Tier, EnsembleSpec> {
    Tier::ALL
        .into_iter()
        .filter_map(|t| {
            let v = store.setting(&key(t)).ok().flatten()?;
            Some((t, EnsembleSpec::from_json(&v)))
        })
        .collect()
}

/// Keeps a tier's ensemble.
pub fn save(store: &Store, tier: Tier, spec: &EnsembleSpec) -> Result<(), revis_store::StoreError> {
    store.set_setting(&key(tier), &spec.to_json())
}

/// Hands each tier's ensemble to a dispatcher, so the tiers that have one
/// switched on answer through it from the next answer on.
pub fn apply(dispatcher: &Dispatcher, ensembles: BTreeMap<Tier, EnsembleSpec>) {
    for (tier, spec) in ensembles {
        dispatcher.set_ensemble(tier, spec);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use revis_client::ensemble::Method;

    use super::*;

    fn spec(members: &[&str]) -> EnsembleSpec {
        EnsembleSpec {
            enabled: true,
            members: members.iter().map(|m| m.parse().unwrap()).collect(),
            method: Method::Confident,
            span_tokens: 8,
            gate: 0.25,
            round_deadline: Duration::from_millis(1500),
        }
    }

    #[test]
    fn a_tiers_ensemble_is_kept_across_opens_and_others_stay_unset() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap().store;
        assert!(load_all(&store).is_empty(), "nothing set yet");
        let tier2 = spec(&["tier2", "desk/tier3"]);
        save(&store, Tier::Tier2, &tier2).unwrap();
        let off = EnsembleSpec { enabled: false, ..spec(&["tier1", "tier3"]) };
        save(&store, Tier::Tier3, &off).unwrap();
        drop(store);

        let store = Store::open(dir.path()).unwrap().store;
        let all = load_all(&store);
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[&Tier::Tier2], tier2);
        assert_eq!(all[&Tier::Tier3], off);
        assert!(!all.contains_key(&Tier::Tier1));
        assert_eq!(store.setting("ensemble/tier2").unwrap().unwrap()["members"], serde_json::json!(["tier2", "desk/tier3"]));
    }

    #[test]
    fn a_setting_that_no_longer_passes_its_check_is_read_back_switched_off() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap().store;
        // Written by hand (or by an older revis): one member cannot make an ensemble.
        store.set_setting(&key(Tier::Tier1), &spec(&["tier1"]).to_json()).unwrap();
        let read = &load_all(&store)[&Tier::Tier1];
        assert!(!read.enabled, "{read:?}");
        assert_eq!(read.members.len(), 1, "what was set is still shown");
    }
}
