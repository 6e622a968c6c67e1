//! The client library of revis: connects to `revisd` over its Unix socket
//! (starting a daemon when none answers) and exposes its API. The `revis`
//! CLI and the GUI both sit on top of this crate.
//!
//! Only this crate speaks the wire: its public API is domain types
//! ([`api`]); the raw gRPC stubs are reachable through `Client::wire`
//! only with the `wire` cargo feature, which only the end-to-end tests and
//! the benchmarks enable (`cargo xtask layers` checks).

// The domain types a daemon is spoken to in, [`CallError`] and [`Runner`].
pub mod api;
// [`Client`]: one connection to one daemon, its calls and their one retry rule.
mod client;
// Which daemon runs which task: this machine's or a paired node's, with failover.
pub mod dispatch;
// Several models answering one tier together.
pub mod ensemble;
// [`ClientError`] and [`NodeError`], and an error's causes in one line.
mod error;
// A Generate's events folded into its finished answer ([`DoneFold`]).
mod fold;
// Dialling this machine's daemon, and only this user's.
mod local;
// Paired nodes as `revis nodes` and the GUI list them, with their health.
pub mod nodes;
// Where this user's data and the daemon's socket are.
pub mod paths;
// Paired daemons on other machines: mutual TLS, pairing, finding them.
mod remote;
// Starting, restarting and ending a local daemon.
mod spawn;
// How fast models would decode here: the machine's probes and a real decode.
pub mod speed;
// Which daemon a client talks to: this machine's or a paired node.
mod target;
// The edge between the domain types and `revis.v1` (public with the `wire` feature).
#[cfg(feature = "wire")]
pub mod wire;
#[cfg(not(feature = "wire"))]
mod wire;

pub use api::*;
pub use client::{Client, GenerateStream, PairingEvents};
pub use error::{ClientError, NodeError};
pub use fold::DoneFold;
pub use local::LOCAL_CONNECT_TIMEOUT;
pub use paths::Paths;
pub use remote::{
    CONNECT_TIMEOUT, Keyring, MAX_CANDIDATE_ADDRESSES, NODE_PING_INTERVAL, NODE_PING_TIMEOUT, NODE_TCP_PROBE_INTERVAL, NODE_TCP_PROBES,
    PAIR_TIMEOUT, interfaces_from_env, pair, resolve,
};
pub use revis_proto::default_socket_path;
pub use revis_trust::{DeviceId, Discovered, Interfaces, PairingCode, browse, host_name};
pub use spawn::{
    RESTART_WAIT, Restarted, START_TIMEOUT, SpawnOptions, check_config, end_daemon, readiness_pipe, restart_daemon, spawn_daemon,
};
pub use target::{Node, Target};
