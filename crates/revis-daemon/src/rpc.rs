//! The gRPC services: Inference (Generate, Prefill, Score, Embed) and Admin
//! (Status, LoadModel, UnloadModel, Purge), over the registry and the queue.

use std::path::Path;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use revis_engine::{
    Class, Delta, EmbedJob, EngineError, FinishReason, Finished, GenerateJob, Job, PrefillJob, Prompt, ScoreJob, build_prompt,
    build_score_prefix, build_static_prompt,
};
use revis_proto::Tier;
use revis_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::admission::{Admission, Admitted};
use crate::config::Config;
use crate::error::DaemonError;
use crate::registry::{Lease, Phase, Registry};
use crate::remote::{DeviceInfo, PairingOutcome, Remote, ServerState, is_remote, local_only};
use crate::scheduler::{Priority, Queue};
use crate::split::{SplitEngine, Splits};
use crate::validate;
use crate::validate::GRPC_MAX_MESSAGE_BYTES;

/// Deltas buffered between the forwarder and the gRPC stream; the caller
/// has "taken" a delta once it left this buffer for the HTTP/2 stream.
const DELTA_BUFFER: usize = 64;

/// A job waiting for the engine, with the lease that keeps its model loaded.
pub struct Task {
    pub key: String,
    pub job: Job,
    pub cancel: Arc<AtomicBool>,
    pub lease: Lease,
}

/// Hands queued jobs to the engine, most urgent first, at most `streams`
/// at a time: the engine decodes that many generations of a model together
/// and runs other jobs between their steps. The rest wait in the queue, in
/// order, so a user job that comes later still goes first.
pub async fn run_queue(queue: Arc<Queue<Task>>, registry: Arc<Registry>, streams: usize) {
    let places = Arc::new(tokio::sync::Semaphore::new(streams.max(1)));
    loop {
        let Ok(place) = places.clone().acquire_owned().await else { return };
        let (priority, task) = queue.pop().await;
        if task.job.abandoned() {
            continue;
        }
        let class = match priority {
            Priority::User => Class::User,
            Priority::Background => Class::Background,
        };
        queue.started();
        // The lease goes with the job and is dropped on the engine thread as
        // soon as the job ends, so an unload right after frees the weights.
        let finished = registry.engine().run(&task.key, task.job, class, task.cancel, Box::new(task.lease));
        let queue = queue.clone();
        tokio::spawn(async move {
            let _ = finished.await;
            queue.ended();
            drop(place);
        });
    }
}

/// What the daemon's gRPC services share: its models, queue, config,
/// server mode and admission. Cloned into each service.
#[derive(Clone)]
pub struct Core {
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
    /// Where prompts are rendered and tokenized: see [`tokenizer_pool`].
    pub tokenizers: Arc<rayon::ThreadPool>,
    /// Tiers split across machines, forwarded to their split engines.
    pub splits: Arc<Splits>,
}

/// A client of a split engine, with the daemon's message limits.
fn engine_client(channel: tonic::transport::Channel) -> pb::inference_client::InferenceClient<tonic::transport::Channel> {
    pb::inference_client::InferenceClient::new(channel)
        .max_decoding_message_size(GRPC_MAX_MESSAGE_BYTES)
        .max_encoding_message_size(GRPC_MAX_MESSAGE_BYTES)
}

/// Threads that render and tokenize prompts, off the async runtime. Two, so
/// a long prompt does not hold up a short one; a fixed few, because each
/// thread keeps the memory its largest prompt needed (a 1 MiB prompt takes
/// tens of MiB while tokenized, and the allocator keeps one arena per
/// thread), where tokio's blocking pool would spread that over dozens.
pub const TOKENIZER_THREADS: usize = 2;

pub fn tokenizer_pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(TOKENIZER_THREADS)
        .thread_name(|i| format!("revis-tokenize-{i}"))
        .build()
        .expect("start the tokenizer threads")
}

impl Core {
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
            status.context_tokens = live.context_tokens;
            status.split = live.split;
        }
        status
    }
}

fn too_long(tokens: usize, n_ctx: u32, tier: Tier) -> DaemonError {
    DaemonError::Invalid(format!(
        "the prompt is {tokens} tokens; {tier}'s context holds {n_ctx} tokens (config daemon.context), so shorten the conversation"
    ))
}

