//! tier1's quick check of the user's message, before the answer: obvious
//! typos (fixed only when sure), the kind of request, and whether it needs
//! the deep tier. One schema-constrained JSON call, no private reasoning:
//! it must be quick. The language is not asked of the model: `whatlang`
//! tells it in microseconds, and is used only when it is sure enough.
//!
//! A small model proposes typos freely; [`accept`] keeps only those a
//! careful reader would make: a lower-case word of the message, replaced by
//! a word of the same first letter at most two edits away. Names, rare
//! words and anything the model invented are left alone.

use revis_client::{Format, GenerateParams, Message, Priority, Runner, Sampling, Tier};
use serde_json::json;

/// What the check found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuickCheck {
    /// The message with the accepted corrections applied (the message itself when none).
    pub corrected: String,
    pub corrections: Vec<Correction>,
    pub kind: RequestKind,
    /// tier1 thinks the deep tier should follow up.
    pub escalate: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Correction {
    pub wrong: String,
    pub right: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestKind {
    Question,
    Request,
    #[default]
    Chat,
}

/// The most output the check may take: its JSON is a few dozen tokens.
pub const CHECK_MAX_TOKENS: u32 = 96;

/// The longest message checked (in bytes); longer ones are answered unchecked.
pub const CHECK_MAX_BYTES: usize = 2_000;

const CHECK_SYSTEM: &str = "You check a user's message before a chat assistant answers it. Reply with JSON only.";

/// The JSON the model must give. The short fields come first and each typo
/// is one word of at most 24 letters, so the answer always fits in
/// [`CHECK_MAX_TOKENS`] (a small model otherwise copies whole sentences
/// into a typo and runs out of tokens before the JSON closes).
pub fn schema() -> serde_json::Value {
    let word = json!({"type": "string", "pattern": "^[A-Za-z']{1,24}$"});
    json!({
        "type": "object",
        "properties": {
            "kind": {"type": "string", "enum": ["question", "request", "chat"]},
            "escalate": {"type": "boolean"},
            "typos": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"wrong": word, "right": word},
                    "required": ["wrong", "right"],
                    "additionalProperties": false
                },
                "maxItems": 3
            }
        },
        "required": ["kind", "escalate", "typos"],
        "additionalProperties": false
    })
}

/// The request that checks `message` on `tier`.
pub fn request(tier: Tier, message: &str) -> GenerateParams {
    let task = format!(
        "Message: {message}\n\n\
         kind: question, request (asks you to do or write something) or chat.\n\
         escalate: true only if a good answer needs long careful reasoning, code, maths or a detailed analysis.\n\
         typos: only obvious misspellings in the message, each as the misspelled word and its correct spelling; \
         never names, never words that are already correct; usually none."
    );
    GenerateParams {
        tier,
        messages: vec![Message::system(CHECK_SYSTEM), Message::user(task)],
        static_messages: Some(1),
        max_tokens: Some(CHECK_MAX_TOKENS),
        format: Format::Json { schema: Some(schema().to_string()) },
        priority: Priority::User,
        sampling: Sampling { temperature: Some(0.0), ..Default::default() },
        ..Default::default()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("the message is longer than the {CHECK_MAX_BYTES} bytes a quick check reads")]
    TooLong,
    #[error("the daemon failed: {0}")]
    Daemon(String),
    #[error("the check's JSON does not parse: {0}")]
    BadJson(String),
}

/// Runs the check of `message` on `tier`.
pub async fn run<D: Runner>(daemon: &D, tier: Tier, message: &str) -> Result<QuickCheck, CheckError> {
    run_with(daemon, tier, message, Priority::User).await
}

/// [`run`], at the daemon's queue `priority`.
pub async fn run_with<D: Runner>(daemon: &D, tier: Tier, message: &str, priority: Priority) -> Result<QuickCheck, CheckError> {
    if message.len() > CHECK_MAX_BYTES {
        return Err(CheckError::TooLong);
    }
    let mut req = request(tier, message);
    req.priority = priority;
    let done = daemon.generate(req, |_| {}).await.map_err(|e| CheckError::Daemon(e.message))?;
    let v: serde_json::Value = serde_json::from_str(&done.text).map_err(|e| CheckError::BadJson(e.to_string()))?;
    Ok(interpret(message, &v))
}

/// The check as revis takes it from the model's JSON: unknown or missing
/// fields read as "nothing found", typos only as far as [`accept`] allows.
pub fn interpret(message: &str, v: &serde_json::Value) -> QuickCheck {
    let proposed = v["typos"].as_array().into_iter().flatten().filter_map(|t| Some((t["wrong"].as_str()?, t["right"].as_str()?)));
    let mut corrections: Vec<Correction> = Vec::new();
    for (wrong, right) in proposed {
        if accept(message, wrong, right) && !corrections.iter().any(|c| c.wrong == wrong) {
            corrections.push(Correction { wrong: wrong.to_owned(), right: right.to_owned() });
        }
    }
    let kind = match v["kind"].as_str() {
        Some("question") => RequestKind::Question,
        Some("request") => RequestKind::Request,
        _ => RequestKind::Chat,
    };
    QuickCheck { corrected: apply(message, &corrections), corrections, kind, escalate: v["escalate"].as_bool() == Some(true) }
}

/// The words of `text` with their byte offsets (letters and apostrophes).
fn words(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        let in_word = c.is_alphabetic() || c == '\'';
        match (in_word, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, &text[s..i]));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, &text[s..]));
    }
    out.into_iter()
}

