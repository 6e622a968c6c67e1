//! The llama.cpp backend (`llama-cpp-2`): loading GGUF models, chat templates,
//! sampling, streaming, prefix reuse, prefill and scoring.

use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use llama_cpp_2::llama_backend::LlamaBackend as RawBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

use crate::cache::{Evaluated, PrefixCache};
use crate::{
    Backend, Delta, EngineError, FinishReason, Finished, GenerateJob, Loaded, MAX_EMBED_TOKENS, Message, ModelSpec, ModelStats, Prefilled,
    Prompt, Sampling, Scored, Session, StopMatcher, Stopped, Token, TokenInfo, Tokenizer, Utf8Stream,
};

/// Sequences shorter than this are not worth saving when they are evicted from the live slot.
const MIN_SAVED_TOKENS: usize = 32;

fn raw_backend() -> &'static RawBackend {
    static BACKEND: OnceLock<RawBackend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        let mut b = RawBackend::init().expect("llama.cpp backend initializes once per process");
        if std::env::var_os("REVIS_LLAMA_LOG").is_none() {
            b.void_logs();
        }
        b
    })
}

/// The llama.cpp backend. Runs on CPU here; a `metal` build uses the GPU on macOS.
#[derive(Debug, Default)]
pub struct LlamaCpp;

