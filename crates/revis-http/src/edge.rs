//! What every API's request goes through on its way to the dispatcher,
//! whichever API it came in by: the rules written once.
//!
//! - The system text is one message, first: system messages anywhere in a
//!   conversation (Claude Code sends its environment inside `messages`,
//!   Codex two `developer` messages) are joined there in order, since every
//!   chat template takes a system message first and many refuse one later
//!   (Gemma 3's raises "roles must alternate").
//! - A `max_tokens` over the daemon's limit is lowered to it, as the APIs'
//!   peers do (Claude Code asks for 128,000), not refused.

use revis_client::{GenerateParams, Message, Role};

/// Applies the rules above to a request's parameters.
pub(crate) fn prepare(params: &mut GenerateParams) {
    one_system_message(&mut params.messages);
    params.cap_max_tokens = true;
}

/// Joins the system messages into one, first (blank lines between them).
fn one_system_message(messages: &mut Vec<Message>) {
    if messages.iter().filter(|m| m.role == Role::System).count() < 2 && messages.first().is_none_or(|m| m.role == Role::System) {
        return;
    }
    let texts: Vec<String> = messages.iter().filter(|m| m.role == Role::System && !m.text.is_empty()).map(|m| m.text.clone()).collect();
    messages.retain(|m| m.role != Role::System);
    if !texts.is_empty() {
        messages.insert(0, Message::system(texts.join("\n\n")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles(m: &[Message]) -> Vec<(Role, &str)> {
        m.iter().map(|m| (m.role, m.text.as_str())).collect()
    }

    #[test]
    fn system_messages_are_joined_first_in_order() {
        let mut m = vec![Message::system("A."), Message::user("Hi"), Message::system("Env."), Message::assistant("Hello")];
        one_system_message(&mut m);
        assert_eq!(roles(&m), [(Role::System, "A.\n\nEnv."), (Role::User, "Hi"), (Role::Assistant, "Hello")]);

        let mut m = vec![Message::user("Hi"), Message::system("Env.")];
        one_system_message(&mut m);
        assert_eq!(roles(&m), [(Role::System, "Env."), (Role::User, "Hi")]);

        let plain = vec![Message::system("A."), Message::user("Hi")];
        let mut m = plain.clone();
        one_system_message(&mut m);
        assert_eq!(m, plain, "one system message first is left as it is");

        let mut m = vec![Message::user("Hi"), Message::system("")];
        one_system_message(&mut m);
        assert_eq!(roles(&m), [(Role::User, "Hi")], "an empty one is dropped");
    }
}
