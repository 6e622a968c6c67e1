//! The listener: accepting connections within their places (all, and each
//! peer's share, with probation past it), TLS handshakes in tasks of their
//! own, each connection served by hyper with its header, write and
//! probation timeouts, and a graceful stop.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::options::{Limits, PROBATION, peer_group};

/// Serves `router` on `listener` until `shutdown` resolves; then answers
/// under way get `grace` to end before they are dropped (which cancels
/// their generations).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<revis_trust::HttpsIdentity>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let (done_tx, done_rx) = tokio::sync::mpsc::channel(limits.max_connections.max(1));
    let places = Arc::new(Semaphore::new(limits.max_connections));
    let from = Arc::new(std::sync::Mutex::new(Counts::default()));
    let mut listener = Bounded {
        inner: listener,
        places,
        from,
        per_address: limits.per_address(),
        unkeyed: limits.unkeyed(),
        write_timeout: limits.write_timeout,
        tls: tls.map(|identity| Tls { identity, done_tx, done_rx }),
    };
    // Each connection holds a receiver; all gone means all closed.
    let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, addr) = tokio::select! {
            c = listener.accept() => c,
            () = &mut shutdown => break,
        };
        tokio::spawn(serve_connection(io, addr, router.clone(), limits.header_timeout, stopping_rx.clone()));
    }
    drop(listener);
    let _ = stopping_tx.send(true);
    drop(stopping_rx);
    tokio::select! {
        () = stopping_tx.closed() => {}
        () = tokio::time::sleep(grace) => tracing::info!("answers still under way after {grace:?}: dropped"),
    }
    Ok(())
}

/// One connection, HTTP/1.1 with keep-alive, until the client closes it,
/// sends no request head within `header_timeout` (a slow or idle client),
/// takes no response bytes for `write_timeout` ([`Held`]), sends no keyed
/// request within [`PROBATION`] when it came on probation, or the server
/// stops (answers under way are let finish).
async fn serve_connection(
    io: Held,
    addr: SocketAddr,
    router: Router,
    header_timeout: Duration,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let keyed = io.from.clone();
    let mut on_probation = io.probation;
    let for_requests = keyed.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(ConnKeyed(for_requests.clone()));
        tower::ServiceExt::oneshot(router.clone(), req.map(axum::body::Body::new))
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let mut asked = false;
    let probation = tokio::time::sleep(if on_probation { PROBATION } else { Duration::ZERO });
    let mut probation = std::pin::pin!(probation);
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    match write_timed_out(&e) {
                        Some(why) => tracing::info!(%addr, "closing a connection: {why}"),
                        None => tracing::debug!(%addr, "connection: {e}"),
                    }
                }
                return;
            }
            () = probation.as_mut(), if on_probation => {
                if !keyed.is_keyed() {
                    tracing::info!(%addr, "closing a connection that came past its peer's share and showed no key within {PROBATION:?}");
                    return;
                }
                // Keyed in time: it stays, as any keyed connection.
                on_probation = false;
            }
            changed = stopping.changed(), if !asked => {
                asked = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// The write timeout's error inside hyper's, when that is why a connection ended.
fn write_timed_out(e: &hyper::Error) -> Option<String> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return Some(io.to_string());
        }
        source = s.source();
    }
    None
}

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A listener that accepts at most `places` connections at once (those
/// still in their TLS handshake included), over TLS when it has [`Tls`].
struct Bounded {
    inner: TcpListener,
    places: Arc<Semaphore>,
    /// Connections without a keyed request, by peer.
    from: ByAddress,
    /// At most this many from one peer before probation ([`Limits::per_address`]).
    per_address: usize,
    /// At most this many from all peers before probation ([`Limits::unkeyed`]).
    unkeyed: usize,
    write_timeout: Duration,
    tls: Option<Tls>,
}

/// TLS handshakes run in tasks of their own, so a slow client holds up
/// nobody; the connections whose handshake ended come back here.
struct Tls {
    identity: revis_trust::HttpsIdentity,
    done_tx: tokio::sync::mpsc::Sender<(Held, SocketAddr)>,
    done_rx: tokio::sync::mpsc::Receiver<(Held, SocketAddr)>,
}

/// A connection and its places (among all, and its peer's), given back
/// when it closes; a write that makes no progress for `write_timeout`
/// fails (and so closes it).
struct Held {
    io: Io,
    _place: OwnedSemaphorePermit,
    from: Arc<FromAddress>,
    /// It came past its peer's share or the unkeyed places: [`PROBATION`].
    probation: bool,
    write_timeout: Duration,
    /// Armed while a write waits.
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// A write or flush waits on the client: nothing more is read (no
    /// further pipelined request) until it goes on ([`Held::timed`]).
    blocked: bool,
}

/// One of a peer's connections, counted until it shows the key or closes.
pub(crate) struct FromAddress {
    from: ByAddress,
    ip: IpAddr,
    keyed: std::sync::atomic::AtomicBool,
}

impl FromAddress {
    fn is_keyed(&self) -> bool {
        self.keyed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// It sent a request that passed the key check: it no longer counts
    /// against its peer's share or the unkeyed places.
    pub(crate) fn mark_keyed(&self) {
        if !self.keyed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.uncount();
        }
    }

    fn uncount(&self) {
        let mut counts = self.from.lock().unwrap_or_else(|e| e.into_inner());
        counts.unkeyed = counts.unkeyed.saturating_sub(1);
        if let Some(n) = counts.by_peer.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.by_peer.remove(&self.ip);
            }
        }
    }
}

