//! Prompts as static prefix + dynamic suffix. The static part is rendered and
//! tokenized on its own, so its tokens are identical in a Prefill and in every
//! later request that starts with the same messages.

use crate::{EngineError, Message, Role, Token, Tokenizer};

/// A tokenized prompt and where its static part ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    pub tokens: Vec<Token>,
    /// Tokens `[0, split)` are the static part.
    pub split: usize,
}

/// Stands in for the next user message when the static part is rendered on
/// its own: private-use characters no template changes and no user types.
const NEXT_MESSAGE: &str = "\u{E000}revis-next\u{E001}";

/// The text of the static part: the messages as the template renders them
/// when a user message follows, up to where that message's text would start.
/// This keeps what the template puts around the static messages even where a
/// message renders nothing on its own (Gemma folds a system message into the
/// next user turn), and it includes the next turn's opening.
fn static_text(tok: &dyn Tokenizer, messages: &[Message]) -> Result<String, EngineError> {
    if messages.is_empty() {
        return Ok(String::new());
    }
    let mut with_next = messages.to_vec();
    with_next.push(Message { role: Role::User, content: NEXT_MESSAGE.to_owned() });
    let rendered = tok.render(&with_next, false)?;
    match rendered.find(NEXT_MESSAGE) {
        Some(at) => Ok(rendered[..at].to_owned()),
        None => tok.render(messages, false),
    }
}

/// The prompt for answering `messages`, whose first `static_count` messages
/// are the static part. The static part is [`static_text`] when the whole
/// conversation renders with it as a prefix (the next message is the user's);
/// otherwise the longest prefix it shares with the whole rendering.
pub fn build_prompt(tok: &dyn Tokenizer, messages: &[Message], static_count: usize) -> Result<Prompt, EngineError> {
    let full = tok.render(messages, true)?;
    let static_count = static_count.min(messages.len());
    let candidate = static_text(tok, &messages[..static_count])?;
    let static_text = if full.starts_with(&candidate) {
        candidate
    } else {
        common_prefix(&tok.render(&messages[..static_count], false)?, &full).to_owned()
    };
    let mut tokens = if static_text.is_empty() { Vec::new() } else { tok.tokenize(&static_text, true) };
    let split = tokens.len();
    let rest = &full[static_text.len()..];
    tokens.extend(tok.tokenize(rest, static_text.is_empty()));
    Ok(Prompt { tokens, split })
}

/// The prompt a Prefill evaluates: the static part alone, exactly as
/// [`build_prompt`] renders it when a user message follows.
pub fn build_static_prompt(tok: &dyn Tokenizer, messages: &[Message]) -> Result<Prompt, EngineError> {
    let text = static_text(tok, messages)?;
    let tokens = tok.tokenize(&text, true);
    Ok(Prompt { split: tokens.len(), tokens })
}

fn common_prefix<'a>(a: &'a str, b: &str) -> &'a str {
    let mut end = 0;
    for ((i, ca), cb) in a.char_indices().zip(b.chars()) {
        if ca != cb {
            break;
        }
        end = i + ca.len_utf8();
    }
    &a[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ChatML-like template over a byte tokenizer, for checking the split logic.
    struct Bytes;
    impl Tokenizer for Bytes {
        fn render(&self, m: &[Message], add: bool) -> Result<String, EngineError> {
            let mut s: String = m.iter().map(|m| format!("<{}>{}</>", m.role.as_str(), m.content)).collect();
            if add {
                s.push_str("<assistant>");
            }
            Ok(s)
        }
        fn tokenize(&self, t: &str, bos: bool) -> Vec<Token> {
            bos.then_some(0).into_iter().chain(t.bytes().map(u32::from)).collect()
        }
        fn tokenize_plain(&self, t: &str) -> Vec<Token> {
            self.tokenize(t, false)
        }
        fn n_ctx(&self) -> u32 {
            1000
        }
        fn json_grammar(&self, _: Option<&str>) -> Result<String, EngineError> {
            Ok(String::new())
        }
    }

    /// Gemma-like: a system message renders nothing alone; it is folded into the next user turn.
    struct Folding;
    impl Tokenizer for Folding {
        fn render(&self, m: &[Message], add: bool) -> Result<String, EngineError> {
            let mut s = String::new();
            let mut pending = String::new();
            for m in m {
                match m.role {
                    Role::System => pending = format!("{}\n\n", m.content),
                    r => s.push_str(&format!("<{}>{}{}</>", r.as_str(), std::mem::take(&mut pending), m.content)),
                }
            }
            if add {
                s.push_str("<model>");
            }
            Ok(s)
        }
        fn tokenize(&self, t: &str, bos: bool) -> Vec<Token> {
            Bytes.tokenize(t, bos)
        }
        fn tokenize_plain(&self, t: &str) -> Vec<Token> {
            Bytes.tokenize_plain(t)
        }
        fn n_ctx(&self) -> u32 {
            1000
        }
        fn json_grammar(&self, _: Option<&str>) -> Result<String, EngineError> {
            Ok(String::new())
        }
    }

    #[test]
    fn a_system_message_folded_into_the_next_turn_is_still_static() {
        let sys = [msg(Role::System, "long rules")];
        let all = [msg(Role::System, "long rules"), msg(Role::User, "question")];
        let p = build_prompt(&Folding, &all, 1).unwrap();
        let pre = build_static_prompt(&Folding, &sys).unwrap();
        assert_eq!(&p.tokens[..p.split], &pre.tokens[..]);
        assert_eq!(String::from_utf8(pre.tokens[1..].iter().map(|&t| t as u8).collect()).unwrap(), "<user>long rules\n\n");
    }

    #[test]
    fn the_static_part_ends_where_the_next_user_message_starts() {
        let p = build_prompt(&Bytes, &[msg(Role::System, "s"), msg(Role::User, "u")], 1).unwrap();
        let text: String = p.tokens[1..p.split].iter().map(|&t| t as u8 as char).collect();
        assert_eq!(text, "<system>s</><user>");
    }

    #[test]
    fn a_static_part_ending_in_a_user_message_falls_back_to_the_shared_prefix() {
        let all = [msg(Role::User, "u")];
        let p = build_prompt(&Bytes, &all, 1).unwrap();
        let text: String = p.tokens[1..p.split].iter().map(|&t| t as u8 as char).collect();
        assert_eq!(text, "<user>u</>");
    }

    fn msg(role: Role, c: &str) -> Message {
        Message { role, content: c.into() }
    }

    #[test]
    fn static_part_matches_the_prefill() {
        let history = [msg(Role::System, "rules"), msg(Role::User, "hi")];
        let mut all = history.to_vec();
        all.push(msg(Role::User, "next"));
        let p = build_prompt(&Bytes, &all, 2).unwrap();
        let pre = build_static_prompt(&Bytes, &history).unwrap();
        assert_eq!(&p.tokens[..p.split], &pre.tokens[..]);
        assert_eq!(p.tokens[0], 0, "one BOS at the start");
        assert_eq!(p.tokens.iter().filter(|&&t| t == 0).count(), 1);
    }

    #[test]
    fn no_static_part() {
        let p = build_prompt(&Bytes, &[msg(Role::User, "x")], 0).unwrap();
        assert_eq!(p.split, 0);
        assert_eq!(p.tokens[0], 0);
    }

    #[test]
    fn common_prefix_respects_char_boundaries() {
        assert_eq!(common_prefix("日本語", "日本人"), "日本");
        assert_eq!(common_prefix("abc", "abc"), "abc");
    }
}
