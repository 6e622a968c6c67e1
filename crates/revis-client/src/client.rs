//! [`Client`]: one connection to one revisd (this machine's over its Unix
//! socket, or a paired node's over mutual TLS), and its calls in domain
//! types. This is the one place in the workspace that calls the gRPC stubs.
//!
//! Each call follows the client layer's one retry rule
//! ([`CallError::may_retry`]); [`Client::once`] gives the same calls sent
//! exactly once, for the dispatcher, which moves a failed call on to
//! another daemon instead. [`GenerateStream`] holds the one loop that reads
//! a Generate's events off the wire.

use std::path::Path;
use std::sync::{Arc, Mutex};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::api::*;
use crate::error::source_chain;
use crate::fold::DoneFold;
use crate::target::Target;
use crate::wire::{self, v1 as pb};
use crate::{ClientError, LOCAL_CONNECT_TIMEOUT, local};

/// A connection to one revisd.
#[derive(Clone)]
pub struct Client {
    inference: pb::inference_client::InferenceClient<Channel>,
    admin: pb::admin_client::AdminClient<Channel>,
    /// The underlying channel, for the socket's other services (health,
    /// reflection): only the wire's programs reach them.
    #[cfg(feature = "wire")]
    channel: Channel,
    target: Target,
}

impl Client {
    /// Connects to the daemon at `path`, refusing a socket that may not be
    /// this user's daemon (see [`local`]: the checks run on every dial, the
    /// reconnects too).
    pub async fn connect(path: &Path) -> Result<Client, ClientError> {
        let not_running = |reason: String| ClientError::NotRunning { path: path.into(), reason };
        // The first connection is dialled here, so its refusal keeps its type.
        let first = Arc::new(Mutex::new(Some(local::dial(path).await?)));
        let socket = path.to_path_buf();
        // The URI is required by tonic but unused: the connector dials the socket.
        let channel = Endpoint::from_static("http://revisd.local")
            .connect_timeout(LOCAL_CONNECT_TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let (socket, first) = (socket.clone(), first.clone());
                async move {
                    let dialled = first.lock().expect("not poisoned").take();
                    let stream = match dialled {
                        Some(s) => s,
                        None => local::dial(&socket).await.map_err(std::io::Error::other)?,
                    };
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| not_running(source_chain(&e)))?;
        Ok(Client::over(channel, Target::Socket(path.into())))
    }

    /// A client over an established channel.
    pub(crate) fn over(channel: Channel, target: Target) -> Client {
        let limit = 4 << 20;
        Client {
            inference: pb::inference_client::InferenceClient::new(channel.clone())
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
            admin: pb::admin_client::AdminClient::new(channel.clone()).max_decoding_message_size(limit).max_encoding_message_size(limit),
            #[cfg(feature = "wire")]
            channel,
            target,
        }
    }

    /// The daemon at `path` if it answers a Status call; `Ok(None)` when it
    /// does not answer, the error when it cannot be connected to.
    pub async fn answering(path: &Path) -> Result<Option<Client>, ClientError> {
        let c = Self::connect(path).await?;
        match c.clone().status().await {
            Ok(_) => Ok(Some(c)),
            Err(e @ ClientError::Untrusted { .. }) => Err(e),
            Err(_) => Ok(None),
        }
    }

    /// The daemon this client talks to.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The same daemon's calls sent exactly once, failing with the wire's
    /// own words: the dispatcher's, which moves a failed call on to another
    /// daemon rather than sending it to the same one again.
    pub(crate) fn once(&self) -> Once<'_> {
        Once(self)
    }

    /// The raw stubs of this connection, for programs that speak the wire
    /// itself (the end-to-end tests of the daemon's API, the benchmarks):
    /// no retry, no domain types.
    #[cfg(feature = "wire")]
    pub fn wire(&self) -> wire::Raw {
        wire::Raw { inference: self.inference.clone(), admin: self.admin.clone(), channel: self.channel.clone() }
    }

