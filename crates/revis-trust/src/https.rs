//! TLS for `revis serve` beyond this machine: HTTPS for third-party HTTP
//! clients (OpenAI's and Ollama's libraries, editors, Open WebUI), which
//! check a server certificate the usual way, not by revis's pinned device
//! IDs. The certificate is the user's own (PEM files), or one made here
//! once for this machine's names and addresses: a certificate authority of
//! its own signs it and is then thrown away (its key is never written, so
//! nothing can sign another certificate under it), and clients trust that
//! authority's certificate ([`HTTPS_CA_FILE`]), as they would a company's.
//! A separate authority, not a self-signed server certificate, because
//! strict verifiers (webpki, Python 3.13's OpenSSL settings) refuse a
//! server certificate that is its own anchor. All kept 0600 in the data
//! directory. TLS 1.2 and 1.3, ALPN `http/1.1`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};

use crate::fsutil::{read_if_exists, write_private_atomic};
use crate::{Result, TrustError, crypto};

/// The certificate `revis serve --tls` makes, and the authority's after it (PEM, 0600).
pub const HTTPS_CERT_FILE: &str = "http-tls.crt";
/// The authority that signed it: what an HTTPS client is told to trust (PEM, 0600).
pub const HTTPS_CA_FILE: &str = "http-tls-ca.crt";
/// Its private key (PKCS#8 PEM, 0600).
pub const HTTPS_KEY_FILE: &str = "http-tls.key";

/// Days a certificate made here is valid: under the 825 days Apple's
/// platforms accept for a server certificate, even under an authority the
/// user added.
pub const HTTPS_CERT_DAYS: i64 = 800;
/// Days the authority made here is valid (it signs once, at the start).
const CA_DAYS: i64 = 3650;

/// A TLS connection of an HTTPS client.
pub type HttpsStream = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// A certificate and key ready to serve HTTPS.
#[derive(Clone)]
pub struct HttpsIdentity {
    /// The file a client trusts: the authority made here, or the user's own certificate.
    pub cert_path: PathBuf,
    /// SHA-256 of that certificate (DER), hex in pairs.
    pub fingerprint: String,
    /// The names and addresses asked for that it is valid for.
    pub names: Vec<String>,
    /// The names and addresses asked for that a certificate made earlier
    /// does not hold (this machine's addresses changed since).
    pub missing: Vec<String>,
    config: Arc<ServerConfig>,
}

impl std::fmt::Debug for HttpsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsIdentity").field("cert_path", &self.cert_path).field("fingerprint", &self.fingerprint).finish_non_exhaustive()
    }
}

impl HttpsIdentity {
    /// The user's own certificate chain and key (PEM files).
    pub fn from_files(cert_path: &Path, key_path: &Path) -> Result<Self> {
        let (chain, key) = read_pair(cert_path, key_path)?;
        let fingerprint = fingerprint(&chain[0]);
        Self::new(cert_path.to_owned(), fingerprint, chain, key, Vec::new())
    }

