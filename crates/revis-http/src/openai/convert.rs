//! OpenAI's chat and legacy completion requests as revis's [`GenerateParams`]:
//! messages, settings, functions and the choice among them, and what is
//! refused (a 400 naming the field).

use async_openai::types::chat::Prompt;
use async_openai::types::chat::{
    ChatCompletionMessageToolCalls, ChatCompletionRequestToolMessageContent, ChatCompletionRequestToolMessageContentPart,
    ChatCompletionToolChoiceOption, ChatCompletionTools, ToolChoiceOptions,
};
use async_openai::types::chat::{
    ChatCompletionRequestAssistantMessageContent, ChatCompletionRequestAssistantMessageContentPart,
    ChatCompletionRequestDeveloperMessageContent, ChatCompletionRequestDeveloperMessageContentPart, ChatCompletionRequestMessage,
    ChatCompletionRequestSystemMessageContent, ChatCompletionRequestSystemMessageContentPart, ChatCompletionRequestUserMessageContent,
    ChatCompletionRequestUserMessageContentPart, CreateChatCompletionRequest, ResponseFormat, StopConfiguration,
};
use async_openai::types::completions::CreateCompletionRequest;
use revis_client::{Format, GenerateParams, Message, Sampling, Tool, ToolCall, ToolChoice};

use super::FLAVOR;
use crate::edge::{self, MAX_TOP_LOGPROBS};
use crate::error::ApiError;

fn text_parts<'a>(parts: impl Iterator<Item = Option<&'a str>>, param: &str) -> Result<String, ApiError> {
    let mut s = String::new();
    for p in parts {
        s.push_str(p.ok_or_else(|| ApiError::invalid(FLAVOR, param, "only text content is supported: revis's models read text"))?);
    }
    Ok(s)
}

/// A chat request's messages as revis's.
fn messages(req: &CreateChatCompletionRequest) -> Result<Vec<Message>, ApiError> {
    use ChatCompletionRequestMessage as M;
    req.messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let param = format!("messages[{i}].content");
            Ok(match m {
                M::Developer(d) => Message::system(match &d.content {
                    ChatCompletionRequestDeveloperMessageContent::Text(t) => t.clone(),
                    ChatCompletionRequestDeveloperMessageContent::Array(a) => text_parts(
                        a.iter().map(|p| match p {
                            ChatCompletionRequestDeveloperMessageContentPart::Text(t) => Some(t.text.as_str()),
                        }),
                        &param,
                    )?,
                }),
                M::System(s) => Message::system(match &s.content {
                    ChatCompletionRequestSystemMessageContent::Text(t) => t.clone(),
                    ChatCompletionRequestSystemMessageContent::Array(a) => text_parts(
                        a.iter().map(|p| match p {
                            ChatCompletionRequestSystemMessageContentPart::Text(t) => Some(t.text.as_str()),
                        }),
                        &param,
                    )?,
                }),
                M::User(u) => Message::user(match &u.content {
                    ChatCompletionRequestUserMessageContent::Text(t) => t.clone(),
                    ChatCompletionRequestUserMessageContent::Array(a) => text_parts(
                        a.iter().map(|p| match p {
                            ChatCompletionRequestUserMessageContentPart::Text(t) => Some(t.text.as_str()),
                            _ => None,
                        }),
                        &param,
                    )?,
                }),
                M::Assistant(a) => {
                    let tool_calls = a
                        .tool_calls
                        .iter()
                        .flatten()
                        .enumerate()
                        .map(|(j, c)| match c {
                            ChatCompletionMessageToolCalls::Function(c) => {
                                Ok(ToolCall { id: c.id.clone(), name: c.function.name.clone(), arguments: c.function.arguments.clone() })
                            }
                            ChatCompletionMessageToolCalls::Custom(_) => Err(ApiError::invalid(
                                FLAVOR,
                                &format!("messages[{i}].tool_calls[{j}]"),
                                "custom tool calls are not supported; revis's tools are functions",
                            )),
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    let mut m = Message::assistant(match &a.content {
                        None => String::new(),
                        Some(ChatCompletionRequestAssistantMessageContent::Text(t)) => t.clone(),
                        Some(ChatCompletionRequestAssistantMessageContent::Array(parts)) => text_parts(
                            parts.iter().map(|p| match p {
                                ChatCompletionRequestAssistantMessageContentPart::Text(t) => Some(t.text.as_str()),
                                ChatCompletionRequestAssistantMessageContentPart::Refusal(r) => Some(r.refusal.as_str()),
                            }),
                            &param,
                        )?,
                    });
                    m.tool_calls = tool_calls;
                    m
                }
                M::Tool(t) => Message {
                    role: revis_client::Role::Tool,
                    text: match &t.content {
                        ChatCompletionRequestToolMessageContent::Text(t) => t.clone(),
                        ChatCompletionRequestToolMessageContent::Array(a) => text_parts(
                            a.iter().map(|p| match p {
                                ChatCompletionRequestToolMessageContentPart::Text(t) => Some(t.text.as_str()),
                            }),
                            &param,
                        )?,
                    },
                    tool_call_id: t.tool_call_id.clone(),
                    ..Message::default()
                },
                M::Function(_) => {
                    return Err(ApiError::invalid(
                        FLAVOR,
                        &format!("messages[{i}].role"),
                        "function messages (deprecated) are not supported; answer a tool call with a tool message",
                    ));
                }
            })
        })
        .collect()
}

