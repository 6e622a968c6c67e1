//! Ensembles in the Tiers view: switched on there, a tier's ensemble is
//! saved in the store and answers the next message with every member, in
//! this app and in the next one that opens the store; one that is refused
//! says why and changes nothing.

use eframe::egui::accesskit::{Role, Toggled};
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use revis_client::ensemble::{EnsembleSpec, Method};
use revis_client::{ModelState, Tier};
use revis_gui::App;
use revis_testkit::TestDaemon;

use crate::{block_on, daemon_status, harness, options, ready, wait_until};

fn model_state(socket: &std::path::Path, tier: Tier) -> ModelState {
    daemon_status(socket).tier(tier).unwrap_or_else(|| panic!("no {tier}")).state
}

fn switch(tier: Tier) -> String {
    format!("Ensemble {tier}")
}

fn members_field(tier: Tier) -> String {
    format!("Members of {tier}'s ensemble:")
}

fn method_choice(tier: Tier) -> String {
    format!("Method of {tier}'s ensemble")
}

/// Whether a tier's ensemble switch is on, as the window shows it.
fn switched_on(h: &Harness<'static, App>, tier: Tier) -> bool {
    h.get_by_role_and_label(Role::CheckBox, &switch(tier)).accesskit_node().toggled() == Some(Toggled::True)
}

/// Opens the Tiers view and waits for the stored ensembles.
fn open_tiers(h: &mut Harness<'static, App>) {
    h.get_by_label("Tiers").click();
    wait_until(h, "the stored ensembles", |h| h.state().state.ensembles.is_some() && h.query_by_label(&switch(Tier::Tier3)).is_some());
}

/// Types `members` in a tier's members field and picks `method`, as a user does.
fn fill(h: &mut Harness<'static, App>, tier: Tier, members: &str, method: Method) {
    h.get_by_role_and_label(Role::TextInput, &members_field(tier)).focus();
    h.get_by_role_and_label(Role::TextInput, &members_field(tier)).type_text(members);
    h.run_ok();
    h.get_by_role_and_label(Role::ComboBox, &method_choice(tier)).click();
    h.run_ok();
    h.get_by_label(method.as_str()).click();
    h.run_ok();
    assert_eq!(h.get_by_role_and_label(Role::TextInput, &members_field(tier)).value().as_deref(), Some(members));
    assert_eq!(h.state().state.ensemble_fields[&tier].method, method);
}

/// Sends a message from the Chat view and waits for its whole answer. The
/// text is put in the box rather than typed: keystrokes start a pre-prefill,
/// which goes through the ensemble too and would load tier1 before the answer.
fn ask(h: &mut Harness<'static, App>, text: &str) {
    h.get_by_label("Chat").click();
    h.run_ok();
    h.state_mut().state.input = text.to_owned();
    h.run_ok();
    h.get_by_role_and_label(Role::Button, "Send").click();
    h.run_ok();
    assert!(h.state().state.messages.iter().any(|m| m.from_user && m.text == text), "Send sent the message");
    wait_until(h, "the answer", |h| !h.state().state.streaming);
    let s = &h.state().state;
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert!(s.last_answer().is_some_and(|a| !a.text.is_empty()), "{:?}", s.last_answer());
}

