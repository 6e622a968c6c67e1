//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`),
//! as Claude Code and Anthropic's SDKs speak it. Anthropic publishes no Rust
//! types, so its requests and replies are the serde structs below, written
//! from its API reference.
//!
//! A request becomes one [`GenerateParams`]: `system` (a string or text
//! blocks) is the system message; a message's text blocks are its text,
//! an assistant's `tool_use` blocks its tool calls, a user's `tool_result`
//! blocks tool messages (before the user's text); a `system` message
//! inside `messages` joins the system text (edge.rs); `max_tokens` (required),
//! `stop_sequences`, `temperature`, `top_p` and `top_k` carry over; `tools`
//! (`input_schema`) are functions (server tools are left out, with a line
//! in the log) and `tool_choice` `auto`, `any`, `tool`
//! (one named) or `none`, `disable_parallel_tool_use` as asked. Earlier
//! `thinking` blocks are left out (revis's models write none); images and
//! documents are refused naming the block.
//!
//! The reply is a `message` with a `text` block, then a `tool_use` block
//! per call (an `input` that is not JSON as the string the model wrote:
//! edge.rs), and `stop_reason` `end_turn`, `max_tokens`, `stop_sequence` or
//! `tool_use` (`stop_sequence` is said when one was asked: the daemon does
//! not report which of several matched). Streaming sends Anthropic's
//! events in order: `message_start`, `ping`, a text block
//! (`content_block_start`, `text_delta`s, `content_block_stop`), each call
//! as a `tool_use` block with one `input_json_delta`, `message_delta` with
//! the stop reason and the usage, `message_stop`; a failure after the
//! first event is an `error` event. `count_tokens` evaluates the prompt
//! once (warming the cache for the request that follows) and says its
//! length. Errors are `{"type": "error", "error": {"type", "message"}}`.

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use revis_client::{Done, FinishReason, GenerateParams, Message, Role, Runner, Sampling, Tool, ToolCall, ToolChoice};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::{AppState, resolve};
use crate::edge;
use crate::error::{ApiError, Flavor};
use crate::generation::Piece;
use crate::reply::{new_id, sse_response};
use crate::request;

const FLAVOR: Flavor = Flavor::Anthropic;

/// A text given as a string or as blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Block {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default)]
        content: Option<Content>,
        #[serde(default)]
        is_error: Option<bool>,
    },
    Thinking {},
    RedactedThinking {},
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
pub(crate) struct InMessage {
    role: String,
    content: Content,
}

#[derive(Debug, Deserialize)]
pub(crate) struct InTool {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    input_schema: Option<Value>,
    /// Server tools (web search, code execution) have a type; functions have none or `custom`.
    #[serde(rename = "type", default)]
    kind: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct InToolChoice {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    disable_parallel_tool_use: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct MessagesRequest {
    model: String,
    max_tokens: Option<u32>,
    #[serde(default)]
    messages: Vec<InMessage>,
    #[serde(default)]
    system: Option<Content>,
    #[serde(default)]
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<Vec<InTool>>,
    #[serde(default)]
    tool_choice: Option<InToolChoice>,
}

/// The text of text blocks; any other block is refused, naming it.
fn text_of(content: &Content, field: &str) -> Result<String, ApiError> {
    match content {
        Content::Text(t) => Ok(t.clone()),
        Content::Blocks(blocks) => {
            let mut out = Vec::new();
            for (i, b) in blocks.iter().enumerate() {
                match b {
                    Block::Text { text } => out.push(text.as_str()),
                    _ => return Err(ApiError::invalid(FLAVOR, &format!("{field}[{i}]"), "only text blocks are supported here")),
                }
            }
            Ok(out.join("\n"))
        }
    }
}

/// A request's messages as revis's.
fn messages(req: &MessagesRequest) -> Result<Vec<Message>, ApiError> {
    let mut out = Vec::new();
    if let Some(system) = &req.system {
        let text = text_of(system, "system")?;
        if !text.is_empty() {
            out.push(Message::system(text));
        }
    }
    for (i, m) in req.messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            // Claude Code's environment; joined with `system` (edge.rs).
            "system" => Role::System,
            other => {
                return Err(ApiError::invalid(
                    FLAVOR,
                    &format!("messages[{i}].role"),
                    format!("role {other:?} must be user, assistant or system"),
                ));
            }
        };
        let blocks = match &m.content {
            Content::Text(t) => {
                out.push(Message::new(role, t.clone()));
                continue;
            }
            Content::Blocks(b) => b,
        };
        let mut text = Vec::new();
        let mut calls = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let field = format!("messages[{i}].content[{j}]");
            match b {
                Block::Text { text: t } => text.push(t.clone()),
                Block::ToolUse { id, name, input } if role == Role::Assistant => {
                    calls.push(ToolCall { id: id.clone(), name: name.clone(), arguments: edge::arguments_text(input) });
                }
                Block::ToolResult { tool_use_id, content, is_error } if role == Role::User => {
                    let mut result = match content {
                        None => String::new(),
                        Some(c) => text_of(c, &format!("{field}.content"))?,
                    };
                    if is_error == &Some(true) {
                        result = format!("Error: {result}");
                    }
                    out.push(Message { role: Role::Tool, text: result, tool_call_id: tool_use_id.clone(), ..Message::default() });
                }
                Block::Thinking {} | Block::RedactedThinking {} => {}
                Block::ToolUse { .. } => return Err(ApiError::invalid(FLAVOR, &field, "tool_use blocks belong in assistant messages")),
                Block::ToolResult { .. } => return Err(ApiError::invalid(FLAVOR, &field, "tool_result blocks belong in user messages")),
                Block::Other => {
                    return Err(ApiError::invalid(
                        FLAVOR,
                        &field,
                        "only text, tool_use and tool_result blocks are supported: revis's models read text",
                    ));
                }
            }
        }
        if !text.is_empty() || !calls.is_empty() {
            out.push(Message { role, text: text.join("\n"), tool_calls: calls, ..Message::default() });
        }
    }
    Ok(out)
}

