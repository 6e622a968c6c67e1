//! Token picking: how a generation picks each token from the logits (plain
//! argmax, a grammar, the lazy grammar of function calls, or sampling with
//! revis's own draw), and a token's log-probability and alternatives.

use std::sync::Arc;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::lookup;
use crate::sample::{argmax, greedy_under, softmax, top_k_of};
use crate::{EngineError, Sampling, Token, TokenInfo};

/// How a generation picks each token from the logits at a batch position
/// (a drafted token there is kept when it is the token picked).
pub(super) enum Picker {
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
pub(super) struct Waiting {
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

pub(super) struct Sampled {
    chain: LlamaSampler,
    /// Top-k done here on the logits (first in the chain), so the chain
    /// sees k candidates, not the whole vocabulary.
    top_k: Option<usize>,
    rng: StdRng,
    /// The distribution at the last position picked.
    p: Vec<(Token, f64)>,
}

impl Picker {
    /// How a job with these settings picks its tokens.
    pub(super) fn new(model: &Arc<LlamaModel>, s: &Sampling, grammar: Option<&crate::Grammar>) -> Result<Picker, EngineError> {
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
                model: model.clone(),
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
            let grammar = LlamaSampler::grammar(model, &g.text, "root").map_err(|e| EngineError::Grammar(e.to_string()))?;
            return Ok(Picker::Strict(grammar));
        }
        let mut chain = Vec::new();
        if penalize {
            chain.push(LlamaSampler::penalties(
                model.n_vocab(),
                s.repeat_last_n as i32,
                s.repeat_penalty,
                s.frequency_penalty,
                s.presence_penalty,
            ));
        }
        if let Some(g) = grammar {
            let sampler = if g.triggers.is_empty() {
                LlamaSampler::grammar(model, &g.text, "root")
            } else {
                LlamaSampler::grammar_lazy(model, &g.text, "root", &g.triggers, &[])
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

    /// The token at batch position `i`. A drafted token there is kept when
    /// it is this token (greedy: the argmax; sampled: the token drawn with
    /// the position's own uniform, so the text is the one the seed gives
    /// without drafts).
    pub(super) fn pick(&mut self, ctx: &LlamaContext<'_>, i: i32) -> LlamaToken {
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

/// A token's piece and log-probability under `logits` (a log-softmax over
/// the whole vocabulary), and the `top` likeliest tokens there.
pub(super) fn token_info(model: &LlamaModel, logits: &[f32], token: usize, top: usize) -> TokenInfo {
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
