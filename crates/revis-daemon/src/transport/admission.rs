//! Admission before any costly work. Every Inference call takes a permit
//! here, before tonic has read or decoded its body: a call that finds none
//! left is answered RESOURCE_EXHAUSTED at once, its (up to 4 MiB) request
//! never buffered, validated, tokenized or given a model lease. The permits
//! are the queue's places plus the jobs running (`daemon.streams`), so whatever gets past
//! this gate also fits in the queue. A permit is held for as long as its
//! caller is owed work: by the handler for Prefill and Score, by the delta
//! forwarder for Generate (`rpc/stream.rs`), which lets go when the job ends
//! or the caller stalls or leaves.
//!
//! HTTP/2 itself is bounded per connection by [`MAX_CONCURRENT_STREAMS`],
//! which both listeners (the Unix socket, TLS in `remote/`) set. A call
//! from the network (its connection has a [`Peer`]) first waits for one of
//! its device's [`CALLS_PER_DEVICE`](super::peer::CALLS_PER_DEVICE) places
//! (shared by all its connections), then for one of the places paired
//! devices may hold together: half of them ([`Admission::remote_share`]).
//! The other half are this machine's own callers', so no paired device,
//! nor all of them together, can have the owner refused.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;

use super::peer::Peer;
use crate::error::DaemonError;

/// HTTP/2 streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS),
/// on the Unix socket and on server mode's TLS port alike. A client that opens more waits
/// for one to close; the calls themselves are admitted by [`Admission`].
pub const MAX_CONCURRENT_STREAMS: u32 = 64;

/// The permits: `daemon.queue_capacity` waiting plus the jobs running.
#[derive(Clone)]
pub struct Admission {
    permits: Arc<Semaphore>,
    capacity: usize,
    /// The places paired devices may hold together.
    remote: Arc<Semaphore>,
}

/// Proof that a call was admitted; its place (and, for a paired device, its
/// connection's place) is given back when the last clone drops. Tonic hands
/// it to the handler as a request extension.
#[derive(Clone)]
pub struct Admitted(#[allow(dead_code)] Arc<(OwnedSemaphorePermit, Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)>)>);

impl Admission {
    pub fn new(queue_capacity: usize, running: usize) -> Admission {
        let places = queue_capacity + running.max(1);
        Admission {
            permits: Arc::new(Semaphore::new(places)),
            capacity: queue_capacity,
            remote: Arc::new(Semaphore::new(Self::remote_share(places))),
        }
    }

    /// Of `places` (the queue plus the jobs running), how many paired
    /// devices may hold together: half, at least one; the rest are kept for
    /// this machine's own callers.
    pub fn remote_share(places: usize) -> usize {
        (places / 2).max(1)
    }

    /// Places in the queue (`daemon.queue_capacity`), besides the jobs running.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A place, or the error a caller sees when there is none.
    pub fn try_admit(&self) -> Result<Admitted, DaemonError> {
        match self.permits.clone().try_acquire_owned() {
            Ok(p) => Ok(Admitted(Arc::new((p, None)))),
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
        // A paired device's call first waits, unread, for one of its
        // device's places (`peer::CALLS_PER_DEVICE`), then for one of the
        // paired devices' share.
        let Some(own) = req.extensions().get::<Peer>().map(|p| p.calls.clone()) else {
            return match self.admission.try_admit() {
                Ok(admitted) => {
                    req.extensions_mut().insert(admitted);
                    Box::pin(self.inner.call(req))
                }
                // The body is dropped unread: h2 resets the stream's upload.
                Err(e) => Box::pin(std::future::ready(Ok(tonic::Status::from(e).into_http()))),
            };
        };
        let (admission, mut inner) = (self.admission.clone(), self.inner.clone());
        Box::pin(async move {
            let Ok(mine) = own.acquire_owned().await else {
                return Ok(tonic::Status::from(DaemonError::ConnectionClosing).into_http());
            };
            let Ok(share) = admission.remote.clone().acquire_owned().await else {
                return Ok(tonic::Status::from(DaemonError::ConnectionClosing).into_http());
            };
            match admission.permits.clone().try_acquire_owned() {
                Ok(place) => {
                    req.extensions_mut().insert(Admitted(Arc::new((place, Some((mine, share))))));
                    inner.call(req).await
                }
                Err(_) => Ok(tonic::Status::from(DaemonError::QueueFull { capacity: admission.capacity }).into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_devices_share_half_the_places() {
        assert_eq!(Admission::remote_share(5), 2);
        assert_eq!(Admission::remote_share(20), 10);
        assert_eq!(Admission::remote_share(1), 1, "a one-place daemon still serves its paired devices");
    }

    #[test]
    fn places_are_the_queue_plus_the_running_jobs_and_come_back() {
        let a = Admission::new(2, 3);
        let mut held: Vec<Admitted> = (0..5).map(|_| a.try_admit().unwrap()).collect();
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
