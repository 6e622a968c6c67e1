//! What every API's request goes through on its way to the dispatcher,
//! whichever API it came in by: the rules written once.
//!
//! - The system text is one message, first: system messages anywhere in a
//!   conversation (Claude Code sends its environment inside `messages`,
//!   Codex two `developer` messages) are joined there in order, since every
//!   chat template takes a system message first and many refuse one later
//!   (Gemma 3's raises "roles must alternate").
//! - A `max_tokens` over the daemon's limit is lowered to it, as the APIs'
//!   peers do (Claude Code asks for 128,000), not refused; one of 0 is
//!   refused ([`max_tokens`]).
//! - A `tool_choice` that names a function names one the request offers,
//!   and one that asks for a call comes with functions ([`tool_choice`]).
//! - A call's arguments that are not JSON are kept as they were written
//!   ([`arguments_json`], [`arguments_text`]).
//! - A seed is 0 or more ([`seed`]), a penalty between -2 and 2
//!   ([`penalty`]), `top_logprobs` at most [`MAX_TOP_LOGPROBS`] and only
//!   with `logprobs` ([`logprobs`]).
//!
//! Each API maps its own form onto revis's [`GenerateParams`] and calls
//! these with the name its field has there, so a rule is refused with the
//! same words by each.

use revis_client::{GenerateParams, Message, Role, Tool, ToolChoice};
use serde_json::Value;

use crate::error::{ApiError, Flavor};

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

/// The choice among the functions `tools` offers, as asked: a named
/// function must be among them, and a choice that asks for a call
/// (`required`, or one named) needs at least one. Refused as `tool_choice`
/// (400) by every API, in the same words.
pub(crate) fn tool_choice(flavor: Flavor, tools: &[Tool], choice: ToolChoice) -> Result<ToolChoice, ApiError> {
    if let ToolChoice::Named(name) = &choice
        && !tools.iter().any(|t| &t.name == name)
    {
        return Err(ApiError::invalid(flavor, "tool_choice", format!("tool_choice names {name:?}, which is not among the tools")));
    }
    if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(ApiError::invalid(flavor, "tool_choice", "tool_choice asks for a call but tools is empty"));
    }
    Ok(choice)
}

/// A call's arguments as the APIs that write them as a JSON value carry
/// them (Ollama's `arguments`, Anthropic's `input`): the JSON the model
/// wrote, or, when what it wrote is not JSON (an answer cut off inside a
/// call), that text as a JSON string. Nothing is lost: the caller sees
/// exactly what the model wrote, as OpenAI's APIs (whose arguments are a
/// string) and Anthropic's stream (`partial_json`) show it, where an empty
/// object would have called the function with no arguments.
pub(crate) fn arguments_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// A call's arguments given as a JSON value (an earlier call sent back):
/// a string is the arguments' text as it is (what [`arguments_json`] made
/// of text that was not JSON comes back unchanged, and a JSON object
/// written as a string is taken too), none is `{}`, any other value its
/// JSON.
pub(crate) fn arguments_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "{}".to_owned(),
        v => v.to_string(),
    }
}

/// A token limit asked (`max_tokens`, `max_output_tokens`, ...): 0 is
/// refused; one past `u32` is the most there is (the daemon lowers it to
/// its own limit).
pub(crate) fn max_tokens(flavor: Flavor, param: &str, n: Option<u64>) -> Result<Option<u32>, ApiError> {
    match n {
        Some(0) => Err(ApiError::invalid(flavor, param, format!("{param} is 0; it must be at least 1"))),
        n => Ok(n.map(|n| u32::try_from(n).unwrap_or(u32::MAX))),
    }
}

/// A seed: 0 or more.
pub(crate) fn seed(flavor: Flavor, param: &str, seed: Option<i64>) -> Result<Option<u64>, ApiError> {
    seed.map(|s| u64::try_from(s).map_err(|_| ApiError::invalid(flavor, param, format!("{param} is {s}; it must be 0 or more"))))
        .transpose()
}

/// A presence or frequency penalty, -2 to 2 (OpenAI's bounds).
pub(crate) fn penalty(flavor: Flavor, param: &str, v: Option<f32>) -> Result<Option<f32>, ApiError> {
    match v {
        Some(p) if !(-2.0..=2.0).contains(&p) => {
            Err(ApiError::invalid(flavor, param, format!("{param} is {p}; it must be between -2 and 2")))
        }
        v => Ok(v),
    }
}

/// The most alternatives a token's log-probability may come with.
pub(crate) const MAX_TOP_LOGPROBS: u32 = 20;

