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
//! - with no healthy node, it runs here.
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use revis_trust::{DeviceId, Interfaces};
use tokio::sync::watch;

use crate::api::{CallError, Code, DaemonStatus, Done, Event, Format, GenerateParams, ModelState, PrefillParams, Prefilled, Priority, Runner, Tier};
use crate::wire::v1 as pb;
use crate::{Client, Keyring, Node};

/// A tier's offload, as the user set it (`revis offload`, the GUI).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Offload {
    pub enabled: bool,
    /// Only this paired node (name or device ID); None = any that serves the tier.
    pub node: Option<String>,
    /// Keep the model loaded here too, and share background work with this machine.
    pub keep_local: bool,
}

impl Offload {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"enabled": self.enabled, "node": self.node, "keep_local": self.keep_local})
    }

    pub fn from_json(v: &serde_json::Value) -> Offload {
        Offload {
            enabled: v["enabled"].as_bool().unwrap_or(false),
            node: v["node"].as_str().map(str::to_owned),
            keep_local: v["keep_local"].as_bool().unwrap_or(false),
        }
    }
}

/// Our own deadlines for a streamed answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// From sending the request to its first event (queue wait and a model
    /// load included).
    pub first_token: Duration,
    /// Longest silence between two events once the answer streams.
    pub gap: Duration,
    /// The whole answer.
    pub total: Duration,
    /// A health probe (connect and Status).
    pub probe: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            first_token: Duration::from_secs(60),
            gap: Duration::from_secs(5),
            total: Duration::from_secs(600),
            probe: Duration::from_secs(2),
        }
    }
}

/// Where a task runs (not to be confused with [`crate::Target`], which
/// daemon a [`Client`] is connected to).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    Local,
    Node(DeviceId),
}

/// Where a tier runs now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// This machine's daemon.
    Local,
    /// Offloaded to this node (name).
    Node(String),
    /// Offload is on but no node serving it is healthy: here for now.
    FallenBack,
}

/// A paired node as the dispatcher sees it.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub name: String,
    pub device_id: DeviceId,
    pub addr: Option<SocketAddr>,
    /// The breaker is closed: the node gets work.
    pub healthy: bool,
    pub last_error: Option<String>,
    pub queue_depth: u32,
    pub in_flight: usize,
    /// Measured decode speed (moving average), 0 until measured.
    pub tokens_per_s: f64,
    /// Round trip of the last health probe.
    pub latency_ms: f64,
    pub tiers: Vec<Tier>,
    /// Tasks it finished for this dispatcher.
    pub completed: u64,
}

struct Slot {
    view: NodeView,
    client: Option<Client>,
}

/// A call that failed on a node and went on elsewhere.
#[derive(Clone, Debug)]
pub struct Fallback {
    /// The node that failed.
    pub from: String,
    pub error: String,
    /// Text (bytes) and tokens shown before the failure: the answer
    /// continued from there.
    pub shown_bytes: usize,
    pub shown_tokens: u32,
    /// When the failure was noticed.
    pub at: Instant,
}

/// Fallbacks remembered for [`Dispatcher::fallbacks`].
const FALLBACKS_KEPT: usize = 32;

struct State {
    nodes: Vec<Slot>,
    offload: BTreeMap<Tier, Offload>,
    /// Tiers whose model this dispatcher unloaded here (to bring home later).
    unloaded_here: HashSet<Tier>,
    /// The target the last pre-prefill of a tier went to.
    sticky: HashMap<Tier, Route>,
    local_in_flight: usize,
    local_tokens_per_s: f64,
    local_completed: u64,
    fallbacks: std::collections::VecDeque<Fallback>,
    /// When mDNS was last asked (it is asked only for nodes not answering).
    last_browse: Option<Instant>,
}

/// mDNS is asked at most this often, and only when a node does not answer
/// at its address: a chat probing every few seconds must not multicast as often.
const BROWSE_EVERY: Duration = Duration::from_secs(30);

