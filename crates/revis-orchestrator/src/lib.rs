//! The client's brain: what runs when. Task types and their tiers and
//! priorities ([`task`]), the three gates ([`gates`]), pre-prefill while the
//! user types ([`prefill`]), prompts as static prefix + dynamic suffix
//! ([`prompt`]), and structured output from a private reasoning tag
//! ([`structured`]).
//!
//! It talks to a daemon through the small [`Daemon`] trait, implemented for
//! [`revis_client::Client`] (one daemon) and for [`dispatch::Dispatcher`]
//! (this machine's daemon and paired nodes, with fallback); unit tests use a
//! scripted one.

pub mod conversation;
pub mod dispatch;
pub mod gates;
pub mod prefill;
pub mod prompt;
mod reply;
pub mod structured;
pub mod task;

use std::future::Future;

use revis_client::v1 as pb;

pub use gates::{GateState, Gates};
pub use prefill::{EnterOutcome, Phase, PrePrefill};
pub use task::{Background, Policies, TaskKind, TaskPolicy, Urgency};

/// What the orchestrator needs from a daemon.
pub trait Daemon: Clone + Send + Sync + 'static {
    fn prefill(&self, req: pb::PrefillRequest) -> impl Future<Output = Result<pb::PrefillResponse, tonic::Status>> + Send;
    /// Generates, calling `on_delta` with each piece of text; returns Done.
    fn generate(
        &self,
        req: pb::GenerateRequest,
        on_delta: impl FnMut(&str) + Send,
    ) -> impl Future<Output = Result<pb::Done, tonic::Status>> + Send;
    /// How many background tasks may run at once (it may change); None = one.
    fn parallelism(&self) -> Option<tokio::sync::watch::Receiver<usize>> {
        None
    }
}

impl Daemon for revis_client::Client {
    async fn prefill(&self, req: pb::PrefillRequest) -> Result<pb::PrefillResponse, tonic::Status> {
        Ok(self.clone().inference.prefill(req).await?.into_inner())
    }

    async fn generate(&self, req: pb::GenerateRequest, mut on_delta: impl FnMut(&str) + Send) -> Result<pb::Done, tonic::Status> {
        // The client library's generate retries once if the daemon restarted before the first event.
        let mut stream = revis_client::Client::generate(&mut self.clone(), req).await.map_err(|e| match e {
            revis_client::ClientError::Rpc(s) => s,
            other => tonic::Status::unavailable(other.to_string()),
        })?;
        while let Some(ev) = stream.message().await? {
            match ev.event {
                Some(pb::generate_event::Event::Delta(d)) => on_delta(&d.text),
                Some(pb::generate_event::Event::Done(done)) => return Ok(done),
                _ => {}
            }
        }
        Err(tonic::Status::unavailable("the daemon closed the stream before the answer was done"))
    }
}