impl Backend for LlamaCpp {
    fn load(&self, spec: &ModelSpec) -> Result<Loaded, EngineError> {
        let load_err = |reason: String| EngineError::Load { path: spec.path.clone(), reason };
        if !spec.path.is_file() {
            return Err(load_err("no such file".into()));
        }
        let model =
            LlamaModel::load_from_file(raw_backend(), &spec.path, &LlamaModelParams::default()).map_err(|e| load_err(e.to_string()))?;
        let model = Arc::new(model);
        let template = match model.chat_template(None) {
            Ok(t) => t,
            // No template in the GGUF: use llama.cpp's built-in one for the architecture.
            Err(_) => {
                let arch = model.meta_val_str("general.architecture").unwrap_or_default();
                let name = if arch.starts_with("gemma") { "gemma" } else { "chatml" };
                LlamaChatTemplate::new(name).map_err(|e| load_err(e.to_string()))?
            }
        };
        let n_ctx = spec.n_ctx.min(model.n_ctx_train().max(1));
        let threads = spec.threads.max(1) as i32;
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(n_ctx))
            .with_n_batch(spec.batch)
            .with_n_ubatch(spec.batch)
            .with_n_threads(threads)
            .with_n_threads_batch(threads)
            .with_n_seq_max(1)
            // Keep the whole sliding-window cache (Gemma 3) so prefixes can be trimmed and restored.
            .with_swa_full(true);
        let ctx = model.new_context(raw_backend(), params).map_err(|e| load_err(e.to_string()))?;
        // SAFETY: the context borrows the model. The session owns an Arc of
        // the model and declares `ctx` before `model`, so the context is
        // dropped first and the model outlives every use of it.
        let ctx: LlamaContext<'static> = unsafe { std::mem::transmute::<LlamaContext<'_>, LlamaContext<'static>>(ctx) };
        let add_bos = model.vocab().should_add_bos();
        let tokenizer = Arc::new(LlamaTokenizer { model: model.clone(), template, n_ctx, add_bos });
        let session = LlamaSession {
            embed_ctx: None,
            ctx,
            model,
            threads,
            batch: LlamaBatch::new(spec.batch as usize, 1),
            chunk: spec.batch as usize,
            n_ctx,
            live: Evaluated::default(),
            saved: PrefixCache::new(spec.cache_slots, spec.cache_budget_bytes),
        };
        Ok((tokenizer, Box::new(session)))
    }

    fn release_memory(&self) {
        // glibc keeps freed pages; hand them back so an unload shows in RSS.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

struct LlamaTokenizer {
    model: Arc<LlamaModel>,
    template: LlamaChatTemplate,
    n_ctx: u32,
    add_bos: bool,
}

impl Tokenizer for LlamaTokenizer {
    fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, EngineError> {
        if messages.is_empty() {
            return Ok(String::new());
        }
        let chat = messages
            .iter()
            .map(|m| LlamaChatMessage::new(m.role.as_str().to_owned(), m.content.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| EngineError::Template(e.to_string()))?;
        self.model.apply_chat_template(&self.template, &chat, add_generation_prompt).map_err(|e| EngineError::Template(e.to_string()))
    }

    fn tokenize(&self, text: &str, add_bos: bool) -> Vec<Token> {
        to_ids(self.model.vocab().tokenize(text.as_bytes(), add_bos && self.add_bos, true))
    }

    fn tokenize_plain(&self, text: &str) -> Vec<Token> {
        to_ids(self.model.vocab().tokenize(text.as_bytes(), false, false))
    }

    fn n_ctx(&self) -> u32 {
        self.n_ctx
    }

    fn json_grammar(&self, schema: Option<&str>) -> Result<String, EngineError> {
        let schema = schema.unwrap_or(r#"{"type":"object"}"#);
        let value: serde_json::Value = serde_json::from_str(schema).map_err(|e| EngineError::InvalidSchema(format!("not JSON: {e}")))?;
        if !value.is_object() {
            return Err(EngineError::InvalidSchema("a JSON schema must be a JSON object".into()));
        }
        let grammar = llama_cpp_2::json_schema_to_grammar(schema).map_err(|e| EngineError::InvalidSchema(e.to_string()))?;
        // Compile it once here so a grammar llama.cpp rejects fails before queueing.
        LlamaSampler::grammar(&self.model, &grammar, "root").map_err(|e| EngineError::InvalidSchema(e.to_string()))?;
        Ok(grammar)
    }
}

fn to_ids(tokens: Vec<LlamaToken>) -> Vec<Token> {
    tokens.into_iter().map(|t| t.0 as Token).collect()
}

struct LlamaSession {
    // Declared before `model`: dropped first (see the SAFETY note in `load`).
    /// The context that embeds texts, made on the first `embed`.
    embed_ctx: Option<LlamaContext<'static>>,
    ctx: LlamaContext<'static>,
    model: Arc<LlamaModel>,
    threads: i32,
    batch: LlamaBatch<'static>,
    chunk: usize,
    n_ctx: u32,
    /// What sequence 0 of the KV cache holds now.
    live: Evaluated,
    saved: PrefixCache<SeqState>,
}

impl LlamaSession {
    /// Makes sequence 0 hold the longest reusable prefix of `tokens` (at most
    /// `limit` tokens), restoring a saved prefix if that gives more. Returns
    /// how many tokens are already evaluated. With `save`, what the live
    /// sequence loses is saved as a cached prefix first (when worth it).
    fn reuse(&mut self, tokens: &[Token], cuts: &[usize], limit: usize, save: bool) -> Result<usize, EngineError> {
        let from_live = self.live.reusable(tokens, cuts, limit);
        if save && from_live < self.live.len() {
            // Save what is about to be cut first: saving may evict entries, so
            // a saved entry is chosen only afterwards.
            self.save_live();
        }
        let from_saved = self.saved.best(tokens, cuts, limit).filter(|&(_, n)| n > from_live);
        let n = match from_saved {
            Some((index, n)) => {
                // Forget what the sequence held before touching it, so an error
                // below never leaves stale bookkeeping behind.
                self.live = Evaluated::default();
                self.ctx.clear_kv_cache_seq(Some(0), None, None).map_err(llama_err)?;
                let saved = self.saved.get(index);
                self.ctx.state_seq_set(&saved.state, 0).map_err(llama_err)?;
                self.live = saved.seq.clone();
                n
            }
            None => from_live,
        };
        if n < self.live.len() {
            let trimmed = self.ctx.clear_kv_cache_seq(Some(0), Some(n as u32), None).map_err(llama_err)?;
            if !trimmed {
                // This model's cache cannot be trimmed part-way: start over.
                self.live = Evaluated::default();
                self.ctx.clear_kv_cache_seq(Some(0), None, None).map_err(llama_err)?;
                return Ok(0);
            }
        }
        self.live.truncate(n);
        Ok(n)
    }

    /// Saves the live sequence as a cached prefix before it is cut, if it is
    /// long enough and no saved prefix already holds it.
    fn save_live(&mut self) {
        if self.live.len() < MIN_SAVED_TOKENS || self.saved.covers(&self.live) {
            return;
        }
        // Ask the size first: copying a state that cannot be kept is wasted work.
        if self.ctx.state_seq_get_size_ext(0, LlamaStateSeqFlags::empty()) > self.saved.budget_bytes() {
            return;
        }
        match self.ctx.state_seq_get(0, LlamaStateSeqFlags::empty()) {
            Ok(state) if state.byte_len() <= self.saved.budget_bytes() => {
                let bytes = state.byte_len();
                self.saved.insert(self.live.clone(), state, bytes);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("could not save a cached prefix: {e}"),
        }
    }

    /// Evaluates `tokens[from..]` batch by batch at `cuts`. `wants_logits(pos)`
    /// says which positions need logits; `after_batch(session, start)` runs
    /// after each batch. Returns false if cancelled between batches.
    fn evaluate(
        &mut self,
        tokens: &[Token],
        cuts: &[usize],
        from: usize,
        wants_logits: &dyn Fn(usize) -> bool,
        after_batch: &mut dyn FnMut(&Self, usize, usize) -> Result<(), EngineError>,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<bool, EngineError> {
        let mut start = from;
        for &end in cuts.iter().filter(|&&c| c > from) {
            if cancelled() {
                return Ok(false);
            }
            self.batch.clear();
            for (pos, &token) in tokens.iter().enumerate().take(end).skip(start) {
                self.batch.add(LlamaToken(token as i32), pos as i32, &[0], wants_logits(pos)).map_err(llama_err)?;
            }
            self.ctx.decode(&mut self.batch).map_err(llama_err)?;
            self.live.push_batch(&tokens[start..end]);
            after_batch(self, start, end)?;
            start = end;
        }
        Ok(true)
    }

    fn check_fits(&self, tokens: usize) -> Result<(), EngineError> {
        if tokens >= self.n_ctx as usize {
            return Err(EngineError::PromptTooLong { tokens, n_ctx: self.n_ctx });
        }
        Ok(())
    }

    fn sampler(&self, s: &Sampling, grammar: Option<&str>) -> Result<LlamaSampler, EngineError> {
        let mut chain = Vec::new();
        if s.repeat_penalty != 1.0 {
            chain.push(LlamaSampler::penalties(self.model.n_vocab(), s.repeat_last_n as i32, s.repeat_penalty, 0.0, 0.0));
        }
        if let Some(g) = grammar {
            chain.push(LlamaSampler::grammar(&self.model, g, "root").map_err(|e| EngineError::Grammar(e.to_string()))?);
        }
        if s.temperature <= 0.0 {
            chain.push(LlamaSampler::greedy());
        } else {
            if s.top_k > 0 {
                chain.push(LlamaSampler::top_k(s.top_k as i32));
            }
            chain.push(LlamaSampler::top_p(s.top_p, 1));
            chain.push(LlamaSampler::min_p(s.min_p, 1));
            chain.push(LlamaSampler::temp(s.temperature));
            // llama.cpp reads u32::MAX as "pick a random seed": never pass it.
            let seed = ((s.seed ^ (s.seed >> 32)) as u32).min(u32::MAX - 1);
            chain.push(LlamaSampler::dist(seed));
        }
        Ok(LlamaSampler::chain_simple(chain))
    }
}

impl Session for LlamaSession {
    fn generate(
        &mut self,
        job: &GenerateJob,
        emit: &mut dyn FnMut(Delta) -> bool,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Finished, EngineError> {
        let tokens = &job.prompt.tokens;
        self.check_fits(tokens.len())?;
        if tokens.is_empty() {
            return Err(EngineError::Template("the prompt is empty".into()));
        }
        let mut sampler = self.sampler(&job.sampling, job.grammar.as_deref())?;
        // Plain greedy needs no sampler chain: an argmax over the logits
        // costs a fraction of building the 50k-entry candidate array.
        let plain_greedy = job.sampling.temperature <= 0.0 && job.grammar.is_none() && job.sampling.repeat_penalty == 1.0;
        let started = Instant::now();
        let cuts = job.prompt.cuts(self.chunk);
        let cached = self.reuse(tokens, &cuts, tokens.len() - 1, true)?;
        let last = tokens.len() - 1;
        let mut finished = Finished {
            reason: FinishReason::Cancelled,
            prompt_tokens: tokens.len() as u32,
            cached_tokens: cached as u32,
            generated_tokens: 0,
            prompt_us: 0,
            generate_us: 0,
            text: String::new(),
        };
        if !self.evaluate(tokens, &cuts, cached, &|p| p == last, &mut |_, _, _| Ok(()), cancelled)? {
            finished.prompt_us = started.elapsed().as_micros() as u64;
            return Ok(finished);
        }
        finished.prompt_us = started.elapsed().as_micros() as u64;
        let decoding = Instant::now();

        let vocab = self.model.vocab();
        let mut utf8 = Utf8Stream::default();
        let mut stop = StopMatcher::new(job.stop.clone());
        let mut unsent = 0u32;
        // Log-probabilities of the tokens not yet sent, when asked.
        let mut infos: Vec<TokenInfo> = Vec::new();
        let mut piece = Vec::with_capacity(16);
        let mut idx = self.batch.n_tokens() - 1;
        let reason = loop {
            if cancelled() {
                break FinishReason::Cancelled;
            }
            let token = if plain_greedy { argmax(self.ctx.get_logits_ith(idx)) } else { sampler.sample(&self.ctx, idx) };
            if let Some(top) = job.logprobs {
                let mut info = token_info(&self.model, self.ctx.get_logits_ith(idx), token.0 as usize, top as usize);
                if vocab.is_eog(token) {
                    info.piece.clear();
                }
                infos.push(info);
            }
            if vocab.is_eog(token) {
                break FinishReason::End;
            }
            finished.generated_tokens += 1;
            unsent += 1;
            piece.clear();
            vocab.token_to_piece_into(token, &mut piece, false, None);
            let text = utf8.push(&piece);
            match stop.push(&text) {
                Stopped::Yes(before) => {
                    if !before.is_empty() {
                        finished.text.push_str(&before);
                        emit(Delta { text: before, tokens: unsent, logprobs: std::mem::take(&mut infos) });
                    }
                    unsent = 0;
                    break FinishReason::Stop;
                }
                Stopped::No(safe) if !safe.is_empty() => {
                    finished.text.push_str(&safe);
                    if !emit(Delta { text: safe, tokens: unsent, logprobs: std::mem::take(&mut infos) }) {
                        break FinishReason::Cancelled;
                    }
                    unsent = 0;
                }
                Stopped::No(_) => {}
            }
            if finished.generated_tokens >= job.max_tokens || self.live.len() + 1 >= self.n_ctx as usize {
                break FinishReason::Length;
            }
            let pos = self.live.len();
            self.batch.clear();
            self.batch.add(token, pos as i32, &[0], true).map_err(llama_err)?;
            self.ctx.decode(&mut self.batch).map_err(llama_err)?;
            self.live.push_batch(&[token.0 as Token]);
            idx = 0;
        };
        if reason != FinishReason::Stop {
            let mut rest = utf8.finish();
            rest = match stop.push(&rest) {
                Stopped::Yes(before) => before,
                Stopped::No(safe) => safe + &stop.finish(),
            };
            // Tokens with no text left to show (the turn's end, a held-back
            // piece) still bring their log-probabilities.
            if (!rest.is_empty() || !infos.is_empty()) && reason != FinishReason::Cancelled {
                finished.text.push_str(&rest);
                emit(Delta { text: rest, tokens: unsent, logprobs: std::mem::take(&mut infos) });
            }
        }
        finished.reason = reason;
        finished.generate_us = decoding.elapsed().as_micros() as u64;
        Ok(finished)
    }

    fn prefill(&mut self, prompt: &Prompt, cancelled: &dyn Fn() -> bool) -> Result<Prefilled, EngineError> {
        let started = Instant::now();
        let tokens = &prompt.tokens;
        self.check_fits(tokens.len())?;
        let cuts = prompt.cuts(self.chunk);
        // A later request always has more tokens, so the whole prefill may be reused.
        let cached = self.reuse(tokens, &cuts, tokens.len(), true)?;
        if !self.evaluate(tokens, &cuts, cached, &|_| false, &mut |_, _, _| Ok(()), cancelled)? {
            return Err(EngineError::Stopped);
        }
        Ok(Prefilled { prompt_tokens: tokens.len() as u32, cached_tokens: cached as u32, elapsed_us: started.elapsed().as_micros() as u64 })
    }

    fn score(
        &mut self,
        prefix: &Prompt,
        continuations: &[Vec<Token>],
        top: u32,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Vec<Scored>, EngineError> {
        if continuations.is_empty() || continuations.iter().any(|c| c.is_empty()) {
            return Err(EngineError::EmptyContinuation);
        }
        let (prompt, prefix) = (prefix, &prefix.tokens[..]);
        if prefix.is_empty() {
            return Err(EngineError::Template("the prefix to score after is empty".into()));
        }
        let longest = continuations.iter().map(Vec::len).max().unwrap_or(0);
        self.check_fits(prefix.len() + longest)?;
        let top = top.min(crate::MAX_TOP_LOGPROBS) as usize;
        let model = self.model.clone();
        let first = prefix.len() - 1; // the position whose logits predict each continuation's first token
        // The prefix's batches are the prompt's own (as Generate cuts a
        // prompt and an answer already begun), whatever the continuation;
        // each continuation follows in chunks from `prefix.len()`. So the
        // prefix is evaluated once, as a cold request would, and a cache a
        // Generate of the same text left behind is reused.
        let prefix_cuts = prompt.cuts(self.chunk);
        let mut out = Vec::with_capacity(continuations.len());
        let mut predicts_first: Option<Vec<f32>> = None;
        for continuation in continuations {
            let all: Vec<Token> = prefix.iter().chain(continuation).copied().collect();
            let mut cuts = prefix_cuts.clone();
            cuts.extend(crate::cuts(prefix.len(), all.len(), self.chunk).into_iter().filter(|&c| c > prefix.len()));
            let last = all.len() - 2;
            let limit = if predicts_first.is_some() { prefix.len() } else { first };
            // Only the first continuation may save what the sequence held
            // before; the others would save the previous continuation.
            let cached = self.reuse(&all, &cuts, limit, predicts_first.is_none())?;
            let mut scored: Vec<TokenInfo> = Vec::with_capacity(continuation.len());
            if cached > first {
                let logits = predicts_first.as_deref().expect("the prefix was evaluated with its last logits kept");
                scored.push(token_info(&model, logits, all[first + 1] as usize, top));
            }
            let mut collect = |s: &Self, start: usize, end: usize| -> Result<(), EngineError> {
                for pos in start.max(first)..end.min(last + 1) {
                    let logits = s.ctx.get_logits_ith((pos - start) as i32);
                    if pos == first {
                        predicts_first = Some(logits.to_vec());
                    }
                    scored.push(token_info(&model, logits, all[pos + 1] as usize, top));
                }
                Ok(())
            };
            if !self.evaluate(&all, &cuts, cached, &|p| p >= first && p <= last, &mut collect, cancelled)? {
                return Err(EngineError::Stopped);
            }
            out.push(Scored { logprob: scored.iter().map(|t| t.logprob).sum(), tokens: scored, prefix_tokens: prefix.len() as u32 });
        }
        Ok(out)
    }

    fn embed(&mut self, texts: &[Vec<Token>], cancelled: &dyn Fn() -> bool) -> Result<Vec<Vec<f32>>, EngineError> {
        if let Some(t) = texts.iter().find(|t| t.len() > MAX_EMBED_TOKENS || t.is_empty()) {
            return Err(EngineError::EmbedTooLong { tokens: t.len(), limit: MAX_EMBED_TOKENS });
        }
        if self.embed_ctx.is_none() {
            let n = (MAX_EMBED_TOKENS as u32).min(self.model.n_ctx_train().max(1));
            let params = LlamaContextParams::default()
                .with_n_ctx(NonZeroU32::new(n))
                .with_n_batch(n)
                .with_n_ubatch(n)
                .with_n_threads(self.threads)
                .with_n_threads_batch(self.threads)
                .with_n_seq_max(1)
                .with_embeddings(true)
                .with_pooling_type(LlamaPoolingType::Mean);
            let ctx = self.model.new_context(raw_backend(), params).map_err(llama_err)?;
            // SAFETY: as for `ctx` in `load`: the field is declared before
            // `model`, so this context is dropped before the model it borrows.
            self.embed_ctx = Some(unsafe { std::mem::transmute::<LlamaContext<'_>, LlamaContext<'static>>(ctx) });
        }
        let ctx = self.embed_ctx.as_mut().expect("made above");
        let mut batch = LlamaBatch::new(MAX_EMBED_TOKENS, 1);
        let mut out = Vec::with_capacity(texts.len());
        for text in texts {
            if cancelled() {
                return Err(EngineError::Stopped);
            }
            ctx.clear_kv_cache();
            batch.clear();
            for (pos, &token) in text.iter().enumerate() {
                batch.add(LlamaToken(token as i32), pos as i32, &[0], true).map_err(llama_err)?;
            }
            ctx.decode(&mut batch).map_err(llama_err)?;
            let pooled = ctx.embeddings_seq_ith(0).map_err(llama_err)?;
            let norm = pooled.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
            out.push(if norm > 0.0 { pooled.iter().map(|&x| (f64::from(x) / norm) as f32).collect() } else { pooled.to_vec() });
        }
        Ok(out)
    }

    fn purge(&mut self) -> (u32, u64) {
        let (n, bytes) = self.saved.clear();
        let live = u32::from(!self.live.is_empty());
        self.ctx.clear_kv_cache();
        self.live = Evaluated::default();
        (n as u32 + live, bytes as u64)
    }

    fn stats(&self) -> ModelStats {
        ModelStats {
            cached_prefixes: self.saved.len() as u32 + u32::from(!self.live.is_empty()),
            cache_bytes: self.saved.total_bytes() as u64,
            n_ctx: self.n_ctx,
        }
    }
}

/// A token's piece and log-probability under `logits` (a log-softmax over
/// the whole vocabulary), and the `top` likeliest tokens there.
fn token_info(model: &LlamaModel, logits: &[f32], token: usize, top: usize) -> TokenInfo {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = logits.iter().map(|&l| ((l as f64) - max).exp()).sum::<f64>().ln();
    let logprob = |i: usize| logits[i] as f64 - max - log_sum;
    let piece = |i: usize| model.vocab().token_to_piece(LlamaToken(i as i32), false, None);
    let mut best: Vec<usize> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if best.len() < top || l > logits[best[best.len() - 1]] {
                let at = best.partition_point(|&b| logits[b] >= l);
                best.insert(at, i);
                best.truncate(top);
            }
        }
    }
    TokenInfo { piece: piece(token), logprob: logprob(token), top: best.into_iter().map(|i| (piece(i), logprob(i))).collect() }
}

/// The first token with the highest logit, as llama.cpp's greedy sampler picks.
fn argmax(logits: &[f32]) -> LlamaToken {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    LlamaToken(best as i32)
}

fn llama_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Llama(e.to_string())
}
