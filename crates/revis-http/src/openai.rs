//! OpenAI's API (`/v1`): models, chat completions, completions; request and
//! response types from `async-openai`.
//!
//! A chat request becomes one [`GenerateParams`]: `system` and `developer`
//! messages are system messages; `max_completion_tokens` (or the older
//! `max_tokens`), `temperature`, `top_p`, `seed` and `stop` carry over;
//! `response_format` `json_object` is JSON, `json_schema` JSON held to its
//! schema by the daemon's grammar. `tools` (functions), `tool_choice`
//! (`none`, `auto`, `required`, one named function) and
//! `parallel_tool_calls` carry over, as do assistant messages' `tool_calls`
//! and `tool` messages; the answer's calls come as `message.tool_calls`
//! with `finish_reason: "tool_calls"` (streamed as OpenAI does: a chunk
//! with each call's index, ID and name, then one with its arguments, before
//! the last chunk). What revis cannot do is
//! refused with a 400 naming the field: more than 8 choices (`n`), custom
//! tools and the deprecated `functions`, non-text content, penalties
//! outside -2 to 2. `logprobs` and `top_logprobs` (at most 20) come as
//! OpenAI writes them (streamed: whole, with the last chunk); the legacy
//! completions' `logprobs` in that API's older shape.
//!
//! A legacy completion's `prompt` is sent as one user message (revis's
//! engine always applies the model's chat template).
//!
//! Embeddings take a string or strings (not token arrays, nor
//! `dimensions`) and answer floats, or base64 (little-endian f32) when
//! `encoding_format` says so, as OpenAI's own Python package asks.
//!
//! Streaming (`stream: true`): the status waits for the answer's first text
//! (so a refused request still gets its 4xx); then `data:` chunks, the first
//! with the assistant's role, each with `choices[0].delta.content`, a last
//! one with `finish_reason`, with `stream_options.include_usage` a chunk
//! with no choices and the usage, and `data: [DONE]`. A failure after text
//! was sent is a `data: {"error": ...}` event, and no `[DONE]`.

use async_openai::types::chat::{
    ChatChoice, ChatChoiceStream, ChatCompletionRequestAssistantMessageContent, ChatCompletionRequestAssistantMessageContentPart,
    ChatCompletionRequestDeveloperMessageContent, ChatCompletionRequestDeveloperMessageContentPart, ChatCompletionRequestMessage,
    ChatCompletionRequestSystemMessageContent, ChatCompletionRequestSystemMessageContentPart, ChatCompletionRequestUserMessageContent,
    ChatCompletionRequestUserMessageContentPart, ChatCompletionResponseMessage, ChatCompletionStreamResponseDelta, CompletionUsage,
    CreateChatCompletionRequest, CreateChatCompletionResponse, CreateChatCompletionStreamResponse, FinishReason, PromptTokensDetails,
    ResponseFormat, Role, StopConfiguration,
};
use async_openai::types::chat::{
    ChatChoiceLogprobs, ChatCompletionTokenLogprob, Choice, CompletionFinishReason, Logprobs, Prompt, TopLogprobs,
};
use async_openai::types::chat::{
    ChatCompletionMessageToolCall, ChatCompletionMessageToolCallChunk, ChatCompletionMessageToolCalls,
    ChatCompletionRequestToolMessageContent, ChatCompletionRequestToolMessageContentPart, ChatCompletionToolChoiceOption,
    ChatCompletionTools, FunctionCall, FunctionCallStream, FunctionType, ToolChoiceOptions,
};
use async_openai::types::completions::{CreateCompletionRequest, CreateCompletionResponse};
use async_openai::types::embeddings::{
    Base64Embedding, Base64EmbeddingVector, CreateBase64EmbeddingResponse, CreateEmbeddingRequest, CreateEmbeddingResponse, Embedding,
    EmbeddingInput, EmbeddingUsage, EncodingFormat,
};
use async_openai::types::models::Model;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use revis_client::{Done, Format, GenerateParams, Message, Runner, Sampling, Tool, ToolCall, ToolChoice};

use crate::app::{AppState, resolve};
use crate::error::{ApiError, Flavor};
use crate::generation::{Generation, Piece};
use crate::reply::{new_id, sse_body, unix_now};
use crate::request;

const FLAVOR: Flavor = Flavor::OpenAi;

