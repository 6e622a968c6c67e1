//! How a pull goes about it: [`PullOptions`], and its defaults as the
//! environment sets them (`PIP_INDEX_URL`, `HF_ENDPOINT`, `HF_TOKEN`).

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use crate::cancel::Cancel;
use crate::index;
use crate::progress::Progress;

/// The Hugging Face endpoint used when `HF_ENDPOINT` is not set.
pub const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";

/// How [`pull`](fn@crate::pull) goes about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullOptions {
    /// PEP 503 simple index base URL, e.g. `https://pypi.org/simple` (a trailing slash is fine).
    pub index_url: String,
    /// Hugging Face endpoint, e.g. `https://huggingface.co`.
    pub hf_endpoint: String,
    /// Progress bar or quiet.
    pub progress: Progress,
    /// Limit on DNS and on TCP/TLS connect; keep it short so an unreachable source is skipped quickly.
    pub connect_timeout: Duration,
    /// Limit on waiting for a response, and on each read of a body.
    pub read_timeout: Duration,
    /// Re-hash a model file that is already present (with the right size) and fetch it again if it is wrong.
    pub verify: bool,
    /// How many times a download that broke off is resumed within one pull.
    pub retries: u32,
    /// A Hugging Face token, sent (as `Authorization: Bearer`) to `hf_endpoint`'s origin only.
    pub hf_token: Option<String>,
    /// Stops the pull when cancelled (see [`Cancel`]): [`Error::Cancelled`](crate::Error::Cancelled),
    /// what arrived kept for the next pull to resume from.
    pub cancel: Option<Cancel>,
    /// The largest file this pull may fetch ([`Error::OverPullLimit`](crate::Error::OverPullLimit),
    /// before any byte); None: no limit but the disk's.
    pub max_bytes: Option<u64>,
    /// Bytes the download must leave free on the models' disk
    /// ([`Error::NoSpace`](crate::Error::NoSpace)); a file that does not fit is refused either way.
    pub keep_free: u64,
    /// The limits are `revis serve`'s (its errors name its options).
    pub by_http: bool,
}

impl Default for PullOptions {
    /// Index from `PIP_INDEX_URL` (else pypi.org), endpoint from `HF_ENDPOINT`
    /// (else huggingface.co), token from `HF_TOKEN` (else the file
    /// `huggingface-cli login` writes: `$HF_TOKEN_PATH`, else `$HF_HOME/token`,
    /// else `~/.cache/huggingface/token`), a progress bar, 8 s to connect, 60 s
    /// per read, no re-hash of present files, 3 resumes, no cancel handle.
    fn default() -> Self {
        PullOptions {
            index_url: index::index_url_from(std::env::var("PIP_INDEX_URL").ok().as_deref()),
            hf_endpoint: hf_endpoint_from(std::env::var("HF_ENDPOINT").ok().as_deref()),
            progress: Progress::Bar,
            connect_timeout: Duration::from_secs(8),
            read_timeout: Duration::from_secs(60),
            verify: false,
            retries: 3,
            hf_token: hf_token_from_env(),
            cancel: None,
            max_bytes: None,
            keep_free: 0,
            by_http: false,
        }
    }
}

/// `HF_TOKEN`, else the token file Hugging Face's own tools read, as they do.
fn hf_token_from_env() -> Option<String> {
    let non_empty = |s: String| Some(s.trim().to_owned()).filter(|t| !t.is_empty());
    if let Some(t) = std::env::var("HF_TOKEN").ok().and_then(non_empty) {
        return Some(t);
    }
    let file = match (std::env::var_os("HF_TOKEN_PATH"), std::env::var_os("HF_HOME")) {
        (Some(p), _) => PathBuf::from(p),
        (None, Some(home)) => PathBuf::from(home).join("token"),
        (None, None) => directories::BaseDirs::new()?.home_dir().join(".cache/huggingface/token"),
    };
    fs::read_to_string(file).ok().and_then(non_empty)
}

fn hf_endpoint_from(env_value: Option<&str>) -> String {
    match env_value.map(str::trim) {
        Some(v) if !v.is_empty() => v.trim_end_matches('/').to_owned(),
        _ => DEFAULT_HF_ENDPOINT.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_endpoint_comes_from_hf_endpoint() {
        assert_eq!(hf_endpoint_from(None), "https://huggingface.co");
        assert_eq!(hf_endpoint_from(Some("")), "https://huggingface.co");
        assert_eq!(hf_endpoint_from(Some("https://hf-mirror.test/")), "https://hf-mirror.test");
    }
}
