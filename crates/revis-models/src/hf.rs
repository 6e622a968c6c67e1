//! Any GGUF on Hugging Face: references (`hf:OWNER/REPO:QUANT`), the part of the Hub's API that
//! lists a repository's files with their sizes and SHA-256, and where such files are kept.
//!
//! # References
//!
//! ```text
//! hf:OWNER/REPO[@REVISION]              the Q4_K_M file (or the repository's only GGUF)
//! hf:OWNER/REPO[@REVISION]:QUANT        the file whose name carries QUANT (Q4_K_M, Q8_0, IQ4_XS, ...)
//! hf:OWNER/REPO[@REVISION]/PATH.gguf    that file
//! ```
//!
//! `hf.co/` or `huggingface.co/` may stand for `hf:` (as Ollama writes them),
//! and a file's page or download URL (`https://huggingface.co/OWNER/REPO/blob/main/F.gguf`,
//! `.../resolve/main/F.gguf`) is read as `hf:OWNER/REPO@main/F.gguf`. The
//! revision is `main` unless given. A quantization matches a file whose name,
//! cut at `-` and `.`, has it as one piece, ignoring case (so `Q4_K_M` finds
//! `qwen2.5-3b-instruct-q4_k_m.gguf` and `Llama-3.2-3B-Instruct-Q4_K_M.gguf`);
//! vision projectors (`mmproj*`) never match, and a model split into several
//! files is refused.
//!
//! # The API
//!
//! `GET {endpoint}/api/models/{repo}/tree/{revision}?recursive=true` lists the
//! files (`type`, `path`, `size`, and for files stored with Git LFS,
//! `lfs.oid`: the SHA-256, and `lfs.size`), in pages linked by a
//! `Link: <...>; rel="next"` header, as `huggingface_hub`'s `list_repo_tree`
//! reads them. The file is then downloaded from
//! `{endpoint}/{repo}/resolve/{revision}/{path}` (which redirects to a CDN) and
//! checked against that SHA-256. A file Hugging Face publishes no SHA-256 for
//! is refused. `HF_TOKEN` (else the token file `huggingface-cli login` wrote)
//! is sent as `Authorization: Bearer`, to the endpoint's origin only: never to
//! a redirect target elsewhere.
//!
//! # Storage
//!
//! A referenced file is kept at `{models_dir}/hf/{OWNER}/{REPO}/{PATH}`
//! (`{REPO}@{REVISION}` for a revision other than `main`); the same
//! reference finds it there again without the network ([`HfRef::local_file`]).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use ureq::Agent;

use crate::choose::human_bytes;
use crate::error::{Error, Result};
use crate::hash::normalize_sha256;
use crate::http::{self, Auth};

/// The quantization a reference without one means (as llama.cpp's `-hf` and Ollama choose).
pub const DEFAULT_QUANT: &str = "Q4_K_M";
/// The file, in a repository's directory, that says which file a reference
/// naming no quantization was pulled as (the repository's only GGUF, when
/// it has no Q4_K_M one).
pub(crate) const DEFAULT_FILE_RECORD: &str = ".default-file";
/// Pages of a repository listing read at most (1,000 files each).
const MAX_PAGES: usize = 20;

/// A GGUF file on Hugging Face, as a person names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfRef {
    /// `OWNER/REPO`.
    pub repo: String,
    /// A branch, tag or commit; `main` unless given.
    pub revision: String,
    /// Which file of the repository.
    pub target: Target,
}

/// How a reference picks its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The file whose name carries this quantization; None = [`DEFAULT_QUANT`], or the only GGUF.
    Quant(Option<String>),
    /// This path in the repository.
    File(String),
}

impl fmt::Display for HfRef {
    /// The canonical form: `hf:OWNER/REPO[@REV]:QUANT` or `hf:OWNER/REPO[@REV]/PATH`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hf:{}", self.repo)?;
        if self.revision != "main" {
            write!(f, "@{}", self.revision)?;
        }
        match &self.target {
            Target::Quant(None) => Ok(()),
            Target::Quant(Some(q)) => write!(f, ":{q}"),
            Target::File(path) => write!(f, "/{path}"),
        }
    }
}

