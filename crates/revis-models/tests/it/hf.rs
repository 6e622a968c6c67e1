//! Pulls of Hugging Face references and pinned catalog files, against two loopback servers that
//! speak the part of the Hub revis uses: the endpoint (`/api/models/{repo}/tree/{rev}` with sizes
//! and LFS SHA-256s, in pages; `/{repo}/resolve/{rev}/{file}`, redirecting) and a CDN (Range).

use expect_test::expect;
use revis_models::{Cancel, CatalogEntry, Error, HfRef, PullOptions, SamplingDefaults, Source, pull, pull_hf};
use serde_json::json;

use crate::cancel::{cancelled_after_first_bytes_of, kept_partial};
use crate::server::{Hit, Server};
use crate::{check_error, hit, leak, listing, model_bytes, options, sha256_hex};

const TREE: &str = "/api/models/owner/repo/tree/main?recursive=true";
const FILE: &str = "Repo-7B-Q4_K_M.gguf";

/// One file of a listing: (path, the bytes its LFS metadata describes), or a small file outside LFS.
enum Listed<'a> {
    Lfs(&'a str, &'a [u8]),
    Plain(&'a str, usize),
}

/// A page of `GET /api/models/{repo}/tree/{rev}` as the Hub answers it.
fn tree(files: &[Listed<'_>]) -> String {
    let entries: Vec<serde_json::Value> = files
        .iter()
        .map(|f| match f {
            Listed::Lfs(path, bytes) => json!({
                "type": "file", "oid": "0123456789abcdef0123456789abcdef01234567", "size": bytes.len(), "path": path,
                "lfs": { "oid": sha256_hex(bytes), "size": bytes.len(), "pointerSize": 134 },
            }),
            Listed::Plain(path, size) => {
                json!({ "type": "file", "oid": "89abcdef0123456789abcdef0123456789abcdef", "size": size, "path": path })
            }
        })
        .chain([json!({ "type": "directory", "oid": "fedcba9876543210fedcba9876543210fedcba98", "size": 0, "path": "sub" })])
        .collect();
    serde_json::to_string(&entries).unwrap()
}

/// The Hub and its CDN: `file` of owner/repo at main is listed (its LFS SHA-256
/// is that of `published`), resolved by a redirect to the CDN, which serves `served`.
struct Hub {
    endpoint: Server,
    cdn: Server,
}

impl Hub {
    fn new(file: &str, published: &[u8], served: &[u8]) -> Hub {
        let (endpoint, cdn) = (Server::start(), Server::start());
        // Two pages, linked as the Hub links them.
        let next = "/api/models/owner/repo/tree/main?recursive=true&cursor=page2";
        endpoint.route(TREE, tree(&[Listed::Plain("README.md", 5120), Listed::Lfs("Repo-7B-Q8_0.gguf", b"another file")]));
        endpoint.header(TREE, "Link", &format!("<{}{next}>; rel=\"next\"", endpoint.url()));
        endpoint.route(next, tree(&[Listed::Lfs(file, published), Listed::Lfs("mmproj-Repo-Q4_K_M.gguf", b"vision")]));
        endpoint.redirect(&Self::resolve(file), &format!("{}/blobs/{}", cdn.url(), sha256_hex(published)));
        cdn.route(&format!("/blobs/{}", sha256_hex(published)), served.to_vec());
        Hub { endpoint, cdn }
    }

    fn resolve(file: &str) -> String {
        format!("/owner/repo/resolve/main/{file}")
    }

    fn blob(&self, published: &[u8]) -> String {
        format!("/blobs/{}", sha256_hex(published))
    }

    fn options(&self) -> PullOptions {
        PullOptions { hf_endpoint: self.endpoint.url(), ..options(&self.cdn) }
    }

    fn ports(&self) -> [u16; 2] {
        [self.endpoint.port(), self.cdn.port()]
    }
}

fn reference(s: &str) -> HfRef {
    HfRef::parse(s).unwrap().expect("a reference")
}

fn with_auth(h: Hit, auth: &str) -> Hit {
    Hit { auth: Some(auth.to_owned()), ..h }
}

#[test]
fn a_reference_is_listed_resolved_downloaded_and_found_again() {
    let content = model_bytes(200_000, 21);
    let hub = Hub::new(FILE, &content, &content);
    let dir = tempfile::tempdir().unwrap();
    let r = reference("hf:owner/repo:Q4_K_M");

    let path = pull_hf(&r, dir.path(), &hub.options()).unwrap();

    assert_eq!(path, dir.path().join("hf/owner/repo").join(FILE));
    assert!(std::fs::read(&path).unwrap() == content, "model bytes differ");
    let page2 = "/api/models/owner/repo/tree/main?recursive=true&cursor=page2";
    assert_eq!(hub.endpoint.hits(), [hit(TREE, None, 200), hit(page2, None, 200), hit(&Hub::resolve(FILE), None, 302)]);
    assert_eq!(hub.cdn.hits(), [hit(&hub.blob(&content), None, 200)]);
    assert_eq!(listing(&dir.path().join("hf/owner/repo")), [FILE]);
    // The daemon finds it by the same reference, without the network; so does the default (Q4_K_M).
    assert_eq!(r.local_file(dir.path()), Some(path.clone()));
    assert_eq!(reference("hf:owner/repo").local_file(dir.path()), Some(path.clone()));

    // Pulled again: listed, not downloaded.
    hub.endpoint.clear_hits();
    hub.cdn.clear_hits();
    assert_eq!(pull_hf(&reference("hf.co/owner/repo"), dir.path(), &hub.options()).unwrap(), path);
    assert_eq!(hub.endpoint.hits().len(), 2, "the two pages of the listing");
    assert_eq!(hub.cdn.hits(), []);
}

#[test]
fn the_token_goes_to_the_endpoint_and_never_to_the_cdn() {
    let content = model_bytes(50_000, 22);
    let hub = Hub::new(FILE, &content, &content);
    let dir = tempfile::tempdir().unwrap();
    let opts = PullOptions { hf_token: Some("hf_secret".into()), ..hub.options() };

    pull_hf(&reference(&format!("hf:owner/repo/{FILE}")), dir.path(), &opts).unwrap();

    let bearer = "Bearer hf_secret";
    let page2 = "/api/models/owner/repo/tree/main?recursive=true&cursor=page2";
    assert_eq!(
        hub.endpoint.hits(),
        [
            with_auth(hit(TREE, None, 200), bearer),
            with_auth(hit(page2, None, 200), bearer),
            with_auth(hit(&Hub::resolve(FILE), None, 302), bearer)
        ]
    );
    assert_eq!(hub.cdn.hits(), [hit(&hub.blob(&content), None, 200)], "no Authorization at the CDN");
}

#[test]
fn a_download_cut_off_resumes_where_it_stopped() {
    let content = model_bytes(300_000, 23);
    let hub = Hub::new(FILE, &content, &content);
    let blob = hub.blob(&content);
    hub.cdn.cut_next(&blob, 120_000);
    let dir = tempfile::tempdir().unwrap();
    let r = reference("hf:owner/repo:q4_k_m");

    let error = pull_hf(&r, dir.path(), &hub.options()).unwrap_err().to_string();
    let resolve = format!("GET {}{}", hub.endpoint.url(), Hub::resolve(FILE));
    assert!(error.starts_with(&format!("{resolve} failed: transfer broke off after 120000 of 300000 bytes")), "{error}");
    let partial = dir.path().join("hf/owner/repo").join(format!("{FILE}.partial"));
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), 120_000);
    assert_eq!(r.local_file(dir.path()), None, "a partial download is not a model");

    hub.endpoint.clear_hits();
    hub.cdn.clear_hits();
    let path = pull_hf(&r, dir.path(), &hub.options()).unwrap();
    assert!(std::fs::read(&path).unwrap() == content, "model bytes differ");
    assert_eq!(hub.cdn.hits(), [hit(&blob, Some("bytes=120000-"), 206)], "only the rest, through the redirect");
    assert_eq!(listing(&dir.path().join("hf/owner/repo")), [FILE]);
}

