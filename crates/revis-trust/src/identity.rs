//! `Identity`: this node's key and self-signed certificate, created once and kept in a private directory.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::{CertifiedKey, SigningKey};

use crate::fsutil::{read_if_exists, write_private_atomic};
use crate::{DeviceId, Result, TrustError, crypto};

/// The private key (PKCS#8, PEM), mode 0600.
pub const KEY_FILE: &str = "identity.key";
/// The self-signed certificate (PEM), mode 0600.
pub const CERT_FILE: &str = "identity.crt";

/// The name in the certificate. Peers never check it: trust is the pinned
/// device ID.
const SUBJECT: &str = "revis";

/// This node's key and certificate. The device ID is the certificate's
/// SHA-256, so it stays the same as long as the two files do.
pub struct Identity {
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
    id: DeviceId,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity").field("device_id", &self.id).finish_non_exhaustive()
    }
}

impl Identity {
    /// Loads the identity in `dir`, or creates it there on first run (the
    /// directory too, 0700). A corrupt file is an error naming it, never
    /// replaced. A key without its certificate (a first run stopped between
    /// the two writes) gets a new certificate.
    pub fn load_or_create(dir: &Path) -> Result<Self> {
        let key_path = dir.join(KEY_FILE);
        let cert_path = dir.join(CERT_FILE);
        let key_pem = read_if_exists(&key_path)?;
        let cert_pem = read_if_exists(&cert_path)?;
        match (key_pem, cert_pem) {
            (Some(key_pem), Some(cert_pem)) => {
                check_private(&key_path)?;
                Self::from_pem(&key_path, &key_pem, &cert_path, &cert_pem)
            }
            (None, None) => {
                let key = rcgen::KeyPair::generate()?;
                write_private_atomic(&key_path, key.serialize_pem().as_bytes())?;
                Self::issue(&key, &cert_path)
            }
            (Some(key_pem), None) => {
                check_private(&key_path)?;
                let text = std::str::from_utf8(&key_pem).map_err(|e| TrustError::corrupt(&key_path, e))?;
                let key = rcgen::KeyPair::from_pem(text).map_err(|e| TrustError::corrupt(&key_path, e))?;
                Self::issue(&key, &cert_path)
            }
            (None, Some(_)) => Err(TrustError::MissingKey { cert: cert_path, key: key_path }),
        }
    }

    /// A fresh identity that lives in memory only (tests, throwaway peers).
    pub fn generate() -> Result<Self> {
        let key = rcgen::KeyPair::generate()?;
        let cert = self_signed(&key)?;
        Ok(Self::from_parts(cert, &key))
    }

    /// This node's device ID.
    pub fn device_id(&self) -> DeviceId {
        self.id
    }

    /// The certificate (DER).
    pub fn certificate(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// The private key as a rustls signing key (the key itself stays here).
    pub fn signing_key(&self) -> Result<Arc<dyn SigningKey>> {
        Ok(crypto::provider().key_provider.load_private_key(self.key.clone_key())?)
    }

    /// Certificate and key together, for a rustls config.
    pub fn certified_key(&self) -> Result<Arc<CertifiedKey>> {
        let ck = CertifiedKey::new(vec![self.cert.clone()], self.signing_key()?);
        ck.keys_match()?;
        Ok(Arc::new(ck))
    }

    fn issue(key: &rcgen::KeyPair, cert_path: &Path) -> Result<Self> {
        let cert = self_signed(key)?;
        write_private_atomic(cert_path, cert.pem().as_bytes())?;
        Ok(Self::from_parts(cert, key))
    }

    fn from_parts(cert: rcgen::Certificate, key: &rcgen::KeyPair) -> Self {
        let cert = cert.der().clone();
        Self { id: DeviceId::of_certificate(&cert), key: PrivateKeyDer::Pkcs8(key.serialize_der().into()), cert }
    }

    fn from_pem(key_path: &Path, key_pem: &[u8], cert_path: &Path, cert_pem: &[u8]) -> Result<Self> {
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TrustError::corrupt(key_path, format!("no private key: {e}")))?;
        let cert = CertificateDer::from_pem_slice(cert_pem).map_err(|e| TrustError::corrupt(cert_path, format!("no certificate: {e}")))?;
        let signing = crypto::provider().key_provider.load_private_key(key.clone_key()).map_err(|e| TrustError::corrupt(key_path, e))?;
        CertifiedKey::new(vec![cert.clone()], signing)
            .keys_match()
            .map_err(|e| TrustError::corrupt(cert_path, format!("does not match {}: {e}", key_path.display())))?;
        Ok(Self { id: DeviceId::of_certificate(&cert), key, cert })
    }
}

fn self_signed(key: &rcgen::KeyPair) -> Result<rcgen::Certificate> {
    let mut params = rcgen::CertificateParams::new(vec![SUBJECT.to_owned()])?;
    params.distinguished_name.push(rcgen::DnType::CommonName, SUBJECT);
    Ok(params.self_signed(key)?)
}

/// The key must be readable by its owner only (ssh's rule).
fn check_private(path: &Path) -> Result<()> {
    let mode = std::fs::metadata(path).map_err(TrustError::io(path))?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TrustError::Permissions { path: PathBuf::from(path), mode });
    }
    Ok(())
}

/// This machine's host name without its domain, at most 64 characters (the
/// default name a node shows to others); `fallback` when there is none.
pub fn host_name(fallback: &str) -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for writes of its length; gethostname
    // writes at most that many bytes.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = if ok { String::from_utf8_lossy(&buf[..end]).into_owned() } else { String::new() };
    let short: String = name.split('.').next().unwrap_or("").trim().chars().filter(|c| !c.is_control()).take(64).collect();
    if short.is_empty() { fallback.to_owned() } else { short }
}
