//! Tiers split across machines (`tiers.X.split = ["desktop"]`): the model's
//! first layers here, its later layers on paired nodes that lend (`lend.rs`
//! on their side), over llama.cpp's RPC backend.
//!
//! llama.cpp's RPC client aborts its process when a node disappears, so a
//! split model never loads in revisd: it runs in a split engine, a child
//! `revisd split-engine` serving that tier on a private Unix socket, and
//! revisd forwards the tier's calls to it. The engine runs in a network
//! namespace of its own (`private_net`): its RPC client dials ports on that
//! private loopback, where the engine itself accepts and hands each
//! connection to revisd as a descriptor over a socket pair made at spawn;
//! revisd carries it to one node's server-mode port under mutual TLS (ALPN
//! `revis-rpc/1`, pinned to the node's device ID, with this user's client
//! identity). No other local process can reach those ports, so none rides
//! this user's paired identity. A node lost mid-answer ends that
//! engine; the call gets UNAVAILABLE naming the node, every other tier goes
//! on, and the next call starts the engine again.
//!
//! The room: the engines as revisd runs them (which tiers share one,
//! starting, restarting and stopping it, forwarding calls) in `engine.rs`;
//! the tunnels to the nodes, both ends, in `tunnel.rs`; the engine's
//! command line, one definition for both sides, in `flags.rs`; inside the
//! engine, placing the layers and its configuration, in `placement.rs`; the
//! errors and their `Status` in `error.rs`.

mod engine;
mod error;
mod flags;
mod placement;
mod tunnel;

pub use self::engine::{ENGINE_START, SplitEngine, Splits, forward_stream};
pub use self::error::SplitError;
pub use self::flags::EngineFlags;
pub use self::placement::{EngineArgs, describe, engine_config};
pub use self::tunnel::{NODE_CONNECT, NODE_SILENCE, TUNNELS_FD, engine_endpoints};
