//! Tiers and their models: which model serves which tier (a model named by
//! several tiers is loaded once), each model's state (unloaded, loading,
//! ready), loading on first use, and unloading after an idle time.

use revis_proto::Tier;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use revis_engine::render::{RenderChild, RenderPlace};
use revis_engine::{Engine, EngineError, ModelSpec, Tokenizer};

use crate::config::{Config, TierModel};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Unloaded,
    Loading,
    Ready,
}

struct Slot {
    phase: Phase,
    tokenizer: Option<Arc<dyn Tokenizer>>,
    memory_bytes: u64,
    last_used: Instant,
    /// Requests admitted and not finished; an idle unload waits for zero.
    in_use: usize,
}

/// One distinct model.
pub struct Model {
    /// The engine's key for it: its path.
    pub key: String,
    pub name: String,
    pub path: PathBuf,
    pub spec: ModelSpec,
    /// The nodes this model is split across (`tiers.X.split`): it runs in a
    /// split engine (`remote/split/`), never in this process.
    pub split: Vec<String>,
    /// In a split engine: how its layers are placed, for Status.
    pub split_note: String,
    slot: Mutex<Slot>,
    /// Serialises load and unload of this model.
    load_lock: tokio::sync::Mutex<()>,
}

/// What a caller holds while it uses a model: the tokenizer, and a count
/// that keeps the model from an idle unload.
pub struct Lease {
    pub model: Arc<Model>,
    pub tokenizer: Arc<dyn Tokenizer>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut s = self.model.lock();
        s.in_use = s.in_use.saturating_sub(1);
        s.last_used = Instant::now();
    }
}

/// Gives back an `in_use` count taken for a lease that was never handed out.
struct InUse(Arc<Model>);

impl Drop for InUse {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.in_use = s.in_use.saturating_sub(1);
    }
}

/// Puts a model back to Unloaded if its load is abandoned half way.
struct LoadingGuard<'a>(&'a Model);

impl Drop for LoadingGuard<'_> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        if s.phase == Phase::Loading {
            s.phase = Phase::Unloaded;
        }
    }
}

/// A snapshot of one model's state.
#[derive(Clone, Debug)]
pub struct ModelView {
    pub phase: Phase,
    pub memory_bytes: u64,
    /// The context the loaded model really has (the configured one capped
    /// at what the model was trained for); None while unloaded.
    pub n_ctx: Option<u32>,
}

impl Model {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn view(&self) -> ModelView {
        let s = self.lock();
        ModelView { phase: s.phase, memory_bytes: s.memory_bytes, n_ctx: s.tokenizer.as_ref().map(|t| t.n_ctx()) }
    }
}

pub struct Registry {
    engine: Engine,
    /// tier → model
    tiers: BTreeMap<Tier, Arc<Model>>,
    keep_alive: Option<Duration>,
}

