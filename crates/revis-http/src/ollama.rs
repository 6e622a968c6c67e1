//! Ollama's API (`/api`): tags, ps, version, show, chat, generate, embed
//! (and the older embeddings), pull and delete.
//!
//! Ollama publishes no Rust types for its server side, so its requests and
//! replies are the serde structs below, written from Ollama's API document.
//!
//! `options` carries `temperature`, `top_p`, `top_k`, `min_p`, `seed`,
//! `num_predict` (-1 and -2: the daemon's default length), `stop`,
//! `repeat_penalty`, `repeat_last_n`, `presence_penalty` and
//! `frequency_penalty`; other options (`num_ctx`,
//! `num_thread`, ...) are the daemon's configuration and are ignored, as
//! Ollama ignores options it does not know. `format` is `"json"` or a JSON
//! Schema. Streaming is the default: one JSON object per line, the last
//! with `done: true`, `done_reason`, the token counts and the durations in
//! nanoseconds (`load_duration` is 0: a model is loaded by the daemon on
//! first use, inside `prompt_eval_duration`'s wait). A failure after text
//! was sent is a last line `{"error": "..."}`.
//!
//! `logprobs` and `top_logprobs` (at most 20) are answered in the last
//! line's `logprobs`. `/api/chat` takes `tools` (functions, OpenAI's form), assistant messages'
//! `tool_calls` (arguments as an object) and `tool` messages (`tool_name`);
//! the answer's calls come in the last line's `message.tool_calls`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use revis_client::{Done, Format, GenerateParams, Message, Role, Runner, Sampling, Tool};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_stream::StreamExt;

use crate::app::AppState;
use crate::error::{ApiError, Flavor};
use crate::generation::Piece;
use crate::models::{Catalog, Entry};
use crate::request;

const FLAVOR: Flavor = Flavor::Ollama;

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
    function: OllamaFunctionCall,
}

