//! The model list (`/v1/models`) and embeddings (`/v1/embeddings`) routes.

use async_openai::types::embeddings::{
    Base64Embedding, Base64EmbeddingVector, CreateBase64EmbeddingResponse, CreateEmbeddingRequest, CreateEmbeddingResponse, Embedding,
    EmbeddingInput, EmbeddingUsage, EncodingFormat,
};
use async_openai::types::models::Model;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use revis_client::Runner;

use super::FLAVOR;
use super::write::json_response;
use crate::app::{AppState, resolve};
use crate::error::ApiError;
use crate::request;

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
