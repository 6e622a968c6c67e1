//! A task sent to its target and carried through failures: one stream at a
//! time under our own deadlines (first token, gap, total: gRPC deadlines do
//! not cover a streamed body), and when it fails on a node, the breaker
//! opens and the task goes on:
//! - before any text was shown: sent again, to another node or here;
//! - after text was shown: continued here from exactly that text
//!   (`answer_prefix`), so the user sees one answer;
//! - a JSON answer, never shown in parts: started again elsewhere;
//! - an answer that may call functions, after text was shown: not
//!   continued (a call may have followed the text), the error is the
//!   caller's, with how much was shown.
//!
//! This machine's daemon is the last resort: a failure there is the
//! caller's, never sent again; so is a failure on the node a dispatcher is
//! held to ([`Dispatcher::on_node`]), once its breaker is open.
//!
//! Every call here is sent once ([`Client::once`]): the client's own retry
//! would send it to the same daemon again, where failover moves on.

use std::time::{Duration, Instant};

use super::state::{Dispatcher, FALLBACKS_KEPT};
use super::types::{Fallback, Route};
use crate::Client;
use crate::api::{CallError, Code, Done, EmbedParams, Embedded, Format, GenerateParams, PrefillParams, Prefilled, Priority};
use crate::fold::DoneFold;

impl Dispatcher {
    /// A pre-prefill, sent where the answer will go (a user's answer then
    /// follows it there, see `routing`).
    pub(super) async fn prefill_routed(&self, req: PrefillParams) -> Result<Prefilled, CallError> {
        let background = req.priority == Priority::Background;
        let target = self.choose(req.tier, background, &[]);
        if !background && self.pinned.is_none() {
            self.lock().sticky.insert(req.tier, target.clone());
        }
        let Some(client) = self.client(&target) else {
            return Err(CallError::new(Code::Unavailable, format!("{} is not connected", self.name(&target))));
        };
        let _counted = self.start(&target);
        client.once().prefill(&req).await.inspect_err(|e| self.failed(&target, &e.message))
    }

    /// Embeddings, from where the tier runs (an offloaded tier's node),
    /// sent again elsewhere, and at last here, when a node fails.
    pub(super) async fn embed_routed(&self, req: EmbedParams) -> Result<Embedded, CallError> {
        let mut tried: Vec<Route> = Vec::new();
        loop {
            let target = self.choose(req.tier, false, &tried);
            let Some(client) = self.client(&target) else {
                if target == Route::Local {
                    return Err(CallError::new(Code::Unavailable, "this machine's revisd is not connected"));
                }
                if self.pinned.is_some() {
                    return Err(CallError::new(Code::Unavailable, format!("{} is not connected", self.name(&target))));
                }
                tried.push(target);
                continue;
            };
            let _counted = self.start(&target);
            match client.once().embed(&req).await {
                Ok(embedded) => return Ok(embedded),
                Err(e) => {
                    if e.is_final() || target == Route::Local {
                        return Err(e);
                    }
                    self.failed(&target, &e.message);
                    if self.pinned.is_some() {
                        return Err(e);
                    }
                    tried.push(target);
                }
            }
        }
    }

