//! What the next prompt is built from, read back from the store: the house
//! rules ([`RULES`]), the profile, the summary and the turns it does not
//! cover, each reply with its deeper follow-up.

use std::ops::Bound;

use revis_models::{ChatGears, Rules};
use revis_store::{ConversationId, MessageId, MessageState, Role, Store};

use super::error::ChatError;
use super::record::turn_record;
use crate::checklist;
use crate::prompt::{PromptContext, Speaker, Turn};

/// revis's house rules, for a model nobody measured ([`ChatGears::UNMEASURED`]):
/// plain instructions, nothing about who or where the assistant is (a small
/// model turns "a private assistant running on the user's own computer" into
/// role-play). Each measured model has the rules `revis-bench turn` chose for
/// it ([`rules_for`], docs/QUALITY.md).
pub const RULES: &str = "Answer the user's messages helpfully, briefly and honestly. If you do not know, say so.";

/// The rules a model's gears name, as the text that opens the system message (empty: none).
pub fn rules_for(gears: &ChatGears) -> String {
    match gears.rules {
        Rules::House => RULES.to_owned(),
        Rules::Own(text) => text.to_owned(),
        Rules::Nothing => String::new(),
    }
}

/// What the next prompt is built from, as the store holds it now (up to
/// `upto`: a reply followed up includes itself, a reply continued stops
/// before the message it answers, which the request adds), opened by
/// `rules`, with the profile when `profile`; the checklist joins the rules
/// when on.
/// A reply's deeper follow-up is part of that reply, for the model.
pub(super) fn build_context(
    store: &Store,
    conversation: ConversationId,
    rules: &str,
    profile: bool,
    checklist: bool,
    upto: Bound<MessageId>,
) -> Result<PromptContext, ChatError> {
    let summary = store.summary(conversation)?;
    let mut turns = Vec::new();
    for m in store.messages(conversation)? {
        // A reply cut off by a crash is kept in the store, flagged, but not shown to the model.
        let past = match upto {
            Bound::Included(u) => m.id > u,
            Bound::Excluded(u) => m.id >= u,
            Bound::Unbounded => false,
        };
        if m.state != MessageState::Complete || m.text.is_empty() || past {
            continue;
        }
        if summary.as_ref().is_some_and(|s| m.id <= s.covers_up_to) {
            continue;
        }
        let mut text = m.text;
        if m.role == Role::Assistant
            && let Some(deep) = turn_record(store, m.id)?.and_then(|r| r.deep).filter(|d| !d.is_empty())
        {
            text.push_str("\n\n");
            text.push_str(&deep);
        }
        turns.push(Turn { speaker: if m.role == Role::User { Speaker::User } else { Speaker::Assistant }, text });
    }
    let rules = match (rules.is_empty(), checklist) {
        (_, false) => rules.to_owned(),
        (true, true) => checklist::instructions(),
        (false, true) => format!("{rules}\n\n{}", checklist::instructions()),
    };
    let profile = if profile { store.facts()?.into_iter().map(|f| f.text).collect() } else { Vec::new() };
    Ok(PromptContext { rules, profile, summary: summary.map(|s| s.text), turns })
}
