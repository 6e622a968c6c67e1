//! One generation, in a task of its own, feeding a response.
//!
//! The task runs [`Runner::generate`] and sends what it hears down an
//! unbounded channel (so the runner never waits for the HTTP caller), and
//! watches that channel's receiver: when the response is dropped (the
//! caller went away, hyper failed a write), the task returns, dropping the
//! generate future, which cancels the answer on the daemon that runs it.
//! The generation's place ([`crate::options::Limits::max_generations`]) is held by
//! the task, so it is given back when the answer ends even if the caller
//! has not read it yet.
//!
//! A streamed answer whose prompt takes long to read (an agent's 17,000
//! tokens of tools and instructions) starts its response after
//! [`FIRST_WAIT`] anyway, with [`Piece::Wait`] every [`WAIT_EVERY`] until
//! its first text: each API writes what its clients take as "still there"
//! (Anthropic's `ping`, an SSE comment), so no client gives up during a
//! long prefill. A failure within [`FIRST_WAIT`] is still the response's
//! status; a later one is the stream's error event.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

use revis_client::{CallError, Done, GenerateParams, Runner};
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// How long a streamed answer waits for its first piece before its
/// response starts anyway.
pub(crate) const FIRST_WAIT: Duration = Duration::from_secs(2);
/// How often a streamed answer still reading its prompt says so.
pub(crate) const WAIT_EVERY: Duration = Duration::from_secs(5);
/// How often the log says that an answer has shown no text yet (its
/// prompt is being read, most often).
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// An SSE comment: what OpenAI's APIs send for [`Piece::Wait`] (their
/// clients skip comments).
pub(crate) const SSE_WAIT: &[u8] = b": revis is reading the prompt\n\n";

/// What a generation says, in order: text, then its end. Before the first
/// text, a streamed response may say [`Piece::Wait`] (the prompt is still
/// being read) any number of times.
#[derive(Debug)]
pub(crate) enum Piece {
    Text(String),
    End(Result<Done, CallError>),
    Wait,
}

/// A generation under way.
pub(crate) struct Generation {
    pub rx: UnboundedReceiver<Piece>,
    /// When the request came (Ollama's `total_duration`).
    pub started: Instant,
    prompt_tokens: Arc<OnceLock<u32>>,
}

impl Generation {
    /// Starts `params` on `runner`; `model` is what the request named (for the log).
    pub(crate) fn start<R: Runner>(runner: R, model: String, params: GenerateParams, place: OwnedSemaphorePermit) -> Generation {
        let started = Instant::now();
        let (tx, rx) = unbounded_channel();
        let prompt_tokens = Arc::new(OnceLock::new());
        let told = prompt_tokens.clone();
        tokio::spawn(async move {
            let _place = place;
            let text_tx = tx.clone();
            let first_text = Arc::new(OnceLock::new());
            let first = first_text.clone();
            let tier = params.tier;
            tracing::trace!(?params, "generation asked");
            let read = told.clone();
            // Empty text (a call's syntax held back) is no piece: streams
            // send no empty chunks.
            let generate = runner.generate_started(
                params,
                move |n| {
                    let _ = told.set(n);
                },
                move |t| {
                    if !t.is_empty() {
                        first.get_or_init(|| started.elapsed());
                        let _ = text_tx.send(Piece::Text(t.to_owned()));
                    }
                },
            );
            tokio::pin!(generate);
            // A long prompt's reading shows in the log while it lasts.
            let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
            loop {
                tokio::select! {
                    r = &mut generate => {
                        let ms = |d: Option<&Duration>| d.map_or_else(|| "-".to_owned(), |d| d.as_millis().to_string());
                        match &r {
                            Ok(d) => tracing::info!(
                                "generation {model} ({tier}): {} prompt tokens ({} cached), {} generated, {} tool calls, first text {} ms, {} ms in all, {:?}",
                                d.prompt_tokens, d.cached_tokens, d.generated_tokens, d.tool_calls.len(),
                                ms(first_text.get()), started.elapsed().as_millis(), d.finish_reason
                            ),
                            Err(e) => tracing::info!("generation {model} ({tier}) failed after {} ms: {e}", started.elapsed().as_millis()),
                        }
                        let _ = tx.send(Piece::End(r));
                        return;
                    }
                    () = tx.closed() => {
                        tracing::info!("generation {model} ({tier}): the caller went away after {} ms; cancelled", started.elapsed().as_millis());
                        return;
                    }
                    // Most often the prompt is still being read; a call or a
                    // JSON answer shows no text until it ends, hence the words.
                    _ = progress.tick(), if first_text.get().is_none() => {
                        let prompt = read.get().map_or_else(String::new, |n| format!(" (a {n}-token prompt)"));
                        tracing::info!("generation {model} ({tier}): no text yet after {} s{prompt}", started.elapsed().as_secs());
                    }
                }
            }
        });
        Generation { rx, started, prompt_tokens }
    }

    /// The prompt's length in the model's tokens, once the daemon has said it.
    pub(crate) fn prompt_tokens(&self) -> Option<u32> {
        self.prompt_tokens.get().copied()
    }

