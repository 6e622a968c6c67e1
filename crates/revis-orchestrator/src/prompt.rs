//! Prompts as a static prefix (system rules, profile, summary, earlier
//! turns) plus a dynamic suffix (the new message). The static messages are
//! built once from the context and used, byte for byte, both for the
//! pre-prefill and for the real request.

use revis_client::{GenerateParams, Message, Priority, Role, Tier};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speaker {
    User,
    Assistant,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    pub speaker: Speaker,
    pub text: String,
}

/// Everything a prompt is built from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromptContext {
    pub rules: String,
    /// Facts about the user, in the order they are shown.
    pub profile: Vec<String>,
    /// Summary of turns no longer shown in full.
    pub summary: Option<String>,
    /// Earlier turns shown in full.
    pub turns: Vec<Turn>,
}

impl PromptContext {
    /// The system message: rules, then the profile, then the summary.
    pub fn system_text(&self) -> String {
        let mut s = self.rules.clone();
        if !self.profile.is_empty() {
            s.push_str("\n\nWhat you know about the user:");
            for f in &self.profile {
                s.push_str("\n- ");
                s.push_str(f);
            }
        }
        if let Some(sum) = self.summary.as_deref().filter(|s| !s.is_empty()) {
            s.push_str("\n\nSummary of the conversation so far:\n");
            s.push_str(sum);
        }
        s
    }

    /// The static part: what a pre-prefill sends and every answer starts with.
    pub fn static_messages(&self) -> Vec<Message> {
        let mut out = Vec::with_capacity(self.turns.len() + 1);
        let system = self.system_text();
        if !system.is_empty() {
            out.push(Message::system(system));
        }
        for t in &self.turns {
            let role = match t.speaker {
                Speaker::User => Role::User,
                Speaker::Assistant => Role::Assistant,
            };
            if !t.text.is_empty() {
                out.push(Message::new(role, t.text.clone()));
            }
        }
        out
    }

    /// The request that answers `new_message`: static part + the new message.
    pub fn request(&self, tier: Tier, new_message: &str) -> GenerateParams {
        let mut messages = self.static_messages();
        let static_count = messages.len() as u32;
        messages.push(Message::user(new_message));
        GenerateParams { tier, messages, static_messages: Some(static_count), priority: Priority::User, ..Default::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every byte the daemon sees of a list of messages: roles, lengths, contents.
    fn bytes(m: &[Message]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in m {
            out.push(m.role as u8);
            out.extend_from_slice(&(m.text.len() as u64).to_le_bytes());
            out.extend_from_slice(m.text.as_bytes());
        }
        out
    }

    fn turn() -> impl Strategy<Value = Turn> {
        (any::<bool>(), "\\PC{0,30}").prop_map(|(u, text)| Turn { speaker: if u { Speaker::User } else { Speaker::Assistant }, text })
    }

    fn context() -> impl Strategy<Value = PromptContext> {
        (
            "\\PC{0,40}",
            proptest::collection::vec("\\PC{1,20}", 0..4),
            proptest::option::of("\\PC{0,40}"),
            proptest::collection::vec(turn(), 0..8),
        )
            .prop_map(|(rules, profile, summary, turns)| PromptContext { rules, profile, summary, turns })
    }

    proptest! {
        /// The pre-prefill and the real request carry byte-identical static parts.
        #[test]
        fn the_static_part_is_byte_identical(ctx in context(), next in "\\PC{1,30}") {
            let prefill = ctx.static_messages();
            let req = ctx.request(Tier::Tier2, &next);
            let n = req.static_messages.unwrap() as usize;
            prop_assert_eq!(bytes(&req.messages[..n]), bytes(&prefill));
            prop_assert_eq!(req.messages.len(), n + 1);
            prop_assert!(req.messages.iter().all(|m| !m.text.is_empty()), "the daemon refuses empty messages");
        }

        /// Adding a turn extends the static part: an older prefill stays a prefix.
        #[test]
        fn a_new_turn_extends_the_static_part(ctx in context(), t in turn()) {
            let before = ctx.static_messages();
            let mut grown = ctx.clone();
            grown.turns.push(t);
            let after = grown.static_messages();
            prop_assert_eq!(&after[..before.len()], &before[..]);
        }
    }

    #[test]
    fn system_text_layout() {
        let ctx = PromptContext {
            rules: "Be brief.".into(),
            profile: vec!["Name: Ada".into()],
            summary: Some("We talked about stars.".into()),
            turns: vec![],
        };
        assert_eq!(
            ctx.system_text(),
            "Be brief.\n\nWhat you know about the user:\n- Name: Ada\n\nSummary of the conversation so far:\nWe talked about stars."
        );
    }
}
