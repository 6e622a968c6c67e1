//! Mutual-TLS configs: TLS 1.3 only, ALPN h2, peers pinned by device ID with handshake signatures verified.

use std::sync::Arc;

use rustls::client::Resumption;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::NoServerSessionStorage;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::SingleCertAndKey;
use rustls::{CertificateError, ClientConfig, CommonState, DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};

use crate::crypto::provider;
use crate::{DeviceId, Identity, Result, TrustSet};

/// The one application protocol: gRPC over HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";

/// The name a client sends (SNI). Nothing checks it: the server is pinned
/// by device ID, so any address (an IP from mDNS too) can be dialled.
pub fn server_name() -> ServerName<'static> {
    ServerName::try_from("revis").expect("a valid DNS name")
}

/// The device ID of the peer of an established connection.
pub fn peer_device_id(conn: &CommonState) -> Option<DeviceId> {
    conn.peer_certificates().and_then(|certs| certs.first()).map(|cert| DeviceId::of_certificate(cert))
}

/// Which peers a verifier lets through.
#[derive(Clone, Debug)]
pub enum Pin {
    /// Server side of a paired connection: any device in the trust set, as
    /// it is at handshake time (a revoke takes effect at once).
    Trusted(TrustSet),
    /// Client side of a paired connection: exactly this server.
    Device(DeviceId),
    /// Both sides of a pairing connection: anyone whose key signs the
    /// handshake; the pairing code decides trust, never this verifier.
    Any,
}

/// The one certificate verifier of revis, for both sides: no CA and no
/// hostname check; the peer's device ID must match the [`Pin`]; client
/// authentication is mandatory; and the TLS 1.3 handshake signature is
/// always verified, so a certificate without its key is worth nothing.
/// TLS 1.2 signatures are refused (every config here is TLS 1.3 only).
#[derive(Debug)]
pub struct PeerVerifier {
    pin: Pin,
    algorithms: WebPkiSupportedAlgorithms,
}

impl PeerVerifier {
    pub fn new(pin: Pin, algorithms: WebPkiSupportedAlgorithms) -> Self {
        Self { pin, algorithms }
    }

    fn check(&self, cert: &CertificateDer<'_>) -> std::result::Result<(), rustls::Error> {
        let ok = match &self.pin {
            Pin::Trusted(set) => set.contains(&DeviceId::of_certificate(cert)),
            Pin::Device(id) => DeviceId::of_certificate(cert) == *id,
            Pin::Any => true,
        };
        if ok { Ok(()) } else { Err(not_trusted()) }
    }

    fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }
}

/// The certificate names no paired device.
fn not_trusted() -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure)
}

fn no_tls12() -> rustls::Error {
    rustls::Error::General("revis accepts TLS 1.3 signatures only".into())
}

impl ClientCertVerifier for PeerVerifier {
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
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity).map(|()| ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        Err(no_tls12())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

impl ServerCertVerifier for PeerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity).map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        Err(no_tls12())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A server config: presents `identity`, lets clients through `pin`, offers
/// `alpn`. TLS 1.3 only and no session resumption, so every connection runs
/// the full check (a revoked device cannot resume).
fn server_with(identity: &Identity, pin: Pin, alpn: &[u8]) -> Result<Arc<ServerConfig>> {
    let provider = provider();
    let verifier = Arc::new(PeerVerifier::new(pin, provider.signature_verification_algorithms));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::unwrap_or_clone(identity.certified_key()?))));
    config.alpn_protocols = vec![alpn.to_vec()];
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// A client config: presents `identity`, accepts a server through `pin`,
/// asks for `alpn`. TLS 1.3 only, no session resumption.
fn client_with(identity: &Identity, pin: Pin, alpn: &[u8]) -> Result<Arc<ClientConfig>> {
    let provider = provider();
    let verifier = Arc::new(PeerVerifier::new(pin, provider.signature_verification_algorithms));
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::unwrap_or_clone(identity.certified_key()?))));
    config.alpn_protocols = vec![alpn.to_vec()];
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

/// The server side: presents `identity`, demands a client certificate whose
/// device ID is in `trusted` at handshake time. ALPN h2.
pub fn server_config(identity: &Identity, trusted: TrustSet) -> Result<Arc<ServerConfig>> {
    server_with(identity, Pin::Trusted(trusted), ALPN_H2)
}

/// The client side: presents `identity`, accepts only a server whose
/// certificate has device ID `server`. ALPN h2.
pub fn client_config(identity: &Identity, server: DeviceId) -> Result<Arc<ClientConfig>> {
    client_with(identity, Pin::Device(server), ALPN_H2)
}

/// The application protocol of a lending connection: llama.cpp's RPC
/// protocol, tunnelled to the lender's RPC server (bound to 127.0.0.1)
/// between paired devices only. Distinct from `h2`, so neither side can
/// take one for the other.
pub const ALPN_RPC: &[u8] = b"revis-rpc/1";

/// The lender's side of a lending connection: as [`server_config`] (the
/// client's device ID must be in `trusted`), ALPN [`ALPN_RPC`].
pub fn lend_server_config(identity: &Identity, trusted: TrustSet) -> Result<Arc<ServerConfig>> {
    server_with(identity, Pin::Trusted(trusted), ALPN_RPC)
}

/// The borrower's side: pinned to the lender's device ID, ALPN [`ALPN_RPC`].
pub fn lend_client_config(identity: &Identity, server: DeviceId) -> Result<Arc<ClientConfig>> {
    client_with(identity, Pin::Device(server), ALPN_RPC)
}

/// The application protocol of a pairing connection, distinct from `h2` so
/// that a pairing session can never be mistaken for a gRPC one.
pub const ALPN_PAIRING: &[u8] = b"revis-pair/1";

/// The server side of a pairing connection: presents `identity` and demands
/// a client certificate, but pins nothing (the peer is not trusted yet; the
/// pairing code decides). The handshake signature is still verified, so the
/// peer's device ID ([`peer_device_id`]) is one whose key it holds.
pub fn pairing_server_config(identity: &Identity) -> Result<Arc<ServerConfig>> {
    server_with(identity, Pin::Any, ALPN_PAIRING)
}

/// The client side of a pairing connection: presents `identity` and accepts
/// any server certificate whose handshake signature verifies.
pub fn pairing_client_config(identity: &Identity) -> Result<Arc<ClientConfig>> {
    client_with(identity, Pin::Any, ALPN_PAIRING)
}
