//! The client library of revis: connects to `revisd` over its Unix socket
//! (starting a daemon when none answers) and exposes its API. The `revis`
//! CLI and the GUI both sit on top of this crate.

pub mod api;
pub mod dispatch;
pub mod ensemble;
mod local;
pub mod nodes;
pub mod paths;
mod remote;
mod spawn;
pub mod wire;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};
use wire::v1 as pb;

pub use api::*;
pub use local::LOCAL_CONNECT_TIMEOUT;
pub use paths::Paths;
pub use remote::{
    CONNECT_TIMEOUT, Keyring, MAX_CANDIDATE_ADDRESSES, NODE_PING_INTERVAL, NODE_PING_TIMEOUT, NODE_TCP_PROBE_INTERVAL, NODE_TCP_PROBES,
    Node, NodeError, PAIR_TIMEOUT, interfaces_from_env, pair, resolve,
};
pub use revis_trust::{DeviceId, Discovered, Interfaces, PairingCode, browse, host_name};
pub use spawn::{RESTART_WAIT, Restarted, SpawnOptions, check_config, end_daemon, readiness_pipe, restart_daemon, spawn_daemon};

/// How long to wait for a freshly started daemon to answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no revisd answers on {path}: {reason}")]
    NotRunning { path: PathBuf, reason: String },
    /// The socket may not be this user's daemon: nothing was sent to it.
    /// `reason` says why and what to do.
    #[error("refusing {path}: {reason}")]
    Untrusted { path: PathBuf, reason: String },
    /// A process ID that a daemon reported, not believed (see [`end_daemon`]).
    #[error("refusing to signal process {pid}: {reason}")]
    NotDaemon { pid: u32, reason: String },
    #[error("could not start revisd: {0}")]
    Spawn(String),
    /// A call failed: the daemon refused it, or it could not be completed.
    #[error(transparent)]
    Call(#[from] CallError),
    #[error(transparent)]
    Models(#[from] revis_models::Error),
    #[error(transparent)]
    Trust(#[from] revis_trust::TrustError),
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("no paired node is called or has the ID {0:?}; `revis nodes` lists them, `revis pair NODE` pairs one")]
    UnknownNode(String),
    #[error("{0}")]
    Pairing(String),
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Call(s.into())
    }
}

impl ClientError {
    /// The error in words for a person: a daemon's own message without its
    /// gRPC code, anything else as it reads.
    pub fn words(&self) -> String {
        match self {
            ClientError::Call(c) => c.message.clone(),
            other => other.to_string(),
        }
    }

    /// As a failed call: what is not a daemon's answer (no daemon, a
    /// socket not to be trusted, a node that could not be reached) reads as
    /// UNAVAILABLE, with its own words.
    pub fn into_call(self) -> CallError {
        match self {
            ClientError::Call(c) => c,
            other => CallError::new(Code::Unavailable, other.to_string()),
        }
    }
}

pub use revis_proto::default_socket_path;

/// A connection to one revisd.
#[derive(Clone)]
pub struct Client {
    pub inference: pb::inference_client::InferenceClient<Channel>,
    pub admin: pb::admin_client::AdminClient<Channel>,
    /// The underlying channel, for other services on the socket (health, reflection).
    pub channel: Channel,
    target: Target,
}

