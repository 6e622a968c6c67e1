//! The engine thread: owns every loaded model and its context, decodes
//! the generations of a model together (one batch a step, a person's first:
//! [`Share`]), runs other jobs between steps, and talks to async callers over channels (readiness and
//! results via oneshot, deltas via an unbounded mpsc). It never waits for a
//! consumer: a caller that stops reading must not hold up everyone else's
//! jobs. Whoever reads the deltas decides how long a caller may stall (the
//! daemon cancels the job after its stall timeout); until then a job's
//! deltas are at most one per generated token, so `max_tokens` bounds them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::{
    Backend, Delta, EngineError, Finished, ModelSpec, ModelStats, Prefilled, Prompt, Sampling, Scored, Session, StreamId, Token, Tokenizer,
};

pub struct GenerateJob {
    pub prompt: Prompt,
    pub sampling: Sampling,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    /// A grammar the answer keeps to: from [`Tokenizer::json_grammar`] for
    /// JSON output, from [`crate::tools::plan`] for function calls.
    pub grammar: Option<crate::Grammar>,
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

/// Whose work a job is: a person waiting for it, or the background. A
/// person's streams keep at least [`USER_SHARE`] of the speed they would
/// have alone while background work shares the engine with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    User,
    Background,
}

enum Command {
    Load { key: String, spec: ModelSpec, reply: oneshot::Sender<Result<LoadedModel, EngineError>> },
    Unload { key: String, reply: oneshot::Sender<bool> },
    Purge { key: Option<String>, reply: oneshot::Sender<(u32, u64)> },
    Run { key: String, job: Job, class: Class, cancel: Arc<AtomicBool>, hold: Box<dyn std::any::Any + Send>, finished: oneshot::Sender<()> },
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
            .spawn(move || {
                let mut state = State {
                    backend,
                    models: HashMap::new(),
                    pending: VecDeque::new(),
                    running: Vec::new(),
                    share: Share::default(),
                    shutdown: flag,
                    published,
                };
                state.run(rx);
            })
            .expect("spawn the engine thread");
        Engine { tx, shutdown, stats }
    }

    pub async fn load(&self, key: &str, spec: ModelSpec) -> Result<LoadedModel, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Load { key: key.to_owned(), spec, reply })?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }

    /// Frees a model; true if it was loaded. Waits while generations run on it.
    pub async fn unload(&self, key: &str) -> Result<bool, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Unload { key: key.to_owned(), reply })?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Drops cached prefixes of one model or all (not what running
    /// generations hold); returns (prefixes, bytes).
    pub async fn purge(&self, key: Option<&str>) -> Result<(u32, u64), EngineError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Purge { key: key.map(str::to_owned), reply })?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Cache figures of each loaded model, answered at once, even while
    /// jobs run. They are published before a job's or a purge's reply is
    /// sent, so what follows a reply sees what that job or purge did.
    pub fn stats(&self) -> HashMap<String, ModelStats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Runs a job. The returned receiver resolves when the engine is done
    /// with it (its results went to the job's own channels). Generations
    /// decode together with the others running on the same model (up to
    /// its streams); other jobs run between their steps. Setting `cancel`
    /// stops it within one step. `hold` is dropped on the engine thread
    /// right after the job: whatever it keeps alive (a model lease) is
    /// released before an unload that follows can run.
    pub fn run(
        &self,
        key: &str,
        job: Job,
        class: Class,
        cancel: Arc<AtomicBool>,
        hold: Box<dyn std::any::Any + Send>,
    ) -> oneshot::Receiver<()> {
        let (finished, rx) = oneshot::channel();
        // If the thread is gone the command is dropped and `rx` resolves at once.
        let _ = self.tx.send(Command::Run { key: key.to_owned(), job, class, cancel, hold, finished });
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

/// A generation between its steps, with where its results go.
struct Running {
    key: String,
    id: StreamId,
    class: Class,
    cancel: Arc<AtomicBool>,
    deltas: tmpsc::UnboundedSender<Delta>,
    done: oneshot::Sender<Result<Finished, EngineError>>,
    _hold: Box<dyn std::any::Any + Send>,
    _finished: oneshot::Sender<()>,
}

/// What the engine thread owns.
struct State {
    backend: Arc<dyn Backend>,
    models: HashMap<String, Box<dyn Session>>,
    /// Commands that wait: for a free sequence, for generations on the
    /// model they unload, or (background work) for the person's share.
    pending: VecDeque<Command>,
    running: Vec<Running>,
    share: Share,
    shutdown: Arc<AtomicBool>,
    published: Arc<Mutex<HashMap<String, ModelStats>>>,
}

impl State {
    fn run(&mut self, rx: mpsc::Receiver<Command>) {
        loop {
            if self.running.is_empty() && self.pending.is_empty() {
                match rx.recv() {
                    Ok(c) => self.pending.push_back(c),
                    Err(_) => break,
                }
            }
            while let Ok(c) = rx.try_recv() {
                self.pending.push_back(c);
            }
            self.admit();
            self.step();
        }
    }

    /// Runs or starts what may run now, in order; the rest waits. With
    /// nothing running every command may run, so nothing waits forever.
    fn admit(&mut self) {
        for _ in 0..self.pending.len() {
            let Some(cmd) = self.pending.pop_front() else { break };
            if self.may_run(&cmd) {
                self.execute(cmd);
            } else {
                self.pending.push_back(cmd);
            }
        }
    }

    fn may_run(&self, cmd: &Command) -> bool {
        let has_streams = |key: &str| self.running.iter().any(|r| r.key == key);
        match cmd {
            Command::Load { key, .. } | Command::Unload { key, .. } => !has_streams(key),
            Command::Purge { .. } => true,
            Command::Run { key, job, class, .. } => {
                if job.abandoned() {
                    return true;
                }
                let needs_sequence = !matches!(job, Job::Embed { .. });
                if needs_sequence && self.models.get(key).is_some_and(|s| !s.has_free_sequence()) {
                    return false;
                }
                *class == Class::User || !self.user_waits() || self.share.may_spend()
            }
        }
    }

    fn user_waits(&self) -> bool {
        self.running.iter().any(|r| r.class == Class::User)
    }

    fn publish(&self, key: &str) {
        if let Some(s) = self.models.get(key) {
            self.published.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_owned(), s.stats());
        }
    }

    fn publish_all(&self) {
        let stats = self.models.iter().map(|(k, s)| (k.clone(), s.stats())).collect();
        *self.published.lock().unwrap_or_else(|p| p.into_inner()) = stats;
    }

    fn execute(&mut self, cmd: Command) {
        match cmd {
            Command::Load { key, spec, reply } => {
                if reply.is_closed() {
                    return;
                }
                let started = Instant::now();
                let before = crate::rss_bytes();
                // Loading again replaces the old copy; free it first.
                if self.models.remove(&key).is_some() {
                    self.backend.release_memory();
                }
                let result = self.backend.load(&spec).map(|(tokenizer, session)| {
                    self.models.insert(key.clone(), session);
                    LoadedModel {
                        tokenizer,
                        memory_bytes: crate::rss_bytes().saturating_sub(before),
                        load_ms: started.elapsed().as_millis() as u64,
                    }
                });
                self.publish_all();
                let _ = reply.send(result);
            }
            Command::Unload { key, reply } => {
                let was = self.models.remove(&key).is_some();
                if was {
                    self.backend.release_memory();
                }
                self.publish_all();
                let _ = reply.send(was);
            }
            Command::Purge { key, reply } => {
                let mut total = (0, 0);
                for (k, s) in self.models.iter_mut() {
                    if key.as_deref().is_none_or(|want| want == k) {
                        let (n, b) = s.purge();
                        total = (total.0 + n, total.1 + b);
                    }
                }
                self.publish_all();
                let _ = reply.send(total);
            }
            Command::Run { key, job, class, cancel, hold, finished } => {
                if job.abandoned() {
                    return;
                }
                let shutdown = self.shutdown.clone();
                let stopped = || shutdown.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed);
                let Some(session) = self.models.get_mut(&key) else {
                    fail(job, EngineError::NotLoaded(key));
                    return;
                };
                if stopped() {
                    fail(job, EngineError::Stopped);
                    return;
                }
                let background_over_user = class == Class::Background && self.running.iter().any(|r| r.class == Class::User);
                let started = Instant::now();
                let published = &self.published;
                // A job's figures are published before its reply goes out, so
                // a Status that follows a reply counts what that job cached.
                let publish = |s: &dyn Session| {
                    published.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), s.stats());
                };
                match job {
                    // Its prompt is evaluated in the steps that follow, with
                    // the others joining then (`Session::join`).
                    Job::Generate { job, deltas, done } => match session.start(job) {
                        Ok(id) => self.running.push(Running { key, id, class, cancel, deltas, done, _hold: hold, _finished: finished }),
                        Err(e) => {
                            publish(session.as_ref());
                            let _ = done.send(Err(e));
                        }
                    },
                    other => {
                        session.set_background(class == Class::Background);
                        run_job(session.as_mut(), other, &stopped, &publish)
                    }
                }
                if background_over_user {
                    self.share.spend(started.elapsed());
                }
            }
        }
    }

    /// Ends cancelled generations, then, for each model, evaluates one batch
    /// of the prompts joining and decodes one step of the streams decoding:
    /// a person's always, background ones while the person's share allows.
    fn step(&mut self) {
        let stopping = self.shutdown.load(Ordering::Relaxed);
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            if stopping || r.cancel.load(Ordering::Relaxed) || r.deltas.is_closed() {
                let r = self.running.remove(i);
                if let Some(session) = self.models.get_mut(&r.key) {
                    let f = session.cancel(r.id);
                    self.publish(&r.key);
                    let _ = r.done.send(Ok(f));
                }
            } else {
                i += 1;
            }
        }
        let user_waits = self.user_waits();
        let mut keys: Vec<String> = Vec::new();
        for r in &self.running {
            if !keys.contains(&r.key) {
                keys.push(r.key.clone());
            }
        }
        for key in keys {
            let Some(session) = self.models.get_mut(&key) else {
                // Not reached (a lease keeps the model loaded), but never spin on it.
                self.running.retain(|r| r.key != key);
                continue;
            };
            let of = |class: Class, joining: bool| -> Vec<StreamId> {
                self.running.iter().filter(|r| r.key == key && r.class == class && session.joining(r.id) == joining).map(|r| r.id).collect()
            };
            let background_may = !user_waits || self.share.may_spend();
            // Prompts joining: one batch of them (a person's first), then the
            // step, so a join delays the others by at most one batch.
            let mut joiners = of(Class::User, true);
            let background_only = joiners.is_empty();
            if background_may {
                joiners.extend(of(Class::Background, true));
            }
            if !joiners.is_empty() {
                session.set_background(background_only);
                let mut emit = emitter(&self.running, &key);
                let started = Instant::now();
                let joined = session.join(&joiners, &mut emit);
                drop(emit);
                let took = started.elapsed();
                tracing::trace!(model = %key, prompts = joined.advanced.len(), us = took.as_micros() as u64, "join");
                let background = joined
                    .advanced
                    .iter()
                    .filter(|&&id| self.running.iter().any(|r| r.key == key && r.id == id && r.class == Class::Background))
                    .count();
                if user_waits && background > 0 {
                    // The background prompts' part of the batch (theirs are as long as the rest).
                    self.share.spend(took.mul_f64(background as f64 / joined.advanced.len() as f64));
                }
                self.end(&key, joined.ended);
            }
            let Some(session) = self.models.get_mut(&key) else { continue };
            let of = |class: Class| -> Vec<StreamId> {
                self.running.iter().filter(|r| r.key == key && r.class == class && !session.joining(r.id)).map(|r| r.id).collect()
            };
            let (users, background) = (of(Class::User), of(Class::Background));
            let mut rows = users.clone();
            if background_may {
                rows.extend(background);
            }
            if rows.is_empty() {
                continue;
            }
            session.set_background(users.is_empty());
            let mut emit = emitter(&self.running, &key);
            let started = Instant::now();
            let result = session.step(&rows, &mut emit);
            drop(emit);
            tracing::trace!(model = %key, rows = rows.len(), us = started.elapsed().as_micros() as u64, "step");
            if user_waits {
                self.share.stepped(&key, users.len(), rows.len() > users.len(), started.elapsed());
            }
            let ended: Vec<(StreamId, Result<Finished, EngineError>)> = match result {
                Ok(done) => done.into_iter().map(|(id, f)| (id, Ok(f))).collect(),
                Err(e) => rows.iter().map(|&id| (id, Err(e.clone()))).collect(),
            };
            self.end(&key, ended);
        }
        if !user_waits {
            self.share.reset();
        }
    }
}

