//! The engine thread: owns every loaded model and its context, runs one job
//! at a time, and talks to async callers over channels (readiness and
//! results via oneshot, deltas via an unbounded mpsc). It never waits for a
//! consumer: a caller that stops reading must not hold up everyone else's
//! jobs. Whoever reads the deltas decides how long a caller may stall (the
//! daemon cancels the job after its stall timeout); until then a job's
//! deltas are at most one per generated token, so `max_tokens` bounds them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::{Backend, Delta, EngineError, Finished, ModelSpec, ModelStats, Prefilled, Prompt, Sampling, Scored, Session, Token, Tokenizer};

pub struct GenerateJob {
    pub prompt: Prompt,
    pub sampling: Sampling,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    /// A grammar from [`Tokenizer::json_grammar`], for JSON output.
    pub grammar: Option<String>,
    /// Report each token's log-probability with this many alternatives
    /// (in [`Delta::logprobs`]); None = no log-probabilities.
    pub logprobs: Option<u32>,
    /// Draft tokens from the context and verify them in one batch (prompt
    /// lookup decoding, [`crate::lookup`]): the same text when greedy, the
    /// same distribution when sampled; `Auto` drafts only where it pays.
    pub speculate: crate::lookup::Speculate,
}

pub struct PrefillJob {
    pub prompt: Prompt,
}

pub struct ScoreJob {
    /// What the continuations follow, with where its batches end.
    pub prefix: Prompt,
    /// Scored one after another after the prefix, which is evaluated once.
    pub continuations: Vec<Vec<Token>>,
    /// Alternatives per position.
    pub top: u32,
}

pub struct EmbedJob {
    /// Each text's tokens (BOS included where the model wants one).
    pub texts: Vec<Vec<Token>>,
}

/// Work for a loaded model, with where its results go.
pub enum Job {
    Generate { job: GenerateJob, deltas: tmpsc::UnboundedSender<Delta>, done: oneshot::Sender<Result<Finished, EngineError>> },
    Prefill { job: PrefillJob, done: oneshot::Sender<Result<Prefilled, EngineError>> },
    Score { job: ScoreJob, done: oneshot::Sender<Result<Vec<Scored>, EngineError>> },
    Embed { job: EmbedJob, done: oneshot::Sender<Result<Vec<Vec<f32>>, EngineError>> },
}

impl Job {
    /// True if nobody waits for the result any more.
    pub fn abandoned(&self) -> bool {
        match self {
            Job::Generate { deltas, done, .. } => deltas.is_closed() || done.is_closed(),
            Job::Prefill { done, .. } => done.is_closed(),
            Job::Score { done, .. } => done.is_closed(),
            Job::Embed { done, .. } => done.is_closed(),
        }
    }
}

/// What a load returns to the caller.
#[derive(Clone)]
pub struct LoadedModel {
    pub tokenizer: Arc<dyn Tokenizer>,
    /// Resident memory the load added (weights, context, buffers).
    pub memory_bytes: u64,
    pub load_ms: u64,
}

enum Command {
    Load { key: String, spec: ModelSpec, reply: oneshot::Sender<Result<LoadedModel, EngineError>> },
    Unload { key: String, reply: oneshot::Sender<bool> },
    Purge { key: Option<String>, reply: oneshot::Sender<(u32, u64)> },
    Run { key: String, job: Job, cancel: Arc<AtomicBool>, hold: Box<dyn std::any::Any + Send>, _finished: oneshot::Sender<()> },
}

/// Handle to the engine thread. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Command>,
    shutdown: Arc<AtomicBool>,
    stats: Arc<Mutex<HashMap<String, ModelStats>>>,
}

impl Engine {
    /// Starts the engine thread.
    pub fn spawn(backend: Arc<dyn Backend>) -> Engine {
        let (tx, rx) = mpsc::channel();
        let shutdown = Arc::new(AtomicBool::new(false));
        let flag = shutdown.clone();
        let stats = Arc::new(Mutex::new(HashMap::new()));
        let published = stats.clone();
        std::thread::Builder::new()
            .name("revis-engine".into())
            .spawn(move || engine_loop(backend, rx, flag, published))
            .expect("spawn the engine thread");
        Engine { tx, shutdown, stats }
    }