/// Which daemon a [`Client`] talks to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The local daemon, over its Unix socket.
    Socket(PathBuf),
    /// A paired daemon on another machine, over mutual TLS.
    Node(Node),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Socket(p) => write!(f, "{}", p.display()),
            Target::Node(n) => write!(f, "{} at {} (mutual TLS)", n.name, n.addr),
        }
    }
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
    fn over(channel: Channel, target: Target) -> Client {
        let limit = 4 << 20;
        Client {
            inference: pb::inference_client::InferenceClient::new(channel.clone())
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
            admin: pb::admin_client::AdminClient::new(channel.clone()).max_decoding_message_size(limit).max_encoding_message_size(limit),
            channel,
            target,
        }
    }

    /// Connects to the daemon at `path`; if none answers, starts one (pulling
    /// the default model first if it is missing) and connects to it. A
    /// socket that may not be this user's ([`ClientError::Untrusted`]) is
    /// refused at once: no daemon is started there.
    pub async fn connect_or_start(path: &Path, opts: &SpawnOptions) -> Result<Client, ClientError> {
        match Self::answering(path).await {
            Ok(Some(c)) => return Ok(c),
            Err(e @ ClientError::Untrusted { .. }) => return Err(e),
            _ => {}
        }
        match spawn_daemon(path, opts).await {
            Ok(_) => Self::connect(path).await,
            // Another client may have started one at the same moment: use it.
            Err(e) => match Self::answering(path).await {
                Ok(Some(c)) => Ok(c),
                Err(untrusted @ ClientError::Untrusted { .. }) => Err(untrusted),
                _ => Err(e),
            },
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

    // The calls below are safe to send twice, so each follows the client
    // layer's one retry rule (`CallError::may_retry`): sent once more when
    // the daemon could not take it or the connection broke under it. The
    // `admin` and `inference` fields are the raw stubs, without that retry.

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
            Err(s) if CallError::from(s.clone()).may_retry() => {
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
            Err(s) if CallError::from(s.clone()).may_retry() => {
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
    /// Callers of the raw `inference`/`admin` stubs use it to say a failure
    /// the same way.
    pub fn failure(&self, s: tonic::Status) -> ClientError {
        match &self.target {
            Target::Socket(_) if s.code() == tonic::Code::Unavailable => {
                local::undialled(&s).unwrap_or_else(|| ClientError::Call(s.into()))
            }
            _ => ClientError::Call(s.into()),
        }
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
                    let e = CallError::from(s).after(self.delivered);
                    match self.retry.take() {
                        Some((client, req)) if e.may_retry() => {
                            tracing::debug!(error = %e, "Generate failed before its first event; sending it again");
                            self.inner = client.inference.clone().generate(req).await.map_err(CallError::from)?.into_inner();
                        }
                        _ => return Err(e),
                    }
                }
            }
        }
    }

    /// Reads the stream to its end, handing each piece of text to
    /// `on_delta`; returns the finished answer.
    pub async fn finish(mut self, mut on_delta: impl FnMut(&str)) -> Result<Done, CallError> {
        while let Some(ev) = self.next().await? {
            match ev {
                Event::Delta { text, .. } => on_delta(&text),
                Event::Done(done) => return Ok(done),
                Event::Started { .. } => {}
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
}

/// An error and its causes, `: `-joined; a cause that the text so far
/// already ends with (transport errors repeat their source) is not said twice.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let words = c.to_string();
        if !s.ends_with(&words) {
            s.push_str(": ");
            s.push_str(&words);
        }
        cur = c.source();
    }
    s
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

    #[test]
    fn a_cause_is_said_once() {
        #[derive(Debug)]
        struct Wraps(std::io::Error);
        impl std::fmt::Display for Wraps {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "transport error: {}", self.0)
            }
        }
        impl std::error::Error for Wraps {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Wraps(std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"));
        assert_eq!(source_chain(&e), "transport error: no such file");
        let plain = std::io::Error::other(Wraps(std::io::Error::other("deep")));
        assert_eq!(source_chain(&plain), "transport error: deep");
        // Said earlier, but not as the end of the text: a cause of its own.
        let e = Wraps(std::io::Error::other("transport"));
        assert_eq!(source_chain(&e), "transport error: transport");
        #[derive(Debug)]
        struct Says(&'static str, std::io::Error);
        impl std::fmt::Display for Says {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Says {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.1)
            }
        }
        assert_eq!(source_chain(&Says("refused by the node", std::io::Error::other("refused"))), "refused by the node: refused");
        let e = std::io::Error::other(Wraps(std::io::Error::other("transport")));
        assert_eq!(source_chain(&e), "transport error: transport");
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