fn stop(stop: &Option<StopConfiguration>) -> Vec<String> {
    match stop {
        None => Vec::new(),
        Some(StopConfiguration::String(s)) => vec![s.clone()],
        Some(StopConfiguration::StringArray(a)) => a.clone(),
    }
}

fn max_tokens(param: &str, n: Option<u32>) -> Result<Option<u32>, ApiError> {
    edge::max_tokens(FLAVOR, param, n.map(u64::from))
}

/// The functions a chat request offers, and the choice among them.
#[allow(deprecated)] // `functions`: deprecated in OpenAI's API, and still sent
fn tools(req: &CreateChatCompletionRequest) -> Result<(Vec<Tool>, ToolChoice), ApiError> {
    if req.functions.as_ref().is_some_and(|f| !f.is_empty()) {
        return Err(ApiError::invalid(FLAVOR, "functions", "functions (deprecated) is not supported; offer them as tools"));
    }
    let tools = req
        .tools
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| match t {
            ChatCompletionTools::Function(t) => Ok(Tool {
                name: t.function.name.clone(),
                description: t.function.description.clone().unwrap_or_default(),
                parameters: t.function.parameters.as_ref().map(|p| p.to_string()).unwrap_or_default(),
            }),
            ChatCompletionTools::Custom(_) => {
                Err(ApiError::invalid(FLAVOR, &format!("tools[{i}]"), "custom tools are not supported; revis's tools are functions"))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let choice = match &req.tool_choice {
        None => ToolChoice::Auto,
        Some(ChatCompletionToolChoiceOption::Mode(ToolChoiceOptions::Auto)) => ToolChoice::Auto,
        Some(ChatCompletionToolChoiceOption::Mode(ToolChoiceOptions::None)) => ToolChoice::None,
        Some(ChatCompletionToolChoiceOption::Mode(ToolChoiceOptions::Required)) => ToolChoice::Required,
        Some(ChatCompletionToolChoiceOption::Function(f)) => ToolChoice::Named(f.function.name.clone()),
        Some(_) => {
            return Err(ApiError::invalid(FLAVOR, "tool_choice", "tool_choice must be none, auto, required or one named function"));
        }
    };
    let choice = edge::tool_choice(FLAVOR, &tools, choice)?;
    Ok((tools, choice))
}

/// A chat request as revis's [`GenerateParams`] (its tier set by the caller).
#[allow(deprecated)] // `max_tokens`, `seed` and `function_call` are deprecated in OpenAI's API, and still sent
pub(crate) fn chat_params(req: &CreateChatCompletionRequest) -> Result<GenerateParams, ApiError> {
    choices(req.n)?;
    let (tools, tool_choice) = tools(req)?;
    let logprobs = edge::logprobs(FLAVOR, req.logprobs, req.top_logprobs.map(u32::from))?;
    if req.audio.is_some() {
        return Err(ApiError::invalid(FLAVOR, "audio", "audio output is not supported"));
    }
    if req.messages.is_empty() {
        return Err(ApiError::invalid(FLAVOR, "messages", "messages is empty; send at least one"));
    }
    let format = match &req.response_format {
        None | Some(ResponseFormat::Text) => Format::Text,
        Some(ResponseFormat::JsonObject) => Format::Json { schema: None },
        Some(ResponseFormat::JsonSchema { json_schema }) => Format::Json { schema: Some(json_schema.schema.to_string()) },
    };
    let max = match req.max_completion_tokens {
        Some(n) => max_tokens("max_completion_tokens", Some(n))?,
        None => max_tokens("max_tokens", req.max_tokens)?,
    };
    Ok(GenerateParams {
        messages: messages(req)?,
        sampling: Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            seed: edge::seed(FLAVOR, "seed", req.seed)?,
            presence_penalty: edge::penalty(FLAVOR, "presence_penalty", req.presence_penalty)?,
            frequency_penalty: edge::penalty(FLAVOR, "frequency_penalty", req.frequency_penalty)?,
            ..Default::default()
        },
        max_tokens: max,
        stop: stop(&req.stop),
        format,
        tools,
        tool_choice,
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        logprobs,
        ..Default::default()
    })
}

/// A legacy completion request as revis's [`GenerateParams`].
pub(crate) fn completion_params(req: &CreateCompletionRequest) -> Result<GenerateParams, ApiError> {
    choices(req.n)?;
    let prompt = match &req.prompt {
        Prompt::String(s) => s.clone(),
        Prompt::StringArray(a) if a.len() == 1 => a[0].clone(),
        Prompt::StringArray(a) => {
            return Err(ApiError::invalid(
                FLAVOR,
                "prompt",
                format!("prompt has {} strings; revis answers one prompt per request", a.len()),
            ));
        }
        Prompt::IntegerArray(_) | Prompt::ArrayOfIntegerArray(_) => {
            return Err(ApiError::invalid(FLAVOR, "prompt", "token ID prompts are not supported; send text"));
        }
    };
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid(FLAVOR, "suffix", "suffix (fill in the middle) is not supported"));
    }
    if req.echo == Some(true) {
        return Err(ApiError::invalid(FLAVOR, "echo", "echo is not supported"));
    }
    if let Some(n) = req.logprobs
        && u32::from(n) > MAX_TOP_LOGPROBS
    {
        return Err(ApiError::invalid(FLAVOR, "logprobs", format!("logprobs is {n}; it must be at most {MAX_TOP_LOGPROBS}")));
    }
    if req.best_of.is_some_and(|n| n > 1) {
        return Err(ApiError::invalid(FLAVOR, "best_of", "best_of must be 1: revis answers with one choice"));
    }
    Ok(GenerateParams {
        messages: vec![Message::user(prompt)],
        sampling: Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            seed: edge::seed(FLAVOR, "seed", req.seed)?,
            presence_penalty: edge::penalty(FLAVOR, "presence_penalty", req.presence_penalty)?,
            frequency_penalty: edge::penalty(FLAVOR, "frequency_penalty", req.frequency_penalty)?,
            ..Default::default()
        },
        max_tokens: max_tokens("max_tokens", req.max_tokens)?,
        stop: stop(&req.stop),
        logprobs: req.logprobs.map(u32::from),
        ..Default::default()
    })
}