    pub async fn load(&self, key: &str, spec: ModelSpec) -> Result<LoadedModel, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Load { key: key.to_owned(), spec, reply })?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }

    /// Frees a model; true if it was loaded.
    pub async fn unload(&self, key: &str) -> Result<bool, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Unload { key: key.to_owned(), reply })?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Drops cached prefixes of one model or all; returns (prefixes, bytes).
    pub async fn purge(&self, key: Option<&str>) -> Result<(u32, u64), EngineError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Purge { key: key.map(str::to_owned), reply })?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Cache figures of each loaded model, answered at once, even while a
    /// job runs. They are published before a job's or a purge's reply is
    /// sent, so what follows a reply sees what that job or purge did.
    pub fn stats(&self) -> HashMap<String, ModelStats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Runs a job. The returned receiver resolves when the engine is done
    /// with it (its results went to the job's own channels). Setting `cancel`
    /// stops it within one token step. `hold` is dropped on the engine thread
    /// right after the job, before the next command: whatever it keeps alive
    /// (a model lease) is released before an unload that follows can run.
    pub fn run(&self, key: &str, job: Job, cancel: Arc<AtomicBool>, hold: Box<dyn std::any::Any + Send>) -> oneshot::Receiver<()> {
        let (finished, rx) = oneshot::channel();
        // If the thread is gone the command is dropped and `rx` resolves at once.
        let _ = self.tx.send(Command::Run { key: key.to_owned(), job, cancel, hold, _finished: finished });
        rx
    }

    /// Cancels running work and refuses new jobs (shutdown).
    pub fn cancel_all(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
    }

    fn send(&self, c: Command) -> Result<(), EngineError> {
        self.tx.send(c).map_err(|_| EngineError::Stopped)
    }
}

fn engine_loop(
    backend: Arc<dyn Backend>,
    rx: mpsc::Receiver<Command>,
    shutdown: Arc<AtomicBool>,
    published: Arc<Mutex<HashMap<String, ModelStats>>>,
) {
    let mut models: HashMap<String, Box<dyn Session>> = HashMap::new();
    while let Ok(cmd) = rx.recv() {
        handle(cmd, &backend, &mut models, &shutdown, &published);
        publish_all(&models, &published);
    }
}

fn publish_all(models: &HashMap<String, Box<dyn Session>>, published: &Mutex<HashMap<String, ModelStats>>) {
    let stats = models.iter().map(|(k, s)| (k.clone(), s.stats())).collect();
    *published.lock().unwrap_or_else(|p| p.into_inner()) = stats;
}

fn handle(
    cmd: Command,
    backend: &Arc<dyn Backend>,
    models: &mut HashMap<String, Box<dyn Session>>,
    shutdown: &AtomicBool,
    published: &Mutex<HashMap<String, ModelStats>>,
) {
    {
        match cmd {
            Command::Load { key, spec, reply } => {
                if reply.is_closed() {
                    return;
                }
                let started = Instant::now();
                let before = crate::rss_bytes();
                // Loading again replaces the old copy; free it first.
                if models.remove(&key).is_some() {
                    backend.release_memory();
                }
                let result = backend.load(&spec).map(|(tokenizer, session)| {
                    models.insert(key.clone(), session);
                    LoadedModel {
                        tokenizer,
                        memory_bytes: crate::rss_bytes().saturating_sub(before),
                        load_ms: started.elapsed().as_millis() as u64,
                    }
                });
                let _ = reply.send(result);
            }
            Command::Unload { key, reply } => {
                let was = models.remove(&key).is_some();
                if was {
                    backend.release_memory();
                }
                let _ = reply.send(was);
            }
            Command::Purge { key, reply } => {
                let mut total = (0, 0);
                for (k, s) in models.iter_mut() {
                    if key.as_deref().is_none_or(|want| want == k) {
                        let (n, b) = s.purge();
                        total = (total.0 + n, total.1 + b);
                    }
                }
                publish_all(models, published);
                let _ = reply.send(total);
            }
            Command::Run { key, job, cancel, hold, _finished } => {
                let _hold = hold;
                if job.abandoned() {
                    return;
                }
                let stopped = || shutdown.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed);
                let Some(session) = models.get_mut(&key) else {
                    fail(job, EngineError::NotLoaded(key));
                    return;
                };
                if stopped() {
                    fail(job, EngineError::Stopped);
                    return;
                }
                // A job's figures are published before its reply goes out, so
                // a Status that follows a reply counts what that job cached.
                let publish = |s: &dyn Session| {
                    published.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), s.stats());
                };
                run_job(session.as_mut(), job, &stopped, &publish);
            }
        }
    }
}

fn run_job(session: &mut dyn Session, job: Job, stopped: &dyn Fn() -> bool, publish: &dyn Fn(&dyn Session)) {
    match job {
        Job::Generate { job, deltas, done } => {
            let cancelled = || stopped() || deltas.is_closed();
            // Never a blocking send: the engine must not wait for a consumer.
            let mut emit = |d: Delta| !stopped() && deltas.send(d).is_ok();
            let result = session.generate(&job, &mut emit, &cancelled);
            publish(session);
            let _ = done.send(result);
        }
        Job::Prefill { job, done } => {
            let cancelled = || stopped() || done.is_closed();
            let result = session.prefill(&job.prompt, &cancelled);
            publish(session);
            let _ = done.send(result);
        }
        Job::Score { job, done } => {
            let cancelled = || stopped() || done.is_closed();
            let result = session.score(&job.prefix, &job.continuations, job.top, &cancelled);
            publish(session);
            let _ = done.send(result);
        }
        Job::Embed { job, done } => {
            let cancelled = || stopped() || done.is_closed();
            let result = session.embed(&job.texts, &cancelled);
            publish(session);
            let _ = done.send(result);
        }
    }
}

