//! `revis serve`: the HTTP APIs other tools already speak, OpenAI's `/v1`
//! and Ollama's `/api`, over the client's [`Runner`] (in `revis serve`, the
//! [`revis_client::dispatch::Dispatcher`], so an offloaded tier runs on its
//! node and fails over like any other task, and a model named `NODE/TIER`
//! runs on that node through the dispatcher, under its breaker).
//!
//! The routes:
//!
//! - OpenAI: `GET /v1/models`, `POST /v1/chat/completions` and
//!   `POST /v1/completions` (SSE with `stream: true`, ending `data: [DONE]`);
//!   errors are `{"error": {"message", "type", "param", "code"}}`.
//! - Ollama: `GET /api/tags`, `/api/version`, `/api/ps`, `POST /api/show`,
//!   `/api/chat` and `/api/generate` (NDJSON streaming unless `stream:
//!   false`); errors are `{"error": "..."}`.
//! - OpenAI's Responses: `POST /v1/responses`, stateless (`response.*`
//!   SSE events with `stream: true`).
//! - Anthropic: `POST /v1/messages` (SSE events with `stream: true`) and
//!   `/v1/messages/count_tokens`; errors are `{"type": "error", "error":
//!   {"type", "message"}}`; the key may come as `x-api-key`.
//! - Embeddings: `POST /v1/embeddings` (floats or base64), `/api/embed`
//!   and the older `/api/embeddings`: the tier's model's hidden states,
//!   mean-pooled and L2-normalised (any model gives them; a model trained
//!   for embeddings gives better ones).
//!
//! A model is named by its tier (`tier2`) or by the model a tier runs
//! (`smollm2-135m-instruct`): see [`models`].
//!
//! Every request passes [`guard`] first: the API key (`Authorization:
//! Bearer`, on both APIs, unless the server runs without one) and, on a
//! loopback address, a `Host` that names this machine (a web page that
//! rebinds its own name to 127.0.0.1 is refused). Bounded: the request
//! body ([`Limits::max_body_bytes`]), generations running at once
//! ([`Limits::max_generations`], a 429 naming it when full) and connections
//! ([`Limits::max_connections`]). A generation runs in a task of its own
//! that ends when the answer does or when the caller goes away (its
//! response body dropped), which drops the [`Runner::generate`] future and
//! so cancels the answer on whichever daemon runs it; a caller that stops
//! reading holds nothing: the answer is finished into memory and the
//! generation's place is given back.

mod anthropic;
mod edge;
mod error;
mod generation;
pub mod key;
pub mod models;
mod ollama;
mod openai;
mod request;
mod responses;

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use revis_client::Runner;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use error::{ApiError, Flavor};
pub use key::{KEY_FILE, load_or_create_key};
/// HTTPS beyond loopback (`revis serve --tls`): revis-trust owns the TLS configuration.
pub use revis_trust::{HTTPS_CA_FILE, HTTPS_CERT_FILE, HTTPS_KEY_FILE, HttpsIdentity, https_names};

/// Where `revis serve` listens unless told otherwise: loopback, next to
/// Ollama's 11434.
pub const DEFAULT_ADDR: &str = "127.0.0.1:11435";

/// What the server bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A request body larger than this is refused (413).
    pub max_body_bytes: usize,
    /// Generations running at once; one more is refused with 429.
    pub max_generations: usize,
    /// Connections open at once; more wait to be accepted. One address may
    /// hold [`Limits::per_address`] of them.
    pub max_connections: usize,
    /// How long a client has to send a request's head, and how long a
    /// kept-alive connection may sit idle before its next request.
    pub header_timeout: Duration,
    /// How long a response write may make no progress (a client that does
    /// not read, or pipelines requests and never reads their answers)
    /// before the connection is closed.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 << 20,
            max_generations: 16,
            max_connections: 64,
            header_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(60),
        }
    }
}

impl Limits {
    /// Connections without a keyed request one peer ([`peer_group`]) may
    /// hold at once: half of `max_connections` (at least one), so clients
    /// of one other address cannot take every place.
    pub fn per_address(&self) -> usize {
        (self.max_connections / 2).max(1)
    }

    /// Connections without a keyed request all peers together may hold: the
    /// rest (a quarter, at least one) is kept for connections that show the
    /// key, as the owner's do.
    pub fn unkeyed(&self) -> usize {
        (self.max_connections - self.max_connections / 4).max(1)
    }
}

