//! `revisd measure-speed MODEL`: a short greedy decode of a model with the
//! daemon's default settings, printed as one JSON line. The client runs it
//! on the smallest downloaded catalog model before it estimates the others'
//! speeds (`revis models`, the GUI's models view): the real figure behind
//! the estimate (revis_models::choose).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use revis_engine::{Engine, GenerateJob, Job, LlamaCpp, Message, ModelSpec, Sampling, build_prompt};
use serde::Serialize;

/// Tokens the timed decode asks for.
pub const TOKENS: u32 = 64;
/// Fewer tokens than this (the model ended its answer early) make no figure.
pub const AT_LEAST: u32 = 16;
/// An answer that goes on: a count gives every model something to say.
const PROMPT: &str = "Count from 1 to 200, one number after another, separated by commas.";

/// What one decode measured.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Measured {
    pub tokens: u32,
    pub seconds: f64,
    pub tokens_per_s: f64,
}

impl Measured {
    /// The line `revisd measure-speed` prints.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain numbers")
    }
}

/// Loads `model` as revisd does by default (threads chosen by load, one
/// stream, a short context), decodes a few tokens to warm it, then
/// [`TOKENS`] greedily, and unloads it.
pub fn measure(model: &Path) -> Result<Measured, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let engine = Engine::spawn(Arc::new(LlamaCpp));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let spec = ModelSpec {
            path: model.to_owned(),
            n_ctx: 512,
            threads: revis_engine::Threads::Auto { most: cores },
            batch: 512,
            cache_slots: 1,
            cache_budget_bytes: 16 << 20,
            probe: false,
            split: None,
            streams: 1,
            render: Default::default(),
        };
        let loaded = engine.load("speed", spec).await.map_err(|e| format!("loading {}: {e}", model.display()))?;
        let messages = [Message::new(revis_engine::Role::User, PROMPT)];
        let prompt = build_prompt(loaded.tokenizer.as_ref(), &messages, &[], 0).map_err(|e| e.to_string())?;
        decode(&engine, prompt.clone(), 8).await?;
        engine.purge(None).await.map_err(|e| e.to_string())?;
        let (tokens, us) = decode(&engine, prompt, TOKENS).await?;
        let _ = engine.unload("speed").await;
        if tokens < AT_LEAST || us == 0 {
            return Err(format!("{} ended its answer after {tokens} tokens, fewer than the {AT_LEAST} a figure needs", model.display()));
        }
        let seconds = us as f64 / 1e6;
        Ok(Measured { tokens, seconds, tokens_per_s: f64::from(tokens) / seconds })
    })
}

/// One greedy generation of at most `max_tokens`: tokens generated and the engine's decode time in µs.
async fn decode(engine: &Engine, prompt: revis_engine::Prompt, max_tokens: u32) -> Result<(u32, u64), String> {
    let (deltas, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (done, done_rx) = tokio::sync::oneshot::channel();
    let job = GenerateJob {
        prompt,
        sampling: Sampling::greedy(),
        max_tokens,
        stop: vec![],
        grammar: None,
        logprobs: None,
        speculate: revis_engine::Speculate::Off,
    };
    let _finished =
        engine.run("speed", Job::Generate { job, deltas, done }, revis_engine::Class::User, Arc::new(AtomicBool::new(false)), Box::new(()));
    while rx.recv().await.is_some() {}
    let done = done_rx.await.map_err(|_| "the engine stopped".to_owned())?.map_err(|e| e.to_string())?;
    Ok((done.generated_tokens, done.generate_us))
}