impl Drop for FromAddress {
    fn drop(&mut self) {
        if !self.is_keyed() {
            self.uncount();
        }
    }
}

/// What a request carries of its connection, for the key check to mark.
#[derive(Clone)]
pub(crate) struct ConnKeyed(pub(crate) Arc<FromAddress>);

enum Io {
    Plain(TcpStream),
    Tls(Box<revis_trust::HttpsStream>),
}

/// Connections without a keyed request: by peer ([`peer_group`]), and all.
#[derive(Default)]
struct Counts {
    by_peer: HashMap<IpAddr, usize>,
    unkeyed: usize,
}

type ByAddress = Arc<std::sync::Mutex<Counts>>;

/// The next TCP connection, once a place is free, counted under its peer;
/// on probation when its peer holds `per_address` unkeyed connections
/// already, or all peers `unkeyed`.
async fn accept_tcp(
    inner: &TcpListener,
    places: &Arc<Semaphore>,
    by_address: &ByAddress,
    (per_address, unkeyed): (usize, usize),
) -> (TcpStream, SocketAddr, OwnedSemaphorePermit, Arc<FromAddress>, bool) {
    let place = places.clone().acquire_owned().await.expect("the semaphore is never closed");
    let (io, addr) = accept_one(inner).await;
    let ip = peer_group(addr.ip());
    let mut counts = by_address.lock().unwrap_or_else(|e| e.into_inner());
    let n = counts.by_peer.entry(ip).or_default();
    let probation = *n >= per_address || counts.unkeyed >= unkeyed;
    if probation {
        tracing::info!(%addr, "a connection past its peer's share or the unkeyed places: it has {PROBATION:?} to show the key");
    }
    *counts.by_peer.entry(ip).or_default() += 1;
    counts.unkeyed += 1;
    drop(counts);
    let from = Arc::new(FromAddress { from: by_address.clone(), ip, keyed: std::sync::atomic::AtomicBool::new(false) });
    (io, addr, place, from, probation)
}

