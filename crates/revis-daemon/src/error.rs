//! The daemon's errors and their one mapping to gRPC status codes.

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
    /// The caller took none of a Generate's text for the stall timeout.
    #[error(
        "the caller took none of the answer for {}s (daemon.stall_timeout_s); revisd stopped it so other requests could go on",
        timeout.as_secs()
    )]
    Stalled { timeout: std::time::Duration },
    #[error("revisd is shutting down")]
    ShuttingDown,
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
            DaemonError::ShuttingDown => Status::unavailable(msg),
            DaemonError::Engine(e) => {
                let code = match e {
                    EngineError::PromptTooLong { .. }
                    | EngineError::InvalidSchema(_)
                    | EngineError::Grammar(_)
                    | EngineError::EmptyContinuation
                    | EngineError::EmbedTooLong { .. }
                    | EngineError::Template(_) => Code::InvalidArgument,
                    EngineError::Load { .. } => Code::FailedPrecondition,
                    EngineError::NotLoaded(_) | EngineError::Stopped => Code::Unavailable,
                    EngineError::Llama(_) => Code::Internal,
                };
                Status::new(code, msg)
            }
        }
    }
}
