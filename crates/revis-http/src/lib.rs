//! `revis serve`: the HTTP APIs other tools already speak, OpenAI's `/v1`
//! and Ollama's `/api`, over the client's [`Runner`](revis_client::Runner) (in `revis serve`, the
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
//! Every request passes the [`guard`] first: the API key (`Authorization:
//! Bearer`, on both APIs, unless the server runs without one) and, on a
//! loopback address, a `Host` that names this machine (a web page that
//! rebinds its own name to 127.0.0.1 is refused). Bounded: the request
//! body ([`Limits::max_body_bytes`]), generations running at once
//! ([`Limits::max_generations`], a 429 naming it when full) and connections
//! ([`Limits::max_connections`]). A generation runs in a task of its own
//! that ends when the answer does or when the caller goes away (its
//! response body dropped), which drops the [`Runner::generate`](revis_client::Runner::generate) future and
//! so cancels the answer on whichever daemon runs it; a caller that stops
//! reading holds nothing: the answer is finished into memory and the
//! generation's place is given back.
//!
//! The rooms: [`router`](mod@router) (the routes), `guard.rs` (origin, body type, host
//! and key), `listen.rs` (connections, TLS, timeouts: [`serve`]),
//! `options.rs` ([`Options`], [`Limits`], [`check_bind`]), `app.rs` (what
//! every handler shares), `request.rs` (a body read strictly into a route's
//! typed request), `edge.rs` (the rules every API's request follows, written
//! once), `openai`, `responses.rs`, `anthropic.rs` and `ollama` (each API's
//! own form, in and out), `generation.rs`, `models.rs`, `reply.rs`,
//! `error.rs` ([`ApiError`]: each API's error shape) and `key.rs`.

mod anthropic;
mod app;
mod edge;
mod error;
mod generation;
mod guard;
pub mod key;
mod listen;
pub mod models;
mod ollama;
mod openai;
mod options;
mod reply;
mod request;
mod responses;
mod router;

pub use error::{ApiError, Flavor, HttpError};
pub use key::{KEY_FILE, load_or_create_key};
pub use listen::{HANDSHAKE_TIMEOUT, serve};
pub use options::{DEFAULT_ADDR, Limits, Options, PROBATION, check_bind, peer_group};
/// HTTPS beyond loopback (`revis serve --tls`): revis-trust owns the TLS configuration.
pub use revis_trust::{HTTPS_CA_FILE, HTTPS_CERT_FILE, HTTPS_KEY_FILE, HttpsIdentity, https_names};
pub use router::router;
