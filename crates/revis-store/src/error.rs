//! `StoreError`, the crate's one error type.

use std::path::PathBuf;

use crate::{ConversationId, MessageId};

/// Everything that can go wrong in the store.
///
/// Errors about opening name the database directory; errors about data name
/// the record (tree and key) or the id that was asked for.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The directory cannot be created, read or renamed (permissions, a
    /// regular file where the directory should be, a full disk).
    #[error("cannot use the database directory {path}: {source}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Another process (another revis) has the database open.
    #[error("the database at {path} is in use by another process")]
    Locked {
        /// The database directory.
        path: PathBuf,
    },
    /// The database was written by a newer revis; nothing was changed.
    #[error(
        "the database at {path} has schema version {found}, newer than the {supported} this revis \
         understands; use a newer revis (the database was left as it is)"
    )]
    NewerSchema {
        /// The database directory.
        path: PathBuf,
        /// The version on disk.
        found: u32,
        /// [`crate::SCHEMA_VERSION`].
        supported: u32,
    },
    /// The database was damaged and could not be replaced by a fresh one (the
    /// fresh one failed too).
    #[error("the database at {path} is damaged: {reason}")]
    Damaged {
        /// The database directory.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// sled failed while reading or writing an open database.
    #[error("database error in {path}: {source}")]
    Db {
        /// The database directory.
        path: PathBuf,
        /// sled's error, kept opaque so no other crate depends on sled.
        #[source]
        source: DbError,
    },
    /// A stored record cannot be decoded.
    #[error("the {tree} record {key} in {path} cannot be read: {source}")]
    Decode {
        /// The database directory.
        path: PathBuf,
        /// Which kind of record (the sled tree).
        tree: &'static str,
        /// Its key, readable.
        key: String,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// No conversation with this id.
    #[error("no conversation {0}")]
    NoConversation(ConversationId),
    /// No message with this id.
    #[error("no message {0}")]
    NoMessage(MessageId),
    /// `update_reply`/`complete_reply` on a user message or a finished reply.
    #[error("message {0} is not an open reply (it is a user message or already complete)")]
    NotAnOpenReply(MessageId),
    /// The revis process that holds the database (and serves it to the
    /// others, `share.rs`) could not be reached or failed otherwise.
    #[error("the revis process holding the database at {path}: {message}")]
    Shared {
        /// The database directory.
        path: PathBuf,
        /// What went wrong, in its words or ours.
        message: String,
    },
    /// The process holding the database ended during a write; this process
    /// holds it now, but whether that write was stored is not known.
    #[error(
        "the revis process holding the database at {path} ended during this change; it may or may not have been saved (look, then try again)"
    )]
    HolderGone {
        /// The database directory.
        path: PathBuf,
    },
    /// A summary must cover a message of its own conversation.
    #[error("message {message} is not in conversation {conversation}")]
    WrongConversation {
        /// The message given.
        message: MessageId,
        /// The conversation it was given for.
        conversation: ConversationId,
    },
}

/// sled's error, opaque: its message and source chain are all callers need.
#[derive(Debug)]
pub struct DbError(pub(crate) sled::Error);

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            sled::Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
