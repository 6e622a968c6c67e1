//! Conversations as a person manages them: searched by title and text,
//! renamed, deleted with an undo; an answer regenerated, a message edited
//! and sent again, a stopped answer continued. What the window shows and
//! what the store holds agree at every step.

use std::time::Instant;

use eframe::egui::Key;
use eframe::egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use revis_gui::App;
use revis_gui::state::Shown;
use revis_store::{ConversationId, MessageState, Role as StoreRole, Store};
use revis_testkit::TestDaemon;

use crate::{harness, options, ready, retype, wait_until};

/// A conversation with one question and its answer, stored as the app stores them.
fn stored(store: &Store, title: &str, question: &str, answer: &str) -> ConversationId {
    let c = store.create_conversation(title).unwrap();
    store.append_user(c, question).unwrap();
    let r = store.begin_reply(c, "tier2").unwrap();
    store.complete_reply(r, answer).unwrap();
    c
}

#[test]
fn conversations_are_searched_renamed_and_deleted_with_an_undo() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let opts = options(&d.socket, data.path(), 16);
    let store = opts.store.clone().unwrap();
    let safari = stored(&store, "Packing list", "What should I pack for a zebra safari?", "A hat.");
    stored(&store, "Soup", "How do I make leek soup?", "Slowly.");
    let mut h = harness(opts);
    ready(&mut h);

    // "zebra" is in a message of the first, in no title: the text is searched too.
    h.get_by_role_and_label(Role::TextInput, "Search conversations:").focus();
    h.run_ok();
    h.get_by_role_and_label(Role::TextInput, "Search conversations:").type_text("zebra");
    wait_until(&mut h, "the search's hits", |h| h.state().state.search_hits.as_ref().is_some_and(|(q, _)| q == "zebra"));
    assert!(h.query_by_label("Packing list").is_some());
    assert!(h.query_by_label("Soup").is_none(), "a conversation without the word is not listed");
    retype(&mut h, Role::TextInput, "Search conversations:", "sou");
    assert!(h.query_by_label("Soup").is_some() && h.query_by_label("Packing list").is_none(), "titles match as typed");
    retype(&mut h, Role::TextInput, "Search conversations:", "");
    h.key_press(Key::Backspace);
    h.run_ok();
    assert!(h.query_by_label("Soup").is_some() && h.query_by_label("Packing list").is_some());

    h.get_by_label("Packing list").click();
    wait_until(&mut h, "the conversation to open", |h| h.state().state.current == Some(safari));
    h.get_by_label("Rename").click();
    h.run_ok();
    retype(&mut h, Role::TextInput, "New title:", "Safari");
    h.key_press(Key::Enter);
    wait_until(&mut h, "the new title", |h| h.state().state.conversations.iter().any(|c| c.title == "Safari"));
    assert_eq!(store.conversation(safari).unwrap().unwrap().title, "Safari", "stored as shown");

    // Deleted: gone from the list at once, still stored while its undo is offered.
    h.get_by_label("Delete").click();
    wait_until(&mut h, "another conversation to open", |h| h.state().state.current.is_some_and(|c| c != safari));
    assert!(h.query_by_label("Safari").is_none());
    assert!(store.conversation(safari).unwrap().is_some());
    h.get_by_label("Undo").click();
    wait_until(&mut h, "the conversation back", |h| h.state().state.current == Some(safari));
    assert!(h.query_by_label("Safari").is_some());
    assert_eq!(store.messages(safari).unwrap().len(), 2, "nothing of it was lost");

    // Deleted again and its undo let go: deleted for good, with its messages.
    h.get_by_label("Delete").click();
    h.run_ok();
    h.state_mut().state.pending_delete.as_mut().unwrap().1 = Instant::now();
    wait_until(&mut h, "the deletion", |h| {
        h.state().state.pending_delete.is_none() && !h.state().state.conversations.iter().any(|c| c.id == safari)
    });
    assert!(store.conversation(safari).unwrap().is_none());
    assert!(h.query_by_label("Undo").is_none());
}

