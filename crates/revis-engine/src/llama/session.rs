//! The engine thread's calls on a loaded model ([`Session`]), each answered
//! by the room that does that job.

use super::LlamaSession;
use crate::{
    Delta, EngineError, FinishReason, Finished, GenerateJob, Joined, ModelStats, Prefilled, Prompt, Scored, Session, StreamId, Token,
};

impl Session for LlamaSession {
    fn streams(&self) -> usize {
        self.seqs.len()
    }

    fn has_free_sequence(&self) -> bool {
        self.seqs.iter().any(|s| !s.busy)
    }

    fn start(&mut self, job: GenerateJob) -> Result<StreamId, EngineError> {
        self.start_stream(job)
    }

    fn joining(&self, id: StreamId) -> bool {
        self.gens[id].as_ref().is_some_and(|g| g.join.is_some())
    }

    fn join(&mut self, ids: &[StreamId], emit: &mut dyn FnMut(StreamId, Delta) -> bool) -> Joined {
        self.join_streams(ids, emit)
    }

    fn step(&mut self, ids: &[StreamId], emit: &mut dyn FnMut(StreamId, Delta) -> bool) -> Result<Vec<(StreamId, Finished)>, EngineError> {
        self.step_streams(ids, emit)
    }

    fn cancel(&mut self, id: StreamId) -> Finished {
        self.finish(id, FinishReason::Cancelled, &mut |_| false)
    }

    fn prefill(&mut self, prompt: &Prompt, cancelled: &dyn Fn() -> bool) -> Result<Prefilled, EngineError> {
        self.prefill_prompt(prompt, cancelled)
    }

    fn score(
        &mut self,
        prefix: &Prompt,
        continuations: &[Vec<Token>],
        top: u32,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Vec<Scored>, EngineError> {
        self.score_continuations(prefix, continuations, top, cancelled)
    }

    fn embed(&mut self, texts: &[Vec<Token>], cancelled: &dyn Fn() -> bool) -> Result<Vec<Vec<f32>>, EngineError> {
        self.embed_texts(texts, cancelled)
    }

    fn purge(&mut self) -> (u32, u64) {
        self.purge_cached()
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
