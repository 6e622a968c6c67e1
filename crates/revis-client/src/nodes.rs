//! The other machines as a person sees them, shared by `revis nodes` and the
//! desktop app: paired nodes (where they are now, probed over mutual TLS),
//! then advertisements of machines not paired, and what "pair with NAME"
//! means among them.

use std::net::SocketAddr;
use std::time::Instant;

use revis_trust::{DeviceId, Discovered};

use crate::{Client, Keyring, Node};

/// A node as the lists show it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRow {
    pub name: String,
    pub device_id: String,
    pub paired: bool,
    /// Seen on the network just now.
    pub discovered: bool,
    /// Where it was seen, else where it was last reached (paired).
    pub address: Option<String>,
    pub health: Health,
    /// Set when an unpaired advertisement uses a paired node's name.
    pub warning: Option<String>,
}

/// What a probe of a paired node found.
#[derive(Clone, Debug, PartialEq)]
pub enum Health {
    /// Not paired, or not probed yet.
    Unknown,
    Ok {
        connect_ms: f64,
        /// Round trip of a Status call on the new connection.
        latency_ms: f64,
        /// (tier, model, state)
        tiers: Vec<(String, String, String)>,
        /// "depth/capacity"
        queue: String,
    },
    Failed(String),
}

/// The warning on an advertisement that uses a paired node's name.
pub const NOT_THAT_NODE: &str = "uses the name of a paired node but has another device ID: not that node, ignored";

/// Paired nodes first (with where they are now), then what is advertised and not paired.
pub fn node_rows(keyring: &Keyring, seen: &[Discovered]) -> Vec<NodeRow> {
    let mut rows = Vec::new();
    for d in keyring.store.devices() {
        let ad = seen.iter().find(|s| s.device_id == d.device_id);
        let addr = ad.and_then(|s| s.addresses.first().copied()).or_else(|| d.address.as_deref().and_then(|a| a.parse().ok()));
        rows.push(NodeRow {
            name: d.name.clone(),
            device_id: d.device_id.to_string(),
            paired: true,
            discovered: ad.is_some(),
            address: addr.map(|a: SocketAddr| a.to_string()),
            health: Health::Unknown,
            warning: None,
        });
    }
    for s in seen.iter().filter(|s| keyring.store.get(&s.device_id).is_none()) {
        let warning = keyring.store.devices().iter().any(|d| d.name == s.name).then(|| NOT_THAT_NODE.to_owned());
        rows.push(NodeRow {
            name: s.name.clone(),
            device_id: s.device_id.to_string(),
            paired: false,
            discovered: true,
            address: s.addresses.first().map(|a| a.to_string()),
            health: Health::Unknown,
            warning,
        });
    }
    rows
}

/// Connects to a paired node's row over mutual TLS and reads its Status.
pub async fn probe(keyring: &Keyring, row: &NodeRow) -> Health {
    let Some(addr) = row.address.as_deref().and_then(|a| a.parse().ok()) else {
        return Health::Failed("not found on the network, and no address is known".into());
    };
    let Ok(device_id) = row.device_id.parse() else { return Health::Failed("a damaged device ID in the keyring".into()) };
    let node = Node { name: row.name.clone(), device_id, addr };
    let t0 = Instant::now();
    let c = match Client::connect_node(keyring, &node).await {
        Ok(c) => c,
        Err(e) => return Health::Failed(e.words()),
    };
    let connect_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = Instant::now();
    match c.status().await {
        Ok(s) => Health::Ok {
            connect_ms,
            latency_ms: t1.elapsed().as_secs_f64() * 1e3,
            tiers: s.tiers.iter().map(|t| (t.tier.to_string(), t.model.clone(), t.state.as_str().to_owned())).collect(),
            queue: format!("{}/{}", s.queue_depth, s.queue_capacity),
        },
        Err(e) => Health::Failed(e.words()),
    }
}

/// Whether `d` is the machine a person named (its name, or its device ID).
pub fn names(d: &Discovered, what: &str) -> bool {
    match what.parse::<DeviceId>() {
        Ok(id) => d.device_id == id,
        Err(_) => d.name == what,
    }
}

/// Where to pair: an address as given (listed under its IP), or the one
/// advertisement whose name or device ID is `what`.
pub fn find_unpaired(what: &str, seen: &[Discovered]) -> Result<(SocketAddr, String), String> {
    if let Ok(addr) = what.parse::<SocketAddr>() {
        return Ok((addr, addr.ip().to_string()));
    }
    let found: Vec<&Discovered> = seen.iter().filter(|d| names(d, what)).collect();
    match found.as_slice() {
        [] => Err(format!(
            "no machine called {what:?} answered on the network; is its server mode on (`revisd server on`)? You can also give HOST:PORT"
        )),
        [d] => d.addresses.first().map(|a| (*a, d.name.clone())).ok_or_else(|| format!("{what} advertised no IPv4 address")),
        several => {
            let ids: Vec<String> = several.iter().map(|d| d.device_id.to_string()).collect();
            Err(format!(
                "several machines are called {what:?}; pair by device ID instead (compare with the code screen on the machine you mean): {}",
                ids.join(", ")
            ))
        }
    }
}