/// The functions a request offers, and the choice among them.
fn tools(req: &MessagesRequest) -> Result<(Vec<Tool>, ToolChoice, bool), ApiError> {
    let mut tools = Vec::new();
    for (i, t) in req.tools.iter().flatten().enumerate() {
        match t.kind.as_deref() {
            None | Some("custom") => tools.push(Tool {
                name: t.name.clone(),
                description: t.description.clone().unwrap_or_default(),
                parameters: t.input_schema.as_ref().map(Value::to_string).unwrap_or_default(),
            }),
            // Server tools (web search, code execution) run at Anthropic:
            // left out, as local servers do for Claude Code.
            Some(other) => tracing::info!("tools[{i}] ({other}) left out: revis offers the functions you run"),
        }
    }
    let (choice, parallel) = match &req.tool_choice {
        None => (ToolChoice::Auto, true),
        Some(c) => {
            let choice = match (c.kind.as_str(), &c.name) {
                ("auto", _) => ToolChoice::Auto,
                ("any", _) => ToolChoice::Required,
                ("none", _) => ToolChoice::None,
                ("tool", Some(name)) => ToolChoice::Named(name.clone()),
                ("tool", None) => return Err(ApiError::invalid(FLAVOR, "tool_choice.name", "tool_choice of type tool names a tool")),
                (other, _) => {
                    return Err(ApiError::invalid(FLAVOR, "tool_choice.type", format!("{other:?} must be auto, any, tool or none")));
                }
            };
            (choice, c.disable_parallel_tool_use != Some(true))
        }
    };
    let choice = edge::tool_choice(FLAVOR, &tools, choice)?;
    Ok((tools, choice, parallel))
}

/// A Messages request as revis's [`GenerateParams`] (its tier set by the caller).
pub(crate) fn params(req: &MessagesRequest, count_only: bool) -> Result<GenerateParams, ApiError> {
    let max_tokens = match req.max_tokens {
        None if count_only => None,
        None => return Err(ApiError::invalid(FLAVOR, "max_tokens", "max_tokens is required")),
        n => edge::max_tokens(FLAVOR, "max_tokens", n.map(u64::from))?,
    };
    if req.messages.is_empty() {
        return Err(ApiError::invalid(FLAVOR, "messages", "messages is empty; send at least one"));
    }
    let (tools, tool_choice, parallel_tool_calls) = tools(req)?;
    Ok(GenerateParams {
        messages: messages(req)?,
        sampling: Sampling { temperature: req.temperature, top_p: req.top_p, top_k: req.top_k, ..Default::default() },
        max_tokens,
        stop: req.stop_sequences.clone().unwrap_or_default(),
        tools,
        tool_choice,
        parallel_tool_calls,
        ..Default::default()
    })
}

fn stop_reason(d: &Done) -> &'static str {
    match d.finish_reason {
        FinishReason::End => "end_turn",
        FinishReason::Length => "max_tokens",
        FinishReason::Stop => "stop_sequence",
        FinishReason::ToolCalls => "tool_use",
    }
}