/// A token and its log-probabilities, as the wire carries them.
fn token_logprob(t: revis_engine::TokenInfo) -> pb::TokenLogprob {
    pb::TokenLogprob {
        piece: t.piece.into(),
        logprob: t.logprob,
        top: t.top.into_iter().map(|(piece, logprob)| pb::Alternative { piece: piece.into(), logprob }).collect(),
    }
}

/// Runs tokenizer work on the [`tokenizer_pool`], off the async runtime.
async fn blocking<T: Send + 'static>(
    pool: &rayon::ThreadPool,
    f: impl FnOnce() -> Result<T, EngineError> + Send + 'static,
) -> Result<T, DaemonError> {
    let (tx, rx) = oneshot::channel();
    pool.spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.await {
        Ok(Ok(r)) => r.map_err(DaemonError::from),
        Ok(Err(_)) => Err(DaemonError::Engine(EngineError::Llama("the tokenizer panicked".into()))),
        Err(_) => Err(DaemonError::ShuttingDown),
    }
}

#[tonic::async_trait]
impl pb::inference_server::Inference for Core {
    type GenerateStream = crate::split::Forwarded;

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
                Err(s) => return Err(engine.translate(s).await),
            };
            return Ok(Response::new(crate::split::forward_stream(engine, events, admitted)));
        }
        let lease = self.registry.lease(&v.model).await.map_err(DaemonError::from)?;
        let tok = lease.tokenizer.clone();
        let (messages, static_count, json, prefix) = (v.messages, v.static_count, v.json, v.answer_prefix);
        let (prompt, grammar) = blocking(&self.tokenizers, move || {
            let mut prompt = build_prompt(tok.as_ref(), &messages, static_count)?;
            // Continuing an answer: its text so far follows the turn's
            // opening, as the model's own text (special-token names in it
            // stay text).
            if !prefix.is_empty() {
                prompt.continue_answer(&tok.tokenize_plain(&prefix));
            }
            let grammar = json.map(|schema| tok.json_grammar(schema.as_deref())).transpose()?;
            Ok((prompt, grammar))
        })
        .await?;
        let n_ctx = lease.tokenizer.n_ctx();
        if prompt.tokens.len() >= n_ctx as usize {
            return Err(too_long(prompt.tokens.len(), n_ctx, v.tier).into());
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
                Err(s) => Err(engine.translate(s).await),
            };
        }
        let lease = self.registry.lease(&v.model).await.map_err(DaemonError::from)?;
        let tok = lease.tokenizer.clone();
        let messages = v.messages;
        let prompt = blocking(&self.tokenizers, move || build_static_prompt(tok.as_ref(), &messages)).await?;
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
                Err(s) => Err(engine.translate(s).await),
            };
        }
        let lease = self.registry.lease(&v.model).await.map_err(DaemonError::from)?;
        let tok = lease.tokenizer.clone();
        let inputs = v.inputs;
        let texts = blocking(&self.tokenizers, move || Ok(inputs.iter().map(|t| tok.tokenize(t, true)).collect::<Vec<_>>())).await?;
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
                Err(s) => Err(engine.translate(s).await),
            };
        }
        let lease = self.registry.lease(&v.model).await.map_err(DaemonError::from)?;
        let tok = lease.tokenizer.clone();
        let (messages, static_count, prefix, texts) = (v.messages, v.static_count, v.prefix, v.continuations.clone());
        let (prefix, continuations) = blocking(&self.tokenizers, move || {
            let prefix = if messages.is_empty() {
                // Plain text: the prefix alone, in the usual batches.
                let tokens = build_score_prefix(tok.as_ref(), &messages, &prefix)?;
                Prompt { split: tokens.len(), answer: tokens.len(), tokens }
            } else {
                // A conversation: as Generate builds it, `prefix` as its answer so far.
                let mut prompt = build_prompt(tok.as_ref(), &messages, static_count)?;
                if !prefix.is_empty() {
                    prompt.continue_answer(&tok.tokenize_plain(&prefix));
                }
                prompt
            };
            Ok((prefix, texts.iter().map(|c| tok.tokenize_plain(c)).collect::<Vec<_>>()))
        })
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

