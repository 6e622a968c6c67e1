//! What can go wrong while writing service files and running the manager:
//! [`ServiceError`], and the small helpers that make one.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot tell where your home directory is (HOME is not set)")]
    NoHome,
    #[error("cannot tell where this {program} binary is: {source}")]
    Binary { program: &'static str, source: std::io::Error },
    #[error("{path:?} cannot be written into the service file: {why}")]
    Unrepresentable { path: PathBuf, why: &'static str },
    #[error("`{command}` failed: {message}")]
    Command { command: String, message: String },
}

pub(crate) fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ServiceError + '_ {
    move |source| ServiceError::Io { path: path.into(), source }
}

/// `p` as text, or why it cannot be written into a service file.
pub(crate) fn utf8<'a>(p: &'a Path, why: &'static str) -> Result<&'a str, ServiceError> {
    p.to_str().ok_or_else(|| ServiceError::Unrepresentable { path: p.into(), why })
}
