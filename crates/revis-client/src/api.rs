//! The client's domain types: what the orchestrator, the CLI and the GUI
//! say to a daemon and hear back, with no protobuf or gRPC type in sight.
//! [`crate::wire`] converts them to and from `revis.v1`, once, at the edge;
//! a call that fails is a [`CallError`], which says what went wrong, whether
//! the same call may be sent again and how much of its answer was already
//! delivered.
//!
//! [`Runner`] is the one interface the orchestrator runs tasks through. The
//! single-daemon [`crate::Client`] implements it, and so does the
//! [`crate::dispatch::Dispatcher`] (this machine's daemon and the paired
//! nodes, with failover), so policy above it never knows where a task ran.

use std::fmt;
use std::future::Future;
use std::time::Duration;

pub use revis_proto::{Priority, Tier, UnknownTier};

/// Who says a message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    System,
    #[default]
    User,
    Assistant,
    /// A function's result, answering an assistant's [`ToolCall`].
    Tool,
}

/// One message of a conversation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub text: String,
    /// An assistant message: the functions it called.
    pub tool_calls: Vec<ToolCall>,
    /// A tool message: the call it answers (empty: not said).
    pub tool_call_id: String,
    /// A tool message: the function that answered (empty: not said).
    pub name: String,
}

/// A function call: made by the model ([`Done::tool_calls`]) or earlier in
/// the conversation ([`Message::tool_calls`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments, a JSON object as text.
    pub arguments: String,
}

/// A function the model may call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// The arguments' JSON schema (an object) as text; empty: any object.
    pub parameters: String,
}

/// Whether, and which, function the model must call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// Text or calls, as the model chooses.
    #[default]
    Auto,
    /// Text: the functions are not offered.
    None,
    /// At least one call.
    Required,
    /// A call of this function.
    Named(String),
}

impl Message {
    pub fn new(role: Role, text: impl Into<String>) -> Message {
        Message { role, text: text.into(), ..Message::default() }
    }

    pub fn system(text: impl Into<String>) -> Message {
        Message::new(Role::System, text)
    }

    pub fn user(text: impl Into<String>) -> Message {
        Message::new(Role::User, text)
    }

    pub fn assistant(text: impl Into<String>) -> Message {
        Message::new(Role::Assistant, text)
    }
}

/// How the next token is drawn; `None` leaves a setting to the daemon.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_k: Option<u32>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<u32>,
    /// OpenAI's penalties (-2 to 2, 0 = off), over the last `repeat_last_n` tokens.
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// The same seed, prompt and settings give the same answer.
    pub seed: Option<u64>,
}

/// What the answer is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// Free text, streamed as it comes.
    #[default]
    Text,
    /// One JSON value, constrained by a grammar (from `schema`, a JSON
    /// Schema, when given). Never shown in parts.
    Json { schema: Option<String> },
}

/// One answer to generate.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerateParams {
    pub tier: Tier,
    pub messages: Vec<Message>,
    /// How many leading messages are the static part of the prompt (kept
    /// in the daemon's cache across turns); `None`: all but the last.
    pub static_messages: Option<u32>,
    pub sampling: Sampling,
    /// `None`: the daemon's default.
    pub max_tokens: Option<u32>,
    /// A `max_tokens` over the daemon's limit is lowered to it, not refused
    /// (the HTTP APIs).
    pub cap_max_tokens: bool,
    /// The answer ends before any of these.
    pub stop: Vec<String>,
    pub format: Format,
    pub priority: Priority,
    /// Text the answer already begins with (shown before a failover): the
    /// daemon continues from it and sends only what follows.
    pub answer_prefix: String,
    /// Report each token's log-probability (in [`Event::Delta`]) with this
    /// many alternatives (at most 20); `None`: no log-probabilities.
    pub logprobs: Option<u32>,
    /// Functions the model may call (their calls come in [`Done::tool_calls`]).
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    /// Several calls in one answer.
    pub parallel_tool_calls: bool,
}

impl GenerateParams {
    /// Whether the model may call a function in this answer.
    pub fn offers_tools(&self) -> bool {
        !self.tools.is_empty() && self.tool_choice != ToolChoice::None
    }
}

/// A prompt to evaluate ahead of its answer (pre-prefill while the user types).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefillParams {
    pub tier: Tier,
    pub messages: Vec<Message>,
    pub priority: Priority,
}