/// How long a connection past its peer's share, or past the places kept
/// for keyed connections, has to send a request that passes the key check
/// (any request, under `--no-key`) before it is closed.
pub const PROBATION: Duration = Duration::from_secs(2);

/// The peer a connection is counted under: every loopback address is one
/// (any local process may bind any 127.x), an IPv6 address by its /64 (one
/// host holds a whole /64), an IPv4 address as it is.
pub fn peer_group(ip: IpAddr) -> IpAddr {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match ip {
        _ if ip.is_loopback() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

/// How the server runs.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The API key every request must carry; `None`: none is asked (loopback only, see [`check_bind`]).
    pub key: Option<String>,
    pub limits: Limits,
    /// Requests must name this machine in `Host` (set for loopback addresses).
    pub loopback_host_only: bool,
    /// The web pages (an `Origin`, e.g. `http://localhost:3000`) allowed to
    /// call; a request from any other page is refused, key or not.
    pub allowed_origins: Vec<String>,
    /// Ollama's `/api/pull` and `/api/delete` are served (`--allow-pull`):
    /// off by default, since they write to the owner's disk. A pull never
    /// sends the owner's Hugging Face token.
    pub allow_pull: bool,
    /// The largest file a pull may fetch (`--max-pull-bytes`; 0 = none may).
    pub max_pull_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{0}")]
    Refused(String),
    #[error("{path}: {source}")]
    Io { path: std::path::PathBuf, source: std::io::Error },
}

/// What a request's `model` names.
async fn resolve<R: Runner>(app: &AppState<R>, model: &str, flavor: Flavor) -> Result<models::Entry, ApiError> {
    let catalog = app.catalog.get(&app.runner).await.map_err(|e| ApiError::from_call(flavor, &e))?;
    catalog.find(model).cloned().ok_or_else(|| ApiError::model_not_found(flavor, model, &catalog.names()))
}

/// An SSE response: `first`, then the rest of the generation, each piece
/// written by `encode`.
fn sse_response(
    first: generation::Piece,
    generation: generation::Generation,
    encode: impl FnMut(generation::Piece) -> Vec<u8> + Send + 'static,
) -> Response {
    sse_body(generation.body(first, encode))
}

/// A response of server-sent events with `body`.
fn sse_body(body: axum::body::Body) -> Response {
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

/// Refuses an address the server may not listen on: `--no-key` anywhere
/// but loopback, and any address but loopback without TLS (the key would
/// cross the network in the clear).
pub fn check_bind(addr: SocketAddr, no_key: bool, tls: bool) -> Result<(), HttpError> {
    if addr.ip().is_loopback() {
        return Ok(());
    }
    if no_key {
        return Err(HttpError::Refused(format!(
            "--no-key is allowed on loopback addresses only (127.0.0.1, ::1), not on {addr}: anyone who can reach it could use your models"
        )));
    }
    if !tls {
        return Err(HttpError::Refused(format!(
            "{addr} is not a loopback address: serving beyond this machine needs TLS (--tls for a certificate made here, or --tls-cert and --tls-key for your own); or listen on 127.0.0.1 or ::1"
        )));
    }
    Ok(())
}

/// What every handler shares.
struct App<R> {
    runner: R,
    catalog: models::Cached,
    generations: Arc<Semaphore>,
    /// Model downloads running at once (`/api/pull`).
    pulls: Arc<Semaphore>,
    opts: Options,
}

/// The state axum hands each handler.
type AppState<R> = Arc<App<R>>;

impl<R: Runner> App<R> {
    /// The runner held to a paired node, for a request that names it
    /// (`NODE/TIER`), or a 503 saying it does not answer.
    fn node(&self, flavor: Flavor, node: &str) -> Result<R, ApiError> {
        self.runner.on_node(node).ok_or_else(|| {
            ApiError::new(
                flavor,
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!("the paired node {node:?} does not answer now; the model list says what can be used"),
            )
        })
    }

    /// Starts a generation where `entry` runs: its node alone, or wherever the runner places it.
    fn start(
        &self,
        flavor: Flavor,
        entry: &models::Entry,
        mut params: revis_client::GenerateParams,
        place: OwnedSemaphorePermit,
    ) -> Result<generation::Generation, ApiError> {
        params.tier = entry.tier;
        edge::prepare(&mut params);
        Ok(match &entry.node {
            None => generation::Generation::start(self.runner.clone(), entry.name.clone(), params, place),
            Some(node) => generation::Generation::start(self.node(flavor, node)?, entry.name.clone(), params, place),
        })
    }

    /// Embeddings where `entry` runs.
    async fn embed(&self, flavor: Flavor, entry: &models::Entry, inputs: Vec<String>) -> Result<revis_client::Embedded, ApiError> {
        let req = revis_client::EmbedParams { tier: entry.tier, inputs };
        let r = match &entry.node {
            None => self.runner.embed(req).await,
            Some(node) => self.node(flavor, node)?.embed(req).await,
        };
        r.map_err(|e| ApiError::from_call(flavor, &e))
    }

    /// A place for one more generation (an embedding call takes one too),
    /// or a 429 naming the limit.
    fn generation_place(&self, flavor: Flavor) -> Result<OwnedSemaphorePermit, ApiError> {
        self.generations.clone().try_acquire_owned().map_err(|_| {
            ApiError::too_many(
                flavor,
                format!(
                    "revis serve runs at most {} generations at once (its max_generations limit) and all are in use; retry when one ends",
                    self.opts.limits.max_generations
                ),
                Duration::from_secs(1),
            )
        })
    }
}

/// The routes of both APIs over `runner`.
pub fn router<R: Runner>(runner: R, opts: Options) -> Router {
    let app = Arc::new(App {
        runner,
        catalog: models::Cached::default(),
        generations: Arc::new(Semaphore::new(opts.limits.max_generations)),
        pulls: Arc::new(Semaphore::new(ollama::MAX_PULLS)),
        opts,
    });
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
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard::<R>))
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

/// The web page a request comes from, the key and the `Host`, before
/// anything else is read. A browser names the page in `Origin` (and sends
/// any page's request, as a "simple" one with a text or form body, without
/// asking first): only the pages `--allow-origin` names get through, and
/// only JSON bodies, so no page the user happens to open can use the models
/// blindly, with `--no-key` or not.
async fn guard<R: Runner>(State(app): State<AppState<R>>, req: Request, next: Next) -> Response {
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

/// Serves `router` on `listener` until `shutdown` resolves; then answers
/// under way get `grace` to end before they are dropped (which cancels
/// their generations).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<revis_trust::HttpsIdentity>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let (done_tx, done_rx) = tokio::sync::mpsc::channel(limits.max_connections.max(1));
    let places = Arc::new(Semaphore::new(limits.max_connections));
    let from = Arc::new(std::sync::Mutex::new(Counts::default()));
    let mut listener = Bounded {
        inner: listener,
        places,
        from,
        per_address: limits.per_address(),
        unkeyed: limits.unkeyed(),
        write_timeout: limits.write_timeout,
        tls: tls.map(|identity| Tls { identity, done_tx, done_rx }),
    };
    // Each connection holds a receiver; all gone means all closed.
    let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, addr) = tokio::select! {
            c = listener.accept() => c,
            () = &mut shutdown => break,
        };
        tokio::spawn(serve_connection(io, addr, router.clone(), limits.header_timeout, stopping_rx.clone()));
    }
    drop(listener);
    let _ = stopping_tx.send(true);
    drop(stopping_rx);
    tokio::select! {
        () = stopping_tx.closed() => {}
        () = tokio::time::sleep(grace) => tracing::info!("answers still under way after {grace:?}: dropped"),
    }
    Ok(())
}