#[test]
fn a_cancelled_download_keeps_its_partial_file_and_the_next_pull_resumes_it() {
    let content = model_bytes(2_000_000, 27);
    let hub = Hub::new(FILE, &content, &content);
    let blob = hub.blob(&content);
    let dir = tempfile::tempdir().unwrap();
    let r = reference("hf:owner/repo:Q4_K_M");
    let (cancel, progress) = cancelled_after_first_bytes_of(FILE);

    let error = pull_hf(&r, dir.path(), &PullOptions { progress, cancel: Some(cancel), retries: 3, ..hub.options() }).unwrap_err();

    assert!(matches!(error, Error::Cancelled), "{error}");
    assert_eq!(hub.cdn.hits(), [hit(&blob, None, 200)], "not resumed within the pull");
    let repo_dir = dir.path().join("hf/owner/repo");
    let kept = kept_partial(&repo_dir, FILE);
    assert_eq!(r.local_file(dir.path()), None, "a partial download is not a model");

    hub.cdn.clear_hits();
    let path = pull_hf(&r, dir.path(), &hub.options()).unwrap();
    assert!(std::fs::read(&path).unwrap() == content, "model bytes differ");
    assert_eq!(hub.cdn.hits(), [hit(&blob, Some(&format!("bytes={kept}-")), 206)], "only the rest");
    assert_eq!(listing(&repo_dir), [FILE]);
}

#[test]
fn a_reference_pulled_with_a_cancelled_handle_is_not_even_listed() {
    let content = model_bytes(1000, 28);
    let hub = Hub::new(FILE, &content, &content);
    let dir = tempfile::tempdir().unwrap();
    let cancel = Cancel::new();
    cancel.cancel();

    let error = pull_hf(&reference("hf:owner/repo"), dir.path(), &PullOptions { cancel: Some(cancel), ..hub.options() }).unwrap_err();

    assert!(matches!(error, Error::Cancelled), "{error}");
    assert_eq!((hub.endpoint.hits(), hub.cdn.hits()), (vec![], vec![]), "no network");
    assert!(!dir.path().join("hf").exists(), "nothing created");
}

