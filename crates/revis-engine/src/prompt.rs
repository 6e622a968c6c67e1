//! Prompts as static prefix + dynamic suffix. The static part is rendered and
//! tokenized on its own, so its tokens are identical in a Prefill and in every
//! later request that starts with the same messages.

use crate::{EngineError, Message, Token, Tokenizer};

/// A tokenized prompt and where its static part ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    pub tokens: Vec<Token>,
    /// Tokens `[0, split)` are the static part.
    pub split: usize,
}

/// The prompt for answering `messages`, whose first `static_count` messages
/// are the static part. If the template renders the static messages as a
/// prefix of the whole conversation (ChatML does), the static part is exactly
/// that text; otherwise it is the longest shared prefix of the two renderings.
pub fn build_prompt(tok: &dyn Tokenizer, messages: &[Message], static_count: usize) -> Result<Prompt, EngineError> {
    let full = tok.render(messages, true)?;
    let static_count = static_count.min(messages.len());
    let static_text = if static_count == 0 {
        String::new()
    } else {
        let rendered = tok.render(&messages[..static_count], false)?;
        common_prefix(&rendered, &full).to_owned()
    };
    let mut tokens = if static_text.is_empty() { Vec::new() } else { tok.tokenize(&static_text, true) };
    let split = tokens.len();
    let rest = &full[static_text.len()..];
    tokens.extend(tok.tokenize(rest, static_text.is_empty()));
    Ok(Prompt { tokens, split })
}

/// The prompt a Prefill evaluates: the messages alone, all static, rendered
/// exactly as [`build_prompt`] renders them as the static part.
pub fn build_static_prompt(tok: &dyn Tokenizer, messages: &[Message]) -> Result<Prompt, EngineError> {
    let text = tok.render(messages, false)?;
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
    use crate::Role;

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
