//! The daemon's errors and their mapping to gRPC status codes: every
//! [`DaemonError`] becomes its `Status` here and nowhere else. The rooms
//! with errors of their own map them beside their definitions, in one
//! place each: server mode's `RemoteError` in `remote/mod.rs`, a split
//! tier's `SplitError` in `remote/split/error.rs`.

use revis_engine::EngineError;
use tonic::{Code, Status};

/// How long a client should wait before retrying after a full queue.
pub const RETRY_AFTER_MS: u64 = 1000;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The request is malformed or breaks a limit that retrying will not fix.
    #[error("{0}")]
    Invalid(String),
    /// The request is bigger than a size limit.
    #[error("{0}")]
    TooLarge(String),
    #[error(
        "the queue is full ({capacity} requests waiting besides those running, daemon.queue_capacity); retry in {}s",
        RETRY_AFTER_MS / 1000
    )]
    QueueFull { capacity: usize },
    /// The caller fell a buffer behind a Generate's text and took too little
    /// of it within the stall timeout (`rpc/stream.rs`).
    #[error(
        "the caller fell behind the answer and took fewer than {progress} pieces of it in {}s (daemon.stall_timeout_s); revisd stopped it so other requests could go on",
        timeout.as_secs()
    )]
    Stalled {
        timeout: std::time::Duration,
        /// The pieces it had to take each timeout (`rpc::stream::STALL_PROGRESS`).
        progress: usize,
    },
    #[error("revisd is shutting down")]
    ShuttingDown,
    /// A Generate cancelled by the shutdown before it finished.
    #[error("revisd is shutting down; the answer was cut short")]
    CutShort,
    /// A paired device's connection closed while its call waited for a place.
    #[error("this connection is closing")]
    ConnectionClosing,
    /// An Admin call a paired device made over the network.
    #[error("{call} is for the local socket only; paired devices may run tasks and read Status, nothing else")]
    LocalOnly { call: &'static str },
    /// Another user called the local socket.
    #[error("uid {uid} may not use this revisd; it serves only its own user (uid {own})")]
    OtherUser { uid: u32, own: u32 },
    /// The local socket could not say who is calling.
    #[error("cannot tell which user is calling; refusing")]
    UnknownUser,
    /// A model whose chat template ran past `daemon.render_timeout_s` or
    /// `daemon.render_memory_mb` on a prompt: not used again until the
    /// model is loaded again.
    #[error("{0}")]
    TemplateBroken(String),
    /// A shared resource stayed busy past its limit; retrying may work.
    #[error("{0}")]
    Busy(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<DaemonError> for Status {
    fn from(e: DaemonError) -> Status {
        let msg = e.to_string();
        match e {
            DaemonError::Invalid(_) => Status::invalid_argument(msg),
            DaemonError::TooLarge(_) => Status::resource_exhausted(msg),
            DaemonError::QueueFull { .. } => {
                let mut s = Status::resource_exhausted(msg);
                // gRFC A6's server pushback: the client may retry after this many ms.
                s.metadata_mut().insert("grpc-retry-pushback-ms", RETRY_AFTER_MS.into());
                s
            }
            DaemonError::Stalled { .. } => Status::deadline_exceeded(msg),
            DaemonError::TemplateBroken(_) => Status::failed_precondition(msg),
            DaemonError::Busy(_) => Status::unavailable(msg),
            DaemonError::ShuttingDown | DaemonError::CutShort | DaemonError::ConnectionClosing => Status::unavailable(msg),
            DaemonError::LocalOnly { .. } | DaemonError::OtherUser { .. } | DaemonError::UnknownUser => Status::permission_denied(msg),
            DaemonError::Engine(e) => {
                let code = match e {
                    EngineError::PromptTooLong { .. }
                    | EngineError::InvalidSchema(_)
                    | EngineError::Grammar(_)
                    | EngineError::EmptyContinuation
                    | EngineError::EmbedTooLong { .. }
                    | EngineError::Template(_)
                    | EngineError::Tools(_) => Code::InvalidArgument,
                    EngineError::Load { .. } | EngineError::TemplateLimit { .. } => Code::FailedPrecondition,
                    EngineError::NotLoaded(_) | EngineError::Stopped => Code::Unavailable,
                    EngineError::Llama(_) => Code::Internal,
                };
                Status::new(code, msg)
            }
        }
    }
}
