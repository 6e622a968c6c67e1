//! The inference engine: a narrow [`Backend`] trait, its llama.cpp
//! implementation, and the engine thread that owns every loaded model.
//!
//! This crate knows nothing about gRPC, sockets, tiers or queues. It turns
//! prompts into tokens, tokens into text, and keeps prefix caches.

mod cache;
mod error;
mod grammar;
mod llama;
pub mod lookup;
mod message;
mod prompt;
pub mod render;
pub mod rpc;
pub mod sample;
pub mod schema;
mod stop;
mod template;
mod thread;
pub mod threads;
pub mod tools;
mod utf8;

use std::path::PathBuf;
use std::sync::Arc;

pub use cache::{ANSWER_CHUNK, Evaluated, PrefixCache, cuts, prompt_cuts};
pub use error::EngineError;
pub use llama::LlamaCpp;
pub use lookup::Speculate;
pub use message::{Message, Role, ToolCall};
pub use prompt::{Prompt, build_prompt, build_score_prefix, build_static_prompt};
pub use stop::{StopMatcher, Stopped};
pub use template::ChatTemplate;
pub use thread::{Class, EmbedJob, Engine, GenerateJob, Job, LoadedModel, PrefillJob, ScoreJob};
pub use threads::Threads;
pub use tools::{Grammar, Tool, ToolChoice, ToolFormat};
pub use utf8::Utf8Stream;

/// A token id in the model's vocabulary.
pub type Token = u32;

/// How to load one model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub path: PathBuf,
    /// Context size in tokens.
    pub n_ctx: u32,
    /// Threads per call: a fixed count, or chosen by measurement ([`threads`]).
    pub threads: Threads,
    /// Prompt tokens per batch (the fixed chunk size of prompt evaluation).
    pub batch: u32,
    /// Saved prefixes kept besides the live sequence.
    pub cache_slots: usize,
    pub cache_budget_bytes: usize,
    /// Probe at load which batch sizes decode bit-identically to single
    /// tokens (for drafting; see `lookup`), so the first generation that
    /// drafts need not empty the cache to find out.
    pub probe: bool,
    /// The model's later layers on other machines' RPC servers (a split
    /// engine only; see [`rpc`]); None: all of it here.
    pub split: Option<Split>,
    /// Generations decoded together, each on a sequence with a cache of
    /// `n_ctx` tokens of its own (1 to [`MAX_STREAMS`]).
    pub streams: u32,
    /// Where its chat template renders (revisd: in processes of their own).
    pub render: render::RenderPlace,
}

/// Where a split model's layers go: the last `remote_layers` repeating
/// layers onto `devices` (llama.cpp device indices from [`rpc::connect`]);
/// the embeddings, the first layers and the output layer stay here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub devices: Vec<usize>,
    pub remote_layers: u32,
}

/// Sampling settings, already validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    /// 1 = off.
    pub repeat_penalty: f32,
    pub repeat_last_n: u32,
    /// 0 = off (OpenAI's penalties, over the last `repeat_last_n` tokens).
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl Sampling {
    pub fn greedy() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended its turn.
    End,
    /// max_tokens reached or the context is full.
    Length,
    /// A stop string matched.
    Stop,
    /// The caller went away or the engine is shutting down.
    Cancelled,
}

/// A piece of streamed text.
#[derive(Clone, Debug, PartialEq)]
pub struct Delta {
    pub text: String,
    /// Tokens generated since the previous delta.
    pub tokens: u32,
    /// Those tokens with their log-probabilities, when the job asked
    /// ([`GenerateJob::logprobs`]); empty otherwise.
    pub logprobs: Vec<TokenInfo>,
}

/// One token as the model saw it: its bytes (a piece of a UTF-8 character
/// is possible; a token that ends the turn has none), its natural-log
/// probability under the model's own distribution (the raw logits, before
/// any sampling setting), and the likeliest alternatives at its position.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenInfo {
    pub piece: Vec<u8>,
    pub logprob: f64,
    /// Most likely first; empty unless asked.
    pub top: Vec<(Vec<u8>, f64)>,
}

