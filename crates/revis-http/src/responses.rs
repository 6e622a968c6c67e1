//! OpenAI's Responses API (`POST /v1/responses`), stateless: nothing is
//! kept between requests, so `previous_response_id`, and `store: true` when
//! a request sets it, are refused with a 400 that says so (the reply says
//! `"store": false`). Its request is read into the serde structs below,
//! strictly (a field of the wrong type is a 400 naming it, as on the other
//! APIs), and its reply written as JSON by hand: async-openai's Responses
//! types cover far more than revis serves, and a request need only fit
//! what is read.
//!
//! A request becomes one [`GenerateParams`]: `instructions` is the system
//! message; `input` is a string (one user message) or items: messages
//! (`system`, `developer`, `user`, `assistant`; text content or
//! `input_text`/`output_text` parts), `function_call` items (an assistant's
//! call) and `function_call_output` items (its result); `reasoning` items
//! are left out. `tools` (functions; hosted, `namespace` and `custom` tools
//! are left out, with a line in the log), `tool_choice`,
//! `parallel_tool_calls`, `max_output_tokens` (none: up to the daemon's
//! limit), `temperature`, `top_p` and `text.format` (`json_object`,
//! `json_schema`) carry over.
//!
//! The reply's `output` is a `message` item with one `output_text` part
//! (when the model wrote text, or called nothing) and a `function_call`
//! item per call; `status` is `incomplete` with `max_output_tokens` when
//! the answer ran out. Streamed, the `response.*` events come in OpenAI's
//! order, each with its `sequence_number`: `created`, `in_progress`, the
//! message item (`output_item.added`, `content_part.added`,
//! `output_text.delta`s, `output_text.done`, `content_part.done`,
//! `output_item.done`), each call (`output_item.added`,
//! `function_call_arguments.delta` and `.done`, `output_item.done`), then
//! `completed` (or `incomplete`); a failure after the first is an `error`
//! event.

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use revis_client::{Done, FinishReason, Format, GenerateParams, Message, Role, Runner, Sampling, Tool, ToolCall, ToolChoice};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::app::{AppState, resolve};
use crate::edge;
use crate::error::{ApiError, Flavor};
use crate::generation::Piece;
use crate::reply::{new_id, sse_response, unix_now};
use crate::request::{self, TextOr, WordOr};

const FLAVOR: Flavor = Flavor::OpenAi;

/// Writes one SSE event of a kind, with its data and its sequence number.
trait Event: FnMut(&str, Map<String, Value>) -> Vec<u8> {}
impl<F: FnMut(&str, Map<String, Value>) -> Vec<u8>> Event for F {}

fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(FLAVOR, param, message)
}

/// A Responses request: what revis reads of it, typed, so a field of the
/// wrong type is refused naming it (a null is as good as absent); fields
/// revis does not read are let through.
#[derive(Debug, Deserialize)]
pub(crate) struct ResponsesRequest {
    model: Option<String>,
    instructions: Option<String>,
    /// One user message, or items.
    input: Option<TextOr<Item>>,
    tools: Option<Vec<InTool>>,
    /// `none`, `auto`, `required`, or spelled out.
    tool_choice: Option<WordOr<InToolChoice>>,
    parallel_tool_calls: Option<bool>,
    max_output_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    text: Option<TextConfig>,
    stream: Option<bool>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    conversation: Option<Value>,
}

/// An input item: a message (its `type` may be left out), a
/// `function_call`, a `function_call_output`, or `reasoning`.
#[derive(Debug, Deserialize)]
pub(crate) struct Item {
    #[serde(rename = "type")]
    kind: Option<String>,
    role: Option<String>,
    content: Option<TextOr<Part>>,
    call_id: Option<String>,
    name: Option<String>,
    /// A string (the Responses form); a JSON value is taken too (edge.rs).
    arguments: Option<Value>,
    output: Option<TextOr<Part>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Part {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
}

/// A tool offered: a function (its name, description and parameters), or
/// one revis does not run.
#[derive(Debug, Deserialize)]
pub(crate) struct InTool {
    #[serde(rename = "type")]
    kind: Option<String>,
    name: Option<String>,
    description: Option<String>,
    parameters: Option<Value>,
}

/// `tool_choice` spelled out: a function by its name (or a kind revis does not serve).
#[derive(Debug, Deserialize)]
pub(crate) struct InToolChoice {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TextConfig {
    format: Option<TextFormat>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TextFormat {
    #[serde(rename = "type")]
    kind: Option<String>,
    schema: Option<Value>,
}

/// A content's text: a string, or text parts (`input_text`, `output_text`, `text`).
fn text_of(content: Option<&TextOr<Part>>, field: &str) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(TextOr::Text(s)) => Ok(s.clone()),
        Some(TextOr::List(parts)) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                match (p.kind.as_deref(), &p.text) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => out.push_str(t),
                    _ => return Err(invalid(&format!("{field}[{i}]"), "only text parts are supported: revis's models read text")),
                }
            }
            Ok(out)
        }
    }
}