/// Sends each task to the daemon that should run it. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    local: Client,
    keyring: Option<Arc<Keyring>>,
    discovery: Option<Interfaces>,
    deadlines: Deadlines,
    state: Arc<Mutex<State>>,
    parallelism: Arc<watch::Sender<usize>>,
}

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
        let nodes = keyring
            .as_ref()
            .map(|k| {
                k.store
                    .devices()
                    .iter()
                    .map(|d| Slot {
                        view: NodeView {
                            name: d.name.clone(),
                            device_id: d.device_id,
                            addr: d.address.as_deref().and_then(|a| a.parse().ok()),
                            // Unknown until probed: no work before a probe says so.
                            healthy: false,
                            last_error: Some("not probed yet".into()),
                            queue_depth: 0,
                            in_flight: 0,
                            tokens_per_s: 0.0,
                            latency_ms: 0.0,
                            tiers: Vec::new(),
                            completed: 0,
                        },
                        client: None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        Dispatcher {
            local,
            keyring,
            discovery,
            deadlines,
            state: Arc::new(Mutex::new(State {
                nodes,
                offload,
                unloaded_here: HashSet::new(),
                sticky: HashMap::new(),
                local_in_flight: 0,
                local_tokens_per_s: 0.0,
                local_completed: 0,
                fallbacks: Default::default(),
                last_browse: None,
            })),
            parallelism: Arc::new(watch::Sender::new(1)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn local(&self) -> &Client {
        &self.local
    }

    /// Changes a tier's offload; call [`Dispatcher::refresh`] to apply it.
    pub fn set_offload(&self, tier: Tier, offload: Offload) {
        self.lock().offload.insert(tier, offload);
    }

    pub fn offload(&self, tier: Tier) -> Offload {
        self.lock().offload.get(&tier).cloned().unwrap_or_default()
    }

    /// The paired nodes as last probed.
    pub fn nodes(&self) -> Vec<NodeView> {
        self.lock().nodes.iter().map(|s| s.view.clone()).collect()
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
        Tier::ALL
            .into_iter()
            .map(|tier| {
                let offload = state.offload.get(&tier).cloned().unwrap_or_default();
                let p = if !offload.enabled {
                    Placement::Local
                } else {
                    match best_node(&state, tier, &offload, &[]) {
                        Some(i) => Placement::Node(state.nodes[i].view.name.clone()),
                        None => Placement::FallenBack,
                    }
                };
                (tier, p)
            })
            .collect()
    }

    /// Probes every paired node (finding moved ones over mDNS first, when
    /// allowed), opens or closes their breakers, then applies the tiers'
    /// placement to this machine: unloads offloaded models, loads the ones
    /// that came home.
    pub async fn refresh(&self) {
        self.discover().await;
        let slots: Vec<(usize, Node, Option<Client>)> = {
            let state = self.lock();
            state
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    let addr = s.view.addr?;
                    Some((i, Node { name: s.view.name.clone(), device_id: s.view.device_id, addr }, s.client.clone()))
                })
                .collect()
        };
        let mut probes = tokio::task::JoinSet::new();
        for (i, node, client) in slots {
            let this = self.clone();
            probes.spawn(async move { (i, this.probe(&node, client).await) });
        }
        while let Some(joined) = probes.join_next().await {
            let Ok((i, result)) = joined else { continue };
            let mut state = self.lock();
            let Some(slot) = state.nodes.get_mut(i) else { continue };
            match result {
                Ok((client, status, rtt)) => {
                    if !slot.view.healthy {
                        tracing::info!(node = %slot.view.name, "node healthy: breaker closed");
                    }
                    slot.view.healthy = true;
                    slot.view.last_error = None;
                    slot.view.queue_depth = status.queue_depth;
                    slot.view.latency_ms = rtt.as_secs_f64() * 1e3;
                    slot.view.tiers = status.tiers.iter().map(|t| t.tier).collect();
                    slot.client = Some(client);
                }
                Err(e) => {
                    if slot.view.healthy {
                        tracing::warn!(node = %slot.view.name, "node unhealthy: {e}");
                    }
                    slot.view.healthy = false;
                    slot.view.last_error = Some(e);
                    slot.client = None;
                }
            }
        }
        for s in self.lock().nodes.iter_mut().filter(|s| s.view.addr.is_none()) {
            s.view.healthy = false;
            s.view.last_error = Some("no known address".into());
        }
        self.update_parallelism();
        self.apply_placement().await;
    }

    /// Runs [`Dispatcher::refresh`] every `every` until the returned handle is aborted.
    pub fn spawn_supervisor(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                this.refresh().await;
            }
        })
    }

    async fn discover(&self) {
        let Some(interfaces) = &self.discovery else { return };
        let wanted: Vec<DeviceId> = {
            let mut state = self.lock();
            let lost: Vec<DeviceId> = state.nodes.iter().filter(|s| !s.view.healthy).map(|s| s.view.device_id).collect();
            if lost.is_empty() || state.last_browse.is_some_and(|t| t.elapsed() < BROWSE_EVERY) {
                return;
            }
            state.last_browse = Some(Instant::now());
            lost
        };
        let done = |seen: &[revis_trust::Discovered]| wanted.iter().all(|id| seen.iter().any(|d| d.device_id == *id));
        match revis_trust::browse(interfaces, Duration::from_millis(1500), done).await {
            Ok(seen) => {
                let mut state = self.lock();
                for d in seen {
                    if let Some(slot) = state.nodes.iter_mut().find(|s| s.view.device_id == d.device_id)
                        && let Some(addr) = d.addresses.first().copied()
                        && slot.view.addr != Some(addr)
                    {
                        slot.view.addr = Some(addr);
                        slot.client = None;
                    }
                }
            }
            Err(e) => tracing::warn!("mDNS browse failed: {e}"),
        }
    }

    async fn probe(&self, node: &Node, client: Option<Client>) -> Result<(Client, DaemonStatus, Duration), String> {
        let keyring = self.keyring.as_ref().ok_or("no keyring")?;
        let run = async {
            let client = match client {
                Some(c) => c,
                None => Client::connect_node(keyring, node).await.map_err(|e| e.to_string())?,
            };
            let t0 = Instant::now();
            // Once: a node that does not answer is what the probe is for.
            let status = client.admin.clone().status(pb::StatusRequest {}).await.map_err(|s| s.message().to_owned())?.into_inner().into();
            Ok((client, status, t0.elapsed()))
        };
        tokio::time::timeout(self.deadlines.probe, run)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.deadlines.probe)))
    }

    fn update_parallelism(&self) {
        let n = 1 + self.lock().nodes.iter().filter(|s| s.view.healthy).count();
        self.parallelism.send_if_modified(|p| std::mem::replace(p, n) != n);
    }

    /// Unloads here what runs elsewhere now; loads here what came home.
    async fn apply_placement(&self) {
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

    /// Picks where a task of `tier` runs, never one of `exclude`.
    pub fn choose(&self, tier: Tier, background: bool, exclude: &[Route]) -> Route {
        let state = self.lock();
        let offload = state.offload.get(&tier).cloned().unwrap_or_default();
        if !offload.enabled {
            return Route::Local;
        }
        let excluded: Vec<DeviceId> = exclude.iter().filter_map(|t| if let Route::Node(d) = t { Some(*d) } else { None }).collect();
        if !background
            && let Some(Route::Node(id)) = state.sticky.get(&tier)
            && !excluded.contains(id)
            && state.nodes.iter().any(|s| s.view.device_id == *id && serves(&s.view, tier, &offload))
        {
            return Route::Node(*id);
        }
        let best = best_node(&state, tier, &offload, &excluded);
        match best {
            None => Route::Local,
            Some(i) => {
                let node = &state.nodes[i].view;
                if background && offload.keep_local && !exclude.contains(&Route::Local) {
                    let here = cost(state.local_in_flight, 0, state.local_tokens_per_s);
                    if here <= cost(node.in_flight, node.queue_depth, node.tokens_per_s) {
                        return Route::Local;
                    }
                }
                Route::Node(node.device_id)
            }
        }
    }

    fn client(&self, target: &Route) -> Option<Client> {
        match target {
            Route::Local => Some(self.local.clone()),
            Route::Node(id) => self.lock().nodes.iter().find(|s| s.view.device_id == *id).and_then(|s| s.client.clone()),
        }
    }

    fn name(&self, target: &Route) -> String {
        match target {
            Route::Local => "this machine".into(),
            Route::Node(id) => {
                self.lock().nodes.iter().find(|s| s.view.device_id == *id).map_or_else(|| id.to_string(), |s| s.view.name.clone())
            }
        }
    }

    /// Counts a call on `target` (in flight), until the guard drops.
    fn start(&self, target: &Route) -> InFlight {
        let mut state = self.lock();
        match target {
            Route::Local => state.local_in_flight += 1,
            Route::Node(id) => {
                if let Some(s) = state.nodes.iter_mut().find(|s| s.view.device_id == *id) {
                    s.view.in_flight += 1;
                }
            }
        }
        InFlight { dispatcher: self.clone(), target: target.clone() }
    }

    fn succeeded(&self, target: &Route, done: &Done) {
        let speed = done.tokens_per_s();
        let mut state = self.lock();
        let update = |avg: &mut f64| {
            if let Some(s) = speed {
                *avg = if *avg == 0.0 { s } else { 0.7 * *avg + 0.3 * s };
            }
        };
        match target {
            Route::Local => {
                update(&mut state.local_tokens_per_s);
                state.local_completed += 1;
            }
            Route::Node(id) => {
                if let Some(s) = state.nodes.iter_mut().find(|s| s.view.device_id == *id) {
                    update(&mut s.view.tokens_per_s);
                    s.view.completed += 1;
                }
            }
        }
    }

    /// Opens `target`'s breaker: no work until a probe succeeds.
    fn failed(&self, target: &Route, why: &str) {
        if let Route::Node(id) = target {
            {
                let mut state = self.lock();
                if let Some(s) = state.nodes.iter_mut().find(|s| s.view.device_id == *id) {
                    s.view.healthy = false;
                    s.view.last_error = Some(why.to_owned());
                    s.client = None;
                }
                state.sticky.retain(|_, t| t != target);
            }
            self.update_parallelism();
        }
    }

    /// One streamed call with our deadlines; text goes to `on_text`. This
    /// machine's daemon gets only the total deadline: the others exist to
    /// move on to another daemon, and here there is none to move on to.
    /// Sent once: a failure moves on to another daemon, never to this one
    /// again (see [`crate::api::CallError`]).
    async fn stream_once(
        &self,
        client: Client,
        req: &GenerateParams,
        remote: bool,
        on_text: &mut (dyn FnMut(&str, u32) + Send),
    ) -> Result<Done, CallError> {
        let mut d = self.deadlines;
        if !remote {
            (d.first_token, d.gap) = (d.total, d.total);
        }
        let t0 = Instant::now();
        let deadline = |what: &str, limit: Duration| CallError::new(Code::DeadlineExceeded, format!("no {what} within {:.1}s", limit.as_secs_f64()));
        let mut inference = client.inference.clone();
        let mut stream = match tokio::time::timeout(d.first_token, inference.generate(pb::GenerateRequest::from(req))).await {
            Err(_) => return Err(deadline("answer", d.first_token)),
            Ok(r) => r.map_err(CallError::from)?.into_inner(),
        };
        let mut first = true;
        loop {
            let limit = if first { d.first_token.saturating_sub(t0.elapsed()) } else { d.gap };
            let limit = limit.min(d.total.saturating_sub(t0.elapsed()));
            let ev = match tokio::time::timeout(limit, stream.message()).await {
                Err(_) if t0.elapsed() >= d.total => return Err(deadline("end of the answer", d.total)),
                Err(_) => {
                    return Err(deadline(if first { "first token" } else { "next token" }, if first { d.first_token } else { d.gap }));
                }
                Ok(r) => r.map_err(CallError::from)?,
            };
            let Some(ev) = ev else {
                return Err(CallError::new(Code::Unavailable, "the stream ended before the answer was done"));
            };
            match crate::wire::event(ev) {
                None | Some(Event::Started { .. }) => {}
                Some(Event::Delta { text, tokens }) => {
                    first = false;
                    on_text(&text, tokens);
                }
                Some(Event::Done(done)) => return Ok(done),
            }
        }
    }
}