/// One connection, HTTP/1.1 with keep-alive, until the client closes it,
/// sends no request head within `header_timeout` (a slow or idle client),
/// takes no response bytes for `write_timeout` ([`Held`]), sends no keyed
/// request within [`PROBATION`] when it came on probation, or the server
/// stops (answers under way are let finish).
async fn serve_connection(
    io: Held,
    addr: SocketAddr,
    router: Router,
    header_timeout: Duration,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let keyed = io.from.clone();
    let mut on_probation = io.probation;
    let for_requests = keyed.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(ConnKeyed(for_requests.clone()));
        tower::ServiceExt::oneshot(router.clone(), req.map(axum::body::Body::new))
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let mut asked = false;
    let probation = tokio::time::sleep(if on_probation { PROBATION } else { Duration::ZERO });
    let mut probation = std::pin::pin!(probation);
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    match write_timed_out(&e) {
                        Some(why) => tracing::info!(%addr, "closing a connection: {why}"),
                        None => tracing::debug!(%addr, "connection: {e}"),
                    }
                }
                return;
            }
            () = probation.as_mut(), if on_probation => {
                if !keyed.is_keyed() {
                    tracing::info!(%addr, "closing a connection that came past its peer's share and showed no key within {PROBATION:?}");
                    return;
                }
                // Keyed in time: it stays, as any keyed connection.
                on_probation = false;
            }
            changed = stopping.changed(), if !asked => {
                asked = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// The write timeout's error inside hyper's, when that is why a connection ended.
fn write_timed_out(e: &hyper::Error) -> Option<String> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return Some(io.to_string());
        }
        source = s.source();
    }
    None
}

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A listener that accepts at most `places` connections at once (those
/// still in their TLS handshake included), over TLS when it has [`Tls`].
struct Bounded {
    inner: TcpListener,
    places: Arc<Semaphore>,
    /// Connections without a keyed request, by peer.
    from: ByAddress,
    /// At most this many from one peer before probation ([`Limits::per_address`]).
    per_address: usize,
    /// At most this many from all peers before probation ([`Limits::unkeyed`]).
    unkeyed: usize,
    write_timeout: Duration,
    tls: Option<Tls>,
}

/// TLS handshakes run in tasks of their own, so a slow client holds up
/// nobody; the connections whose handshake ended come back here.
struct Tls {
    identity: revis_trust::HttpsIdentity,
    done_tx: tokio::sync::mpsc::Sender<(Held, SocketAddr)>,
    done_rx: tokio::sync::mpsc::Receiver<(Held, SocketAddr)>,
}

/// A connection and its places (among all, and its peer's), given back
/// when it closes; a write that makes no progress for `write_timeout`
/// fails (and so closes it).
struct Held {
    io: Io,
    _place: OwnedSemaphorePermit,
    from: Arc<FromAddress>,
    /// It came past its peer's share or the unkeyed places: [`PROBATION`].
    probation: bool,
    write_timeout: Duration,
    /// Armed while a write waits.
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// A write or flush waits on the client: nothing more is read (no
    /// further pipelined request) until it goes on ([`Held::timed`]).
    blocked: bool,
}

/// One of a peer's connections, counted until it shows the key or closes.
struct FromAddress {
    from: ByAddress,
    ip: IpAddr,
    keyed: std::sync::atomic::AtomicBool,
}

impl FromAddress {
    fn is_keyed(&self) -> bool {
        self.keyed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// It sent a request that passed the key check: it no longer counts
    /// against its peer's share or the unkeyed places.
    fn mark_keyed(&self) {
        if !self.keyed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.uncount();
        }
    }

    fn uncount(&self) {
        let mut counts = self.from.lock().unwrap_or_else(|e| e.into_inner());
        counts.unkeyed = counts.unkeyed.saturating_sub(1);
        if let Some(n) = counts.by_peer.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.by_peer.remove(&self.ip);
            }
        }
    }
}

