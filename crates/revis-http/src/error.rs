//! Errors as each API says them: OpenAI's `{"error": {"message", "type",
//! "param", "code"}}`, Ollama's `{"error": "..."}`, with the HTTP status the
//! failure calls for. A failed call of the runner ([`CallError`]) is mapped
//! here, and only here.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use revis_client::{CallError, Code};
use serde_json::json;

/// What stops the server from starting: an address or a key file it refuses, or a file it cannot read or write.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{0}")]
    Refused(String),
    #[error("{path}: {source}")]
    Io { path: std::path::PathBuf, source: std::io::Error },
}

/// Which API a request speaks (by its path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Ollama,
    Anthropic,
}

impl Flavor {
    pub fn of(path: &str) -> Flavor {
        if path.starts_with("/api/") {
            Flavor::Ollama
        } else if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            Flavor::Anthropic
        } else {
            Flavor::OpenAi
        }
    }
}

/// A failed request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub flavor: Flavor,
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`.
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// OpenAI's machine-readable `code`.
    pub code: Option<&'static str>,
    /// Sent as `Retry-After` (whole seconds, at least 1).
    pub retry_after: Option<Duration>,
}

impl ApiError {
    pub fn new(flavor: Flavor, status: StatusCode, message: impl Into<String>) -> ApiError {
        let kind = match status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        ApiError { flavor, status, message: message.into(), kind, param: None, code: None, retry_after: None }
    }

    /// A request that cannot be served as asked (400), naming the field.
    pub fn invalid(flavor: Flavor, param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_owned()), ..ApiError::new(flavor, StatusCode::BAD_REQUEST, message) }
    }

    pub fn unauthorized(flavor: Flavor, message: impl Into<String>) -> ApiError {
        ApiError { code: Some("invalid_api_key"), ..ApiError::new(flavor, StatusCode::UNAUTHORIZED, message) }
    }

    pub fn too_many(flavor: Flavor, message: impl Into<String>, retry_after: Duration) -> ApiError {
        ApiError {
            code: Some("rate_limit_exceeded"),
            retry_after: Some(retry_after),
            ..ApiError::new(flavor, StatusCode::TOO_MANY_REQUESTS, message)
        }
    }

    pub fn model_not_found(flavor: Flavor, model: &str, known: &[String]) -> ApiError {
        let message = format!("the model {model:?} does not exist here; models: {}", known.join(", "));
        ApiError { param: Some("model".into()), code: Some("model_not_found"), ..ApiError::new(flavor, StatusCode::NOT_FOUND, message) }
    }

    /// A failed call of the runner: the daemon's refusal or a failure to reach it.
    pub fn from_call(flavor: Flavor, e: &CallError) -> ApiError {
        let status = match e.code {
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            // A full queue says when to come back; a request over a limit
            // (a prompt longer than the context) would fail again.
            Code::ResourceExhausted if e.retry_after.is_some() => StatusCode::TOO_MANY_REQUESTS,
            Code::ResourceExhausted => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::PermissionDenied | Code::Unauthenticated => StatusCode::FORBIDDEN,
            Code::Cancelled
            | Code::Unknown
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::Aborted
            | Code::Internal
            | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let mut err = ApiError::new(flavor, status, e.message.clone());
        match status {
            StatusCode::TOO_MANY_REQUESTS => {
                err.code = Some("rate_limit_exceeded");
                err.retry_after = Some(e.retry_after.unwrap_or(Duration::from_secs(1)));
            }
            StatusCode::SERVICE_UNAVAILABLE => err.retry_after = Some(Duration::from_secs(1)),
            _ => {}
        }
        err
    }

    /// The error's JSON body, in its API's shape.
    pub fn body(&self) -> serde_json::Value {
        match self.flavor {
            Flavor::OpenAi => json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}),
            Flavor::Ollama => json!({"error": self.message}),
            Flavor::Anthropic => {
                let kind = match self.status {
                    StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
                    StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
                    s if s.is_server_error() => "api_error",
                    _ => self.kind,
                };
                json!({"type": "error", "error": {"type": kind, "message": self.message}})
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (self.status, [(header::CONTENT_TYPE, "application/json")], self.body().to_string()).into_response();
        if let Some(after) = self.retry_after {
            let secs = after.as_secs_f64().ceil().max(1.0) as u64;
            res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(code: Code, retry: Option<Duration>, status: StatusCode) {
        let e = CallError { retry_after: retry, ..CallError::new(code, "said") };
        assert_eq!(ApiError::from_call(Flavor::OpenAi, &e).status, status, "{code:?}");
    }

    #[test]
    fn call_errors_map_to_statuses() {
        check(Code::InvalidArgument, None, StatusCode::BAD_REQUEST);
        check(Code::ResourceExhausted, Some(Duration::from_millis(200)), StatusCode::TOO_MANY_REQUESTS);
        check(Code::ResourceExhausted, None, StatusCode::BAD_REQUEST);
        check(Code::Unavailable, None, StatusCode::SERVICE_UNAVAILABLE);
        check(Code::Internal, None, StatusCode::INTERNAL_SERVER_ERROR);
        check(Code::DeadlineExceeded, None, StatusCode::GATEWAY_TIMEOUT);
    }

    #[test]
    fn a_full_queue_says_when_to_retry_in_whole_seconds() {
        let e = CallError {
            retry_after: Some(Duration::from_millis(200)),
            ..CallError::new(Code::ResourceExhausted, "queue full (capacity 1)")
        };
        let res = ApiError::from_call(Flavor::OpenAi, &e).into_response();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn each_api_has_its_error_shape() {
        let e = ApiError::invalid(Flavor::OpenAi, "n", "n must be 1");
        assert_eq!(e.body(), json!({"error": {"message": "n must be 1", "type": "invalid_request_error", "param": "n", "code": null}}));
        let e = ApiError { flavor: Flavor::Ollama, ..e };
        assert_eq!(e.body(), json!({"error": "n must be 1"}));
    }
}
