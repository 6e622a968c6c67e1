//! One generation, in a task of its own, feeding a response.
//!
//! The task runs [`Runner::generate`] and sends what it hears down an
//! unbounded channel (so the runner never waits for the HTTP caller), and
//! watches that channel's receiver: when the response is dropped (the
//! caller went away, hyper failed a write), the task returns, dropping the
//! generate future, which cancels the answer on the daemon that runs it.
//! The generation's place ([`crate::Limits::max_generations`]) is held by
//! the task, so it is given back when the answer ends even if the caller
//! has not read it yet.

use std::convert::Infallible;
use std::time::Instant;

use bytes::Bytes;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

use revis_client::{CallError, Done, GenerateParams, Runner};
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// What a generation says, in order: text, then its end.
#[derive(Debug)]
pub(crate) enum Piece {
    Text(String),
    End(Result<Done, CallError>),
}

/// A generation under way.
pub(crate) struct Generation {
    pub rx: UnboundedReceiver<Piece>,
    /// When the request came (Ollama's `total_duration`).
    pub started: Instant,
}

impl Generation {
    pub(crate) fn start<R: Runner>(runner: R, params: GenerateParams, place: OwnedSemaphorePermit) -> Generation {
        let started = Instant::now();
        let (tx, rx) = unbounded_channel();
        tokio::spawn(async move {
            let _place = place;
            let text_tx = tx.clone();
            let generate = runner.generate(params, move |t| {
                let _ = text_tx.send(Piece::Text(t.to_owned()));
            });
            tokio::select! {
                r = generate => {
                    let _ = tx.send(Piece::End(r));
                }
                () = tx.closed() => tracing::debug!("the caller went away: generation cancelled"),
            }
        });
        Generation { rx, started }
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

    /// The response body of a streamed answer: `first`, then the rest of
    /// the generation, each piece as `encode` writes it.
    pub(crate) fn body(self, first: Piece, mut encode: impl FnMut(Piece) -> Vec<u8> + Send + 'static) -> axum::body::Body {
        let head = Bytes::from(encode(first));
        let rest = UnboundedReceiverStream::new(self.rx).map(move |p| Ok::<_, Infallible>(Bytes::from(encode(p))));
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
            head.extend(encode(Some((i, first))));
            rest.insert(i, UnboundedReceiverStream::new(generation.rx));
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
