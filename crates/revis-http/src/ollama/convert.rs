//! Ollama's chat and generate requests, as the serde structs below written
//! from Ollama's API document, and as revis's [`GenerateParams`]: messages,
//! `options`, `format`, functions and log-probabilities.

use revis_client::{Format, GenerateParams, Message, Role, Sampling, Tool};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::FLAVOR;
use crate::edge;
use crate::error::ApiError;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Options {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    min_p: Option<f32>,
    seed: Option<i64>,
    num_predict: Option<i64>,
    stop: Option<Vec<String>>,
    repeat_penalty: Option<f32>,
    repeat_last_n: Option<u32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChatMessage {
    role: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    images: Option<Vec<Value>>,
    #[serde(default)]
    tool_calls: Option<Vec<OllamaToolCall>>,
    /// A tool message: the function that answered (`name` before Ollama 0.9).
    #[serde(default, alias = "name")]
    tool_name: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
pub(crate) struct OllamaToolCall {
    pub(super) function: OllamaFunctionCall,
}

#[derive(Debug, Deserialize, Serialize)]
pub(crate) struct OllamaFunctionCall {
    pub(super) name: String,
    /// An object (Ollama's form); a JSON string is taken too.
    #[serde(default)]
    pub(super) arguments: Value,
}

/// A function a chat offers: OpenAI's form, as Ollama takes it.
#[derive(Debug, Deserialize)]
pub(crate) struct OllamaTool {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    function: OllamaFunction,
}

#[derive(Debug, Deserialize)]
pub(crate) struct OllamaFunction {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    pub(super) model: String,
    #[serde(default)]
    messages: Vec<ChatMessage>,
    pub(super) stream: Option<bool>,
    format: Option<Value>,
    options: Option<Options>,
    tools: Option<Vec<OllamaTool>>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct GenerateRequest {
    pub(super) model: String,
    #[serde(default)]
    pub(super) prompt: String,
    pub(super) system: Option<String>,
    suffix: Option<String>,
    template: Option<String>,
    raw: Option<bool>,
    context: Option<Vec<i64>>,
    images: Option<Vec<Value>>,
    pub(super) stream: Option<bool>,
    format: Option<Value>,
    options: Option<Options>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<u32>,
}

fn format(f: &Option<Value>) -> Result<Format, ApiError> {
    match f {
        None | Some(Value::Null) => Ok(Format::Text),
        Some(Value::String(s)) if s.is_empty() => Ok(Format::Text),
        Some(Value::String(s)) if s == "json" => Ok(Format::Json { schema: None }),
        Some(Value::Object(_)) => Ok(Format::Json { schema: f.as_ref().map(Value::to_string) }),
        Some(other) => Err(ApiError::invalid(FLAVOR, "format", format!("format is {other}; it must be \"json\" or a JSON Schema object"))),
    }
}

/// `options` as revis's sampling, length and stop strings.
fn options(o: Option<&Options>) -> Result<(Sampling, Option<u32>, Vec<String>), ApiError> {
    let Some(o) = o else { return Ok(Default::default()) };
    let seed = edge::seed(FLAVOR, "options.seed", o.seed)?;
    let max = match o.num_predict {
        None | Some(-1) | Some(-2) => None,
        Some(n) if n >= 1 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        Some(n) => {
            return Err(ApiError::invalid(
                FLAVOR,
                "options.num_predict",
                format!("options.num_predict is {n}; it must be at least 1, or -1"),
            ));
        }
    };
    let sampling = Sampling {
        temperature: o.temperature,
        top_k: o.top_k,
        top_p: o.top_p,
        min_p: o.min_p,
        repeat_penalty: o.repeat_penalty,
        repeat_last_n: o.repeat_last_n,
        presence_penalty: edge::penalty(FLAVOR, "options.presence_penalty", o.presence_penalty)?,
        frequency_penalty: edge::penalty(FLAVOR, "options.frequency_penalty", o.frequency_penalty)?,
        seed,
    };
    Ok((sampling, max, o.stop.clone().unwrap_or_default()))
}

pub(crate) fn chat_params(req: &ChatRequest) -> Result<GenerateParams, ApiError> {
    let tools = req
        .tools
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| match t.kind.as_deref() {
            None | Some("function") => Ok(Tool {
                name: t.function.name.clone(),
                description: t.function.description.clone().unwrap_or_default(),
                parameters: t.function.parameters.as_ref().map(|p| p.to_string()).unwrap_or_default(),
            }),
            Some(other) => Err(ApiError::invalid(FLAVOR, "tools", format!("tools[{i}].type is {other:?}; revis's tools are functions"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid(FLAVOR, "messages", "messages is empty; send at least one"));
    }
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            if m.images.as_ref().is_some_and(|v| !v.is_empty()) {
                return Err(ApiError::invalid(FLAVOR, "images", format!("messages[{i}] has images: revis's models read text only")));
            }
            let role = match m.role.as_str() {
                "system" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "tool" => Role::Tool,
                other => {
                    return Err(ApiError::invalid(
                        FLAVOR,
                        "role",
                        format!("messages[{i}].role is {other:?}; it must be system, user, assistant or tool"),
                    ));
                }
            };
            let mut message = Message::new(role, m.content.clone());
            // Ollama's calls carry no ID: each gets one, and a tool message
            // answers by the function's name.
            message.tool_calls = m
                .tool_calls
                .iter()
                .flatten()
                .map(|c| revis_client::ToolCall {
                    id: String::new(),
                    name: c.function.name.clone(),
                    arguments: edge::arguments_text(&c.function.arguments),
                })
                .collect();
            message.name = m.tool_name.clone().unwrap_or_default();
            Ok(message)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (sampling, max_tokens, stop) = options(req.options.as_ref())?;
    Ok(GenerateParams {
        messages,
        sampling,
        max_tokens,
        stop,
        format: format(&req.format)?,
        tools,
        parallel_tool_calls: true,
        logprobs: edge::logprobs(FLAVOR, req.logprobs, req.top_logprobs)?,
        ..Default::default()
    })
}

pub(crate) fn generate_params(req: &GenerateRequest) -> Result<GenerateParams, ApiError> {
    let refuse = |field: &str, why: &str| Err(ApiError::invalid(FLAVOR, field, format!("{field} is not supported: {why}")));
    if req.images.as_ref().is_some_and(|v| !v.is_empty()) {
        return refuse("images", "revis's models read text only");
    }
    if req.context.as_ref().is_some_and(|v| !v.is_empty()) {
        return refuse("context", "send the conversation to /api/chat instead");
    }
    if req.raw == Some(true) || req.template.as_ref().is_some_and(|t| !t.is_empty()) {
        return refuse(if req.raw == Some(true) { "raw" } else { "template" }, "the model's own chat template is always applied");
    }
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return refuse("suffix", "no fill in the middle");
    }
    let mut messages = Vec::new();
    if let Some(s) = req.system.as_ref().filter(|s| !s.is_empty()) {
        messages.push(Message::system(s.clone()));
    }
    messages.push(Message::user(req.prompt.clone()));
    let (sampling, max_tokens, stop) = options(req.options.as_ref())?;
    let logprobs = edge::logprobs(FLAVOR, req.logprobs, req.top_logprobs)?;
    Ok(GenerateParams { messages, sampling, max_tokens, stop, format: format(&req.format)?, logprobs, ..Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn options_carry_over_and_bad_ones_name_themselves() {
        let req: ChatRequest = serde_json::from_value(json!({
            "model": "tier2", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "format": {"type": "object"},
            "options": {"temperature": 0, "top_k": 5, "seed": 3, "num_predict": 9, "stop": ["\n"], "repeat_penalty": 1.1, "num_ctx": 8192}
        }))
        .unwrap();
        let p = chat_params(&req).unwrap();
        assert_eq!(p.messages, vec![Message::system("Be brief."), Message::user("Hi")]);
        assert_eq!(
            (p.sampling.temperature, p.sampling.top_k, p.sampling.seed, p.sampling.repeat_penalty),
            (Some(0.0), Some(5), Some(3), Some(1.1))
        );
        assert_eq!((p.max_tokens, p.stop.clone()), (Some(9), vec!["\n".to_owned()]));
        assert_eq!(p.format, Format::Json { schema: Some(r#"{"type":"object"}"#.into()) });

        let bad = |v: Value| chat_params(&serde_json::from_value(v).unwrap()).unwrap_err();
        let msgs = json!([{"role": "user", "content": "x"}]);
        assert_eq!(
            bad(json!({"model": "m", "messages": msgs, "options": {"num_predict": 0}})).param.as_deref(),
            Some("options.num_predict")
        );
        assert_eq!(
            bad(json!({"model": "m", "messages": msgs, "options": {"presence_penalty": 7}})).param.as_deref(),
            Some("options.presence_penalty")
        );
        assert_eq!(bad(json!({"model": "m", "messages": msgs, "format": "yaml"})).param.as_deref(), Some("format"));
        assert_eq!(bad(json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]})).param.as_deref(), Some("role"));
        assert_eq!(
            bad(json!({"model": "m", "messages": msgs, "tools": [{"type": "code", "function": {"name": "f"}}]})).param.as_deref(),
            Some("tools")
        );
    }

    #[test]
    fn a_generate_prompt_is_a_user_message_after_its_system() {
        let req: GenerateRequest =
            serde_json::from_value(json!({"model": "m", "prompt": "Hi", "system": "Be brief.", "format": "json"})).unwrap();
        let p = generate_params(&req).unwrap();
        assert_eq!(p.messages, vec![Message::system("Be brief."), Message::user("Hi")]);
        assert_eq!(p.format, Format::Json { schema: None });
        let req: GenerateRequest = serde_json::from_value(json!({"model": "m", "prompt": "Hi", "context": [1, 2]})).unwrap();
        assert_eq!(generate_params(&req).unwrap_err().param.as_deref(), Some("context"));
    }
}
