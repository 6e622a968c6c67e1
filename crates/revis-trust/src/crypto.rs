//! The crypto provider: the one place that chooses ring for every TLS config,
//! key load and signature check in this crate.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

/// The ring crypto provider every config here uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