/// The request's messages as revis's.
fn messages(req: &ResponsesRequest) -> Result<Vec<Message>, ApiError> {
    let mut out = Vec::new();
    if let Some(text) = req.instructions.as_ref().filter(|t| !t.is_empty()) {
        out.push(Message::system(text.clone()));
    }
    let items = match &req.input {
        Some(TextOr::Text(s)) => {
            out.push(Message::user(s.clone()));
            return Ok(out);
        }
        Some(TextOr::List(items)) => items,
        None => return Err(invalid("input", "input must be a string or a list of items")),
    };
    for (i, item) in items.iter().enumerate() {
        let field = format!("input[{i}]");
        let kind = item.kind.as_deref().unwrap_or(if item.role.is_some() { "message" } else { "" });
        match kind {
            "message" => {
                let role = match item.role.as_deref() {
                    Some("system" | "developer") => Role::System,
                    Some("user") => Role::User,
                    Some("assistant") => Role::Assistant,
                    other => {
                        return Err(invalid(
                            &format!("{field}.role"),
                            format!("role {other:?} must be system, developer, user or assistant"),
                        ));
                    }
                };
                out.push(Message::new(role, text_of(item.content.as_ref(), &format!("{field}.content"))?));
            }
            "function_call" => {
                let call = ToolCall {
                    id: item.call_id.clone().unwrap_or_default(),
                    name: item.name.clone().ok_or_else(|| invalid(&format!("{field}.name"), "a function_call names its function"))?,
                    arguments: edge::arguments_text(item.arguments.as_ref().unwrap_or(&Value::Null)),
                };
                // Calls one after another are one assistant message's.
                match out.last_mut() {
                    Some(m) if m.role == Role::Assistant && !m.tool_calls.is_empty() => m.tool_calls.push(call),
                    _ => out.push(Message { role: Role::Assistant, tool_calls: vec![call], ..Message::default() }),
                }
            }
            "function_call_output" => {
                out.push(Message {
                    role: Role::Tool,
                    text: text_of(item.output.as_ref(), &format!("{field}.output"))?,
                    tool_call_id: item.call_id.clone().unwrap_or_default(),
                    ..Message::default()
                });
            }
            "reasoning" => {}
            other => return Err(invalid(&format!("{field}.type"), format!("input items of type {other:?} are not supported"))),
        }
    }
    Ok(out)
}

/// The functions offered and the choice among them.
fn tools(req: &ResponsesRequest) -> Result<(Vec<Tool>, ToolChoice), ApiError> {
    let mut tools = Vec::new();
    for (i, t) in req.tools.iter().flatten().enumerate() {
        if t.kind.as_deref() != Some("function") {
            // Hosted tools (web_search), groups (namespace) and freeform
            // (custom) ones: left out, as local servers do for Codex.
            tracing::info!("tools[{i}] (type {}) left out: revis offers function tools only", t.kind.as_deref().unwrap_or("none"));
            continue;
        }
        tools.push(Tool {
            name: t.name.clone().ok_or_else(|| invalid(&format!("tools[{i}].name"), "a function tool has a name"))?,
            description: t.description.clone().unwrap_or_default(),
            parameters: t.parameters.as_ref().filter(|p| !p.is_null()).map(Value::to_string).unwrap_or_default(),
        });
    }
    let choice = match &req.tool_choice {
        None => ToolChoice::Auto,
        Some(WordOr::Word(s)) if s == "auto" => ToolChoice::Auto,
        Some(WordOr::Word(s)) if s == "none" => ToolChoice::None,
        Some(WordOr::Word(s)) if s == "required" => ToolChoice::Required,
        Some(WordOr::Object(InToolChoice { kind, name })) if kind == "function" => ToolChoice::Named(name.clone().unwrap_or_default()),
        _ => return Err(invalid("tool_choice", "tool_choice must be none, auto, required or one named function")),
    };
    let choice = edge::tool_choice(FLAVOR, &tools, choice)?;
    Ok((tools, choice))
}

