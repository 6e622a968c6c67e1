//! HTTP plumbing: the client (system roots, short connect timeout), redirects that keep a token
//! on its own origin, JSON listings, and resumable, verified downloads.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use ureq::http::Response;
use ureq::tls::{RootCerts, TlsConfig};
use ureq::{Agent, Body, ResponseExt};

use crate::cancel::{self, Cancel};
use crate::error::{Error, Result};
use crate::hash::{self, BUF_SIZE};
use crate::index::resolve_url;
use crate::options::PullOptions;
use crate::progress::{Meter, Progress};

/// Index pages and API listings larger than this are refused (pypi.org's largest are a few MB).
const MAX_PAGE_BYTES: u64 = 32 * 1024 * 1024;
/// Redirects followed at most by [`get`].
const MAX_REDIRECTS: usize = 10;

/// A credential for one origin: sent only to URLs of that origin (scheme, host and port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Auth {
    /// `scheme://host[:port]`, lowercase, as [`origin`] gives it.
    pub origin: String,
    /// The whole `Authorization` header value (`Bearer ...`).
    pub header: String,
}

impl Auth {
    /// A bearer token for `endpoint`'s origin; None if the endpoint is not a URL.
    pub(crate) fn bearer(endpoint: &str, token: &str) -> Option<Auth> {
        Some(Auth { origin: origin(endpoint)?, header: format!("Bearer {}", token.trim()) })
    }

    fn applies_to(&self, url: &str) -> bool {
        origin(url).as_deref() == Some(self.origin.as_str())
    }
}

/// `scheme://host[:port]` of a URL, lowercase, the port left out when it is the scheme's default.
pub(crate) fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit('@').next()?.to_ascii_lowercase();
    let scheme = scheme.to_ascii_lowercase();
    let default = match scheme.as_str() {
        "https" => ":443",
        "http" => ":80",
        _ => "",
    };
    let host_port = host_port.strip_suffix(default).unwrap_or(&host_port);
    (!host_port.is_empty()).then(|| format!("{scheme}://{host_port}"))
}

/// Percent-encodes a path (or one segment) for a URL, keeping `/` and the unreserved characters.
pub(crate) fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// GETs `url` with `headers`, following redirects itself so that `auth` goes
/// only to its own origin (a redirect to a CDN gets no token). Returns the URL
/// that answered and its response, whatever the status.
pub(crate) fn get(agent: &Agent, url: &str, headers: &[(&str, String)], auth: Option<&Auth>) -> Result<(String, Response<Body>)> {
    let mut url = url.to_owned();
    for _ in 0..=MAX_REDIRECTS {
        let mut request = agent.get(url.as_str()).config().max_redirects(0).build();
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        if let Some(auth) = auth.filter(|a| a.applies_to(&url)) {
            request = request.header("Authorization", &auth.header);
        }
        let resp = request.call().map_err(|e| Error::transport(&url, e))?;
        let location = resp.headers().get("location").and_then(|v| v.to_str().ok());
        match (resp.status().as_u16(), location) {
            (301 | 302 | 303 | 307 | 308, Some(location)) => url = resolve_url(&url, location),
            _ => return Ok((url, resp)),
        }
    }
    Err(Error::transport(&url, format!("more than {MAX_REDIRECTS} redirects")))
}

/// GETs a JSON document (at most 32 MiB) and the `rel="next"` link of its `Link` header, if any.
/// 401 and 403 are [`Error::Denied`], saying whether a token was sent.
pub(crate) fn get_json<T: DeserializeOwned>(agent: &Agent, url: &str, auth: Option<&Auth>) -> Result<(T, Option<String>)> {
    let (served_from, mut resp) = get(agent, url, &[("Accept", "application/json".to_owned())], auth)?;
    let status = resp.status().as_u16();
    match status {
        200 => {}
        401 | 403 => return Err(Error::Denied { url: url.to_owned(), status, token_sent: auth.is_some_and(|a| a.applies_to(url)) }),
        _ => return Err(Error::HttpStatus { url: url.to_owned(), status }),
    }
    let next = resp.headers().get("link").and_then(|v| v.to_str().ok()).and_then(next_link).map(|l| resolve_url(&served_from, &l));
    let body = resp.body_mut().with_config().limit(MAX_PAGE_BYTES).read_to_string().map_err(|e| Error::transport(url, e))?;
    let value = serde_json::from_str(&body).map_err(|e| Error::transport(url, format!("the answer is not the JSON expected: {e}")))?;
    Ok((value, next))
}

