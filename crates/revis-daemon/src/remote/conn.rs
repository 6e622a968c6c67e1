//! Connection accounting: the paired connections open (so a revoke or
//! server mode going off can cut them), the connections still in their
//! handshake (so strangers cannot take every slot), and the connection as
//! tonic sees it, which carries its [`Peer`] and fails once cut.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use revis_trust::TrustSet;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;
use tonic::{Request, Status};

use super::state::Conn;
use super::{HANDSHAKES_PER_ADDRESS, Remote, RemoteError};
use crate::transport::peer::Peer;

impl Remote {
    /// Records a paired device's new connection; None if it was revoked
    /// between its handshake and now.
    pub(super) fn register(self: &Arc<Self>, tls: TlsStream<TcpStream>, addr: SocketAddr, cut: CancellationToken) -> Option<RemoteIo> {
        let device_id = revis_trust::peer_device_id(tls.get_ref().1)?;
        let (id, calls) = {
            let mut state = self.lock();
            if !self.trusted.contains(&device_id) {
                return None;
            }
            state.next_id += 1;
            let id = state.next_id;
            state.conns.insert(id, Conn { device: device_id, cut: cut.clone(), lending: false });
            let calls = state.device_calls.entry(device_id).or_insert_with(Peer::device_places).clone();
            (id, calls)
        };
        // The file is rewritten at most once a minute per device, not on
        // every connection: "last seen" is for people, to the minute.
        let now = SystemTime::now();
        let stale = |d: &revis_trust::PairedDevice| {
            d.last_seen.is_none_or(|t| now.duration_since(std::time::UNIX_EPOCH).map_or(true, |n| n.as_secs() >= t + 60))
        };
        let mut store = self.store();
        if store.get(&device_id).is_some_and(stale)
            && let Err(e) = store.mark_seen(&device_id, now)
        {
            tracing::warn!("recording when {device_id} was last seen: {e}");
        }
        drop(store);
        tracing::info!(%addr, %device_id, "paired device connected");
        Some(RemoteIo {
            tls,
            peer: Peer { device_id, addr, calls },
            cut: Box::pin(cut.cancelled_owned()),
            _guard: ConnGuard { remote: Arc::downgrade(self), id },
        })
    }
}

/// Refuses a call whose device was revoked after its connection opened
/// (its connection is being cut; this closes the gap).
pub(super) fn still_paired(trusted: TrustSet) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| match req.extensions().get::<Peer>() {
        Some(p) if trusted.contains(&p.device_id) => Ok(req),
        Some(p) => Err(RemoteError::NoLongerPaired(p.device_id).into()),
        None => Err(RemoteError::NoPeer.into()),
    }
}

/// Takes a connection out of the open list when tonic drops it.
pub(super) struct ConnGuard {
    pub(super) remote: std::sync::Weak<Remote>,
    pub(super) id: u64,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if let Some(r) = self.remote.upgrade() {
            r.lock().conns.remove(&self.id);
        }
    }
}

/// A connection still in its TLS handshake or pairing (settled RPC
/// connections are in `conns`). At most `server.max_connections` of these
/// at once, and [`HANDSHAKES_PER_ADDRESS`] from one address.
pub(super) struct Unsettled {
    remote: Arc<Remote>,
    ip: IpAddr,
}

impl Unsettled {
    /// Why not, when a limit is reached.
    pub(super) fn take(remote: &Arc<Remote>, ip: IpAddr) -> Result<Unsettled, &'static str> {
        let max = remote.config.max_connections;
        let mut state = remote.lock();
        if state.conns.len() >= max {
            return Err("server.max_connections paired connections are open");
        }
        if state.unsettled >= max {
            return Err("server.max_connections connections are in their handshake");
        }
        let from = state.unsettled_from.entry(ip).or_default();
        if *from >= HANDSHAKES_PER_ADDRESS.min(max) {
            return Err("this address has as many handshakes open as it may");
        }
        *from += 1;
        state.unsettled += 1;
        Ok(Unsettled { remote: remote.clone(), ip })
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        let mut state = self.remote.lock();
        state.unsettled = state.unsettled.saturating_sub(1);
        if let Some(n) = state.unsettled_from.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                state.unsettled_from.remove(&self.ip);
            }
        }
    }
}

/// A paired device's TLS connection as tonic sees it. Once its token is
/// cancelled (revoked, or server mode off) every read and write fails, so
/// hyper closes the connection and the calls on it end.
pub struct RemoteIo {
    tls: TlsStream<TcpStream>,
    peer: Peer,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    _guard: ConnGuard,
}

impl RemoteIo {
    fn check_cut(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.cut.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(io::ErrorKind::ConnectionAborted, "connection cut by revisd")),
            Poll::Pending => Ok(()),
        }
    }
}

impl Connected for RemoteIo {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl AsyncRead for RemoteIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Err(e) = self.check_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for RemoteIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Err(e) = self.check_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        if let Err(e) = self.check_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.tls).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}
