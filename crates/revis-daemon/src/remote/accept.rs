//! Server mode listening: the port bound and advertised, the gRPC server
//! for paired devices, and the accept loop: each TCP connection is
//! handshaken on a task of its own and, by the ALPN it offered, handed to
//! gRPC (tonic), a pairing attempt, or a lending session.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use revis_trust::{ALPN_PAIRING, ALPN_RPC, Advertisement, Advertiser, Interfaces};
use rustls::server::Acceptor;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use super::conn::{ConnGuard, RemoteIo, Unsettled, still_paired};
use super::state::{Conn, Listening};
use super::{HANDSHAKE_TIMEOUT, Remote, RemoteError, http2_keepalive, tcp_keepalive};

/// Bytes buffered each way in a lending session (weights cross it at load).
const LEND_BUFFER: usize = 256 << 10;

enum Handshaken {
    Rpc(Box<TlsStream<TcpStream>>),
    Lend(Box<TlsStream<TcpStream>>),
    Pairing(Box<TlsStream<TcpStream>>),
}

impl Remote {
    /// Binds server mode's port, advertises it, and serves paired devices'
    /// gRPC on the connections the accept loop hands over.
    pub(super) async fn start(self: &Arc<Self>) -> Result<(), RemoteError> {
        let want = self.config.listen;
        let listener = TcpListener::bind(want).await.map_err(|source| RemoteError::Listen { addr: want, source })?;
        let addr = listener.local_addr().map_err(|source| RemoteError::Listen { addr: want, source })?;
        let advertiser = if self.config.advertise {
            let ad = Advertisement {
                name: self.config.name.clone(),
                device_id: self.device_id(),
                port: addr.port(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                tiers: self.tiers.clone(),
            };
            let interfaces =
                if self.config.interfaces.is_empty() { Interfaces::AllLan } else { Interfaces::Named(self.config.interfaces.clone()) };
            Some(Advertiser::start(&ad, &interfaces)?)
        } else {
            None
        };
        let stop = CancellationToken::new();
        let (tx, rx) = mpsc::channel::<io::Result<RemoteIo>>(16);
        let accept = tokio::spawn(self.clone().accept_loop(listener, stop.clone(), tx));
        let routes = self.routes.get().cloned().expect("routes are set before server mode starts");
        let trusted = self.trusted.clone();
        let (ping_interval, ping_timeout) = http2_keepalive(self.config.peer_timeout);
        let serve = Server::builder()
            .max_concurrent_streams(crate::transport::admission::MAX_CONCURRENT_STREAMS)
            .http2_keepalive_interval(Some(ping_interval))
            .http2_keepalive_timeout(Some(ping_timeout))
            .layer(tonic::service::InterceptorLayer::new(still_paired(trusted)))
            .add_routes(routes)
            .serve_with_incoming_shutdown(ReceiverStream::new(rx), stop.clone().cancelled_owned());
        let server = tokio::spawn(async move {
            if let Err(e) = serve.await {
                tracing::error!("server mode stopped: {e}");
            }
        });
        tracing::info!(%addr, advertised = advertiser.is_some(), device_id = %self.device_id(), "server mode on");
        self.lock().listening = Some(Listening { addr, stop, advertiser, accept, server });
        Ok(())
    }

    /// Accepts TCP connections until `stop`, handshaking each on a task of
    /// its own so a slow peer holds up nobody else.
    pub(super) async fn accept_loop(
        self: Arc<Self>,
        listener: TcpListener,
        stop: CancellationToken,
        tx: mpsc::Sender<io::Result<RemoteIo>>,
    ) {
        loop {
            let (tcp, addr) = tokio::select! {
                () = stop.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors and the like: say so, back off, go on.
                        tracing::warn!("server mode: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            if let Err(e) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&tcp_keepalive(self.config.peer_timeout)) {
                tracing::warn!(%addr, "server mode: cannot set TCP keepalive: {e}");
            }
            // A peer gone mid-answer leaves bytes unacknowledged: drop it at the peer timeout too.
            if let Err(e) = revis_trust::link::give_up_unacknowledged(&tcp, self.config.peer_timeout) {
                tracing::warn!(%addr, "server mode: cannot set the TCP user timeout: {e}");
            }
            let unsettled = match Unsettled::take(&self, addr.ip()) {
                Ok(u) => u,
                Err(why) => {
                    tracing::warn!(%addr, limit = self.config.max_connections, "refusing a connection: {why}");
                    continue;
                }
            };
            let this = self.clone();
            let cut = stop.child_token();
            let tx = tx.clone();
            tokio::spawn(async move {
                // Server mode going off ends handshakes and pairings too.
                let handshake = tokio::select! {
                    () = cut.cancelled() => return,
                    r = tokio::time::timeout(HANDSHAKE_TIMEOUT, this.handshake(tcp)) => r,
                };
                match handshake {
                    Err(_) => {
                        drop(unsettled);
                        tracing::info!(%addr, "TLS handshake timed out");
                    }
                    Ok(Err(e)) => {
                        drop(unsettled);
                        tracing::info!(%addr, "TLS handshake refused: {e}");
                    }
                    Ok(Ok(Handshaken::Pairing(tls))) => {
                        tokio::select! {
                            () = cut.cancelled() => {}
                            () = this.pair(*tls, addr) => {}
                        }
                    }
                    Ok(Ok(Handshaken::Lend(tls))) => {
                        this.lend(*tls, addr, cut, unsettled).await;
                    }
                    Ok(Ok(Handshaken::Rpc(tls))) => {
                        if let Some(io) = this.register(*tls, addr, cut) {
                            drop(unsettled);
                            let _ = tx.send(Ok(io)).await;
                        }
                    }
                }
            });
        }
    }

    async fn handshake(&self, tcp: TcpStream) -> io::Result<Handshaken> {
        let _ = tcp.set_nodelay(true);
        let start = LazyConfigAcceptor::new(Acceptor::default(), tcp).await?;
        let offers = |alpn: &[u8]| start.client_hello().alpn().is_some_and(|mut a| a.any(|p| p == alpn));
        let (pairing, lending) = (offers(ALPN_PAIRING), offers(ALPN_RPC));
        Ok(if pairing {
            Handshaken::Pairing(Box::new(start.into_stream(self.pairing_tls.clone()).await?))
        } else if lending {
            Handshaken::Lend(Box::new(start.into_stream(self.lend_tls.clone()).await?))
        } else {
            Handshaken::Rpc(Box::new(start.into_stream(self.rpc_tls.clone()).await?))
        })
    }

    /// Runs one lending session: a paired device's llama.cpp RPC client,
    /// spliced to the RPC worker until either side closes, lending goes
    /// off, the device is revoked, or server mode goes off.
    async fn lend(self: &Arc<Self>, mut tls: TlsStream<TcpStream>, addr: SocketAddr, cut: CancellationToken, unsettled: Unsettled) {
        let Some(device_id) = revis_trust::peer_device_id(tls.get_ref().1) else { return };
        // Counted from here (its place taken before its worker session is
        // asked for), so that one device's many at once meet the cap too.
        let counted = {
            let mut state = self.lock();
            if !self.trusted.contains(&device_id) {
                return;
            }
            let held = state.conns.values().filter(|c| c.lending && c.device == device_id).count();
            if held >= super::lend::MAX_SESSIONS_PER_DEVICE {
                Err(held)
            } else {
                state.next_id += 1;
                let id = state.next_id;
                state.conns.insert(id, Conn { device: device_id, cut: cut.clone(), lending: true });
                Ok(id)
            }
        };
        let id = match counted {
            Ok(id) => id,
            Err(held) => {
                refuse(&mut tls, addr, device_id, &super::lend::LendError::TooManySessions(held)).await;
                return;
            }
        };
        let _guard = ConnGuard { remote: Arc::downgrade(self), id };
        let this = self.clone();
        let session = match tokio::task::spawn_blocking(move || this.lender.session()).await {
            Ok(Ok(w)) => w,
            Ok(Err(e)) => {
                refuse(&mut tls, addr, device_id, &e).await;
                return;
            }
            Err(_) => return,
        };
        if !self.lender.is_on() {
            return;
        }
        drop(unsettled);
        let mut upstream = match session.set_nonblocking(true).and_then(|()| tokio::net::UnixStream::from_std(session)) {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(%addr, %device_id, "lending: the RPC worker's session: {e}");
                return;
            }
        };
        tracing::info!(%addr, %device_id, "lending session open");
        tokio::select! {
            () = cut.cancelled() => tracing::info!(%addr, %device_id, "lending session cut"),
            r = tokio::io::copy_bidirectional_with_sizes(&mut tls, &mut upstream, LEND_BUFFER, LEND_BUFFER) => match r {
                Ok((up, down)) => tracing::info!(%addr, %device_id, up, down, "lending session closed"),
                Err(e) => tracing::info!(%addr, %device_id, "lending session ended: {e}"),
            },
        }
        // The session may have added weights to the cache.
        let this = self.clone();
        let _ = tokio::task::spawn_blocking(move || this.lender.trim_cache()).await;
    }
}

/// Refuses a lending session, saying why (see `lend::refusal`). What the
/// device sent meanwhile is read and dropped until it closes, so that no
/// reset overtakes the reason.
async fn refuse(tls: &mut TlsStream<TcpStream>, addr: SocketAddr, device_id: revis_trust::DeviceId, e: &super::lend::LendError) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tracing::info!(%addr, %device_id, "refusing a lending session: {e}");
    let said = super::lend::refusal(e);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        tls.write_all(&said).await?;
        tls.shutdown().await?;
        tokio::io::copy(&mut (&mut *tls).take(1 << 20), &mut tokio::io::sink()).await
    })
    .await;
}
