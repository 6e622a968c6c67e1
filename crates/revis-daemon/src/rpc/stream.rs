//! Generate's answer as a stream: the forwarder that carries the engine's
//! deltas to the caller and owns the stall clock, and the stream of events
//! (Started, the deltas, Done) the caller reads.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use revis_engine::tools::ToolStream;
use revis_engine::{Delta, EngineError, FinishReason, Finished};
use revis_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tonic::Status;

use crate::error::DaemonError;
use crate::transport::admission::Admitted;

/// Deltas buffered between the forwarder and the gRPC stream; the caller
/// has "taken" a delta once it left this buffer for the HTTP/2 stream.
pub(super) const DELTA_BUFFER: usize = 64;

/// The Generate response as the service returns it: this daemon's
/// [`EventStream`], or a split engine's events passed on.
pub type GenerateStream = Pin<Box<dyn Stream<Item = Result<pb::GenerateEvent, Status>> + Send>>;

/// A token and its log-probabilities, as the wire carries them.
pub(super) fn token_logprob(t: revis_engine::TokenInfo) -> pb::TokenLogprob {
    pb::TokenLogprob {
        piece: t.piece.into(),
        logprob: t.logprob,
        top: t.top.into_iter().map(|(piece, logprob)| pb::Alternative { piece: piece.into(), logprob }).collect(),
    }
}

/// How a Generate's forwarder treats a caller that stops reading.
pub(super) struct Stall {
    pub(super) timeout: Duration,
    /// The job's own cancel flag.
    pub(super) cancel: Arc<AtomicBool>,
    /// Set when the caller stalled, so the stream ends with that reason.
    pub(super) stalled: Arc<AtomicBool>,
}

/// Deltas a caller that has fallen a whole buffer behind must take within
/// each stall timeout to keep its place: reading one now and then (a
/// trickle) is not progress.
pub const STALL_PROGRESS: usize = DELTA_BUFFER / 4;

/// Carries a Generate's deltas from the engine (which never waits) to the
/// gRPC stream's buffer, and owns the stall clock. The clock starts when the
/// buffer is full (the caller took nothing: a frozen client, an HTTP/2
/// window left at 0, or a trickle); it stops when the caller catches up
/// (the buffer nearly empty) and starts again whenever the caller has taken
/// [`STALL_PROGRESS`] deltas. When it reaches `stall.timeout` the job is
/// cancelled and the forwarder ends. Also ends when the job ends or the
/// stream is dropped; with it go the call's admission place and, for the
/// engine, the job's delta channel (a closed channel stops the generation
/// within one token).
pub(super) async fn forward(mut from: mpsc::UnboundedReceiver<Delta>, to: mpsc::Sender<Delta>, stall: Stall, _admitted: Admitted) {
    let mut clock = StallClock::default();
    loop {
        let delta = tokio::select! {
            d = from.recv() => match d {
                Some(d) => d,
                None => return,
            },
            () = to.closed() => return,
        };
        let buffered = to.max_capacity() - to.capacity();
        let left = clock.before_send(Instant::now(), buffered, to.max_capacity(), stall.timeout);
        match tokio::time::timeout(left, to.send(delta)).await {
            Ok(Ok(())) => clock.after_send(Instant::now(), to.max_capacity() - to.capacity()),
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::warn!(
                    timeout_s = stall.timeout.as_secs(),
                    progress = STALL_PROGRESS,
                    "a caller fell behind and took too little of its answer for the stall timeout; cancelling it"
                );
                stall.stalled.store(true, Ordering::SeqCst);
                stall.cancel.store(true, Ordering::SeqCst);
                return;
            }
        }
    }
}

/// The forwarder's stall clock (see [`forward`]); pure, for its tests.
#[derive(Default, Debug)]
struct StallClock {
    /// Deltas put into the buffer so far.
    sent: usize,
    /// Since when the caller is behind, and how many it had taken then.
    behind: Option<(Instant, usize)>,
}

impl StallClock {
    /// How long the next send may wait, given what is buffered now.
    fn before_send(&mut self, now: Instant, buffered: usize, capacity: usize, timeout: Duration) -> Duration {
        let taken = self.sent - buffered;
        if buffered >= capacity && self.behind.is_none() {
            self.behind = Some((now, taken));
        }
        match self.behind {
            Some((since, _)) => timeout.saturating_sub(now - since),
            None => timeout,
        }
    }

    /// After a send: `buffered` now holds the delta just sent.
    fn after_send(&mut self, now: Instant, buffered: usize) {
        self.sent += 1;
        let taken = self.sent - buffered;
        match self.behind {
            Some(_) if buffered <= 1 => self.behind = None,
            Some((_, at)) if taken - at >= STALL_PROGRESS => self.behind = Some((now, taken)),
            _ => {}
        }
    }
}