#[tonic::async_trait]
impl pb::admin_server::Admin for Core {
    async fn status(&self, req: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        // Paired devices see the tiers and the load, not this machine's
        // pairings, file paths or process ID.
        let remote = is_remote(&req);
        let server = (!remote).then(|| server_status(&self.remote.state()));
        let mut tiers = Vec::new();
        for (t, _) in self.registry.tiers() {
            tiers.push(self.tier_status_live(t, remote).await);
        }
        Ok(Response::new(pb::StatusResponse {
            memory_free_bytes: revis_engine::rpc::local_free_bytes(),
            device_id: self.remote.device_id().to_string(),
            name: self.remote.name().to_owned(),
            server,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            tiers,
            queue_depth: self.queue.len() as u32,
            queue_capacity: self.admission.capacity() as u32,
            rss_bytes: revis_engine::rss_bytes(),
            busy: self.queue.busy(),
            pid: if remote { 0 } else { std::process::id() },
            uptime_s: self.started.elapsed().as_secs(),
        }))
    }

    async fn load_model(&self, req: Request<pb::LoadModelRequest>) -> Result<Response<pb::LoadModelResponse>, Status> {
        local_only(&req, "LoadModel")?;
        let (tier, model) = validate::tier(&self.registry, &req.get_ref().tier)?;
        let t0 = Instant::now();
        match self.split_of(&req.get_ref().tier) {
            Some(engine) => drop(engine.channel().await?),
            None => drop(self.registry.load(model).await.map_err(DaemonError::from)?),
        }
        Ok(Response::new(pb::LoadModelResponse {
            tier: Some(self.tier_status_live(tier, false).await),
            elapsed_ms: t0.elapsed().as_millis() as u64,
        }))
    }

    async fn unload_model(&self, req: Request<pb::UnloadModelRequest>) -> Result<Response<pb::UnloadModelResponse>, Status> {
        local_only(&req, "UnloadModel")?;
        let (tier, model) = validate::tier(&self.registry, &req.get_ref().tier)?;
        let rss_before_bytes = revis_engine::rss_bytes();
        match self.split_of(&req.get_ref().tier) {
            Some(engine) => drop(engine.stop().await),
            None => drop(self.registry.unload(model).await.map_err(DaemonError::from)?),
        }
        Ok(Response::new(pb::UnloadModelResponse {
            tier: Some(self.tier_status(tier, false)),
            rss_before_bytes,
            rss_after_bytes: revis_engine::rss_bytes(),
        }))
    }

    async fn purge(&self, req: Request<pb::PurgeRequest>) -> Result<Response<pb::PurgeResponse>, Status> {
        local_only(&req, "Purge")?;
        // A split tier's caches are in its engine (one tier, or every one that runs).
        let tier = req.get_ref().tier.clone();
        let engines = match self.split_of(&tier) {
            Some(e) => vec![e],
            None if tier.is_empty() => self.splits.engines(),
            None => Vec::new(),
        };
        let (mut n, mut bytes) = (0, 0);
        for engine in &engines {
            if engine.status().await.is_none() {
                continue;
            }
            let mut admin = pb::admin_client::AdminClient::new(engine.channel().await?);
            match admin.purge(pb::PurgeRequest { tier: tier.clone() }).await {
                Ok(r) => {
                    n += r.get_ref().dropped_prefixes;
                    bytes += r.get_ref().freed_bytes;
                }
                Err(s) => return Err(engine.translate(s).await),
            }
        }
        if self.split_of(&tier).is_some() {
            return Ok(Response::new(pb::PurgeResponse { dropped_prefixes: n, freed_bytes: bytes }));
        }
        let key =
            if req.get_ref().tier.is_empty() { None } else { Some(validate::tier(&self.registry, &req.get_ref().tier)?.1.key.clone()) };
        let (here, here_bytes) = self.registry.engine().purge(key.as_deref()).await.map_err(DaemonError::from)?;
        Ok(Response::new(pb::PurgeResponse { dropped_prefixes: n + here, freed_bytes: bytes + here_bytes }))
    }

    async fn set_server_mode(&self, req: Request<pb::SetServerModeRequest>) -> Result<Response<pb::ServerModeStatus>, Status> {
        local_only(&req, "SetServerMode")?;
        self.open()?;
        let state = self.remote.set_enabled(req.get_ref().enabled, true).await?;
        Ok(Response::new(server_status(&state)))
    }

    async fn set_lending(&self, req: Request<pb::SetLendingRequest>) -> Result<Response<pb::ServerModeStatus>, Status> {
        local_only(&req, "SetLending")?;
        self.open()?;
        let state = self.remote.set_lending(req.get_ref().enabled, true)?;
        Ok(Response::new(server_status(&state)))
    }

