//! `TrustError`: everything that can go wrong with identities, the trust store, TLS configs, pairing and discovery.

use std::io;
use std::path::PathBuf;

/// The one error type of `revis-trust`.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Reading or writing a file (or the directory) failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A file exists but its content cannot be used.
    #[error("{} is corrupt: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    /// The private key is readable by other users.
    #[error("{} has mode {mode:03o}; it must be readable by its owner only (chmod 600)", path.display())]
    Permissions { path: PathBuf, mode: u32 },
    /// The certificate exists without its key: the identity cannot be used,
    /// and replacing it silently would change this node's device ID.
    #[error("{} exists but {} does not; restore the key or remove both files to create a new identity", cert.display(), key.display())]
    MissingKey { cert: PathBuf, key: PathBuf },
    /// Text that is not a device ID.
    #[error("not a device ID: {0}")]
    InvalidDeviceId(&'static str),
    /// A device name that cannot be stored.
    #[error("invalid device name: {0}")]
    InvalidName(&'static str),
    /// Creating the key or the certificate failed.
    #[error("creating the identity: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the key, the certificate or the configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// Pairing: the two sides did not prove the same code on this very
    /// connection. Either the code was mistyped, or someone is relaying the
    /// connection (a man in the middle); the two cannot be told apart, and
    /// either way nothing was paired.
    #[error("pairing failed: the code does not match (mistyped, or the connection is being intercepted); nothing was paired")]
    WrongCode,
    /// Pairing: the window is not open (never opened, expired, or already
    /// used by a successful pairing). Open a new one for a new code.
    #[error("pairing failed: the pairing window is closed (expired or already used); open a new one for a new code")]
    WindowClosed,
    /// Pairing: too many wrong codes, in all or from this address; the
    /// window takes no more tries from here.
    #[error("pairing failed: too many wrong codes; this pairing window takes no more tries from here, open a new one for a new code")]
    TooManyAttempts,
    /// Pairing: the peer broke the pairing protocol (malformed, oversized or
    /// unexpected message).
    #[error("pairing failed: protocol error: {0}")]
    Protocol(String),
    /// Pairing: the connection failed.
    #[error("pairing failed: connection: {0}")]
    Connection(#[source] io::Error),
    /// mDNS discovery: a named interface does not exist, an advertisement
    /// cannot be sent as given, or the mDNS daemon failed.
    #[error("mDNS discovery: {0}")]
    Discovery(String),
}

impl TrustError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, reason: impl ToString) -> Self {
        Self::Corrupt { path: path.into(), reason: reason.to_string() }
    }
}
