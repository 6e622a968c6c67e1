//! Which daemon runs which task: this machine's, or a paired node's for
//! tiers the user offloaded, with fallback the user never notices.
//!
//! The [`Dispatcher`] is a [`Runner`], like a single [`Client`], so
//! everything above it (chat turns, pre-prefill, structured background
//! tasks) runs unchanged. Per task it
//! picks a target:
//!
//! - a tier whose offload is off runs here;
//! - an offloaded tier runs on a healthy paired node (the one named, or the
//!   least loaded by queue depth and measured speed); background tasks are
//!   spread over every such node, and over this machine too when the tier
//!   keeps its local model (`keep_local`);
//! - with no healthy node, it runs here;
//! - a task that names a paired node ([`Dispatcher::on_node`], the HTTP
//!   APIs' `NODE/TIER`) runs there alone: a failure opens that node's
//!   breaker as any other, and nothing moves elsewhere.
//!
//! Failures: a node that fails a call has its circuit breaker opened (it gets
//! no work) until a health probe succeeds again ([`Dispatcher::refresh`]).
//! A failed call before any text was shown is sent again elsewhere; after
//! text was shown, the answer continues here from the text already
//! delivered (`answer_prefix`), so the user sees one continuous answer. JSON
//! answers are never shown in parts: they are started again elsewhere.
//! Streams have deadlines of their own (first token, gap between tokens,
//! total), since gRPC deadlines do not cover a streamed body.
//!
//! Offloading a tier unloads its model here (unless another tier still
//! uses it here, or `keep_local`); when no node serves it any more, or
//! offload is switched off, the model is loaded here again.
//!
//! The paired nodes are read again from the keyring's directory at every
//! [`Dispatcher::refresh`], so a node paired or forgotten elsewhere (the
//! GUI, `revis pair`) gets work or loses it without a restart.
//!
//! By concern: `routing` (which target: pure functions, no I/O), `health`
//! (the paired nodes, probes, breakers, the supervisor), `placement`
//! (offload applied to this machine), `failover` (one stream with our
//! deadlines, and what to do when it fails), `state` (the [`Dispatcher`]
//! handle and the state behind its lock), `types` (the data the API speaks
//! in). This module holds the public API.

mod failover;
mod health;
mod placement;
mod routing;
mod state;
mod types;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use revis_trust::Interfaces;
use tokio::sync::watch;

use crate::api::{CallError, Done, EmbedParams, Embedded, GenerateParams, PrefillParams, Prefilled, Runner, Tier, TierStatus};
use crate::ensemble::{Ensemble, EnsembleSpec, Member, Weights};
use crate::{Client, Keyring};
use routing::Task;
use state::State;

pub use state::Dispatcher;
pub use types::{Deadlines, Fallback, NodeView, Offload, Placement, Route};

impl Dispatcher {
    /// A dispatcher over the local daemon and the nodes paired in `keyring`
    /// (None: this machine only). `discovery`: the interfaces mDNS may use
    /// to find nodes that moved (None: their last address only).
    pub fn new(
        local: Client,
        keyring: Option<Arc<Keyring>>,
        discovery: Option<Interfaces>,
        offload: BTreeMap<Tier, Offload>,
        deadlines: Deadlines,
    ) -> Dispatcher {
        let mut state = State::new(offload);
        if let Some(k) = &keyring {
            health::reconcile(&mut state, k.store.devices());
        }
        Dispatcher {
            local,
            keyring,
            discovery,
            deadlines,
            state: Arc::new(Mutex::new(state)),
            parallelism: Arc::new(watch::Sender::new(1)),
            pinned: None,
        }
    }

    pub fn local(&self) -> &Client {
        &self.local
    }

    /// Changes a tier's offload; call [`Dispatcher::refresh`] to apply it.
    pub fn set_offload(&self, tier: Tier, offload: Offload) {
        self.lock().offload.insert(tier, offload);
    }

    pub fn offload(&self, tier: Tier) -> Offload {
        self.lock().offload(tier)
    }

    /// Changes a tier's ensemble; it applies from the next answer.
    pub fn set_ensemble(&self, tier: Tier, spec: EnsembleSpec) {
        self.lock().ensembles.insert(tier, spec);
    }

    /// A tier's ensemble settings (disabled by default).
    pub fn ensemble(&self, tier: Tier) -> EnsembleSpec {
        self.lock().ensembles.get(&tier).cloned().unwrap_or_default()
    }

