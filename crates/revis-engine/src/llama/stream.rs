//! Generations as streams that decode together: starting one on a free
//! sequence, joining prompts batch by batch, each step's batch (with a
//! draft when a stream has it to itself), and what each picked token
//! streams, until a stream finishes.

use std::time::Instant;

use llama_cpp_2::token::LlamaToken;

use super::pick::{Picker, token_info};
use super::{Gen, Join, LlamaSession, llama_err};
use crate::lookup::{self, EXACT_CONTEXT, MAX_DRAFT, Speculate, Speculation};
use crate::{Delta, EngineError, FinishReason, Finished, GenerateJob, Joined, StopMatcher, Stopped, StreamId, Token, Utf8Stream};

impl LlamaSession {
    /// Takes the tokens the batch just decoded gives stream `id` (see
    /// [`Picker::pick`]), streams their text, and says whether it is done;
    /// if not, its next token is set.
    pub(super) fn pick(&mut self, id: StreamId, emit: &mut dyn FnMut(Delta) -> bool) -> Result<Option<FinishReason>, EngineError> {
        let mut g = self.gens[id].take().expect("a running stream");
        let reason = self.pick_into(&mut g, emit);
        self.gens[id] = Some(g);
        reason
    }

    pub(super) fn pick_into(&mut self, g: &mut Gen, emit: &mut dyn FnMut(Delta) -> bool) -> Result<Option<FinishReason>, EngineError> {
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
    pub(super) fn finish(&mut self, id: StreamId, reason: FinishReason, emit: &mut dyn FnMut(Delta) -> bool) -> Finished {
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

    /// Ends streams without an answer (an error left their sequences unknown).
    pub(super) fn drop_streams(&mut self, ids: &[StreamId]) {
        for &id in ids {
            if let Some(g) = self.gens[id].take() {
                self.forget(g.seq);
            }
        }
    }
}

impl LlamaSession {
    pub(super) fn start_stream(&mut self, job: GenerateJob) -> Result<StreamId, EngineError> {
        let tokens = &job.prompt.tokens;
        self.check_fits(tokens.len())?;
        if tokens.is_empty() {
            return Err(EngineError::Template("the prompt is empty".into()));
        }
        let picker = Picker::new(&self.model, &job.sampling, job.grammar.as_ref())?;
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

    pub(super) fn join_streams(&mut self, ids: &[StreamId], emit: &mut dyn FnMut(StreamId, Delta) -> bool) -> Joined {
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

    pub(super) fn step_streams(
        &mut self,
        ids: &[StreamId],
        emit: &mut dyn FnMut(StreamId, Delta) -> bool,
    ) -> Result<Vec<(StreamId, Finished)>, EngineError> {
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
}