fn bad(reference: &str, message: impl Into<String>) -> Error {
    Error::BadReference { reference: reference.to_owned(), message: message.into() }
}

/// An owner, repository or revision name: letters, digits, `-`, `_`, `.`, not starting with `.`.
fn is_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 96 && !s.starts_with('.') && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A relative path inside a repository that is safe to join to a directory.
pub(crate) fn is_safe_path(path: &str) -> bool {
    !path.is_empty() && !path.starts_with('/') && !path.contains('\\') && path.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

impl HfRef {
    /// Reads a reference; Ok(None) when `s` is not one (a catalog name or a path).
    pub fn parse(s: &str) -> Result<Option<HfRef>> {
        let s = s.trim();
        let url_prefixes = ["https://huggingface.co/", "https://hf.co/", "http://huggingface.co/", "http://hf.co/"];
        let (rest, is_url) = if let Some(r) = s.strip_prefix("hf:") {
            (r, false)
        } else if let Some(r) = url_prefixes.iter().find_map(|p| s.strip_prefix(p)) {
            (r, true)
        } else if let Some(r) = s.strip_prefix("hf.co/").or_else(|| s.strip_prefix("huggingface.co/")) {
            (r, false)
        } else {
            return Ok(None);
        };
        let rest = rest.split(['?', '#']).next().unwrap_or_default();
        let (owner, rest) = rest.split_once('/').ok_or_else(|| bad(s, "it names no repository; write OWNER/REPO"))?;
        // REPO[@REV], then :QUANT or /PATH.
        let repo_end = rest.find([':', '/']).unwrap_or(rest.len());
        let (repo_rev, tail) = rest.split_at(repo_end);
        let (name, revision) = match repo_rev.split_once('@') {
            Some((n, r)) => (n, Some(r)),
            None => (repo_rev, None),
        };
        if !is_name(owner) || !is_name(name) {
            return Err(bad(s, format!("{owner:?}/{name:?} is not a repository name (letters, digits, '-', '_' and '.')")));
        }
        if let Some(r) = revision.filter(|r| !is_name(r)) {
            return Err(bad(s, format!("{r:?} is not a revision (a branch, tag or commit)")));
        }
        let mut revision = revision.unwrap_or("main").to_owned();
        let target = if let Some(q) = tail.strip_prefix(':') {
            if q.is_empty() || !q.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(bad(s, format!("{q:?} is not a quantization such as Q4_K_M")));
            }
            Target::Quant(Some(q.to_owned()))
        } else if let Some(path) = tail.strip_prefix('/').filter(|p| !p.is_empty()) {
            let path = match (is_url, path.split_once('/')) {
                (true, Some(("resolve" | "blob", after))) => {
                    let (rev, file) = after.split_once('/').ok_or_else(|| bad(s, "the URL names no file after its revision"))?;
                    if !is_name(rev) {
                        return Err(bad(s, format!("{rev:?} is not a revision")));
                    }
                    revision = rev.to_owned();
                    file
                }
                _ => path,
            };
            if !is_safe_path(path) || !path.to_ascii_lowercase().ends_with(".gguf") {
                return Err(bad(s, format!("{path:?} is not the path of a .gguf file in the repository")));
            }
            Target::File(path.to_owned())
        } else {
            Target::Quant(None)
        };
        Ok(Some(HfRef { repo: format!("{owner}/{name}"), revision, target }))
    }

    /// Where its files are kept under `models_dir`: `hf/OWNER/REPO`, or
    /// `hf/OWNER/REPO@REVISION` for a revision other than `main`, so a
    /// reference pinned to a revision never finds another's file.
    pub fn dir_in(&self, models_dir: &Path) -> PathBuf {
        let mut dir = models_dir.join("hf");
        dir.push(if self.revision == "main" { self.repo.clone() } else { format!("{}@{}", self.repo, self.revision) });
        dir
    }

    /// The downloaded file this reference means, if it is in `models_dir` (no network).
    pub fn local_file(&self, models_dir: &Path) -> Option<PathBuf> {
        let dir = self.dir_in(models_dir);
        match &self.target {
            Target::File(path) => Some(dir.join(path)).filter(|p| p.is_file()),
            Target::Quant(quant) => {
                if quant.is_none()
                    && let Some(path) = std::fs::read_to_string(dir.join(DEFAULT_FILE_RECORD)).ok().map(|p| p.trim().to_owned())
                    && is_safe_path(&path)
                    && dir.join(&path).is_file()
                {
                    return Some(dir.join(path));
                }
                let mut files = Vec::new();
                walk(&dir, &dir, &mut files);
                let local: Vec<RepoFile> = files.into_iter().map(|(path, size)| RepoFile { path, size, sha256: None }).collect();
                // The quantization named, else the default one: never "the only
                // file here", which may be another quantization pulled by name.
                select(self, Some(quant.as_deref().unwrap_or(DEFAULT_QUANT)), &local).ok().map(|f| dir.join(&f.path))
            }
        }
    }
}

