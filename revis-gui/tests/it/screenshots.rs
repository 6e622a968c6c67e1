//! Renders the main views to PNG with egui's own wgpu renderer (headless:
//! Mesa's CPU renderer on a machine without a GPU): chat with a streamed
//! answer, tiers, nodes, server mode with a pairing code, models, settings. They go
//! to `$REVIS_SCREENSHOTS` (`cargo xtask screenshots` sets it to
//! docs/screenshots), else under the target directory. Their content
//! varies (codes, timings, paths), so each is checked to have rendered,
//! not compared pixel by pixel.

use std::path::PathBuf;

use eframe::egui::Key;
use eframe::egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use revis_client::wire::v1 as pb;
use revis_gui::App;
use revis_gui::io_thread::{Health, PairingEvent};
use revis_testkit::TestDaemon;

use crate::{block_on, harness_with, options, ready, wait_until};

const SIZE: [f32; 2] = [1000.0, 640.0];

fn out_dir() -> PathBuf {
    let dir =
        std::env::var_os("REVIS_SCREENSHOTS").map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots"), PathBuf::from);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Renders the window and saves it; checks it is a real picture.
fn shoot(h: &mut Harness<'static, App>, name: &str) {
    h.remove_cursor();
    h.run_ok();
    let image = h.render().unwrap_or_else(|e| panic!("rendering {name}: {e}"));
    assert_eq!((image.width(), image.height()), (SIZE[0] as u32, SIZE[1] as u32));
    let mut colours: Vec<[u8; 4]> = image.pixels().map(|p| p.0).collect();
    colours.sort_unstable();
    colours.dedup();
    assert!(colours.len() > 20, "{name} rendered {} colours: blank?", colours.len());
    let path = out_dir().join(format!("{name}.png"));
    image.save(&path).unwrap_or_else(|e| panic!("saving {}: {e}", path.display()));
}

#[test]
fn screenshots_of_the_main_views() {
    let d = TestDaemon::new().server("enabled = true\nlisten = \"127.0.0.1:0\"\nadvertise = false\nname = \"desk\"").start();
    let data = tempfile::tempdir().unwrap();
    // This machine is paired with the daemon, as a node of its own (loopback, no mDNS).
    block_on(async {
        let c = revis_client::Client::connect(&d.socket).await.unwrap();
        let addr = c.status().await.unwrap().server.unwrap().listen_address.parse().unwrap();
        let mut events = c.wire().admin.open_pairing(pb::OpenPairingRequest { window_s: 0 }).await.unwrap().into_inner();
        let Some(pb::pairing_event::Event::Opened(o)) = events.message().await.unwrap().and_then(|e| e.event) else { panic!("no code") };
        let mut keyring = revis_client::Keyring::open(&data.path().join("client")).unwrap();
        revis_client::pair(&mut keyring, addr, "desk", &o.code.parse().unwrap(), "laptop").await.unwrap();
    });
    // The test model, downloaded (as the Models view shows it).
    let models = data.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    let model = revis_testkit::smollm2();
    std::os::unix::fs::symlink(&model, models.join(model.file_name().unwrap())).unwrap();
    let mut opts = options(&d.socket, data.path(), 64);
    opts.config = data.path().join("config/revisd.toml");
    std::fs::create_dir_all(data.path().join("config")).unwrap();
    std::fs::write(&opts.config, "[tiers.tier3]\nmodel = \"gemma3-270m\"\n").unwrap();
    let mut h = harness_with(Harness::builder().with_size(SIZE).wgpu(), opts);
    ready(&mut h);

    let input = h.get_by_role_and_label(Role::MultilineTextInput, "Message:");
    input.focus();
    input.type_text("Show a short Python function that adds two numbers.");
    h.run_ok();
    h.key_press(Key::Enter);
    // Its title in the list and its stored ids (the answer's buttons) come just after it.
    wait_until(&mut h, "the answer, its title and its ids", |h| {
        let s = &h.state().state;
        !s.streaming
            && s.last_stats.is_some()
            && s.messages.iter().all(|m| m.id.is_some())
            && s.conversations.iter().any(|c| !c.title.is_empty())
    });
    shoot(&mut h, "chat");

    h.get_by_label("Tiers").click();
    wait_until(&mut h, "tier2 ready", |h| h.query_by_label("Unload tier2").is_some());
    shoot(&mut h, "tiers");

    h.get_by_label("Nodes").click();
    wait_until(&mut h, "the node's health", |h| h.state().state.nodes.iter().any(|n| matches!(n.health, Health::Ok { .. })));
    shoot(&mut h, "nodes");

    h.get_by_label("Server mode").click();
    wait_until(&mut h, "server mode", |h| h.query_by_label("Pair a device").is_some());
    h.get_by_label("Pair a device").click();
    wait_until(&mut h, "a pairing code", |h| {
        matches!(h.state().state.pairing, Some(PairingEvent::Opened { .. })) && !h.state().state.devices.is_empty()
    });
    shoot(&mut h, "server");

    h.get_by_label("Models").click();
    wait_until(&mut h, "the catalog", |h| h.state().state.models.is_some());
    shoot(&mut h, "models");

    h.get_by_label("Settings").click();
    wait_until(&mut h, "the settings", |h| h.query_by_label("Save settings").is_some());
    shoot(&mut h, "settings");
}