/// A Responses request as revis's [`GenerateParams`] (its tier set by the caller).
pub(crate) fn params(req: &ResponsesRequest) -> Result<GenerateParams, ApiError> {
    if req.previous_response_id.is_some() {
        return Err(invalid(
            "previous_response_id",
            "revis keeps no responses (its Responses API is stateless): send the whole conversation in input",
        ));
    }
    if req.store == Some(true) {
        return Err(invalid("store", "revis keeps no responses (its Responses API is stateless): leave store out or set it false"));
    }
    if req.conversation.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(invalid("conversation", "revis keeps no conversations: send the whole conversation in input"));
    }
    // Without max_output_tokens the answer may run to the daemon's limit
    // (its max_tokens_limit, or the context's end), as OpenAI's does.
    let max_tokens = edge::max_tokens(FLAVOR, "max_output_tokens", req.max_output_tokens)?.or(Some(u32::MAX));
    let format = match req.text.as_ref().and_then(|t| t.format.as_ref()) {
        None => Format::Text,
        Some(f) => match f.kind.as_deref().unwrap_or("text") {
            "text" => Format::Text,
            "json_object" => Format::Json { schema: None },
            "json_schema" => Format::Json { schema: f.schema.as_ref().map(Value::to_string) },
            other => return Err(invalid("text.format.type", format!("{other:?} must be text, json_object or json_schema"))),
        },
    };
    let (tools, tool_choice) = tools(req)?;
    let messages = messages(req)?;
    if messages.is_empty() {
        return Err(invalid("input", "input is empty; send at least one message"));
    }
    Ok(GenerateParams {
        messages,
        sampling: Sampling { temperature: req.temperature, top_p: req.top_p, ..Default::default() },
        max_tokens,
        format,
        tools,
        tool_choice,
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        ..Default::default()
    })
}

/// What the reply repeats of the request.
struct Echo {
    id: String,
    created_at: u32,
    model: String,
    request: Value,
}

impl Echo {
    /// The response object, `status` and `output` as given.
    fn response(&self, status: &str, output: Vec<Value>, done: Option<&Done>) -> Value {
        let r = &self.request;
        let mut v = json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.model, "output": output, "error": null, "incomplete_details": null,
            "instructions": r.get("instructions").cloned().unwrap_or(Value::Null),
            "max_output_tokens": r.get("max_output_tokens").cloned().unwrap_or(Value::Null),
            "parallel_tool_calls": r.get("parallel_tool_calls").cloned().unwrap_or(Value::Bool(true)),
            "temperature": r.get("temperature").cloned().unwrap_or(Value::Null),
            "top_p": r.get("top_p").cloned().unwrap_or(Value::Null),
            "tool_choice": r.get("tool_choice").cloned().unwrap_or(json!("auto")),
            "tools": r.get("tools").cloned().unwrap_or(json!([])),
            "text": r.get("text").cloned().unwrap_or(json!({"format": {"type": "text"}})),
            "store": false, "metadata": {}, "usage": null,
        });
        if let Some(d) = done {
            v["usage"] = json!({
                "input_tokens": d.prompt_tokens, "output_tokens": d.generated_tokens,
                "total_tokens": d.prompt_tokens + d.generated_tokens,
                "input_tokens_details": {"cached_tokens": d.cached_tokens},
                "output_tokens_details": {"reasoning_tokens": 0},
            });
            if d.finish_reason == FinishReason::Length {
                v["incomplete_details"] = json!({"reason": "max_output_tokens"});
            }
        }
        v
    }
}

fn status(d: &Done) -> &'static str {
    if d.finish_reason == FinishReason::Length { "incomplete" } else { "completed" }
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content: Vec<Value> = if status == "in_progress" { Vec::new() } else { vec![text_part(text)] };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn call_item(id: &str, c: &ToolCall, status: &str) -> Value {
    let arguments = if status == "in_progress" { "" } else { c.arguments.as_str() };
    json!({"type": "function_call", "id": id, "call_id": c.id, "name": c.name, "arguments": arguments, "status": status})
}

/// A finished answer's output items.
pub(crate) fn output(d: &Done, message_id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    if !d.text.is_empty() || d.tool_calls.is_empty() {
        out.push(message_item(message_id, &d.text, status(d)));
    }
    out.extend(d.tool_calls.iter().map(|c| call_item(&format!("fc_{}", c.id), c, "completed")));
    out
}