/// Every `.gguf` file under `dir`, as (path relative to `root`, size).
fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, u64)>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            walk(root, &path, out);
        } else if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
            && let Some(rel) = path.strip_prefix(root).ok().and_then(|r| r.to_str())
        {
            out.push((rel.replace(std::path::MAIN_SEPARATOR, "/"), meta.len()));
        }
    }
}

/// One file of a repository, as the API lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    /// Its path in the repository.
    pub path: String,
    /// Its size in bytes (the LFS object's, for an LFS file).
    pub size: u64,
    /// The SHA-256 Hugging Face publishes (LFS files only).
    pub sha256: Option<String>,
}

impl RepoFile {
    fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    fn is_gguf(&self) -> bool {
        let name = self.name().to_ascii_lowercase();
        name.ends_with(".gguf") && !name.starts_with("mmproj")
    }

    /// The pieces of its name between `-` and `.`, without `.gguf`.
    fn pieces(&self) -> Vec<String> {
        let name = self.name();
        let stem = &name[..name.len().saturating_sub(".gguf".len())];
        stem.split(['-', '.']).map(str::to_ascii_lowercase).collect()
    }

    /// Whether it is one shard of a split model (`-00001-of-00003.gguf`).
    fn is_shard(&self) -> bool {
        let pieces = self.pieces();
        pieces.windows(3).any(|w| w[1] == "of" && [&w[0], &w[2]].iter().all(|p| p.len() == 5 && p.bytes().all(|b| b.is_ascii_digit())))
    }

    /// How people see it in a list: "F.gguf (1.9 GB)".
    fn listed(&self) -> String {
        format!("{} ({})", self.path, human_bytes(self.size))
    }
}

