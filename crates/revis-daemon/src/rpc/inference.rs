//! The Inference handlers: Generate, Prefill, Embed and Score. Each is
//! validated, then forwarded to its split engine when its tier is split,
//! else given a model lease, its prompt built, and queued for the engine.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use revis_engine::tools::ToolStream;
use revis_engine::{EmbedJob, GenerateJob, Job, PrefillJob, ScoreJob, build_static_prompt};
use revis_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

use super::prompt::{self, blocking, too_long};
use super::stream::{DELTA_BUFFER, EventStream, GenerateStream, Stall, forward, token_logprob};
use super::{Daemon, engine_client};
use crate::error::DaemonError;
use crate::remote::split::forward_stream;
use crate::scheduler::{Priority, Task};
use crate::transport::peer::is_remote;
use crate::validate;

#[tonic::async_trait]
impl pb::inference_server::Inference for Daemon {
    type GenerateStream = GenerateStream;

    async fn generate(&self, req: Request<pb::GenerateRequest>) -> Result<Response<Self::GenerateStream>, Status> {
        let admitted_at = Instant::now();
        self.open()?;
        let admitted = self.admitted(&req)?;
        let v = validate::generate(req.get_ref(), &self.registry, &self.config)?;
        if let Some(engine) = self.splits.get(v.tier).cloned() {
            // Validated here, against this daemon's limits; run there.
            let mut msg = req.into_inner();
            msg.max_tokens = v.max_tokens;
            let mut client = engine_client(engine.channel().await?);
            let events = match client.generate(msg).await {
                Ok(r) => r.into_inner(),
                Err(s) => return Err(engine.translate(s).await.into()),
            };
            return Ok(Response::new(Box::pin(forward_stream(engine, events, admitted))));
        }
        let lease = self.registry.lease(&v.model).await.map_err(DaemonError::from)?;
        let tok = lease.tokenizer.clone();
        // What takes the prompt's room, for the error when it does not fit.
        let shares = prompt::Shares::of(&v.messages, &v.tools);
        let (messages, static_count) = (v.messages, v.static_count);
        let asked = prompt::Asked {
            answer_prefix: v.answer_prefix,
            json: v.json,
            tools: v.tools,
            tool_choice: v.tool_choice,
            parallel_tool_calls: v.parallel_tool_calls,
        };
        let (prompt, grammar, tool_syntax) =
            blocking(&self.tokenizers, &lease.tokenizer, move || prompt::generate(tok.as_ref(), &messages, static_count, asked)).await?;
        let n_ctx = lease.tokenizer.n_ctx();
        if prompt.tokens.len() >= n_ctx as usize {
            return Err(prompt::too_long_with(prompt.tokens.len(), n_ctx, v.tier, shares).into());
        }
        let started = pb::Started { model: v.model.name.clone(), prompt_tokens: prompt.tokens.len() as u32 };
        let (engine_tx, engine_rx) = mpsc::unbounded_channel();
        let (deltas_tx, deltas) = mpsc::channel(DELTA_BUFFER);
        let (done_tx, done) = oneshot::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let stalled = Arc::new(AtomicBool::new(false));
        let seed = v.sampling.seed;
        let job = GenerateJob {
            prompt,
            sampling: v.sampling,
            max_tokens: v.max_tokens,
            stop: v.stop,
            grammar,
            logprobs: v.logprobs,
            speculate: self.config.speculate,
        };
        let task =
            Task { key: v.model.key.clone(), job: Job::Generate { job, deltas: engine_tx, done: done_tx }, cancel: cancel.clone(), lease };
        self.admit(v.priority, task)?;
        let stall = Stall { timeout: self.config.stall_timeout, cancel: cancel.clone(), stalled: stalled.clone() };
        tokio::spawn(forward(engine_rx, deltas_tx, stall, admitted));
        Ok(Response::new(Box::pin(EventStream {
            started: Some(started),
            deltas,
            done: Some(done),
            cancel,
            stalled,
            stall_timeout: self.config.stall_timeout,
            seed,
            admitted: admitted_at,
            calls: tool_syntax.map(ToolStream::new),
            ending: None,
        })))
    }

    async fn prefill(&self, req: Request<pb::PrefillRequest>) -> Result<Response<pb::PrefillResponse>, Status> {
        self.open()?;
        // Held until the answer is sent, or the caller leaves (tonic drops this future).
        let _admitted = self.admitted(&req)?;
        let v = validate::prefill(req.get_ref(), &self.registry)?;
        if let Some(engine) = self.splits.get(v.tier).cloned() {
            let mut client = engine_client(engine.channel().await?);
            return match client.prefill(req.into_inner()).await {
                Ok(r) => Ok(r),
                Err(s) => Err(engine.translate(s).await.into()),
            };
        }
        let lease = self.registry.lease(&v.model).await.map_err(DaemonError::from)?;
        let tok = lease.tokenizer.clone();
        let messages = v.messages;
        let prompt = blocking(&self.tokenizers, &lease.tokenizer, move || build_static_prompt(tok.as_ref(), &messages)).await?;
        let n_ctx = lease.tokenizer.n_ctx();
        if prompt.tokens.len() >= n_ctx as usize {
            return Err(too_long(prompt.tokens.len(), n_ctx, v.tier).into());
        }
        let (done_tx, done) = oneshot::channel();
        let task = Task {
            key: v.model.key.clone(),
            job: Job::Prefill { job: PrefillJob { prompt }, done: done_tx },
            cancel: Arc::new(AtomicBool::new(false)),
            lease,
        };
        self.admit(v.priority, task)?;
        let p = done.await.map_err(|_| DaemonError::ShuttingDown)?.map_err(DaemonError::from)?;
        Ok(Response::new(pb::PrefillResponse { prompt_tokens: p.prompt_tokens, cached_tokens: p.cached_tokens, elapsed_us: p.elapsed_us }))
    }

