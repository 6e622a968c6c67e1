//! Tiers, server mode, pairing and nodes: each control changes the daemon's
//! state, checked with a client of the test's own. Settings write the files.

use eframe::egui::accesskit::Role;
use egui_kittest::kittest::Queryable;
use revis_client::Tier;
use revis_gui::io_thread::{Health, PairingEvent};
use revis_testkit::TestDaemon;

use crate::{Reaper, block_on, daemon_status, harness, options, ready, revisd_in, wait_until};

fn tier_state(s: &revis_client::DaemonStatus, tier: &str) -> &'static str {
    s.tiers.iter().find(|t| t.tier == tier).unwrap().state.as_str()
}

#[test]
fn load_and_unload_change_the_daemons_tiers() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(options(&d.socket, data.path(), 16));
    ready(&mut h);
    h.get_by_label("Tiers").click();
    wait_until(&mut h, "the tiers table", |h| h.query_by_label("Load tier1").is_some());
    assert_eq!(tier_state(&daemon_status(&d.socket), "tier1"), "unloaded");
    assert_eq!(h.query_all_by_label_contains("this machine").count(), 3, "where each tier runs");

    h.get_by_label("Load tier1").click();
    wait_until(&mut h, "tier1 to load", |h| {
        h.state().state.tier_notes.contains_key(&Tier::Tier1) && h.query_by_label("Unload tier1").is_some()
    });
    assert!(h.state().state.tier_notes[&Tier::Tier1].is_ok(), "{:?}", h.state().state.tier_notes);
    let s = daemon_status(&d.socket);
    assert_eq!(tier_state(&s, "tier1"), "ready");
    let mib = s.tiers.iter().find(|t| t.tier == "tier1").unwrap().memory_bytes >> 20;
    assert!(h.query_all_by_label(&format!("{mib} MiB")).count() >= 1, "its memory is shown");

    h.get_by_label("Unload tier1").click();
    wait_until(&mut h, "tier1 to unload", |h| h.query_by_label("Load tier1").is_some());
    assert_eq!(tier_state(&daemon_status(&d.socket), "tier1"), "unloaded");
}