    /// A Status call sent once, failing with tonic's own status: connecting
    /// to a node tells its refusal from it ([`Client::connect_node`]).
    pub(crate) async fn answers(&self) -> Result<(), tonic::Status> {
        self.admin.clone().status(pb::StatusRequest {}).await.map(drop)
    }

    // The calls below are safe to send twice, so each follows the client
    // layer's one retry rule (`CallError::may_retry`): sent once more when
    // the daemon could not take it or the connection broke under it.

    pub async fn status(&self) -> Result<DaemonStatus, ClientError> {
        self.retry(|mut c| async move { c.admin.status(pb::StatusRequest {}).await }).await.map(Into::into)
    }

    /// Loads a tier's model now (it would load on first use anyway).
    pub async fn load_model(&self, tier: Tier) -> Result<Loaded, ClientError> {
        let req = pb::LoadModelRequest { tier: tier.to_string() };
        self.retry(|mut c| {
            let req = req.clone();
            async move { c.admin.load_model(req).await }
        })
        .await
        .map(Into::into)
    }

    /// Unloads a tier's model (and so every tier that shares it) and gives its memory back.
    pub async fn unload_model(&self, tier: Tier) -> Result<Unloaded, ClientError> {
        let req = pb::UnloadModelRequest { tier: tier.to_string() };
        self.retry(|mut c| {
            let req = req.clone();
            async move { c.admin.unload_model(req).await }
        })
        .await
        .map(Into::into)
    }

    /// Drops a tier's saved prefixes.
    pub async fn purge(&self, tier: Tier) -> Result<Purged, ClientError> {
        let req = pb::PurgeRequest { tier: tier.to_string() };
        self.retry(|mut c| {
            let req = req.clone();
            async move { c.admin.purge(req).await }
        })
        .await
        .map(Into::into)
    }

    pub async fn prefill(&self, params: &PrefillParams) -> Result<Prefilled, ClientError> {
        let req = pb::PrefillRequest::from(params);
        self.retry(|mut c| {
            let req = req.clone();
            async move { c.inference.prefill(req).await }
        })
        .await
        .map(Into::into)
    }

    /// Embeds each input with the tier's model; one embedding per input, in order.
    pub async fn embed(&self, params: &EmbedParams) -> Result<Embedded, ClientError> {
        let req = pb::EmbedRequest::from(params);
        self.retry(|mut c| {
            let req = req.clone();
            async move { c.inference.embed(req).await }
        })
        .await
        .map(Into::into)
    }

    /// Scores each continuation after the same prefix; one result per
    /// continuation, in order.
    pub async fn score(&self, params: &ScoreParams) -> Result<Vec<Scored>, ClientError> {
        let req = pb::ScoreRequest::from(params);
        self.retry(|mut c| {
            let req = req.clone();
            async move { c.inference.score(req).await }
        })
        .await
        .map(wire::scored)
    }

    /// Starts a generation; the stream yields `Started`, `Delta`s, then
    /// `Done`. The request is sent again once if the connection fails
    /// before the first event arrives (nothing has been shown to anyone
    /// yet); after that, a failure ends the stream with its error.
    pub async fn generate(&self, params: &GenerateParams) -> Result<GenerateStream, ClientError> {
        let req = pb::GenerateRequest::from(params);
        let first = self.inference.clone().generate(req.clone()).await;
        match first {
            Ok(r) => Ok(GenerateStream { inner: r.into_inner(), retry: Some((self.clone(), req)), delivered: 0 }),
            Err(s) if CallError::from_status(s.clone()).may_retry() => {
                tracing::debug!(status = %s, "Generate failed before it started; sending it again");
                let inner = self.inference.clone().generate(req).await.map_err(|s| self.failure(s))?.into_inner();
                Ok(GenerateStream { inner, retry: None, delivered: 0 })
            }
            Err(s) => Err(self.failure(s)),
        }
    }

    /// Switches server mode on or off; returns its state after.
    pub async fn set_server_mode(&self, enabled: bool) -> Result<ServerMode, ClientError> {
        self.admin
            .clone()
            .set_server_mode(pb::SetServerModeRequest { enabled })
            .await
            .map(|r| r.into_inner().into())
            .map_err(|s| self.failure(s))
    }