/// The target of the `rel="next"` entry of a `Link` header (RFC 8288).
fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        let is_next = params.split(';').any(|p| {
            let p = p.trim().to_ascii_lowercase();
            p == "rel=\"next\"" || p == "rel=next"
        });
        is_next.then(|| target.trim().trim_start_matches('<').trim_end_matches('>').to_owned())
    })
}

/// The HTTP client for one pull.
///
/// Certificates are checked against the platform's roots (so a proxy CA in the
/// system store is trusted), connect and DNS are bounded by the short
/// `connect_timeout` so an unreachable host falls through to the next source
/// quickly, and each read is bounded by `read_timeout` so a stalled transfer
/// fails rather than hangs. HTTP error statuses are returned, not raised, so
/// the caller can name the URL.
pub(crate) fn agent(connect_timeout: Duration, read_timeout: Duration) -> Agent {
    let tls = TlsConfig::builder().root_certs(RootCerts::PlatformVerifier).build();
    Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .user_agent(concat!("revis/", env!("CARGO_PKG_VERSION")))
        .timeout_resolve(Some(connect_timeout))
        .timeout_connect(Some(connect_timeout))
        .timeout_recv_response(Some(read_timeout))
        .timeout_per_read(Some(read_timeout))
        .build()
        .new_agent()
}

/// GETs a text page; returns the URL it was finally served from (after redirects) and the body.
pub(crate) fn get_text(agent: &Agent, url: &str) -> Result<(String, String)> {
    let mut resp = agent.get(url).header("Accept", "text/html").call().map_err(|e| Error::transport(url, e))?;
    let status = resp.status().as_u16();
    if !resp.status().is_success() {
        return Err(Error::HttpStatus { url: url.to_owned(), status });
    }
    let final_url = resp.get_uri().to_string();
    let body =
        resp.body_mut().with_config().limit(MAX_PAGE_BYTES).lossy_utf8(true).read_to_string().map_err(|e| Error::transport(url, e))?;
    Ok((final_url, body))
}

/// `path` with `suffix` appended to its file name.
pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s: OsString = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// One file to download.
pub(crate) struct Artifact<'a> {
    pub url: &'a str,
    /// Where the verified file ends up; bytes arrive in `{dest}.partial` first.
    pub dest: &'a Path,
    pub sha256: Option<&'a str>,
    /// The exact size, and so the limit: the transfer stops as soon as it would pass it.
    pub size: u64,
    /// Shown on the progress bar.
    pub label: &'a str,
    /// Sent to its own origin only (see [`get`]).
    pub auth: Option<&'a Auth>,
}

/// Why one attempt stopped.
enum Stop {
    /// The transfer broke off; `{dest}.partial` keeps what arrived and another attempt may resume.
    Interrupted(Error),
    /// Trying again would not help, or must not happen ([`Error::Cancelled`]).
    Failed(Error),
}

