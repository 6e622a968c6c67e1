//! The session's work besides generation: prefilling a prompt into the
//! cache, scoring continuations after a prefix, embedding texts (on a
//! context of their own), and purging cached prefixes.

use std::num::NonZeroU32;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use super::pacer::Pacer;
use super::pick::token_info;
use super::{LlamaSession, llama_err, raw_backend};
use crate::{EngineError, MAX_EMBED_TOKENS, Prefilled, Prompt, Scored, Token, TokenInfo};

impl LlamaSession {
    pub(super) fn prefill_prompt(&mut self, prompt: &Prompt, cancelled: &dyn Fn() -> bool) -> Result<Prefilled, EngineError> {
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

    pub(super) fn score_continuations(
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

    pub(super) fn embed_texts(&mut self, texts: &[Vec<Token>], cancelled: &dyn Fn() -> bool) -> Result<Vec<Vec<f32>>, EngineError> {
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

    pub(super) fn purge_cached(&mut self) -> (u32, u64) {
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
}
