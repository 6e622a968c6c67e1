//! Knowing the nodes: which are paired (read again from the keyring's
//! directory at each refresh), where they are (mDNS, for the ones that do
//! not answer at their address), whether they answer (probes), and each
//! node's breaker: opened by a failed call, closed by a probe that
//! succeeds. Also the supervisor that refreshes all this on a timer, and
//! the per-call bookkeeping the routing rule weighs (calls in flight,
//! measured speed, tasks completed).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use revis_trust::{DeviceId, PairedDevice, TrustStore};

use super::state::{Dispatcher, State};
use super::types::{NodeView, Route};
use crate::api::{DaemonStatus, Done};
use crate::{Client, Node};

/// mDNS is asked at most this often, and only when a node does not answer
/// at its address: a chat probing every few seconds must not multicast as often.
const BROWSE_EVERY: Duration = Duration::from_secs(30);

/// How long mDNS is listened to for nodes that moved.
const BROWSE_FOR: Duration = Duration::from_millis(1500);

/// Weight of the newest measurement in a daemon's moving-average speed.
const SPEED_WEIGHT: f64 = 0.3;

/// Makes the node list the keyring's `devices` (in the order they were
/// paired): a device paired since joins unprobed (no work before a probe
/// says so); a forgotten one leaves with its connection and the tiers that
/// stuck to it; the others keep their live state (breaker, load, speed,
/// counts), taking their name from the keyring and, when paired again at a
/// new address, that address.
pub(super) fn reconcile(state: &mut State, devices: &[PairedDevice]) {
    let mut known: HashMap<DeviceId, NodeView> = state.nodes.drain(..).map(|n| (n.device_id, n)).collect();
    let mut nodes = Vec::with_capacity(devices.len());
    for d in devices {
        let addr = d.address.as_deref().and_then(|a| a.parse().ok());
        let node = match known.remove(&d.device_id) {
            Some(mut n) => {
                n.name.clone_from(&d.name);
                if addr.is_some() && state.paired_addrs.get(&d.device_id) != Some(&addr) {
                    // Paired again elsewhere: the next connection goes there.
                    n.addr = addr;
                }
                n
            }
            None => {
                tracing::info!(node = %d.name, "node paired: it gets work once a probe says it answers");
                NodeView {
                    name: d.name.clone(),
                    device_id: d.device_id,
                    addr,
                    healthy: false,
                    last_error: Some("not probed yet".into()),
                    queue_depth: 0,
                    in_flight: 0,
                    tokens_per_s: 0.0,
                    latency_ms: 0.0,
                    tiers: Vec::new(),
                    completed: 0,
                }
            }
        };
        state.paired_addrs.insert(d.device_id, addr);
        nodes.push(node);
    }
    for gone in known.values() {
        tracing::info!(node = %gone.name, "node forgotten: no more work goes there");
    }
    state.nodes = nodes;
    let paired = |id: &DeviceId| state.nodes.iter().any(|n| n.device_id == *id);
    state.clients.retain(|id, _| paired(id));
    state.paired_addrs.retain(|id, _| paired(id));
    state.sticky.retain(|_, r| match r {
        Route::Local => true,
        Route::Node(id) => paired(id),
    });
}

impl Dispatcher {
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

    /// Reads the paired devices again from the keyring's directory (one
    /// small file, off the runtime's threads) and reconciles the nodes with
    /// them. A file that cannot be read leaves the nodes as they are.
    pub(super) async fn reload_paired(&self) {
        let Some(keyring) = &self.keyring else { return };
        let dir = keyring.dir().to_path_buf();
        match tokio::task::spawn_blocking(move || TrustStore::open(&dir)).await {
            Ok(Ok(store)) => reconcile(&mut self.lock(), store.devices()),
            Ok(Err(e)) => tracing::warn!("reading the paired nodes again failed (keeping the ones known): {e}"),
            Err(e) => tracing::warn!("reading the paired nodes again failed (keeping the ones known): {e}"),
        }
    }