fn json_response<T: serde::Serialize>(v: &T) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], serde_json::to_string(v).unwrap_or_default()).into_response()
}

/// A model as OpenAI lists it, with its context in tokens as the peers
/// add it (`context_length` as OpenRouter and LM Studio, `max_model_len`
/// as vLLM); none for a paired node's tier, whose context is not known here.
fn to_model(name: &str, e: &crate::models::Entry) -> serde_json::Value {
    let model = Model { id: name.to_owned(), object: "model".into(), created: 0, owned_by: "revis".into(), ..Default::default() };
    let mut v = serde_json::to_value(model).unwrap_or_default();
    if e.context_tokens > 0 {
        v["context_length"] = e.context_tokens.into();
        v["max_model_len"] = e.context_tokens.into();
    }
    v
}

pub(crate) async fn models<R: Runner>(State(app): State<AppState<R>>) -> Response {
    match app.catalog.fresh(&app.runner).await {
        Ok(c) => json_response(
            &serde_json::json!({"object": "list", "data": c.entries.iter().map(|e| to_model(&e.name, e)).collect::<Vec<_>>()}),
        ),
        Err(e) => ApiError::from_call(FLAVOR, &e).into_response(),
    }
}

pub(crate) async fn model<R: Runner>(State(app): State<AppState<R>>, Path(name): Path<String>) -> Response {
    match app.catalog.get(&app.runner).await {
        Ok(c) => match c.find(&name) {
            Some(e) => json_response(&to_model(&name, e)),
            None => ApiError::model_not_found(FLAVOR, &name, &c.names()).into_response(),
        },
        Err(e) => ApiError::from_call(FLAVOR, &e).into_response(),
    }
}

pub(crate) async fn embeddings<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    embeddings_response(app, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn embeddings_response<R: Runner>(app: AppState<R>, body: Body) -> Result<Response, ApiError> {
    let req: CreateEmbeddingRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
    let inputs = match req.input {
        EmbeddingInput::String(s) => vec![s],
        EmbeddingInput::StringArray(v) => v,
        EmbeddingInput::IntegerArray(_) | EmbeddingInput::ArrayOfIntegerArray(_) => {
            return Err(ApiError::invalid(
                FLAVOR,
                "input",
                "token arrays cannot be embedded: revis's models have their own tokenizers; send the text",
            ));
        }
    };
    if req.dimensions.is_some() {
        return Err(ApiError::invalid(FLAVOR, "dimensions", "dimensions is not supported: an embedding has the model's own size"));
    }
    let entry = resolve(&app, &req.model, FLAVOR).await?;
    let _place = app.generation_place(FLAVOR)?;
    let out = app.embed(FLAVOR, &entry, inputs).await?;
    let tokens: u32 = out.embeddings.iter().map(|e| e.tokens).sum();
    let usage = EmbeddingUsage { prompt_tokens: tokens, total_tokens: tokens };
    let (object, model) = ("list".to_owned(), req.model);
    if req.encoding_format == Some(EncodingFormat::Base64) {
        let data = out
            .embeddings
            .iter()
            .enumerate()
            .map(|(i, e)| Base64Embedding {
                index: i as u32,
                object: "embedding".into(),
                embedding: Base64EmbeddingVector(base64_floats(&e.values)),
            })
            .collect();
        return Ok(json_response(&CreateBase64EmbeddingResponse { object, model, data, usage }));
    }
    let data = out
        .embeddings
        .into_iter()
        .enumerate()
        .map(|(i, e)| Embedding { index: i as u32, object: "embedding".into(), embedding: e.values })
        .collect();
    Ok(json_response(&CreateEmbeddingResponse { object, model, data, usage }))
}

/// OpenAI's base64 embeddings: the floats as little-endian f32 bytes.
fn base64_floats(values: &[f32]) -> String {
    use base64::Engine as _;
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

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

fn seed(seed: Option<i64>) -> Result<Option<u64>, ApiError> {
    seed.map(|s| u64::try_from(s).map_err(|_| ApiError::invalid(FLAVOR, "seed", format!("seed is {s}; it must be 0 or more")))).transpose()
}

fn max_tokens(param: &str, n: Option<u32>) -> Result<Option<u32>, ApiError> {
    match n {
        Some(0) => Err(ApiError::invalid(FLAVOR, param, format!("{param} is 0; it must be at least 1"))),
        n => Ok(n),
    }
}

/// OpenAI's presence or frequency penalty, -2 to 2.
fn penalty(param: &str, v: Option<f32>) -> Result<Option<f32>, ApiError> {
    match v {
        Some(p) if !(-2.0..=2.0).contains(&p) => {
            Err(ApiError::invalid(FLAVOR, param, format!("{param} is {p}; it must be between -2 and 2")))
        }
        v => Ok(v),
    }
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
        Some(ChatCompletionToolChoiceOption::Function(f)) => {
            if !tools.iter().any(|t| t.name == f.function.name) {
                return Err(ApiError::invalid(
                    FLAVOR,
                    "tool_choice",
                    format!("tool_choice names {:?}, which is not among the tools", f.function.name),
                ));
            }
            ToolChoice::Named(f.function.name.clone())
        }
        Some(_) => {
            return Err(ApiError::invalid(FLAVOR, "tool_choice", "tool_choice must be none, auto, required or one named function"));
        }
    };
    if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(ApiError::invalid(FLAVOR, "tool_choice", "tool_choice asks for a call but tools is empty"));
    }
    Ok((tools, choice))
}

