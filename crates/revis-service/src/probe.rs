//! `status`'s last question: does the service answer? revisd is asked for
//! its Status on its socket; `revis serve` is sent one HTTP request on its
//! address ([`Probe`]).

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::command::say;
use crate::layout::{Layout, Probe};

/// How long `status` waits for an answer. With socket activation the first
/// connection may start revisd, which is quick: models load on first use.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What is asked of an HTTP service: Ollama's version route, which reads
/// nothing and asks no daemon.
const HTTP_PATH: &str = "/api/version";

/// The probe's errors when nothing answered at all.
const NOTHING_LISTENS: &str = "nothing listens there";
const NO_ANSWER_WITHIN: &str = "no answer within";

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
            let (answer, warning) = ask(&url, trust.as_deref());
            if let Some(w) = warning {
                say!(out, "{url}: {w}");
            }
            match answer {
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

/// [`http`] at `url`, trusting `trust` over HTTPS. When something answers
/// TLS but not with a certificate that verifies for this address against
/// `trust` (a user's own certificate made for a DNS name, or signed by an
/// authority elsewhere), it is asked again without verifying (the probe
/// sends no secret), and the second value says so.
fn ask(url: &str, trust: Option<&Path>) -> (Result<Answer, String>, Option<String>) {
    let answer = http(url, trust, true);
    if let (Err(why), Some(trust)) = (&answer, trust)
        && why != NOTHING_LISTENS
        && !why.starts_with(NO_ANSWER_WITHIN)
        && let Ok(a) = http(url, None, false)
    {
        return (Ok(a), Some(format!("its certificate does not verify against {} for this address ({why})", trust.display())));
    }
    (answer, None)
}

/// `GET HTTP_PATH` at `url`: no proxy (it is this machine), no redirect
/// followed, no key; over HTTPS trusting `trust` (a PEM certificate) alone,
/// or, without `verify`, any certificate.
fn http(url: &str, trust: Option<&Path>, verify: bool) -> Result<Answer, String> {
    let mut tls = ureq::tls::TlsConfig::builder().disable_verification(!verify);
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
        ureq::Error::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => NOTHING_LISTENS.to_owned(),
        ureq::Error::Timeout(_) => format!("{NO_ANSWER_WITHIN} {} s", PROBE_TIMEOUT.as_secs()),
        e => e.to_string(),
    })?;
    let status = r.status().as_u16();
    let body = r.body_mut().with_config().limit(64 * 1024).read_to_string().unwrap_or_default();
    let version = serde_json::from_str::<serde_json::Value>(&body).ok().and_then(|v| v.get("version")?.as_str().map(str::to_owned));
    Ok(Answer { status, version })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A service whose certificate is made for another name, under an
    /// authority the probe is not told of, still answers, and that is said.
    #[test]
    fn a_certificate_that_does_not_verify_here_still_answers_and_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let id = revis_trust::HttpsIdentity::load_or_create(dir.path(), &["elsewhere.test".into()]).unwrap();
        let leaf = dir.path().join(revis_trust::HTTPS_CERT_FILE);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            rt.block_on(async move {
                // The verifying try's handshake fails; the second is answered.
                loop {
                    let (tcp, _) = listener.accept().await.unwrap();
                    let Ok(mut tls) = id.accept(tcp).await else { continue };
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        let n = tls.read(&mut buf).await.unwrap();
                        assert!(n > 0, "the request ends");
                        request.extend_from_slice(&buf[..n]);
                    }
                    let body = r#"{"version":"9.9"}"#;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    tls.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
                    tls.shutdown().await.unwrap();
                    return String::from_utf8_lossy(&request).into_owned();
                }
            })
        });
        let (answer, warning) = ask(&format!("https://{addr}"), Some(&leaf));
        assert!(matches!(&answer, Ok(Answer { status: 200, version: Some(v) }) if v == "9.9"), "{:?}", answer.as_ref().err());
        let warning = warning.expect("the certificate is said not to verify");
        assert!(warning.contains("does not verify against") && warning.contains(revis_trust::HTTPS_CERT_FILE), "{warning}");
        let request = server.join().unwrap();
        assert!(request.starts_with("GET /api/version ") && !request.to_ascii_lowercase().contains("authorization"), "{request}");
        // Nothing listens there any more: not retried, and said so.
        let (answer, warning) = ask(&format!("https://{addr}"), Some(&leaf));
        assert_eq!((answer.err().as_deref(), warning), (Some(NOTHING_LISTENS), None));
    }
}
