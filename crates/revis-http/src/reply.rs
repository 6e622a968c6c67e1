//! What the APIs' replies share: server-sent events responses, random IDs
//! and the Unix time.

use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::generation;

/// An SSE response: `first`, then the rest of the generation, each piece
/// written by `encode`.
pub(crate) fn sse_response(
    first: generation::Piece,
    generation: generation::Generation,
    encode: impl FnMut(generation::Piece) -> Vec<u8> + Send + 'static,
) -> Response {
    sse_body(generation.body(first, encode))
}

/// A response of server-sent events with `body`.
pub(crate) fn sse_body(body: axum::body::Body) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        body,
    )
        .into_response()
}

/// Unix seconds now (the `created` of OpenAI's objects).
pub(crate) fn unix_now() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as u32)
}

/// A random ID with `prefix` (`chatcmpl-...`).
pub(crate) fn new_id(prefix: &str) -> String {
    let n: u128 = rand::random();
    format!("{prefix}-{:024x}", n >> 32)
}