#[test]
fn an_ensemble_switched_on_in_the_tiers_view_answers_with_both_models_and_is_kept() {
    // tier2 (the chat's tier) runs Gemma 3, tier1 SmolLM2. tier3, which
    // every background task after an answer uses (task.rs's policies), runs
    // Gemma too: left on SmolLM2 it would share tier1's model (a file is
    // loaded once for every tier that names it), and a background task
    // would make tier1 ready with no ensemble at all.
    let gemma = revis_testkit::gemma3();
    let d = TestDaemon::new().tier_model("tier2", gemma.clone()).tier_model("tier3", gemma).start();
    let data = tempfile::tempdir().unwrap();
    let opts = options(&d.socket, data.path(), 16);
    let store = opts.store.clone().unwrap();
    let mut h = harness(opts);
    ready(&mut h);
    open_tiers(&mut h);
    assert!(!switched_on(&h, Tier::Tier2));
    assert_eq!(h.state().state.ensembles.as_ref().unwrap().get(&Tier::Tier2), None, "nothing stored yet");

    fill(&mut h, Tier::Tier2, "tier2, tier1", Method::Confident);
    h.get_by_role_and_label(Role::CheckBox, &switch(Tier::Tier2)).click();
    wait_until(&mut h, "tier2's ensemble saved", |h| {
        let s = &h.state().state;
        s.ensemble_wanted.is_empty() && s.ensembles.as_ref().is_some_and(|e| e.get(&Tier::Tier2).is_some_and(|t| t.enabled))
    });
    assert!(h.state().state.ensemble_notes.is_empty(), "{:?}", h.state().state.ensemble_notes);
    h.run_ok();
    assert!(h.query_by_label("Members: tier2 (this machine) · tier1 (this machine)").is_some(), "the members, and where they run");
    // The store has it, and the window shows what the store has.
    let stored = revis_orchestrator::ensemble::load_all(&store).remove(&Tier::Tier2).expect("tier2's ensemble in the store");
    let want = EnsembleSpec {
        enabled: true,
        members: vec!["tier2".parse().unwrap(), "tier1".parse().unwrap()],
        method: Method::Confident,
        ..EnsembleSpec::default()
    };
    assert_eq!(stored, want);
    assert_eq!(h.state().state.ensembles.as_ref().unwrap()[&Tier::Tier2], stored);
    assert!(switched_on(&h, Tier::Tier2));
    assert!(h.query_by_label("on: tier2 + tier1 (confident, spans of 16 tokens)").is_some(), "the summary is shown");
    assert_eq!(model_state(&d.socket, Tier::Tier1), ModelState::Unloaded, "nothing has used tier1 yet");

    // The next message is answered by both: tier1's model drafts too.
    ask(&mut h, "Name a colour.");
    let footer = h.state().state.last_answer().and_then(|a| a.footer.clone()).unwrap_or_default();
    assert!(footer.starts_with("tier2 on an ensemble of tier2 and tier1 · "), "the answer says where it ran: {footer:?}");
    assert_eq!(model_state(&d.socket, Tier::Tier2), ModelState::Ready);
    let tier1 = daemon_status(&d.socket).tier(Tier::Tier1).unwrap().clone();
    assert_eq!(tier1.state, ModelState::Ready, "tier1 took part in the answer");
    assert!(tier1.cached_prefixes > 0, "tier1 evaluated the conversation's prompt: {tier1:?}");

    // The next app that opens the store starts with it: shown in the Tiers
    // view, and answering the first message.
    drop(h);
    block_on(async { revis_client::Client::connect(&d.socket).await.unwrap().unload_model(Tier::Tier1).await.unwrap() });
    assert_eq!(model_state(&d.socket, Tier::Tier1), ModelState::Unloaded);
    let again = tempfile::tempdir().unwrap();
    let mut opts = options(&d.socket, again.path(), 16);
    opts.store = Some(store);
    let mut h = harness(opts);
    ready(&mut h);
    open_tiers(&mut h);
    assert!(switched_on(&h, Tier::Tier2), "the stored ensemble is on");
    assert_eq!(h.get_by_role_and_label(Role::TextInput, &members_field(Tier::Tier2)).value().as_deref(), Some("tier2, tier1"));
    assert_eq!(h.get_by_role_and_label(Role::ComboBox, &method_choice(Tier::Tier2)).value().as_deref(), Some("confident"));
    assert!(!switched_on(&h, Tier::Tier1) && !switched_on(&h, Tier::Tier3));
    assert_eq!(model_state(&d.socket, Tier::Tier1), ModelState::Unloaded);
    ask(&mut h, "Name a fruit.");
    assert_eq!(model_state(&d.socket, Tier::Tier1), ModelState::Ready, "the stored ensemble answered");
}

#[test]
fn an_ensemble_that_is_refused_says_why_and_nothing_is_saved() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let opts = options(&d.socket, data.path(), 16);
    let store = opts.store.clone().unwrap();
    let mut h = harness(opts);
    ready(&mut h);
    open_tiers(&mut h);

    // One member is not an ensemble.
    fill(&mut h, Tier::Tier2, "tier2", Method::Confident);
    h.get_by_role_and_label(Role::CheckBox, &switch(Tier::Tier2)).click();
    let why = "an ensemble needs at least two members, it has 1";
    wait_until(&mut h, "the refusal", |h| h.state().state.ensemble_wanted.is_empty() && h.query_by_label(why).is_some());
    assert!(!switched_on(&h, Tier::Tier2), "the switch stays off");
    assert_eq!(h.state().state.ensembles.as_ref().unwrap().get(&Tier::Tier2), None);
    assert!(revis_orchestrator::ensemble::load_all(&store).is_empty(), "nothing saved");

    // Nor is one with a member on a node that is not paired.
    h.state_mut().state.ensemble_fields.get_mut(&Tier::Tier2).unwrap().members.clear();
    fill(&mut h, Tier::Tier2, "tier2, desk/tier3", Method::Cross);
    h.get_by_role_and_label(Role::CheckBox, &switch(Tier::Tier2)).click();
    wait_until(&mut h, "the second refusal", |h| {
        h.state().state.ensemble_wanted.is_empty() && h.state().state.ensemble_notes.get(&Tier::Tier2).is_some_and(|n| n != why)
    });
    let note = h.state().state.ensemble_notes[&Tier::Tier2].clone();
    assert!(note.starts_with("ensemble member desk/tier3: no paired node is called or has the ID \"desk\""), "{note}");
    assert!(h.query_by_label(&note).is_some(), "shown");
    assert!(!switched_on(&h, Tier::Tier2));
    assert!(revis_orchestrator::ensemble::load_all(&store).is_empty(), "nothing saved");
    assert!(h.state().state.errors.is_empty(), "{:?}", h.state().state.errors);
}