#[derive(Debug, Deserialize, Serialize)]
pub(crate) struct OllamaFunctionCall {
    name: String,
    /// An object (Ollama's form); a JSON string is taken too.
    #[serde(default)]
    arguments: Value,
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
    model: String,
    #[serde(default)]
    messages: Vec<ChatMessage>,
    stream: Option<bool>,
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
    model: String,
    #[serde(default)]
    prompt: String,
    system: Option<String>,
    suffix: Option<String>,
    template: Option<String>,
    raw: Option<bool>,
    context: Option<Vec<i64>>,
    images: Option<Vec<Value>>,
    stream: Option<bool>,
    format: Option<Value>,
    options: Option<Options>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ShowRequest {
    model: Option<String>,
    name: Option<String>,
}

#[derive(Serialize)]
struct Details {
    parent_model: &'static str,
    format: &'static str,
    family: String,
    families: Option<Vec<String>>,
    parameter_size: String,
    quantization_level: String,
}

fn details(e: &Entry) -> Details {
    Details {
        parent_model: "",
        format: "gguf",
        family: String::new(),
        families: None,
        parameter_size: String::new(),
        quantization_level: String::new(),
    }
    .with_model(&e.model)
}

impl Details {
    /// What a catalog name says of the model (`smollm2-135m-instruct`: 135M).
    fn with_model(mut self, model: &str) -> Details {
        if let Some(size) = model
            .split('-')
            .find(|p| p.len() > 1 && p.ends_with(['m', 'b', 'M', 'B']) && p[..p.len() - 1].chars().all(|c| c.is_ascii_digit() || c == '.'))
        {
            self.parameter_size = size.to_uppercase();
        }
        self.family = model.split('-').next().unwrap_or_default().to_owned();
        self
    }
}

fn now() -> String {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

fn ndjson_line(v: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out
}

fn json_response(v: &Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json; charset=utf-8")], v.to_string()).into_response()
}

async fn catalog<R: Runner>(app: &AppState<R>) -> Result<std::sync::Arc<Catalog>, ApiError> {
    app.catalog.get(&app.runner).await.map_err(|e| ApiError::from_call(FLAVOR, &e))
}

/// For the listings: read now.
async fn fresh<R: Runner>(app: &AppState<R>) -> Result<std::sync::Arc<Catalog>, ApiError> {
    app.catalog.fresh(&app.runner).await.map_err(|e| ApiError::from_call(FLAVOR, &e))
}

fn not_found(model: &str) -> ApiError {
    ApiError::new(FLAVOR, StatusCode::NOT_FOUND, format!("model {model:?} not found; GET /api/tags lists the models"))
}

fn tag(e: &Entry) -> Value {
    json!({
        "name": e.name, "model": e.name, "modified_at": now(), "size": e.size, "digest": e.digest, "details": details(e),
    })
}

pub(crate) async fn tags<R: Runner>(State(app): State<AppState<R>>) -> Response {
    match fresh(&app).await {
        Ok(c) => json_response(&json!({"models": c.entries.iter().map(tag).collect::<Vec<_>>()})),
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn ps<R: Runner>(State(app): State<AppState<R>>) -> Response {
    match fresh(&app).await {
        Ok(c) => {
            let loaded = c.entries.iter().filter(|e| e.state == revis_client::ModelState::Ready).map(|e| {
                let mut v = tag(e);
                v["size"] = e.memory_bytes.into();
                v["size_vram"] = 0.into();
                v["context_length"] = e.context_tokens.into();
                v
            });
            json_response(&json!({"models": loaded.collect::<Vec<_>>()}))
        }
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn version() -> Response {
    json_response(&json!({"version": env!("CARGO_PKG_VERSION")}))
}

pub(crate) async fn show<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    let r = async {
        let req: ShowRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
        let Some(model) = req.model.or(req.name) else { return Err(ApiError::invalid(FLAVOR, "model", "model is missing")) };
        let c = catalog(&app).await?;
        let e = c.find(&model).ok_or_else(|| not_found(&model))?;
        Ok(json_response(&json!({
            "modelfile": format!("# revis: {} runs {}\n", e.tier, e.model),
            "parameters": "",
            "template": "",
            "details": details(e),
            // Ollama's clients read `<general.architecture>.context_length`.
            "model_info": {
                "general.architecture": "revis", "revis.tier": e.tier.as_str(), "revis.model": e.model,
                "revis.context_length": e.context_tokens,
            },
            // Every model calls functions: its template's way, or revis's generic one.
            "capabilities": ["completion", "tools", "embedding"],
            "modified_at": now(),
        })))
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

#[derive(Deserialize)]
struct EmbedRequest {
    model: String,
    /// A string or strings.
    input: Value,
}

/// The older form: one `prompt`, one `embedding`.
#[derive(Deserialize)]
struct EmbeddingsRequest {
    model: String,
    prompt: String,
}

/// Embeds `inputs` with the model `model` names; the figures Ollama reports.
async fn embed_texts<R: Runner>(app: &AppState<R>, model: &str, inputs: Vec<String>) -> Result<(revis_client::Embedded, u64), ApiError> {
    let c = catalog(app).await?;
    let entry = c.find(model).ok_or_else(|| not_found(model))?.clone();
    let _place = app.generation_place(FLAVOR)?;
    let t0 = std::time::Instant::now();
    let out = app.embed(FLAVOR, &entry, inputs).await?;
    Ok((out, t0.elapsed().as_nanos() as u64))
}

pub(crate) async fn embed<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    let r = async {
        let req: EmbedRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
        let inputs = match req.input {
            Value::String(s) => vec![s],
            Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    _ => Err(ApiError::invalid(FLAVOR, "input", "input must be a string or an array of strings")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(ApiError::invalid(FLAVOR, "input", "input must be a string or an array of strings")),
        };
        let (out, ns) = embed_texts(&app, &req.model, inputs).await?;
        let tokens: u32 = out.embeddings.iter().map(|e| e.tokens).sum();
        let embeddings: Vec<&Vec<f32>> = out.embeddings.iter().map(|e| &e.values).collect();
        Ok(json_response(&json!({
            "model": req.model, "embeddings": embeddings, "total_duration": ns, "load_duration": 0, "prompt_eval_count": tokens,
        })))
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

pub(crate) async fn embeddings<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    let r = async {
        let req: EmbeddingsRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
        let (out, _) = embed_texts(&app, &req.model, vec![req.prompt]).await?;
        let values = out.embeddings.into_iter().next().map(|e| e.values).unwrap_or_default();
        Ok::<_, ApiError>(json_response(&json!({ "embedding": values })))
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
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
    let seed = o
        .seed
        .map(|s| {
            u64::try_from(s).map_err(|_| ApiError::invalid(FLAVOR, "options.seed", format!("options.seed is {s}; it must be 0 or more")))
        })
        .transpose()?;
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
        presence_penalty: o.presence_penalty,
        frequency_penalty: o.frequency_penalty,
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
                    arguments: match &c.function.arguments {
                        Value::String(s) => s.clone(),
                        Value::Null => "{}".to_owned(),
                        v => v.to_string(),
                    },
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
        logprobs: logprobs(req.logprobs, req.top_logprobs)?,
        ..Default::default()
    })
}

/// The calls an answer made, as Ollama writes them (arguments as an object).
fn tool_calls(d: &Done) -> Vec<OllamaToolCall> {
    d.tool_calls
        .iter()
        .map(|c| OllamaToolCall {
            function: OllamaFunctionCall {
                name: c.name.clone(),
                arguments: serde_json::from_str(&c.arguments).unwrap_or_else(|_| Value::String(c.arguments.clone())),
            },
        })
        .collect()
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
    let logprobs = logprobs(req.logprobs, req.top_logprobs)?;
    Ok(GenerateParams { messages, sampling, max_tokens, stop, format: format(&req.format)?, logprobs, ..Default::default() })
}

/// Ollama's `logprobs` and `top_logprobs` (at most 20) as revis's.
fn logprobs(on: Option<bool>, top: Option<u32>) -> Result<Option<u32>, ApiError> {
    match (on, top) {
        (_, Some(n)) if n > 20 => Err(ApiError::invalid(FLAVOR, "top_logprobs", format!("top_logprobs is {n}; it must be at most 20"))),
        (Some(true), n) => Ok(Some(n.unwrap_or(0))),
        (_, Some(n)) if n > 0 => Err(ApiError::invalid(FLAVOR, "top_logprobs", "top_logprobs needs logprobs: true")),
        _ => Ok(None),
    }
}

/// An answer's log-probabilities as Ollama writes them (the token that ends
/// the turn, which has no text, left out).
fn logprobs_json(d: &Done) -> Value {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    d.logprobs
        .iter()
        .filter(|t| !t.piece.is_empty())
        .map(|t| {
            let top: Vec<Value> = t.top.iter().map(|a| json!({"token": lossy(&a.piece), "logprob": a.logprob, "bytes": a.piece})).collect();
            json!({"token": lossy(&t.piece), "logprob": t.logprob, "bytes": t.piece, "top_logprobs": top})
        })
        .collect()
}

/// The counts and durations of a finished answer, and its calls.
fn finished(v: &mut Value, d: &Done, total_ns: u64) {
    if !d.tool_calls.is_empty()
        && let Some(message) = v.get_mut("message").and_then(Value::as_object_mut)
    {
        message.insert("tool_calls".into(), json!(tool_calls(d)));
    }
    if !d.logprobs.is_empty()
        && let Some(o) = v.as_object_mut()
    {
        o.insert("logprobs".into(), logprobs_json(d));
    }
    let extra = json!({
        "done": true,
        "done_reason": if d.finish_reason == revis_client::FinishReason::Length { "length" } else { "stop" },
        "total_duration": total_ns,
        "load_duration": 0,
        "prompt_eval_count": d.prompt_tokens,
        "prompt_eval_duration": d.prompt_us * 1000,
        "eval_count": d.generated_tokens,
        "eval_duration": d.generate_us * 1000,
    });
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
}

/// How a line of each endpoint holds text.
#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Generate,
}

impl Kind {
    fn line(self, model: &str, text: &str) -> Value {
        match self {
            Kind::Chat => json!({"model": model, "created_at": now(), "message": {"role": "assistant", "content": text}, "done": false}),
            Kind::Generate => json!({"model": model, "created_at": now(), "response": text, "done": false}),
        }
    }
}

async fn answer<R: Runner>(
    app: AppState<R>,
    model: String,
    params: GenerateParams,
    stream: bool,
    kind: Kind,
) -> Result<Response, ApiError> {
    let catalog = catalog(&app).await?;
    let entry = catalog.find(&model).ok_or_else(|| not_found(&model))?.clone();
    let place = app.generation_place(FLAVOR)?;
    let mut generation = app.start(FLAVOR, &entry, params, place)?;
    let started = generation.started;
    if !stream {
        let done = generation.finish().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
        let mut v = kind.line(&model, &done.text);
        finished(&mut v, &done, started.elapsed().as_nanos() as u64);
        return Ok(json_response(&v));
    }
    let first = generation.first_or_wait().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
    let encode = move |p: Piece| match p {
        // NDJSON has no comment: the headers are what says "still there".
        Piece::Wait => Vec::new(),
        Piece::Text(t) => ndjson_line(&kind.line(&model, &t)),
        Piece::End(Ok(d)) => {
            let mut v = kind.line(&model, "");
            finished(&mut v, &d, started.elapsed().as_nanos() as u64);
            ndjson_line(&v)
        }
        Piece::End(Err(e)) => ndjson_line(&ApiError::from_call(FLAVOR, &e).body()),
    };
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], generation.body(first, encode)).into_response())
}

pub(crate) async fn chat<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    let r = async {
        let req: ChatRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
        let params = chat_params(&req)?;
        answer(app.clone(), req.model, params, req.stream != Some(false), Kind::Chat).await
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

pub(crate) async fn generate<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    let r = async {
        let req: GenerateRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
        if req.prompt.is_empty() && req.system.as_deref().unwrap_or_default().is_empty() {
            // Ollama's "load the model": revis's daemon loads a tier's model on first use.
            let c = catalog(&app).await?;
            c.find(&req.model).ok_or_else(|| not_found(&req.model))?;
            return Ok(json_response(
                &json!({"model": req.model, "created_at": now(), "response": "", "done": true, "done_reason": "load"}),
            ));
        }
        let params = generate_params(&req)?;
        answer(app.clone(), req.model, params, req.stream != Some(false), Kind::Generate).await
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

#[derive(Debug, Deserialize)]
pub(crate) struct PullRequest {
    model: Option<String>,
    name: Option<String>,
    stream: Option<bool>,
}

/// The model a pull or delete names: a catalog name or an `hf:` reference
/// (`:latest` accepted and ignored); a 404 listing the catalog otherwise.
fn model_ref(model: Option<&String>, name: Option<&String>) -> Result<revis_models::ModelRef, ApiError> {
    let given = model.or(name).ok_or_else(|| ApiError::invalid(FLAVOR, "model", "model names the model"))?;
    let bare = given.strip_suffix(":latest").unwrap_or(given);
    revis_models::ModelRef::parse_known(bare).map_err(|e| ApiError::new(FLAVOR, StatusCode::NOT_FOUND, e.to_string()))
}

/// `POST /api/pull`: downloads a catalog model or an `hf:` reference into
/// this machine's models directory, as `revis pull` does (verified against
/// its SHA-256, resumable), streaming Ollama's progress objects (`status`,
/// and `digest`, `total`, `completed` while a file downloads), ending with
/// `{"status": "success"}` or `{"error": ...}`. A tier uses it once
/// revisd.toml names it. At most [`MAX_PULLS`] at once. Refused unless
/// `revis serve --allow-pull`: pulls and deletes write to the owner's
/// disk. A file past `--max-pull-bytes` is refused before any byte
/// (413 when not streamed), one that does not fit on the disk with
/// [`PULL_KEEP_FREE`] left is refused or stopped (507); a caller that goes
/// away cancels its pull; a pull that fails or is cancelled leaves nothing
/// behind (no partial file to resume: that is `revis pull`'s); the
/// owner's Hugging Face token is never sent.
fn pulls_allowed<R: Runner>(app: &AppState<R>, what: &str) -> Result<(), ApiError> {
    if app.opts.allow_pull {
        return Ok(());
    }
    Err(ApiError::new(
        FLAVOR,
        StatusCode::FORBIDDEN,
        format!(
            "{what} models over HTTP is off: start `revis serve --allow-pull` to let callers do it, or use `revis pull` on this machine"
        ),
    ))
}

pub(crate) async fn pull<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    let r = async {
        pulls_allowed(&app, "pulling")?;
        let req: PullRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
        let reference = model_ref(req.model.as_ref(), req.name.as_ref())?;
        let dir = revis_models::models_dir().map_err(|e| ApiError::new(FLAVOR, StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let place = app.pulls.clone().try_acquire_owned().map_err(|_| {
            ApiError::too_many(
                FLAVOR,
                format!("revis serve runs at most {MAX_PULLS} pulls at once; retry when one ends"),
                std::time::Duration::from_secs(5),
            )
        })?;
        // Each line, and for a failure the status it would have as a whole response.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Value, StatusCode)>();
        let cancel = revis_models::Cancel::new();
        // The caller gone (its response dropped): the pull stops.
        let gone = CancelOnDrop(cancel.clone());
        let max_bytes = app.opts.max_pull_bytes;
        tokio::task::spawn_blocking(move || {
            let _place = place;
            let ok = StatusCode::OK;
            let say = {
                let (tx, cancel) = (tx.clone(), cancel.clone());
                move |v: Value, status: StatusCode| {
                    if tx.send((v, status)).is_err() {
                        cancel.cancel();
                    }
                }
            };
            say(json!({"status": "pulling manifest"}), ok);
            let report = say.clone();
            let reporter = revis_models::Reporter::new(move |label, completed, total| {
                report(json!({"status": format!("pulling {label}"), "digest": label, "total": total, "completed": completed}), ok);
            });
            let opts = revis_models::PullOptions {
                progress: revis_models::Progress::Report(reporter),
                cancel: Some(cancel),
                max_bytes: Some(max_bytes),
                keep_free: PULL_KEEP_FREE,
                by_http: true,
                hf_token: None,
                ..Default::default()
            };
            match reference.pull(&dir, &opts) {
                Ok(_) => {
                    for status in ["verifying sha256 digest", "writing manifest", "success"] {
                        say(json!({"status": status}), ok);
                    }
                }
                Err(e) => {
                    let removed: Vec<_> = reference.leftovers(&dir).into_iter().filter(|p| std::fs::remove_file(p).is_ok()).collect();
                    tracing::info!(model = %reference, removed = removed.len(), "an HTTP pull ended: {e}");
                    let status = match &e {
                        revis_models::Error::OverPullLimit { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                        revis_models::Error::NoSpace { .. } => StatusCode::INSUFFICIENT_STORAGE,
                        _ => StatusCode::INTERNAL_SERVER_ERROR,
                    };
                    say(json!({"error": e.to_string()}), status);
                }
            }
        });
        if req.stream == Some(false) {
            let mut last = (json!({"error": "the pull ended without a word"}), StatusCode::INTERNAL_SERVER_ERROR);
            while let Some(v) = rx.recv().await {
                last = v;
            }
            drop(gone);
            return match last.0.get("error").and_then(Value::as_str) {
                Some(e) => Err(ApiError::new(FLAVOR, last.1, e)),
                None => Ok(json_response(&last.0)),
            };
        }
        let lines = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(move |(v, _)| {
            let _held = &gone;
            Ok::<_, std::convert::Infallible>(ndjson_line(&v))
        });
        Ok::<_, ApiError>(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines)).into_response())
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

/// Pulls that may run at once.
pub const MAX_PULLS: usize = 2;
/// What a pull over HTTP leaves free on the models' disk.
pub const PULL_KEEP_FREE: u64 = 1 << 30;

/// Cancels a pull when the caller's request or response is dropped.
struct CancelOnDrop(revis_models::Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// `DELETE /api/delete`: removes a downloaded model's file, and what an
/// unfinished pull of it left (partial downloads, wheels). A model a tier
/// of this machine runs is refused (409, naming the tier): revisd.toml
/// names it, and the tier could not load it again.
pub(crate) async fn delete<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    let r = async {
        pulls_allowed(&app, "deleting")?;
        let req: PullRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
        let reference = model_ref(req.model.as_ref(), req.name.as_ref())?;
        let dir = revis_models::models_dir().map_err(|e| ApiError::new(FLAVOR, StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let leftovers = reference.leftovers(&dir);
        let Some(path) = reference.local_path(&dir) else {
            if leftovers.is_empty() {
                return Err(ApiError::new(FLAVOR, StatusCode::NOT_FOUND, format!("model {reference} is not downloaded here")));
            }
            for p in &leftovers {
                std::fs::remove_file(p)
                    .map_err(|e| ApiError::new(FLAVOR, StatusCode::INTERNAL_SERVER_ERROR, format!("{}: {e}", p.display())))?;
            }
            return Ok(StatusCode::OK.into_response());
        };
        let name = crate::models::model_name(&path.to_string_lossy());
        let c = catalog(&app).await?;
        if let Some(e) = c.entries.iter().find(|e| e.node.is_none() && e.model == name && e.name == e.tier.to_string()) {
            return Err(ApiError::new(
                FLAVOR,
                StatusCode::CONFLICT,
                format!("{} runs model {reference}: give it another model in revisd.toml before deleting this one", e.tier),
            ));
        }
        for p in std::iter::once(&path).chain(&leftovers) {
            std::fs::remove_file(p)
                .map_err(|e| ApiError::new(FLAVOR, StatusCode::INTERNAL_SERVER_ERROR, format!("{}: {e}", p.display())))?;
        }
        Ok::<_, ApiError>(StatusCode::OK.into_response())
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(bad(json!({"model": "m", "messages": msgs, "format": "yaml"})).param.as_deref(), Some("format"));
        assert_eq!(bad(json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]})).param.as_deref(), Some("role"));
        assert_eq!(
            bad(json!({"model": "m", "messages": msgs, "tools": [{"type": "code", "function": {"name": "f"}}]})).param.as_deref(),
            Some("tools")
        );
    }

    #[test]
    fn tools_and_calls_carry_over_and_calls_come_back_as_objects() {
        let req: ChatRequest = serde_json::from_value(json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "18 C", "tool_name": "get_weather"}
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        }))
        .unwrap();
        let p = chat_params(&req).unwrap();
        assert_eq!((p.tools.len(), p.tools[0].parameters.as_str()), (1, r#"{"type":"object"}"#));
        assert_eq!(
            (p.messages[1].tool_calls[0].name.as_str(), p.messages[1].tool_calls[0].arguments.as_str()),
            ("get_weather", r#"{"city":"Paris"}"#)
        );
        assert_eq!((p.messages[2].role, p.messages[2].name.as_str()), (Role::Tool, "get_weather"));
        let d = Done {
            finish_reason: revis_client::FinishReason::ToolCalls,
            tool_calls: vec![revis_client::ToolCall { id: "x".into(), name: "get_weather".into(), arguments: r#"{"city":"Oslo"}"#.into() }],
            ..Default::default()
        };
        let mut v = Kind::Chat.line("tier2", "");
        finished(&mut v, &d, 1);
        assert_eq!(v["message"]["tool_calls"], json!([{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]));
        assert_eq!(v["done_reason"], json!("stop"));
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

    #[test]
    fn the_last_line_has_counts_and_nanoseconds() {
        let d = Done { prompt_tokens: 10, generated_tokens: 4, prompt_us: 1500, generate_us: 2000, ..Default::default() };
        let mut v = Kind::Generate.line("tier2", "");
        finished(&mut v, &d, 9_000_000);
        assert_eq!(
            (
                &v["done"],
                &v["done_reason"],
                &v["prompt_eval_count"],
                &v["eval_count"],
                &v["prompt_eval_duration"],
                &v["eval_duration"],
                &v["total_duration"]
            ),
            (&json!(true), &json!("stop"), &json!(10), &json!(4), &json!(1_500_000), &json!(2_000_000), &json!(9_000_000))
        );
    }

    #[test]
    fn a_catalog_name_gives_its_parameter_size() {
        let d = Details {
            parent_model: "",
            format: "gguf",
            family: String::new(),
            families: None,
            parameter_size: String::new(),
            quantization_level: String::new(),
        }
        .with_model("smollm2-135m-instruct");
        assert_eq!((d.parameter_size.as_str(), d.family.as_str()), ("135M", "smollm2"));
    }
}