/// How likely the model finds each of `continuations` after `messages` and
/// `prefix` (evaluated once for all of them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScoreParams {
    pub tier: Tier,
    pub messages: Vec<Message>,
    /// With messages: how many are the static part, as in
    /// [`GenerateParams::static_messages`] (the prompt is then cut into
    /// batches as a Generate of the same conversation is, so a Score after
    /// that Generate reuses its cache); None = all but the last.
    pub static_messages: Option<u32>,
    pub prefix: String,
    /// At least one, at most 16.
    pub continuations: Vec<String>,
    /// Alternatives to report at each position (at most 20).
    pub top_logprobs: u32,
}

impl ScoreParams {
    /// One continuation after a plain-text prefix.
    pub fn one(tier: Tier, prefix: impl Into<String>, continuation: impl Into<String>) -> ScoreParams {
        ScoreParams { tier, prefix: prefix.into(), continuations: vec![continuation.into()], ..Default::default() }
    }
}

/// A token as the model saw it: its bytes (a piece of a UTF-8 character
/// is possible; a token that ends the turn has none) and its natural-log
/// probability under the model's own distribution.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenLogprob {
    pub piece: Vec<u8>,
    pub logprob: f64,
    /// The likeliest tokens at this position, likeliest first (when asked).
    pub top: Vec<Alternative>,
}

/// A token the model could have put at a position.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Alternative {
    pub piece: Vec<u8>,
    pub logprob: f64,
}

/// An event of a streamed answer: `Started`, `Delta`s, then `Done`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Started {
        model: String,
        prompt_tokens: u32,
    },
    /// `logprobs`: the tokens with their log-probabilities, when asked
    /// ([`GenerateParams::logprobs`]); the last Delta may carry only the
    /// turn's end, with no text.
    Delta {
        text: String,
        tokens: u32,
        logprobs: Vec<TokenLogprob>,
    },
    Done(Done),
}

/// Why an answer ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended it.
    #[default]
    End,
    /// `max_tokens` or the context ran out.
    Length,
    /// A stop string.
    Stop,
    /// The answer is function calls ([`Done::tool_calls`]).
    ToolCalls,
}

/// A finished answer and what it cost.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Done {
    pub finish_reason: FinishReason,
    pub prompt_tokens: u32,
    /// Prompt tokens that came from the daemon's cache.
    pub cached_tokens: u32,
    pub generated_tokens: u32,
    /// The seed used (the one given, or the one drawn).
    pub seed: u64,
    pub prompt_us: u64,
    pub generate_us: u64,
    /// The whole answer.
    pub text: String,
    /// Time spent waiting in the daemon's queue.
    pub queue_ms: u64,
    /// Tokens the daemon drafted from the context and verified, and how
    /// many of them the model kept (the text is the same either way).
    pub draft_tokens: u32,
    pub draft_accepted: u32,
    /// The most answers that shared one decode step with this one, itself
    /// included (1: it was decoded alone).
    pub batch_peak: u32,
    /// The functions the answer called; their text is not in `text`.
    pub tool_calls: Vec<ToolCall>,
    /// Each token of the answer with its log-probability, when the request
    /// asked ([`GenerateParams::logprobs`]): those the deltas carried, in
    /// order (after a failover, the last daemon's only).
    pub logprobs: Vec<TokenLogprob>,
}

impl Done {
    /// Decode speed, when enough tokens were made to say.
    pub fn tokens_per_s(&self) -> Option<f64> {
        (self.generate_us > 0 && self.generated_tokens > 1).then(|| f64::from(self.generated_tokens) / (self.generate_us as f64 / 1e6))
    }
}

/// A prompt evaluated ahead of its answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prefilled {
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub elapsed_us: u64,
}

/// Texts to embed with a tier's model (1 to 64, each at most 512 tokens).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EmbedParams {
    pub tier: Tier,
    pub inputs: Vec<String>,
}

/// The embeddings of [`EmbedParams::inputs`], in order: each unit length
/// (mean-pooled hidden states, L2-normalised), with the tokens the text was read as.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Embedded {
    /// The tier's model, as the daemon names it.
    pub model: String,
    pub embeddings: Vec<Embedding>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Embedding {
    pub values: Vec<f32>,
    pub tokens: u32,
}

