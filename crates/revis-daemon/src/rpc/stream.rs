//! Generate's answer as a stream: the forwarder that carries the engine's
//! deltas to the caller and owns the stall clock, and the stream of events
//! (Started, the deltas, Done) the caller reads.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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

/// Carries a Generate's deltas from the engine (which never waits) to the
/// gRPC stream's buffer, and owns the stall clock: when the buffer stays
/// full for `stall.timeout` (the caller took nothing: a frozen client, an
/// HTTP/2 window left at 0) the job is cancelled and the forwarder ends.
/// Also ends when the job ends or the stream is dropped; with it go the
/// call's admission place and, for the engine, the job's delta channel
/// (a closed channel stops the generation within one token).
pub(super) async fn forward(mut from: mpsc::UnboundedReceiver<Delta>, to: mpsc::Sender<Delta>, stall: Stall, _admitted: Admitted) {
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
    pub(super) started: Option<pb::Started>,
    pub(super) deltas: mpsc::Receiver<Delta>,
    pub(super) done: Option<oneshot::Receiver<Result<Finished, EngineError>>>,
    pub(super) cancel: Arc<AtomicBool>,
    /// The forwarder gave up on this caller (see [`forward`]).
    pub(super) stalled: Arc<AtomicBool>,
    pub(super) stall_timeout: Duration,
    pub(super) seed: u64,
    pub(super) admitted: Instant,
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
            Ok(Ok(f)) if f.reason == FinishReason::Cancelled => Err(DaemonError::CutShort.into()),
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
