//! The prompts of a run, sized in the model's own tokens: a long user message
//! for prompt speed, a long system message plus a short question for
//! time-to-first-token, and a counting task for decode speed.

use revis_engine::{Message, Role, Tokenizer, build_prompt};

/// Asks for a long, regular answer, so greedy decoding does not stop early.
pub const DECODE_PROMPT: &str = "Count from 1 to 500, separated by spaces. Write every number; do not stop early.";
/// The short new message after the warm prefix.
pub const QUESTION: &str = "Using only the notes above, which room holds the blue lantern, and who keeps it there?";
/// A short request that loads the model and warms its code paths.
pub const WARMUP_PROMPT: &str = "Say hello.";

/// The prompts of one model, with their sizes in that model's tokens.
#[derive(Clone, Debug)]
pub struct Prompts {
    /// One user message; the whole chat prompt is `prompt_tokens` tokens.
    pub long_user: String,
    pub prompt_tokens: usize,
    /// The long static text of the time-to-first-token test ("notes").
    pub notes: String,
    /// Tokens of the notes text alone (no template).
    pub notes_tokens: usize,
    /// Tokens of the bare question text.
    pub question_tokens: usize,
}

/// How the static part of the time-to-first-token test is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// A system message, then the question (the case).
    System,
    /// History: the notes as a user message and a short assistant reply, then the question.
    History,
}

impl Layout {
    pub const ALL: [Layout; 2] = [Layout::System, Layout::History];

    pub fn label(self) -> &'static str {
        match self {
            Layout::System => "system message",
            Layout::History => "user + assistant history",
        }
    }

    /// The static messages (what Prefill gets).
    pub fn static_messages(self, notes: &str) -> Vec<Message> {
        match self {
            Layout::System => vec![system(notes)],
            Layout::History => vec![user(notes), assistant(ACK)],
        }
    }
}

/// The assistant's reply in the history layout.
pub const ACK: &str = "Noted.";

pub fn user(text: &str) -> Message {
    Message::new(Role::User, text)
}

pub fn system(text: &str) -> Message {
    Message::new(Role::System, text)
}

pub fn assistant(text: &str) -> Message {
    Message::new(Role::Assistant, text)
}

impl Prompts {
    /// Sizes the texts for `tok`: the long user message as close to
    /// `n_prompt` chat tokens as possible without going over (so prompt
    /// evaluation is one batch, like llama-bench's), the notes close to
    /// `n_prefix` tokens of text (the template adds a few).
    pub fn build(tok: &dyn Tokenizer, n_prompt: usize, n_prefix: usize) -> anyhow::Result<Prompts> {
        let words = filler_words(4 * n_prompt.max(n_prefix) + 64);
        let user_len = |k: usize| -> anyhow::Result<usize> { Ok(build_prompt(tok, &[user(&words[..k].join(" "))], &[], 0)?.tokens.len()) };
        let k = largest_at_most(words.len(), n_prompt, user_len)?;
        let long_user = words[..k].join(" ");
        let prompt_tokens = user_len(k)?;

        let notes_len = |k: usize| -> anyhow::Result<usize> { Ok(tok.tokenize_plain(&words[..k].join(" ")).len()) };
        let k = largest_at_most(words.len(), n_prefix.saturating_sub(8).max(1), notes_len)?;
        let notes = words[..k].join(" ");
        Ok(Prompts { long_user, prompt_tokens, notes_tokens: notes_len(k)?, notes, question_tokens: tok.tokenize_plain(QUESTION).len() })
    }
}

/// The largest `k` in `1..=max` with `len(k) <= target` (len grows with k), by bisection.
fn largest_at_most(max: usize, target: usize, len: impl Fn(usize) -> anyhow::Result<usize>) -> anyhow::Result<usize> {
    let (mut lo, mut hi) = (1usize, max);
    if len(lo)? > target {
        return Ok(lo);
    }
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if len(mid)? <= target {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok(lo)
}

/// Deterministic notes-like English ("Note 12: the blue lantern is kept in
/// the third room by the old gardener."), `n` words or more.
pub fn filler_words(n: usize) -> Vec<String> {
    const COLORS: [&str; 8] = ["blue", "red", "green", "silver", "yellow", "black", "white", "copper"];
    const THINGS: [&str; 8] = ["lantern", "ledger", "compass", "teapot", "map", "bell", "clock", "key"];
    const ROOMS: [&str; 6] = ["first", "second", "third", "north", "east", "upper"];
    const KEEPERS: [&str; 6] = ["old gardener", "young clerk", "night porter", "head cook", "librarian", "harbour pilot"];
    const VERBS: [&str; 4] = ["is kept", "was left", "is stored", "was hidden"];
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = |m: usize| {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) as usize) % m
    };
    let mut words = Vec::with_capacity(n + 16);
    let mut i = 1;
    while words.len() < n {
        let sentence = format!(
            "Note {i}: the {} {} {} in the {} room by the {}.",
            COLORS[next(COLORS.len())],
            THINGS[next(THINGS.len())],
            VERBS[next(VERBS.len())],
            ROOMS[next(ROOMS.len())],
            KEEPERS[next(KEEPERS.len())]
        );
        words.extend(sentence.split(' ').map(str::to_owned));
        i += 1;
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bisection_finds_the_largest_fit() {
        assert_eq!(largest_at_most(100, 50, |k| Ok(k * 3)).unwrap(), 16);
        assert_eq!(largest_at_most(10, 1000, Ok).unwrap(), 10);
        assert_eq!(largest_at_most(10, 0, Ok).unwrap(), 1);
    }

    #[test]
    fn filler_is_deterministic() {
        let a = filler_words(30);
        assert_eq!(a, filler_words(30));
        assert!(a.len() >= 30);
        assert_eq!(a[0], "Note");
    }
}