/// The file `reference` means among a repository's `files`.
pub fn select<'a>(reference: &HfRef, quant: Option<&str>, files: &'a [RepoFile]) -> Result<&'a RepoFile> {
    let ggufs: Vec<&RepoFile> = files.iter().filter(|f| f.is_gguf()).collect();
    let listed = || ggufs.iter().map(|f| f.listed()).collect::<Vec<_>>();
    if let Target::File(path) = &reference.target {
        return files.iter().find(|f| &f.path == path).ok_or_else(|| Error::NoSuchFile {
            reference: reference.to_string(),
            file: path.clone(),
            listed: listed(),
        });
    }
    let wanted = quant.unwrap_or(DEFAULT_QUANT);
    let matching: Vec<&RepoFile> = ggufs.iter().copied().filter(|f| f.pieces().iter().any(|p| p.eq_ignore_ascii_case(wanted))).collect();
    let chosen = match (matching.as_slice(), quant) {
        ([one], _) => *one,
        ([], None) if ggufs.len() == 1 => ggufs[0],
        ([], _) => {
            return Err(Error::NoSuchQuant { reference: reference.to_string(), quant: wanted.to_owned(), listed: listed() });
        }
        (many, _) => {
            let files: Vec<String> = many.iter().map(|f| f.path.clone()).collect();
            if many.iter().all(|f| f.is_shard()) {
                return Err(Error::SplitModel { reference: reference.to_string(), quant: wanted.to_owned(), files });
            }
            let repo_ref = HfRef { target: Target::Quant(None), ..reference.clone() }.to_string();
            return Err(Error::AmbiguousQuant { reference: reference.to_string(), repo_ref, quant: wanted.to_owned(), files });
        }
    };
    if chosen.is_shard() {
        return Err(Error::SplitModel { reference: reference.to_string(), quant: wanted.to_owned(), files: vec![chosen.path.clone()] });
    }
    Ok(chosen)
}

/// One entry of `GET /api/models/{repo}/tree/{revision}`.
#[derive(Debug, Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    lfs: Option<Lfs>,
}

#[derive(Debug, Deserialize)]
struct Lfs {
    oid: String,
    size: u64,
}

/// What a pull needs to reach Hugging Face.
pub(crate) struct Hub<'a> {
    pub agent: &'a Agent,
    /// Without a trailing slash.
    pub endpoint: &'a str,
    pub auth: Option<Auth>,
}