    /// The ensemble that answers `tier` now: its members that can be
    /// reached (this machine's tiers, and paired nodes whose breaker is
    /// closed), or None when the tier has no ensemble or none of its
    /// members can be reached (the tier is then dispatched as usual).
    pub fn ensemble_for(&self, tier: Tier) -> Option<Ensemble> {
        let mut state = self.lock();
        let spec = state.ensembles.get(&tier).filter(|s| s.enabled)?.clone();
        let mut members = Vec::new();
        let mut routes = HashMap::new();
        for m in &spec.members {
            let route = match &m.node {
                None => Route::Local,
                Some(want) => {
                    let Some(node) = state.nodes.iter().find(|n| n.healthy && (n.name == *want || n.device_id.to_string() == *want)) else {
                        tracing::debug!("ensemble member {m} is not reachable now: it sits this answer out");
                        continue;
                    };
                    Route::Node(node.device_id)
                }
            };
            let client = match &route {
                Route::Local => self.local.clone(),
                Route::Node(id) => match state.clients.get(id) {
                    Some(c) => c.clone(),
                    None => continue,
                },
            };
            routes.insert(m.to_string(), route);
            members.push(Member { name: m.to_string(), client, tier: m.tier });
        }
        if members.is_empty() {
            return None;
        }
        let weights = state.ensemble_weights.entry(tier).or_insert_with(|| Arc::new(Mutex::new(Weights::equal(members.len())))).clone();
        drop(state);
        let dispatcher = self.clone();
        Some(Ensemble::new(members, spec).with_weights(weights).on_failure(move |name, e| {
            if let Some(route) = routes.get(name) {
                dispatcher.failed(route, &e.message);
            }
        }))
    }

    /// This dispatcher held to one paired node (by name or device ID) whose
    /// breaker is closed, for tasks that name where they must run: each
    /// runs there alone, under the nodes' deadlines, and a failure opens
    /// the node's breaker and is the caller's (no failover, no ensemble).
    /// It shares this dispatcher's state (breakers, loads, counts).
    pub fn on_node(&self, node: &str) -> Option<Dispatcher> {
        let state = self.lock();
        let n = state.nodes.iter().find(|n| n.healthy && (n.name == node || n.device_id.to_string() == node))?;
        state.clients.contains_key(&n.device_id).then(|| Dispatcher { pinned: Some(n.device_id), ..self.clone() })
    }

    /// The paired nodes as last probed.
    pub fn nodes(&self) -> Vec<NodeView> {
        self.lock().nodes.clone()
    }

    /// The latest calls that failed on a node and went on elsewhere, oldest first.
    pub fn fallbacks(&self) -> Vec<Fallback> {
        self.lock().fallbacks.iter().cloned().collect()
    }

    /// Tasks finished here (this machine's daemon).
    pub fn local_completed(&self) -> u64 {
        self.lock().local_completed
    }

    /// How many background tasks may run at once: one per daemon that can
    /// take them (this machine plus every healthy node).
    pub fn parallelism(&self) -> watch::Receiver<usize> {
        self.parallelism.subscribe()
    }

    /// Where each tier runs now.
    pub fn placements(&self) -> BTreeMap<Tier, Placement> {
        let state = self.lock();
        Tier::ALL.into_iter().map(|tier| (tier, routing::placement(&state.nodes, tier, &state.offload(tier)))).collect()
    }

    /// Reads the paired nodes again (from the keyring's directory: paired
    /// or forgotten since), finds moved ones over mDNS (when allowed),
    /// probes every node, opening or closing its breaker, then applies the
    /// tiers' placement to this machine: unloads offloaded models, loads
    /// the ones that came home.
    pub async fn refresh(&self) {
        self.reload_paired().await;
        self.discover().await;
        self.probe_all().await;
        self.update_parallelism();
        self.apply_placement().await;
    }

    /// Picks where a task of `tier` runs, never one of `exclude` (a
    /// dispatcher held to a node: that node).
    pub fn choose(&self, tier: Tier, background: bool, exclude: &[Route]) -> Route {
        if let Some(id) = self.pinned {
            return Route::Node(id);
        }
        let state = self.lock();
        routing::choose(&state.nodes, state.here, &state.offload(tier), state.sticky.get(&tier), Task { tier, background, exclude })
    }

    fn client(&self, target: &Route) -> Option<Client> {
        match target {
            Route::Local => Some(self.local.clone()),
            Route::Node(id) => self.lock().clients.get(id).cloned(),
        }
    }

