//! Downloading and removing models over HTTP (`/api/pull`, `/api/delete`),
//! when `revis serve --allow-pull` lets callers do it.

use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use revis_client::Runner;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_stream::StreamExt;

use super::{FLAVOR, catalog, json_response, ndjson_line};
use crate::app::AppState;
use crate::error::ApiError;
use crate::request;

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
