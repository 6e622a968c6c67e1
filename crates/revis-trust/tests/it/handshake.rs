//! Mutual TLS over loopback: pinned peers talk; strangers, replayed certificates, wrong servers and revoked devices do not.

use std::sync::Arc;

use revis_trust::{
    ALPN_H2, DeviceId, Identity, PeerVerifier, Pin, TrustSet, TrustStore, client_config, peer_device_id, provider, server_config,
    server_name,
};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// What each side saw of one connection.
struct Outcome {
    /// The server: the client's device ID, or the handshake/exchange error.
    server: Result<DeviceId, String>,
    /// The client: the server's device ID, or the handshake/exchange error.
    client: Result<DeviceId, String>,
}

/// One connection over loopback: handshake, then the client sends "ping"
/// and the server answers "pong".
async fn connect(server: Arc<ServerConfig>, client: Arc<ClientConfig>) -> Outcome {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = TlsAcceptor::from(server).accept(tcp).await.map_err(|e| e.to_string())?;
        let (_, conn) = tls.get_ref();
        assert_eq!(conn.alpn_protocol(), Some(ALPN_H2));
        assert_eq!(conn.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_3));
        let peer = peer_device_id(conn).expect("a client certificate");
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        assert_eq!(&buf, b"ping");
        tls.write_all(b"pong").await.map_err(|e| e.to_string())?;
        tls.shutdown().await.map_err(|e| e.to_string())?;
        Ok(peer)
    });
    let client = async move {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let mut tls = TlsConnector::from(client).connect(server_name(), tcp).await.map_err(|e| e.to_string())?;
        let peer = peer_device_id(tls.get_ref().1).expect("a server certificate");
        // In TLS 1.3 the client finishes first; a refusal of its certificate
        // arrives as an alert on its first read.
        tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        assert_eq!(&buf, b"pong");
        Ok(peer)
    }
    .await;
    Outcome { server: server.await.unwrap(), client }
}

/// A client config that presents `cert_of`'s certificate but signs with
/// `key_of`'s key: someone who copied a paired device's certificate.
fn replaying_client(cert_of: &Identity, key_of: &Identity, server: DeviceId) -> Arc<ClientConfig> {
    let forged = CertifiedKey::new(vec![cert_of.certificate().clone()], key_of.signing_key().unwrap());
    let provider = provider();
    let verifier = PeerVerifier::new(Pin::Device(server), provider.signature_verification_algorithms);
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(forged)));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Arc::new(config)
}

struct Pair {
    server: Identity,
    client: Identity,
}

fn pair() -> Pair {
    Pair { server: Identity::generate().unwrap(), client: Identity::generate().unwrap() }
}

fn assert_refused(outcome: &Outcome, server_says: &str) {
    let server = outcome.server.as_ref().expect_err("the server must refuse");
    assert!(server.contains(server_says), "server: {server}");
    assert!(outcome.client.is_err(), "the client must not get through");
}

#[tokio::test]
async fn pinned_peers_complete_the_handshake_and_talk() {
    let p = pair();
    let server = server_config(&p.server, TrustSet::new([p.client.device_id()])).unwrap();
    let client = client_config(&p.client, p.server.device_id()).unwrap();
    let out = connect(server, client).await;
    assert_eq!(out.server.unwrap(), p.client.device_id());
    assert_eq!(out.client.unwrap(), p.server.device_id());
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let p = pair();
    let server = server_config(&p.server, TrustSet::new([p.client.device_id()])).unwrap();
    let provider = provider();
    let verifier = PeerVerifier::new(Pin::Device(p.server.device_id()), provider.signature_verification_algorithms);
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    client.alpn_protocols = vec![ALPN_H2.to_vec()];
    let out = connect(server, Arc::new(client)).await;
    assert_refused(&out, "peer sent no certificates");
}

#[tokio::test]
async fn a_stranger_is_refused() {
    let p = pair();
    let stranger = Identity::generate().unwrap();
    let server = server_config(&p.server, TrustSet::new([p.client.device_id()])).unwrap();
    let client = client_config(&stranger, p.server.device_id()).unwrap();
    assert_refused(&connect(server, client).await, "ApplicationVerificationFailure");
}

#[tokio::test]
async fn a_replayed_client_certificate_without_its_key_is_refused() {
    let p = pair();
    let thief = Identity::generate().unwrap();
    let server = server_config(&p.server, TrustSet::new([p.client.device_id()])).unwrap();
    let client = replaying_client(&p.client, &thief, p.server.device_id());
    assert_refused(&connect(server, client).await, "BadSignature");
}

#[tokio::test]
async fn a_server_that_is_not_the_pinned_one_is_refused() {
    let p = pair();
    let impostor = Identity::generate().unwrap();
    let server = server_config(&impostor, TrustSet::new([p.client.device_id()])).unwrap();
    let client = client_config(&p.client, p.server.device_id()).unwrap();
    let out = connect(server, client).await;
    let err = out.client.expect_err("the client must refuse");
    assert!(err.contains("ApplicationVerificationFailure"), "client: {err}");
    assert!(out.server.is_err());
}

#[tokio::test]
async fn a_server_replaying_the_pinned_certificate_is_refused() {
    let p = pair();
    let impostor = Identity::generate().unwrap();
    let forged = CertifiedKey::new(vec![p.server.certificate().clone()], impostor.signing_key().unwrap());
    let provider = provider();
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_client_cert_verifier(Arc::new(revis_trust::PeerVerifier::new(
            Pin::Trusted(TrustSet::new([p.client.device_id()])),
            provider.signature_verification_algorithms,
        )))
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(forged)));
    server.alpn_protocols = vec![ALPN_H2.to_vec()];
    let client = client_config(&p.client, p.server.device_id()).unwrap();
    let out = connect(Arc::new(server), client).await;
    let err = out.client.expect_err("the client must refuse");
    assert!(err.contains("BadSignature"), "client: {err}");
    assert!(out.server.is_err());
}

#[tokio::test]
async fn a_revoked_device_is_refused_at_its_next_handshake() {
    let p = pair();
    let dir = tempfile::tempdir().unwrap();
    let mut store = TrustStore::open(dir.path()).unwrap();
    store.add(p.client.device_id(), "laptop").unwrap();
    // One server config and one client config for both connections, as a
    // running daemon and client would keep them.
    let server = server_config(&p.server, store.trust_set()).unwrap();
    let client = client_config(&p.client, p.server.device_id()).unwrap();

    let out = connect(server.clone(), client.clone()).await;
    assert_eq!(out.server.unwrap(), p.client.device_id());
    out.client.unwrap();

    assert!(store.revoke(&p.client.device_id()).unwrap());
    assert_refused(&connect(server.clone(), client.clone()).await, "ApplicationVerificationFailure");

    store.add(p.client.device_id(), "laptop").unwrap();
    connect(server, client).await.server.unwrap();
}