/// At most this many alternatives per position (`top_logprobs`).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// The longest text [`Session::embed`] takes, in tokens: the embedding
/// context evaluates a text in one batch of this size.
pub const MAX_EMBED_TOKENS: usize = 512;

#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub reason: FinishReason,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub generated_tokens: u32,
    /// From the start to the first token, and from there to the end; with
    /// other streams running, both include their steps taken meanwhile.
    pub prompt_us: u64,
    pub generate_us: u64,
    pub text: String,
    /// Tokens drafted from the context and verified ([`lookup`]), and how
    /// many of them the model kept.
    pub draft_tokens: u32,
    pub draft_accepted: u32,
    /// The most streams that shared one step with this one, itself included.
    pub batch_peak: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Prefilled {
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub elapsed_us: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    pub logprob: f64,
    /// Each continuation token with its log-probability (and alternatives, when asked).
    pub tokens: Vec<TokenInfo>,
    pub prefix_tokens: u32,
}

/// Cache and memory figures of one loaded model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelStats {
    /// Saved prefixes plus the live sequence, if it holds anything.
    pub cached_prefixes: u32,
    pub cache_bytes: u64,
    pub n_ctx: u32,
    /// The threads a single token's step runs on now ([`threads`]).
    pub threads: u32,
}

/// Read-only half of a loaded model, safe to use from any thread: chat
/// template and tokenizer. Used to validate and tokenize requests before
/// they are queued.
pub trait Tokenizer: Send + Sync {
    /// Renders messages, and the functions the model may call, with the
    /// model's chat template; with `add_generation_prompt` the text ends with
    /// the assistant's turn opening. `tools` are given only when
    /// [`Tokenizer::tool_format`] says the template renders them (else
    /// [`tools::plan`] has put them into the messages already).
    fn render(&self, messages: &[Message], tools: &[Tool], add_generation_prompt: bool) -> Result<String, EngineError>;
    /// How this model's template offers functions and how its calls are
    /// written (see [`tools`]); by default it offers none, and calls are
    /// written in revis's generic (Hermes) form.
    fn tool_format(&self) -> ToolFormat {
        ToolFormat { native: false, syntax: tools::ToolSyntax::Hermes }
    }
    /// Refuses a grammar the backend cannot compile (before the request is
    /// queued; the engine builds a lazy grammar only when its trigger comes).
    fn check_grammar(&self, _grammar: &Grammar) -> Result<(), EngineError> {
        Ok(())
    }
    /// Tokenizes text; template markers are parsed as special tokens.
    fn tokenize(&self, text: &str, add_bos: bool) -> Vec<Token>;
    /// Tokenizes plain text (no special tokens, no BOS), e.g. a continuation to score.
    fn tokenize_plain(&self, text: &str) -> Vec<Token>;
    /// The context size the model was loaded with.
    fn n_ctx(&self) -> u32;
    /// Compiles a JSON-output constraint (any JSON, or JSON matching `schema`)
    /// into the backend's grammar form, rejecting what cannot be compiled.
    fn json_grammar(&self, schema: Option<&str>) -> Result<String, EngineError>;
}

/// A generation running on a session, between decode steps.
pub type StreamId = usize;

/// The most generations one model decodes together (`daemon.streams`).
pub const MAX_STREAMS: u32 = 16;

/// What one [`Session::join`] did.
#[derive(Debug, Default)]
pub struct Joined {
    /// The streams whose prompt batch it evaluated (all of the same length).
    pub advanced: Vec<StreamId>,
    /// Those that ended: at their first token, or with an error.
    pub ended: Vec<(StreamId, Result<Finished, EngineError>)>,
}

