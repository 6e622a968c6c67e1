//! Ollama's API (`/api`): tags, ps, version, show, chat, generate, embed
//! (and the older embeddings), pull and delete.
//!
//! Ollama publishes no Rust types for its server side, so its requests and
//! replies are serde structs (`convert.rs`) and JSON written by hand, from
//! Ollama's API document.
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
//! the answer's calls come in the last line's `message.tool_calls`
//! (arguments that are not JSON as the string the model wrote: edge.rs).

mod answer;
mod convert;
mod models;
mod pull;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use revis_client::Runner;
use serde_json::Value;

use crate::app::AppState;
use crate::error::{ApiError, Flavor};
use crate::models::Catalog;

pub(crate) use answer::{chat, generate};
pub(crate) use models::{embed, embeddings, ps, show, tags, version};
pub(crate) use pull::{MAX_PULLS, delete, pull};
#[cfg(test)]
pub(crate) use {
    answer::tool_calls,
    convert::{ChatRequest, chat_params},
};

const FLAVOR: Flavor = Flavor::Ollama;

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