/// The stop sequence that ended the answer, when it can be told: the one asked.
fn stop_sequence(d: &Done, asked: &[String]) -> Value {
    match (d.finish_reason, asked) {
        (FinishReason::Stop, [one]) => json!(one),
        _ => Value::Null,
    }
}

/// Anthropic's usage: the prompt is `input_tokens` + `cache_read_input_tokens`
/// (Claude Code adds them up to know how full the context is).
fn usage(d: &Done) -> Value {
    json!({
        "input_tokens": d.prompt_tokens.saturating_sub(d.cached_tokens),
        "output_tokens": d.generated_tokens,
        "cache_read_input_tokens": d.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

pub(crate) fn tool_use(c: &ToolCall) -> Value {
    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": edge::arguments_json(&c.arguments)})
}

fn json_response(v: &Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// One SSE event as Anthropic names them.
fn event(name: &str, data: &Value) -> Vec<u8> {
    format!("event: {name}\ndata: {data}\n\n").into_bytes()
}

pub(crate) async fn messages_route<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    answer(app, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn answer<R: Runner>(app: AppState<R>, body: Body) -> Result<Response, ApiError> {
    let req: MessagesRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
    let params = params(&req, false)?;
    let entry = resolve(&app, &req.model, FLAVOR).await?;
    let place = app.generation_place(FLAVOR)?;
    let asked_stops = params.stop.clone();
    let mut generation = app.start(FLAVOR, &entry, params, place)?;
    let (id, model) = (new_id("msg"), req.model.clone());
    if req.stream != Some(true) {
        let done = generation.finish().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
        let mut content = Vec::new();
        if !done.text.is_empty() || done.tool_calls.is_empty() {
            content.push(json!({"type": "text", "text": done.text}));
        }
        content.extend(done.tool_calls.iter().map(tool_use));
        return Ok(json_response(&json!({
            "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason(&done), "stop_sequence": stop_sequence(&done, &asked_stops), "usage": usage(&done),
        })));
    }
    let first = generation.first_or_wait().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
    let start = json!({
        "type": "message_start",
        "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            // Known once the daemon has read the prompt in, which comes
            // before its first token and, but for a prompt too slow to
            // tokenize, before the first wait.
            "usage": {"input_tokens": generation.prompt_tokens().unwrap_or(0), "output_tokens": 0},
        },
    });
    let mut opened = false;
    let mut started = false;
    let encode = move |p: Piece| {
        let mut out = Vec::new();
        if !started {
            started = true;
            out.extend(event("message_start", &start));
            out.extend(event("ping", &json!({"type": "ping"})));
        }
        match p {
            Piece::Wait if out.is_empty() => out.extend(event("ping", &json!({"type": "ping"}))),
            Piece::Wait => {}
            Piece::Text(t) => {
                if !opened {
                    opened = true;
                    out.extend(event(
                        "content_block_start",
                        &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                    ));
                }
                out.extend(event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}),
                ));
            }
            Piece::End(Ok(d)) => {
                if !opened && d.tool_calls.is_empty() {
                    opened = true;
                    out.extend(event(
                        "content_block_start",
                        &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                    ));
                }
                let mut index = 0;
                if opened {
                    out.extend(event("content_block_stop", &json!({"type": "content_block_stop", "index": 0})));
                    index = 1;
                }
                for c in &d.tool_calls {
                    let block = json!({"type": "tool_use", "id": c.id, "name": c.name, "input": {}});
                    out.extend(event(
                        "content_block_start",
                        &json!({"type": "content_block_start", "index": index, "content_block": block}),
                    ));
                    let delta = json!({"type": "input_json_delta", "partial_json": c.arguments});
                    out.extend(event("content_block_delta", &json!({"type": "content_block_delta", "index": index, "delta": delta})));
                    out.extend(event("content_block_stop", &json!({"type": "content_block_stop", "index": index})));
                    index += 1;
                }
                let delta = json!({"stop_reason": stop_reason(&d), "stop_sequence": stop_sequence(&d, &asked_stops)});
                out.extend(event("message_delta", &json!({"type": "message_delta", "delta": delta, "usage": usage(&d)})));
                out.extend(event("message_stop", &json!({"type": "message_stop"})));
            }
            Piece::End(Err(e)) => out.extend(event("error", &ApiError::from_call(FLAVOR, &e).body())),
        }
        out
    };
    Ok(sse_response(first, generation, encode))
}

/// `POST /v1/messages/count_tokens`: the prompt's length in the model's
/// tokens, functions included. The prompt is evaluated to find it (one
/// token is made and dropped), which warms the cache for the request that
/// follows.
pub(crate) async fn count_tokens<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    let r = async {
        let req: MessagesRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
        let mut params = params(&req, true)?;
        params.max_tokens = Some(1);
        params.sampling.temperature = Some(0.0);
        // A required call would build its grammar: counting needs only the prompt.
        if matches!(params.tool_choice, ToolChoice::Required | ToolChoice::Named(_)) {
            params.tool_choice = ToolChoice::Auto;
        }
        let entry = resolve(&app, &req.model, FLAVOR).await?;
        let place = app.generation_place(FLAVOR)?;
        let done = app.start(FLAVOR, &entry, params, place)?.finish().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
        Ok::<_, ApiError>(json_response(&json!({"input_tokens": done.prompt_tokens})))
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn req(v: Value) -> Result<GenerateParams, ApiError> {
        params(&serde_json::from_value(v).expect("a Messages request"), false)
    }

    #[test]
    fn a_request_carries_its_system_blocks_tools_and_settings() {
        let p = req(json!({
            "model": "tier2", "max_tokens": 64, "temperature": 0, "top_k": 5, "stop_sequences": ["\n\n"],
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "y"}, {"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]}, {"type": "text", "text": "Thanks"}]}
            ],
            "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true}
        }))
        .unwrap();
        assert_eq!(
            (p.max_tokens, p.sampling.temperature, p.sampling.top_k, p.stop.clone()),
            (Some(64), Some(0.0), Some(5), vec!["\n\n".to_owned()])
        );
        let roles: Vec<Role> = p.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::System, Role::User, Role::Assistant, Role::Tool, Role::User]);
        assert_eq!(p.messages[2].text, "Checking.");
        assert_eq!(
            p.messages[2].tool_calls,
            [ToolCall { id: "toolu_1".into(), name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() }]
        );
        assert_eq!((p.messages[3].tool_call_id.as_str(), p.messages[3].text.as_str()), ("toolu_1", "18 C"));
        assert_eq!((p.tool_choice, p.parallel_tool_calls, p.tools.len()), (ToolChoice::Required, false, 1));
    }

    /// What Claude Code sends: system blocks with cache_control, a system
    /// message inside `messages`, thinking, metadata, context management.
    #[test]
    fn what_claude_code_sends_is_read() {
        let p = req(json!({
            "model": "tier2", "max_tokens": 128000,
            "system": [{"type": "text", "text": "A."}, {"type": "text", "text": "B.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]},
                {"role": "system", "content": [{"type": "text", "text": "Env."}]}
            ],
            "thinking": {"type": "adaptive"}, "metadata": {"user_id": "u"},
            "context_management": {"edits": []}, "output_config": {"effort": "medium"}
        }))
        .unwrap();
        let got: Vec<(Role, &str)> = p.messages.iter().map(|m| (m.role, m.text.as_str())).collect();
        assert_eq!(got, [(Role::System, "A.\nB."), (Role::User, "Hi"), (Role::System, "Env.")], "joined by edge.rs");
    }

    #[test]
    fn what_cannot_be_done_is_refused_naming_the_field() {
        let user = json!([{"role": "user", "content": "x"}]);
        for (v, param) in [
            (json!({"model": "m", "messages": user}), "max_tokens"),
            (json!({"model": "m", "max_tokens": 0, "messages": user}), "max_tokens"),
            (json!({"model": "m", "max_tokens": 5, "messages": []}), "messages"),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages[0].content[0]",
            ),
            (json!({"model": "m", "max_tokens": 5, "messages": user, "tool_choice": {"type": "any"}}), "tool_choice"),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user, "tools": [{"name": "f"}], "tool_choice": {"type": "tool", "name": "g"}}),
                "tool_choice",
            ),
            (json!({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}), "messages[0].role"),
        ] {
            let e = req(v).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (StatusCode::BAD_REQUEST, Some(param)), "{e:?}");
        }
    }

    #[test]
    fn the_reply_names_how_it_ended() {
        let d = Done { finish_reason: FinishReason::Stop, ..Default::default() };
        assert_eq!((stop_reason(&d), stop_sequence(&d, &["\n".into()])), ("stop_sequence", json!("\n")));
        assert_eq!(stop_sequence(&d, &["a".into(), "b".into()]), Value::Null, "which of several is not known");
        let d = Done { finish_reason: FinishReason::ToolCalls, ..Default::default() };
        assert_eq!(stop_reason(&d), "tool_use");
        let call = ToolCall { id: "x".into(), name: "f".into(), arguments: r#"{"a":1}"#.into() };
        assert_eq!(tool_use(&call), json!({"type": "tool_use", "id": "x", "name": "f", "input": {"a": 1}}));
    }
}