/// The Generate response: Started, the deltas as they come, then Done.
/// Dropping it (the client went away) stops the generation within one token.
pub struct EventStream {
    pub(super) started: Option<pb::Started>,
    pub(super) deltas: mpsc::Receiver<Delta>,
    pub(super) done: Option<oneshot::Receiver<Result<Finished, EngineError>>>,
    pub(super) cancel: Arc<AtomicBool>,
    /// The forwarder gave up on this caller (see [`forward`]).
    pub(super) stalled: Arc<AtomicBool>,
    pub(super) stall_timeout: Duration,
    pub(super) seed: u64,
    pub(super) admitted: Instant,
    /// When the model may call functions: reads the calls out of the text.
    pub(super) calls: Option<ToolStream>,
    /// Done, held while the last of the text goes first.
    pub(super) ending: Option<pb::Done>,
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
        if let Some(done) = this.ending.take() {
            return Poll::Ready(Some(event(pb::generate_event::Event::Done(done))));
        }
        match this.deltas.poll_recv(cx) {
            Poll::Ready(Some(d)) => {
                let text = match &mut this.calls {
                    Some(calls) => calls.push(&d.text),
                    None => d.text,
                };
                return Poll::Ready(Some(event(pb::generate_event::Event::Delta(pb::Delta {
                    text,
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
            return Poll::Ready(Some(Err(DaemonError::Stalled { timeout: this.stall_timeout, progress: STALL_PROGRESS }.into())));
        }
        let result = match Pin::new(done).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        this.done = None;
        let item = match result {
            Err(_) => Err(DaemonError::ShuttingDown.into()),
            Ok(Err(e)) => Err(DaemonError::from(e).into()),
            Ok(Ok(f)) if f.reason == FinishReason::Cancelled => Err(DaemonError::CutShort.into()),
            Ok(Ok(mut f)) => {
                let busy_us = f.prompt_us + f.generate_us;
                let mut reason = match f.reason {
                    FinishReason::End => pb::FinishReason::End,
                    FinishReason::Length => pb::FinishReason::Length,
                    FinishReason::Stop | FinishReason::Cancelled => pb::FinishReason::Stop,
                };
                // The calls' text is not the answer's: Done's text is what the deltas carried.
                let mut last_text = None;
                let mut tool_calls = Vec::new();
                if let Some(calls) = this.calls.take() {
                    let (rest, found, shown) = calls.finish(reason == pb::FinishReason::Length);
                    if !found.is_empty() {
                        // Cut short by max_tokens after whole calls: those, and the length said.
                        if reason != pb::FinishReason::Length {
                            reason = pb::FinishReason::ToolCalls;
                        }
                        let count = found.len();
                        tool_calls = found
                            .into_iter()
                            .map(|c| pb::ToolCall { id: c.id, name: c.name, arguments: c.arguments.into_bytes().into() })
                            .collect();
                        tracing::debug!(calls = count, "the answer called functions");
                    }
                    f.text = shown;
                    last_text = (!rest.is_empty()).then_some(rest);
                }
                let done = pb::Done {
                    finish_reason: reason as i32,
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
                    tool_calls,
                };
                match last_text {
                    Some(text) => {
                        this.ending = Some(done);
                        event(pb::generate_event::Event::Delta(pb::Delta { text, tokens: 0, logprobs: Vec::new() }))
                    }
                    None => event(pb::generate_event::Event::Done(done)),
                }
            }
        };
        Poll::Ready(Some(item))
    }
}

#[cfg(test)]
mod tests {
    use super::{DELTA_BUFFER, STALL_PROGRESS, StallClock};
    use std::time::{Duration, Instant};

    const T: Duration = Duration::from_secs(10);

    /// Fills the buffer, then the caller takes one delta every `gap`:
    /// how long until the clock runs out (None within `limit`).
    fn reader_taking_one_every(gap: Duration, limit: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        let mut c = StallClock::default();
        let mut buffered = 0;
        while buffered < DELTA_BUFFER {
            assert_eq!(c.before_send(t0, buffered, DELTA_BUFFER, T), T);
            buffered += 1;
            c.after_send(t0, buffered);
        }
        let mut now = t0;
        while now - t0 < limit {
            let left = c.before_send(now, buffered, DELTA_BUFFER, T);
            if left < gap {
                return Some(now - t0 + left);
            }
            now += gap;
            // The caller took one; the send refills the buffer.
            c.after_send(now, buffered);
        }
        None
    }

    #[test]
    fn a_trickle_reader_runs_out_of_time() {
        let ran_out = reader_taking_one_every(Duration::from_secs(9), Duration::from_secs(120)).expect("a trickle loses its place");
        assert!(ran_out <= T, "after {ran_out:?}");
    }

    #[test]
    fn a_slow_steady_reader_keeps_its_place() {
        // STALL_PROGRESS deltas per timeout, with room to spare.
        let gap = T / (STALL_PROGRESS as u32 * 2);
        assert_eq!(reader_taking_one_every(gap, Duration::from_secs(600)), None);
    }

    #[test]
    fn a_caller_that_catches_up_stops_the_clock() {
        let t0 = Instant::now();
        let mut c = StallClock::default();
        for i in 0..DELTA_BUFFER {
            c.before_send(t0, i, DELTA_BUFFER, T);
            c.after_send(t0, i + 1);
        }
        // Full: the clock starts; 9 s later the caller has emptied the buffer.
        assert_eq!(c.before_send(t0, DELTA_BUFFER, DELTA_BUFFER, T), T);
        let later = t0 + Duration::from_secs(9);
        c.after_send(later, 1);
        assert_eq!(c.before_send(later + Duration::from_secs(30), 1, DELTA_BUFFER, T), T, "caught up: no clock");
    }
}
