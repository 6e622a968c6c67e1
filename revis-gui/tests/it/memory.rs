//! The Memory view as a person uses it: each fact shown with where and
//! when it was said, one forgotten, one edited, one told, a refusal that
//! names its limit, then everything forgotten. What the window shows and
//! what the store holds agree at every step. The switch for learning is
//! kept for the app's next start.

use eframe::egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use revis_gui::App;
use revis_gui::state::View;
use revis_store::Store;
use revis_testkit::TestDaemon;

use crate::{harness, options, ready, retype, wait_until};

fn texts(store: &Store) -> Vec<String> {
    store.facts().unwrap().into_iter().map(|f| f.text).collect()
}

/// Waits until the view shows `want` (what a change leaves), then checks
/// the store holds exactly that too: stored = shown.
#[track_caller]
fn shown_and_stored(h: &mut Harness<'static, App>, store: &Store, want: &[&str], what: &str) {
    wait_until(h, what, |h| h.state().state.facts.as_ref().is_some_and(|f| f.iter().map(|f| f.text.as_str()).eq(want.iter().copied())));
    assert_eq!(texts(store), want, "{what}: stored as shown");
}

#[test]
fn the_person_sees_forgets_edits_and_tells_what_revis_knows() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let opts = options(&d.socket, data.path(), 8);
    let store = opts.store.clone().unwrap();
    let conversation = store.create_conversation("").unwrap();
    let told = store.append_user(conversation, "Hello! I play the cello in Lyon.").unwrap();
    let cello = store.add_fact_said("The user plays the cello.", Some(told), Some("I play the cello in Lyon.")).unwrap();
    let lyon = store.add_fact_said("The user said: \"I play the cello in Lyon\"", Some(told), Some("I play the cello in Lyon")).unwrap();
    let gui_toml = opts.config.with_file_name("gui.toml");
    let mut h = harness(opts.clone());
    ready(&mut h);
    h.state_mut().open_view(View::Memory);
    shown_and_stored(&mut h, &store, &["The user plays the cello.", "The user said: \"I play the cello in Lyon\""], "the facts");
    assert!(h.query_by_label("The user plays the cello.").is_some());
    let from = format!("from what you said in conversation {conversation} (message {told}), just now: \"I play the cello in Lyon.\"");
    assert!(h.query_by_label(&from).is_some(), "where and when it was said, and the words it rests on");

    // Forgotten: gone from the window and the store.
    h.get_by_label(&format!("Forget fact {cello}")).click();
    shown_and_stored(&mut h, &store, &["The user said: \"I play the cello in Lyon\""], "the fact forgotten");

    // Edited: the person's words, kept as theirs.
    h.get_by_label(&format!("Edit fact {lyon}")).click();
    h.run_ok();
    retype(&mut h, Role::TextInput, &format!("Fact {lyon}:"), "I play the viola in Lyon");
    h.get_by_label("Save").click();
    shown_and_stored(&mut h, &store, &["The user said: \"I play the viola in Lyon\""], "the fact edited");

    // Told directly; and a refusal that names its limit changes nothing.
    retype(&mut h, Role::TextInput, "Tell revis:", "My cat is called Tom.");
    h.get_by_label("Add").click();
    let both = ["The user said: \"I play the viola in Lyon\"", "The user said: \"My cat is called Tom.\""];
    shown_and_stored(&mut h, &store, &both, "the fact told");
    retype(&mut h, Role::TextInput, "Tell revis:", &"x".repeat(200));
    h.get_by_label("Add").click();
    wait_until(&mut h, "the refusal", |h| matches!(&h.state().state.facts_note, Some(Err(m)) if m.contains("at most 160")));
    shown_and_stored(&mut h, &store, &both, "nothing changed by the refusal");

    h.get_by_label("Forget everything").click();
    shown_and_stored(&mut h, &store, &[], "everything forgotten");
    assert!(h.query_by_label("revis has not learned anything about you yet.").is_some());

    // Learning turned off stays off when the app starts again.
    assert_eq!(h.state().state.learning, Some(true), "on as revis starts");
    h.get_by_label("Learn from what I say in chats").click();
    wait_until(&mut h, "the switch kept", |_| std::fs::read_to_string(&gui_toml).is_ok_and(|t| t.contains("learn = false")));
    drop(h);
    let mut h = harness(opts);
    ready(&mut h);
    assert_eq!(h.state().state.learning, Some(false), "off after a restart, as the person left it");
}