/// The log-probability of a continuation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scored {
    pub logprob: f64,
    /// Each token of the continuation with its log-probability.
    pub tokens: Vec<TokenLogprob>,
    /// Compare models per byte, never per token.
    pub byte_length: u32,
    pub prefix_tokens: u32,
}

impl Scored {
    /// Natural-log probability per byte of the continuation.
    pub fn per_byte(&self) -> f64 {
        self.logprob / f64::from(self.byte_length.max(1))
    }
}

/// Where a tier's model is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModelState {
    #[default]
    Unloaded,
    Loading,
    Ready,
}

impl ModelState {
    /// As the CLI and the GUI print it.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Unloaded => "unloaded",
            ModelState::Loading => "loading",
            ModelState::Ready => "ready",
        }
    }
}

/// One tier of a daemon.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierStatus {
    pub tier: Tier,
    pub model: String,
    pub model_path: String,
    pub state: ModelState,
    pub memory_bytes: u64,
    pub cached_prefixes: u32,
    pub cache_bytes: u64,
    pub context_tokens: u32,
    /// Other tiers that use the same model (loaded once).
    pub shared_with: Vec<Tier>,
    /// A tier split across machines: how its layers are placed; empty otherwise.
    pub split: String,
    /// The threads a single token's step runs on now (0 while not loaded),
    /// and whether the daemon chooses them by measurement (`threads = "auto"`).
    pub threads: u32,
    pub threads_auto: bool,
}

/// A daemon's server mode (other machines reaching it over mutual TLS).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerMode {
    pub enabled: bool,
    pub listen_address: String,
    pub advertised: bool,
    pub remote_connections: u32,
    pub paired_devices: u32,
    pub pairing_open: bool,
    /// Lending this machine's layers to paired devices (`revisd lend`).
    pub lending: bool,
    pub lending_sessions: u32,
    /// Why lending cannot serve although it is on ("" when it can, or not
    /// known yet): no private loopback for the RPC worker.
    pub lending_refused: String,
}

/// What a daemon says of itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DaemonStatus {
    pub version: String,
    pub tiers: Vec<TierStatus>,
    pub queue_depth: u32,
    pub queue_capacity: u32,
    pub rss_bytes: u64,
    pub busy: bool,
    pub pid: u32,
    pub uptime_s: u64,
    pub device_id: String,
    pub name: String,
    pub server: Option<ServerMode>,
    /// Memory free on the daemon's machine.
    pub memory_free_bytes: u64,
}

impl DaemonStatus {
    pub fn tier(&self, tier: Tier) -> Option<&TierStatus> {
        self.tiers.iter().find(|t| t.tier == tier)
    }
}

/// A model loaded on request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    pub tier: TierStatus,
    pub elapsed_ms: u64,
}

/// A model unloaded on request, and the memory that came back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unloaded {
    pub tier: TierStatus,
    pub rss_before_bytes: u64,
    pub rss_after_bytes: u64,
}

/// A tier's saved prefixes dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Purged {
    pub dropped_prefixes: u32,
    pub freed_bytes: u64,
}

/// What happens in a pairing window the daemon opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PairingEvent {
    Opened { code: String, expires_in_s: u32, listen_address: String, device_id: String },
    Paired { device_id: String, name: String },
    Closed { reason: String },
}

/// A device paired with a daemon.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    pub device_id: String,
    pub name: String,
    /// Unix seconds.
    pub paired_at: u64,
    /// Unix seconds; 0 = never.
    pub last_seen: u64,
    pub connections: u32,
}

/// A device revoked, and the connections cut with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Revoked {
    pub device: Option<DeviceInfo>,
    pub cut_connections: u32,
}

/// What kind of failure a call met (gRPC's status codes, as the daemon and
/// the transport report them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

/// A call that failed.
///
/// The one retry rule of the client layer (see [`CallError::may_retry`]): a
/// call is sent again, at most once and to the same daemon, only when
/// nothing of its answer was delivered and the daemon could not take it
/// (UNAVAILABLE: unreachable, restarting or shutting down) or the
/// connection broke under it. [`crate::Client`] applies it to every call;
/// the dispatcher never resends to the same daemon, it fails over
/// ([`crate::dispatch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallError {
    pub code: Code,
    /// What the daemon (or the transport) said.
    pub message: String,
    /// The daemon's hint of when to try again (a full queue).
    pub retry_after: Option<Duration>,
    /// The connection broke under the call: the daemon did not answer it.
    pub broken: bool,
    /// Bytes of the answer delivered before it failed.
    pub delivered: usize,
}