#[test]
fn server_mode_pairing_nodes_and_revocation() {
    let d = TestDaemon::new().server("listen = \"127.0.0.1:0\"\nadvertise = false\nname = \"desk\"").start();
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(options(&d.socket, data.path(), 16));
    ready(&mut h);
    h.get_by_label("Server mode").click();
    wait_until(&mut h, "the switch", |h| h.query_by_label("Let my other Macs use this one").is_some());
    assert!(!daemon_status(&d.socket).server.unwrap().enabled);
    assert!(h.query_by_label("Pair a device").is_none(), "no pairing while off");

    // The switch turns server mode on in the daemon.
    h.get_by_role_and_label(Role::CheckBox, "Let my other Macs use this one").click();
    wait_until(&mut h, "server mode on", |h| {
        h.state().state.server.as_ref().is_some_and(|s| s.enabled) && h.query_by_label("Pair a device").is_some()
    });
    let server = daemon_status(&d.socket).server.unwrap();
    assert!(server.enabled);
    let addr = server.listen_address;

    // "Pair a device" shows the code.
    h.get_by_label("Pair a device").click();
    wait_until(&mut h, "a pairing code", |h| matches!(h.state().state.pairing, Some(PairingEvent::Opened { .. })));
    let Some(PairingEvent::Opened { code, .. }) = h.state().state.pairing.clone() else { unreachable!() };
    assert!(h.query_by_label(&code).is_some(), "the code is on screen");
    assert!(daemon_status(&d.socket).server.unwrap().pairing_open);

    // This app pairs with that daemon as a node (by address: no mDNS here).
    h.get_by_label("Nodes").click();
    wait_until(&mut h, "the nodes view", |h| !h.state().state.nodes_loading);
    assert!(h.state().state.nodes_note.as_deref().is_some_and(|n| n.contains("Discovery is off")));
    // A wrong code first: refused, in words.
    let wrong = crate::pair_in_app(&mut h, &addr, "0000 0000").unwrap_err();
    assert!(wrong.contains("code"), "{wrong}");
    assert!(h.query_by_label(&wrong).is_some());
    // Then the right one.
    let paired = crate::pair_in_app(&mut h, "", &code);
    assert!(paired.is_ok(), "{paired:?}");
    wait_until(&mut h, "the paired node's health", |h| {
        h.state().state.nodes.iter().any(|n| n.paired && matches!(n.health, Health::Ok { .. }))
    });
    let node = h.state().state.nodes[0].clone();
    // The row as drawn in this very frame (the state is applied at the start
    // of each frame and nothing has run since): the name, the address it was
    // paired at, and the probe's health line, each label exactly.
    let Health::Ok { connect_ms, latency_ms, tiers, queue } = node.health.clone() else { unreachable!() };
    assert_eq!((node.address.as_deref(), node.discovered), (Some(addr.as_str()), false), "{node:?}");
    for label in [node.name.as_str(), &addr, "paired"] {
        h.get_by_label(label);
    }
    assert!(latency_ms > 0.0 && connect_ms > 0.0, "{:?}", node.health);
    h.get_by_label(&format!("ok, {latency_ms:.1} ms (connect {connect_ms:.0} ms), queue {queue}"));
    // What the probe read is the node's own status: its queue and its tiers
    // (a paired device sees a model given by path by its file name only).
    let desk = daemon_status(&d.socket);
    assert_eq!(queue, format!("{}/{}", desk.queue_depth, desk.queue_capacity));
    let file_name = |m: &str| std::path::Path::new(m).file_name().unwrap().to_string_lossy().into_owned();
    let want: Vec<String> =
        desk.tiers.iter().map(|t| format!("{}: {} ({})", t.tier, file_name(&t.model), tier_state(&desk, t.tier.as_str()))).collect();
    assert_eq!(tiers.len(), 3, "{tiers:?}");
    h.get_by_label(&want.join(" · "));

    // The daemon lists this app's machine; Revoke unpairs it there.
    h.get_by_label("Server mode").click();
    wait_until(&mut h, "the paired device", |h| {
        h.state().state.devices.len() == 1 && matches!(h.state().state.pairing, Some(PairingEvent::Paired { .. }))
    });
    let name = h.state().state.devices[0].name.clone();
    let listed = block_on(async { revis_client::Client::connect(&d.socket).await.unwrap().list_devices().await.unwrap() });
    assert_eq!(listed.len(), 1);
    h.get_by_label(&format!("Revoke {name}")).click();
    wait_until(&mut h, "the device revoked", |h| h.state().state.devices.is_empty());
    let listed = block_on(async { revis_client::Client::connect(&d.socket).await.unwrap().list_devices().await.unwrap() });
    assert!(listed.is_empty());

    // Revoked there: the node now refuses this machine; Forget drops it here.
    h.get_by_label("Nodes").click();
    h.run_ok();
    h.get_by_label("Look again").click();
    wait_until(&mut h, "the refusal", |h| h.state().state.nodes.iter().any(|n| matches!(&n.health, Health::Failed(_))));
    h.get_by_label(&format!("Forget {}", node.name)).click();
    wait_until(&mut h, "the node forgotten", |h| h.state().state.nodes.is_empty() && !h.state().state.nodes_loading);

    // The switch turns it off again.
    h.get_by_label("Server mode").click();
    h.run_ok();
    h.get_by_role_and_label(Role::CheckBox, "Let my other Macs use this one").click();
    wait_until(&mut h, "server mode off", |h| h.state().state.server.as_ref().is_some_and(|s| !s.enabled));
    assert!(!daemon_status(&d.socket).server.unwrap().enabled);
}

#[test]
fn settings_write_the_models_per_tier_and_the_data_folder() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let opts = options(&d.socket, data.path(), 16);
    let config = opts.config.clone();
    let mut h = harness(opts);
    ready(&mut h);
    h.get_by_label("Settings").click();
    wait_until(&mut h, "the settings", |h| h.query_by_label("Save settings").is_some());
    assert!(h.query_by_label_contains(&data.path().display().to_string()).is_some(), "the data folder in use");
    h.get_by_role_and_label(Role::TextInput, "tier3 model:").focus();
    h.get_by_role_and_label(Role::TextInput, "tier3 model:").type_text("gemma3-270m");
    h.run_ok();
    h.get_by_role_and_label(Role::TextInput, "Use from the next start:").focus();
    h.get_by_role_and_label(Role::TextInput, "Use from the next start:").type_text("/srv/revis");
    h.run_ok();
    h.get_by_label("Save settings").click();
    wait_until(&mut h, "saved", |h| h.state().state.settings_note.is_some());
    assert!(h.state().state.settings_note.clone().unwrap().is_ok(), "{:?}", h.state().state.settings_note);
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("[tiers.tier3]") && text.contains("model = \"gemma3-270m\""), "{text}");
    assert_eq!(revis_gui::settings::saved_data_dir(&config).as_deref(), Some(std::path::Path::new("/srv/revis")));
}