    /// Waits for the first thing the generation says: a failure before
    /// any text is the response's status; anything else starts the body.
    pub(crate) async fn first(&mut self) -> Result<Piece, CallError> {
        match self.rx.recv().await {
            Some(Piece::End(Err(e))) => Err(e),
            Some(p) => Ok(p),
            None => Err(CallError::new(revis_client::Code::Internal, "the generation ended without an answer")),
        }
    }

    /// [`Self::first`], or [`Piece::Wait`] when nothing came within
    /// [`FIRST_WAIT`] (the prompt is long): the response starts then.
    pub(crate) async fn first_or_wait(&mut self) -> Result<Piece, CallError> {
        tokio::time::timeout(FIRST_WAIT, self.first()).await.unwrap_or(Ok(Piece::Wait))
    }

    /// The response body of a streamed answer: `first`, then the rest of
    /// the generation, each piece as `encode` writes it. While `first` was
    /// a [`Piece::Wait`] and no other piece has come, a Wait every [`WAIT_EVERY`].
    pub(crate) fn body(self, first: Piece, mut encode: impl FnMut(Piece) -> Vec<u8> + Send + 'static) -> axum::body::Body {
        let waiting = matches!(first, Piece::Wait);
        let head = Bytes::from(encode(first));
        let rest = pieces(self.rx, waiting).map(move |p| Ok::<_, Infallible>(Bytes::from(encode(p))));
        axum::body::Body::from_stream(tokio_stream::once(Ok::<_, Infallible>(head)).chain(rest))
    }

    /// The response body of several answers streamed together (OpenAI's
    /// `n`): each answer's first piece, then the rest of all of them as they
    /// come, each as `encode` writes it with its answer's index; `encode`
    /// is given `None` once every answer has ended. Dropping the body
    /// cancels every answer still running.
    pub(crate) fn bodies(
        started: Vec<(Piece, Generation)>,
        mut encode: impl FnMut(Option<(usize, Piece)>) -> Vec<u8> + Send + 'static,
    ) -> axum::body::Body {
        let mut head = Vec::new();
        let mut rest = tokio_stream::StreamMap::new();
        for (i, (first, generation)) in started.into_iter().enumerate() {
            rest.insert(i, pieces(generation.rx, matches!(first, Piece::Wait)));
            head.extend(encode(Some((i, first))));
        }
        let rest = rest.map(Some).chain(tokio_stream::once(None)).map(move |p| Ok::<_, Infallible>(Bytes::from(encode(p))));
        axum::body::Body::from_stream(tokio_stream::once(Ok::<_, Infallible>(Bytes::from(head))).chain(rest))
    }

    /// The whole answer (a request that does not stream).
    pub(crate) async fn finish(mut self) -> Result<Done, CallError> {
        while let Some(p) = self.rx.recv().await {
            if let Piece::End(r) = p {
                return r;
            }
        }
        Err(CallError::new(revis_client::Code::Internal, "the generation ended without an answer"))
    }
}

/// What `rx` says; while `waiting` and nothing has come yet, a
/// [`Piece::Wait`] every [`WAIT_EVERY`] too. The stream ends when `rx` does;
/// dropping it drops `rx` (which cancels the generation) at once.
fn pieces(mut rx: UnboundedReceiver<Piece>, waiting: bool) -> UnboundedReceiverStream<Piece> {
    if !waiting {
        return UnboundedReceiverStream::new(rx);
    }
    let (tx, out) = unbounded_channel();
    tokio::spawn(async move {
        let mut waiting = true;
        loop {
            tokio::select! {
                p = rx.recv() => match p {
                    Some(p) => {
                        waiting = false;
                        if tx.send(p).is_err() {
                            return;
                        }
                    }
                    None => return,
                },
                () = tokio::time::sleep(WAIT_EVERY), if waiting => {
                    if tx.send(Piece::Wait).is_err() {
                        return;
                    }
                }
                () = tx.closed() => return,
            }
        }
    });
    UnboundedReceiverStream::new(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_long_prompt_says_wait_until_the_first_text_and_the_stream_ends_with_the_answer() {
        let (tx, rx) = unbounded_channel();
        let mut s = pieces(rx, true);
        let t0 = tokio::time::Instant::now();
        assert!(matches!(s.next().await, Some(Piece::Wait)));
        assert!(matches!(s.next().await, Some(Piece::Wait)));
        assert_eq!(t0.elapsed(), 2 * WAIT_EVERY, "a Wait every {WAIT_EVERY:?}");
        tx.send(Piece::Text("a".into())).unwrap();
        assert!(matches!(s.next().await, Some(Piece::Text(t)) if t == "a"));
        tx.send(Piece::End(Ok(Done::default()))).unwrap();
        drop(tx);
        assert!(matches!(s.next().await, Some(Piece::End(Ok(_)))), "no Wait after the first text");
        assert!(s.next().await.is_none());
        assert_eq!(t0.elapsed(), 2 * WAIT_EVERY, "the stream ends with the answer, not at a timer");

        // Dropping the stream lets the generation see its caller gone.
        let (tx, rx) = unbounded_channel::<Piece>();
        drop(pieces(rx, true));
        tokio::time::timeout(Duration::from_secs(1), tx.closed()).await.expect("the receiver is dropped");
    }
}
