//! Structured tasks (summaries, audits, profile extraction): the model
//! reasons inside a private tag of our own as numbered steps ending in a
//! Draft, then gives JSON. The JSON is asked of the daemon with the task's
//! schema, so it always validates; [`parse`] also takes a one-shot output
//! apart robustly. Malformed output is logged and retried once.

use revis_client::{Format, GenerateParams, Message, Priority, Runner, Sampling, Tier};

/// The private reasoning tag. Not `<think>`, which models use for their own ends.
pub const TAG_OPEN: &str = "<revis-notes>";
pub const TAG_CLOSE: &str = "</revis-notes>";

/// How the model is told to work.
pub fn instructions() -> String {
    format!(
        "Work in two parts. First, inside {TAG_OPEN} ... {TAG_CLOSE}, reason step by step as a numbered list \
         (1., 2., ...) and end with a line starting 'Draft:' that holds your draft answer. \
         Then close the tag and give only the final JSON."
    )
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StructuredError {
    #[error("the model opened {TAG_OPEN} and never closed it")]
    Unclosed,
    #[error("no JSON after the reasoning")]
    NoJson,
    #[error("the JSON does not parse: {0}")]
    BadJson(String),
    #[error("the daemon failed: {0}")]
    Daemon(String),
}

/// The private reasoning, if any, and the JSON value after it.
pub fn parse(output: &str) -> Result<(Option<String>, serde_json::Value), StructuredError> {
    let (notes, rest) = match output.find(TAG_OPEN) {
        Some(open) => {
            let after = &output[open + TAG_OPEN.len()..];
            let close = after.find(TAG_CLOSE).ok_or(StructuredError::Unclosed)?;
            (Some(after[..close].trim().to_owned()), &after[close + TAG_CLOSE.len()..])
        }
        None => (None, output),
    };
    let start = rest.find(['{', '[']).ok_or(StructuredError::NoJson)?;
    let mut values = serde_json::Deserializer::from_str(&rest[start..]).into_iter::<serde_json::Value>();
    match values.next() {
        Some(Ok(v)) => Ok((notes, v)),
        Some(Err(e)) => Err(StructuredError::BadJson(e.to_string())),
        None => Err(StructuredError::NoJson),
    }
}

/// Runs a structured task: reasoning in the private tag, then JSON matching
/// `schema` (constrained by the daemon). Retried once on malformed output.
pub async fn run<D: Runner>(daemon: &D, tier: Tier, task: &str, schema: &serde_json::Value) -> Result<serde_json::Value, StructuredError> {
    let mut last = StructuredError::NoJson;
    for attempt in 0..2 {
        match run_once(daemon, tier, task, schema).await {
            Ok(v) => return Ok(v),
            Err(e) => {
                tracing::warn!(attempt, "structured task output was malformed: {e}");
                last = e;
            }
        }
    }
    Err(last)
}

async fn run_once<D: Runner>(daemon: &D, tier: Tier, task: &str, schema: &serde_json::Value) -> Result<serde_json::Value, StructuredError> {
    let system = Message::system(instructions());
    let user = Message::user(task);
    // 1: the reasoning, stopped at the closing tag.
    let reasoning = GenerateParams {
        tier,
        messages: vec![system.clone(), user.clone()],
        static_messages: Some(1),
        max_tokens: Some(256),
        stop: vec![TAG_CLOSE.to_owned()],
        priority: Priority::Background,
        sampling: Sampling { temperature: Some(0.2), seed: Some(0), ..Default::default() },
        ..Default::default()
    };
    let notes = daemon.generate(reasoning, |_| {}).await.map_err(|e| StructuredError::Daemon(e.message))?;
    let mut notes_text = notes.text;
    if !notes_text.contains(TAG_OPEN) {
        notes_text.insert_str(0, TAG_OPEN);
    }
    notes_text.push_str(TAG_CLOSE);
    // 2: the JSON, constrained to the schema, after the reasoning.
    let json = GenerateParams {
        tier,
        messages: vec![system, user, Message::assistant(notes_text.clone()), Message::user("Now give only the final JSON.")],
        static_messages: Some(3),
        max_tokens: Some(512),
        format: Format::Json { schema: Some(schema.to_string()) },
        priority: Priority::Background,
        sampling: Sampling { temperature: Some(0.0), ..Default::default() },
        ..Default::default()
    };
    let out = daemon.generate(json, |_| {}).await.map_err(|e| StructuredError::Daemon(e.message))?;
    parse(&format!("{notes_text}{}", out.text)).map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_reasoning_then_json() {
        let out = "<revis-notes>1. The user is Ada.\nDraft: {\"name\":\"Ada\"}</revis-notes>\n```json\n{\"name\": \"Ada\"}\n```";
        let (notes, v) = parse(out).unwrap();
        assert!(notes.unwrap().starts_with("1. The user"));
        assert_eq!(v, json!({"name": "Ada"}));
    }

    #[test]
    fn json_without_the_tag_and_with_trailing_text() {
        assert_eq!(parse("Sure! [1, 2] and more").unwrap().1, json!([1, 2]));
    }

    #[test]
    fn malformed_outputs_are_errors_not_panics() {
        assert_eq!(parse("<revis-notes>1. thinking forever"), Err(StructuredError::Unclosed));
        assert_eq!(parse("<revis-notes>x</revis-notes> no json here"), Err(StructuredError::NoJson));
        assert!(matches!(parse("{\"a\": "), Err(StructuredError::BadJson(_))));
        // The draft inside the tag is never taken for the answer.
        assert_eq!(parse("<revis-notes>Draft: {\"a\":1}</revis-notes>"), Err(StructuredError::NoJson));
    }
}