    /// An answer, moved on from each target that fails (see the module's rules).
    pub(super) async fn generate_with_failover(
        &self,
        req: GenerateParams,
        mut on_started: impl FnMut(u32) + Send,
        mut on_delta: impl FnMut(&str) + Send,
    ) -> Result<Done, CallError> {
        let background = req.priority == Priority::Background;
        let json = matches!(req.format, Format::Json { .. });
        let tools = req.offers_tools();
        let mut delivered = String::new();
        let mut tokens = 0u32;
        let mut tried: Vec<Route> = Vec::new();
        loop {
            // After text was shown, the answer continues here; before, anywhere else.
            let target = if delivered.is_empty() { self.choose(req.tier, background, &tried) } else { Route::Local };
            let mut attempt = req.clone();
            if !delivered.is_empty() {
                // The caller's own prefix (a continued answer, the checklist's notes) stays in front.
                attempt.answer_prefix = format!("{}{delivered}", req.answer_prefix);
                attempt.max_tokens = req.max_tokens.map(|m| m.saturating_sub(tokens).max(1));
            }
            let result = match self.client(&target) {
                None => Err(CallError::new(Code::Unavailable, "not connected")),
                Some(client) => {
                    let _counted = self.start(&target);
                    let mut on_text = |t: &str, n: u32| {
                        delivered.push_str(t);
                        tokens += n;
                        if !json {
                            on_delta(t);
                        }
                    };
                    self.stream_once(client, &attempt, target != Route::Local, &mut on_started, &mut on_text).await
                }
            };
            match result {
                Ok(done) => {
                    self.succeeded(&target, &done);
                    if json {
                        on_delta(&delivered);
                    }
                    return Ok(Done { text: delivered, generated_tokens: tokens, ..done });
                }
                Err(e) if e.is_final() || target == Route::Local => return Err(e.after(if json { 0 } else { delivered.len() })),
                // A call may still have followed the text: it is not continued elsewhere.
                Err(e) if tools && !delivered.is_empty() => {
                    self.failed(&target, &e.message);
                    return Err(e.after(delivered.len()));
                }
                Err(e) if self.pinned.is_some() => {
                    // Held to this node: its breaker opens, the answer goes nowhere else.
                    self.failed(&target, &e.message);
                    return Err(e.after(if json { 0 } else { delivered.len() }));
                }
                Err(e) => {
                    let at = self.name(&target);
                    tracing::warn!(
                        node = %at,
                        shown = delivered.len(),
                        shown_tokens = tokens,
                        "{} failed: {}; {}",
                        at,
                        e.message,
                        if delivered.is_empty() || json { "sending it elsewhere" } else { "continuing here" }
                    );
                    self.failed(&target, &e.message);
                    self.fell_back(Fallback {
                        from: at,
                        error: e.message,
                        shown_bytes: if json { 0 } else { delivered.len() },
                        shown_tokens: if json { 0 } else { tokens },
                        at: Instant::now(),
                    });
                    tried.push(target);
                    if json {
                        // Nothing was shown: start again from scratch.
                        delivered.clear();
                        tokens = 0;
                    }
                }
            }
        }
    }

    /// Remembers a fallback for [`Dispatcher::fallbacks`] (the latest [`FALLBACKS_KEPT`]).
    fn fell_back(&self, fallback: Fallback) {
        let mut state = self.lock();
        if state.fallbacks.len() == FALLBACKS_KEPT {
            state.fallbacks.pop_front();
        }
        state.fallbacks.push_back(fallback);
    }

    /// One streamed call with our deadlines; the prompt's length goes to
    /// `on_started`, text to `on_text`. This
    /// machine's daemon gets only the total deadline: the others exist to
    /// move on to another daemon, and here there is none to move on to.
    /// Sent once: a failure moves on to another daemon, never to this one
    /// again (see [`crate::api::CallError`]).
    async fn stream_once(
        &self,
        client: Client,
        req: &GenerateParams,
        remote: bool,
        on_started: &mut (dyn FnMut(u32) + Send),
        on_text: &mut (dyn FnMut(&str, u32) + Send),
    ) -> Result<Done, CallError> {
        let mut d = self.deadlines;
        if !remote {
            (d.first_token, d.gap) = (d.total, d.total);
        }
        let t0 = Instant::now();
        let deadline =
            |what: &str, limit: Duration| CallError::new(Code::DeadlineExceeded, format!("no {what} within {:.1}s", limit.as_secs_f64()));
        let mut stream = match tokio::time::timeout(d.first_token, client.once().generate(req)).await {
            Err(_) => return Err(deadline("answer", d.first_token)),
            Ok(r) => r?,
        };
        let mut first = true;
        let mut fold = DoneFold::new();
        loop {
            let limit = if first { d.first_token.saturating_sub(t0.elapsed()) } else { d.gap };
            let limit = limit.min(d.total.saturating_sub(t0.elapsed()));
            let ev = match tokio::time::timeout(limit, stream.next()).await {
                Err(_) if t0.elapsed() >= d.total => return Err(deadline("end of the answer", d.total)),
                Err(_) => {
                    return Err(deadline(if first { "first token" } else { "next token" }, if first { d.first_token } else { d.gap }));
                }
                Ok(r) => r?,
            };
            let Some(ev) = ev else {
                return Err(CallError::new(Code::Unavailable, "the stream ended before the answer was done"));
            };
            let text_came = |text: &str, tokens: u32| {
                first = false;
                on_text(text, tokens);
            };
            if let Some(done) = fold.push(ev, &mut *on_started, text_came) {
                return Ok(done);
            }
        }
    }
}