/// A chat request as revis's [`GenerateParams`] (its tier set by the caller).
#[allow(deprecated)] // `max_tokens`, `seed` and `function_call` are deprecated in OpenAI's API, and still sent
pub(crate) fn chat_params(req: &CreateChatCompletionRequest) -> Result<GenerateParams, ApiError> {
    choices(req.n)?;
    let (tools, tool_choice) = tools(req)?;
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (_, Some(n)) if u32::from(n) > MAX_TOP_LOGPROBS => {
            return Err(ApiError::invalid(FLAVOR, "top_logprobs", format!("top_logprobs is {n}; it must be at most {MAX_TOP_LOGPROBS}")));
        }
        (Some(true), n) => Some(u32::from(n.unwrap_or(0))),
        (_, Some(n)) if n > 0 => return Err(ApiError::invalid(FLAVOR, "top_logprobs", "top_logprobs needs logprobs: true")),
        _ => None,
    };
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
            seed: seed(req.seed)?,
            presence_penalty: penalty("presence_penalty", req.presence_penalty)?,
            frequency_penalty: penalty("frequency_penalty", req.frequency_penalty)?,
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

/// The most alternatives a token's log-probability may come with.
const MAX_TOP_LOGPROBS: u32 = 20;

/// The tokens an answer's log-probabilities speak of: those with text (the
/// token that ends the turn has none, and OpenAI lists no such token).
fn spoken(d: &Done) -> impl Iterator<Item = &revis_client::TokenLogprob> {
    d.logprobs.iter().filter(|t| !t.piece.is_empty())
}

/// A chat answer's log-probabilities, when they were asked.
fn chat_logprobs(d: &Done) -> Option<ChatChoiceLogprobs> {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (!d.logprobs.is_empty()).then(|| ChatChoiceLogprobs {
        content: Some(
            spoken(d)
                .map(|t| ChatCompletionTokenLogprob {
                    token: lossy(&t.piece),
                    logprob: t.logprob as f32,
                    bytes: Some(t.piece.clone()),
                    top_logprobs: t
                        .top
                        .iter()
                        .map(|a| TopLogprobs { token: lossy(&a.piece), logprob: a.logprob as f32, bytes: Some(a.piece.clone()) })
                        .collect(),
                })
                .collect(),
        ),
        refusal: None,
    })
}

/// A legacy completion's log-probabilities, in that API's older shape.
fn completion_logprobs(d: &Done) -> Option<Logprobs> {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if d.logprobs.is_empty() {
        return None;
    }
    let mut offset = 0u32;
    let (mut tokens, mut token_logprobs, mut top_logprobs, mut text_offset) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for t in spoken(d) {
        tokens.push(lossy(&t.piece));
        token_logprobs.push(Some(t.logprob as f32));
        let top: serde_json::Map<String, serde_json::Value> =
            t.top.iter().map(|a| (lossy(&a.piece), serde_json::json!(a.logprob as f32))).collect();
        top_logprobs.push(serde_json::Value::Object(top));
        text_offset.push(offset);
        offset += t.piece.len() as u32;
    }
    Some(Logprobs { tokens, token_logprobs, top_logprobs, text_offset })
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
            seed: seed(req.seed)?,
            presence_penalty: penalty("presence_penalty", req.presence_penalty)?,
            frequency_penalty: penalty("frequency_penalty", req.frequency_penalty)?,
            ..Default::default()
        },
        max_tokens: max_tokens("max_tokens", req.max_tokens)?,
        stop: stop(&req.stop),
        logprobs: req.logprobs.map(u32::from),
        ..Default::default()
    })
}

