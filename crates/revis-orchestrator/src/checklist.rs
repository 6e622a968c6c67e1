//! tier2's checklist: before the first answer, the model goes through a
//! few items aloud inside the private reasoning tag, like a worker pointing
//! at each line of a list, then answers. The instructions are part of the
//! system message (the static part of the prompt, so pre-prefill still
//! warms them); the notes are asked for in a call of their own, hidden and
//! bounded, and the answer continues after them, so the user's stream
//! carries only the answer.

use crate::structured::{TAG_CLOSE, TAG_OPEN};

/// The checklist, as the system message gives it.
pub fn instructions() -> String {
    format!(
        "Before you answer, think privately inside {TAG_OPEN} ... {TAG_CLOSE}, one short line for each item of this checklist:\n\
         LANGUAGE: the language of the user's last message. The answer is written in that language.\n\
         TONE: how to sound, as what you know about the user and the conversation ask.\n\
         ESCALATE: yes or no, and why. Yes only if a good answer needs long careful reasoning, code, maths or a detailed analysis.\n\
         DRAFT: the answer in a few words.\n\
         Then close the tag and write only the answer. The user never sees the notes."
    )
}

/// The most tokens the notes may take before the answer starts regardless.
pub const NOTES_MAX_TOKENS: u32 = 96;

/// Where the notes end: the closing tag, or a blank line (a small model
/// that forgets the tag starts its answer after one).
pub fn notes_stop() -> Vec<String> {
    vec![TAG_CLOSE.to_owned(), "\n\n".to_owned()]
}

/// What the notes begin with: the tag and the first item, with the language
/// already filled in when revis knows it (the model only continues).
pub fn notes_prefix(language: Option<&str>) -> String {
    match language {
        Some(lang) => format!("{TAG_OPEN}\nLANGUAGE: {lang}\nTONE:"),
        None => format!("{TAG_OPEN}\nLANGUAGE:"),
    }
}

/// The answer's prefix: the whole notes, closed. The daemon continues after it.
pub fn answer_prefix(prefix: &str, notes: &str) -> String {
    let notes = notes.trim_end();
    format!("{prefix}{notes}\n{TAG_CLOSE}\n")
}

/// The items as the model filled them in.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Notes {
    pub language: Option<String>,
    pub tone: Option<String>,
    /// `Some(true)` for a yes, `Some(false)` for a no, `None` when the item is missing or neither.
    pub escalate: Option<bool>,
    /// What came after the yes or no.
    pub why: Option<String>,
    pub draft: Option<String>,
}

/// Reads the notes (prefix and continuation together), item by item.
pub fn parse(notes: &str) -> Notes {
    let mut out = Notes::default();
    for line in notes.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        let value_or_none = || (!value.is_empty()).then(|| value.to_owned());
        match key.trim().trim_start_matches(['-', '*', ' ']).to_ascii_uppercase().as_str() {
            "LANGUAGE" => out.language = value_or_none(),
            "TONE" => out.tone = value_or_none(),
            "DRAFT" => out.draft = value_or_none(),
            "ESCALATE" => {
                let lower = value.to_lowercase();
                let word: String = lower.chars().take_while(|c| c.is_alphabetic()).collect();
                out.escalate = match word.as_str() {
                    "yes" => Some(true),
                    "no" => Some(false),
                    _ => None,
                };
                let why = value[word.len().min(value.len())..].trim_start_matches([',', '.', ':', ';', '-', ' ']).trim();
                out.why = (!why.is_empty()).then(|| why.to_owned());
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_items_are_read_whatever_the_model_adds() {
        let prefix = notes_prefix(Some("French"));
        let notes = format!("{prefix} friendly, brief\n- ESCALATE: No, a simple fact.\nDRAFT: Paris.\nsomething else: ignored");
        let n = parse(&notes);
        assert_eq!(n.language.as_deref(), Some("French"));
        assert_eq!(n.tone.as_deref(), Some("friendly, brief"));
        assert_eq!(n.escalate, Some(false));
        assert_eq!(n.why.as_deref(), Some("a simple fact."));
        assert_eq!(n.draft.as_deref(), Some("Paris."));
        assert_eq!(parse("ESCALATE: yes - it needs code").escalate, Some(true));
        assert_eq!(parse("ESCALATE: yes - it needs code").why.as_deref(), Some("it needs code"));
        assert_eq!(parse("ESCALATE: maybe").escalate, None);
        assert_eq!(parse("nothing at all"), Notes::default());
    }

    #[test]
    fn the_answer_continues_after_closed_notes() {
        let p = notes_prefix(None);
        assert!(p.starts_with(TAG_OPEN) && p.ends_with("LANGUAGE:"));
        let a = answer_prefix(&p, " English\nTONE: warm\n\n");
        assert!(a.starts_with(&p) && a.ends_with(&format!("warm\n{TAG_CLOSE}\n")), "{a:?}");
        assert!(instructions().contains("LANGUAGE:") && instructions().contains("ESCALATE:"));
    }
}
