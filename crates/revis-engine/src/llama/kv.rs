//! The KV cache's sequences: which free one a prompt goes on, the longest
//! prefix it can reuse (from what the sequence holds or a saved prefix),
//! saving what a sequence is about to lose, and evaluating a prompt on it
//! batch by batch.

use llama_cpp_2::context::session::LlamaStateSeqFlags;
use llama_cpp_2::token::LlamaToken;

use super::{LlamaSession, llama_err};
use crate::cache::Evaluated;
use crate::{EngineError, Token};

/// Sequences shorter than this are not worth saving when they are evicted from the live slot.
const MIN_SAVED_TOKENS: usize = 32;

impl LlamaSession {
    /// The free sequence to put `tokens` on: the one that holds the longest
    /// reusable prefix of it; among equals, the one that leaves the busy
    /// sequences in the fewest runs of consecutive ids (llama.cpp decodes
    /// each run as a ubatch of its own), then the least recently used. None
    /// when every sequence is busy.
    pub(super) fn choose(&self, tokens: &[Token], cuts: &[usize], limit: usize) -> Option<usize> {
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
    pub(super) fn place(&mut self, tokens: &[Token], cuts: &[usize], limit: usize, save: bool) -> Result<(usize, usize), EngineError> {
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
    pub(super) fn reuse(&mut self, seq: usize, tokens: &[Token], cuts: &[usize], limit: usize, save: bool) -> Result<usize, EngineError> {
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
    pub(super) fn save_live(&mut self, seq: usize) {
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
    pub(super) fn forget(&mut self, seq: usize) {
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
    pub(super) fn evaluate(
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

    pub(super) fn check_fits(&self, tokens: usize) -> Result<(), EngineError> {
        if tokens >= self.n_ctx as usize {
            return Err(EngineError::PromptTooLong { tokens, n_ctx: self.n_ctx });
        }
        Ok(())
    }
}
