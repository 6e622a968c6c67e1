//! The llama.cpp backend (`llama-cpp-2`): loading GGUF models, chat templates,
//! sampling, streaming, prefix reuse, prefill and scoring.
//!
//! This room holds the engine-thread session's state ([`LlamaSession`]:
//! its context, sequences and running generations) and the rooms that work
//! on it, one job each: [`load`] makes a model's tokenizer and session,
//! [`tokenizer`] renders and tokenizes (with its grammar caches), [`kv`]
//! places prompts on the cache's sequences and reuses prefixes, [`pick`]
//! picks tokens (the lazy grammar, sampling), [`draft`] keeps drafting
//! exact, [`stream`] starts, joins and steps generations, [`score`]
//! prefills, scores, embeds and purges, [`pacer`] sets each call's threads,
//! and [`session`] answers the engine thread's [`crate::Session`] calls with
//! them.

mod draft;
mod kv;
mod load;
mod pacer;
mod pick;
mod score;
mod session;
mod stream;
mod tokenizer;

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::session::SeqState;
use llama_cpp_2::llama_backend::LlamaBackend as RawBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use crate::cache::{Evaluated, PrefixCache};
use crate::lookup::{BatchCosts, Speculation};
use crate::{EngineError, Finished, GenerateJob, StopMatcher, Token, TokenInfo, Utf8Stream};
use pacer::Pacer;
use pick::Picker;

pub use load::LlamaCpp;

pub(crate) fn raw_backend() -> &'static RawBackend {
    static BACKEND: OnceLock<RawBackend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        let mut b = RawBackend::init().expect("llama.cpp backend initializes once per process");
        if std::env::var_os("REVIS_LLAMA_LOG").is_none() {
            b.void_logs();
        }
        b
    })
}

/// A loaded model on the engine thread: its context, the sequences of its
/// KV cache with the generations running on them, and the saved prefixes.
struct LlamaSession {
    // Declared before `model`: dropped first (see the SAFETY note in `load`).
    /// The context that embeds texts, made on the first `embed`, with its thread counts.
    embed_ctx: Option<(LlamaContext<'static>, Pacer)>,
    ctx: LlamaContext<'static>,
    model: Arc<LlamaModel>,
    /// The most threads a call may get.
    threads: i32,
    /// The thread count of each call ([`Pacer::decode`]).
    pacer: Pacer,
    batch: LlamaBatch<'static>,
    chunk: usize,
    /// Context of each sequence, in tokens.
    n_ctx: u32,
    /// The KV cache's sequences, one per stream: what each holds.
    seqs: Vec<Seq>,
    /// The generation running on each sequence.
    gens: Vec<Option<Gen>>,
    /// Counts uses of sequences, for least-recently-used choices.
    tick: u64,
    saved: PrefixCache<SeqState>,
    /// What decoding a batch of each size costs here (for drafting).
    costs: BatchCosts,
    /// The largest batch whose logits are bit-identical to decoding its
    /// tokens one at a time, on this model and machine ([`Self::probe`]);
    /// None until the first generation that drafts.
    exact_batch: Option<usize>,
    /// How often draft tokens were accepted, as of the last generation that
    /// drafted: the next one starts from it.
    accept: f64,
}

/// One sequence of the KV cache.
#[derive(Default)]
struct Seq {
    /// What it holds.
    live: Evaluated,
    /// A generation, prefill or score has it now.
    busy: bool,
    /// When it was last used ([`LlamaSession::tick`]).
    used: u64,
}

/// A generation in progress on one sequence, between decode steps.
struct Gen {
    seq: usize,
    job: GenerateJob,
    picker: Picker,
    utf8: Utf8Stream,
    stop: StopMatcher,
    /// Tokens generated since the last delta, with their log-probabilities
    /// when asked.
    unsent: u32,
    infos: Vec<TokenInfo>,
    finished: Finished,
    decoding: Instant,
    /// The prompt still being evaluated (None once it is, and the stream decodes).
    join: Option<Join>,
    /// Drafting (prompt lookup decoding): on, the text so far, the draft
    /// verified in the batch just decoded, and the decisions. A stream
    /// drafts only in a step it has to itself.
    speculate: bool,
    exact: usize,
    history: Vec<Token>,
    drafts: Vec<LlamaToken>,
    spec: Speculation,
    /// The model's tokens from the batch just decoded.
    picked: Vec<LlamaToken>,
    /// Where this stream's logits are in the batch just decoded.
    idx: i32,
    /// The token the next step feeds.
    next: LlamaToken,
}

/// A prompt joining its model's batch: where its batches end, how far it
/// is evaluated, and since when it waits.
struct Join {
    cuts: Vec<usize>,
    from: usize,
    started: Instant,
}

fn llama_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Llama(e.to_string())
}