impl Hub<'_> {
    /// Every file of `repo` at `revision`, with sizes and published SHA-256s.
    pub(crate) fn files(&self, repo: &str, revision: &str) -> Result<Vec<RepoFile>> {
        let mut url = format!("{}/api/models/{repo}/tree/{}?recursive=true", self.endpoint, http::encode_path(revision));
        let mut files = Vec::new();
        for _ in 0..MAX_PAGES {
            let (page, next): (Vec<TreeEntry>, Option<String>) = http::get_json(self.agent, &url, self.auth.as_ref())?;
            for e in page.into_iter().filter(|e| e.kind == "file") {
                if !is_safe_path(&e.path) {
                    tracing::warn!(repo, path = e.path, "a listed path that cannot be stored safely; skipped");
                    continue;
                }
                let (size, sha256) = match e.lfs {
                    Some(lfs) => (lfs.size, normalize_sha256(lfs.oid.strip_prefix("sha256:").unwrap_or(&lfs.oid))),
                    None => (e.size, None),
                };
                files.push(RepoFile { path: e.path, size, sha256 });
            }
            match next {
                Some(n) => url = n,
                None => return Ok(files),
            }
        }
        Err(Error::transport(&url, format!("the listing of {repo} goes on past {MAX_PAGES} pages")))
    }

    /// The download URL of `path` in `repo` at `revision`.
    pub(crate) fn resolve_url(&self, repo: &str, revision: &str, path: &str) -> String {
        format!("{}/{repo}/resolve/{}/{}", self.endpoint, http::encode_path(revision), http::encode_path(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};

    fn parse(s: &str) -> String {
        match HfRef::parse(s) {
            Ok(Some(r)) => format!("{r} = {} @ {} {:?}", r.repo, r.revision, r.target),
            Ok(None) => "not a reference".to_owned(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn references_in_every_spelling() {
        let cases = [
            "hf:bartowski/Qwen2.5-3B-Instruct-GGUF",
            "hf:bartowski/Qwen2.5-3B-Instruct-GGUF:Q4_K_M",
            "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q8_0",
            "huggingface.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m",
            "hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf",
            "hf:owner/repo@v1.0/sub/dir/m.gguf",
            "hf:owner/repo@0123456789abcdef0123456789abcdef01234567:IQ4_XS",
            "https://huggingface.co/owner/repo/resolve/main/m-Q4_K_M.gguf?download=true",
            "https://huggingface.co/owner/repo/blob/abc123/sub/m.gguf",
            "smollm2-135m-instruct",
            "/models/m.gguf",
            "hf:owner",
            "hf:owner/../x",
            "hf:owner/repo/../../etc/passwd.gguf",
            "hf:owner/repo/README.md",
            "hf:owner/repo:Q4 K",
            "hf:owner/repo@bad~rev",
        ];
        let got: Vec<String> = cases.iter().map(|c| format!("{c} -> {}", parse(c))).collect();
        expect![[r#"
            hf:bartowski/Qwen2.5-3B-Instruct-GGUF -> hf:bartowski/Qwen2.5-3B-Instruct-GGUF = bartowski/Qwen2.5-3B-Instruct-GGUF @ main Quant(None)
            hf:bartowski/Qwen2.5-3B-Instruct-GGUF:Q4_K_M -> hf:bartowski/Qwen2.5-3B-Instruct-GGUF:Q4_K_M = bartowski/Qwen2.5-3B-Instruct-GGUF @ main Quant(Some("Q4_K_M"))
            hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q8_0 -> hf:bartowski/Llama-3.2-1B-Instruct-GGUF:Q8_0 = bartowski/Llama-3.2-1B-Instruct-GGUF @ main Quant(Some("Q8_0"))
            huggingface.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m -> hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m = Qwen/Qwen2.5-0.5B-Instruct-GGUF @ main Quant(Some("q4_k_m"))
            hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf -> hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf = Qwen/Qwen2.5-0.5B-Instruct-GGUF @ main File("qwen2.5-0.5b-instruct-q4_k_m.gguf")
            hf:owner/repo@v1.0/sub/dir/m.gguf -> hf:owner/repo@v1.0/sub/dir/m.gguf = owner/repo @ v1.0 File("sub/dir/m.gguf")
            hf:owner/repo@0123456789abcdef0123456789abcdef01234567:IQ4_XS -> hf:owner/repo@0123456789abcdef0123456789abcdef01234567:IQ4_XS = owner/repo @ 0123456789abcdef0123456789abcdef01234567 Quant(Some("IQ4_XS"))
            https://huggingface.co/owner/repo/resolve/main/m-Q4_K_M.gguf?download=true -> hf:owner/repo/m-Q4_K_M.gguf = owner/repo @ main File("m-Q4_K_M.gguf")
            https://huggingface.co/owner/repo/blob/abc123/sub/m.gguf -> hf:owner/repo@abc123/sub/m.gguf = owner/repo @ abc123 File("sub/m.gguf")
            smollm2-135m-instruct -> not a reference
            /models/m.gguf -> not a reference
            hf:owner -> "hf:owner" is not a model reference revis can read: it names no repository; write OWNER/REPO. Write a catalog name (see `revis models`), hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf
            hf:owner/../x -> "hf:owner/../x" is not a model reference revis can read: "owner"/".." is not a repository name (letters, digits, '-', '_' and '.'). Write a catalog name (see `revis models`), hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf
            hf:owner/repo/../../etc/passwd.gguf -> "hf:owner/repo/../../etc/passwd.gguf" is not a model reference revis can read: "../../etc/passwd.gguf" is not the path of a .gguf file in the repository. Write a catalog name (see `revis models`), hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf
            hf:owner/repo/README.md -> "hf:owner/repo/README.md" is not a model reference revis can read: "README.md" is not the path of a .gguf file in the repository. Write a catalog name (see `revis models`), hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf
            hf:owner/repo:Q4 K -> "hf:owner/repo:Q4 K" is not a model reference revis can read: "Q4 K" is not a quantization such as Q4_K_M. Write a catalog name (see `revis models`), hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf
            hf:owner/repo@bad~rev -> "hf:owner/repo@bad~rev" is not a model reference revis can read: "bad~rev" is not a revision (a branch, tag or commit). Write a catalog name (see `revis models`), hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf"#]]
        .assert_eq(&got.join("\n"));
    }

    fn file(path: &str, size: u64) -> RepoFile {
        RepoFile { path: path.to_owned(), size, sha256: None }
    }

    fn check_select(reference: &str, files: &[RepoFile], expect: Expect) {
        let r = HfRef::parse(reference).unwrap().unwrap();
        let quant = match &r.target {
            Target::Quant(q) => q.clone(),
            Target::File(_) => None,
        };
        let got = match select(&r, quant.as_deref(), files) {
            Ok(f) => f.path.clone(),
            Err(e) => e.to_string(),
        };
        expect.assert_eq(&got);
    }

    #[test]
    fn quantizations_pick_one_file() {
        let bartowski = [
            file("README.md", 9_000),
            file("Qwen2.5-3B-Instruct-Q4_K_M.gguf", 1_930_000_000),
            file("Qwen2.5-3B-Instruct-Q4_K_S.gguf", 1_830_000_000),
            file("Qwen2.5-3B-Instruct-Q8_0.gguf", 3_290_000_000),
            file("Qwen2.5-3B-Instruct-IQ4_XS.gguf", 1_740_000_000),
            file("mmproj-Qwen2.5-3B-f16.gguf", 600_000_000),
        ];
        check_select("hf:b/r", &bartowski, expect!["Qwen2.5-3B-Instruct-Q4_K_M.gguf"]);
        check_select("hf:b/r:q8_0", &bartowski, expect!["Qwen2.5-3B-Instruct-Q8_0.gguf"]);
        check_select("hf:b/r:IQ4_XS", &bartowski, expect!["Qwen2.5-3B-Instruct-IQ4_XS.gguf"]);
        check_select(
            "hf:b/r:F16",
            &bartowski,
            expect![
                "hf:b/r:F16 has no F16 GGUF file; its GGUF files are: Qwen2.5-3B-Instruct-Q4_K_M.gguf (1.9 GB), Qwen2.5-3B-Instruct-Q4_K_S.gguf (1.8 GB), Qwen2.5-3B-Instruct-Q8_0.gguf (3.3 GB), Qwen2.5-3B-Instruct-IQ4_XS.gguf (1.7 GB)"
            ],
        );
        check_select(
            "hf:b/r/README.md.gguf",
            &bartowski,
            expect![
                "hf:b/r/README.md.gguf has no file README.md.gguf; its GGUF files are: Qwen2.5-3B-Instruct-Q4_K_M.gguf (1.9 GB), Qwen2.5-3B-Instruct-Q4_K_S.gguf (1.8 GB), Qwen2.5-3B-Instruct-Q8_0.gguf (3.3 GB), Qwen2.5-3B-Instruct-IQ4_XS.gguf (1.7 GB)"
            ],
        );
        // Qwen's own spelling, TheBloke's, a repository with one file, a split model.
        check_select(
            "hf:q/r",
            &[file("qwen2.5-0.5b-instruct-q4_k_m.gguf", 1), file("qwen2.5-0.5b-instruct-q4_k_s.gguf", 1)],
            expect!["qwen2.5-0.5b-instruct-q4_k_m.gguf"],
        );
        check_select(
            "hf:t/r:Q5_K_M",
            &[file("llama-2-7b-chat.Q5_K_M.gguf", 1), file("llama-2-7b-chat.Q5_K_S.gguf", 1)],
            expect!["llama-2-7b-chat.Q5_K_M.gguf"],
        );
        check_select("hf:o/r", &[file("only-Q8_0.gguf", 1), file("config.json", 1)], expect!["only-Q8_0.gguf"]);
        check_select(
            "hf:o/r:Q4_K_M",
            &[file("only-Q8_0.gguf", 1)],
            expect!["hf:o/r:Q4_K_M has no Q4_K_M GGUF file; its GGUF files are: only-Q8_0.gguf (1 bytes)"],
        );
        check_select(
            "hf:o/r:Q4_K_M",
            &[file("Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", 1), file("Q4_K_M/m-Q4_K_M-00002-of-00002.gguf", 1)],
            expect![
                "hf:o/r:Q4_K_M: the Q4_K_M model is split into 2 files (Q4_K_M/m-Q4_K_M-00001-of-00002.gguf, Q4_K_M/m-Q4_K_M-00002-of-00002.gguf); revis pulls models that are one GGUF file"
            ],
        );
        check_select(
            "hf:o/r",
            &[file("a-Q4_K_M.gguf", 1), file("b-Q4_K_M.gguf", 1)],
            expect!["hf:o/r: 2 GGUF files match Q4_K_M (a-Q4_K_M.gguf, b-Q4_K_M.gguf); name one: hf:o/r/FILE.gguf"],
        );
        check_select("hf:o/r/sub/x.gguf", &[file("sub/x.gguf", 1)], expect!["sub/x.gguf"]);
    }

    #[test]
    fn a_downloaded_reference_is_found_without_the_network() {
        let dir = tempfile::tempdir().unwrap();
        let r = |s: &str| HfRef::parse(s).unwrap().unwrap();
        let repo = dir.path().join("hf/b/Qwen-GGUF");
        std::fs::create_dir_all(repo.join("sub")).unwrap();
        std::fs::write(repo.join("Qwen-Q4_K_M.gguf"), b"x").unwrap();
        std::fs::write(repo.join("Qwen-Q8_0.gguf.partial"), b"x").unwrap();
        std::fs::write(repo.join("sub/Qwen-IQ4_XS.gguf"), b"x").unwrap();
        assert_eq!(r("hf:b/Qwen-GGUF").local_file(dir.path()), Some(repo.join("Qwen-Q4_K_M.gguf")));
        assert_eq!(r("hf:b/Qwen-GGUF:iq4_xs").local_file(dir.path()), Some(repo.join("sub/Qwen-IQ4_XS.gguf")));
        assert_eq!(r("hf:b/Qwen-GGUF/sub/Qwen-IQ4_XS.gguf").local_file(dir.path()), Some(repo.join("sub/Qwen-IQ4_XS.gguf")));
        assert_eq!(r("hf:b/Qwen-GGUF:Q8_0").local_file(dir.path()), None, "a partial download is not a model");
        assert_eq!(r("hf:b/Other-GGUF").local_file(dir.path()), None);
    }

    #[test]
    fn a_reference_finds_only_the_file_it_means() {
        let dir = tempfile::tempdir().unwrap();
        let r = |s: &str| HfRef::parse(s).unwrap().unwrap();
        // Only Q8_0 is here: the reference naming no quantization means Q4_K_M, which is not.
        let repo = dir.path().join("hf/o/r");
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::write(repo.join("m-Q8_0.gguf"), b"x").unwrap();
        assert_eq!(r("hf:o/r").local_file(dir.path()), None);
        assert_eq!(r("hf:o/r:Q8_0").local_file(dir.path()), Some(repo.join("m-Q8_0.gguf")));
        // Unless it was pulled as that file (the repository's only GGUF).
        std::fs::write(repo.join(DEFAULT_FILE_RECORD), "m-Q8_0.gguf\n").unwrap();
        assert_eq!(r("hf:o/r").local_file(dir.path()), Some(repo.join("m-Q8_0.gguf")));
        // A revision other than main has a directory of its own.
        assert_eq!(r("hf:o/r@abc123/m-Q8_0.gguf").local_file(dir.path()), None);
        let pinned = dir.path().join("hf/o/r@abc123");
        assert_eq!(r("hf:o/r@abc123:Q8_0").dir_in(dir.path()), pinned);
        std::fs::create_dir_all(&pinned).unwrap();
        std::fs::write(pinned.join("m-Q8_0.gguf"), b"x").unwrap();
        assert_eq!(r("hf:o/r@abc123/m-Q8_0.gguf").local_file(dir.path()), Some(pinned.join("m-Q8_0.gguf")));
    }
}