/// Decrements a target's in-flight count when a call ends.
struct InFlight {
    dispatcher: Dispatcher,
    target: Route,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.dispatcher.lock();
        match &self.target {
            Route::Local => state.local_in_flight = state.local_in_flight.saturating_sub(1),
            Route::Node(id) => {
                if let Some(s) = state.nodes.iter_mut().find(|s| s.view.device_id == *id) {
                    s.view.in_flight = s.view.in_flight.saturating_sub(1);
                }
            }
        }
    }
}

/// Seconds of work ahead on a daemon, roughly: what it holds and what we
/// sent it, over its measured speed (a guess of 50 tokens/s until measured).
fn cost(in_flight: usize, queue_depth: u32, tokens_per_s: f64) -> f64 {
    let speed = if tokens_per_s > 0.0 { tokens_per_s } else { 50.0 };
    (in_flight as f64 + f64::from(queue_depth) + 1.0) / speed
}

fn serves(node: &NodeView, tier: Tier, offload: &Offload) -> bool {
    node.healthy
        && node.tiers.contains(&tier)
        && offload.node.as_deref().is_none_or(|want| node.name == want || node.device_id.to_string() == want)
}

/// The healthy node that serves `tier` with the least work ahead.
fn best_node(state: &State, tier: Tier, offload: &Offload, excluded: &[DeviceId]) -> Option<usize> {
    state
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, s)| serves(&s.view, tier, offload) && !excluded.contains(&s.view.device_id))
        .min_by(|(_, a), (_, b)| {
            cost(a.view.in_flight, a.view.queue_depth, a.view.tokens_per_s).total_cmp(&cost(
                b.view.in_flight,
                b.view.queue_depth,
                b.view.tokens_per_s,
            ))
        })
        .map(|(i, _)| i)
}

