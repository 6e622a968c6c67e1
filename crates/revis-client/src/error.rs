//! What goes wrong in the client layer: [`ClientError`] (a daemon not
//! there, a socket not to be trusted, a node not reached ([`NodeError`]),
//! a call refused), and how an error and its causes read as one line.

use std::net::SocketAddr;
use std::path::PathBuf;

use revis_trust::DeviceId;

use crate::api::{CallError, Code};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no revisd answers on {path}: {reason}")]
    NotRunning { path: PathBuf, reason: String },
    /// The socket may not be this user's daemon: nothing was sent to it.
    /// `reason` says why and what to do.
    #[error("refusing {path}: {reason}")]
    Untrusted { path: PathBuf, reason: String },
    /// A process ID that a daemon reported, not believed (see [`end_daemon`](crate::end_daemon)).
    #[error("refusing to signal process {pid}: {reason}")]
    NotDaemon { pid: u32, reason: String },
    #[error("could not start revisd: {0}")]
    Spawn(String),
    /// A call failed: the daemon refused it, or it could not be completed.
    #[error(transparent)]
    Call(#[from] CallError),
    #[error(transparent)]
    Models(#[from] revis_models::Error),
    #[error(transparent)]
    Trust(#[from] revis_trust::TrustError),
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("no paired node is called or has the ID {0:?}; `revis nodes` lists them, `revis pair NODE` pairs one")]
    UnknownNode(String),
    #[error("{0}")]
    Pairing(String),
}

impl ClientError {
    /// The error in words for a person: a daemon's own message without its
    /// gRPC code, anything else as it reads.
    pub fn words(&self) -> String {
        match self {
            ClientError::Call(c) => c.message.clone(),
            other => other.to_string(),
        }
    }

    /// As a failed call: what is not a daemon's answer (no daemon, a
    /// socket not to be trusted, a node that could not be reached) reads as
    /// UNAVAILABLE, with its own words.
    pub fn into_call(self) -> CallError {
        match self {
            ClientError::Call(c) => c,
            other => CallError::new(Code::Unavailable, other.to_string()),
        }
    }
}

/// Why a handshake with a node failed, in words a person can act on.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NodeError {
    #[error(
        "the machine at {addr} is not {name}: its certificate does not match the one paired (device ID {expected}); refusing to talk to it"
    )]
    NotThatNode { name: String, addr: SocketAddr, expected: DeviceId },
    #[error("{name} at {addr} refused this machine: it is not paired there (or was unpaired); pair again with `revis pair {name}`")]
    Refused { name: String, addr: SocketAddr },
    #[error("cannot reach {name} at {addr}: {reason}")]
    Unreachable { name: String, addr: SocketAddr, reason: String },
}

/// An error and its causes, `: `-joined; a cause that the text so far
/// already ends with (transport errors repeat their source) is not said twice.
pub(crate) fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let words = c.to_string();
        if !s.ends_with(&words) {
            s.push_str(": ");
            s.push_str(&words);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_is_said_once() {
        #[derive(Debug)]
        struct Wraps(std::io::Error);
        impl std::fmt::Display for Wraps {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "transport error: {}", self.0)
            }
        }
        impl std::error::Error for Wraps {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Wraps(std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"));
        assert_eq!(source_chain(&e), "transport error: no such file");
        let plain = std::io::Error::other(Wraps(std::io::Error::other("deep")));
        assert_eq!(source_chain(&plain), "transport error: deep");
        // Said earlier, but not as the end of the text: a cause of its own.
        let e = Wraps(std::io::Error::other("transport"));
        assert_eq!(source_chain(&e), "transport error: transport");
        #[derive(Debug)]
        struct Says(&'static str, std::io::Error);
        impl std::fmt::Display for Says {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Says {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.1)
            }
        }
        assert_eq!(source_chain(&Says("refused by the node", std::io::Error::other("refused"))), "refused by the node: refused");
        let e = std::io::Error::other(Wraps(std::io::Error::other("transport")));
        assert_eq!(source_chain(&e), "transport error: transport");
    }
}
