//! Discovery in the Nodes view: a daemon advertising in one network
//! namespace shows up, not paired, in the app browsing from the other (mDNS
//! only on the test's own veth), and pairs by the name it advertised.

use std::time::{Duration, Instant};

use eframe::egui::accesskit::Role;
use egui_kittest::kittest::Queryable;
use revis_client::wire::v1 as pb;
use revis_gui::io_thread::Health;
use revis_testkit::TestDaemon;
use revis_testkit::netns::NetnsPair;

use crate::{STEP, daemon_status, harness, options, ready, wait_until};

#[test]
fn an_advertised_machine_shows_up_not_paired_and_pairs_by_its_name() {
    let net = NetnsPair::new();
    let desk = TestDaemon::new()
        .netns(&net.a.name)
        .server(&format!("enabled = true\nlisten = \"0.0.0.0:0\"\nname = \"desk\"\ninterfaces = [\"{}\"]", net.a.interface))
        .start();
    let local = TestDaemon::new().start();
    // From here this thread, and so the app's I/O thread and its mDNS, live
    // in the other namespace: they see the veth and nothing else.
    net.b.enter();
    let data = tempfile::tempdir().unwrap();
    let mut opts = options(&local.socket, data.path(), 16);
    opts.discovery = Some(revis_client::Interfaces::Named(vec![net.b.interface.clone()]));
    let mut h = harness(opts);
    ready(&mut h);

    let status = daemon_status(&desk.socket);
    let server = status.server.clone().unwrap();
    assert!(server.enabled && server.advertised, "{server:?}");
    let port = server.listen_address.rsplit(':').next().unwrap().to_owned();
    let address = format!("{}:{port}", net.a.addr);

    // The Nodes view browses when it opens; the desk's name probe takes about
    // a second, so look again until it answers.
    h.get_by_label("Nodes").click();
    let deadline = Instant::now() + STEP;
    loop {
        wait_until(&mut h, "a look at the network", |h| !h.state().state.nodes_loading);
        if h.state().state.nodes.iter().any(|n| n.name == "desk") {
            break;
        }
        assert!(Instant::now() < deadline, "the desk was not found in {STEP:?}: {:?}", h.state().state.nodes);
        h.get_by_label("Look again").click();
        h.run_ok();
    }
    let s = &h.state().state;
    assert_eq!(s.nodes.len(), 1, "{:?}", s.nodes);
    let row = &s.nodes[0];
    assert_eq!((row.paired, row.discovered), (false, true), "{row:?}");
    assert_eq!(row.device_id, status.device_id);
    assert_eq!(row.address.as_deref(), Some(address.as_str()));
    assert_eq!((&row.health, &row.warning), (&Health::Unknown, &None));
    assert_eq!(s.nodes_note, None, "discovery is on: no note");
    for label in ["desk", &address, "not paired"] {
        h.get_by_label(label);
    }

    // "Pair with desk" picks it by name; the code comes from the desk.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut window = rt.block_on(async {
        let c = revis_client::Client::connect(&desk.socket).await.unwrap();
        c.wire().admin.open_pairing(pb::OpenPairingRequest { window_s: 0 }).await.unwrap().into_inner()
    });
    let code = match rt.block_on(window.message()).unwrap().and_then(|e| e.event) {
        Some(pb::pairing_event::Event::Opened(o)) => o.code,
        other => panic!("no pairing code: {other:?}"),
    };
    h.get_by_role_and_label(Role::Button, "Pair with desk").click();
    h.run_ok();
    assert_eq!(h.state().state.pair_node, "desk");
    h.get_by_role_and_label(Role::TextInput, "Code:").focus();
    h.get_by_role_and_label(Role::TextInput, "Code:").type_text(&code);
    h.run_ok();
    h.get_by_role_and_label(Role::Button, "Pair").click();
    wait_until(&mut h, "pairing", |h| h.state().state.pair_result.is_some());
    let paired = h.state().state.pair_result.clone().unwrap();
    assert!(paired.as_ref().is_ok_and(|m| m.contains(&address)), "{paired:?}");
    let paired_event = rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), window.message()).await }).unwrap().unwrap();
    assert!(matches!(paired_event.and_then(|e| e.event), Some(pb::pairing_event::Event::Paired(_))));

    // Now it is one row, paired and on the network, and answers.
    wait_until(&mut h, "the paired node's health", |h| {
        h.state().state.nodes.iter().any(|n| n.paired && n.discovered && matches!(n.health, Health::Ok { .. }))
    });
    assert_eq!(h.state().state.nodes.len(), 1, "{:?}", h.state().state.nodes);
    h.get_by_label("paired, on the network");
    h.get_by_label("Forget desk");
}
