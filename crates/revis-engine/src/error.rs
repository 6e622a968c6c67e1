//! The engine's one error type, and which bound of a rendering process a
//! chat template went past.

use std::path::PathBuf;

#[derive(Clone, Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot load model {path}: {reason}")]
    Load { path: PathBuf, reason: String },
    #[error("chat template failed: {0}")]
    Template(String),
    /// The chat template went past a bound of its rendering process
    /// ([`crate::render`]): `what`, after "the chat template".
    #[error("the chat template {what}")]
    TemplateLimit { what: String, bound: Bound },
    #[error("prompt is {tokens} tokens, more than the context of {n_ctx} tokens allows")]
    PromptTooLong { tokens: usize, n_ctx: u32 },
    #[error("invalid JSON schema: {0}")]
    InvalidSchema(String),
    #[error("invalid grammar: {0}")]
    Grammar(String),
    /// The functions offered, or the choice among them, cannot be used.
    #[error("{0}")]
    Tools(String),
    #[error("the continuation to score is empty after tokenization")]
    EmptyContinuation,
    #[error("a text to embed is {tokens} tokens; the limit is {limit} tokens a text")]
    EmbedTooLong { tokens: usize, limit: usize },
    #[error("model {0} is not loaded")]
    NotLoaded(String),
    #[error("the engine thread has stopped")]
    Stopped,
    #[error("llama.cpp failed: {0}")]
    Llama(String),
}

/// Which bound of a rendering process a template went past.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Its memory: the process ended (the allocator aborts when the limit refuses it), or crashed.
    Memory,
    /// Its time: the process was killed.
    Time,
}
