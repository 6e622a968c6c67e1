//! One keyring, shared and reloadable: a node paired in the app gets the
//! app's work as soon as the user offloads to it, with no restart.

use eframe::egui::Key;
use eframe::egui::accesskit::Role;
use egui_kittest::kittest::Queryable;
use revis_client::{Client, ModelState, PairingEvent, Tier};
use revis_testkit::TestDaemon;

use crate::{daemon_status, harness, options, ready, wait_until};

fn tier2(socket: &std::path::Path) -> ModelState {
    daemon_status(socket).tier(Tier::Tier2).expect("a tier2").state
}

#[test]
fn a_node_paired_in_the_app_answers_the_next_message_once_offload_is_on() {
    // desk: another machine's revisd, in server mode on loopback.
    let desk = TestDaemon::new().server("listen = \"127.0.0.1:0\"\nadvertise = false\nname = \"desk\"").start();
    let here = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(options(&here.socket, data.path(), 16));
    ready(&mut h);

    // desk shows a pairing code (what `revisd pair` prints there); its window
    // stays open while this stream is held, on a runtime that lives as long.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (addr, code, _window) = rt.block_on(async {
        let c = Client::connect(&desk.socket).await.unwrap();
        let addr = c.set_server_mode(true).await.unwrap().listen_address;
        let mut window = c.open_pairing(0).await.unwrap();
        let Some(PairingEvent::Opened { code, .. }) = window.next().await.unwrap() else { panic!("no pairing code") };
        (addr, code, window)
    });

    // The user pairs in the Nodes view (by address: no mDNS in tests)...
    h.get_by_label("Nodes").click();
    wait_until(&mut h, "the nodes view", |h| !h.state().state.nodes_loading);
    let paired = crate::pair_in_app(&mut h, &addr, &code);
    assert!(paired.is_ok(), "{paired:?}");
    // Paired by address, the node is listed under it.
    wait_until(&mut h, "the paired node listed", |h| h.state().state.nodes.iter().any(|n| n.paired));
    let desk_name = h.state().state.nodes.iter().find(|n| n.paired).unwrap().name.clone();

    // ...then offloads tier2 (the chat's tier) in the Tiers view: it runs on
    // desk now. The dispatcher was built when the app started, before the
    // pairing; no restart in between.
    h.get_by_label("Tiers").click();
    wait_until(&mut h, "the placements", |h| h.state().state.placements.len() == 3);
    h.get_by_role_and_label(Role::CheckBox, "Offload tier2").click();
    wait_until(&mut h, "tier2 on desk", |h| {
        h.state().state.placements.get(&Tier::Tier2).is_some_and(|p| p.offloaded && p.runs_on == desk_name)
    });
    assert_eq!(tier2(&desk.socket), ModelState::Unloaded, "desk has run nothing yet");

    // The next message is answered by desk.
    h.get_by_label("Chat").click();
    h.run_ok();
    let input = h.get_by_role_and_label(Role::MultilineTextInput, "Message:");
    input.focus();
    input.type_text("Name a colour.");
    h.run_ok();
    h.key_press(Key::Enter);
    h.run_ok();
    wait_until(&mut h, "the answer", |h| !h.state().state.streaming && h.state().state.last_answer().is_some_and(|a| !a.text.is_empty()));
    assert!(h.state().state.errors.is_empty(), "{:?}", h.state().state.errors);
    assert_eq!(tier2(&desk.socket), ModelState::Ready, "desk ran the answer");
    let cached = daemon_status(&desk.socket).tier(Tier::Tier2).unwrap().cached_prefixes;
    assert!(cached > 0, "desk evaluated the conversation's prompt");
}
