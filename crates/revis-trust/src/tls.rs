//! Mutual-TLS configs: TLS 1.3 only, ALPN h2, peers pinned by device ID with handshake signatures verified.

use std::sync::Arc;

use rustls::client::Resumption;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::NoServerSessionStorage;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::SingleCertAndKey;
use rustls::{
    CertificateError, ClientConfig, CommonState, DigitallySignedStruct, DistinguishedName,
    ServerConfig, SignatureScheme,
};

use crate::{DeviceId, Identity, Result, TrustSet};

/// The one application protocol: gRPC over HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";

/// The ring crypto provider every config here uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The name a client sends (SNI). Nothing checks it: the server is pinned
/// by device ID, so any address (an IP from mDNS too) can be dialled.
pub fn server_name() -> ServerName<'static> {
    ServerName::try_from("revis").expect("a valid DNS name")
}

/// The device ID of the peer of an established connection.
pub fn peer_device_id(conn: &CommonState) -> Option<DeviceId> {
    conn.peer_certificates()
        .and_then(|certs| certs.first())
        .map(|cert| DeviceId::of_certificate(cert))
}

/// The server side: presents `identity`, demands a client certificate whose
/// device ID is in `trusted` at handshake time. No session resumption, so
/// every connection runs the full check (a revoked device cannot resume).
pub fn server_config(identity: &Identity, trusted: TrustSet) -> Result<Arc<ServerConfig>> {
    let provider = provider();
    let verifier = Arc::new(PinnedClientVerifier::new(
        trusted,
        provider.signature_verification_algorithms,
    ));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::unwrap_or_clone(
            identity.certified_key()?,
        ))));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// The client side: presents `identity`, accepts only a server whose
/// certificate has device ID `server`. No session resumption.
pub fn client_config(identity: &Identity, server: DeviceId) -> Result<Arc<ClientConfig>> {
    let provider = provider();
    let verifier = Arc::new(PinnedServerVerifier::new(
        server,
        provider.signature_verification_algorithms,
    ));
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::unwrap_or_clone(
            identity.certified_key()?,
        ))));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

/// The certificate names no paired device.
fn not_trusted() -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure)
}

/// Server side: client authentication is mandatory, and only a device in the
/// trust set passes. The handshake signature is verified as usual, so the
/// certificate alone (without its key) is worth nothing.
#[derive(Debug)]
pub struct PinnedClientVerifier {
    trusted: TrustSet,
    algorithms: WebPkiSupportedAlgorithms,
}

impl PinnedClientVerifier {
    pub fn new(trusted: TrustSet, algorithms: WebPkiSupportedAlgorithms) -> Self {
        Self {
            trusted,
            algorithms,
        }
    }
}

impl ClientCertVerifier for PinnedClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if self.trusted.contains(&DeviceId::of_certificate(end_entity)) {
            Ok(ClientCertVerified::assertion())
        } else {
            Err(not_trusted())
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Client side: the server's certificate must have the pinned device ID; no
/// hostname check, no CA. The handshake signature is verified as usual.
#[derive(Debug)]
pub struct PinnedServerVerifier {
    pin: DeviceId,
    algorithms: WebPkiSupportedAlgorithms,
}

impl PinnedServerVerifier {
    pub fn new(pin: DeviceId, algorithms: WebPkiSupportedAlgorithms) -> Self {
        Self { pin, algorithms }
    }
}

impl ServerCertVerifier for PinnedServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if DeviceId::of_certificate(end_entity) == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(not_trusted())
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The application protocol of a pairing connection, distinct from `h2` so
/// that a pairing session can never be mistaken for a gRPC one.
pub const ALPN_PAIRING: &[u8] = b"revis-pair/1";

/// The server side of a pairing connection: presents `identity` and demands
/// a client certificate, but pins nothing (the peer is not trusted yet; the
/// pairing code decides). The handshake signature is still verified, so the
/// peer's device ID ([`peer_device_id`]) is one whose key it holds. ALPN
/// [`ALPN_PAIRING`], TLS 1.3 only, no resumption.
pub fn pairing_server_config(identity: &Identity) -> Result<Arc<ServerConfig>> {
    let provider = provider();
    let verifier = Arc::new(UnpinnedVerifier::new(
        provider.signature_verification_algorithms,
    ));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::unwrap_or_clone(
            identity.certified_key()?,
        ))));
    config.alpn_protocols = vec![ALPN_PAIRING.to_vec()];
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// The client side of a pairing connection: presents `identity` and accepts
/// any server certificate whose handshake signature verifies (pinning
/// nothing). ALPN [`ALPN_PAIRING`], TLS 1.3 only, no resumption.
pub fn pairing_client_config(identity: &Identity) -> Result<Arc<ClientConfig>> {
    let provider = provider();
    let verifier = Arc::new(UnpinnedVerifier::new(
        provider.signature_verification_algorithms,
    ));
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::unwrap_or_clone(
            identity.certified_key()?,
        ))));
    config.alpn_protocols = vec![ALPN_PAIRING.to_vec()];
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

/// Both sides of a pairing connection: any certificate is accepted (it is
/// parsed when the handshake signature is checked against it, so a
/// malformed one fails there), client authentication is mandatory, and the
/// TLS 1.3 signature is verified. Trust comes from the pairing code, never
/// from this verifier.
#[derive(Debug)]
pub struct UnpinnedVerifier {
    algorithms: WebPkiSupportedAlgorithms,
}

impl UnpinnedVerifier {
    pub fn new(algorithms: WebPkiSupportedAlgorithms) -> Self {
        Self { algorithms }
    }
}

impl ClientCertVerifier for UnpinnedVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // The configs are TLS 1.3 only; never accept a 1.2 signature here.
        Err(rustls::Error::General(
            "pairing accepts TLS 1.3 signatures only".into(),
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

impl ServerCertVerifier for UnpinnedVerifier {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        ClientCertVerifier::verify_tls12_signature(self, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        ClientCertVerifier::verify_tls13_signature(self, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        ClientCertVerifier::supported_verify_schemes(self)
    }
}