impl Drop for FromAddress {
    fn drop(&mut self) {
        if !self.is_keyed() {
            self.uncount();
        }
    }
}

/// What a request carries of its connection, for the key check to mark.
#[derive(Clone)]
struct ConnKeyed(Arc<FromAddress>);

enum Io {
    Plain(TcpStream),
    Tls(Box<revis_trust::HttpsStream>),
}

/// Connections without a keyed request: by peer ([`peer_group`]), and all.
#[derive(Default)]
struct Counts {
    by_peer: HashMap<IpAddr, usize>,
    unkeyed: usize,
}

type ByAddress = Arc<std::sync::Mutex<Counts>>;

/// The next TCP connection, once a place is free, counted under its peer;
/// on probation when its peer holds `per_address` unkeyed connections
/// already, or all peers `unkeyed`.
async fn accept_tcp(
    inner: &TcpListener,
    places: &Arc<Semaphore>,
    by_address: &ByAddress,
    (per_address, unkeyed): (usize, usize),
) -> (TcpStream, SocketAddr, OwnedSemaphorePermit, Arc<FromAddress>, bool) {
    let place = places.clone().acquire_owned().await.expect("the semaphore is never closed");
    let (io, addr) = accept_one(inner).await;
    let ip = peer_group(addr.ip());
    let mut counts = by_address.lock().unwrap_or_else(|e| e.into_inner());
    let n = counts.by_peer.entry(ip).or_default();
    let probation = *n >= per_address || counts.unkeyed >= unkeyed;
    if probation {
        tracing::info!(%addr, "a connection past its peer's share or the unkeyed places: it has {PROBATION:?} to show the key");
    }
    *counts.by_peer.entry(ip).or_default() += 1;
    counts.unkeyed += 1;
    drop(counts);
    let from = Arc::new(FromAddress { from: by_address.clone(), ip, keyed: std::sync::atomic::AtomicBool::new(false) });
    (io, addr, place, from, probation)
}

