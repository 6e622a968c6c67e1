//! Drafting's side of the session: the probe of which batch sizes decode
//! bit-identically to single tokens (so a verified draft changes nothing),
//! and dropping rejected draft tokens from a sequence.

use std::time::Instant;

use llama_cpp_2::token::LlamaToken;

use super::tokenizer::to_ids;
use super::{LlamaSession, llama_err};
use crate::cache::Evaluated;
use crate::lookup::MAX_DRAFT;
use crate::{EngineError, Token};

/// How long the batch probe ([`LlamaSession::probe`]) may take before it
/// stops trying larger batches (it runs at load).
const PROBE_BUDGET: std::time::Duration = std::time::Duration::from_secs(1);

impl LlamaSession {
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
    pub(super) fn probe(&mut self) -> Result<usize, EngineError> {
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
    pub(super) fn rollback(&mut self, seq: usize, keep: usize, text: &[Token]) -> Result<bool, EngineError> {
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
