//! A first run as a new user has it: no model and no revisd, so the app
//! opens on the Models view; a download is started, cancelled, resumed
//! where it stopped, and revisd starts with the model; a model is then
//! given to a tier. Downloads come from a Hugging Face of the test's own
//! (loopback), serving the real model file.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eframe::egui::accesskit::Role;
use egui_kittest::kittest::Queryable;
use revis_gui::state::View;

use crate::{Reaper, harness, new_user_options, ready, wait_until};

/// Hugging Face on loopback, serving `entry`'s file (resuming with `Range`);
/// while `slow` is set it sends 16 KiB every 10 ms. Records each download's
/// first byte.
struct Hub {
    url: String,
    slow: Arc<AtomicBool>,
    starts: Arc<Mutex<Vec<u64>>>,
}

fn hub(entry: &'static revis_models::CatalogEntry, file: &Path) -> Hub {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let bytes: Arc<Vec<u8>> = Arc::new(std::fs::read(file).unwrap());
    let (slow, starts) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
    let (s, st) = (slow.clone(), starts.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let (bytes, slow, starts) = (bytes.clone(), s.clone(), st.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let (mut path, mut from) = (String::new(), 0u64);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    if path.is_empty() {
                        path = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
                    } else if let Some(r) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                        from = r.trim().trim_end_matches('-').parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let Some(revis_models::Source::HuggingFace { repo, revision, file }) =
                    entry.sources.iter().find(|s| matches!(s, revis_models::Source::HuggingFace { .. }))
                else {
                    return;
                };
                if path.starts_with("/api/models/big/model/tree/") {
                    // A repository whose Q4_K_M file is a petabyte: too large for any machine here.
                    let lfs = serde_json::json!({"oid": format!("sha256:{}", "0".repeat(64)), "size": 1u64 << 50});
                    let body = serde_json::json!([{"type": "file", "path": "big-Q4_K_M.gguf", "size": 1u64 << 50, "lfs": lfs}]).to_string();
                    let _ =
                        write!(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                } else if path.starts_with(&format!("/api/models/{repo}/tree/{revision}")) {
                    let lfs = serde_json::json!({"oid": format!("sha256:{}", entry.sha256), "size": bytes.len()});
                    let body = serde_json::json!([{"type": "file", "path": file, "size": bytes.len(), "lfs": lfs}]).to_string();
                    let _ =
                        write!(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                } else if path.starts_with(&format!("/{repo}/resolve/{revision}/{file}")) {
                    starts.lock().unwrap().push(from);
                    let (len, rest) = (bytes.len() as u64, &bytes[from as usize..]);
                    let head = if from > 0 {
                        format!("HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {from}-{}/{len}\r\n", len - 1)
                    } else {
                        "HTTP/1.1 200 OK\r\n".to_owned()
                    };
                    let _ = write!(conn, "{head}Content-Length: {}\r\n\r\n", rest.len());
                    for chunk in rest.chunks(16 << 10) {
                        if conn.write_all(chunk).is_err() {
                            return;
                        }
                        if slow.load(Ordering::SeqCst) {
                            // A slow network, so that the download is still under way when it is cancelled.
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                } else {
                    let _ = write!(conn, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                }
            });
        }
    });
    Hub { url, slow, starts }
}

/// A URL where nothing listens.
fn nothing_listens() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

#[test]
fn a_first_run_chooses_downloads_and_starts_without_a_terminal() {
    let entry = revis_models::find(revis_models::DEFAULT_MODEL).unwrap();
    let hub = hub(entry, &revis_testkit::smollm2());
    let home = tempfile::tempdir().unwrap();
    let (mut opts, socket) = new_user_options(home.path());
    opts.pull.hf_endpoint = hub.url.clone();
    opts.pull.index_url = format!("{}/simple", nothing_listens());
    opts.pull.hf_token = None;
    let config = opts.config.clone();
    let mut h = harness(opts);
    let _reaper = Reaper(socket.clone());

    wait_until(&mut h, "the Models view, first", |h| {
        let s = &h.state().state;
        s.need_model.is_some() && s.view() == View::Models && s.models.is_some()
    });
    assert!(!socket.exists(), "no revisd is started without a model");

    // Cancelled part-way: the part fetched is kept, and said so.
    hub.slow.store(true, Ordering::SeqCst);
    let download = format!("Download {}", entry.name);
    h.get_by_label(&download).click();
    wait_until(&mut h, "the download to be under way", |h| {
        let s = &h.state().state;
        assert!(s.pull_note.is_none(), "the download ended: {:?}", s.pull_note);
        s.pull.as_ref().is_some_and(|p| p.2 > 0)
    });
    h.get_by_label("Cancel download").click();
    wait_until(&mut h, "the download to stop", |h| h.state().state.pull_note.is_some());
    let note = h.state().state.pull_note.clone().unwrap();
    assert!(note.as_ref().is_err_and(|e| e.contains("cancelled")), "{note:?}");
    assert!(h.query_by_label_contains("The download did not finish").is_some());

    // Downloaded again: it resumes, becomes the default, and revisd starts with it.
    hub.slow.store(false, Ordering::SeqCst);
    h.get_by_label(&download).click();
    wait_until(&mut h, "the download to finish", |h| h.state().state.pull_note.as_ref().is_some_and(Result::is_ok));
    let starts = hub.starts.lock().unwrap().clone();
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert!(starts[1] > 0, "the second download resumed where the first stopped: {starts:?}");
    ready(&mut h);
    assert!(h.state().state.need_model.is_none());
    wait_until(&mut h, "the catalog again", |h| {
        h.state().state.models.as_ref().is_some_and(|m| m.rows.iter().any(|r| r.name == entry.name && r.downloaded))
    });

    // A Hugging Face model too large for this machine: asked about first, and "Not now" downloads nothing.
    h.get_by_role_and_label(Role::TextInput, "Hugging Face model:").focus();
    h.get_by_role_and_label(Role::TextInput, "Hugging Face model:").type_text("hf:big/model");
    h.run_ok();
    h.get_by_role_and_label(Role::Button, "Download").click();
    wait_until(&mut h, "the question before a large download", |h| h.state().state.pull_confirm.is_some());
    let (model, why) = h.state().state.pull_confirm.clone().unwrap();
    assert_eq!(model, "hf:big/model");
    assert!(why.contains("more than half of this machine's"), "{why}");
    assert!(h.query_by_label("Download anyway").is_some());
    h.get_by_label("Not now").click();
    h.run_ok();
    assert!(h.state().state.pull_confirm.is_none() && h.state().state.pull.is_none());
    assert_eq!(hub.starts.lock().unwrap().len(), 2, "nothing more was downloaded");

    // Given to a tier: written to revisd.toml, for revisd's next start.
    h.get_by_label(&format!("Use {}", entry.name)).click();
    h.run_ok();
    h.get_by_label("for tier3").click();
    wait_until(&mut h, "the setting saved", |h| h.state().state.settings_note.as_ref().is_some_and(Result::is_ok));
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("[tiers.tier3]") && text.contains(&format!("model = \"{}\"", entry.name)), "{text}");
}