fn finish_reason(d: &Done) -> FinishReason {
    match d.finish_reason {
        revis_client::FinishReason::Length => FinishReason::Length,
        revis_client::FinishReason::End | revis_client::FinishReason::Stop => FinishReason::Stop,
        revis_client::FinishReason::ToolCalls => FinishReason::ToolCalls,
    }
}

/// The calls an answer made, as a message carries them.
fn tool_calls(d: &Done) -> Option<Vec<ChatCompletionMessageToolCalls>> {
    (!d.tool_calls.is_empty()).then(|| {
        d.tool_calls
            .iter()
            .map(|c| {
                ChatCompletionMessageToolCalls::Function(ChatCompletionMessageToolCall {
                    id: c.id.clone(),
                    function: FunctionCall { name: c.name.clone(), arguments: c.arguments.clone() },
                })
            })
            .collect()
    })
}

/// The calls an answer made, as OpenAI streams them: for each, a delta
/// with its index, ID, type and name (arguments empty), then one with its
/// arguments.
fn tool_call_chunks(d: &Done) -> Vec<ChatCompletionMessageToolCallChunk> {
    d.tool_calls
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            let named = ChatCompletionMessageToolCallChunk {
                index: i as u32,
                id: Some(c.id.clone()),
                r#type: Some(FunctionType::Function),
                function: Some(FunctionCallStream { name: Some(c.name.clone()), arguments: Some(String::new()) }),
            };
            let arguments = ChatCompletionMessageToolCallChunk {
                index: i as u32,
                function: Some(FunctionCallStream { name: None, arguments: Some(c.arguments.clone()) }),
                ..Default::default()
            };
            [named, arguments]
        })
        .collect()
}

fn usage(d: &Done) -> CompletionUsage {
    CompletionUsage {
        prompt_tokens: d.prompt_tokens,
        completion_tokens: d.generated_tokens,
        total_tokens: d.prompt_tokens + d.generated_tokens,
        prompt_tokens_details: Some(PromptTokensDetails { cached_tokens: Some(d.cached_tokens), ..Default::default() }),
        completion_tokens_details: None,
    }
}

fn sse(v: &impl serde::Serialize) -> Vec<u8> {
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, v).unwrap_or_default();
    out.extend_from_slice(b"\n\n");
    out
}

