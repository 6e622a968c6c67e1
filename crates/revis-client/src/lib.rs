//! The client library of revis: connects to `revisd` over its Unix socket
//! (starting a daemon when none answers) and exposes its API. The `revis`
//! CLI and the GUI both sit on top of this crate.

mod local;
pub mod nodes;
mod remote;
mod spawn;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use revis_proto::v1 as pb;
use tonic::transport::{Channel, Endpoint, Uri};

pub use local::LOCAL_CONNECT_TIMEOUT;
pub use remote::{
    CONNECT_TIMEOUT, Keyring, MAX_CANDIDATE_ADDRESSES, NODE_PING_INTERVAL, NODE_PING_TIMEOUT, NODE_TCP_PROBE_INTERVAL, NODE_TCP_PROBES,
    Node, NodeError, PAIR_TIMEOUT, interfaces_from_env, pair, resolve,
};
pub use revis_proto::v1;
pub use revis_trust::{DeviceId, Discovered, Interfaces, PairingCode, browse, host_name};
pub use spawn::{SpawnOptions, check_config, end_daemon, readiness_pipe, spawn_daemon};

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
    /// A call failed. Its text is the status's message and code; the status
    /// is not given as the error's source, whose text is tonic's debug dump.
    #[error("{}", status_message(.0))]
    Rpc(tonic::Status),
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

fn status_message(s: &tonic::Status) -> String {
    format!("{} ({:?})", s.message(), s.code())
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Rpc(s)
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

    // The calls below are safe to send twice, so each is retried once when
    // the connection failed under it (see `retry`). The `admin` and
    // `inference` fields are the raw stubs, without that retry.

    pub async fn status(&mut self) -> Result<pb::StatusResponse, ClientError> {
        self.retry(|mut c| async move { c.admin.status(pb::StatusRequest {}).await }).await
    }

    pub async fn load_model(&mut self, req: pb::LoadModelRequest) -> Result<pb::LoadModelResponse, ClientError> {
        self.retry(|mut c| {
            let req = req.clone();
            async move { c.admin.load_model(req).await }
        })
        .await
    }

    pub async fn unload_model(&mut self, req: pb::UnloadModelRequest) -> Result<pb::UnloadModelResponse, ClientError> {
        self.retry(|mut c| {
            let req = req.clone();
            async move { c.admin.unload_model(req).await }
        })
        .await
    }

    pub async fn purge(&mut self, req: pb::PurgeRequest) -> Result<pb::PurgeResponse, ClientError> {
        self.retry(|mut c| {
            let req = req.clone();
            async move { c.admin.purge(req).await }
        })
        .await
    }

    pub async fn prefill(&mut self, req: pb::PrefillRequest) -> Result<pb::PrefillResponse, ClientError> {
        self.retry(|mut c| {
            let req = req.clone();
            async move { c.inference.prefill(req).await }
        })
        .await
    }

    pub async fn score(&mut self, req: pb::ScoreRequest) -> Result<pb::ScoreResponse, ClientError> {
        self.retry(|mut c| {
            let req = req.clone();
            async move { c.inference.score(req).await }
        })
        .await
    }

    /// Starts a generation; the stream yields Started, Deltas, then Done.
    /// The request is sent again once if the connection fails before the
    /// first event arrives (nothing has been shown to anyone yet); after
    /// that, a failure ends the stream with its error.
    pub async fn generate(&mut self, req: pb::GenerateRequest) -> Result<GenerateStream, ClientError> {
        match self.inference.generate(req.clone()).await {
            Ok(r) => Ok(GenerateStream { inner: r.into_inner(), retry: Some((self.clone(), req)) }),
            Err(s) if is_retryable(&s) => {
                tracing::debug!(status = %s, "Generate failed before it started; sending it again");
                let inner = self.inference.generate(req).await.map_err(|s| self.failure(s))?.into_inner();
                Ok(GenerateStream { inner, retry: None })
            }
            Err(s) => Err(self.failure(s)),
        }
    }

    /// Runs `call` on a clone of this client and, if the connection failed
    /// under it, once more. The clones share one channel, and the channel
    /// dials the socket again when its connection has gone (tonic's
    /// reconnect), so the second try reaches a daemon that was restarted on
    /// the same path in the meantime.
    async fn retry<T, F, Fut>(&self, call: F) -> Result<T, ClientError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let failed = match call(self.clone()).await {
            Ok(r) => return Ok(r.into_inner()),
            Err(s) if is_retryable(&s) => {
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
            Target::Socket(_) if s.code() == tonic::Code::Unavailable => local::undialled(&s).unwrap_or(ClientError::Rpc(s)),
            _ => ClientError::Rpc(s),
        }
    }
}

