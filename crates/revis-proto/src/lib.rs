//! Generated code for the revis.v1 gRPC API (`proto/revis/v1/revis.proto`).
//!
//! `bytes` fields are `bytes::Bytes`, so large texts are not copied twice.
#![allow(clippy::all, missing_docs)]

pub mod codec;
mod priority;
mod tier;

pub use priority::Priority;
pub use tier::{Tier, UnknownTier};

pub mod v1 {
    tonic::include_proto!("revis.v1");

    /// The encoded `FileDescriptorSet`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("revis_v1_descriptor");
}

/// Where revisd listens by default, and so where clients look:
/// `$REVIS_SOCKET`, else `~/Library/Application Support/revis/revisd.sock`
/// on macOS, else `$XDG_RUNTIME_DIR/revis/revisd.sock`, else
/// `/tmp/revis-$UID/revisd.sock`. Part of the contract between the two sides.
pub fn default_socket_path() -> std::path::PathBuf {
    use std::path::PathBuf;
    if let Some(p) = std::env::var_os("REVIS_SOCKET").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    #[cfg(target_os = "macos")]
    if let Some(home) = std::env::var_os("HOME") {
        return PathBuf::from(home).join("Library/Application Support/revis/revisd.sock");
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("revis/revisd.sock");
    }
    // SAFETY: getuid cannot fail.
    PathBuf::from(format!("/tmp/revis-{}/revisd.sock", unsafe { libc::getuid() }))
}
