//! Which daemon a client talks to: this machine's over its Unix socket, or
//! a paired [`Node`] over mutual TLS ([`Target`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use revis_trust::DeviceId;

/// Which daemon a [`Client`](crate::Client) talks to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The local daemon, over its Unix socket.
    Socket(PathBuf),
    /// A paired daemon on another machine, over mutual TLS.
    Node(Node),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Socket(p) => write!(f, "{}", p.display()),
            Target::Node(n) => write!(f, "{} at {} (mutual TLS)", n.name, n.addr),
        }
    }
}

/// A paired daemon and where to reach it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub device_id: DeviceId,
    pub addr: SocketAddr,
}
