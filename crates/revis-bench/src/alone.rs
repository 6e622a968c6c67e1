//! The engine alone, in this process (no gRPC, no socket): the same greedy
//! generation the daemon runs, for the per-token cost of the stream.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::Context;
use revis_engine::{Engine, GenerateJob, Job, LlamaCpp, LoadedModel, Message, ModelSpec, Sampling, build_prompt};

use crate::prompts::{self, Prompts};

/// The daemon's defaults for a model (see revis-daemon's config), so both
/// sides load the model the same way.
pub fn spec(path: &Path, threads: u32, n_ctx: u32, batch: u32) -> ModelSpec {
    ModelSpec {
        path: path.to_owned(),
        n_ctx,
        threads: revis_engine::Threads::Fixed(threads),
        batch,
        cache_slots: 4,
        cache_budget_bytes: 256 << 20,
        probe: false,
        split: None,
        streams: 1,
        render: Default::default(),
    }
}

/// One timed generation.
#[derive(Clone, Debug)]
pub struct Generation {
    pub generated: u32,
    /// From the first delta to the end: `generated - 1` token steps.
    pub stream_wall: Duration,
    pub generate_us: u64,
}

impl Generation {
    /// Microseconds per token step, from the wall clock of the receiver.
    pub fn wall_us_per_token(&self) -> f64 {
        self.stream_wall.as_secs_f64() * 1e6 / f64::from(self.generated.saturating_sub(1).max(1))
    }
}

/// An engine with one model loaded, owned by this process.
pub struct Alone {
    engine: Engine,
    pub loaded: LoadedModel,
}

const KEY: &str = "bench";

impl Alone {
    pub async fn load(spec: ModelSpec) -> anyhow::Result<Alone> {
        let engine = Engine::spawn(Arc::new(LlamaCpp));
        let path = spec.path.clone();
        let loaded = engine.load(KEY, spec).await.with_context(|| format!("loading {}", path.display()))?;
        Ok(Alone { engine, loaded })
    }

    /// The prompts sized for this model.
    pub fn prompts(&self, n_prompt: usize, n_prefix: usize) -> anyhow::Result<Prompts> {
        Prompts::build(self.loaded.tokenizer.as_ref(), n_prompt, n_prefix)
    }

    /// Runs a greedy generation of at most `max_tokens` tokens for `messages`.
    pub async fn generate(&self, messages: &[Message], max_tokens: u32) -> anyhow::Result<Generation> {
        self.generate_with(messages, max_tokens, Sampling::greedy()).await
    }

    /// Runs a generation with `sampling`.
    pub async fn generate_with(&self, messages: &[Message], max_tokens: u32, sampling: Sampling) -> anyhow::Result<Generation> {
        let prompt = build_prompt(self.loaded.tokenizer.as_ref(), messages, &[], messages.len().saturating_sub(1))?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (done, done_rx) = tokio::sync::oneshot::channel();
        let job = GenerateJob {
            prompt,
            sampling,
            max_tokens,
            stop: vec![],
            grammar: None,
            logprobs: None,
            speculate: revis_engine::Speculate::Off,
        };
        let _finished = self.engine.run(
            KEY,
            Job::Generate { job, deltas: tx, done },
            revis_engine::Class::User,
            Arc::new(AtomicBool::new(false)),
            Box::new(()),
        );
        let mut first = None;
        while rx.recv().await.is_some() {
            first.get_or_insert_with(Instant::now);
        }
        let finished = done_rx.await.context("the engine dropped the job")??;
        let end = Instant::now();
        Ok(Generation {
            generated: finished.generated_tokens,
            stream_wall: first.map_or(Duration::ZERO, |f| end - f),
            generate_us: finished.generate_us,
        })
    }

    /// Warm-up, then the decode run the daemon also does.
    pub async fn decode_run(&self, max_tokens: u32) -> anyhow::Result<Generation> {
        self.generate(&[prompts::user(prompts::WARMUP_PROMPT)], 8).await?;
        self.engine.purge(None).await?;
        self.generate(&[prompts::user(prompts::DECODE_PROMPT)], max_tokens).await
    }

    /// The same decode with revis's default sampling (as the daemon fills
    /// in for a request that sets none), a fixed seed.
    pub async fn decode_run_sampled(&self, max_tokens: u32) -> anyhow::Result<Generation> {
        self.engine.purge(None).await?;
        self.generate_with(&[prompts::user(prompts::DECODE_PROMPT)], max_tokens, default_sampling()).await
    }

    pub async fn unload(self) {
        let _ = self.engine.unload(KEY).await;
    }
}

/// revis's default sampling (revis-daemon's validate.rs for a model that
/// publishes none), with a fixed seed.
pub fn default_sampling() -> Sampling {
    Sampling { temperature: 0.7, top_k: 40, top_p: 0.95, min_p: 0.05, seed: 1, ..Sampling::greedy() }
}