/// Whether a proposed correction is one revis makes: `wrong` is a word of
/// the message (whole, as written), in lower case (a capital may be a name),
/// at least 3 letters; `right` is one word of letters, different, with the
/// same first letter, and at most 2 edits away (1 for words of under 5
/// letters; a swap of neighbours is one edit).
pub fn accept(message: &str, wrong: &str, right: &str) -> bool {
    let letters = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_alphabetic() || c == '\'');
    if !letters(wrong) || !letters(right) || wrong == right || wrong.chars().count() < 3 {
        return false;
    }
    if wrong.chars().any(char::is_uppercase) || right.to_lowercase() != right {
        return false;
    }
    if wrong.chars().next() != right.chars().next() {
        return false;
    }
    if !words(message).any(|(_, w)| w == wrong) {
        return false;
    }
    let limit = if wrong.chars().count() < 5 { 1 } else { 2 };
    strsim::damerau_levenshtein(wrong, right) <= limit
}

/// `message` with each correction's word replaced wherever it stands as a whole word.
pub fn apply(message: &str, corrections: &[Correction]) -> String {
    let mut out = String::with_capacity(message.len());
    let mut last = 0;
    for (at, w) in words(message) {
        if let Some(c) = corrections.iter().find(|c| c.wrong == w) {
            out.push_str(&message[last..at]);
            out.push_str(&c.right);
            last = at + w.len();
        }
    }
    out.push_str(&message[last..]);
    out
}

/// How sure whatlang must be (its confidence, 0 to 1) before revis names a
/// message's language. Its own "reliable" flag refuses most messages of
/// under 20 words; below 0.5 its guesses are often wrong (English read as
/// Norwegian).
pub const LANGUAGE_CONFIDENCE: f64 = 0.5;

/// The language `text` is written in, by its English name, when whatlang is
/// sure enough of it ([`LANGUAGE_CONFIDENCE`]; very short or mixed messages give `None`).
pub fn language(text: &str) -> Option<&'static str> {
    whatlang::detect(text).filter(|i| i.confidence() >= LANGUAGE_CONFIDENCE).map(|i| i.lang().eng_name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn obvious_typos_are_fixed_and_correct_words_and_names_are_not() {
        let m = "Can you recieve teh parcel for Siobhan tomorow?";
        assert!(accept(m, "recieve", "receive"), "a swap");
        assert!(accept(m, "teh", "the"), "a swap in a short word");
        assert!(accept(m, "tomorow", "tomorrow"), "a missing letter");
        assert!(!accept(m, "Siobhan", "siobhan"), "a name");
        assert!(!accept(m, "parcel", "parcel"), "no change");
        assert!(!accept(m, "parcel", "package"), "a different word, not a spelling");
        assert!(!accept(m, "parcel", "barcel"), "another first letter");
        assert!(!accept(m, "parce", "parcel"), "not a whole word of the message");
        assert!(!accept(m, "teh", "the one"), "one word for one word");
        assert!(!accept(m, "tomorow", "Tomorrow"), "no capital invented");
    }

    #[test]
    fn the_guard_is_only_about_distance_for_short_words() {
        // Two edits in a four-letter word is a different word, not a typo.
        assert!(!accept("I like cats", "like", "lace"));
        assert!(accept("I lkie cats", "lkie", "like"));
    }

    #[test]
    fn corrections_apply_to_whole_words_only() {
        let c = [Correction { wrong: "teh".into(), right: "the".into() }];
        assert_eq!(apply("teh tehran teh.", &c), "the tehran the.");
        assert_eq!(apply("nothing here", &c), "nothing here");
        assert_eq!(apply("été teh ünïcode", &c), "été the ünïcode");
    }

    #[test]
    fn the_models_json_is_read_defensively() {
        let m = "Waht is teh capital of France?";
        let v = json!({"typos": [{"wrong": "teh", "right": "the"}, {"wrong": "France", "right": "Frances"}, {"wrong": "teh", "right": "tea"}], "kind": "question", "escalate": false});
        let c = interpret(m, &v);
        assert_eq!(c.corrections, [Correction { wrong: "teh".into(), right: "the".into() }], "names kept, one fix per word");
        assert_eq!(c.corrected, "Waht is the capital of France?", "what the model did not propose stays");
        assert_eq!(c.kind, RequestKind::Question);
        assert!(!c.escalate);
        let odd = interpret(m, &json!({"kind": "poem", "escalate": "yes"}));
        assert_eq!((odd.kind, odd.escalate, odd.corrected.as_str()), (RequestKind::Chat, false, m));
    }

    #[test]
    fn the_language_is_named_only_when_whatlang_is_sure() {
        assert_eq!(language("Quelle est la meilleure façon de préparer une ratatouille pour six personnes ?"), Some("French"));
        assert_eq!(language("Wie lange dauert die Zugfahrt von Berlin nach München ungefähr?"), Some("German"));
        assert_eq!(language("ok"), None);
    }

    #[test]
    fn the_schema_is_what_interpret_reads() {
        let s = schema();
        for field in ["typos", "kind", "escalate"] {
            assert!(s["required"].as_array().unwrap().iter().any(|f| f == field), "{field}");
        }
        let r = request(Tier::Tier1, "hello");
        assert_eq!(r.priority, Priority::User);
        assert!(matches!(r.format, Format::Json { schema: Some(_) }));
    }
}
