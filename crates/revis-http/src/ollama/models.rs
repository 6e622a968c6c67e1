//! The routes that say what models there are (`/api/tags`, `/api/ps`,
//! `/api/show`, `/api/version`) and embed with them (`/api/embed`, the
//! older `/api/embeddings`).

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use revis_client::Runner;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{FLAVOR, catalog, fresh, json_response, not_found, now};
use crate::app::AppState;
use crate::error::ApiError;
use crate::models::Entry;
use crate::request;

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

#[cfg(test)]
mod tests {
    use super::*;

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