    async fn embed(&self, req: Request<pb::EmbedRequest>) -> Result<Response<pb::EmbedResponse>, Status> {
        self.open()?;
        let _admitted = self.admitted(&req)?;
        let v = validate::embed(req.get_ref(), &self.registry)?;
        if let Some(engine) = self.splits.get(v.tier).cloned() {
            let mut client = engine_client(engine.channel().await?);
            return match client.embed(req.into_inner()).await {
                Ok(r) => Ok(r),
                Err(s) => Err(engine.translate(s).await.into()),
            };
        }
        let lease = self.registry.lease(&v.model).await.map_err(DaemonError::from)?;
        let tok = lease.tokenizer.clone();
        let inputs = v.inputs;
        let texts = blocking(&self.tokenizers, &lease.tokenizer, move || Ok(prompt::embed(tok.as_ref(), &inputs))).await?;
        if let Some((i, t)) = texts.iter().enumerate().find(|(_, t)| t.len() > validate::MAX_EMBED_TOKENS) {
            return Err(DaemonError::Invalid(format!(
                "inputs[{i}] is {} tokens for {}'s model; the limit is {} tokens a text",
                t.len(),
                v.tier,
                validate::MAX_EMBED_TOKENS
            ))
            .into());
        }
        let counts: Vec<u32> = texts.iter().map(|t| t.len() as u32).collect();
        let (done_tx, done) = oneshot::channel();
        let task = Task {
            key: v.model.key.clone(),
            job: Job::Embed { job: EmbedJob { texts }, done: done_tx },
            cancel: Arc::new(AtomicBool::new(false)),
            lease,
        };
        self.admit(Priority::User, task)?;
        let vectors = done.await.map_err(|_| DaemonError::ShuttingDown)?.map_err(DaemonError::from)?;
        let remote = is_remote(&req);
        Ok(Response::new(pb::EmbedResponse {
            model: self.tier_status(v.tier, remote).model,
            embeddings: vectors.into_iter().zip(counts).map(|(values, tokens)| pb::Embedding { values, tokens }).collect(),
        }))
    }

    async fn score(&self, req: Request<pb::ScoreRequest>) -> Result<Response<pb::ScoreResponse>, Status> {
        self.open()?;
        let _admitted = self.admitted(&req)?;
        let v = validate::score(req.get_ref(), &self.registry)?;
        if let Some(engine) = self.splits.get(v.tier).cloned() {
            let mut client = engine_client(engine.channel().await?);
            return match client.score(req.into_inner()).await {
                Ok(r) => Ok(r),
                Err(s) => Err(engine.translate(s).await.into()),
            };
        }
        let lease = self.registry.lease(&v.model).await.map_err(DaemonError::from)?;
        let tok = lease.tokenizer.clone();
        let (messages, static_count, prefix, texts) = (v.messages, v.static_count, v.prefix, v.continuations.clone());
        let (prefix, continuations) =
            blocking(&self.tokenizers, &lease.tokenizer, move || prompt::score(tok.as_ref(), &messages, static_count, &prefix, &texts))
                .await?;
        let n_ctx = lease.tokenizer.n_ctx();
        let longest = continuations.iter().map(Vec::len).max().unwrap_or(0);
        if prefix.tokens.len() + longest >= n_ctx as usize {
            return Err(too_long(prefix.tokens.len() + longest, n_ctx, v.tier).into());
        }
        let (done_tx, done) = oneshot::channel();
        let task = Task {
            key: v.model.key.clone(),
            job: Job::Score { job: ScoreJob { prefix, continuations, top: v.top_logprobs }, done: done_tx },
            cancel: Arc::new(AtomicBool::new(false)),
            lease,
        };
        self.admit(Priority::User, task)?;
        let scored = done.await.map_err(|_| DaemonError::ShuttingDown)?.map_err(DaemonError::from)?;
        let prefix_tokens = scored.first().map_or(0, |s| s.prefix_tokens);
        let results: Vec<pb::ScoreResult> = scored
            .into_iter()
            .zip(&v.continuations)
            .map(|(s, text)| pb::ScoreResult {
                logprob: s.logprob,
                tokens: s.tokens.into_iter().map(token_logprob).collect(),
                byte_length: text.len() as u32,
            })
            .collect();
        let first = results.first().cloned().unwrap_or_default();
        Ok(Response::new(pb::ScoreResponse {
            logprob: first.logprob,
            tokens: first.tokens,
            byte_length: first.byte_length,
            prefix_tokens,
            results,
        }))
    }
}
