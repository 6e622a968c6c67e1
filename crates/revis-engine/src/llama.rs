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
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cache::{Evaluated, PrefixCache};
use crate::lookup::{self, BatchCosts, EXACT_CONTEXT, MAX_DRAFT, PRIOR_ACCEPT, Speculate, Speculation};
use crate::render::{RenderPlace, Renderers};
use crate::sample::{argmax, greedy_under, softmax, top_k_of};
use crate::threads::{Threads, Tuner};
use crate::{
    Backend, ChatTemplate, Delta, EngineError, FinishReason, Finished, GenerateJob, Joined, Loaded, MAX_EMBED_TOKENS, Message, ModelSpec,
    ModelStats, Prefilled, Prompt, Sampling, Scored, Session, StopMatcher, Stopped, StreamId, Token, TokenInfo, Tokenizer, Tool,
    ToolFormat, Utf8Stream,
};

/// How long the batch probe ([`LlamaSession::probe`]) may take before it
/// stops trying larger batches (it runs at load).
const PROBE_BUDGET: std::time::Duration = std::time::Duration::from_secs(1);

/// Sequences shorter than this are not worth saving when they are evicted from the live slot.
const MIN_SAVED_TOKENS: usize = 32;

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

/// The llama.cpp backend. Runs on CPU here; a `metal` build uses the GPU on macOS.
#[derive(Debug, Default)]
pub struct LlamaCpp;

