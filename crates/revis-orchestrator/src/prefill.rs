//! Pre-prefill: at the user's first keystroke, send the static part of the
//! next prompt to the daemon that will answer, so on Enter only the new
//! message is left to evaluate.
//!
//! States: idle → queued (waiting for a streaming answer to end) →
//! computing (the daemon evaluates it; the prefill freeze holds background
//! work) → ready. On Enter: queued = cancel it and just run; computing =
//! wait for it, then run; ready = run. A prefill that fails goes back to
//! idle and never holds up the answer.

use std::sync::{Arc, Mutex};

use revis_client::{Message, PrefillParams, Priority, Runner, Tier};
use tokio::sync::watch;

use crate::gates::Gates;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillPhase {
    Idle,
    Queued,
    Computing,
    Ready,
}

/// What Enter found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnterOutcome {
    /// No pre-prefill was under way.
    Nothing,
    /// It was still queued: cancelled, the answer runs at once.
    Cancelled,
    /// It was computing: the answer waited for it.
    Waited,
    /// It was ready.
    WasReady,
}

struct Inner {
    /// The static messages being (or already) warmed.
    key: Option<Vec<Message>>,
    tier: Tier,
    phase: watch::Sender<PrefillPhase>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// The pre-prefill state machine for one conversation.
#[derive(Clone)]
pub struct PrePrefill<D: Runner> {
    daemon: D,
    gates: Gates,
    inner: Arc<Mutex<Inner>>,
}

impl<D: Runner> PrePrefill<D> {
    pub fn new(daemon: D, gates: Gates) -> Self {
        let inner = Inner { key: None, tier: Tier::DEFAULT, phase: watch::Sender::new(PrefillPhase::Idle), task: None };
        PrePrefill { daemon, gates, inner: Arc::new(Mutex::new(inner)) }
    }

    pub fn phase(&self) -> PrefillPhase {
        *self.lock().phase.borrow()
    }