/// The events of one Generate (see [`Client::generate`]).
pub struct GenerateStream {
    inner: tonic::Streaming<pb::GenerateEvent>,
    /// What it takes to send the request again: kept until the first event.
    retry: Option<(Client, pb::GenerateRequest)>,
}

impl GenerateStream {
    /// The next event; `Ok(None)` when the stream ended.
    pub async fn message(&mut self) -> Result<Option<pb::GenerateEvent>, tonic::Status> {
        loop {
            match self.inner.message().await {
                Ok(ev) => {
                    self.retry = None;
                    return Ok(ev);
                }
                Err(s) if is_retryable(&s) => {
                    let Some((mut client, req)) = self.retry.take() else { return Err(s) };
                    tracing::debug!(status = %s, "Generate failed before its first event; sending it again");
                    self.inner = client.inference.generate(req).await?.into_inner();
                }
                Err(s) => return Err(s),
            }
        }
    }
}

/// Whether a failed call may be sent again: the daemon could not be reached
/// (UNAVAILABLE, which is also what a daemon that is shutting down answers),
/// or the connection broke under the call. A broken connection shows up as a
/// status made here from the transport error (it has a `source`), with code
/// UNKNOWN or CANCELLED; a status the daemon sent never has a source.
fn is_retryable(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::Unavailable
        || (std::error::Error::source(s).is_some() && matches!(s.code(), tonic::Code::Unknown | tonic::Code::Cancelled))
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

/// A chat message with text content.
pub fn message(role: pb::Role, text: &str) -> pb::ChatMessage {
    pb::ChatMessage { role: role as i32, content: text.as_bytes().to_vec().into() }
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

    async fn events(stream: &mut GenerateStream) -> Result<usize, Status> {
        let mut n = 0;
        while stream.message().await?.is_some() {
            n += 1;
        }
        Ok(n)
    }

    #[tokio::test]
    async fn generate_is_sent_again_when_it_fails_before_its_first_event() {
        let unavailable = Err(Status::unavailable("shutting down"));
        let (mut c, calls) = scripted("before", vec![vec![unavailable], vec![started(), done()]]).await;
        let mut stream = c.generate(pb::GenerateRequest::default()).await.unwrap();
        assert_eq!(events(&mut stream).await.unwrap(), 2);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn generate_is_not_sent_again_after_an_event_arrived() {
        let unavailable = Err(Status::unavailable("shutting down"));
        let (mut c, calls) = scripted("after", vec![vec![started(), unavailable], vec![started(), done()]]).await;
        let mut stream = c.generate(pb::GenerateRequest::default()).await.unwrap();
        assert!(stream.message().await.unwrap().is_some());
        assert_eq!(stream.message().await.unwrap_err().code(), tonic::Code::Unavailable);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_of_the_daemon_is_not_retried() {
        let refused = Err(Status::invalid_argument("empty"));
        let (mut c, calls) = scripted("refused", vec![vec![refused], vec![started(), done()]]).await;
        let mut stream = c.generate(pb::GenerateRequest::default()).await.unwrap();
        assert_eq!(stream.message().await.unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