#[test]
fn a_file_that_does_not_match_its_published_hash_is_refused_and_removed() {
    let content = model_bytes(80_000, 24);
    let mut corrupt = content.clone();
    corrupt[40_000] ^= 0xff;
    let hub = Hub::new(FILE, &content, &corrupt);
    let dir = tempfile::tempdir().unwrap();

    let error = pull_hf(&reference("hf:owner/repo"), dir.path(), &hub.options()).unwrap_err();

    let Error::HashMismatch { expected, actual, .. } = &error else { panic!("{error}") };
    assert_eq!((expected.as_str(), actual.as_str()), (sha256_hex(&content).as_str(), sha256_hex(&corrupt).as_str()));
    let message = error.to_string();
    assert!(message.contains(&sha256_hex(&content)) && message.contains(&sha256_hex(&corrupt)), "both hashes named: {message}");
    assert_eq!(listing(&dir.path().join("hf/owner/repo")), Vec::<String>::new(), "nothing kept");
}

#[test]
fn a_missing_file_or_quantization_is_named_with_what_the_repository_has() {
    let content = model_bytes(1000, 25);
    let hub = Hub::new(FILE, &content, &content);
    let dir = tempfile::tempdir().unwrap();
    let fails = |s: &str| pull_hf(&reference(s), dir.path(), &hub.options()).unwrap_err();

    check_error(
        &fails("hf:owner/repo:Q9_K"),
        &hub.ports(),
        expect![
            "hf:owner/repo:Q9_K has no Q9_K GGUF file; its GGUF files are: Repo-7B-Q8_0.gguf (12 bytes), Repo-7B-Q4_K_M.gguf (1000 bytes)"
        ],
    );
    check_error(
        &fails("hf:owner/repo/Repo-7B-Q2_K.gguf"),
        &hub.ports(),
        expect![
            "hf:owner/repo/Repo-7B-Q2_K.gguf has no file Repo-7B-Q2_K.gguf; its GGUF files are: Repo-7B-Q8_0.gguf (12 bytes), Repo-7B-Q4_K_M.gguf (1000 bytes)"
        ],
    );
    check_error(
        &fails("hf:owner/missing:Q4_K_M"),
        &hub.ports(),
        expect!["GET http://127.0.0.1:PORT/api/models/owner/missing/tree/main?recursive=true answered HTTP 404"],
    );
    assert_eq!(hub.cdn.hits(), [], "nothing downloaded");
    assert!(!dir.path().join("hf").exists(), "nothing created");
}

/// A catalog entry pinned to a commit and a SHA-256, with a size as Hugging Face shows it.
fn pinned(content: &[u8], sha256: &str) -> &'static CatalogEntry {
    Box::leak(Box::new(CatalogEntry {
        name: "pinned-model",
        file_name: FILE,
        sha256: leak(sha256.to_owned()),
        // Three significant digits, as the Hub's pages show sizes.
        size: (content.len() as u64 / 1000) * 1000,
        exact_size: false,
        params: "7B",
        kv_bytes_per_token: 1,
        sampling: SamplingDefaults::NONE,
        chat: revis_models::ChatGears::UNMEASURED,
        system_prompt: None,
        description: "a model made up by the test",
        sources: Box::leak(Box::new([Source::HuggingFace { repo: "owner/repo", revision: "main", file: FILE }])),
    }))
}

#[test]
fn a_pinned_catalog_file_takes_its_exact_size_from_the_hub_and_its_hash_from_the_catalog() {
    let content = model_bytes(150_321, 26);
    let hub = Hub::new(FILE, &content, &content);
    let dir = tempfile::tempdir().unwrap();

    let path = pull(pinned(&content, &sha256_hex(&content)), dir.path(), &hub.options()).unwrap();
    assert!(std::fs::read(&path).unwrap() == content, "model bytes differ");
    assert_eq!(path, dir.path().join(FILE));
    assert!(pinned(&content, &sha256_hex(&content)).is_present(dir.path()));

    // The Hub now publishes another file under that name: refused before any download.
    std::fs::remove_file(&path).unwrap();
    hub.cdn.clear_hits();
    let other = "ab".repeat(32);
    let error = pull(pinned(&content, &other), dir.path(), &hub.options()).unwrap_err();
    let Error::AllSourcesFailed { failures, .. } = &error else { panic!("{error}") };
    assert_eq!(
        failures[0].error.to_string(),
        format!(
            "the catalog pins {FILE} of owner/repo at main at sha256 {other}, but Hugging Face publishes {} for it; refused",
            sha256_hex(&content)
        )
    );
    assert_eq!(hub.cdn.hits(), []);
    assert_eq!(listing(dir.path()), Vec::<String>::new());
}