/// The most choices one request may ask for (`n`): streams of one batch.
const MAX_CHOICES: u8 = 8;

/// How many choices a request asks for.
pub(super) fn choices(n: Option<u8>) -> Result<usize, ApiError> {
    match n.unwrap_or(1) {
        0 => Err(ApiError::invalid(FLAVOR, "n", "n is 0; it must be at least 1")),
        n if n > MAX_CHOICES => Err(ApiError::invalid(FLAVOR, "n", format!("n is {n}; revis answers with at most {MAX_CHOICES} choices"))),
        n => Ok(usize::from(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use serde_json::json;

    fn chat_req(v: serde_json::Value) -> Result<GenerateParams, ApiError> {
        chat_params(&serde_json::from_value(v).expect("a chat request"))
    }

    #[test]
    fn a_chat_request_carries_its_settings() {
        let p = chat_req(json!({
            "model": "tier2",
            "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]}],
            "max_completion_tokens": 12, "max_tokens": 99, "temperature": 0.0, "top_p": 0.5, "seed": 7, "stop": "\n",
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
        }))
        .unwrap();
        assert_eq!(p.messages, vec![Message::system("Be brief."), Message::user("Hi there")]);
        assert_eq!((p.max_tokens, p.sampling.temperature, p.sampling.top_p, p.sampling.seed), (Some(12), Some(0.0), Some(0.5), Some(7)));
        assert_eq!(p.stop, ["\n"]);
        assert_eq!(p.format, Format::Json { schema: Some(r#"{"type":"object"}"#.into()) });
        let p = chat_req(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "stop": ["a", "b"], "response_format": {"type": "json_object"}})).unwrap();
        assert_eq!((p.max_tokens, p.stop, p.format), (Some(5), vec!["a".to_owned(), "b".to_owned()], Format::Json { schema: None }));
    }

    #[test]
    fn what_revis_cannot_do_is_refused_naming_the_field() {
        let user = json!([{"role": "user", "content": "x"}]);
        for (extra, param) in [
            (json!({"n": 9}), "n"),
            (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (json!({"presence_penalty": 2.5}), "presence_penalty"),
            (json!({"seed": -1}), "seed"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"tools": [{"type": "custom", "custom": {"name": "f", "format": {"type": "text"}}}]}), "tools[0]"),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
                "tool_choice",
            ),
        ] {
            let mut req = json!({"model": "m", "messages": user});
            req.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            let e = chat_req(req).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (StatusCode::BAD_REQUEST, Some(param)), "{e:?}");
        }
        let image = json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]});
        assert_eq!(chat_req(image).unwrap_err().param.as_deref(), Some("messages[0].content"));
        assert!(chat_req(json!({"model": "m", "messages": []})).unwrap_err().message.contains("messages is empty"));
    }

    #[test]
    fn tools_calls_and_their_results_carry_over() {
        let p = chat_req(json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": false
        }))
        .unwrap();
        assert_eq!(p.tools, [Tool { name: "get_weather".into(), description: "d".into(), parameters: r#"{"type":"object"}"#.into() }]);
        assert_eq!((p.tool_choice, p.parallel_tool_calls), (ToolChoice::Named("get_weather".into()), false));
        assert_eq!(
            p.messages[1].tool_calls,
            [ToolCall { id: "call_1".into(), name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() }]
        );
        assert_eq!(
            (p.messages[2].role, p.messages[2].tool_call_id.as_str(), p.messages[2].text.as_str()),
            (revis_client::Role::Tool, "call_1", "18 C")
        );
        let p =
            chat_req(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [], "tool_choice": "none"})).unwrap();
        assert_eq!((p.tools.len(), p.tool_choice, p.parallel_tool_calls), (0, ToolChoice::None, true));
    }

    #[test]
    fn a_completion_prompt_is_one_user_message() {
        let req: CreateCompletionRequest = serde_json::from_value(json!({"model": "m", "prompt": ["Once upon"], "max_tokens": 3})).unwrap();
        let p = completion_params(&req).unwrap();
        assert_eq!((p.messages, p.max_tokens), (vec![Message::user("Once upon")], Some(3)));
        let req: CreateCompletionRequest = serde_json::from_value(json!({"model": "m", "prompt": ["a", "b"]})).unwrap();
        assert_eq!(completion_params(&req).unwrap_err().param.as_deref(), Some("prompt"));
    }
}
