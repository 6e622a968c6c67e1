//! The public data types: ids, conversations, messages, facts, summaries.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A conversation's id: 1, 2, 3, … in creation order, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConversationId(pub u64);

/// A message's id: its conversation and its place in it (0, 1, 2, … in the
/// order written). Never given twice: messages removed by
/// [`crate::Store::rewind`] leave gaps, and the next message comes after them.
///
/// Written `conversation:seq`, e.g. `3:0` for the first message of
/// conversation 3. Ordering is conversation, then seq: the order of the keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MessageId {
    /// The conversation the message belongs to.
    pub conversation: ConversationId,
    /// Its position in the conversation, from 0 (increasing, with gaps where messages were rewound).
    pub seq: u64,
}

/// A profile fact's id: 1, 2, 3, … in creation order, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FactId(pub u64);

impl fmt::Display for ConversationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.conversation, self.seq)
    }
}

impl fmt::Display for FactId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An id that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseIdError(String);

impl fmt::Display for ParseIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not an id: {:?}", self.0)
    }
}

impl std::error::Error for ParseIdError {}

impl FromStr for ConversationId {
    type Err = ParseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self).map_err(|_| ParseIdError(s.to_owned()))
    }
}

impl FromStr for FactId {
    type Err = ParseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self).map_err(|_| ParseIdError(s.to_owned()))
    }
}

impl FromStr for MessageId {
    type Err = ParseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseIdError(s.to_owned());
        let (conversation, seq) = s.split_once(':').ok_or_else(bad)?;
        Ok(MessageId { conversation: conversation.parse().map_err(|_| bad())?, seq: seq.parse().map_err(|_| bad())? })
    }
}

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user.
    User,
    /// The model.
    Assistant,
}

/// Whether a message is whole.
///
/// User messages are always `Complete`. A reply is `Incomplete` from
/// [`crate::Store::begin_reply`] until [`crate::Store::complete_reply`]; one
/// found `Incomplete` after a restart was cut off (crash, daemon gone) and its
/// text is whatever part of the stream was saved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageState {
    /// The reply's stream has not ended (or never will: it was cut off).
    Incomplete,
    /// The message is whole.
    Complete,
}

/// A conversation, as listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversation {
    /// Its id.
    pub id: ConversationId,
    /// Its title.
    pub title: String,
    /// When it was created, unix milliseconds.
    pub created_ms: u64,
    /// When a message was last added, completed or rewound, or the title changed.
    pub updated_ms: u64,
    /// How many messages it holds (complete or not).
    pub message_count: u64,
}

/// A message as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMessage {
    /// Its id (conversation and position).
    pub id: MessageId,
    /// Who wrote it.
    pub role: Role,
    /// Its text (for an incomplete reply: the part saved so far).
    pub text: String,
    /// Whole or cut off.
    pub state: MessageState,
    /// The tier that wrote a reply (`None` for user messages).
    pub tier: Option<String>,
    /// When it was written (a reply: when its stream began), unix ms.
    pub created_ms: u64,
    /// When a reply was completed, unix ms.
    pub completed_ms: Option<u64>,
}

/// A fact about the user, for the profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fact {
    /// Its id.
    pub id: FactId,
    /// The fact, in words.
    pub text: String,
    /// The message it was learned from, if any (it may since have been
    /// deleted with its conversation).
    pub source: Option<MessageId>,
    /// The words of that message it rests on, exactly as the person wrote
    /// them (None: added by hand, merged, or stored before revis kept them).
    pub said: Option<String>,
    /// When it was added, unix ms.
    pub created_ms: u64,
}

/// A conversation's summary (one per conversation; a new one replaces it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// The conversation summarised.
    pub conversation: ConversationId,
    /// The last message the summary covers.
    pub covers_up_to: MessageId,
    /// The summary.
    pub text: String,
    /// When it was written, unix ms.
    pub created_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_and_parse() {
        let m = MessageId { conversation: ConversationId(3), seq: 14 };
        assert_eq!(m.to_string(), "3:14");
        assert_eq!("3:14".parse::<MessageId>(), Ok(m));
        assert_eq!("7".parse::<ConversationId>(), Ok(ConversationId(7)));
        assert_eq!("7".parse::<FactId>(), Ok(FactId(7)));
        for bad in ["", "3", "3:", ":1", "a:1", "1:2:3", "-1:0"] {
            assert!(bad.parse::<MessageId>().is_err(), "{bad:?} parsed");
        }
        assert!("x".parse::<ConversationId>().is_err());
    }
}