/// The next TCP connection.
async fn accept_one(inner: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match inner.accept().await {
            Ok((io, addr)) => {
                let _ = io.set_nodelay(true);
                return (io, addr);
            }
            Err(e) => {
                // Out of file descriptors and the like: wait, as axum's own listener does.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

impl Bounded {
    async fn accept(&mut self) -> (Held, SocketAddr) {
        let write_timeout = self.write_timeout;
        let held =
            move |io, place, from, probation| Held { io, _place: place, from, probation, write_timeout, stalled: None, blocked: false };
        let shares = (self.per_address, self.unkeyed);
        let Some(tls) = &mut self.tls else {
            let (io, addr, place, from, probation) = accept_tcp(&self.inner, &self.places, &self.from, shares).await;
            return (held(Io::Plain(io), place, from, probation), addr);
        };
        loop {
            tokio::select! {
                Some(done) = tls.done_rx.recv() => return done,
                (io, addr, place, from, probation) = accept_tcp(&self.inner, &self.places, &self.from, shares) => {
                    let (identity, done) = (tls.identity.clone(), tls.done_tx.clone());
                    tokio::spawn(async move {
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, identity.accept(io)).await {
                            Ok(Ok(s)) => {
                                let _ = done.send((held(Io::Tls(Box::new(s)), place, from, probation), addr)).await;
                            }
                            Ok(Err(e)) => tracing::debug!(%addr, "TLS handshake failed: {e}"),
                            Err(_) => tracing::debug!(%addr, "no TLS handshake within {HANDSHAKE_TIMEOUT:?}"),
                        }
                    });
                }
            }
        }
    }
}

/// `$method` on whichever stream `$self.io` holds.
macro_rules! on_io {
    ($self:expr, $s:ident => $e:expr) => {
        match &mut $self.get_mut().io {
            Io::Plain($s) => $e,
            Io::Tls($s) => $e,
        }
    };
}

impl tokio::io::AsyncRead for Held {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        // A client that sends and never reads holds no more of revis's work
        // than its unwritten answer: its next requests wait in its socket.
        // The write that unblocks wakes this task (`timed`); one that never
        // does fails at the write timeout.
        if self.blocked {
            return std::task::Poll::Pending;
        }
        on_io!(self, s => std::pin::Pin::new(s).poll_read(cx, buf))
    }
}

impl Held {
    /// A write's outcome, with the stall timer: armed when it waits, reset
    /// when it makes progress, an error once it has waited `write_timeout`;
    /// reads are held back while it waits.
    fn timed<T>(&mut self, cx: &mut std::task::Context<'_>, r: std::task::Poll<std::io::Result<T>>) -> std::task::Poll<std::io::Result<T>> {
        use std::future::Future as _;
        match r {
            std::task::Poll::Pending => {
                self.blocked = true;
                let limit = self.write_timeout;
                let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if stalled.as_mut().poll(cx).is_ready() {
                    return std::task::Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the client took no response bytes for {limit:?} (--write-timeout-ms)"),
                    )));
                }
                std::task::Poll::Pending
            }
            ready => {
                self.stalled = None;
                if std::mem::take(&mut self.blocked) {
                    // A read held back meanwhile goes on.
                    cx.waker().wake_by_ref();
                }
                ready
            }
        }
    }
}

impl tokio::io::AsyncWrite for Held {
    fn poll_write(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = match &mut this.io {
            Io::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        };
        this.timed(cx, r)
    }

    fn poll_flush(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = match &mut this.io {
            Io::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            Io::Tls(s) => std::pin::Pin::new(s).poll_flush(cx),
        };
        this.timed(cx, r)
    }

    fn poll_shutdown(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        on_io!(self, s => std::pin::Pin::new(s).poll_shutdown(cx))
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = match &mut this.io {
            Io::Plain(s) => std::pin::Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => std::pin::Pin::new(s).poll_write_vectored(cx, bufs),
        };
        this.timed(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While a write waits on a client that reads nothing, nothing more is
    /// read from it (no further pipelined request reaches hyper); when the
    /// client reads and the write goes on, reading does too.
    #[tokio::test]
    async fn nothing_more_is_read_while_a_write_waits_on_the_client() {
        use std::pin::Pin;
        use std::task::Poll;
        use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, addr) = listener.accept().await.unwrap();
        let place = Arc::new(Semaphore::new(1)).acquire_owned().await.unwrap();
        let from = Arc::new(FromAddress { from: ByAddress::default(), ip: addr.ip(), keyed: false.into() });
        let mut held = Held {
            io: Io::Plain(server),
            _place: place,
            from,
            probation: false,
            write_timeout: Duration::from_secs(60),
            stalled: None,
            blocked: false,
        };
        let chunk = vec![7u8; 64 << 10];
        let mut written = 0;
        loop {
            match std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut held).poll_write(cx, &chunk))).await {
                Poll::Ready(Ok(n)) => written += n,
                Poll::Ready(Err(e)) => panic!("{e}"),
                Poll::Pending => break,
            }
        }
        client.write_all(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
        let Io::Plain(inner) = &held.io else { unreachable!() };
        inner.readable().await.unwrap();
        let mut space = [0u8; 256];
        let mut buf = tokio::io::ReadBuf::new(&mut space);
        let read = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut held).poll_read(cx, &mut buf))).await;
        assert!(read.is_pending(), "a request was read while the answer waited");
        let mut sink = vec![0u8; written];
        client.read_exact(&mut sink).await.unwrap();
        std::future::poll_fn(|cx| Pin::new(&mut held).poll_write(cx, b"end")).await.unwrap();
        let mut buf = tokio::io::ReadBuf::new(&mut space);
        std::future::poll_fn(|cx| Pin::new(&mut held).poll_read(cx, &mut buf)).await.unwrap();
        assert!(buf.filled().starts_with(b"GET /v1/models"), "{:?}", String::from_utf8_lossy(buf.filled()));
    }
}