impl CallError {
    pub fn new(code: Code, message: impl Into<String>) -> CallError {
        CallError { code, message: message.into(), retry_after: None, broken: false, delivered: 0 }
    }

    /// The same call may be sent again to the same daemon (see the rule above).
    pub fn may_retry(&self) -> bool {
        self.delivered == 0 && (self.code == Code::Unavailable || (self.broken && matches!(self.code, Code::Unknown | Code::Cancelled)))
    }

    /// The same call cannot succeed anywhere: the request itself is refused.
    pub fn is_final(&self) -> bool {
        self.code == Code::InvalidArgument
    }

    /// The same error, after `bytes` of the answer were delivered.
    pub fn after(mut self, bytes: usize) -> CallError {
        self.delivered = bytes;
        self
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:?})", self.message, self.code)
    }
}

impl std::error::Error for CallError {}

/// What the orchestrator and the HTTP APIs run tasks through: one daemon
/// ([`crate::Client`]), several ([`crate::dispatch::Dispatcher`]) or an
/// ensemble of models ([`crate::ensemble::Ensemble`]); unit tests script one.
pub trait Runner: Clone + Send + Sync + 'static {
    fn prefill(&self, req: PrefillParams) -> impl Future<Output = Result<Prefilled, CallError>> + Send;

    /// Generates, calling `on_delta` with each piece of text as it is
    /// shown (a JSON answer: once, whole); returns the finished answer.
    fn generate(&self, req: GenerateParams, on_delta: impl FnMut(&str) + Send) -> impl Future<Output = Result<Done, CallError>> + Send;

    /// [`Runner::generate`], also telling `on_started` the prompt's length
    /// in the model's tokens once the daemon has read it in, before the
    /// prompt is evaluated (what Anthropic's `message_start` reports). A
    /// runner that cannot tell (an ensemble's two models) never calls it.
    fn generate_started(
        &self,
        req: GenerateParams,
        on_started: impl FnMut(u32) + Send,
        on_delta: impl FnMut(&str) + Send,
    ) -> impl Future<Output = Result<Done, CallError>> + Send {
        drop(on_started);
        self.generate(req, on_delta)
    }

    /// Embeds each input with the tier's model, from where the tier runs;
    /// one embedding per input, in order.
    fn embed(&self, req: EmbedParams) -> impl Future<Output = Result<Embedded, CallError>> + Send;

    /// The tiers of the daemon it answers for (this machine's, for the
    /// dispatcher) and the model each runs.
    fn tiers(&self) -> impl Future<Output = Result<Vec<TierStatus>, CallError>> + Send;

    /// How many background tasks may run at once (it may change); `None` = one.
    fn parallelism(&self) -> Option<tokio::sync::watch::Receiver<usize>> {
        None
    }

    /// The paired nodes it can run a task on, by name, each with the tiers
    /// it serves (as last seen); a single daemon has none.
    fn nodes(&self) -> Vec<(String, Vec<Tier>)> {
        Vec::new()
    }

    /// The same runner held to one of [`Runner::nodes`] (by name or device
    /// ID), for a task that names where it must run: nothing moves
    /// elsewhere. None while no such node answers.
    fn on_node(&self, _node: &str) -> Option<Self> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unanswered_call_with_nothing_delivered_may_be_sent_again() {
        let unavailable = CallError::new(Code::Unavailable, "shutting down");
        assert!(unavailable.may_retry());
        assert!(!unavailable.clone().after(3).may_retry(), "text was shown: sending again would repeat it");
        assert!(!CallError::new(Code::Unknown, "the daemon said so").may_retry(), "an answer of the daemon is not retried");
        let broken = CallError { broken: true, ..CallError::new(Code::Unknown, "connection reset") };
        assert!(broken.may_retry());
        assert!(!CallError::new(Code::InvalidArgument, "empty").may_retry());
        assert!(CallError::new(Code::InvalidArgument, "empty").is_final());
        assert!(!CallError::new(Code::ResourceExhausted, "queue full").may_retry(), "a full queue says when, the caller decides");
    }

    #[test]
    fn an_error_reads_as_its_message_and_code() {
        assert_eq!(CallError::new(Code::InvalidArgument, "messages is empty").to_string(), "messages is empty (InvalidArgument)");
    }
}
