//! The core of `revisd`, the revis inference daemon. The `revisd` binary is
//! a thin main over [`server::run`]. Where things are:
//!
//! - [`server`]: putting the daemon together (engine, registry, queue
//!   worker, services, both listeners) and its shutdown.
//! - [`config`]: the config file, read and checked into [`Config`].
//! - [`transport`]: how calls arrive (the Unix socket, the `:authority`
//!   fix, who is calling, the admission gate); knows nothing of server mode.
//! - [`rpc`]: the gRPC services (Inference and Admin handlers, Generate's
//!   stream, prompt building) over one shared service struct.
//! - [`validate`]: each request turned into a `Valid*` type, its limits named.
//! - [`registry`]: the tiers' models, loaded on demand, leased, unloaded when idle.
//! - [`scheduler`]: the bounded priority queue and the worker that feeds the engine.
//! - [`remote`]: the multi-machine family: server mode (TLS port, pairing,
//!   connections), lending, split tiers, and their child processes.
//! - [`error`]: the daemon's errors and their one mapping to gRPC `Status`.

pub mod config;
pub mod error;
pub mod registry;
pub mod remote;
pub mod rpc;
pub mod scheduler;
pub mod server;
pub mod speed;
pub mod transport;
pub mod validate;

pub use config::{Config, ConfigError};
pub use revis_engine::Threads;
pub use server::{ServeError, run};
pub use transport::socket::{SocketError, bind, default_socket_path};
