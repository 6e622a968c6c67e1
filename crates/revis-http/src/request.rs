//! Reading a request's JSON body, bounded, with errors in the API's shape.

use axum::body::Body;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use tokio_stream::StreamExt;

use crate::error::{ApiError, Flavor};

/// The body of `req` as `T`: at most `limit` bytes (413 naming the limit),
/// JSON that fits `T` (400 saying where it does not).
pub(crate) async fn json<T: DeserializeOwned>(flavor: Flavor, body: Body, limit: usize) -> Result<T, ApiError> {
    let too_large = || {
        ApiError::new(
            flavor,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than revis serve's limit of {limit} bytes (max_body_bytes)"),
        )
    };
    let mut buf = Vec::new();
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::new(flavor, StatusCode::BAD_REQUEST, format!("the request body could not be read: {e}")))?;
        if buf.len() + chunk.len() > limit {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&buf)
        .map_err(|e| ApiError::new(flavor, StatusCode::BAD_REQUEST, format!("the request body is not a valid request: {e}")))
}
