//! The core of `revisd`, the revis inference daemon: configuration, tiers
//! and models, the priority queue, the gRPC services and the Unix socket.
//! The `revisd` binary is a thin main over [`server::run`].

pub mod admission;
pub mod authority;
pub mod child;
pub mod config;
pub mod error;
pub mod lend;
pub mod registry;
pub mod remote;
pub mod rpc;
pub mod scheduler;
pub mod server;
pub mod socket;
pub mod split;
pub mod validate;

pub use config::{Config, ConfigError};
pub use server::{ServeError, run};
pub use socket::{SocketError, bind, default_socket_path};
