//! The dispatcher's shared state: the [`Dispatcher`] handle (cheap to
//! clone) and the [`State`] behind its lock (nodes, connections, offload,
//! ensembles, loads, fallbacks), which every room of the dispatcher reads
//! and changes.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use revis_trust::{DeviceId, Interfaces};
use tokio::sync::watch;

use super::routing::LocalLoad;
use super::types::{Deadlines, Fallback, NodeView, Offload, Route};
use crate::api::Tier;
use crate::ensemble::{EnsembleSpec, Weights};
use crate::{Client, Keyring};

/// Fallbacks remembered for [`Dispatcher::fallbacks`].
pub(super) const FALLBACKS_KEPT: usize = 32;

pub(super) struct State {
    /// The paired nodes, in the order they were paired.
    pub(super) nodes: Vec<NodeView>,
    /// A connection to each node whose breaker is closed.
    pub(super) clients: HashMap<DeviceId, Client>,
    /// Each node's address as the keyring last said it (a node paired
    /// again at a new address is reached there).
    pub(super) paired_addrs: HashMap<DeviceId, Option<SocketAddr>>,
    pub(super) offload: BTreeMap<Tier, Offload>,
    /// Tiers answered by an ensemble of models.
    pub(super) ensembles: BTreeMap<Tier, EnsembleSpec>,
    /// What each tier's ensemble learned about its members (`cross`).
    pub(super) ensemble_weights: HashMap<Tier, Arc<Mutex<Weights>>>,
    /// Tiers whose model this dispatcher unloaded here (to bring home later).
    pub(super) unloaded_here: HashSet<Tier>,
    /// The target the last pre-prefill of a tier went to.
    pub(super) sticky: HashMap<Tier, Route>,
    pub(super) here: LocalLoad,
    pub(super) local_completed: u64,
    pub(super) fallbacks: VecDeque<Fallback>,
    /// When mDNS was last asked (it is asked only for nodes not answering).
    pub(super) last_browse: Option<Instant>,
}

impl State {
    pub(super) fn new(offload: BTreeMap<Tier, Offload>) -> State {
        State {
            nodes: Vec::new(),
            clients: HashMap::new(),
            paired_addrs: HashMap::new(),
            offload,
            ensembles: BTreeMap::new(),
            ensemble_weights: HashMap::new(),
            unloaded_here: HashSet::new(),
            sticky: HashMap::new(),
            here: LocalLoad::default(),
            local_completed: 0,
            fallbacks: VecDeque::new(),
            last_browse: None,
        }
    }

    pub(super) fn offload(&self, tier: Tier) -> Offload {
        self.offload.get(&tier).cloned().unwrap_or_default()
    }

    pub(super) fn node_mut(&mut self, id: &DeviceId) -> Option<&mut NodeView> {
        self.nodes.iter_mut().find(|n| n.device_id == *id)
    }
}

/// Sends each task to the daemon that should run it. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    pub(super) local: Client,
    pub(super) keyring: Option<Arc<Keyring>>,
    pub(super) discovery: Option<Interfaces>,
    pub(super) deadlines: Deadlines,
    pub(super) state: Arc<Mutex<State>>,
    pub(super) parallelism: Arc<watch::Sender<usize>>,
    /// Every task goes to this node alone ([`Dispatcher::on_node`]).
    pub(super) pinned: Option<DeviceId>,
}

impl Dispatcher {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