impl Registry {
    pub fn new(config: &Config, engine: Engine) -> Registry {
        let mut by_file: BTreeMap<PathBuf, Arc<Model>> = BTreeMap::new();
        let mut tiers = BTreeMap::new();
        let render = render_place(config);
        for (tier, m) in &config.tiers {
            // One file named two ways (a catalog name and a path through a
            // link, a relative and an absolute path) is still one model.
            let file = std::fs::canonicalize(&m.path).unwrap_or_else(|_| m.path.clone());
            let model = by_file.entry(file).or_insert_with(|| Arc::new(Model::new(m, render.clone()))).clone();
            tiers.insert(*tier, model);
        }
        Registry { engine, tiers, keep_alive: config.keep_alive }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn tier(&self, tier: Tier) -> Option<&Arc<Model>> {
        self.tiers.get(&tier)
    }

    pub fn tiers(&self) -> impl Iterator<Item = (Tier, &Arc<Model>)> {
        self.tiers.iter().map(|(t, m)| (*t, m))
    }

    /// Tiers other than `tier` served by the same model.
    pub fn shared_with(&self, tier: Tier) -> Vec<Tier> {
        let Some(m) = self.tiers.get(&tier) else { return Vec::new() };
        self.tiers.iter().filter(|(t, o)| **t != tier && Arc::ptr_eq(o, m)).map(|(t, _)| *t).collect()
    }

    /// Every distinct model once.
    pub fn models(&self) -> Vec<Arc<Model>> {
        let mut out: Vec<Arc<Model>> = Vec::new();
        for m in self.tiers.values() {
            if !out.iter().any(|o| Arc::ptr_eq(o, m)) {
                out.push(m.clone());
            }
        }
        out
    }

    /// The model, loaded (on first use) and leased to the caller.
    pub async fn lease(&self, model: &Arc<Model>) -> Result<Lease, EngineError> {
        {
            let mut s = model.lock();
            s.in_use += 1;
            if let (Phase::Ready, Some(t)) = (s.phase, s.tokenizer.clone()) {
                s.last_used = Instant::now();
                return Ok(Lease { model: model.clone(), tokenizer: t });
            }
        }
        // The count is given back if loading fails or the caller goes away
        // while it waits (its future is dropped).
        let pending = InUse(model.clone());
        let tokenizer = self.load(model).await?;
        std::mem::forget(pending);
        Ok(Lease { model: model.clone(), tokenizer })
    }

    /// Loads a model if it is not loaded; returns its tokenizer.
    pub async fn load(&self, model: &Arc<Model>) -> Result<Arc<dyn Tokenizer>, EngineError> {
        // A split model's RPC client may abort the process: it loads only in its split engine.
        if !model.split.is_empty() {
            return Err(EngineError::Llama(format!(
                "{} is split across {}; it runs in its split engine, not here",
                model.name,
                model.split.join(", ")
            )));
        }
        let _g = model.load_lock.lock().await;
        {
            let mut s = model.lock();
            if let (Phase::Ready, Some(t)) = (s.phase, s.tokenizer.clone()) {
                return Ok(t);
            }
            s.phase = Phase::Loading;
        }
        tracing::info!(model = %model.name, path = %model.path.display(), "loading");
        let loading = LoadingGuard(model);
        let result = self.engine.load(&model.key, model.spec.clone()).await;
        drop(loading);
        let mut s = model.lock();
        match result {
            Ok(loaded) => {
                tracing::info!(model = %model.name, ms = loaded.load_ms, mb = loaded.memory_bytes >> 20, "loaded");
                s.phase = Phase::Ready;
                s.tokenizer = Some(loaded.tokenizer.clone());
                s.memory_bytes = loaded.memory_bytes;
                s.last_used = Instant::now();
                Ok(loaded.tokenizer)
            }
            Err(e) => {
                tracing::warn!(model = %model.name, "load failed: {e}");
                s.phase = Phase::Unloaded;
                Err(e)
            }
        }
    }

    /// Unloads a model; true if it was loaded. Requests already queued for
    /// it fail with UNAVAILABLE; their leases hold the weights until they end.
    pub async fn unload(&self, model: &Arc<Model>) -> Result<bool, EngineError> {
        let _g = model.load_lock.lock().await;
        self.unload_locked(model).await
    }

    /// Unloads a model only if it is still idle once the load lock is held
    /// (a request may have leased it since the idle check).
    async fn unload_if_idle(&self, model: &Arc<Model>, keep: Duration) -> Result<bool, EngineError> {
        let _g = model.load_lock.lock().await;
        {
            let s = model.lock();
            if !(s.phase == Phase::Ready && s.in_use == 0 && s.last_used.elapsed() >= keep) {
                return Ok(false);
            }
        }
        self.unload_locked(model).await
    }

    async fn unload_locked(&self, model: &Arc<Model>) -> Result<bool, EngineError> {
        {
            let mut s = model.lock();
            s.phase = Phase::Unloaded;
            // Drop our tokenizer first: it shares the weights the engine frees.
            s.tokenizer = None;
            s.memory_bytes = 0;
        }
        let was = self.engine.unload(&model.key).await?;
        if was {
            tracing::info!(model = %model.name, "unloaded");
        }
        Ok(was)
    }

    /// Unloads models idle for longer than keep-alive. Runs until the process ends.
    pub async fn unload_idle_models(self: Arc<Self>) {
        let Some(keep) = self.keep_alive else { return };
        let tick = (keep / 4).clamp(Duration::from_millis(250), Duration::from_secs(30));
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            for m in self.models() {
                let idle = {
                    let s = m.lock();
                    s.phase == Phase::Ready && s.in_use == 0 && s.last_used.elapsed() >= keep
                };
                if idle {
                    match self.unload_if_idle(&m, keep).await {
                        Ok(true) => tracing::info!(model = %m.name, "was idle for {}s: unloaded", keep.as_secs()),
                        Ok(false) => {}
                        Err(e) => tracing::warn!("idle unload failed: {e}"),
                    }
                }
            }
        }
    }
}

/// Where models' chat templates render: in rendering processes of their
/// own (this program's `render-worker`), bounded by
/// `daemon.render_memory_mb` and, a little past the request's own limit,
/// `daemon.render_timeout_s` (revis_engine::render).
fn render_place(config: &Config) -> RenderPlace {
    match std::env::current_exe() {
        Ok(program) => RenderPlace::Child(RenderChild {
            program,
            args: vec!["render-worker".into(), "--memory-limit".into(), config.render_memory_bytes.to_string()],
            memory_limit: config.render_memory_bytes,
            timeout: config.render_timeout + RENDER_KILL_AFTER,
        }),
        Err(e) => {
            tracing::warn!("chat templates render in revisd's own process, unbounded in memory: its program is unknown ({e})");
            RenderPlace::Here
        }
    }
}

/// How long past `daemon.render_timeout_s` a rendering process is killed:
/// the request has failed by then and marked the template (rpc/prompt.rs);
/// this frees its thread.
const RENDER_KILL_AFTER: Duration = Duration::from_secs(2);

impl Model {
    fn new(m: &TierModel, render: RenderPlace) -> Model {
        Model {
            key: m.path.display().to_string(),
            name: m.name.clone(),
            path: m.path.clone(),
            spec: ModelSpec {
                path: m.path.clone(),
                n_ctx: m.context,
                threads: m.threads,
                batch: m.batch,
                cache_slots: m.cache_slots,
                cache_budget_bytes: m.cache_budget_bytes,
                probe: m.speculate != revis_engine::Speculate::Off,
                split: m.engine_split.as_ref().map(|e| e.split.clone()),
                streams: m.streams,
                render,
            },
            split: m.split.clone(),
            split_note: m.engine_split.as_ref().map(|e| e.note.clone()).unwrap_or_default(),
            slot: Mutex::new(Slot { phase: Phase::Unloaded, tokenizer: None, memory_bytes: 0, last_used: Instant::now(), in_use: 0 }),
            load_lock: tokio::sync::Mutex::new(()),
        }
    }
}
