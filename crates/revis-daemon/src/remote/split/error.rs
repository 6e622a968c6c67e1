//! A split tier's errors, and the one place each becomes the `Status` a
//! caller sees.

use std::path::PathBuf;

use revis_proto::Tier;
use tonic::Status;

/// Why a split tier cannot answer now (each becomes its `Status` below).
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// The engine cannot run now: it did not start, or a node was lost.
    #[error("{tier} is split across {nodes} and cannot run now: {why}")]
    Unavailable { tier: Tier, nodes: String, why: String },
    /// This machine has paired with no node yet.
    #[error("{tier} is split across {nodes}, but this machine has paired with no node: pair it first (`revis pair {first}`)")]
    NotPaired { tier: Tier, nodes: String, first: String },
    /// A node the config names is not a paired node.
    #[error(
        "{tier} is split across {nodes}, but no paired node is called {name:?}; `revis nodes` lists them, `revis pair {name}` pairs it"
    )]
    UnknownNode { tier: Tier, nodes: String, name: String },
    /// Where a paired node is has not been seen yet.
    #[error("{tier} is split across {nodes}, but where {name} is has not been seen yet; `revis nodes` finds it")]
    NodeUnseen { tier: Tier, nodes: String, name: String },
    /// The engine's run directory cannot be made.
    #[error("{}: {source}", path.display())]
    RunDir { path: PathBuf, source: std::io::Error },
    /// The pipe the engine says it is ready on.
    #[error("pipe: {0}")]
    Pipe(std::io::Error),
    /// Where revisd's own executable is, to start the engine from.
    #[error("{0}")]
    Exe(std::io::Error),
    #[error("starting the split engine: {0}")]
    Spawn(std::io::Error),
    /// This user's identity or paired nodes (the keyring `revis pair` writes).
    #[error("{0}")]
    Keyring(revis_trust::TrustError),
    /// The engine's own answer to a forwarded call, passed on as it is.
    #[error("{}", .0.message())]
    Engine(Status),
}

impl From<SplitError> for Status {
    fn from(e: SplitError) -> Status {
        let msg = e.to_string();
        match e {
            SplitError::Unavailable { .. } => Status::unavailable(msg),
            SplitError::NotPaired { .. } | SplitError::UnknownNode { .. } | SplitError::NodeUnseen { .. } => {
                Status::failed_precondition(msg)
            }
            SplitError::RunDir { .. } | SplitError::Pipe(_) | SplitError::Exe(_) | SplitError::Spawn(_) | SplitError::Keyring(_) => {
                Status::internal(msg)
            }
            // The engine's own answer, code, message and metadata as they came.
            SplitError::Engine(s) => s,
        }
    }
}