    type OpenPairingStream = tokio_stream::wrappers::ReceiverStream<Result<pb::PairingEvent, Status>>;

    async fn open_pairing(&self, req: Request<pb::OpenPairingRequest>) -> Result<Response<Self::OpenPairingStream>, Status> {
        local_only(&req, "OpenPairing")?;
        self.open()?;
        let window_s = req.get_ref().window_s;
        if window_s > 600 {
            return Err(Status::invalid_argument(format!("window_s is {window_s}; a pairing window is open for at most 600 s")));
        }
        let duration = (window_s > 0).then(|| std::time::Duration::from_secs(window_s.into()));
        let (id, window, mut outcomes) = self.remote.open_window(duration)?;
        let state = self.remote.state();
        let opened = pb::PairingOpened {
            code: window.code().to_string(),
            expires_in_s: window.deadline().saturating_duration_since(Instant::now()).as_secs() as u32,
            listen_address: state.listen.map(|a| a.to_string()).unwrap_or_default(),
            device_id: self.remote.device_id().to_string(),
        };
        let (tx, rx) = mpsc::channel(4);
        let remote = self.remote.clone();
        tokio::spawn(async move {
            use pb::pairing_event::Event;
            let send = |e: Event| pb::PairingEvent { event: Some(e) };
            if tx.send(Ok(send(Event::Opened(opened)))).await.is_err() {
                remote.close_window(id);
                return;
            }
            let last = tokio::select! {
                o = outcomes.recv() => match o {
                    Some(PairingOutcome::Paired { device_id, name }) => {
                        Event::Paired(pb::PairingPaired { device_id: device_id.to_string(), name })
                    }
                    Some(PairingOutcome::Closed(reason)) => Event::Closed(pb::PairingClosed { reason }),
                    None => Event::Closed(pb::PairingClosed { reason: "the window was closed".into() }),
                },
                () = tokio::time::sleep_until(window.deadline().into()) => {
                    Event::Closed(pb::PairingClosed { reason: "the code expired unused; nothing was paired".into() })
                }
                // Nobody shows the code any more: nobody may use it.
                () = tx.closed() => Event::Closed(pb::PairingClosed { reason: String::new() }),
            };
            remote.close_window(id);
            let _ = tx.send(Ok(send(last))).await;
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn list_devices(&self, req: Request<pb::ListDevicesRequest>) -> Result<Response<pb::ListDevicesResponse>, Status> {
        local_only(&req, "ListDevices")?;
        Ok(Response::new(pb::ListDevicesResponse { devices: self.remote.devices().iter().map(device_info).collect() }))
    }

    async fn revoke_device(&self, req: Request<pb::RevokeDeviceRequest>) -> Result<Response<pb::RevokeDeviceResponse>, Status> {
        local_only(&req, "RevokeDevice")?;
        let what = req.get_ref().device.trim();
        if what.is_empty() {
            return Err(Status::invalid_argument("device is empty; give a paired device's ID or name"));
        }
        let (device, cut) = self.remote.revoke(what)?;
        Ok(Response::new(pb::RevokeDeviceResponse { device: Some(device_info(&device)), cut_connections: cut as u32 }))
    }
}

fn server_status(s: &ServerState) -> pb::ServerModeStatus {
    pb::ServerModeStatus {
        enabled: s.enabled,
        listen_address: s.listen.map(|a| a.to_string()).unwrap_or_default(),
        advertised: s.advertised,
        remote_connections: s.connections as u32,
        paired_devices: s.paired as u32,
        pairing_open: s.pairing_open,
        lending: s.lending,
        lending_sessions: s.lending_sessions as u32,
    }
}

fn device_info(d: &DeviceInfo) -> pb::PairedDeviceInfo {
    pb::PairedDeviceInfo {
        device_id: d.device.device_id.to_string(),
        name: d.device.name.clone(),
        paired_at: d.device.paired_at,
        last_seen: d.device.last_seen.unwrap_or(0),
        connections: d.connections as u32,
    }
}

/// How a Generate's forwarder treats a caller that stops reading.
struct Stall {
    timeout: Duration,
    /// The job's own cancel flag.
    cancel: Arc<AtomicBool>,
    /// Set when the caller stalled, so the stream ends with that reason.
    stalled: Arc<AtomicBool>,
}

/// Carries a Generate's deltas from the engine (which never waits) to the
/// gRPC stream's buffer, and owns the stall clock: when the buffer stays
/// full for `stall.timeout` (the caller took nothing: a frozen client, an
/// HTTP/2 window left at 0) the job is cancelled and the forwarder ends.
/// Also ends when the job ends or the stream is dropped; with it go the
/// call's admission place and, for the engine, the job's delta channel
/// (a closed channel stops the generation within one token).
async fn forward(mut from: mpsc::UnboundedReceiver<Delta>, to: mpsc::Sender<Delta>, stall: Stall, _admitted: Admitted) {
    loop {
        let delta = tokio::select! {
            d = from.recv() => match d {
                Some(d) => d,
                None => return,
            },
            () = to.closed() => return,
        };
        match tokio::time::timeout(stall.timeout, to.send(delta)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::warn!(
                    timeout_s = stall.timeout.as_secs(),
                    "a caller took none of its answer for the stall timeout; cancelling it"
                );
                stall.stalled.store(true, Ordering::SeqCst);
                stall.cancel.store(true, Ordering::SeqCst);
                return;
            }
        }
    }
}

/// The Generate response: Started, the deltas as they come, then Done.
/// Dropping it (the client went away) stops the generation within one token.
pub struct EventStream {
    started: Option<pb::Started>,
    deltas: mpsc::Receiver<Delta>,
    done: Option<oneshot::Receiver<Result<Finished, EngineError>>>,
    cancel: Arc<AtomicBool>,
    /// The forwarder gave up on this caller (see [`forward`]).
    stalled: Arc<AtomicBool>,
    stall_timeout: Duration,
    seed: u64,
    admitted: Instant,
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
}

fn event(e: pb::generate_event::Event) -> Result<pb::GenerateEvent, Status> {
    Ok(pb::GenerateEvent { event: Some(e) })
}

impl Stream for EventStream {
    type Item = Result<pb::GenerateEvent, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(s) = this.started.take() {
            return Poll::Ready(Some(event(pb::generate_event::Event::Started(s))));
        }
        match this.deltas.poll_recv(cx) {
            Poll::Ready(Some(d)) => {
                return Poll::Ready(Some(event(pb::generate_event::Event::Delta(pb::Delta {
                    text: d.text,
                    tokens: d.tokens,
                    logprobs: d.logprobs.into_iter().map(token_logprob).collect(),
                }))));
            }
            Poll::Ready(None) => {}
            Poll::Pending => return Poll::Pending,
        }
        let Some(done) = this.done.as_mut() else { return Poll::Ready(None) };
        if this.stalled.load(Ordering::SeqCst) {
            // Deltas were dropped: a Done now would not match what was streamed.
            this.done = None;
            return Poll::Ready(Some(Err(DaemonError::Stalled { timeout: this.stall_timeout }.into())));
        }
        let result = match Pin::new(done).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        this.done = None;
        let item = match result {
            Err(_) => Err(DaemonError::ShuttingDown.into()),
            Ok(Err(e)) => Err(DaemonError::from(e).into()),
            Ok(Ok(f)) if f.reason == FinishReason::Cancelled => {
                Err(Status::unavailable("revisd is shutting down; the answer was cut short"))
            }
            Ok(Ok(f)) => {
                let busy_us = f.prompt_us + f.generate_us;
                event(pb::generate_event::Event::Done(pb::Done {
                    finish_reason: match f.reason {
                        FinishReason::End => pb::FinishReason::End,
                        FinishReason::Length => pb::FinishReason::Length,
                        FinishReason::Stop | FinishReason::Cancelled => pb::FinishReason::Stop,
                    } as i32,
                    prompt_tokens: f.prompt_tokens,
                    cached_tokens: f.cached_tokens,
                    generated_tokens: f.generated_tokens,
                    seed: this.seed,
                    prompt_us: f.prompt_us,
                    generate_us: f.generate_us,
                    text: f.text,
                    queue_ms: (this.admitted.elapsed().as_micros() as u64).saturating_sub(busy_us) / 1000,
                    draft_tokens: f.draft_tokens,
                    draft_accepted: f.draft_accepted,
                    batch_peak: f.batch_peak,
                }))
            }
        };
        Poll::Ready(Some(item))
    }
}

use std::future::Future as _;