/// The next TCP connection.
async fn accept_one(inner: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match inner.accept().await {
            Ok((io, addr)) => {
                let _ = io.set_nodelay(true);
                return (io, addr);
            }
            Err(e) => {
                // Out of file descriptors and the like: wait, as axum's own listener does.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

impl Bounded {
    async fn accept(&mut self) -> (Held, SocketAddr) {
        let write_timeout = self.write_timeout;
        let held =
            move |io, place, from, probation| Held { io, _place: place, from, probation, write_timeout, stalled: None, blocked: false };
        let shares = (self.per_address, self.unkeyed);
        let Some(tls) = &mut self.tls else {
            let (io, addr, place, from, probation) = accept_tcp(&self.inner, &self.places, &self.from, shares).await;
            return (held(Io::Plain(io), place, from, probation), addr);
        };
        loop {
            tokio::select! {
                Some(done) = tls.done_rx.recv() => return done,
                (io, addr, place, from, probation) = accept_tcp(&self.inner, &self.places, &self.from, shares) => {
                    let (identity, done) = (tls.identity.clone(), tls.done_tx.clone());
                    tokio::spawn(async move {
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, identity.accept(io)).await {
                            Ok(Ok(s)) => {
                                let _ = done.send((held(Io::Tls(Box::new(s)), place, from, probation), addr)).await;
                            }
                            Ok(Err(e)) => tracing::debug!(%addr, "TLS handshake failed: {e}"),
                            Err(_) => tracing::debug!(%addr, "no TLS handshake within {HANDSHAKE_TIMEOUT:?}"),
                        }
                    });
                }
            }
        }
    }
}

/// `$method` on whichever stream `$self.io` holds.
macro_rules! on_io {
    ($self:expr, $s:ident => $e:expr) => {
        match &mut $self.get_mut().io {
            Io::Plain($s) => $e,
            Io::Tls($s) => $e,
        }
    };
}

impl tokio::io::AsyncRead for Held {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        // A client that sends and never reads holds no more of revis's work
        // than its unwritten answer: its next requests wait in its socket.
        // The write that unblocks wakes this task (`timed`); one that never
        // does fails at the write timeout.
        if self.blocked {
            return std::task::Poll::Pending;
        }
        on_io!(self, s => std::pin::Pin::new(s).poll_read(cx, buf))
    }
}

impl Held {
    /// A write's outcome, with the stall timer: armed when it waits, reset
    /// when it makes progress, an error once it has waited `write_timeout`;
    /// reads are held back while it waits.
    fn timed<T>(&mut self, cx: &mut std::task::Context<'_>, r: std::task::Poll<std::io::Result<T>>) -> std::task::Poll<std::io::Result<T>> {
        use std::future::Future as _;
        match r {
            std::task::Poll::Pending => {
                self.blocked = true;
                let limit = self.write_timeout;
                let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if stalled.as_mut().poll(cx).is_ready() {
                    return std::task::Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the client took no response bytes for {limit:?} (--write-timeout-ms)"),
                    )));
                }
                std::task::Poll::Pending
            }
            ready => {
                self.stalled = None;
                if std::mem::take(&mut self.blocked) {
                    // A read held back meanwhile goes on.
                    cx.waker().wake_by_ref();
                }
                ready
            }
        }
    }
}

impl tokio::io::AsyncWrite for Held {
    fn poll_write(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = match &mut this.io {
            Io::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        };
        this.timed(cx, r)
    }

    fn poll_flush(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = match &mut this.io {
            Io::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            Io::Tls(s) => std::pin::Pin::new(s).poll_flush(cx),
        };
        this.timed(cx, r)
    }