    /// Switches lending on or off (`revisd lend`); returns server mode's state after.
    pub async fn set_lending(&self, enabled: bool) -> Result<ServerMode, ClientError> {
        self.admin.clone().set_lending(pb::SetLendingRequest { enabled }).await.map(|r| r.into_inner().into()).map_err(|s| self.failure(s))
    }

    /// Opens a pairing window (`window_s` = 0: the daemon's default length)
    /// and follows it: `Opened` (the code to type on the other machine),
    /// then `Paired` or `Closed`.
    pub async fn open_pairing(&self, window_s: u32) -> Result<PairingEvents, ClientError> {
        let inner = self.admin.clone().open_pairing(pb::OpenPairingRequest { window_s }).await.map_err(|s| self.failure(s))?.into_inner();
        Ok(PairingEvents { inner, client: self.clone() })
    }

    /// The devices paired with this daemon.
    pub async fn list_devices(&self) -> Result<Vec<DeviceInfo>, ClientError> {
        self.retry(|mut c| async move { c.admin.list_devices(pb::ListDevicesRequest {}).await })
            .await
            .map(|r| r.devices.into_iter().map(Into::into).collect())
    }

    /// Revokes a paired device (by name or device ID) and cuts its connections.
    pub async fn revoke_device(&self, device: &str) -> Result<Revoked, ClientError> {
        self.admin
            .clone()
            .revoke_device(pb::RevokeDeviceRequest { device: device.to_owned() })
            .await
            .map(|r| r.into_inner().into())
            .map_err(|s| self.failure(s))
    }

    /// Runs `call` on a clone of this client and, when the failure may be
    /// retried ([`CallError::may_retry`]), once more. The clones share one
    /// channel, and the channel dials the socket again when its connection
    /// has gone (tonic's reconnect), so the second try reaches a daemon
    /// that was restarted on the same path in the meantime.
    async fn retry<T, F, Fut>(&self, call: F) -> Result<T, ClientError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let failed = match call(self.clone()).await {
            Ok(r) => return Ok(r.into_inner()),
            Err(s) if CallError::from_status(s.clone()).may_retry() => {
                tracing::debug!(status = %s, "call failed on the connection; sending it again");
                match call(self.clone()).await {
                    Ok(r) => return Ok(r.into_inner()),
                    Err(s) => s,
                }
            }
            Err(s) => s,
        };
        Err(self.failure(failed))
    }

    /// What a failed call says: on the local socket, a daemon that could not
    /// be dialled again reads as [`local::dial`]'s own error (nothing answers
    /// there, or the socket is not to be trusted), not as tonic's status.
    fn failure(&self, s: tonic::Status) -> ClientError {
        match &self.target {
            Target::Socket(_) if s.code() == tonic::Code::Unavailable => {
                local::undialled(&s).unwrap_or_else(|| ClientError::Call(CallError::from_status(s)))
            }
            _ => ClientError::Call(CallError::from_status(s)),
        }
    }
}

/// A [`Client`]'s calls sent exactly once (see [`Client::once`]): a failure
/// is the call's, as the wire said it ([`CallError::from_status`]), never
/// sent again.
pub(crate) struct Once<'a>(&'a Client);

impl Once<'_> {
    pub(crate) async fn status(&self) -> Result<DaemonStatus, CallError> {
        self.0.admin.clone().status(pb::StatusRequest {}).await.map(|r| r.into_inner().into()).map_err(CallError::from_status)
    }

    pub(crate) async fn prefill(&self, params: &PrefillParams) -> Result<Prefilled, CallError> {
        let req = pb::PrefillRequest::from(params);
        self.0.inference.clone().prefill(req).await.map(|r| r.into_inner().into()).map_err(CallError::from_status)
    }

    pub(crate) async fn embed(&self, params: &EmbedParams) -> Result<Embedded, CallError> {
        let req = pb::EmbedRequest::from(params);
        self.0.inference.clone().embed(req).await.map(|r| r.into_inner().into()).map_err(CallError::from_status)
    }

    /// Starts a generation; a stream that fails, before its first event or
    /// after, ends with its error.
    pub(crate) async fn generate(&self, params: &GenerateParams) -> Result<GenerateStream, CallError> {
        let req = pb::GenerateRequest::from(params);
        let inner = self.0.inference.clone().generate(req).await.map_err(CallError::from_status)?.into_inner();
        Ok(GenerateStream { inner, retry: None, delivered: 0 })
    }
}

