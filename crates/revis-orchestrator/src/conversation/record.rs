//! A turn's record: what its gears found and did, stored with its reply
//! under [`turn_key`] ([`TurnRecord`], with the [`Escalation`] that asked
//! tier3 to follow up), and what they report as they go ([`TurnNote`]).

use revis_client::Tier;
use revis_store::{MessageId, Store};

use super::error::ChatError;
use crate::check::QuickCheck;

/// The settings key a turn's record ([`TurnRecord`]) is stored under.
pub fn turn_key(reply: MessageId) -> String {
    format!("turn/{reply}")
}

/// What a turn's gears found and did, stored with its reply.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TurnRecord {
    /// tier1's quick check, once it ran.
    pub check: Option<QuickCheck>,
    /// The check was ready before the answer, which then answered the corrected message.
    pub checked_before: bool,
    /// The language of the message, when revis was sure of it.
    pub language: Option<String>,
    /// The checklist tier2 went through (private: never shown as the answer).
    pub notes: Option<String>,
    pub escalation: Option<Escalation>,
    /// tier3's follow-up, once written.
    pub deep: Option<String>,
}

/// Why tier3 was asked to follow up.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Escalation {
    pub by: EscalatedBy,
    pub why: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EscalatedBy {
    /// tier1's quick check.
    Check,
    /// tier2's checklist said ESCALATE: yes.
    Checklist,
    /// The user asked (a command or a button).
    User,
}

/// What a turn's gears report as they go, for a CLI or GUI to show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TurnNote {
    /// tier1 checked the message: before the answer (its corrections were
    /// answered) or after it (shown only).
    Checked {
        reply: MessageId,
        check: QuickCheck,
        before_answer: bool,
    },
    /// tier1 or the checklist says the answer needs the deep tier, or the
    /// user asked; `queued`: tier3 follows up (when the gates let it).
    Escalated {
        reply: MessageId,
        escalation: Escalation,
        queued: bool,
    },
    /// tier3 started writing.
    DeepStarted {
        reply: MessageId,
        tier: Tier,
    },
    /// tier3's follow-up, whole.
    Deep {
        reply: MessageId,
        text: String,
    },
    DeepFailed {
        reply: MessageId,
        error: String,
    },
}

/// A reply's record, if it has one.
pub fn turn_record(store: &Store, reply: MessageId) -> Result<Option<TurnRecord>, ChatError> {
    Ok(store.setting(&turn_key(reply))?.and_then(|v| serde_json::from_value(v).ok()))
}