    /// The certificate in `dir` ([`HTTPS_CERT_FILE`], [`HTTPS_KEY_FILE`],
    /// signed by [`HTTPS_CA_FILE`]), made on first use for `names` (host
    /// names and addresses), valid for [`HTTPS_CERT_DAYS`]. Made once: a
    /// client that trusted it keeps trusting it. A certificate read back
    /// that has expired (or no longer verifies under its authority) is an
    /// error saying to remove the three files for new ones; the names it
    /// does not hold are in [`HttpsIdentity::missing`].
    pub fn load_or_create(dir: &Path, names: &[String]) -> Result<Self> {
        let (cert_path, key_path, ca_path) = (dir.join(HTTPS_CERT_FILE), dir.join(HTTPS_KEY_FILE), dir.join(HTTPS_CA_FILE));
        if read_if_exists(&cert_path)?.is_some() || read_if_exists(&key_path)?.is_some() {
            let (chain, key) = read_pair(&cert_path, &key_path)?;
            let ca = read_if_exists(&ca_path)?.ok_or_else(|| TrustError::corrupt(&ca_path, "no such file"))?;
            let ca = CertificateDer::from_pem_slice(&ca).map_err(|e| TrustError::corrupt(&ca_path, format!("no certificate: {e}")))?;
            let (held, missing) = names_held(&chain[0], &ca, names).map_err(|e| {
                TrustError::corrupt(
                    &cert_path,
                    format!(
                        "{e}; remove {HTTPS_CERT_FILE}, {HTTPS_KEY_FILE} and {HTTPS_CA_FILE} from {} to make new ones \
                         (clients then trust the new {HTTPS_CA_FILE})",
                        dir.display()
                    ),
                )
            })?;
            let mut id = Self::new(ca_path, fingerprint(&ca), chain, key, held)?;
            id.missing = missing;
            return Ok(id);
        }
        let now = time::OffsetDateTime::now_utc();
        let validity = |p: &mut rcgen::CertificateParams, days: i64| {
            // A day back, for clocks a little behind this one.
            p.not_before = now - time::Duration::days(1);
            p.not_after = now + time::Duration::days(days);
        };
        // The authority: used once, its key dropped at the end of this function.
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, format!("revis serve on {}", crate::host_name("this machine")));
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        validity(&mut ca_params, CA_DAYS);
        let ca = ca_params.self_signed(&ca_key)?;
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(names.to_vec())?;
        params.distinguished_name.push(rcgen::DnType::CommonName, "revis serve");
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, HTTPS_CERT_DAYS);
        let cert = params.signed_by(&key, &rcgen::Issuer::new(ca_params, &ca_key))?;
        write_private_atomic(&key_path, key.serialize_pem().as_bytes())?;
        write_private_atomic(&ca_path, ca.pem().as_bytes())?;
        write_private_atomic(&cert_path, format!("{}{}", cert.pem(), ca.pem()).as_bytes())?;
        let der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
        Self::new(ca_path, fingerprint(ca.der()), vec![cert.der().clone(), ca.der().clone()], der, names.to_vec())
    }

    fn new(
        cert_path: PathBuf,
        fingerprint: String,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        names: Vec<String>,
    ) -> Result<Self> {
        let mut config = ServerConfig::builder_with_provider(crypto::provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| TrustError::corrupt(&cert_path, format!("the certificate and key do not go together: {e}")))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self { cert_path, fingerprint, names, missing: Vec::new(), config: Arc::new(config) })
    }

    /// Completes the TLS handshake of an accepted connection.
    pub async fn accept(&self, tcp: tokio::net::TcpStream) -> std::io::Result<HttpsStream> {
        tokio_rustls::TlsAcceptor::from(self.config.clone()).accept(tcp).await
    }
}

/// Which of `names` the certificate `leaf` holds, and which it does not;
/// an error when it does not verify under `ca` now (expired, or not its).
fn names_held(
    leaf: &CertificateDer<'_>,
    ca: &CertificateDer<'static>,
    names: &[String],
) -> std::result::Result<(Vec<String>, Vec<String>), rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone())?;
    let parsed = rustls::server::ParsedCertificate::try_from(leaf)?;
    let algorithms = crypto::provider().signature_verification_algorithms.all;
    rustls::client::verify_server_cert_signed_by_trust_anchor(&parsed, &roots, &[], rustls::pki_types::UnixTime::now(), algorithms)?;
    Ok(names.iter().cloned().partition(|n| {
        rustls::pki_types::ServerName::try_from(n.as_str()).is_ok_and(|name| rustls::client::verify_server_name(&parsed, &name).is_ok())
    }))
}