/// The events of one Generate (see [`Client::generate`]).
pub struct GenerateStream {
    inner: tonic::Streaming<pb::GenerateEvent>,
    /// What it takes to send the request again: kept until the first event.
    retry: Option<(Client, pb::GenerateRequest)>,
    /// Bytes of text delivered so far.
    delivered: usize,
}

impl GenerateStream {
    /// The next event; `Ok(None)` when the stream ended. An error says how
    /// much of the answer was delivered before it.
    pub async fn next(&mut self) -> Result<Option<Event>, CallError> {
        loop {
            match self.inner.message().await {
                Ok(None) => return Ok(None),
                Ok(Some(ev)) => {
                    self.retry = None;
                    let Some(ev) = wire::event(ev) else { continue };
                    if let Event::Delta { text, .. } = &ev {
                        self.delivered += text.len();
                    }
                    return Ok(Some(ev));
                }
                Err(s) => {
                    let e = CallError::from_status(s).after(self.delivered);
                    match self.retry.take() {
                        Some((client, req)) if e.may_retry() => {
                            tracing::debug!(error = %e, "Generate failed before its first event; sending it again");
                            self.inner = client.inference.clone().generate(req).await.map_err(CallError::from_status)?.into_inner();
                        }
                        _ => return Err(e),
                    }
                }
            }
        }
    }

    /// Reads the stream to its end, handing each piece of text to
    /// `on_delta`; returns the finished answer.
    pub async fn finish(self, on_delta: impl FnMut(&str)) -> Result<Done, CallError> {
        self.finish_started(|_| {}, on_delta).await
    }

    /// [`Self::finish`], telling `on_started` the prompt's length in tokens
    /// when the daemon says it (before any text).
    pub async fn finish_started(mut self, mut on_started: impl FnMut(u32), mut on_delta: impl FnMut(&str)) -> Result<Done, CallError> {
        let mut fold = DoneFold::new();
        while let Some(ev) = self.next().await? {
            if let Some(done) = fold.push(ev, &mut on_started, |text, _| on_delta(text)) {
                return Ok(done);
            }
        }
        Err(CallError::new(Code::Unavailable, "the daemon closed the stream before the answer was done").after(self.delivered))
    }
}

/// The events of a pairing window (see [`Client::open_pairing`]).
pub struct PairingEvents {
    inner: tonic::Streaming<pb::PairingEvent>,
    /// Says a failure as the client does ([`Client::failure`]).
    client: Client,
}

impl PairingEvents {
    /// The next event; `Ok(None)` when the window's stream ended.
    pub async fn next(&mut self) -> Result<Option<PairingEvent>, ClientError> {
        loop {
            match self.inner.message().await.map_err(|s| self.client.failure(s))? {
                None => return Ok(None),
                Some(e) => {
                    if let Some(e) = wire::pairing_event(e) {
                        return Ok(Some(e));
                    }
                }
            }
        }
    }
}

impl Runner for Client {
    async fn prefill(&self, req: PrefillParams) -> Result<Prefilled, CallError> {
        Client::prefill(self, &req).await.map_err(ClientError::into_call)
    }

    async fn generate(&self, req: GenerateParams, on_delta: impl FnMut(&str) + Send) -> Result<Done, CallError> {
        Client::generate(self, &req).await.map_err(ClientError::into_call)?.finish(on_delta).await
    }

    async fn generate_started(
        &self,
        req: GenerateParams,
        on_started: impl FnMut(u32) + Send,
        on_delta: impl FnMut(&str) + Send,
    ) -> Result<Done, CallError> {
        Client::generate(self, &req).await.map_err(ClientError::into_call)?.finish_started(on_started, on_delta).await
    }