impl Backend for LlamaCpp {
    fn load(&self, spec: &ModelSpec) -> Result<Loaded, EngineError> {
        let load_err = |reason: String| EngineError::Load { path: spec.path.clone(), reason };
        if !spec.path.is_file() {
            return Err(load_err("no such file".into()));
        }
        let mut params = std::pin::pin!(match &spec.split {
            None => LlamaModelParams::default(),
            // llama.cpp offloads from the end, the output layer first: one
            // more than the repeating layers wanted there.
            Some(split) => LlamaModelParams::default()
                .with_devices(&split.devices)
                .map_err(|e| load_err(e.to_string()))?
                .with_n_gpu_layers(split.remote_layers + 1),
        });
        if spec.split.is_some() {
            // ...but the output layer's weights stay here (its matrix is
            // vocabulary × embedding): then a token's hidden state crosses
            // the network, not its logits (a 49k-entry vocabulary's logits
            // are 192 KiB a token, the hidden state 2 KiB).
            params.as_mut().add_cpu_buft_override(c"^(output|token_embd)");
        }
        let model = LlamaModel::load_from_file(raw_backend(), &spec.path, &params).map_err(|e| load_err(e.to_string()))?;
        let model = Arc::new(model);
        let template = match model.chat_template(None).ok().and_then(|t| t.to_string().ok()) {
            // The model's own (Jinja), as Hugging Face renders it.
            Some(source) => {
                let special = |t: LlamaToken| String::from_utf8_lossy(&model.vocab().token_to_piece(t, true, None)).into_owned();
                let (bos, eos) = (special(model.vocab().bos()), special(model.vocab().eos()));
                let template = ChatTemplate::new(&source, &bos, &eos).map_err(|e| load_err(e.to_string()))?;
                let renderers = match &spec.render {
                    RenderPlace::Here => None,
                    RenderPlace::Child(child) => Some(Renderers::new(child.clone())),
                };
                Template::Jinja(Box::new(Jinja { template, source, renderers }))
            }
            // No template in the GGUF: llama.cpp's built-in one for the architecture.
            None => {
                let arch = model.meta_val_str("general.architecture").unwrap_or_default();
                let name = if arch.starts_with("gemma") { "gemma" } else { "chatml" };
                Template::Builtin(LlamaChatTemplate::new(name).map_err(|e| load_err(e.to_string()))?)
            }
        };
        let n_ctx = spec.n_ctx.min(model.n_ctx_train().max(1));
        let threads = spec.threads.most() as i32;
        let streams = spec.streams.clamp(1, crate::MAX_STREAMS);
        let params = LlamaContextParams::default()
            // One sequence per stream, each with a cache of its own of the
            // whole context (not one pool they share): a stream never runs
            // out of cells because of the others, and attends over its own.
            .with_n_ctx(NonZeroU32::new(n_ctx * streams))
            .with_n_seq_max(streams)
            .with_kv_unified(false)
            .with_n_batch(spec.batch)
            .with_n_ubatch(spec.batch)
            .with_n_threads(threads)
            .with_n_threads_batch(threads)
            // Keep the whole sliding-window cache (Gemma 3) so prefixes can be trimmed and restored.
            .with_swa_full(true);
        let ctx = model.new_context(raw_backend(), params).map_err(|e| load_err(e.to_string()))?;
        // SAFETY: the context borrows the model. The session owns an Arc of
        // the model and declares `ctx` before `model`, so the context is
        // dropped first and the model outlives every use of it.
        let ctx: LlamaContext<'static> = unsafe { std::mem::transmute::<LlamaContext<'_>, LlamaContext<'static>>(ctx) };
        let pacer = Pacer::new(&ctx, spec.threads);
        let add_bos = model.vocab().should_add_bos();
        let bos_text = String::from_utf8_lossy(&model.vocab().token_to_piece(model.vocab().bos(), true, None)).into_owned();
        let tokenizer = Arc::new(LlamaTokenizer {
            model: model.clone(),
            template,
            n_ctx,
            add_bos,
            bos_text,
            grammars: Default::default(),
            checked: Default::default(),
        });
        let mut session = LlamaSession {
            embed_ctx: None,
            ctx,
            model,
            threads,
            pacer,
            batch: LlamaBatch::new(spec.batch as usize, 1),
            chunk: spec.batch as usize,
            n_ctx,
            seqs: (0..streams).map(|_| Seq::default()).collect(),
            gens: (0..streams).map(|_| None).collect(),
            tick: 0,
            saved: PrefixCache::new(spec.cache_slots, spec.cache_budget_bytes),
            costs: BatchCosts::default(),
            exact_batch: None,
            accept: PRIOR_ACCEPT,
        };
        if spec.probe {
            // The cache is empty now: nothing to save or lose.
            session.exact_batch = Some(session.probe()?);
        }
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

/// A model's chat template: its own, or llama.cpp's built-in one where the
/// GGUF has none.
enum Template {
    Jinja(Box<Jinja>),
    Builtin(LlamaChatTemplate),
}

/// A model's own template: compiled here (it is checked at load, and tells
/// how functions are offered), rendered here or in rendering processes
/// ([`crate::render`]).
struct Jinja {
    template: ChatTemplate,
    source: String,
    renderers: Option<Renderers>,
}

struct LlamaTokenizer {
    model: Arc<LlamaModel>,
    template: Template,
    n_ctx: u32,
    add_bos: bool,
    /// Schemas compiled lately and their grammars, the latest first: an
    /// agent offers the same functions request after request.
    grammars: std::sync::Mutex<Vec<(String, String)>>,
    /// Function-call grammars that compiled lately, the latest first.
    checked: std::sync::Mutex<Vec<String>>,
    /// BOS as text, as a template writes it.
    bos_text: String,
}

/// Compiled grammars a tokenizer keeps ([`LlamaTokenizer::grammars`]).
const GRAMMARS_KEPT: usize = 16;

impl Tokenizer for LlamaTokenizer {
    fn render(&self, messages: &[Message], tools: &[Tool], add_generation_prompt: bool) -> Result<String, EngineError> {
        if messages.is_empty() {
            return Ok(String::new());
        }
        match &self.template {
            Template::Jinja(t) => {
                let text = match &t.renderers {
                    None => t.template.render(messages, tools, add_generation_prompt)?,
                    Some(r) => r.render(&t.source, &t.template.context(messages, tools, add_generation_prompt))?,
                };
                // The template writes BOS as text where tokenizing adds it
                // (Gemma's `{{ bos_token }}`): once is enough.
                match text.strip_prefix(self.bos_text.as_str()) {
                    Some(rest) if self.add_bos && !self.bos_text.is_empty() => Ok(rest.to_owned()),
                    _ => Ok(text),
                }
            }
            Template::Builtin(t) => {
                let chat = messages
                    .iter()
                    .map(|m| LlamaChatMessage::new(m.role.as_str().to_owned(), m.content.clone()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| EngineError::Template(e.to_string()))?;
                self.model.apply_chat_template(t, &chat, add_generation_prompt).map_err(|e| EngineError::Template(e.to_string()))
            }
        }
    }

    fn tool_format(&self) -> ToolFormat {
        match &self.template {
            Template::Jinja(t) => t.template.tool_format(),
            Template::Builtin(_) => ToolFormat { native: false, syntax: crate::tools::ToolSyntax::Hermes },
        }
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

    fn check_grammar(&self, grammar: &crate::Grammar) -> Result<(), EngineError> {
        let lock = || self.checked.lock().unwrap_or_else(|e| e.into_inner());
        if lock().contains(&grammar.text) {
            return Ok(());
        }
        LlamaSampler::grammar(&self.model, &grammar.text, "root")
            .map_err(|e| EngineError::Tools(format!("the functions' grammar does not compile: {e}")))?;
        let mut kept = lock();
        kept.insert(0, grammar.text.clone());
        kept.truncate(GRAMMARS_KEPT);
        Ok(())
    }

    fn json_grammar(&self, schema: Option<&str>) -> Result<String, EngineError> {
        let schema = schema.unwrap_or(r#"{"type":"object"}"#);
        let mut kept = self.grammars.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = kept.iter().position(|(s, _)| s == schema) {
            let hit = kept.remove(at);
            let grammar = hit.1.clone();
            kept.insert(0, hit);
            return Ok(grammar);
        }
        drop(kept);
        let grammar = self.compile_json_grammar(schema)?;
        let mut kept = self.grammars.lock().unwrap_or_else(|e| e.into_inner());
        kept.insert(0, (schema.to_owned(), grammar.clone()));
        kept.truncate(GRAMMARS_KEPT);
        Ok(grammar)
    }
}

impl LlamaTokenizer {
    /// A JSON schema's grammar, checked by compiling it once.
    fn compile_json_grammar(&self, schema: &str) -> Result<String, EngineError> {
        let value: serde_json::Value = serde_json::from_str(schema).map_err(|e| EngineError::InvalidSchema(format!("not JSON: {e}")))?;
        if !value.is_object() {
            return Err(EngineError::InvalidSchema("a JSON schema must be a JSON object".into()));
        }
        let grammar = llama_cpp_2::json_schema_to_grammar(schema).map_err(|e| EngineError::InvalidSchema(e.to_string()))?;
        // Compile it once here so a grammar llama.cpp rejects fails before queueing.
        LlamaSampler::grammar(&self.model, &grammar, "root")
            .map_err(|e| EngineError::InvalidSchema(crate::grammar::over_repetition_limit(&grammar).unwrap_or_else(|| e.to_string())))?;
        Ok(grammar)
    }
}

fn to_ids(tokens: Vec<LlamaToken>) -> Vec<Token> {
    tokens.into_iter().map(|t| t.0 as Token).collect()
}

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

impl LlamaSession {
    /// The free sequence to put `tokens` on: the one that holds the longest
    /// reusable prefix of it; among equals, the one that leaves the busy
    /// sequences in the fewest runs of consecutive ids (llama.cpp decodes
    /// each run as a ubatch of its own), then the least recently used. None
    /// when every sequence is busy.
    fn choose(&self, tokens: &[Token], cuts: &[usize], limit: usize) -> Option<usize> {
        let runs = |taken: usize| {
            let busy = |i: usize| i == taken || self.seqs[i].busy;
            (0..self.seqs.len()).filter(|&i| busy(i) && (i == 0 || !busy(i - 1))).count()
        };
        (0..self.seqs.len()).filter(|&i| !self.seqs[i].busy).max_by_key(|&i| {
            (self.seqs[i].live.reusable(tokens, cuts, limit), std::cmp::Reverse(runs(i)), std::cmp::Reverse(self.seqs[i].used))
        })
    }

    /// Takes a free sequence for `tokens` (see [`Self::choose`]) and makes it
    /// hold the longest reusable prefix of them (see [`Self::reuse`]).
    fn place(&mut self, tokens: &[Token], cuts: &[usize], limit: usize, save: bool) -> Result<(usize, usize), EngineError> {
        let seq = self.choose(tokens, cuts, limit).ok_or(EngineError::Llama("every sequence is busy".into()))?;
        self.tick += 1;
        self.seqs[seq].used = self.tick;
        let cached = self.reuse(seq, tokens, cuts, limit, save)?;
        Ok((seq, cached))
    }

    /// Makes sequence `seq` hold the longest reusable prefix of `tokens` (at
    /// most `limit` tokens), restoring a saved prefix if that gives more.
    /// Returns how many tokens are already evaluated. With `save`, what the
    /// sequence loses is saved as a cached prefix first (when worth it).
    fn reuse(&mut self, seq: usize, tokens: &[Token], cuts: &[usize], limit: usize, save: bool) -> Result<usize, EngineError> {
        let from_live = self.seqs[seq].live.reusable(tokens, cuts, limit);
        if save && from_live < self.seqs[seq].live.len() {
            // Save what is about to be cut first: saving may evict entries, so
            // a saved entry is chosen only afterwards.
            self.save_live(seq);
        }
        let id = Some(seq as u32);
        let from_saved = self.saved.best(tokens, cuts, limit).filter(|&(_, n)| n > from_live);
        let n = match from_saved {
            Some((index, n)) => {
                // Forget what the sequence held before touching it, so an error
                // below never leaves stale bookkeeping behind.
                self.seqs[seq].live = Evaluated::default();
                self.ctx.clear_kv_cache_seq(id, None, None).map_err(llama_err)?;
                let saved = self.saved.get(index);
                self.ctx.state_seq_set(&saved.state, seq as i32).map_err(llama_err)?;
                self.seqs[seq].live = saved.seq.clone();
                n
            }
            None => from_live,
        };
        if n < self.seqs[seq].live.len() {
            let trimmed = self.ctx.clear_kv_cache_seq(id, Some(n as u32), None).map_err(llama_err)?;
            if !trimmed {
                // This model's cache cannot be trimmed part-way: start over.
                self.seqs[seq].live = Evaluated::default();
                self.ctx.clear_kv_cache_seq(id, None, None).map_err(llama_err)?;
                return Ok(0);
            }
        }
        self.seqs[seq].live.truncate(n);
        Ok(n)
    }

    /// Saves sequence `seq` as a cached prefix before it is cut, if it is
    /// long enough and no saved prefix already holds it.
    fn save_live(&mut self, seq: usize) {
        let live = &self.seqs[seq].live;
        if live.len() < MIN_SAVED_TOKENS || self.saved.covers(live) {
            return;
        }
        // Ask the size first: copying a state that cannot be kept is wasted work.
        if self.ctx.state_seq_get_size_ext(seq as i32, LlamaStateSeqFlags::empty()) > self.saved.budget_bytes() {
            return;
        }
        match self.ctx.state_seq_get(seq as i32, LlamaStateSeqFlags::empty()) {
            Ok(state) if state.byte_len() <= self.saved.budget_bytes() => {
                let bytes = state.byte_len();
                self.saved.insert(self.seqs[seq].live.clone(), state, bytes);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("could not save a cached prefix: {e}"),
        }
    }

    /// Forgets what sequence `seq` holds (after an error left it unknown).
    fn forget(&mut self, seq: usize) {
        self.seqs[seq].live = Evaluated::default();
        self.seqs[seq].busy = false;
        if let Err(e) = self.ctx.clear_kv_cache_seq(Some(seq as u32), None, None) {
            tracing::warn!("could not clear sequence {seq}: {e}");
        }
    }

    /// Evaluates `tokens[from..]` on sequence `seq`, batch by batch at
    /// `cuts`. `wants_logits(pos)` says which positions need logits;
    /// `after_batch(session, start)` runs after each batch. Returns false if
    /// cancelled between batches.
    #[allow(clippy::too_many_arguments)]
    fn evaluate(
        &mut self,
        seq: usize,
        tokens: &[Token],
        cuts: &[usize],
        from: usize,
        wants_logits: &dyn Fn(usize) -> bool,
        after_batch: &mut dyn FnMut(&Self, usize, usize) -> Result<(), EngineError>,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<bool, EngineError> {
        let mut start = from;
        let id = [seq as i32];
        for &end in cuts.iter().filter(|&&c| c > from) {
            if cancelled() {
                return Ok(false);
            }
            self.batch.clear();
            for (pos, &token) in tokens.iter().enumerate().take(end).skip(start) {
                self.batch.add(LlamaToken(token as i32), pos as i32, &id, wants_logits(pos)).map_err(llama_err)?;
            }
            self.pacer.decode(&mut self.ctx, &mut self.batch).map_err(llama_err)?;
            self.seqs[seq].live.push_batch(&tokens[start..end]);
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

    /// How this job picks its tokens (see [`Picker`]).
    fn picker(&self, s: &Sampling, grammar: Option<&crate::Grammar>) -> Result<Picker, EngineError> {
        let penalize = s.repeat_penalty != 1.0 || s.presence_penalty != 0.0 || s.frequency_penalty != 0.0;
        if s.temperature <= 0.0 && grammar.is_none() && !penalize {
            return Ok(Picker::Argmax);
        }
        if let Some(g) = grammar
            && !g.triggers.is_empty()
            && s.temperature <= 0.0
            && !penalize
        {
            return Ok(Picker::Waiting(Box::new(Waiting {
                grammar: g.clone(),
                model: self.model.clone(),
                recent: std::collections::VecDeque::new(),
                seen: String::new(),
                grammar_made: None,
            })));
        }
        if let Some(g) = grammar
            && g.triggers.is_empty()
            && s.temperature <= 0.0
            && !penalize
        {
            let grammar = LlamaSampler::grammar(&self.model, &g.text, "root").map_err(|e| EngineError::Grammar(e.to_string()))?;
            return Ok(Picker::Strict(grammar));
        }
        let mut chain = Vec::new();
        if penalize {
            chain.push(LlamaSampler::penalties(
                self.model.n_vocab(),
                s.repeat_last_n as i32,
                s.repeat_penalty,
                s.frequency_penalty,
                s.presence_penalty,
            ));
        }
        if let Some(g) = grammar {
            let sampler = if g.triggers.is_empty() {
                LlamaSampler::grammar(&self.model, &g.text, "root")
            } else {
                LlamaSampler::grammar_lazy(&self.model, &g.text, "root", &g.triggers, &[])
            };
            chain.push(sampler.map_err(|e| EngineError::Grammar(e.to_string()))?);
        }
        if s.temperature <= 0.0 {
            chain.push(LlamaSampler::greedy());
            return Ok(Picker::Chain(LlamaSampler::chain_simple(chain)));
        }
        // Top-k first over the raw logits can be done here, on the logits
        // themselves, when nothing before it changes them.
        let top_k = (s.top_k > 0 && chain.is_empty()).then_some(s.top_k as usize);
        if s.top_k > 0 && top_k.is_none() {
            chain.push(LlamaSampler::top_k(s.top_k as i32));
        }
        chain.push(LlamaSampler::top_p(s.top_p, 1));
        chain.push(LlamaSampler::min_p(s.min_p, 1));
        chain.push(LlamaSampler::temp(s.temperature));
        Ok(Picker::Sampled(Box::new(Sampled {
            chain: LlamaSampler::chain_simple(chain),
            top_k,
            rng: StdRng::seed_from_u64(s.seed),
            p: Vec::new(),
        })))
    }

    /// Finds the largest batch, up to a token and [`MAX_DRAFT`] drafts, whose
    /// logits are bit-identical to decoding its tokens one at a time: a
    /// verified draft then leaves exactly the text and cache that plain
    /// decoding would. llama.cpp's CPU kernels depend on the batch's shape
    /// for some weight types (Gemma 3's Q4_K rows go through a different
    /// kernel from 4 rows on), so this is measured, not assumed: each size
    /// from 2 up, stopping at the first that differs. It also measures what
    /// each size costs. Runs on an empty sequence (what the cache held is
    /// saved as a prefix first, when worth it) in 10-50 token evaluations,
    /// trying no larger size once it has taken [`PROBE_BUDGET`].
    fn probe(&mut self) -> Result<usize, EngineError> {
        const PROBE_TEXT: &str = "A batch must give the very logits that one token at a time gives, or drafts would change the answer.";
        let n = MAX_DRAFT + 1;
        let text = to_ids(self.model.vocab().tokenize(PROBE_TEXT.as_bytes(), self.model.vocab().should_add_bos(), false));
        let started = Instant::now();
        self.save_live(0);
        self.seqs[0].live = Evaluated::default();
        self.ctx.clear_kv_cache_seq(Some(0), None, None).map_err(llama_err)?;
        if text.len() < n + 1 {
            return Ok(1);
        }
        let decode = |session: &mut Self, from: usize, to: usize, logits: bool| -> Result<Vec<Vec<f32>>, EngineError> {
            session.batch.clear();
            for (pos, &t) in text.iter().enumerate().take(to).skip(from) {
                session.batch.add(LlamaToken(t as i32), pos as i32, &[0], logits).map_err(llama_err)?;
            }
            let started = Instant::now();
            session.pacer.decode(&mut session.ctx, &mut session.batch).map_err(llama_err)?;
            session.costs.record(to - from, started.elapsed().as_secs_f64() * 1e6);
            Ok(if logits { (0..to - from).map(|i| session.ctx.get_logits_ith(i as i32).to_vec()).collect() } else { Vec::new() })
        };
        decode(self, 0, 1, false)?;
        let mut alone = Vec::with_capacity(n);
        for pos in 1..=n {
            alone.extend(decode(self, pos, pos + 1, true)?);
        }
        let mut exact = 1;
        for size in 2..=n {
            // A large model on a slow machine stops early: what was found
            // so far holds, larger drafts are just not verified.
            if started.elapsed() > PROBE_BUDGET {
                break;
            }
            self.ctx.clear_kv_cache_seq(Some(0), Some(1), None).map_err(llama_err)?;
            let batched = decode(self, 1, 1 + size, true)?;
            if batched.iter().zip(&alone).any(|(b, a)| b != a) {
                break;
            }
            exact = size;
        }
        self.ctx.clear_kv_cache_seq(Some(0), None, None).map_err(llama_err)?;
        tracing::debug!(exact, "batches up to this size decode bit-identically to single tokens");
        Ok(exact)
    }

    /// Drops the cache's tokens from `keep` on (rejected draft tokens). A
    /// model whose cache cannot be cut part-way has the kept text evaluated
    /// again; false then, so the caller stops drafting.
    fn rollback(&mut self, seq: usize, keep: usize, text: &[Token]) -> Result<bool, EngineError> {
        let id = Some(seq as u32);
        if self.ctx.clear_kv_cache_seq(id, Some(keep as u32), None).map_err(llama_err)? {
            self.seqs[seq].live.truncate(keep);
            return Ok(true);
        }
        self.seqs[seq].live = Evaluated::default();
        self.ctx.clear_kv_cache_seq(id, None, None).map_err(llama_err)?;
        let kept = &text[..keep];
        let cuts = crate::cuts(0, kept.len(), self.chunk);
        self.evaluate(seq, kept, &cuts, 0, &|_| false, &mut |_, _, _| Ok(()), &|| false)?;
        Ok(false)
    }
}

/// How a generation picks each token from the logits at a batch position
/// (a drafted token there is kept when it is the token picked).
enum Picker {
    /// Plain greedy: an argmax over the logits, no candidate array.
    Argmax,
    /// Greedy through llama.cpp's chain (grammar, repetition penalty).
    Chain(LlamaSampler),
    /// Greedy under a grammar (JSON output, a named function): see [`greedy_under`].
    Strict(LlamaSampler),
    /// Greedy with a lazy grammar (function calls, `auto`): see [`Waiting`].
    Waiting(Box<Waiting>),
    /// Sampling: llama.cpp's chain up to the temperature gives the
    /// distribution and revis draws from it, one uniform number per position
    /// ([`lookup::draw`]).
    Sampled(Box<Sampled>),
}

/// Greedy with a lazy grammar (function calls, `auto`): until the trigger
/// is written the grammar allows every token, so argmax picks them, with
/// no grammar made yet (llama.cpp's lazy grammar matches its triggers with
/// a regular expression at every token, and making it costs a few
/// milliseconds). When the text so far holds a trigger, the lazy grammar is
/// made and given the last tokens, where it finds the trigger as llama.cpp's
/// lazy grammar would have; from then on it picks ([`greedy_under`]). The
/// same tokens as llama.cpp's chain (the lazy grammar, then greedy) from
/// the first token.
struct Waiting {
    grammar: crate::Grammar,
    model: Arc<LlamaModel>,
    /// The last [`RECENT_TOKENS`] tokens, for the chain to find the trigger in.
    recent: std::collections::VecDeque<LlamaToken>,
    /// The end of the text so far, long enough to hold a trigger.
    seen: String,
    /// The lazy grammar, once made.
    grammar_made: Option<LlamaSampler>,
}

/// Tokens a trigger may span (a trigger is a word or two).
const RECENT_TOKENS: usize = 24;

impl Waiting {
    fn pick(&mut self, ctx: &LlamaContext<'_>, i: i32) -> LlamaToken {
        if let Some(grammar) = &mut self.grammar_made {
            return greedy_under(grammar, ctx.get_logits_ith(i));
        }
        let token = LlamaToken(argmax(ctx.get_logits_ith(i)) as i32);
        if self.recent.len() == RECENT_TOKENS {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
        self.seen.push_str(&String::from_utf8_lossy(&self.model.vocab().token_to_piece(token, true, None)));
        if self.grammar.triggers.iter().any(|t| self.seen.contains(t.as_str())) {
            let made = LlamaSampler::grammar_lazy(&self.model, &self.grammar.text, "root", &self.grammar.triggers, &[]);
            match made {
                Ok(mut grammar) => {
                    for &t in &self.recent {
                        grammar.accept(t);
                    }
                    self.grammar_made = Some(grammar);
                }
                // Checked when the request came (Tokenizer::check_grammar): not expected.
                Err(e) => tracing::warn!("a call's grammar failed to build: {e}; the answer goes on without it"),
            }
            self.grammar.triggers.clear();
        }
        let keep = self.grammar.triggers.iter().map(String::len).max().unwrap_or(0);
        if self.seen.len() > 2 * keep + 64 {
            let mut cut = self.seen.len() - keep;
            while !self.seen.is_char_boundary(cut) {
                cut -= 1;
            }
            self.seen.drain(..cut);
        }
        token
    }
}

struct Sampled {
    chain: LlamaSampler,
    /// Top-k done here on the logits (first in the chain), so the chain
    /// sees k candidates, not the whole vocabulary.
    top_k: Option<usize>,
    rng: StdRng,
    /// The distribution at the last position picked.
    p: Vec<(Token, f64)>,
}

impl Picker {
    /// The token at batch position `i`. A drafted token there is kept when
    /// it is this token (greedy: the argmax; sampled: the token drawn with
    /// the position's own uniform, so the text is the one the seed gives
    /// without drafts).
    fn pick(&mut self, ctx: &LlamaContext<'_>, i: i32) -> LlamaToken {
        match self {
            Picker::Argmax => LlamaToken(argmax(ctx.get_logits_ith(i)) as i32),
            Picker::Chain(chain) => chain.sample(ctx, i),
            Picker::Strict(grammar) => greedy_under(grammar, ctx.get_logits_ith(i)),
            Picker::Waiting(w) => w.pick(ctx, i),
            Picker::Sampled(sampled) => {
                let Sampled { chain, top_k, rng, p } = sampled.as_mut();
                let mut candidates = match *top_k {
                    Some(k) => LlamaTokenDataArray::new(top_k_of(ctx.get_logits_ith(i), k), true),
                    None => ctx.token_data_array_ith(i),
                };
                candidates.apply_sampler(chain);
                softmax(&candidates.data, p);
                // One uniform per position, drafted or not (lookup.rs).
                let token = LlamaToken(lookup::draw(p, rng.random()) as i32);
                chain.accept(token);
                token
            }
        }
    }
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

impl LlamaSession {
    /// Takes the tokens the batch just decoded gives stream `id` (see
    /// [`Picker::pick`]), streams their text, and says whether it is done;
    /// if not, its next token is set.
    fn pick(&mut self, id: StreamId, emit: &mut dyn FnMut(Delta) -> bool) -> Result<Option<FinishReason>, EngineError> {
        let mut g = self.gens[id].take().expect("a running stream");
        let reason = self.pick_into(&mut g, emit);
        self.gens[id] = Some(g);
        reason
    }

    fn pick_into(&mut self, g: &mut Gen, emit: &mut dyn FnMut(Delta) -> bool) -> Result<Option<FinishReason>, EngineError> {
        let model = self.model.clone();
        let vocab = model.vocab();
        // The token after the batch's first position, and one more for
        // each draft token the model agrees with.
        g.picked.clear();
        for i in 0..=g.drafts.len() {
            let token = g.picker.pick(&self.ctx, g.idx + i as i32);
            g.picked.push(token);
            if g.drafts.get(i) != Some(&token) {
                break;
            }
        }
        if !g.drafts.is_empty() {
            let accepted = g.picked.len() - 1;
            g.spec.record(g.drafts.len(), accepted);
            g.finished.draft_tokens += g.drafts.len() as u32;
            g.finished.draft_accepted += accepted as u32;
            if accepted < g.drafts.len() {
                let keep = self.seqs[g.seq].live.len() - (g.drafts.len() - accepted);
                g.speculate &= self.rollback(g.seq, keep, &g.history)?;
            }
        }
        let mut piece = Vec::with_capacity(16);
        for i in 0..g.picked.len() {
            let token = g.picked[i];
            if let Some(top) = g.job.logprobs {
                let mut info = token_info(&model, self.ctx.get_logits_ith(g.idx + i as i32), token.0 as usize, top as usize);
                if vocab.is_eog(token) {
                    info.piece.clear();
                }
                g.infos.push(info);
            }
            if vocab.is_eog(token) {
                return Ok(Some(FinishReason::End));
            }
            g.finished.generated_tokens += 1;
            g.unsent += 1;
            piece.clear();
            // Under a grammar a control token's text is part of the answer
            // (Mistral opens its calls with `[TOOL_CALLS]`, one token): the
            // grammar matched that text, so the answer says it too.
            vocab.token_to_piece_into(token, &mut piece, g.job.grammar.is_some(), None);
            let text = g.utf8.push(&piece);
            match g.stop.push(&text) {
                Stopped::Yes(before) => {
                    if !before.is_empty() {
                        g.finished.text.push_str(&before);
                        emit(Delta { text: before, tokens: g.unsent, logprobs: std::mem::take(&mut g.infos) });
                    }
                    g.unsent = 0;
                    return Ok(Some(FinishReason::Stop));
                }
                Stopped::No(safe) if !safe.is_empty() => {
                    g.finished.text.push_str(&safe);
                    if !emit(Delta { text: safe, tokens: g.unsent, logprobs: std::mem::take(&mut g.infos) }) {
                        return Ok(Some(FinishReason::Cancelled));
                    }
                    g.unsent = 0;
                }
                Stopped::No(_) => {}
            }
            if g.finished.generated_tokens >= g.job.max_tokens {
                return Ok(Some(FinishReason::Length));
            }
        }
        if self.seqs[g.seq].live.len() + 1 >= self.n_ctx as usize {
            return Ok(Some(FinishReason::Length));
        }
        g.next = *g.picked.last().expect("at least one token is picked");
        if g.speculate {
            g.history.extend(g.picked.iter().map(|t| t.0 as Token));
        }
        g.drafts.clear();
        Ok(None)
    }

    /// Ends stream `id`: the text held back is streamed (unless cancelled)
    /// and its sequence is free again, holding what it evaluated.
    fn finish(&mut self, id: StreamId, reason: FinishReason, emit: &mut dyn FnMut(Delta) -> bool) -> Finished {
        let mut g = self.gens[id].take().expect("a running stream");
        self.seqs[g.seq].busy = false;
        if reason != FinishReason::Stop {
            let mut rest = g.utf8.finish();
            rest = match g.stop.push(&rest) {
                Stopped::Yes(before) => before,
                Stopped::No(safe) => safe + &g.stop.finish(),
            };
            // Tokens with no text left to show (the turn's end, a held-back
            // piece) still bring their log-probabilities.
            if (!rest.is_empty() || !g.infos.is_empty()) && reason != FinishReason::Cancelled {
                g.finished.text.push_str(&rest);
                emit(Delta { text: rest, tokens: g.unsent, logprobs: std::mem::take(&mut g.infos) });
            }
        }
        if g.finished.draft_tokens > 0 {
            self.accept = g.spec.acceptance();
        }
        g.finished.reason = reason;
        match &g.join {
            // Cancelled before its prompt was done.
            Some(join) => g.finished.prompt_us = join.started.elapsed().as_micros() as u64,
            None => g.finished.generate_us = g.decoding.elapsed().as_micros() as u64,
        }
        g.finished
    }
}

impl LlamaSession {
    /// Ends streams without an answer (an error left their sequences unknown).
    fn drop_streams(&mut self, ids: &[StreamId]) {
        for &id in ids {
            if let Some(g) = self.gens[id].take() {
                self.forget(g.seq);
            }
        }
    }
}

impl Session for LlamaSession {
    fn streams(&self) -> usize {
        self.seqs.len()
    }

    fn has_free_sequence(&self) -> bool {
        self.seqs.iter().any(|s| !s.busy)
    }

    fn start(&mut self, job: GenerateJob) -> Result<StreamId, EngineError> {
        let tokens = &job.prompt.tokens;
        self.check_fits(tokens.len())?;
        if tokens.is_empty() {
            return Err(EngineError::Template("the prompt is empty".into()));
        }
        let picker = self.picker(&job.sampling, job.grammar.as_ref())?;
        let drafting = job.speculate != Speculate::Off;
        if drafting && self.exact_batch.is_none() && !self.seqs.iter().any(|s| s.busy) {
            // Before the prompt is placed: the probe empties sequence 0.
            self.exact_batch = Some(self.probe()?);
        }
        let started = Instant::now();
        let cuts = job.prompt.cuts(self.chunk);
        let (seq, cached) = self.place(tokens, &cuts, tokens.len() - 1, true)?;
        self.seqs[seq].busy = true;
        let finished = Finished {
            reason: FinishReason::Cancelled,
            prompt_tokens: tokens.len() as u32,
            cached_tokens: cached as u32,
            generated_tokens: 0,
            prompt_us: 0,
            generate_us: 0,
            text: String::new(),
            draft_tokens: 0,
            draft_accepted: 0,
            batch_peak: 1,
        };
        let exact = self.exact_batch.unwrap_or(1).min(self.chunk);
        let speculate = drafting && exact > 1;
        let always = job.speculate == Speculate::Always;
        self.gens[seq] = Some(Gen {
            seq,
            picker,
            utf8: Utf8Stream::default(),
            stop: StopMatcher::new(job.stop.clone()),
            unsent: 0,
            infos: Vec::new(),
            finished,
            decoding: started,
            join: Some(Join { cuts, from: cached, started }),
            speculate,
            exact,
            history: if speculate { job.prompt.tokens.clone() } else { Vec::new() },
            drafts: Vec::with_capacity(MAX_DRAFT),
            spec: Speculation::new(self.accept, always),
            picked: Vec::with_capacity(MAX_DRAFT + 1),
            idx: 0,
            next: LlamaToken(0),
            job,
        });
        Ok(seq)
    }

    fn joining(&self, id: StreamId) -> bool {
        self.gens[id].as_ref().is_some_and(|g| g.join.is_some())
    }

    fn join(&mut self, ids: &[StreamId], emit: &mut dyn FnMut(StreamId, Delta) -> bool) -> Joined {
        // Each prompt keeps the batches its cuts give it, alone in its
        // stretch of the batch: llama.cpp splits a batch of several
        // sequences into equal shares (its KV cache is one stream per
        // sequence), so only batches of one length go together, and in
        // sequence order, where consecutive sequences make one ubatch.
        let next = |g: &Gen| {
            let join = g.join.as_ref().expect("a joining stream");
            let end = join.cuts.iter().copied().find(|&c| c > join.from).unwrap_or(g.job.prompt.tokens.len());
            (join.from, end)
        };
        let mut chosen: Vec<StreamId> = Vec::new();
        let mut length = 0;
        for &id in ids {
            let Some(g) = self.gens[id].as_ref().filter(|g| g.join.is_some()) else { continue };
            let (from, end) = next(g);
            if chosen.is_empty() {
                length = end - from;
            } else if end - from != length || (chosen.len() + 1) * length > self.chunk {
                continue;
            }
            chosen.push(id);
        }
        chosen.sort_unstable();
        let mut joined = Joined { advanced: chosen.clone(), ended: Vec::new() };
        if chosen.is_empty() {
            return joined;
        }
        self.batch.clear();
        for &id in &chosen {
            let g = self.gens[id].as_mut().expect("a joining stream");
            let (from, end) = next(g);
            let tokens = &g.job.prompt.tokens;
            let last = tokens.len() - 1;
            if end > last {
                g.idx = self.batch.n_tokens() + (last - from) as i32;
            }
            let seq = [g.seq as i32];
            for (pos, &token) in tokens.iter().enumerate().take(end).skip(from) {
                if let Err(e) = self.batch.add(LlamaToken(token as i32), pos as i32, &seq, pos == last) {
                    self.drop_streams(&chosen);
                    joined.ended = chosen.iter().map(|&id| (id, Err(llama_err(&e)))).collect();
                    return joined;
                }
            }
        }
        if let Err(e) = self.pacer.decode(&mut self.ctx, &mut self.batch) {
            self.drop_streams(&chosen);
            joined.ended = chosen.iter().map(|&id| (id, Err(llama_err(&e)))).collect();
            return joined;
        }
        for (n, &id) in chosen.iter().enumerate() {
            let g = self.gens[id].as_mut().expect("a joining stream");
            let (from, end) = next(g);
            self.seqs[g.seq].live.push_batch(&g.job.prompt.tokens[from..end]);
            let join = g.join.as_mut().expect("a joining stream");
            join.from = end;
            if end < g.job.prompt.tokens.len() {
                continue;
            }
            g.finished.prompt_us = join.started.elapsed().as_micros() as u64;
            g.join = None;
            g.decoding = Instant::now();
            let mut emit_one = |d: Delta| emit(id, d);
            match self.pick(id, &mut emit_one) {
                Ok(None) => {}
                Ok(Some(reason)) => joined.ended.push((id, Ok(self.finish(id, reason, &mut emit_one)))),
                Err(e) => {
                    // Not expected (a first pick has no draft to roll back),
                    // but then the context failed: this stream's sequence is
                    // in an unknown state, and the ones not picked yet may
                    // have lost their logits with it.
                    let rest: Vec<StreamId> = chosen[n..].iter().copied().filter(|&id| self.gens[id].is_some()).collect();
                    self.drop_streams(&rest);
                    joined.ended.push((id, Err(e.clone())));
                    joined.ended.extend(rest.into_iter().skip(1).map(|id| (id, Err(e.clone()))));
                    return joined;
                }
            }
        }
        joined
    }

    fn step(&mut self, ids: &[StreamId], emit: &mut dyn FnMut(StreamId, Delta) -> bool) -> Result<Vec<(StreamId, Finished)>, EngineError> {
        let alone = ids.len() == 1;
        self.batch.clear();
        let mut drafted = 0;
        // In sequence order: llama.cpp keeps one KV stream per sequence and
        // decodes consecutive sequences in one ubatch, others in one each.
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        for &id in &sorted {
            let g = self.gens[id].as_mut().expect("a running stream");
            let pos = self.seqs[g.seq].live.len();
            // The next batch: the last token picked, then a draft when the
            // stream has the step to itself, the text so far has one, and
            // it is expected to pay.
            if alone && g.speculate {
                let room = ((g.job.max_tokens - g.finished.generated_tokens) as usize)
                    .saturating_sub(1)
                    .min((self.n_ctx as usize).saturating_sub(pos + 2))
                    .min(EXACT_CONTEXT.saturating_sub(pos + 1))
                    .min(g.exact - 1);
                let found = lookup::find_draft(&g.history, room.min(MAX_DRAFT));
                let k = g.spec.plan(found.len(), &self.costs);
                g.drafts.extend(found[..k].iter().map(|&t| LlamaToken(t as i32)));
                drafted = g.drafts.len();
            }
            g.idx = self.batch.n_tokens();
            g.finished.batch_peak = g.finished.batch_peak.max(ids.len() as u32);
            let seq = [g.seq as i32];
            let added = std::iter::once(g.next)
                .chain(g.drafts.iter().copied())
                .enumerate()
                .try_for_each(|(i, t)| self.batch.add(t, (pos + i) as i32, &seq, true));
            if let Err(e) = added {
                self.drop_streams(ids);
                return Err(llama_err(e));
            }
        }
        let step = Instant::now();
        if let Err(e) = self.pacer.decode(&mut self.ctx, &mut self.batch) {
            self.drop_streams(ids);
            return Err(llama_err(e));
        }
        if alone && self.gens[ids[0]].as_ref().is_some_and(|g| g.speculate) {
            self.costs.record(drafted + 1, step.elapsed().as_secs_f64() * 1e6);
        }
        for &id in ids {
            let g = self.gens[id].as_ref().expect("a running stream");
            let live = &mut self.seqs[g.seq].live;
            for t in std::iter::once(g.next).chain(g.drafts.iter().copied()) {
                live.push_batch(&[t.0 as Token]);
            }
        }
        let mut done = Vec::new();
        for (n, &id) in ids.iter().enumerate() {
            let mut emit_one = |d: Delta| emit(id, d);
            match self.pick(id, &mut emit_one) {
                Ok(None) => {}
                Ok(Some(reason)) => done.push((id, self.finish(id, reason, &mut emit_one))),
                Err(e) => {
                    // This stream's sequence is in an unknown state; the
                    // ones not picked yet lose their logits with it.
                    self.drop_streams(&ids[n..]);
                    return Err(e);
                }
            }
        }
        Ok(done)
    }

    fn cancel(&mut self, id: StreamId) -> Finished {
        self.finish(id, FinishReason::Cancelled, &mut |_| false)
    }

    fn prefill(&mut self, prompt: &Prompt, cancelled: &dyn Fn() -> bool) -> Result<Prefilled, EngineError> {
        let started = Instant::now();
        let tokens = &prompt.tokens;
        self.check_fits(tokens.len())?;
        let cuts = prompt.cuts(self.chunk);
        // A later request always has more tokens, so the whole prefill may be reused.
        let (seq, cached) = self.place(tokens, &cuts, tokens.len(), true)?;
        if !self.evaluate(seq, tokens, &cuts, cached, &|_| false, &mut |_, _, _| Ok(()), cancelled)? {
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
        let mut seq = None;
        for continuation in continuations {
            let all: Vec<Token> = prefix.iter().chain(continuation).copied().collect();
            let mut cuts = prefix_cuts.clone();
            cuts.extend(crate::cuts(prefix.len(), all.len(), self.chunk).into_iter().filter(|&c| c > prefix.len()));
            let last = all.len() - 2;
            let limit = if predicts_first.is_some() { prefix.len() } else { first };
            // Only the first continuation may save what the sequence held
            // before; the others would save the previous continuation.
            let (at, cached) = match seq {
                None => self.place(&all, &cuts, limit, true)?,
                Some(at) => (at, self.reuse(at, &all, &cuts, limit, false)?),
            };
            seq = Some(at);
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
            if !self.evaluate(at, &all, &cuts, cached, &|p| p >= first && p <= last, &mut collect, cancelled)? {
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
            let ctx = unsafe { std::mem::transmute::<LlamaContext<'_>, LlamaContext<'static>>(ctx) };
            let pacer = Pacer::new(&ctx, self.pacer.threads);
            self.embed_ctx = Some((ctx, pacer));
        }
        let background = self.pacer.background;
        let (ctx, pacer) = self.embed_ctx.as_mut().expect("made above");
        pacer.background = background;
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
            pacer.decode(ctx, &mut batch).map_err(llama_err)?;
            let pooled = ctx.embeddings_seq_ith(0).map_err(llama_err)?;
            let norm = pooled.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
            out.push(if norm > 0.0 { pooled.iter().map(|&x| (f64::from(x) / norm) as f32).collect() } else { pooled.to_vec() });
        }
        Ok(out)
    }

    fn purge(&mut self) -> (u32, u64) {
        let (n, bytes) = self.saved.clear();
        let mut live = 0;
        // A sequence a stream runs on keeps what it holds.
        for seq in 0..self.seqs.len() {
            if self.seqs[seq].busy {
                continue;
            }
            live += u32::from(!self.seqs[seq].live.is_empty());
            self.forget(seq);
        }
        (n as u32 + live, bytes as u64)
    }

    fn stats(&self) -> ModelStats {
        ModelStats {
            cached_prefixes: self.saved.len() as u32 + self.seqs.iter().filter(|s| !s.live.is_empty()).count() as u32,
            cache_bytes: self.saved.total_bytes() as u64,
            n_ctx: self.n_ctx,
            threads: self.pacer.tuner.current(),
        }
    }

    fn set_background(&mut self, background: bool) {
        self.pacer.background = background;
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

/// A context's thread counts: before each `llama_decode` it sets the count
/// the [`Tuner`] plans for the call (`llama_set_n_threads`), and gives the
/// tuner what the call took.
struct Pacer {
    threads: Threads,
    tuner: Tuner,
    /// The `llama_context` as an address ([`raw_context`]); 0 when it could
    /// not be found, and then every call keeps the count the context was
    /// made with.
    raw: usize,
    /// The count set last.
    applied: u32,
    /// The calls that follow carry background work only ([`Session::set_background`]).
    background: bool,
}

impl Pacer {
    fn new(ctx: &LlamaContext<'_>, threads: Threads) -> Pacer {
        let raw = match (threads, raw_context(ctx)) {
            (Threads::Fixed(_), _) => 0,
            (_, Some(p)) => p as usize,
            (_, None) => {
                tracing::warn!("cannot reach llama.cpp's context to change its thread count: every call keeps {}", threads.most());
                0
            }
        };
        Pacer { threads, tuner: Tuner::new(threads), raw, applied: threads.most(), background: false }
    }

    fn decode(&mut self, ctx: &mut LlamaContext<'_>, batch: &mut LlamaBatch<'_>) -> Result<(), llama_cpp_2::DecodeError> {
        if self.raw == 0 {
            return ctx.decode(batch);
        }
        let tokens = batch.n_tokens().max(1) as usize;
        let plan = self.tuner.plan(tokens, self.background, Instant::now());
        if plan.threads != self.applied {
            let n = plan.threads as i32;
            // SAFETY: `raw` is `ctx`'s own context (checked in `raw_context`),
            // used on the engine thread that owns `ctx`, between calls.
            unsafe { llama_cpp_sys_2::llama_set_n_threads(self.raw as *mut llama_cpp_sys_2::llama_context, n, n) };
            self.applied = plan.threads;
        }
        let started = Instant::now();
        let result = ctx.decode(batch);
        if result.is_ok() {
            let now = Instant::now();
            self.tuner.record(plan, tokens, now - started, now);
        }
        result
    }
}

/// The `llama_context` behind `ctx`, for `llama_set_n_threads`, which
/// llama-cpp-2 (pinned at =0.1.160) does not wrap. The crate keeps the
/// pointer private and prints it in its Debug form; the address read there
/// is used only if llama.cpp's own getters through it give what the
/// crate's give (context, batch and micro-batch sizes).
fn raw_context(ctx: &LlamaContext<'_>) -> Option<*mut llama_cpp_sys_2::llama_context> {
    let shown = format!("{ctx:?}");
    let digits: String = shown.split("0x").nth(1)?.chars().take_while(char::is_ascii_hexdigit).collect();
    let p = usize::from_str_radix(&digits, 16).ok()? as *mut llama_cpp_sys_2::llama_context;
    if p.is_null() {
        return None;
    }
    // SAFETY: with the pinned crate `p` is the pointer `ctx` wraps; the
    // getters read fields of a live context.
    let agrees = unsafe {
        llama_cpp_sys_2::llama_n_ctx(p) == ctx.n_ctx()
            && llama_cpp_sys_2::llama_n_batch(p) == ctx.n_batch()
            && llama_cpp_sys_2::llama_n_ubatch(p) == ctx.n_ubatch()
    };
    agrees.then_some(p)
}

fn llama_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Llama(e.to_string())
}
