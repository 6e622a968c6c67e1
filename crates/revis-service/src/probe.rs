//! `status`'s last question: does the service answer? revisd is asked for
//! its Status on its socket; `revis serve` is sent one HTTP request on its
//! address ([`Probe`]).

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::{Layout, Probe, say};

/// How long `status` waits for an answer. With socket activation the first
/// connection may start revisd, which is quick: models load on first use.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What is asked of an HTTP service: Ollama's version route, which reads
/// nothing and asks no daemon.
const HTTP_PATH: &str = "/api/version";

/// Says whether the service answers; returns whether it does.
pub(crate) fn report(layout: &Layout, out: &mut dyn Write) -> bool {
    let name = layout.service.name;
    match &layout.probe {
        Probe::Revisd => {
            let socket = layout.socket();
            if !socket.exists() {
                say!(out, "{}: no {name} answers (nothing listens there)", socket.display());
                return false;
            }
            match revisd(&socket) {
                Ok(s) => {
                    say!(out, "{}: {name} {} answers (pid {}, up {} s)", socket.display(), s.version, s.pid, s.uptime_s);
                    true
                }
                Err(why) => {
                    say!(out, "{}: no {name} answers ({why})", socket.display());
                    false
                }
            }
        }
        Probe::Http(addr, trust) => {
            let url = base_url(*addr, trust.is_some());
            match http(&url, trust.as_deref()) {
                Ok(Answer { status: 200, version: Some(v) }) => {
                    say!(out, "{url}: {name} {v} answers");
                    true
                }
                Ok(Answer { status, .. }) => {
                    say!(out, "{url}: {name} answers (HTTP {status} to GET {HTTP_PATH}, asked without the API key)");
                    true
                }
                Err(why) => {
                    say!(out, "{url}: no {name} answers ({why})");
                    false
                }
            }
        }
    }
}

/// Asks the daemon on `socket` for its status.
fn revisd(socket: &Path) -> Result<revis_client::DaemonStatus, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let ask = async {
            let c = revis_client::Client::connect(socket).await?;
            c.status().await
        };
        match tokio::time::timeout(PROBE_TIMEOUT, ask).await {
            // The path is said already: only why.
            Ok(r) => r.map_err(|e| match e {
                revis_client::ClientError::NotRunning { reason, .. } => reason,
                e => e.to_string(),
            }),
            Err(_) => Err(format!("no answer within {} s", PROBE_TIMEOUT.as_secs())),
        }
    })
}

/// An HTTP service's answer to [`HTTP_PATH`].
struct Answer {
    status: u16,
    /// `version` of a JSON body, as Ollama's route has it.
    version: Option<String>,
}

/// Where the service at `addr` is asked: this machine's loopback address
/// when it listens on every address (a certificate made by `revis serve
/// --tls` holds that name too).
fn base_url(addr: SocketAddr, tls: bool) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(v) if v.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(v) if v.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("{}://{}", if tls { "https" } else { "http" }, SocketAddr::new(ip, addr.port()))
}

/// `GET HTTP_PATH` at `url`: no proxy (it is this machine), no redirect
/// followed, no key; over HTTPS trusting `trust` (a PEM certificate) alone.
fn http(url: &str, trust: Option<&Path>) -> Result<Answer, String> {
    let mut tls = ureq::tls::TlsConfig::builder();
    if let Some(path) = trust {
        let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let cert = ureq::tls::Certificate::from_pem(&pem).map_err(|e| format!("{}: {e}", path.display()))?;
        tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&[cert]));
    }
    let agent = ureq::Agent::config_builder()
        .tls_config(tls.build())
        .http_status_as_error(false)
        .proxy(None)
        .max_redirects(0)
        .timeout_global(Some(PROBE_TIMEOUT))
        .user_agent(concat!("revis-service/", env!("CARGO_PKG_VERSION")))
        .build()
        .new_agent();
    let mut r = agent.get(format!("{url}{HTTP_PATH}")).call().map_err(|e| match e {
        ureq::Error::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => "nothing listens there".to_owned(),
        ureq::Error::Timeout(_) => format!("no answer within {} s", PROBE_TIMEOUT.as_secs()),
        e => e.to_string(),
    })?;
    let status = r.status().as_u16();
    let body = r.body_mut().with_config().limit(64 * 1024).read_to_string().unwrap_or_default();
    let version = serde_json::from_str::<serde_json::Value>(&body).ok().and_then(|v| v.get("version")?.as_str().map(str::to_owned));
    Ok(Answer { status, version })
}