    /// Asks mDNS where the nodes that do not answer are now (at most every
    /// [`BROWSE_EVERY`], only when allowed).
    pub(super) async fn discover(&self) {
        let Some(interfaces) = &self.discovery else { return };
        let wanted: Vec<DeviceId> = {
            let mut state = self.lock();
            let lost: Vec<DeviceId> = state.nodes.iter().filter(|n| !n.healthy).map(|n| n.device_id).collect();
            if lost.is_empty() || state.last_browse.is_some_and(|t| t.elapsed() < BROWSE_EVERY) {
                return;
            }
            state.last_browse = Some(Instant::now());
            lost
        };
        let done = |seen: &[revis_trust::Discovered]| wanted.iter().all(|id| seen.iter().any(|d| d.device_id == *id));
        match revis_trust::browse(interfaces, BROWSE_FOR, done).await {
            Ok(seen) => {
                let mut state = self.lock();
                for d in seen {
                    if let Some(addr) = d.addresses.first().copied()
                        && let Some(node) = state.node_mut(&d.device_id)
                        && node.addr != Some(addr)
                    {
                        node.addr = Some(addr);
                        state.clients.remove(&d.device_id);
                    }
                }
            }
            Err(e) => tracing::warn!("mDNS browse failed: {e}"),
        }
    }

    /// Probes every node at once; a probe that succeeds closes the node's
    /// breaker, one that fails opens it.
    pub(super) async fn probe_all(&self) {
        let targets: Vec<(Node, Option<Client>)> = {
            let state = self.lock();
            state
                .nodes
                .iter()
                .filter_map(|n| {
                    let node = Node { name: n.name.clone(), device_id: n.device_id, addr: n.addr? };
                    Some((node, state.clients.get(&n.device_id).cloned()))
                })
                .collect()
        };
        let mut probes = tokio::task::JoinSet::new();
        for (node, client) in targets {
            let this = self.clone();
            probes.spawn(async move { (node.device_id, this.probe(&node, client).await) });
        }
        while let Some(joined) = probes.join_next().await {
            let Ok((id, result)) = joined else { continue };
            let mut state = self.lock();
            let State { nodes, clients, .. } = &mut *state;
            // Forgotten while it was probed: nothing to record.
            let Some(node) = nodes.iter_mut().find(|n| n.device_id == id) else { continue };
            match result {
                Ok((client, status, rtt)) => {
                    if !node.healthy {
                        tracing::info!(node = %node.name, "node healthy: breaker closed");
                    }
                    node.healthy = true;
                    node.last_error = None;
                    node.queue_depth = status.queue_depth;
                    node.latency_ms = rtt.as_secs_f64() * 1e3;
                    node.tiers = status.tiers.iter().map(|t| t.tier).collect();
                    clients.insert(id, client);
                }
                Err(e) => {
                    if node.healthy {
                        tracing::warn!(node = %node.name, "node unhealthy: {e}");
                    }
                    node.healthy = false;
                    node.last_error = Some(e);
                    clients.remove(&id);
                }
            }
        }
        for n in self.lock().nodes.iter_mut().filter(|n| n.addr.is_none()) {
            n.healthy = false;
            n.last_error = Some("no known address".into());
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
            let status = client.once().status().await.map_err(|e| e.message)?;
            Ok((client, status, t0.elapsed()))
        };
        tokio::time::timeout(self.deadlines.probe, run)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.deadlines.probe)))
    }

    pub(super) fn update_parallelism(&self) {
        let n = 1 + self.lock().nodes.iter().filter(|n| n.healthy).count();
        self.parallelism.send_if_modified(|p| std::mem::replace(p, n) != n);
    }

    /// Counts a call on `target` (in flight), until the guard drops.
    pub(super) fn start(&self, target: &Route) -> InFlight {
        let mut state = self.lock();
        match target {
            Route::Local => state.here.in_flight += 1,
            Route::Node(id) => {
                if let Some(n) = state.node_mut(id) {
                    n.in_flight += 1;
                }
            }
        }
        InFlight { dispatcher: self.clone(), target: target.clone() }
    }

    /// Records a call `target` finished: its speed and its count.
    pub(super) fn succeeded(&self, target: &Route, done: &Done) {
        let speed = done.tokens_per_s();
        let update = |avg: &mut f64| {
            if let Some(s) = speed {
                *avg = if *avg == 0.0 { s } else { (1.0 - SPEED_WEIGHT) * *avg + SPEED_WEIGHT * s };
            }
        };
        let mut state = self.lock();
        match target {
            Route::Local => {
                update(&mut state.here.tokens_per_s);
                state.local_completed += 1;
            }
            Route::Node(id) => {
                if let Some(n) = state.node_mut(id) {
                    update(&mut n.tokens_per_s);
                    n.completed += 1;
                }
            }
        }
    }

    /// Opens `target`'s breaker: no work until a probe succeeds.
    pub(super) fn failed(&self, target: &Route, why: &str) {
        if let Route::Node(id) = target {
            {
                let mut state = self.lock();
                if let Some(n) = state.node_mut(id) {
                    n.healthy = false;
                    n.last_error = Some(why.to_owned());
                }
                state.clients.remove(id);
                state.sticky.retain(|_, t| t != target);
            }
            self.update_parallelism();
        }
    }
}