/// Waits until the answer on screen has ended and has its stored ids.
fn answered(h: &mut Harness<'static, App>, what: &str) {
    wait_until(h, what, |h| {
        let s = &h.state().state;
        !s.streaming && s.last_answer().is_some_and(|m| m.id.is_some() && m.shown != Shown::Streaming)
    });
}

/// The conversation as stored: (role, text, state) of each message.
fn as_stored(store: &Store, c: ConversationId) -> Vec<(StoreRole, String, MessageState)> {
    store.messages(c).unwrap().into_iter().map(|m| (m.role, m.text, m.state)).collect()
}

/// What the window shows of the conversation, as (from the user, text).
fn as_shown(h: &Harness<'static, App>) -> Vec<(bool, String)> {
    h.state().state.messages.iter().map(|m| (m.from_user, m.text.clone())).collect()
}

#[test]
fn an_answer_is_regenerated_a_message_edited_and_a_stopped_answer_continued() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let opts = options(&d.socket, data.path(), 32);
    let store = opts.store.clone().unwrap();
    let mut h = harness(opts);
    ready(&mut h);
    let conv = h.state().state.current.unwrap();

    let input = h.get_by_role_and_label(Role::MultilineTextInput, "Message:");
    input.focus();
    input.type_text("Name three colours.");
    h.run_ok();
    h.key_press(Key::Enter);
    answered(&mut h, "the first answer");
    let first = h.state().state.last_answer().unwrap().id.unwrap();

    // Regenerated: the question stays, the old answer leaves the store, a new one (a new id) takes its place.
    h.get_by_label("Regenerate").click();
    answered(&mut h, "the regenerated answer");
    let again = h.state().state.last_answer().unwrap().id.unwrap();
    assert!(again.seq > first.seq, "a new answer, not the old one rewritten: {first:?} then {again:?}");
    let s = as_stored(&store, conv);
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!((s[0].0, s[0].1.as_str()), (StoreRole::User, "Name three colours."));
    assert_eq!(as_shown(&h), s.iter().map(|(r, t, _)| (*r == StoreRole::User, t.clone())).collect::<Vec<_>>(), "stored = shown");

    // Edited and sent again: the new text replaces the message and what followed it.
    h.get_by_label("Edit").click();
    h.run_ok();
    retype(&mut h, Role::MultilineTextInput, "Edit message:", "Name two fruits.");
    h.get_by_label("Send edited").click();
    answered(&mut h, "the answer to the edited message");
    let s = as_stored(&store, conv);
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!(s[0].1, "Name two fruits.");
    assert_eq!(s[1].2, MessageState::Complete);
    assert_eq!(as_shown(&h), s.iter().map(|(r, t, _)| (*r == StoreRole::User, t.clone())).collect::<Vec<_>>(), "stored = shown");

    // Stopped after a few pieces, then continued: one answer, its first part kept as it was.
    let input = h.get_by_role_and_label(Role::MultilineTextInput, "Message:");
    input.focus();
    input.type_text("Tell me a long story about a lighthouse keeper.");
    h.run_ok();
    h.key_press(Key::Enter);
    wait_until(&mut h, "a few pieces of the answer", |h| h.state().state.last_answer().is_some_and(|m| m.pieces >= 3));
    h.key_press(Key::Escape);
    answered(&mut h, "the stopped answer");
    let stopped = h.state().state.last_answer().unwrap().clone();
    assert_eq!(stopped.shown, Shown::Stopped);
    let s = as_stored(&store, conv);
    assert_eq!((s[3].1.as_str(), s[3].2), (stopped.text.as_str(), MessageState::Incomplete), "what was shown is stored, flagged");
    h.get_by_label("Continue").click();
    answered(&mut h, "the continued answer");
    let done = h.state().state.last_answer().unwrap().clone();
    assert_eq!(done.id, stopped.id, "the same answer goes on");
    assert!(done.text.starts_with(&stopped.text) && done.text.len() > stopped.text.len(), "{:?} then {:?}", stopped.text, done.text);
    let s = as_stored(&store, conv);
    assert_eq!(s.len(), 4, "{s:?}");
    assert_eq!((s[3].1.as_str(), s[3].2), (done.text.as_str(), MessageState::Complete), "stored = shown");
}
