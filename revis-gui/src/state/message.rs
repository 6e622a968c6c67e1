//! A message as the chat view shows it: who wrote it, how it came to be
//! (complete, streaming, stopped…), and what the turn's gears said of an
//! answer (correction, escalation, tier3's follow-up), in words.

use revis_orchestrator::conversation::{EscalatedBy, Escalation, TurnRecord};
use revis_store::MessageId;

/// How a message on screen came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    Complete,
    /// Cut off (a crash, or stopped), as the store flags it.
    Incomplete,
    Streaming,
    Stopped,
    Failed,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub from_user: bool,
    pub text: String,
    pub shown: Shown,
    /// Pieces of a streamed answer applied so far (0 for stored messages).
    pub pieces: u32,
    /// The stored message, once known (an answer streaming now learns it from its first note).
    pub id: Option<MessageId>,
    /// What the turn's gears said of an answer.
    pub gears: Gears,
    /// The tier that wrote an answer (as stored).
    pub tier: Option<String>,
    /// Where an answer of this session ran, and its tokens, speed and
    /// cache reuse, in words (stored answers keep only their tier).
    pub footer: Option<String>,
}

impl Message {
    /// An empty message of the user's, complete (to build others from).
    pub fn user_message() -> Message {
        Message {
            from_user: true,
            text: String::new(),
            shown: Shown::Complete,
            pieces: 0,
            id: None,
            gears: Gears::default(),
            tier: None,
            footer: None,
        }
    }

    pub(super) fn user(text: String) -> Message {
        Message { text, ..Message::user_message() }
    }

    pub(super) fn answer() -> Message {
        Message { from_user: false, shown: Shown::Streaming, ..Message::user_message() }
    }
}

/// An answer's correction, escalation and deeper follow-up, as shown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gears {
    /// tier1's correction of the message, in words.
    pub correction: Option<String>,
    /// Why tier3 was asked to go deeper, in words.
    pub escalation: Option<String>,
    pub deep: Deep,
    /// The checklist tier2 went through before answering, when it is on.
    pub checklist: Option<String>,
}

/// tier3's follow-up of an answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Deep {
    #[default]
    None,
    /// Asked for; waits for the gates (the user pausing).
    Asked,
    Writing,
    Done(String),
    Failed(String),
}

impl Gears {
    /// The gears of a stored answer, from its record.
    pub fn of(r: &TurnRecord) -> Gears {
        let mut g = Gears::default();
        if let Some(c) = r.check.as_ref().filter(|c| !c.corrections.is_empty()) {
            g.correction = Some(correction(c, r.checked_before));
        }
        if let Some(e) = &r.escalation {
            g.escalation = Some(escalation(e));
        }
        if let Some(d) = &r.deep {
            g.deep = Deep::Done(d.clone());
        }
        g.checklist.clone_from(&r.notes);
        g
    }
}

pub(super) fn correction(c: &revis_orchestrator::check::QuickCheck, before: bool) -> String {
    let fixes: Vec<String> = c.corrections.iter().map(|c| format!("{} → {}", c.wrong, c.right)).collect();
    if before {
        format!("Read your message as \u{201c}{}\u{201d} ({})", c.corrected, fixes.join(", "))
    } else {
        format!("tier1 noticed a typo: {}", fixes.join(", "))
    }
}

pub(super) fn escalation(e: &Escalation) -> String {
    let who = match e.by {
        EscalatedBy::Check => "tier1's check",
        EscalatedBy::Checklist => "tier2's checklist",
        EscalatedBy::User => return "You asked tier3 to go deeper".to_owned(),
    };
    match &e.why {
        Some(why) => format!("{who} thinks this needs tier3: {why}"),
        None => format!("{who} thinks this needs tier3"),
    }
}
