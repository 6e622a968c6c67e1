//! Admission before any costly work. Every Inference call takes a permit
//! here, before tonic has read or decoded its body: a call that finds none
//! left is answered RESOURCE_EXHAUSTED at once, its (up to 4 MiB) request
//! never buffered, validated, tokenized or given a model lease. The permits
//! are the queue's places plus the one job running, so whatever gets past
//! this gate also fits in the queue. A permit is held for as long as its
//! caller is owed work: by the handler for Prefill and Score, by the delta
//! forwarder for Generate (`service.rs`), which lets go when the job ends
//! or the caller stalls or leaves.
//!
//! HTTP/2 itself is bounded per connection by [`MAX_CONCURRENT_STREAMS`],
//! which both listeners (the Unix socket here, TLS in `remote.rs`) set.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;

use crate::error::DaemonError;

/// HTTP/2 streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS),
/// on the Unix socket and on server mode's TLS port alike. A client that opens more waits
/// for one to close; the calls themselves are admitted by [`Admission`].
pub const MAX_CONCURRENT_STREAMS: u32 = 64;

/// The permits: `daemon.queue_capacity` waiting plus the one job running.
#[derive(Clone)]
pub struct Admission {
    permits: Arc<Semaphore>,
    capacity: usize,
}

/// Proof that a call was admitted; its place is given back when the last clone drops.
/// Tonic hands it to the handler as a request extension.
#[derive(Clone)]
pub struct Admitted(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

impl Admission {
    pub fn new(queue_capacity: usize) -> Admission {
        Admission { permits: Arc::new(Semaphore::new(queue_capacity + 1)), capacity: queue_capacity }
    }

    /// A place, or the error a caller sees when there is none.
    pub fn try_admit(&self) -> Result<Admitted, DaemonError> {
        match self.permits.clone().try_acquire_owned() {
            Ok(p) => Ok(Admitted(Arc::new(p))),
            Err(_) => Err(DaemonError::QueueFull { capacity: self.capacity }),
        }
    }

    /// Wraps a service (Inference) so each of its calls is admitted first.
    pub fn gate<S>(&self, inner: S) -> Gated<S> {
        Gated { inner, admission: self.clone() }
    }
}

/// A service whose calls are admitted before they are read; see [`Admission`].
#[derive(Clone)]
pub struct Gated<S> {
    inner: S,
    admission: Admission,
}

impl<S: NamedService> NamedService for Gated<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Gated<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        match self.admission.try_admit() {
            Ok(admitted) => {
                req.extensions_mut().insert(admitted);
                Box::pin(self.inner.call(req))
            }
            // The body is dropped unread: h2 resets the stream's upload.
            Err(e) => Box::pin(std::future::ready(Ok(tonic::Status::from(e).into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_the_queue_plus_the_running_job_and_come_back() {
        let a = Admission::new(2);
        let mut held: Vec<Admitted> = (0..3).map(|_| a.try_admit().unwrap()).collect();
        let e = a.try_admit().err().unwrap();
        let status = tonic::Status::from(e);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("daemon.queue_capacity"), "{}", status.message());
        let copy = held[0].clone();
        held.remove(0);
        assert!(a.try_admit().is_err(), "a clone still holds its place");
        drop(copy);
        held.push(a.try_admit().unwrap());
        assert!(a.try_admit().is_err());
    }
}