    fn name(&self, target: &Route) -> String {
        match target {
            Route::Local => "this machine".into(),
            Route::Node(id) => self.lock().nodes.iter().find(|n| n.device_id == *id).map_or_else(|| id.to_string(), |n| n.name.clone()),
        }
    }

    /// The ensemble that answers `tier`, unless this dispatcher is held to a node.
    fn answering_ensemble(&self, tier: Tier) -> Option<Ensemble> {
        if self.pinned.is_some() { None } else { self.ensemble_for(tier) }
    }
}

impl Runner for Dispatcher {
    async fn prefill(&self, req: PrefillParams) -> Result<Prefilled, CallError> {
        match self.answering_ensemble(req.tier) {
            Some(ensemble) => ensemble.prefill(req).await,
            None => self.prefill_routed(req).await,
        }
    }

    async fn generate(&self, req: GenerateParams, on_delta: impl FnMut(&str) + Send) -> Result<Done, CallError> {
        self.generate_started(req, |_| {}, on_delta).await
    }

    async fn generate_started(
        &self,
        req: GenerateParams,
        on_started: impl FnMut(u32) + Send,
        on_delta: impl FnMut(&str) + Send,
    ) -> Result<Done, CallError> {
        match self.answering_ensemble(req.tier) {
            Some(ensemble) => ensemble.generate(req, on_delta).await,
            None => self.generate_with_failover(req, on_started, on_delta).await,
        }
    }

    async fn embed(&self, req: EmbedParams) -> Result<Embedded, CallError> {
        self.embed_routed(req).await
    }

    /// This machine's daemon's tiers.
    async fn tiers(&self) -> Result<Vec<TierStatus>, CallError> {
        self.local.tiers().await
    }

    fn parallelism(&self) -> Option<watch::Receiver<usize>> {
        Some(self.parallelism())
    }

    fn nodes(&self) -> Vec<(String, Vec<Tier>)> {
        Dispatcher::nodes(self).into_iter().map(|n| (n.name, n.tiers)).collect()
    }

    fn on_node(&self, node: &str) -> Option<Dispatcher> {
        Dispatcher::on_node(self, node)
    }
}

#[cfg(test)]
mod tests {
    use revis_trust::DeviceId;
    use tonic::transport::Endpoint;

    use super::*;
    use crate::Target;
    use crate::api::Code;

    /// A client whose channel connects only when used (never, here).
    fn idle_client() -> Client {
        Client::over(Endpoint::from_static("http://revisd.local").connect_lazy(), Target::Socket("/nowhere/revisd.sock".into()))
    }

    #[tokio::test]
    async fn a_dispatcher_held_to_a_node_sends_its_tasks_there_alone_and_only_while_it_answers() {
        let d = Dispatcher::new(idle_client(), None, None, BTreeMap::new(), Deadlines::default());
        let id = DeviceId::from_bytes([1; 32]);
        d.lock().nodes.push(NodeView { tiers: vec![Tier::Tier1], ..routing::tests::node("desk", 1) });
        assert!(d.on_node("desk").is_none(), "not connected: it does not answer");
        d.lock().clients.insert(id, idle_client());
        assert!(d.on_node("attic").is_none(), "no such node");
        assert!(d.on_node(&id.to_string()).is_some(), "by device ID too");
        let held = d.on_node("desk").unwrap();
        assert_eq!(d.choose(Tier::Tier1, false, &[]), Route::Local, "tier1 is not offloaded");
        assert_eq!(held.choose(Tier::Tier1, false, &[]), Route::Node(id));
        assert_eq!(Runner::nodes(&d), [("desk".to_owned(), vec![Tier::Tier1])]);

        // The node goes away under the held dispatcher: the answer fails
        // there, its breaker opens for everyone, and nothing moves here.
        d.lock().clients.remove(&id);
        let e = Runner::generate(&held, GenerateParams::default(), |_| {}).await.unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (Code::Unavailable, "not connected"));
        assert!(!d.nodes()[0].healthy, "its breaker is open");
        assert!(d.fallbacks().is_empty(), "nothing went elsewhere");
        assert_eq!(d.local_completed(), 0);
        let e = Runner::embed(&held, EmbedParams::default()).await.unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (Code::Unavailable, "desk is not connected"));
        assert!(d.on_node("desk").is_none());
    }
}