#[test]
fn saved_models_take_effect_when_revisd_is_restarted_from_the_settings() {
    let mut d = TestDaemon::new().start();
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    // The revisd the app starts keeps to this test's folders.
    let wrapper = revisd_in(home.path(), &data);
    let mut opts = options(&d.socket, &data, 16);
    opts.spawn = revis_client::SpawnOptions {
        revisd: Some(wrapper),
        log: Some(home.path().join("revisd.log")),
        config: Some(opts.config.clone()),
        ..Default::default()
    };
    let mut h = harness(opts);
    ready(&mut h);
    let before = daemon_status(&d.socket);
    assert!(before.tiers[2].model_path.contains("SmolLM2"), "{:?}", before.tiers[2]);
    let _reaper = Reaper(d.socket.clone());

    h.get_by_label("Settings").click();
    wait_until(&mut h, "the settings", |h| h.query_by_label("Save settings").is_some());
    let set = |h: &mut egui_kittest::Harness<'static, revis_gui::App>, models: &[(&str, &str)]| {
        for (tier, model) in models {
            h.get_by_role_and_label(Role::TextInput, &format!("{tier} model:")).focus();
            h.run_ok();
            // Select what is there, so typing replaces it.
            h.key_press_modifiers(eframe::egui::Modifiers::COMMAND, eframe::egui::Key::A);
            h.run_ok();
            h.get_by_role_and_label(Role::TextInput, &format!("{tier} model:")).type_text(model);
            h.run_ok();
        }
        h.get_by_label("Save settings").click();
        wait_until(h, "saved", |h| h.state().state.settings_note.as_ref().is_some_and(|n| n.is_ok()));
        h.get_by_label("Restart revisd now").click();
        wait_until(h, "the restart", |h| {
            let s = &h.state().state;
            !s.restarting
                && s.settings_note.as_ref().is_some_and(|n| n.as_ref().is_err() || n.as_ref().is_ok_and(|m| m.contains("restarted")))
        });
        h.state().state.settings_note.clone().unwrap()
    };
    let smollm2 = revis_testkit::smollm2().display().to_string();
    let gemma = revis_testkit::gemma3().display().to_string();
    // A model that is not there: the running daemon is left alone, and the app says why.
    let note = set(&mut h, &[("tier1", &smollm2), ("tier2", &smollm2), ("tier3", "/nowhere/model.gguf")]);
    assert!(note.as_ref().is_err_and(|e| e.contains("revisd was not restarted") && e.contains("tiers.tier3.model")), "{note:?}");
    assert_eq!(daemon_status(&d.socket).pid, before.pid);

    let note = set(&mut h, &[("tier3", &gemma)]);
    assert!(note.is_ok(), "{note:?}");
    let after = daemon_status(&d.socket);
    assert!(d.wait_exit(std::time::Duration::from_secs(10)).is_some_and(|s| s.success()), "the old revisd stopped cleanly");
    assert_ne!(after.pid, before.pid);
    assert_eq!(after.tiers[2].model_path, gemma, "tier3 runs the model chosen in the settings");

    // The app goes on with the new daemon: a question gets its answer.
    h.get_by_label("Chat").click();
    h.run_ok();
    let input = h.get_by_role_and_label(Role::MultilineTextInput, "Message:");
    input.focus();
    input.type_text("What is the capital of France?");
    h.run_ok();
    h.key_press(eframe::egui::Key::Enter);
    wait_until(&mut h, "the answer", |h| !h.state().state.streaming && h.state().state.last_answer().is_some());
    let answer = h.state().state.last_answer().unwrap().clone();
    assert_eq!(answer.shown, revis_gui::state::Shown::Complete, "{:?}", h.state().state.errors);
    assert!(!answer.text.is_empty());
}

#[test]
fn the_offload_switch_is_saved_and_a_tier_with_no_node_stays_here() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let opts = options(&d.socket, data.path(), 16);
    let store = opts.store.clone().unwrap();
    let mut h = harness(opts);
    ready(&mut h);
    h.get_by_label("Tiers").click();
    wait_until(&mut h, "the placements", |h| h.state().state.placements.len() == 3);
    let switch = "Offload tier3";
    h.get_by_role_and_label(Role::CheckBox, switch).click();
    // No node is paired: offloaded, but it runs here, and says why.
    wait_until(&mut h, "tier3 offloaded", |h| {
        h.state().state.placements.get(&Tier::Tier3).is_some_and(|p| p.offloaded && p.runs_on.contains("no node answers"))
    });
    assert!(h.query_by_label("this machine (no node answers)").is_some(), "the Tiers table says so");
    let saved = store.setting("offload/tier3").unwrap().expect("saved");
    assert_eq!(saved["enabled"], true);
    // tier3 shares its model with tier1 and tier2, which run here: it stays loaded.
    assert_eq!(tier_state(&daemon_status(&d.socket), "tier3"), "ready", "loaded again when it came home");

    h.get_by_role_and_label(Role::CheckBox, switch).click();
    wait_until(&mut h, "tier3 home", |h| {
        h.state().state.placements.get(&Tier::Tier3).is_some_and(|p| !p.offloaded && p.runs_on == "this machine")
    });
    assert_eq!(store.setting("offload/tier3").unwrap().unwrap()["enabled"], false);
}