/// `logprobs` and `top_logprobs` as revis's: the alternatives asked with
/// each token (0: the token's own only), at most [`MAX_TOP_LOGPROBS`], and
/// only with `logprobs: true`.
pub(crate) fn logprobs(flavor: Flavor, on: Option<bool>, top: Option<u32>) -> Result<Option<u32>, ApiError> {
    match (on, top) {
        (_, Some(n)) if n > MAX_TOP_LOGPROBS => {
            Err(ApiError::invalid(flavor, "top_logprobs", format!("top_logprobs is {n}; it must be at most {MAX_TOP_LOGPROBS}")))
        }
        (Some(true), n) => Ok(Some(n.unwrap_or(0))),
        (_, Some(n)) if n > 0 => Err(ApiError::invalid(flavor, "top_logprobs", "top_logprobs needs logprobs: true")),
        _ => Ok(None),
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

    /// The rules above as each API holds them: a request in each API's own
    /// form, read as its route reads it.
    mod each_api {
        use axum::http::StatusCode;
        use serde_json::{Value, json};

        use crate::error::{ApiError, Flavor};
        use crate::request::parse;
        use crate::{anthropic, ollama, openai, responses};
        use revis_client::{Done, FinishReason, GenerateParams, ToolCall};

        fn openai(v: Value) -> Result<GenerateParams, ApiError> {
            openai::chat_params(&parse(Flavor::OpenAi, v.to_string().as_bytes())?)
        }
        fn responses(v: Value) -> Result<GenerateParams, ApiError> {
            responses::params(&parse(Flavor::OpenAi, v.to_string().as_bytes())?)
        }
        fn anthropic(v: Value) -> Result<GenerateParams, ApiError> {
            anthropic::params(&parse(Flavor::Anthropic, v.to_string().as_bytes())?, false)
        }
        fn ollama(v: Value) -> Result<GenerateParams, ApiError> {
            ollama::chat_params(&parse::<ollama::ChatRequest>(Flavor::Ollama, v.to_string().as_bytes())?)
        }

        /// Ollama's API has no `tool_choice`: the other three refuse a
        /// function that is not offered with one 400, in the same words.
        #[test]
        fn a_tool_choice_naming_a_function_not_offered_is_refused_alike() {
            let user = json!([{"role": "user", "content": "Hi"}]);
            let refusals = [
                openai(json!({"model": "m", "messages": user,
                    "tools": [{"type": "function", "function": {"name": "f"}}],
                    "tool_choice": {"type": "function", "function": {"name": "g"}}})),
                responses(json!({"model": "m", "input": "Hi",
                    "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}})),
                anthropic(json!({"model": "m", "max_tokens": 5, "messages": user,
                    "tools": [{"name": "f"}], "tool_choice": {"type": "tool", "name": "g"}})),
            ];
            for r in refusals {
                let e = r.unwrap_err();
                assert_eq!(
                    (e.status, e.param.as_deref(), e.message.as_str()),
                    (StatusCode::BAD_REQUEST, Some("tool_choice"), r#"tool_choice names "g", which is not among the tools"#),
                    "{:?}",
                    e.flavor
                );
            }
            let no_tools = [
                openai(json!({"model": "m", "messages": user, "tool_choice": "required"})),
                responses(json!({"model": "m", "input": "Hi", "tool_choice": "required"})),
                anthropic(json!({"model": "m", "max_tokens": 5, "messages": user, "tool_choice": {"type": "any"}})),
            ];
            for r in no_tools {
                let e = r.unwrap_err();
                assert_eq!(
                    (e.param.as_deref(), e.message.as_str()),
                    (Some("tool_choice"), "tool_choice asks for a call but tools is empty")
                );
            }
        }

        /// Arguments that are not JSON (an answer cut off inside a call)
        /// are kept as the model wrote them by each API: as the string
        /// OpenAI's APIs always give, as a JSON string where Ollama and
        /// Anthropic give a value; and such text sent back in an earlier
        /// call reaches the daemon unchanged.
        #[test]
        fn arguments_that_are_not_json_are_kept_as_written_by_each_api() {
            let cut = r#"{"city": "Par"#;
            let done = Done {
                finish_reason: FinishReason::ToolCalls,
                tool_calls: vec![ToolCall { id: "call_1".into(), name: "get_weather".into(), arguments: cut.into() }],
                ..Default::default()
            };
            let openai_calls = serde_json::to_value(openai::tool_calls(&done)).unwrap();
            assert_eq!(openai_calls[0]["function"]["arguments"], json!(cut));
            assert_eq!(responses::output(&done, "msg_1")[0]["arguments"], json!(cut));
            assert_eq!(anthropic::tool_use(&done.tool_calls[0])["input"], json!(cut));
            assert_eq!(serde_json::to_value(ollama::tool_calls(&done)).unwrap()[0]["function"]["arguments"], json!(cut));
            // Well-formed arguments are a value where the API writes one.
            let whole = ToolCall { arguments: r#"{"city":"Paris"}"#.into(), ..done.tool_calls[0].clone() };
            assert_eq!(anthropic::tool_use(&whole)["input"], json!({"city": "Paris"}));

            let sent_back = [
                openai(json!({"model": "m", "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": cut}}]}]})),
                responses(json!({"model": "m", "input": [
                    {"role": "user", "content": "Hi"},
                    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": cut}]})),
                anthropic(json!({"model": "m", "max_tokens": 5, "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": cut}]}]})),
                ollama(json!({"model": "m", "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": cut}}]}]})),
            ];
            for p in sent_back {
                let p = p.unwrap();
                assert_eq!(p.messages[1].tool_calls[0].arguments, cut);
            }
        }

        /// A setting of the wrong type is the same 400 on every API, naming
        /// the field as that API calls it (Responses' request is as typed
        /// as the others').
        #[test]
        fn a_string_temperature_is_refused_naming_the_field_by_each_api() {
            let user = json!([{"role": "user", "content": "Hi"}]);
            for (e, field) in [
                (openai(json!({"model": "m", "messages": user, "temperature": "hot"})), "temperature"),
                (responses(json!({"model": "m", "input": "Hi", "temperature": "hot"})), "temperature"),
                (anthropic(json!({"model": "m", "max_tokens": 5, "messages": user, "temperature": "hot"})), "temperature"),
                (ollama(json!({"model": "m", "messages": user, "options": {"temperature": "hot"}})), "options.temperature"),
            ] {
                let e = e.unwrap_err();
                assert_eq!((e.status, e.param.as_deref()), (StatusCode::BAD_REQUEST, Some(field)), "{}", e.message);
                assert!(e.message.contains(&format!("{field}: invalid type: string \"hot\"")), "{}", e.message);
            }
        }
    }
}