    /// Watches the phase (for a UI, or to wait for Ready).
    pub fn watch(&self) -> watch::Receiver<PrefillPhase> {
        self.lock().phase.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The user started typing the next message; `static_messages` is the
    /// static part of the prompt that will answer it (none: nothing is warmed).
    pub fn typing_started(&self, tier: Tier, static_messages: Vec<Message>) {
        self.gates.set_typing(true);
        let mut inner = self.lock();
        if static_messages.is_empty() {
            // Nothing static yet (no rules, no profile, a new conversation): nothing to warm.
            if let Some(t) = inner.task.take() {
                t.abort();
            }
            inner.key = None;
            inner.phase.send_replace(PrefillPhase::Idle);
            return;
        }
        let same = inner.key.as_ref() == Some(&static_messages) && inner.tier == tier;
        if same && *inner.phase.borrow() != PrefillPhase::Idle {
            return; // already queued, computing or ready for exactly this
        }
        if let Some(t) = inner.task.take() {
            t.abort();
        }
        inner.key = Some(static_messages.clone());
        inner.tier = tier;
        inner.phase.send_replace(PrefillPhase::Queued);
        let phase = inner.phase.clone();
        let (daemon, gates) = (self.daemon.clone(), self.gates.clone());
        let req = PrefillParams { tier, messages: static_messages, priority: Priority::User };
        inner.task = Some(tokio::spawn(async move {
            // Queued: never compete with an answer that is streaming.
            let mut rx = gates.subscribe();
            let _ = rx.wait_for(|g| g.streaming == 0).await;
            phase.send_replace(PrefillPhase::Computing);
            let _freeze = gates.prefilling();
            match daemon.prefill(req).await {
                Ok(r) => {
                    tracing::debug!(tokens = r.prompt_tokens, cached = r.cached_tokens, "pre-prefill ready");
                    phase.send_replace(PrefillPhase::Ready);
                }
                Err(e) => {
                    tracing::warn!("pre-prefill failed (the answer will not wait for it): {}", e.message);
                    phase.send_replace(PrefillPhase::Idle);
                }
            }
        }));
    }

    /// The user stopped typing without sending: nothing else happens; a
    /// computing prefill finishes and its cache stays warm.
    pub fn typing_stopped(&self) {
        self.gates.set_typing(false);
    }

    /// Enter: settle the pre-prefill as the state machine says, so the
    /// answer can be sent. Typing is over.
    pub async fn enter(&self) -> EnterOutcome {
        self.gates.set_typing(false);
        let mut rx = {
            let mut inner = self.lock();
            let phase = *inner.phase.borrow();
            match phase {
                PrefillPhase::Idle => return EnterOutcome::Nothing,
                PrefillPhase::Ready => return EnterOutcome::WasReady,
                PrefillPhase::Queued => {
                    if let Some(t) = inner.task.take() {
                        t.abort();
                    }
                    inner.key = None;
                    inner.phase.send_replace(PrefillPhase::Idle);
                    return EnterOutcome::Cancelled;
                }
                PrefillPhase::Computing => inner.phase.subscribe(),
            }
        };
        let _ = rx.wait_for(|p| *p != PrefillPhase::Computing).await;
        EnterOutcome::Waited
    }

    /// What was warmed no longer starts the next prompt (the conversation
    /// was rewound): a prefill still queued or computing is cancelled (it
    /// would hold background work and the daemon for a prompt no one
    /// sends), and the next keystroke warms the history as it is now.
    pub fn forget(&self) {
        let mut inner = self.lock();
        if let Some(t) = inner.task.take() {
            t.abort();
        }
        inner.key = None;
        inner.phase.send_replace(PrefillPhase::Idle);
    }

    /// The answer used the warm cache; the next message needs a new prefill.
    pub fn consumed(&self) {
        let mut inner = self.lock();
        inner.key = None;
        inner.phase.send_replace(PrefillPhase::Idle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use revis_client::{CallError, Code, Done, GenerateParams, Prefilled};
    use std::time::Duration;
    use tokio::sync::Semaphore;

    /// A daemon whose Prefill takes a scripted time, or fails.
    #[derive(Clone)]
    struct Scripted {
        prefill_time: Duration,
        fail: bool,
        calls: Arc<Semaphore>,
    }

    impl Runner for Scripted {
        async fn prefill(&self, req: PrefillParams) -> Result<Prefilled, CallError> {
            self.calls.add_permits(1);
            tokio::time::sleep(self.prefill_time).await;
            if self.fail {
                return Err(CallError::new(Code::Unavailable, "scripted failure"));
            }
            Ok(Prefilled { prompt_tokens: req.messages.len() as u32, ..Default::default() })
        }
        async fn generate(&self, _: GenerateParams, _: impl FnMut(&str) + Send) -> Result<Done, CallError> {
            Ok(Done::default())
        }

        async fn embed(&self, _: revis_client::EmbedParams) -> Result<revis_client::Embedded, CallError> {
            Err(CallError::new(revis_client::Code::Unimplemented, "scripted: no embeddings"))
        }

        async fn tiers(&self) -> Result<Vec<revis_client::TierStatus>, CallError> {
            Ok(Vec::new())
        }
    }

    fn setup(ms: u64, fail: bool) -> (PrePrefill<Scripted>, Gates, Arc<Semaphore>) {
        let calls = Arc::new(Semaphore::new(0));
        let gates = Gates::new();
        let d = Scripted { prefill_time: Duration::from_millis(ms), fail, calls: calls.clone() };
        (PrePrefill::new(d, gates.clone()), gates, calls)
    }

    fn history() -> Vec<Message> {
        vec![Message::system("rules")]
    }

    async fn phase_becomes(p: &PrePrefill<Scripted>, want: PrefillPhase) {
        let mut rx = p.watch();
        let _ = rx.wait_for(|ph| *ph == want).await;
    }

    #[tokio::test(start_paused = true)]
    async fn enter_while_queued_cancels_and_runs_at_once() {
        let (p, gates, calls) = setup(500, false);
        let answer = gates.streaming(); // an answer still streams: the prefill queues
        p.typing_started(Tier::Tier2, history());
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(p.phase(), PrefillPhase::Queued);
        assert_eq!(p.enter().await, EnterOutcome::Cancelled);
        drop(answer);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(calls.available_permits(), 0, "the cancelled prefill never reached the daemon");
        assert_eq!(p.phase(), PrefillPhase::Idle);
    }

    #[tokio::test(start_paused = true)]
    async fn enter_while_computing_waits_for_it() {
        let (p, gates, _) = setup(800, false);
        p.typing_started(Tier::Tier2, history());
        phase_becomes(&p, PrefillPhase::Computing).await;
        assert_eq!(gates.state().prefilling, 1, "the prefill freeze holds while it computes");
        let t0 = tokio::time::Instant::now();
        assert_eq!(p.enter().await, EnterOutcome::Waited);
        assert_eq!(t0.elapsed(), Duration::from_millis(800), "waited exactly until the prefill was done");
        assert_eq!(p.phase(), PrefillPhase::Ready);
        assert_eq!(gates.state().prefilling, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn enter_when_ready_runs_at_once_and_typing_again_does_not_refill() {
        let (p, gates, calls) = setup(100, false);
        p.typing_started(Tier::Tier2, history());
        phase_becomes(&p, PrefillPhase::Ready).await;
        p.typing_stopped();
        assert!(!gates.state().typing);
        p.typing_started(Tier::Tier2, history());
        assert_eq!(calls.available_permits(), 1, "the same static part is not prefilled twice");
        assert_eq!(p.enter().await, EnterOutcome::WasReady);
        assert!(!gates.state().typing, "Enter ends the typing hold");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_prefill_does_not_block_the_answer() {
        let (p, _, _) = setup(50, true);
        p.typing_started(Tier::Tier2, history());
        phase_becomes(&p, PrefillPhase::Computing).await;
        assert_eq!(p.enter().await, EnterOutcome::Waited);
        assert_eq!(p.phase(), PrefillPhase::Idle);
        // Without anything under way Enter returns at once.
        assert_eq!(p.enter().await, EnterOutcome::Nothing);
    }
}