impl State {
    /// Answers the streams of model `key` that ended, after publishing its figures.
    fn end(&mut self, key: &str, ended: Vec<(StreamId, Result<Finished, EngineError>)>) {
        if ended.is_empty() {
            return;
        }
        self.publish(key);
        for (id, result) in ended {
            if let Some(at) = self.running.iter().position(|r| r.key == key && r.id == id) {
                let r = self.running.remove(at);
                let _ = r.done.send(result);
            }
        }
    }
}

/// Where the deltas of model `key`'s streams go: false once a stream's
/// caller has gone or cancelled it. Never a blocking send.
fn emitter<'a>(running: &'a [Running], key: &'a str) -> impl FnMut(StreamId, Delta) -> bool + 'a {
    move |id, d| {
        running.iter().find(|r| r.key == key && r.id == id).is_some_and(|r| !r.cancel.load(Ordering::Relaxed) && r.deltas.send(d).is_ok())
    }
}

fn run_job(session: &mut dyn Session, job: Job, stopped: &dyn Fn() -> bool, publish: &dyn Fn(&dyn Session)) {
    match job {
        Job::Generate { .. } => unreachable!("generations start as streams"),
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

/// The least share of its solo speed a person's stream keeps while
/// background work shares the engine: background rows join a step, and
/// background jobs run between steps, only while the time they have added
/// to the person's steps stays within `1 / USER_SHARE - 1` of those steps'
/// solo cost (0.9: 11 %). Above the 0.8 by a margin: what a
/// background row costs the person's next steps (caches it evicted) is not
/// charged, and at 0.85 the benchmark measured 0.78 on the 2-core machine.
pub const USER_SHARE: f64 = 0.9;

/// The most background time saved up while a person's stream runs alone,
/// so background work cannot take it in one long burst.
const MAX_CREDIT_US: f64 = 100_000.0;

/// How much background work a person's streams can carry now: credit
/// earned by their steps, spent by what background work adds to them.
#[derive(Debug, Default)]
pub(crate) struct Share {
    credit_us: f64,
    /// Mean time of a step with only a person's rows, by model and rows.
    solo_us: HashMap<String, [f64; crate::MAX_STREAMS as usize + 1]>,
}

impl Share {
    pub(crate) fn may_spend(&self) -> bool {
        self.credit_us > 0.0
    }

    /// Background work that ran while a person waited.
    pub(crate) fn spend(&mut self, took: std::time::Duration) {
        self.credit_us -= took.as_secs_f64() * 1e6;
    }

    /// A step of model `key` with `users` rows of a person's streams (0:
    /// background rows only, while a person waits on another model), and
    /// background rows too when `mixed`.
    pub(crate) fn stepped(&mut self, key: &str, users: usize, mixed: bool, took: std::time::Duration) {
        let us = took.as_secs_f64() * 1e6;
        if users == 0 {
            self.credit_us -= us;
            return;
        }
        let allowance = 1.0 / USER_SHARE - 1.0;
        if !self.solo_us.contains_key(key) {
            self.solo_us.insert(key.to_owned(), [0.0; crate::MAX_STREAMS as usize + 1]);
        }
        let by_rows = self.solo_us.get_mut(key).expect("inserted above");
        let solo = &mut by_rows[users.min(crate::MAX_STREAMS as usize)];
        if mixed {
            // What the background rows added; all of it while the solo cost is unknown.
            let base = solo.min(us);
            self.credit_us += allowance * base - (us - base);
        } else {
            *solo = if *solo == 0.0 { us } else { *solo + 0.1 * (us - *solo) };
            self.credit_us += allowance * *solo;
        }
        self.credit_us = self.credit_us.min(MAX_CREDIT_US);
    }

    /// No person waits: nothing to keep.
    pub(crate) fn reset(&mut self) {
        self.credit_us = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    /// A model that counts the prompts it was given.
    struct Counting(u32);

    impl Session for Counting {
        fn streams(&self) -> usize {
            1
        }
        fn has_free_sequence(&self) -> bool {
            true
        }
        fn start(&mut self, _: GenerateJob) -> Result<StreamId, EngineError> {
            unreachable!("prefill only")
        }
        fn joining(&self, _: StreamId) -> bool {
            unreachable!("prefill only")
        }
        fn join(&mut self, _: &[StreamId], _: &mut dyn FnMut(StreamId, Delta) -> bool) -> crate::Joined {
            unreachable!("prefill only")
        }
        fn step(&mut self, _: &[StreamId], _: &mut dyn FnMut(StreamId, Delta) -> bool) -> Result<Vec<(StreamId, Finished)>, EngineError> {
            unreachable!("prefill only")
        }
        fn cancel(&mut self, _: StreamId) -> Finished {
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
            ModelStats { cached_prefixes: self.0, cache_bytes: 0, n_ctx: 64, ..Default::default() }
        }
    }

    struct NoText;

    impl Tokenizer for NoText {
        fn render(&self, _: &[Message], _: &[crate::Tool], _: bool) -> Result<String, EngineError> {
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
            threads: crate::Threads::Fixed(1),
            batch: 8,
            cache_slots: 1,
            cache_budget_bytes: 0,
            probe: false,
            split: None,
            streams: 1,
            render: Default::default(),
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
        let finished =
            engine.run("m", Job::Prefill { job: PrefillJob { prompt }, done }, Class::User, Arc::default(), Box::new(Gate(gate)));
        assert_eq!(reply.await.unwrap().unwrap().prompt_tokens, 3);
        // The engine thread is still inside the job (the gate holds it).
        assert_eq!(engine.stats()["m"].cached_prefixes, 1, "Status after the reply counts the job");
        release.send(()).unwrap();
        let _ = finished.await;
        assert_eq!(engine.purge(None).await.unwrap(), (1, 0));
        assert_eq!(engine.stats()["m"].cached_prefixes, 0, "and after a purge's reply, the purge");
    }

    /// A person's stream, and background work that always wants to share
    /// it: the person's steps take at most 1 / USER_SHARE of their solo time.
    #[test]
    fn background_work_keeps_within_the_persons_share() {
        use std::time::Duration;
        for (solo, mixed, job) in [(10_000, 14_000, 0), (10_000, 30_000, 0), (10_000, 10_500, 0), (10_000, 14_000, 50_000)] {
            let mut share = Share::default();
            let (mut took, mut with_background) = (0u64, 0);
            for step in 0..2000 {
                // Now and then a background job asks to run between steps.
                if job > 0 && step % 100 == 0 && share.may_spend() {
                    share.spend(Duration::from_micros(job));
                    took += job;
                }
                let joined = share.may_spend();
                let us = if joined { mixed } else { solo };
                with_background += u32::from(joined);
                share.stepped("m", 1, joined, Duration::from_micros(us));
                took += us;
            }
            let speed = (2000 * solo) as f64 / took as f64;
            assert!(
                speed >= USER_SHARE - 0.01,
                "solo {solo} µs, mixed {mixed} µs, jobs {job} µs: the person kept {speed:.3} of solo speed"
            );
            assert!(with_background > 100, "background work ran {with_background} steps of 2000 (solo {solo}, mixed {mixed})");
        }
    }

    #[test]
    fn with_no_person_waiting_nothing_is_saved_up() {
        let mut share = Share::default();
        share.stepped("m", 1, false, std::time::Duration::from_millis(10));
        assert!(share.may_spend());
        share.reset();
        assert!(!share.may_spend(), "a person who comes later starts alone");
        share.stepped("other", 0, false, std::time::Duration::from_millis(1));
        assert!(!share.may_spend(), "another model's background step spends");
    }
}