/// Decrements a target's in-flight count when a call ends.
pub(super) struct InFlight {
    dispatcher: Dispatcher,
    target: Route,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.dispatcher.lock();
        match &self.target {
            Route::Local => state.here.in_flight = state.here.in_flight.saturating_sub(1),
            Route::Node(id) => {
                if let Some(n) = state.node_mut(id) {
                    n.in_flight = n.in_flight.saturating_sub(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::Tier;

    fn device(name: &str, id: u8, address: Option<&str>) -> PairedDevice {
        PairedDevice {
            device_id: DeviceId::from_bytes([id; 32]),
            name: name.into(),
            paired_at: 0,
            last_seen: None,
            address: address.map(str::to_owned),
        }
    }

    #[test]
    fn the_nodes_follow_the_keyring_and_those_that_stay_keep_their_state() {
        let mut state = State::new(BTreeMap::new());
        let (desk, attic, cellar) =
            (device("desk", 1, Some("10.0.0.1:7000")), device("attic", 2, None), device("cellar", 3, Some("10.0.0.3:7000")));
        reconcile(&mut state, &[desk.clone(), attic.clone()]);
        assert_eq!(state.nodes.len(), 2);
        assert!(state.nodes.iter().all(|n| !n.healthy && n.last_error.as_deref() == Some("not probed yet")), "no work before a probe");
        assert_eq!(state.nodes[0].addr, Some("10.0.0.1:7000".parse().unwrap()));

        // desk answered and worked; attic's tier stuck to it.
        let n = state.node_mut(&desk.device_id).unwrap();
        (n.healthy, n.last_error, n.completed, n.tokens_per_s, n.tiers) = (true, None, 3, 80.0, vec![Tier::Tier2]);
        state.sticky.insert(Tier::Tier2, Route::Node(attic.device_id));
        state.sticky.insert(Tier::Tier1, Route::Node(desk.device_id));

        // attic forgotten, cellar paired, desk renamed: in the keyring's order.
        let renamed = PairedDevice { name: "study".into(), ..desk.clone() };
        reconcile(&mut state, &[cellar.clone(), renamed]);
        let names: Vec<&str> = state.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["cellar", "study"]);
        let kept = &state.nodes[1];
        assert!(kept.healthy && kept.last_error.is_none(), "its breaker stays as it was: {kept:?}");
        assert_eq!((kept.completed, kept.tokens_per_s, kept.tiers.as_slice()), (3, 80.0, &[Tier::Tier2][..]));
        assert!(!state.nodes[0].healthy, "cellar: not probed yet");
        assert_eq!(state.sticky.get(&Tier::Tier2), None, "nothing sticks to a forgotten node");
        assert_eq!(state.sticky.get(&Tier::Tier1), Some(&Route::Node(desk.device_id)));
        assert!(!state.paired_addrs.contains_key(&attic.device_id));
    }

    #[test]
    fn a_node_paired_again_at_a_new_address_is_reached_there_and_an_address_found_since_is_kept_otherwise() {
        let mut state = State::new(BTreeMap::new());
        let desk = device("desk", 1, Some("10.0.0.1:7000"));
        reconcile(&mut state, std::slice::from_ref(&desk));
        // mDNS found it elsewhere since; the keyring still says the old address.
        let found: std::net::SocketAddr = "10.0.0.9:7000".parse().unwrap();
        state.nodes[0].addr = Some(found);
        reconcile(&mut state, std::slice::from_ref(&desk));
        assert_eq!(state.nodes[0].addr, Some(found), "the keyring said nothing new");
        let moved = PairedDevice { address: Some("10.0.0.2:7000".into()), ..desk };
        reconcile(&mut state, &[moved]);
        assert_eq!(state.nodes[0].addr, Some("10.0.0.2:7000".parse().unwrap()), "paired again there");
    }
}