/// Downloads `art` to `art.dest`, resuming a `{dest}.partial` left by an earlier try.
///
/// A transfer that breaks off is resumed with a `Range` request up to
/// `retries` times; a server that ignores `Range` (answers 200) is read from
/// the start. No more than `art.size` bytes are ever written: a response that
/// announces more is refused before its body is read, and one that sends more
/// is stopped at the limit ([`Error::TooLarge`]; the partial file is deleted).
/// The result is checked against the expected size and hash; on a mismatch the
/// partial file is deleted. Only a verified file is renamed into place.
/// A hash mismatch of a file resumed from a partial file left by an earlier
/// pull is tried once more from the start: the file may have changed
/// upstream since those bytes were fetched.
///
/// `cancel` is looked at before each attempt, once the response has come,
/// between reads of the body and while waiting to resume: once cancelled, the
/// download stops with [`Error::Cancelled`], keeping the partial file as it is,
/// and is not tried again.
///
/// A file over `opts.max_bytes` is refused before any request
/// ([`Error::OverPullLimit`]); one whose remaining bytes (and
/// `opts.keep_free`) do not fit on the disk is refused before the body is
/// read, and one that stops fitting while it downloads (the disk filled by
/// something else) is stopped within [`SPACE_CHECK_EVERY`] bytes
/// ([`Error::NoSpace`]; the partial file is deleted).
pub(crate) fn download(agent: &Agent, art: &Artifact<'_>, opts: &PullOptions) -> Result<()> {
    let (progress, retries, cancel) = (&opts.progress, opts.retries, opts.cancel.as_ref());
    if let Some(limit) = opts.max_bytes
        && art.size > limit
    {
        return Err(Error::OverPullLimit { what: art.url.to_owned(), size: art.size, limit, by_http: opts.by_http });
    }
    let space = Space { keep: opts.keep_free };
    let mut attempt = 0;
    let mut from_scratch = false;
    loop {
        cancel::check(cancel)?;
        let had_partial = fs::metadata(with_suffix(art.dest, ".partial")).is_ok_and(|m| m.len() > 0);
        match download_once(agent, art, progress, cancel, space) {
            Ok(()) => return Ok(()),
            Err(Stop::Failed(e @ Error::HashMismatch { .. })) if had_partial && !from_scratch => {
                // `finish` deleted the partial file: the next try starts at byte 0.
                tracing::warn!(url = art.url, error = %e, "a resumed download does not match its hash; downloading it again from the start");
                from_scratch = true;
            }
            Err(Stop::Failed(e)) => return Err(e),
            Err(Stop::Interrupted(e)) if attempt < retries => {
                attempt += 1;
                tracing::warn!(url = art.url, attempt, error = %e, "download interrupted; resuming");
                cancel::sleep(cancel, Duration::from_millis(250 << attempt.min(4)))?;
            }
            Err(Stop::Interrupted(e)) => return Err(e),
        }
    }
}

/// How often a download looks at the disk's free space again.
pub(crate) const SPACE_CHECK_EVERY: u64 = 64 << 20;

/// What a download must leave free on its disk.
#[derive(Clone, Copy)]
struct Space {
    keep: u64,
}

impl Space {
    /// Whether `needed` more bytes (and `keep`) fit beside `dest`; an
    /// unknown free space passes (the write itself then fails, named).
    fn check(self, art: &Artifact<'_>, needed: u64) -> Result<()> {
        let dir = art.dest.parent().unwrap_or(Path::new("."));
        let Some(free) = free_bytes(dir) else { return Ok(()) };
        if free >= needed.saturating_add(self.keep) {
            return Ok(());
        }
        Err(Error::NoSpace { dir: dir.display().to_string(), what: art.url.to_owned(), free, needed, keep: self.keep })
    }
}

/// The bytes an unprivileged process may still write on `dir`'s file system.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs only writes into `st`, which outlives the call; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)]
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