pub(crate) async fn create<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    answer(app, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn answer<R: Runner>(app: AppState<R>, body: Body) -> Result<Response, ApiError> {
    let body = request::bytes(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
    let req: ResponsesRequest = request::parse(FLAVOR, &body)?;
    let model = req.model.clone().ok_or_else(|| invalid("model", "model names the model to answer"))?;
    let params = params(&req)?;
    let entry = resolve(&app, &model, FLAVOR).await?;
    let place = app.generation_place(FLAVOR)?;
    let mut generation = app.start(FLAVOR, &entry, params, place)?;
    let stream = req.stream == Some(true);
    // The reply repeats the request's own settings as it sent them.
    let echoed: Value = request::parse(FLAVOR, &body)?;
    let echo = Echo { id: new_id("resp"), created_at: unix_now(), model, request: echoed };
    let message_id = new_id("msg");
    if !stream {
        let done = generation.finish().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
        let v = echo.response(status(&done), output(&done, &message_id), Some(&done));
        return Ok(([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response());
    }
    let first = generation.first_or_wait().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
    let mut seq = 0u64;
    let mut event = move |kind: &str, mut data: Map<String, Value>| {
        data.insert("type".into(), kind.into());
        data.insert("sequence_number".into(), seq.into());
        seq += 1;
        format!("event: {kind}\ndata: {}\n\n", Value::Object(data)).into_bytes()
    };
    let obj = |v: Value| match v {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    let mut text = String::new();
    let mut opened = false;
    let mut begun = false;
    let encode = move |p: Piece| {
        let mut out = Vec::new();
        if !begun {
            begun = true;
            let r = echo.response("in_progress", Vec::new(), None);
            out.extend(event("response.created", obj(json!({"response": r}))));
            out.extend(event("response.in_progress", obj(json!({"response": r}))));
        }
        let open = |out: &mut Vec<u8>, event: &mut dyn Event| {
            out.extend(event(
                "response.output_item.added",
                obj(json!({"output_index": 0, "item": message_item(&message_id, "", "in_progress")})),
            ));
            let part = json!({"item_id": message_id, "output_index": 0, "content_index": 0, "part": text_part("")});
            out.extend(event("response.content_part.added", obj(part)));
        };
        match p {
            Piece::Wait => out.extend_from_slice(crate::generation::SSE_WAIT),
            Piece::Text(t) => {
                if !opened {
                    opened = true;
                    open(&mut out, &mut event);
                }
                text.push_str(&t);
                let delta = json!({"item_id": message_id, "output_index": 0, "content_index": 0, "delta": t, "logprobs": []});
                out.extend(event("response.output_text.delta", obj(delta)));
            }
            Piece::End(Ok(d)) => {
                if !opened && d.tool_calls.is_empty() {
                    opened = true;
                    open(&mut out, &mut event);
                }
                let mut index = 0;
                if opened {
                    let at = json!({"item_id": message_id, "output_index": 0, "content_index": 0});
                    let mut done = obj(at.clone());
                    done.insert("text".into(), text.clone().into());
                    done.insert("logprobs".into(), json!([]));
                    out.extend(event("response.output_text.done", done));
                    let mut part = obj(at);
                    part.insert("part".into(), text_part(&text));
                    out.extend(event("response.content_part.done", part));
                    out.extend(event(
                        "response.output_item.done",
                        obj(json!({"output_index": 0, "item": message_item(&message_id, &text, status(&d))})),
                    ));
                    index = 1;
                }
                for c in &d.tool_calls {
                    let item_id = format!("fc_{}", c.id);
                    out.extend(event(
                        "response.output_item.added",
                        obj(json!({"output_index": index, "item": call_item(&item_id, c, "in_progress")})),
                    ));
                    out.extend(event(
                        "response.function_call_arguments.delta",
                        obj(json!({"item_id": item_id, "output_index": index, "delta": c.arguments})),
                    ));
                    out.extend(event(
                        "response.function_call_arguments.done",
                        obj(json!({"item_id": item_id, "output_index": index, "name": c.name, "arguments": c.arguments})),
                    ));
                    out.extend(event(
                        "response.output_item.done",
                        obj(json!({"output_index": index, "item": call_item(&item_id, c, "completed")})),
                    ));
                    index += 1;
                }
                let kind = if status(&d) == "incomplete" { "response.incomplete" } else { "response.completed" };
                let r = echo.response(status(&d), output(&d, &message_id), Some(&d));
                out.extend(event(kind, obj(json!({"response": r}))));
            }
            Piece::End(Err(e)) => {
                let body = ApiError::from_call(FLAVOR, &e);
                out.extend(event("error", obj(json!({"code": body.code, "message": body.message, "param": body.param}))));
            }
        }
        out
    };
    Ok(sse_response(first, generation, encode))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request `v` read as a body is, then as revis's.
    fn params(v: &Value) -> Result<GenerateParams, ApiError> {
        super::params(&request::parse(FLAVOR, v.to_string().as_bytes())?)
    }

    #[test]
    fn input_items_become_messages_calls_and_results() {
        let p = params(&json!({
            "model": "tier2", "instructions": "Be brief.", "max_output_tokens": 40, "temperature": 0,
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}
            ],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}
        }))
        .unwrap();
        let roles: Vec<Role> = p.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::System, Role::User, Role::Assistant, Role::Tool]);
        assert_eq!(p.messages[2].tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!((p.messages[3].tool_call_id.as_str(), p.messages[3].text.as_str()), ("call_1", "18 C"));
        assert_eq!((p.max_tokens, p.tool_choice.clone()), (Some(40), ToolChoice::Named("get_weather".into())));
        assert_eq!(p.format, Format::Json { schema: Some(r#"{"type":"object"}"#.into()) });
        let p = params(&json!({"model": "m", "input": "Hi"})).unwrap();
        assert_eq!(p.messages, [Message::user("Hi")]);
    }

    #[test]
    fn state_and_what_cannot_be_done_are_refused_naming_the_field() {
        for (v, param) in [
            (json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}), "previous_response_id"),
            (json!({"model": "m", "input": "x", "store": true}), "store"),
            (json!({"model": "m", "input": 3}), "input"),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[0]",
            ),
            (json!({"model": "m", "input": "x", "tool_choice": "required"}), "tool_choice"),
            (json!({"model": "m", "input": "x", "max_output_tokens": 0}), "max_output_tokens"),
            (json!({"model": "m", "input": "x", "max_output_tokens": -5}), "max_output_tokens"),
            (json!({"model": "m", "input": "x", "max_output_tokens": "abc"}), "max_output_tokens"),
            (json!({"model": "m", "input": "x", "temperature": "hot"}), "temperature"),
            (json!({"model": "m", "input": "x", "top_p": [1]}), "top_p"),
            (json!({"model": "m", "input": "x", "parallel_tool_calls": "yes"}), "parallel_tool_calls"),
        ] {
            assert_eq!(params(&v).unwrap_err().param.as_deref(), Some(param), "{v}");
        }
        assert!(params(&json!({"model": "m", "input": "x", "store": false})).is_ok());
        let nulls = params(&json!({"model": "m", "input": "x", "temperature": null, "max_output_tokens": null})).unwrap();
        assert_eq!((nulls.sampling.temperature, nulls.max_tokens), (None, Some(u32::MAX)), "null is absent");
        let e = params(&json!({"model": "m", "input": "x", "temperature": "hot"})).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (axum::http::StatusCode::BAD_REQUEST, Some("temperature")));
        assert!(e.message.contains(r#"temperature: invalid type: string "hot", expected f32"#), "{}", e.message);
    }

    /// What Codex sends: hosted and grouped tools beside its functions, no
    /// max_output_tokens.
    #[test]
    fn tools_that_are_not_functions_are_left_out_and_no_cap_runs_to_the_limit() {
        let f = json!({"type": "function", "name": "f", "parameters": {"type": "object"}});
        let p = params(&json!({
            "model": "m", "input": "x",
            "tools": [{"type": "web_search", "external_web_access": false}, f, {"type": "namespace", "name": "n", "tools": []}, {"type": "custom", "name": "apply_patch"}],
            "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k", "store": false
        }))
        .unwrap();
        assert_eq!(p.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["f"]);
        assert_eq!(p.max_tokens, Some(u32::MAX), "lowered to the daemon's limit (edge.rs)");
    }

    #[test]
    fn the_output_holds_the_text_then_each_call() {
        let d = Done {
            text: String::new(),
            finish_reason: FinishReason::ToolCalls,
            tool_calls: vec![ToolCall { id: "c1".into(), name: "f".into(), arguments: "{}".into() }],
            ..Default::default()
        };
        let out = output(&d, "msg_1");
        assert_eq!(
            out,
            [json!({"type": "function_call", "id": "fc_c1", "call_id": "c1", "name": "f", "arguments": "{}", "status": "completed"})]
        );
        let d = Done { text: "Hi".into(), finish_reason: FinishReason::Length, ..Default::default() };
        assert_eq!((output(&d, "m")[0]["content"][0]["text"].as_str(), status(&d)), (Some("Hi"), "incomplete"));
    }
}
