//! The client library of revis: connects to `revisd` over its Unix socket
//! (starting a daemon when none answers) and exposes its API. The `revis`
//! CLI and the GUI both sit on top of this crate.

mod spawn;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use revis_proto::v1 as pb;
use tonic::transport::{Channel, Endpoint, Uri};

pub use revis_proto::v1;
pub use spawn::{SpawnOptions, spawn_daemon};

/// How long to wait for a freshly started daemon to answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no revisd answers on {path}: {reason}")]
    NotRunning { path: PathBuf, reason: String },
    #[error("could not start revisd: {0}")]
    Spawn(String),
    #[error("{}", status_message(.0))]
    Rpc(#[from] tonic::Status),
    #[error(transparent)]
    Models(#[from] revis_models::Error),
}

fn status_message(s: &tonic::Status) -> String {
    format!("{} ({:?})", s.message(), s.code())
}

/// The default socket: `$REVIS_SOCKET`, else the user's runtime directory
/// (must match revisd's default; see `revis_daemon::socket::default_socket_path`).
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("REVIS_SOCKET").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    #[cfg(target_os = "macos")]
    if let Some(home) = std::env::var_os("HOME") {
        return PathBuf::from(home).join("Library/Application Support/revis/revisd.sock");
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("revis/revisd.sock");
    }
    // SAFETY: getuid cannot fail.
    PathBuf::from(format!("/tmp/revis-{}/revisd.sock", unsafe { libc::getuid() }))
}

/// A connection to one revisd.
#[derive(Clone)]
pub struct Client {
    pub inference: pb::inference_client::InferenceClient<Channel>,
    pub admin: pb::admin_client::AdminClient<Channel>,
    /// The underlying channel, for other services on the socket (health, reflection).
    pub channel: Channel,
    path: PathBuf,
}

impl Client {
    /// Connects to the daemon at `path` and checks that it answers.
    pub async fn connect(path: &Path) -> Result<Client, ClientError> {
        let not_running = |reason: String| ClientError::NotRunning { path: path.into(), reason };
        let socket = path.to_path_buf();
        // The URI is required by tonic but unused: the connector dials the socket.
        let channel = Endpoint::from_static("http://revisd.local")
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move { tokio::net::UnixStream::connect(socket).await.map(TokioIo::new) }
            }))
            .await
            .map_err(|e| not_running(source_chain(&e)))?;
        let limit = 4 << 20;
        let client = Client {
            inference: pb::inference_client::InferenceClient::new(channel.clone())
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
            admin: pb::admin_client::AdminClient::new(channel.clone())
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
            channel,
            path: path.into(),
        };
        Ok(client)
    }

    /// Connects to the daemon at `path`; if none answers, starts one (pulling
    /// the default model first if it is missing) and connects to it.
    pub async fn connect_or_start(path: &Path, opts: &SpawnOptions) -> Result<Client, ClientError> {
        if let Ok(c) = Self::connect(path).await
            && c.clone().status().await.is_ok()
        {
            return Ok(c);
        }
        spawn_daemon(path, opts).await?;
        Self::connect(path).await
    }

    pub fn socket(&self) -> &Path {
        &self.path
    }

    pub async fn status(&mut self) -> Result<pb::StatusResponse, ClientError> {
        Ok(self.admin.status(pb::StatusRequest {}).await?.into_inner())
    }

    /// Starts a generation; the stream yields Started, Deltas, then Done.
    pub async fn generate(&mut self, req: pb::GenerateRequest) -> Result<tonic::Streaming<pb::GenerateEvent>, ClientError> {
        Ok(self.inference.generate(req).await?.into_inner())
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A chat message with text content.
pub fn message(role: pb::Role, text: &str) -> pb::ChatMessage {
    pb::ChatMessage { role: role as i32, content: text.as_bytes().to_vec().into() }
}
