//! What the dispatcher's API speaks in: a tier's [`Offload`], our own
//! [`Deadlines`], where a task runs ([`Route`]) and a tier runs
//! ([`Placement`]), a paired node as seen ([`NodeView`]) and a call that
//! went elsewhere ([`Fallback`]). Plain data, shared by every room of the
//! dispatcher.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use revis_trust::DeviceId;

use crate::api::Tier;

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
/// daemon a [`Client`](crate::Client) is connected to).
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