impl Runner for Dispatcher {
    async fn prefill(&self, req: PrefillParams) -> Result<Prefilled, CallError> {
        // The pre-prefill goes where the answer will go, and the answer follows it there.
        let background = req.priority == Priority::Background;
        let target = self.choose(req.tier, background, &[]);
        if !background {
            self.lock().sticky.insert(req.tier, target.clone());
        }
        let Some(client) = self.client(&target) else {
            return Err(CallError::new(Code::Unavailable, format!("{} is not connected", self.name(&target))));
        };
        let _counted = self.start(&target);
        match client.inference.clone().prefill(pb::PrefillRequest::from(&req)).await {
            Ok(r) => Ok(r.into_inner().into()),
            Err(s) => {
                self.failed(&target, s.message());
                Err(s.into())
            }
        }
    }

    async fn generate(&self, req: GenerateParams, mut on_delta: impl FnMut(&str) + Send) -> Result<Done, CallError> {
        let background = req.priority == Priority::Background;
        let json = matches!(req.format, Format::Json { .. });
        let mut delivered = String::new();
        let mut tokens = 0u32;
        let mut tried: Vec<Route> = Vec::new();
        loop {
            // After text was shown, the answer continues here; before, anywhere else.
            let target = if delivered.is_empty() { self.choose(req.tier, background, &tried) } else { Route::Local };
            let mut attempt = req.clone();
            if !delivered.is_empty() {
                attempt.answer_prefix = delivered.clone();
                attempt.max_tokens = req.max_tokens.map(|m| m.saturating_sub(tokens).max(1));
            }
            let result = match self.client(&target) {
                None => Err(CallError::new(Code::Unavailable, "not connected")),
                Some(client) => {
                    let _counted = self.start(&target);
                    let mut on_text = |t: &str, n: u32| {
                        delivered.push_str(t);
                        tokens += n;
                        if !json {
                            on_delta(t);
                        }
                    };
                    self.stream_once(client, &attempt, target != Route::Local, &mut on_text).await
                }
            };
            match result {
                Ok(done) => {
                    self.succeeded(&target, &done);
                    if json {
                        on_delta(&delivered);
                    }
                    return Ok(Done { text: delivered, generated_tokens: tokens, ..done });
                }
                Err(e) if e.is_final() || target == Route::Local => return Err(e.after(if json { 0 } else { delivered.len() })),
                Err(e) => {
                    let at = self.name(&target);
                    tracing::warn!(
                        node = %at,
                        shown = delivered.len(),
                        "{} failed: {}; {}",
                        at,
                        e.message,
                        if delivered.is_empty() || json { "sending it elsewhere" } else { "continuing here" }
                    );
                    self.failed(&target, &e.message);
                    {
                        let mut state = self.lock();
                        if state.fallbacks.len() == FALLBACKS_KEPT {
                            state.fallbacks.pop_front();
                        }
                        state.fallbacks.push_back(Fallback {
                            from: at.clone(),
                            error: e.message.clone(),
                            shown_bytes: if json { 0 } else { delivered.len() },
                            shown_tokens: if json { 0 } else { tokens },
                            at: Instant::now(),
                        });
                    }
                    tried.push(target);
                    if json {
                        // Nothing was shown: start again from scratch.
                        delivered.clear();
                        tokens = 0;
                    }
                }
            }
        }
    }

    fn parallelism(&self) -> Option<watch::Receiver<usize>> {
        Some(self.parallelism())
    }
}