pub(crate) async fn chat<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    chat_response(app, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn chat_response<R: Runner>(app: AppState<R>, body: Body) -> Result<Response, ApiError> {
    let req: CreateChatCompletionRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
    let params = chat_params(&req)?;
    let n = choices(req.n)?;
    let entry = resolve(&app, &req.model, FLAVOR).await?;
    let mut generations = start_choices(&app, &entry, params, n)?;
    let (id, created, model) = (new_id("chatcmpl"), unix_now(), req.model.clone());
    if req.stream != Some(true) {
        let mut choices = Vec::with_capacity(n);
        let mut dones = Vec::with_capacity(n);
        for (i, generation) in generations.into_iter().enumerate() {
            let done = generation.finish().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
            #[allow(deprecated)] // function_call: deprecated, left out
            let message = ChatCompletionResponseMessage {
                // OpenAI's: no content beside calls when the model wrote none.
                content: (done.tool_calls.is_empty() || !done.text.is_empty()).then(|| done.text.clone()),
                tool_calls: tool_calls(&done),
                role: Role::Assistant,
                ..Default::default()
            };
            let (finish, logprobs) = (Some(finish_reason(&done)), chat_logprobs(&done));
            choices.push(ChatChoice { index: i as u32, message, finish_reason: finish, logprobs });
            dones.push(done);
        }
        return Ok(json_response(&CreateChatCompletionResponse {
            id,
            object: "chat.completion".into(),
            created,
            model,
            choices,
            usage: Some(usage_of(&dones)),
            ..Default::default()
        }));
    }
    let include_usage = req.stream_options.as_ref().and_then(|o| o.include_usage) == Some(true);
    let started = firsts(&mut generations).await?;
    let chunk = move |index: usize,
                      delta: ChatCompletionStreamResponseDelta,
                      finish: Option<FinishReason>,
                      usage: Option<CompletionUsage>,
                      logprobs: Option<ChatChoiceLogprobs>| {
        let choices = match usage {
            Some(_) => Vec::new(),
            None => vec![ChatChoiceStream { index: index as u32, delta, finish_reason: finish, logprobs }],
        };
        sse(&CreateChatCompletionStreamResponse {
            id: id.clone(),
            object: "chat.completion.chunk".into(),
            created,
            model: model.clone(),
            choices,
            usage,
            ..Default::default()
        })
    };
    let mut ends = Ends::new(n);
    let encode = move |p: Option<(usize, Piece)>| {
        let Some((i, p)) = p else {
            return ends.last(|u| if include_usage { chunk(0, Default::default(), None, Some(u), None) } else { Vec::new() });
        };
        if matches!(p, Piece::Wait) {
            return crate::generation::SSE_WAIT.to_vec();
        }
        let mut out = Vec::new();
        if ends.first(i) {
            let role =
                ChatCompletionStreamResponseDelta { role: Some(Role::Assistant), content: Some(String::new()), ..Default::default() };
            out = chunk(i, role, None, None, None);
        }
        match p {
            Piece::Text(t) => {
                out.extend(chunk(i, ChatCompletionStreamResponseDelta { content: Some(t), ..Default::default() }, None, None, None))
            }
            Piece::Wait => {}
            Piece::End(r) => out.extend(ends.end(r, |d| {
                let mut last = Vec::new();
                for call in tool_call_chunks(d) {
                    let delta = ChatCompletionStreamResponseDelta { tool_calls: Some(vec![call]), ..Default::default() };
                    last.extend(chunk(i, delta, None, None, None));
                }
                // The answer's log-probabilities come whole with its last chunk.
                last.extend(chunk(i, Default::default(), Some(finish_reason(d)), None, chat_logprobs(d)));
                last
            })),
        }
        out
    };
    Ok(sse_body(Generation::bodies(started, encode)))
}

/// The most choices one request may ask for (`n`): streams of one batch.
const MAX_CHOICES: u8 = 8;

/// How many choices a request asks for.
fn choices(n: Option<u8>) -> Result<usize, ApiError> {
    match n.unwrap_or(1) {
        0 => Err(ApiError::invalid(FLAVOR, "n", "n is 0; it must be at least 1")),
        n if n > MAX_CHOICES => Err(ApiError::invalid(FLAVOR, "n", format!("n is {n}; revis answers with at most {MAX_CHOICES} choices"))),
        n => Ok(usize::from(n)),
    }
}

/// Starts `n` answers of `params`, each with a place of its own (a 429 when
/// there are not that many); a seed given is the first choice's, the next
/// ones take the seeds after it.
fn start_choices<R: Runner>(
    app: &AppState<R>,
    entry: &crate::models::Entry,
    params: GenerateParams,
    n: usize,
) -> Result<Vec<Generation>, ApiError> {
    let places = (0..n).map(|_| app.generation_place(FLAVOR)).collect::<Result<Vec<_>, _>>()?;
    places
        .into_iter()
        .enumerate()
        .map(|(i, place)| {
            let mut p = params.clone();
            p.sampling.seed = p.sampling.seed.map(|s| s.wrapping_add(i as u64));
            app.start(FLAVOR, entry, p, place)
        })
        .collect()
}

/// Each answer's first piece: a failure before any text is the response's status.
async fn firsts(generations: &mut Vec<Generation>) -> Result<Vec<(Piece, Generation)>, ApiError> {
    let mut started = Vec::with_capacity(generations.len());
    for mut g in generations.drain(..) {
        let first = g.first_or_wait().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
        started.push((first, g));
    }
    Ok(started)
}

/// The usage of several answers to one prompt: the prompt once, every answer's tokens.
fn usage_of(dones: &[Done]) -> CompletionUsage {
    let mut u = usage(&dones[0]);
    u.completion_tokens = dones.iter().map(|d| d.generated_tokens).sum();
    u.total_tokens = u.prompt_tokens + u.completion_tokens;
    u
}

/// A stream of several answers: which have started and ended, what they
/// used, and whether one failed (then nothing follows its error event, and
/// no `[DONE]`).
struct Ends {
    started: Vec<bool>,
    dones: Vec<Done>,
    failed: bool,
}

impl Ends {
    fn new(n: usize) -> Ends {
        Ends { started: vec![false; n], dones: Vec::with_capacity(n), failed: false }
    }

    /// Whether this is answer `i`'s first piece.
    fn first(&mut self, i: usize) -> bool {
        !std::mem::replace(&mut self.started[i], true)
    }

    /// An answer's end: its last chunks (`last`), or the error event.
    fn end(&mut self, r: Result<Done, revis_client::CallError>, last: impl FnOnce(&Done) -> Vec<u8>) -> Vec<u8> {
        if self.failed {
            return Vec::new();
        }
        match r {
            Ok(done) => {
                let out = last(&done);
                self.dones.push(done);
                out
            }
            Err(e) => {
                self.failed = true;
                sse(&ApiError::from_call(FLAVOR, &e).body())
            }
        }
    }

    /// After every answer ended: the usage chunk (`usage`, given the
    /// answers' usage) and `[DONE]`, unless one failed.
    fn last(&mut self, usage_chunk: impl FnOnce(CompletionUsage) -> Vec<u8>) -> Vec<u8> {
        if self.failed || self.dones.is_empty() {
            return Vec::new();
        }
        let mut out = usage_chunk(usage_of(&self.dones));
        out.extend_from_slice(b"data: [DONE]\n\n");
        out
    }
}

pub(crate) async fn completions<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    completion_response(app, body).await.unwrap_or_else(IntoResponse::into_response)
}

