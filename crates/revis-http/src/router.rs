//! The router: which handler answers each route of the four APIs, behind
//! the guard and the request log, and the 404 for any other path.

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use revis_client::Runner;

use crate::app::App;
use crate::error::{ApiError, Flavor};
use crate::options::Options;
use crate::{anthropic, guard, ollama, openai, responses};

/// The routes of both APIs over `runner`.
pub fn router<R: Runner>(runner: R, opts: Options) -> Router {
    let app = Arc::new(App::new(runner, opts, ollama::MAX_PULLS));
    Router::new()
        .route("/v1/models", get(openai::models::<R>))
        .route("/v1/models/{model}", get(openai::model::<R>))
        .route("/v1/chat/completions", post(openai::chat::<R>))
        .route("/v1/completions", post(openai::completions::<R>))
        .route("/v1/embeddings", post(openai::embeddings::<R>))
        .route("/v1/responses", post(responses::create::<R>))
        .route("/v1/messages", post(anthropic::messages_route::<R>))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens::<R>))
        .route("/api/tags", get(ollama::tags::<R>))
        .route("/api/ps", get(ollama::ps::<R>))
        .route("/api/version", get(ollama::version))
        .route("/api/show", post(ollama::show::<R>))
        .route("/api/chat", post(ollama::chat::<R>))
        .route("/api/generate", post(ollama::generate::<R>))
        .route("/api/embed", post(ollama::embed::<R>))
        .route("/api/embeddings", post(ollama::embeddings::<R>))
        .route("/api/pull", post(ollama::pull::<R>))
        .route("/api/delete", axum::routing::delete(ollama::delete::<R>))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard::guard::<R>))
        .layer(axum::middleware::from_fn(log_request))
        .with_state(app)
}

/// One line a request in the log: what was asked, the status and how long
/// the response took to start (a generation adds its own line at its end).
async fn log_request(req: Request, next: Next) -> Response {
    let (method, path, started) = (req.method().clone(), req.uri().path().to_owned(), std::time::Instant::now());
    let agent = req.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned();
    let r = next.run(req).await;
    tracing::info!("{method} {path} {} in {} ms ({agent})", r.status().as_u16(), started.elapsed().as_millis());
    r
}

async fn not_found(req: Request) -> Response {
    let flavor = Flavor::of(req.uri().path());
    ApiError::new(flavor, axum::http::StatusCode::NOT_FOUND, format!("no route {} {}", req.method(), req.uri().path())).into_response()
}