fn download_once(agent: &Agent, art: &Artifact<'_>, progress: &Progress, cancel: Option<&Cancel>, space: Space) -> Result<(), Stop> {
    let partial = with_suffix(art.dest, ".partial");
    let io_fail = |action, e| Stop::Failed(Error::io(action, &partial, e));
    let mut offset = match fs::metadata(&partial) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(io_fail("read", e)),
    };
    if offset > art.size {
        File::create(&partial).map_err(|e| io_fail("truncate", e))?;
        offset = 0;
    }
    if offset > 0 && offset == art.size {
        tracing::debug!(path = %partial.display(), "partial download already complete");
        return finish(art, &partial, None).map_err(Stop::Failed);
    }

    let range = if offset > 0 { vec![("Range", format!("bytes={offset}-"))] } else { Vec::new() };
    let (_, mut resp) = get(agent, art.url, &range, art.auth).map_err(Stop::Failed)?;
    // Before anything is truncated: a cancel while the answer was awaited leaves the partial file as it was.
    cancel::check(cancel).map_err(Stop::Failed)?;
    let status = resp.status().as_u16();
    let resumed = match status {
        206 if offset > 0 => {
            let header = resp.headers().get("content-range").and_then(|v| v.to_str().ok());
            if content_range_start(header) != Some(offset) {
                File::create(&partial).map_err(|e| io_fail("truncate", e))?;
                return Err(Stop::Interrupted(Error::transport(
                    art.url,
                    format!("asked for bytes {offset}- but got Content-Range {header:?}; starting over"),
                )));
            }
            true
        }
        200 => {
            if offset > 0 {
                tracing::info!(url = art.url, "server ignored the Range request; downloading from the start");
            }
            false
        }
        416 if offset > 0 => {
            // Nothing left to send: the partial file may already be whole.
            drop(resp);
            return finish(art, &partial, None).map_err(Stop::Interrupted);
        }
        401 | 403 => {
            let token_sent = art.auth.is_some_and(|a| a.applies_to(art.url));
            return Err(Stop::Failed(Error::Denied { url: art.url.to_owned(), status, token_sent }));
        }
        _ => {
            return Err(Stop::Failed(Error::HttpStatus { url: art.url.to_owned(), status }));
        }
    };

    let mut hasher = Sha256::new();
    let start = if resumed {
        hash::hash_prefix(&partial, Some(offset), &mut hasher).map_err(|e| io_fail("read", e))?;
        tracing::info!(url = art.url, offset, "resuming download");
        offset
    } else {
        0
    };
    // What is left must fit before the body is read (a resumed file's bytes are already on the disk).
    if let Err(e) = space.check(art, art.size - start) {
        drop(resp);
        return Err(Stop::Failed(e));
    }
    let file = if resumed { OpenOptions::new().append(true).open(&partial) } else { File::create(&partial) };
    let mut file = file.map_err(|e| io_fail("write", e))?;

    let body_len = resp.body().content_length();
    if let Some(announced) = body_len.map(|n| n.saturating_add(start))
        && announced > art.size
    {
        // Refused before a byte of the body is read.
        drop(resp);
        let _ = fs::remove_file(&partial);
        return Err(Stop::Failed(too_large(art, "the server announced", announced)));
    }
    let total = body_len.map(|n| n + start).unwrap_or(art.size);
    let meter = Meter::new(progress, art.label, Some(total), start);
    let mut reader = resp.body_mut().as_reader();
    let mut buf = vec![0u8; BUF_SIZE];
    let mut have = start;
    loop {
        if let Err(cancelled) = cancel::check(cancel) {
            // Every byte read so far is written: the next pull resumes after it.
            meter.abandon();
            file.flush().map_err(|e| io_fail("write", e))?;
            tracing::info!(url = art.url, have, total, "download cancelled; the partial file is kept");
            return Err(Stop::Failed(cancelled));
        }
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                meter.abandon();
                file.flush().map_err(|e| io_fail("write", e))?;
                return Err(Stop::Interrupted(Error::transport(art.url, format!("transfer broke off after {have} of {total} bytes: {e}"))));
            }
        };
        if have + n as u64 > art.size {
            // Checked before writing: the file never holds more than the limit.
            meter.abandon();
            drop(file);
            let _ = fs::remove_file(&partial);
            return Err(Stop::Failed(too_large(art, "at least", have + n as u64)));
        }
        file.write_all(&buf[..n]).map_err(|e| io_fail("write", e))?;
        hasher.update(&buf[..n]);
        have += n as u64;
        meter.inc(n as u64);
        if have / SPACE_CHECK_EVERY != (have - n as u64) / SPACE_CHECK_EVERY
            && let Err(e) = space.check(art, art.size - have)
        {
            // Something else is filling the disk: stop before it is full, and give back what this took.
            meter.abandon();
            drop(file);
            let _ = fs::remove_file(&partial);
            return Err(Stop::Failed(e));
        }
    }
    if have < total && body_len.is_some() {
        meter.abandon();
        return Err(Stop::Interrupted(Error::transport(art.url, format!("connection closed after {have} of {total} bytes"))));
    }
    file.sync_all().map_err(|e| io_fail("write", e))?;
    drop(file);
    meter.finish();
    finish(art, &partial, Some(hex::encode(hasher.finalize()))).map_err(Stop::Failed)
}

fn too_large(art: &Artifact<'_>, seen: &'static str, actual: u64) -> Error {
    Error::TooLarge { what: art.url.to_owned(), limit: art.size, seen, actual }
}

