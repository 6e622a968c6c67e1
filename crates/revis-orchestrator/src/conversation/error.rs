//! What can go wrong in a turn ([`ChatError`]), and the one way the turn's
//! store work leaves the async runtime ([`blocking`]).

use revis_client::CallError;

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error(transparent)]
    Store(#[from] revis_store::StoreError),
    /// The answer could not be had (the daemon refused or failed it).
    #[error("the daemon failed: {}", .0.message)]
    Call(#[from] CallError),
    /// What was asked cannot be done as it is (a message empty or over a
    /// limit, a rewind or a continuation of a message it does not apply
    /// to), in words; nothing was stored or removed.
    #[error("{0}")]
    Refused(String),
    /// The reply's writer thread (or a store task) ended unexpectedly.
    #[error("{0}")]
    Writer(String),
}

/// Runs store work (which blocks: sled fsyncs) off the async runtime.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ChatError> + Send + 'static) -> Result<T, ChatError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ChatError::Writer(format!("a store task failed: {e}")))?
}
