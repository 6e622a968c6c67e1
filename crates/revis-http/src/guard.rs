//! The security guard every request passes before anything else is read:
//! the web page it comes from (`Origin`, and the preflight an allowed page
//! sends), the body's type, the `Host` on a loopback address, and the API
//! key; a request that passes marks its connection as keyed.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use revis_client::Runner;

use crate::app::{App, AppState};
use crate::error::{ApiError, Flavor};
use crate::key;
use crate::listen::ConnKeyed;

/// The web page a request comes from, the key and the `Host`, before
/// anything else is read. A browser names the page in `Origin` (and sends
/// any page's request, as a "simple" one with a text or form body, without
/// asking first): only the pages `--allow-origin` names get through, and
/// only JSON bodies, so no page the user happens to open can use the models
/// blindly, with `--no-key` or not.
pub(crate) async fn guard<R: Runner>(State(app): State<AppState<R>>, req: Request, next: Next) -> Response {
    let flavor = Flavor::of(req.uri().path());
    let origin = req.headers().get(header::ORIGIN).cloned();
    if let Some(o) = &origin {
        let named = o.to_str().unwrap_or_default();
        if !app.opts.allowed_origins.iter().any(|a| a == named) {
            return ApiError::new(
                flavor,
                axum::http::StatusCode::FORBIDDEN,
                format!(
                    "requests from web pages are refused: the page {o:?} is not allowed (`revis serve --allow-origin {named}` allows it)"
                ),
            )
            .into_response();
        }
        if req.method() == axum::http::Method::OPTIONS {
            // An allowed page asks first (a preflight, without the key): what it may send.
            let mut r = axum::http::StatusCode::NO_CONTENT.into_response();
            let h = r.headers_mut();
            h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, header::HeaderValue::from_static("GET, POST, DELETE"));
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                header::HeaderValue::from_static("authorization, content-type, x-api-key, anthropic-version"),
            );
            h.insert(header::ACCESS_CONTROL_MAX_AGE, header::HeaderValue::from_static("600"));
            return with_origin(r, o.clone());
        }
    }
    let r = checked(&app, flavor, req, next).await;
    match origin {
        Some(o) => with_origin(r, o),
        None => r,
    }
}

/// A reply an allowed page may read.
fn with_origin(mut r: Response, origin: header::HeaderValue) -> Response {
    r.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    r.headers_mut().append(header::VARY, header::HeaderValue::from_static("Origin"));
    r
}

/// A body's type, when it says one: JSON (`application/json`, `…+json`).
fn is_json(content_type: &header::HeaderValue) -> bool {
    let media = content_type.to_str().unwrap_or_default().split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

/// [`guard`]'s checks of the body's type, the `Host` and the key.
async fn checked<R: Runner>(app: &App<R>, flavor: Flavor, req: Request, next: Next) -> Response {
    if req.method() == axum::http::Method::POST
        && let Some(ct) = req.headers().get(header::CONTENT_TYPE)
        && !is_json(ct)
    {
        return ApiError::new(
            flavor,
            axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("the body must be JSON, sent as `Content-Type: application/json`, not {ct:?} (with curl: -H 'Content-Type: application/json')"),
        )
        .into_response();
    }
    if app.opts.loopback_host_only
        && let Some(host) = req.headers().get(header::HOST)
        && !names_loopback(host.to_str().unwrap_or_default())
    {
        return ApiError::new(
            flavor,
            axum::http::StatusCode::FORBIDDEN,
            format!(
                "the Host header {:?} does not name this machine: revis serve on a loopback address answers only localhost, 127.0.0.1 and [::1]",
                host
            ),
        )
        .into_response();
    }
    if let Some(key) = &app.opts.key {
        // `Authorization: Bearer` on every API; Anthropic's clients send `x-api-key`.
        let bearer = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        let x_api_key = req.headers().get("x-api-key").and_then(|v| v.to_str().ok());
        let given = bearer.or(x_api_key);
        match given {
            None => {
                return ApiError::unauthorized(
                    flavor,
                    "no API key: send `Authorization: Bearer KEY` or `x-api-key: KEY` (`revis serve --show-key` prints it)",
                )
                .into_response();
            }
            Some(g) if !key::same(g.trim(), key) => {
                return ApiError::unauthorized(flavor, "the API key is not this server's (`revis serve --show-key` prints it)")
                    .into_response();
            }
            Some(_) => {}
        }
    }
    // Past every check: its connection no longer counts as a stranger's.
    if let Some(ConnKeyed(from)) = req.extensions().get::<ConnKeyed>() {
        from.mark_keyed();
    }
    next.run(req).await
}

/// `localhost`, a loopback IP, with or without a port.
fn names_loopback(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(h, port)| if port.chars().all(|c| c.is_ascii_digit()) { h } else { host }),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_names_pass_the_host_check() {
        for ok in ["localhost", "localhost:11435", "127.0.0.1:80", "127.0.0.1", "[::1]:11435", "[::1]", "LOCALHOST:1"] {
            assert!(names_loopback(ok), "{ok}");
        }
        for bad in ["evil.example", "evil.example:11435", "192.168.1.2:11435", "localhost.evil.example", "[fe80::1]:1", ""] {
            assert!(!names_loopback(bad), "{bad}");
        }
    }
}