fn fail(job: Job, e: EngineError) {
    match job {
        Job::Generate { done, .. } => {
            let _ = done.send(Err(e));
        }
        Job::Prefill { done, .. } => {
            let _ = done.send(Err(e));
        }
        Job::Score { done, .. } => {
            let _ = done.send(Err(e));
        }
        Job::Embed { done, .. } => {
            let _ = done.send(Err(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    /// A model that counts the prompts it was given.
    struct Counting(u32);

    impl Session for Counting {
        fn generate(&mut self, _: &GenerateJob, _: &mut dyn FnMut(Delta) -> bool, _: &dyn Fn() -> bool) -> Result<Finished, EngineError> {
            unreachable!("prefill only")
        }
        fn prefill(&mut self, prompt: &Prompt, _: &dyn Fn() -> bool) -> Result<Prefilled, EngineError> {
            self.0 += 1;
            Ok(Prefilled { prompt_tokens: prompt.tokens.len() as u32, cached_tokens: 0, elapsed_us: 0 })
        }
        fn score(&mut self, _: &Prompt, _: &[Vec<Token>], _: u32, _: &dyn Fn() -> bool) -> Result<Vec<Scored>, EngineError> {
            unreachable!("prefill only")
        }
        fn embed(&mut self, _: &[Vec<Token>], _: &dyn Fn() -> bool) -> Result<Vec<Vec<f32>>, EngineError> {
            unreachable!("prefill only")
        }
        fn purge(&mut self) -> (u32, u64) {
            (std::mem::take(&mut self.0), 0)
        }
        fn stats(&self) -> ModelStats {
            ModelStats { cached_prefixes: self.0, cache_bytes: 0, n_ctx: 64 }
        }
    }

    struct NoText;

    impl Tokenizer for NoText {
        fn render(&self, _: &[Message], _: bool) -> Result<String, EngineError> {
            Ok(String::new())
        }
        fn tokenize(&self, _: &str, _: bool) -> Vec<Token> {
            Vec::new()
        }
        fn tokenize_plain(&self, _: &str) -> Vec<Token> {
            Vec::new()
        }
        fn n_ctx(&self) -> u32 {
            64
        }
        fn json_grammar(&self, _: Option<&str>) -> Result<String, EngineError> {
            Ok(String::new())
        }
    }

    struct Fake;

    impl Backend for Fake {
        fn load(&self, _: &ModelSpec) -> Result<crate::Loaded, EngineError> {
            Ok((Arc::new(NoText), Box::new(Counting(0))))
        }
    }

    /// Held by a job and dropped on the engine thread after it, where it
    /// waits until the test lets go: the engine is still busy with the job.
    struct Gate(std::sync::mpsc::Receiver<()>);

    impl Drop for Gate {
        fn drop(&mut self) {
            let _ = self.0.recv();
        }
    }

    fn spec() -> ModelSpec {
        ModelSpec {
            path: "fake.gguf".into(),
            n_ctx: 64,
            threads: 1,
            batch: 8,
            cache_slots: 1,
            cache_budget_bytes: 0,
            probe: false,
            split: None,
        }
    }

    #[tokio::test]
    async fn a_jobs_figures_are_out_before_its_reply() {
        let engine = Engine::spawn(Arc::new(Fake));
        engine.load("m", spec()).await.unwrap();
        assert_eq!(engine.stats()["m"].cached_prefixes, 0);
        let (release, gate) = std::sync::mpsc::channel();
        let (done, reply) = oneshot::channel();
        let prompt = Prompt { tokens: vec![1, 2, 3], split: 0, answer: 3 };
        let finished = engine.run("m", Job::Prefill { job: PrefillJob { prompt }, done }, Arc::default(), Box::new(Gate(gate)));
        assert_eq!(reply.await.unwrap().unwrap().prompt_tokens, 3);
        // The engine thread is still inside the job (the gate holds it).
        assert_eq!(engine.stats()["m"].cached_prefixes, 1, "Status after the reply counts the job");
        release.send(()).unwrap();
        let _ = finished.await;
        assert_eq!(engine.purge(None).await.unwrap(), (1, 0));
        assert_eq!(engine.stats()["m"].cached_prefixes, 0, "and after a purge's reply, the purge");
    }
}