fn completion_finish(d: &Done) -> CompletionFinishReason {
    match d.finish_reason {
        revis_client::FinishReason::Length => CompletionFinishReason::Length,
        revis_client::FinishReason::End | revis_client::FinishReason::Stop | revis_client::FinishReason::ToolCalls => {
            CompletionFinishReason::Stop
        }
    }
}

async fn completion_response<R: Runner>(app: AppState<R>, body: Body) -> Result<Response, ApiError> {
    let req: CreateCompletionRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
    let params = completion_params(&req)?;
    let n = choices(req.n)?;
    let entry = resolve(&app, &req.model, FLAVOR).await?;
    let mut generations = start_choices(&app, &entry, params, n)?;
    let (id, created, model) = (new_id("cmpl"), unix_now(), req.model.clone());
    let response = move |choices: Vec<Choice>, usage: Option<CompletionUsage>| CreateCompletionResponse {
        id: id.clone(),
        object: "text_completion".into(),
        created,
        model: model.clone(),
        choices,
        usage,
        ..Default::default()
    };
    let choice = |index: usize, text: String, d: Option<&Done>| Choice {
        text,
        index: index as u32,
        logprobs: d.and_then(completion_logprobs),
        finish_reason: d.map(completion_finish),
    };
    if req.stream != Some(true) {
        let mut choices = Vec::with_capacity(n);
        let mut dones = Vec::with_capacity(n);
        for (i, generation) in generations.into_iter().enumerate() {
            let done = generation.finish().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
            choices.push(choice(i, done.text.clone(), Some(&done)));
            dones.push(done);
        }
        return Ok(json_response(&response(choices, Some(usage_of(&dones)))));
    }
    let include_usage = req.stream_options.as_ref().and_then(|o| o.include_usage) == Some(true);
    let started = firsts(&mut generations).await?;
    let mut ends = Ends::new(n);
    let encode = move |p: Option<(usize, Piece)>| match p {
        None => ends.last(|u| if include_usage { sse(&response(Vec::new(), Some(u))) } else { Vec::new() }),
        Some((_, Piece::Wait)) => crate::generation::SSE_WAIT.to_vec(),
        Some((i, Piece::Text(t))) => sse(&response(vec![choice(i, t, None)], None)),
        Some((i, Piece::End(r))) => ends.end(r, |d| sse(&response(vec![choice(i, String::new(), Some(d))], None))),
    };
    Ok(sse_body(Generation::bodies(started, encode)))
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
