//! Trust between machines: who this node is, which devices it trusts, and mutual TLS between them.
//!
//! The one crate that owns TLS, pairing and discovery (see
//! `shared/design/trust-and-faults.md`). Today it holds the foundation:
//!
//! - [`Identity`]: this node's key and self-signed certificate, created on
//!   first run in a directory it is given (`identity.key`, `identity.crt`,
//!   both 0600) and loaded afterwards.
//! - [`DeviceId`]: SHA-256 of a certificate's DER, written as 8 groups of 7
//!   base32 characters with check characters, and parsed back.
//! - [`TrustStore`]: the paired devices (`trusted-devices.json`, 0600,
//!   written atomically) and the live [`TrustSet`] the TLS verifier reads.
//! - [`server_config`] / [`client_config`]: TLS 1.3 only, ALPN `h2`, client
//!   authentication mandatory, peers pinned by device ID, handshake
//!   signatures verified, session resumption off (so a revocation holds for
//!   every new connection).
//!
//! - Pairing ([`PairingWindow`], [`pair_server`], [`pair_client`]): a
//!   single-use code shown for about two minutes, SPAKE2 over it between the
//!   two device IDs, key confirmation bound to the TLS connection by its
//!   exporter, over [`pairing_server_config`] / [`pairing_client_config`]
//!   (TLS 1.3, signatures verified, nothing pinned). Then each side stores
//!   the other.
//!
//! - Discovery ([`Advertiser`], [`browse`]): mDNS (DNS-SD type
//!   [`SERVICE_TYPE`]) on chosen interfaces, IPv4 only; an advertisement
//!   carries the device ID, name, version and tiers, and is a hint only:
//!   the connection that follows pins the device ID.
//!
//! - HTTPS for `revis serve` beyond this machine ([`HttpsIdentity`]): for
//!   third-party HTTP clients, which check a certificate the usual way; the
//!   user's own, or one made here, self-signed for this machine's names.

mod crypto;
mod device_id;
mod discovery;
mod error;
mod fsutil;
mod https;
mod identity;
pub mod link;
mod pairing;
mod store;
mod tls;

pub use crypto::provider;
pub use device_id::DeviceId;
pub use discovery::{Advertisement, Advertiser, Discovered, Interfaces, SERVICE_TYPE, browse};
pub use error::TrustError;
pub use https::{HTTPS_CA_FILE, HTTPS_CERT_FILE, HTTPS_KEY_FILE, HttpsIdentity, HttpsStream, https_names};
pub use identity::{CERT_FILE, Identity, KEY_FILE, host_name};
pub use pairing::{
    CODE_DIGITS, ChannelBinding, DEFAULT_WINDOW, EXPORTER_LABEL, MAX_ATTEMPTS, MAX_ATTEMPTS_PER_ADDRESS, MAX_FRAME, PairingCode,
    PairingSink, PairingWindow, pair_client, pair_client_over, pair_server, pair_server_over, read_frame, send_frame,
};
pub use store::{PairedDevice, TRUST_FILE, TrustSet, TrustStore};
pub use tls::{
    ALPN_H2, ALPN_PAIRING, ALPN_RPC, PeerVerifier, Pin, client_config, lend_client_config, lend_server_config, pairing_client_config,
    pairing_server_config, peer_device_id, server_config, server_name,
};

/// The `Result` of this crate.
pub type Result<T, E = TrustError> = std::result::Result<T, E>;
