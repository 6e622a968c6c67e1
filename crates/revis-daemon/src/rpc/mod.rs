//! The gRPC services: Inference (Generate, Prefill, Score, Embed) and Admin
//! (Status, LoadModel, UnloadModel, Purge, server mode and pairing), over
//! the registry and the queue. This file holds what both share; the
//! handlers are in `inference.rs` and `admin.rs`, Generate's answer stream
//! in `stream.rs`, prompt building in `prompt.rs`.

mod admin;
mod inference;
pub mod prompt;
pub mod stream;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use revis_proto::Tier;
use revis_proto::v1 as pb;
use tonic::Request;

use crate::config::Config;
use crate::error::DaemonError;
use crate::registry::{Phase, Registry};
use crate::remote::Remote;
use crate::remote::split::{SplitEngine, Splits};
use crate::scheduler::{Priority, Queue, Task};
use crate::transport::admission::{Admission, Admitted};
use crate::validate::GRPC_MAX_MESSAGE_BYTES;

/// The daemon as its gRPC services see it: one value serving both
/// Inference and Admin over its models, queue, config, server mode and
/// admission. Cloned into each service.
#[derive(Clone)]
pub struct Daemon {
    pub registry: Arc<Registry>,
    pub queue: Arc<Queue<Task>>,
    pub config: Arc<Config>,
    pub started: Instant,
    /// Set once shutdown begins: new requests are refused.
    pub closing: Arc<AtomicBool>,
    /// Server mode: identity, paired devices, the TCP side.
    pub remote: Arc<Remote>,
    /// Places for Inference calls, taken before a request is read.
    pub admission: Admission,
    /// Where prompts are rendered and tokenized: see [`prompt::tokenizer_pool`].
    pub tokenizers: Arc<prompt::Tokenizers>,
    /// Tiers split across machines, forwarded to their split engines.
    pub splits: Arc<Splits>,
}

/// A client of a split engine, with the daemon's message limits.
fn engine_client(channel: tonic::transport::Channel) -> pb::inference_client::InferenceClient<tonic::transport::Channel> {
    pb::inference_client::InferenceClient::new(channel)
        .max_decoding_message_size(GRPC_MAX_MESSAGE_BYTES)
        .max_encoding_message_size(GRPC_MAX_MESSAGE_BYTES)
}

impl Daemon {
    /// The split engine serving the tier a request names, if it is split.
    fn split_of(&self, tier: &str) -> Option<Arc<SplitEngine>> {
        Tier::from_wire(tier).ok().and_then(|t| self.splits.get(t).cloned())
    }

    /// Refuses new work once shutdown began, before any model is loaded for it.
    fn open(&self) -> Result<(), DaemonError> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(DaemonError::ShuttingDown);
        }
        Ok(())
    }

    /// The call's place, taken by the gate in front of the service before
    /// its body was read (see `admission.rs`), or here when it came in
    /// another way.
    fn admitted<T>(&self, req: &Request<T>) -> Result<Admitted, DaemonError> {
        match req.extensions().get::<Admitted>() {
            Some(a) => Ok(a.clone()),
            None => self.admission.try_admit(),
        }
    }

    fn admit(&self, priority: Priority, task: Task) -> Result<(), DaemonError> {
        self.open()?;
        self.queue.push(priority, task).map_err(|f| DaemonError::QueueFull { capacity: f.capacity })
    }

    /// A tier as Status shows it. Over the network (`remote`) without local
    /// file paths, which name this machine's user: the model is its catalog
    /// name, or only the file's name when the config gave a path.
    fn tier_status(&self, tier: Tier, remote: bool) -> pb::TierStatus {
        let Some(model) = self.registry.tier(tier) else { return pb::TierStatus::default() };
        let view = model.view();
        let stats = self.registry.engine().stats().remove(&model.key).unwrap_or_default();
        let ready = view.phase == Phase::Ready;
        pb::TierStatus {
            tier: tier.to_string(),
            model: if remote {
                Path::new(&model.name).file_name().map_or_else(|| model.name.clone(), |f| f.to_string_lossy().into_owned())
            } else {
                model.name.clone()
            },
            model_path: if remote { String::new() } else { model.path.display().to_string() },
            state: match view.phase {
                Phase::Unloaded => pb::ModelState::Unloaded,
                Phase::Loading => pb::ModelState::Loading,
                Phase::Ready => pb::ModelState::Ready,
            } as i32,
            memory_bytes: view.memory_bytes,
            cached_prefixes: if ready { stats.cached_prefixes } else { 0 },
            cache_bytes: if ready { stats.cache_bytes } else { 0 },
            threads: if ready { stats.threads } else { 0 },
            threads_auto: !matches!(model.spec.threads, revis_engine::Threads::Fixed(_)),
            context_tokens: view.n_ctx.unwrap_or(model.spec.n_ctx),
            shared_with: self.registry.shared_with(tier).iter().map(Tier::to_string).collect(),
            split: if model.split.is_empty() {
                model.split_note.clone()
            } else {
                format!("split across {} (its engine starts on first use)", model.split.join(", "))
            },
        }
    }

    /// `tier_status`, from its split engine while that runs.
    async fn tier_status_live(&self, tier: Tier, remote: bool) -> pb::TierStatus {
        let mut status = self.tier_status(tier, remote);
        if let Some(engine) = self.splits.get(tier)
            && let Some(live) = engine.status().await
        {
            status.state = live.state;
            status.memory_bytes = live.memory_bytes;
            status.cached_prefixes = live.cached_prefixes;
            status.cache_bytes = live.cache_bytes;
            status.threads = live.threads;
            status.threads_auto = live.threads_auto;
            status.context_tokens = live.context_tokens;
            status.split = live.split;
        }
        status
    }
}