/// The engine-thread half of a loaded model: owns its context and caches.
/// Not `Sync`; only the engine thread touches it.
///
/// Generations run as streams that decode together: [`Session::start`]
/// takes a sequence for a prompt, [`Session::join`] evaluates the next
/// batch of the prompts still joining (those whose batches are as long go
/// together, in one `llama_decode`) and picks a stream's first token when
/// its prompt is done, and each [`Session::step`] decodes one batch with a
/// token (or a verified draft) of each decoding stream it is given. A stream's text and tokens never depend on which others share
/// its steps beyond what llama.cpp's kernels do with the batch's shape (see
/// ARCHITECTURE.md, "Architecture invariants").
pub trait Session: Send {
    /// How many generations can run at once.
    fn streams(&self) -> usize;
    /// Whether a sequence is free for a generation, a prefill or a score.
    fn has_free_sequence(&self) -> bool;
    /// Starts a generation on a free sequence (the one holding most of its
    /// prompt): it joins, and [`Session::join`] evaluates its prompt.
    fn start(&mut self, job: GenerateJob) -> Result<StreamId, EngineError>;
    /// Whether `stream` is still joining (its prompt not all evaluated).
    fn joining(&self, stream: StreamId) -> bool;
    /// Evaluates the next prompt batch of joining streams, in one
    /// `llama_decode` of at most the model's batch size: the first of
    /// `streams` (the caller puts a person's first) and every other whose
    /// next batch is as long, while they fit. A stream whose prompt is done
    /// picks its first token (its text goes through `emit`; false: the
    /// receiver has gone) and decodes from the next [`Session::step`].
    /// Returns the streams advanced and those that ended; on an error
    /// every stream advanced has ended without an answer.
    fn join(&mut self, streams: &[StreamId], emit: &mut dyn FnMut(StreamId, Delta) -> bool) -> Joined;
    /// Decodes one step of `streams` (decoding, none joining) in one batch;
    /// returns those that ended. On an error every one of them has ended
    /// without an answer.
    fn step(
        &mut self,
        streams: &[StreamId],
        emit: &mut dyn FnMut(StreamId, Delta) -> bool,
    ) -> Result<Vec<(StreamId, Finished)>, EngineError>;
    /// Ends a stream now (its reason: cancelled).
    fn cancel(&mut self, stream: StreamId) -> Finished;
    fn prefill(&mut self, prompt: &Prompt, cancelled: &dyn Fn() -> bool) -> Result<Prefilled, EngineError>;
    /// Scores each continuation after the same prefix, which is evaluated
    /// once; `top` alternatives per position. The numbers are the same
    /// whether or not the prefix was cached, and the same as scoring each
    /// continuation on its own. `cancelled` is polled between batches.
    fn score(
        &mut self,
        prefix: &Prompt,
        continuations: &[Vec<Token>],
        top: u32,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Vec<Scored>, EngineError>;
    /// Each text's embedding: the model's last hidden states mean-pooled
    /// over its tokens and L2-normalised (unit length). Each text is at
    /// most [`MAX_EMBED_TOKENS`] tokens. The generation cache is left as
    /// it was (a context of its own, made on first use, holds the texts).
    fn embed(&mut self, texts: &[Vec<Token>], cancelled: &dyn Fn() -> bool) -> Result<Vec<Vec<f32>>, EngineError>;
    /// Drops cached prefixes; returns (prefixes, bytes) dropped.
    fn purge(&mut self) -> (u32, u64);
    fn stats(&self) -> ModelStats;
    /// Whether the calls that follow carry background work only (nobody
    /// waits for it): they then run on fewer threads ([`threads`]).
    fn set_background(&mut self, _background: bool) {}
}

/// A loaded model: its shared tokenizer and its engine-thread session.
pub type Loaded = (Arc<dyn Tokenizer>, Box<dyn Session>);

/// An inference backend (llama.cpp here; MLX on macOS later).
pub trait Backend: Send + Sync + 'static {
    /// Loads a model. Called on the engine thread only.
    fn load(&self, spec: &ModelSpec) -> Result<Loaded, EngineError>;
    /// Returns freed memory to the operating system after an unload.
    fn release_memory(&self) {}
}

/// Resident memory of this process in bytes (Linux: /proc/self/statm; 0 where unknown).
pub fn rss_bytes() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
            .map_or(0, |pages| pages * page)
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}