/// A certificate chain and its key, from PEM files.
fn read_pair(cert_path: &Path, key_path: &Path) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let read = |p: &Path| read_if_exists(p)?.ok_or_else(|| TrustError::corrupt(p, "no such file"));
    let (cert_pem, key_pem) = (read(cert_path)?, read(key_path)?);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| TrustError::corrupt(cert_path, format!("not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(TrustError::corrupt(cert_path, "holds no certificate"));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TrustError::corrupt(key_path, format!("no private key: {e}")))?;
    Ok((chain, key))
}

/// SHA-256 of a certificate, hex in pairs.
fn fingerprint(cert: &CertificateDer<'_>) -> String {
    Sha256::digest(cert).iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
}

/// The names a certificate made for listening on `ip` should hold: this
/// machine's host name (and `.local`), `localhost`, the loopback
/// addresses, and `ip` itself, or, for an unspecified address (0.0.0.0,
/// ::), every address of this machine's interfaces.
pub fn https_names(ip: IpAddr) -> Vec<String> {
    let host = crate::host_name("localhost");
    let mut names = vec![host.clone(), format!("{host}.local"), "localhost".into(), "127.0.0.1".into(), "::1".into()];
    let addrs: Vec<IpAddr> = if ip.is_unspecified() {
        if_addrs::get_if_addrs().map(|all| all.into_iter().map(|i| i.ip()).collect()).unwrap_or_default()
    } else {
        vec![ip]
    };
    for a in addrs {
        let a = a.to_string();
        if !names.contains(&a) {
            names.push(a);
        }
    }
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_made_once_and_kept_private() {
        let dir = tempfile::tempdir().unwrap();
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "10.1.2.3".to_owned()];
        let first = HttpsIdentity::load_or_create(dir.path(), &names).unwrap();
        assert_eq!(first.fingerprint.len(), 32 * 3 - 1);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(first.cert_path, dir.path().join(HTTPS_CA_FILE), "clients trust the authority");
        for f in [HTTPS_CERT_FILE, HTTPS_KEY_FILE, HTTPS_CA_FILE] {
            assert_eq!(std::fs::metadata(dir.path().join(f)).unwrap().permissions().mode() & 0o777, 0o600, "{f}");
        }
        // Read back, not made again, whatever names are asked this time; the
        // names it does not hold are said.
        let again = HttpsIdentity::load_or_create(dir.path(), &["other".into(), "10.1.2.3".into()]).unwrap();
        assert_eq!(again.fingerprint, first.fingerprint);
        assert_eq!((again.names, again.missing), (vec!["10.1.2.3".to_owned()], vec!["other".to_owned()]));
        // A certificate that does not verify under the authority there (here: another's) is refused, saying what to do.
        let elsewhere = tempfile::tempdir().unwrap();
        HttpsIdentity::load_or_create(elsewhere.path(), &names).unwrap();
        let mixed = tempfile::tempdir().unwrap();
        for f in [HTTPS_CERT_FILE, HTTPS_KEY_FILE] {
            std::fs::copy(dir.path().join(f), mixed.path().join(f)).unwrap();
        }
        std::fs::copy(elsewhere.path().join(HTTPS_CA_FILE), mixed.path().join(HTTPS_CA_FILE)).unwrap();
        let e = HttpsIdentity::load_or_create(mixed.path(), &names).unwrap_err().to_string();
        assert!(e.contains(HTTPS_CERT_FILE) && e.contains("to make new ones"), "{e}");
        // A key that is not the certificate's is refused, naming the file.
        let other = tempfile::tempdir().unwrap();
        HttpsIdentity::load_or_create(other.path(), &names).unwrap();
        std::fs::copy(other.path().join(HTTPS_KEY_FILE), dir.path().join(HTTPS_KEY_FILE)).unwrap();
        let e = HttpsIdentity::from_files(&dir.path().join(HTTPS_CERT_FILE), &dir.path().join(HTTPS_KEY_FILE)).unwrap_err();
        assert!(e.to_string().contains("do not go together"), "{e}");
        let e = HttpsIdentity::from_files(&dir.path().join("none.pem"), &dir.path().join(HTTPS_KEY_FILE)).unwrap_err();
        assert!(e.to_string().contains("none.pem") && e.to_string().contains("no such file"), "{e}");
    }

    /// A client that trusts the authority made here (webpki, the strict
    /// verifier) reaches the server by each of its names, and no other.
    #[tokio::test]
    async fn a_client_that_trusts_the_authority_connects_by_the_names_it_holds() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let id = HttpsIdentity::load_or_create(dir.path(), &["localhost".into(), "127.0.0.1".into()]).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = id.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                if let Ok(mut s) = server.accept(tcp).await {
                    let _ = s.write_all(b"ok").await;
                    let _ = s.shutdown().await;
                }
            }
        });
        let mut roots = rustls::RootCertStore::empty();
        let ca = std::fs::read(&id.cert_path).unwrap();
        roots.add(CertificateDer::from_pem_slice(&ca).unwrap()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(crypto::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let dial = |name: &'static str| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
                let mut s = connector.connect(rustls::pki_types::ServerName::try_from(name).unwrap(), tcp).await?;
                let mut got = Vec::new();
                s.read_to_end(&mut got).await?;
                Ok::<_, std::io::Error>(got)
            }
        };
        assert_eq!(dial("localhost").await.unwrap(), b"ok");
        assert_eq!(dial("127.0.0.1").await.unwrap(), b"ok");
        let e = dial("evil.example").await.unwrap_err();
        assert!(e.to_string().contains("not valid for name"), "{e}");
    }

    #[test]
    fn the_names_hold_the_host_loopback_and_the_address() {
        let names = https_names("192.168.7.9".parse().unwrap());
        for want in ["localhost", "127.0.0.1", "::1", "192.168.7.9"] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
    }
}