    async fn embed(&self, req: EmbedParams) -> Result<Embedded, CallError> {
        Client::embed(self, &req).await.map_err(ClientError::into_call)
    }

    async fn tiers(&self) -> Result<Vec<TierStatus>, CallError> {
        self.status().await.map(|s| s.tiers).map_err(ClientError::into_call)
    }
}

#[cfg(test)]
mod tests {
    //! The Generate retry rule against a scripted server: sent again when
    //! the stream fails before its first event, never after one.

    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio_stream::Stream;
    use tonic::{Request, Response, Status};

    use super::*;

    type Events = Pin<Box<dyn Stream<Item = Result<pb::GenerateEvent, Status>> + Send>>;

    /// Answers each Generate with the next script; counts the calls.
    struct Scripted {
        scripts: Vec<Vec<Result<pb::GenerateEvent, Status>>>,
        calls: Arc<AtomicUsize>,
    }

    fn started() -> Result<pb::GenerateEvent, Status> {
        Ok(pb::GenerateEvent { event: Some(pb::generate_event::Event::Started(pb::Started::default())) })
    }

    fn done() -> Result<pb::GenerateEvent, Status> {
        Ok(pb::GenerateEvent { event: Some(pb::generate_event::Event::Done(pb::Done::default())) })
    }

    #[tonic::async_trait]
    impl pb::inference_server::Inference for Scripted {
        type GenerateStream = Events;

        async fn generate(&self, _: Request<pb::GenerateRequest>) -> Result<Response<Events>, Status> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let script = self.scripts.get(n).cloned().unwrap_or_default();
            Ok(Response::new(Box::pin(tokio_stream::iter(script))))
        }

        async fn prefill(&self, _: Request<pb::PrefillRequest>) -> Result<Response<pb::PrefillResponse>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        async fn score(&self, _: Request<pb::ScoreRequest>) -> Result<Response<pb::ScoreResponse>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        async fn embed(&self, _: Request<pb::EmbedRequest>) -> Result<Response<pb::EmbedResponse>, Status> {
            Err(Status::unimplemented("scripted"))
        }
    }

    /// A client of a scripted server on a fresh socket, and its call count.
    async fn scripted(name: &str, scripts: Vec<Vec<Result<pb::GenerateEvent, Status>>>) -> (Client, Arc<AtomicUsize>) {
        // A private directory: the client refuses a socket in a shared one.
        let dir = tempfile::Builder::new().prefix(&format!("revis-client-{name}")).tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let server = pb::inference_server::InferenceServer::new(Scripted { scripts, calls: calls.clone() });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(server)
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let client = Client::connect(&path).await.unwrap();
        let _ = std::fs::remove_file(&path);
        (client, calls)
    }

    async fn events(stream: &mut GenerateStream) -> Result<usize, CallError> {
        let mut n = 0;
        while stream.next().await?.is_some() {
            n += 1;
        }
        Ok(n)
    }

    #[tokio::test]
    async fn generate_is_sent_again_when_it_fails_before_its_first_event() {
        let unavailable = Err(Status::unavailable("shutting down"));
        let (c, calls) = scripted("before", vec![vec![unavailable], vec![started(), done()]]).await;
        let mut stream = c.generate(&GenerateParams::default()).await.unwrap();
        assert_eq!(events(&mut stream).await.unwrap(), 2);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn generate_is_not_sent_again_after_an_event_arrived() {
        let unavailable = Err(Status::unavailable("shutting down"));
        let (c, calls) = scripted("after", vec![vec![started(), unavailable], vec![started(), done()]]).await;
        let mut stream = c.generate(&GenerateParams::default()).await.unwrap();
        assert!(stream.next().await.unwrap().is_some());
        assert_eq!(stream.next().await.unwrap_err().code, Code::Unavailable);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_of_the_daemon_is_not_retried() {
        let refused = Err(Status::invalid_argument("empty"));
        let (c, calls) = scripted("refused", vec![vec![refused], vec![started(), done()]]).await;
        let mut stream = c.generate(&GenerateParams::default()).await.unwrap();
        assert_eq!(stream.next().await.unwrap_err().code, Code::InvalidArgument);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