    fn poll_shutdown(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        on_io!(self, s => std::pin::Pin::new(s).poll_shutdown(cx))
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = match &mut this.io {
            Io::Plain(s) => std::pin::Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => std::pin::Pin::new(s).poll_write_vectored(cx, bufs),
        };
        this.timed(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// Unix seconds now (the `created` of OpenAI's objects).
fn unix_now() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as u32)
}

/// A random ID with `prefix` (`chatcmpl-...`).
fn new_id(prefix: &str) -> String {
    let n: u128 = rand::random();
    format!("{prefix}-{:024x}", n >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While a write waits on a client that reads nothing, nothing more is
    /// read from it (no further pipelined request reaches hyper); when the
    /// client reads and the write goes on, reading does too.
    #[tokio::test]
    async fn nothing_more_is_read_while_a_write_waits_on_the_client() {
        use std::pin::Pin;
        use std::task::Poll;
        use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, addr) = listener.accept().await.unwrap();
        let place = Arc::new(Semaphore::new(1)).acquire_owned().await.unwrap();
        let from = Arc::new(FromAddress { from: ByAddress::default(), ip: addr.ip(), keyed: false.into() });
        let mut held = Held {
            io: Io::Plain(server),
            _place: place,
            from,
            probation: false,
            write_timeout: Duration::from_secs(60),
            stalled: None,
            blocked: false,
        };
        let chunk = vec![7u8; 64 << 10];
        let mut written = 0;
        loop {
            match std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut held).poll_write(cx, &chunk))).await {
                Poll::Ready(Ok(n)) => written += n,
                Poll::Ready(Err(e)) => panic!("{e}"),
                Poll::Pending => break,
            }
        }
        client.write_all(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
        let Io::Plain(inner) = &held.io else { unreachable!() };
        inner.readable().await.unwrap();
        let mut space = [0u8; 256];
        let mut buf = tokio::io::ReadBuf::new(&mut space);
        let read = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut held).poll_read(cx, &mut buf))).await;
        assert!(read.is_pending(), "a request was read while the answer waited");
        let mut sink = vec![0u8; written];
        client.read_exact(&mut sink).await.unwrap();
        std::future::poll_fn(|cx| Pin::new(&mut held).poll_write(cx, b"end")).await.unwrap();
        let mut buf = tokio::io::ReadBuf::new(&mut space);
        std::future::poll_fn(|cx| Pin::new(&mut held).poll_read(cx, &mut buf)).await.unwrap();
        assert!(buf.filled().starts_with(b"GET /v1/models"), "{:?}", String::from_utf8_lossy(buf.filled()));
    }

    #[test]
    fn loopback_is_one_peer_and_ipv6_counts_by_its_64() {
        let g = |s: &str| peer_group(s.parse().unwrap()).to_string();
        for local in ["127.0.0.1", "127.0.0.2", "127.255.0.9", "::1", "::ffff:127.0.0.3"] {
            assert_eq!(g(local), "127.0.0.1", "{local}");
        }
        assert_eq!(g("192.168.1.7"), "192.168.1.7");
        assert_eq!(g("::ffff:192.168.1.7"), "192.168.1.7");
        assert_eq!(g("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        assert_eq!(g("2001:db8:1:2::9"), g("2001:db8:1:2:ffff::1"), "one /64, one peer");
        assert_ne!(g("2001:db8:1:2::9"), g("2001:db8:1:3::9"));
    }

    #[test]
    fn only_loopback_names_pass_the_host_check() {
        for ok in ["localhost", "localhost:11435", "127.0.0.1:80", "127.0.0.1", "[::1]:11435", "[::1]", "LOCALHOST:1"] {
            assert!(names_loopback(ok), "{ok}");
        }
        for bad in ["evil.example", "evil.example:11435", "192.168.1.2:11435", "localhost.evil.example", "[fe80::1]:1", ""] {
            assert!(!names_loopback(bad), "{bad}");
        }
    }

    #[test]
    fn no_key_and_non_loopback_addresses_are_refused_with_the_reason() {
        let any: SocketAddr = "0.0.0.0:11435".parse().unwrap();
        assert!(check_bind("127.0.0.1:0".parse().unwrap(), true, false).is_ok());
        assert!(check_bind("[::1]:0".parse().unwrap(), false, false).is_ok());
        assert!(check_bind(any, true, true).unwrap_err().to_string().contains("--no-key is allowed on loopback addresses only"));
        assert!(check_bind(any, false, false).unwrap_err().to_string().contains("needs TLS"));
        assert!(check_bind(any, false, true).is_ok(), "beyond loopback: the key and TLS");
    }
}