/// Checks a complete `partial` (size, then hash) and renames it to `art.dest`; deletes it on a mismatch.
fn finish(art: &Artifact<'_>, partial: &Path, digest: Option<String>) -> Result<()> {
    let size = fs::metadata(partial).map_err(|e| Error::io("read", partial, e))?.len();
    if size != art.size {
        let _ = fs::remove_file(partial);
        return Err(Error::SizeMismatch { what: art.url.to_owned(), expected: art.size, actual: size });
    }
    if let Some(expected) = art.sha256 {
        let actual = match digest {
            Some(d) => d,
            None => hash::sha256_file(partial).map_err(|e| Error::io("read", partial, e))?,
        };
        if !hash::same_digest(&actual, expected) {
            let _ = fs::remove_file(partial);
            return Err(Error::HashMismatch { what: art.url.to_owned(), expected: expected.to_ascii_lowercase(), actual });
        }
    }
    fs::rename(partial, art.dest).map_err(|e| Error::io("rename into place", art.dest, e))
}

/// The first byte position of a `Content-Range: bytes FIRST-LAST/TOTAL` header.
fn content_range_start(header: Option<&str>) -> Option<u64> {
    let spec = header?.trim().strip_prefix("bytes")?.trim_start();
    spec.split('-').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_download_that_does_not_fit_the_disk_is_refused_naming_both_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("m.gguf");
        let art = Artifact { url: "http://hub/m.gguf", dest: &dest, sha256: None, size: 10, label: "m", auth: None };
        let free = free_bytes(dir.path()).expect("statvfs answers for a temp dir");
        assert!(Space { keep: 0 }.check(&art, 10).is_ok());
        let e = Space { keep: 1 << 20 }.check(&art, free).unwrap_err().to_string();
        assert!(e.contains("needs") && e.contains(&format!("{} kept free", 1 << 20)) && e.contains("http://hub/m.gguf"), "{e}");
        assert!(matches!(Space { keep: 0 }.check(&art, u64::MAX), Err(Error::NoSpace { .. })));
    }

    #[test]
    fn content_range_start_parses_the_first_byte() {
        assert_eq!(content_range_start(Some("bytes 100-199/200")), Some(100));
        assert_eq!(content_range_start(Some(" bytes  7-9/*")), Some(7));
        assert_eq!(content_range_start(Some("bytes */200")), None);
        assert_eq!(content_range_start(Some("items 1-2/3")), None);
        assert_eq!(content_range_start(None), None);
    }

    #[test]
    fn origins_compare_scheme_host_and_port() {
        assert_eq!(origin("https://huggingface.co/api/models/x").as_deref(), Some("https://huggingface.co"));
        assert_eq!(origin("HTTPS://HuggingFace.co:443/x").as_deref(), Some("https://huggingface.co"));
        assert_eq!(origin("http://127.0.0.1:8080?q").as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!(origin("http://user@h:80/").as_deref(), Some("http://h"));
        assert_eq!(origin("not a url"), None);
        let auth = Auth::bearer("http://127.0.0.1:8080/", "hf_x").unwrap();
        assert_eq!(auth.header, "Bearer hf_x");
        assert!(auth.applies_to("http://127.0.0.1:8080/owner/repo/resolve/main/m.gguf"));
        for other in
            ["http://127.0.0.1:8081/m.gguf", "https://127.0.0.1:8080/m.gguf", "http://localhost:8080/m.gguf", "http://127.0.0.1.evil:8080/"]
        {
            assert!(!auth.applies_to(other), "{other}");
        }
    }

    #[test]
    fn link_headers_and_paths() {
        assert_eq!(
            next_link(r#"<https://huggingface.co/api/models/o/r/tree/main?cursor=abc>; rel="next""#).as_deref(),
            Some("https://huggingface.co/api/models/o/r/tree/main?cursor=abc")
        );
        assert_eq!(next_link(r#"<a>; rel="prev", <b>; rel=next"#).as_deref(), Some("b"));
        assert_eq!(next_link(r#"<a>; rel="prev""#), None);
        assert_eq!(encode_path("sub dir/Q4_K_M+x.gguf"), "sub%20dir/Q4_K_M%2Bx.gguf");
    }

    #[test]
    fn suffixes_append_to_the_file_name() {
        assert_eq!(with_suffix(Path::new("/m/a.gguf"), ".partial"), PathBuf::from("/m/a.gguf.partial"));
    }
}
