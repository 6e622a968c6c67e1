//! Chat: typing is the typing signal, Enter sends, the answer streams in
//! piece by piece and is stored; Stop stops it, in the daemon too.

use eframe::egui::Key;
use eframe::egui::accesskit::Role;
use egui_kittest::kittest::Queryable;
use revis_client::v1 as pb;
use revis_gui::state::Shown;
use revis_orchestrator::Phase;
use revis_store::{MessageState, Role as StoreRole};
use revis_testkit::TestDaemon;

use crate::{block_on, harness, options, ready, wait_until};

/// Types `text` into the message box (the first key is the typing signal).
fn type_message(h: &mut egui_kittest::Harness<'static, revis_gui::App>, text: &str) {
    let input = h.get_by_role_and_label(Role::MultilineTextInput, "Message:");
    input.focus();
    input.type_text(text);
    h.run_ok();
}

#[test]
fn a_typed_question_streams_its_answer_and_is_stored() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(options(&d.socket, data.path(), 48));
    ready(&mut h);

    type_message(&mut h, "What is the capital of France?");
    // The first keystroke holds background work and starts the pre-prefill.
    wait_until(&mut h, "the typing hold and a pre-prefill", |h| {
        let s = &h.state().state;
        s.gates.typing && matches!(s.phase, Some(Phase::Queued | Phase::Computing | Phase::Ready))
    });
    wait_until(&mut h, "the pre-prefill to finish", |h| h.state().state.phase == Some(Phase::Ready));

    h.key_press(Key::Enter);
    h.run_ok();
    assert!(h.state().state.streaming, "Enter sent the message");
    assert_eq!(h.state().state.input, "", "the box is empty again");
    assert!(h.query_by_label("Stop").is_some(), "a Stop button while it streams");

    // The answer arrives in pieces and is on screen before it is done. (Each
    // frame applies every piece that has arrived, so how many partial
    // renders the test sees depends on how often it gets the CPU.)
    let mut partial_seen = Vec::new();
    wait_until(&mut h, "the answer to finish", |h| {
        let s = &h.state().state;
        let a = s.last_answer().unwrap();
        if a.shown == Shown::Streaming && !a.text.is_empty() && h.query_by_label(&a.text).is_some() {
            partial_seen.push(a.text.clone());
        }
        !s.streaming
    });
    let s = &h.state().state;
    let answer = s.last_answer().unwrap().clone();
    assert_eq!(answer.shown, Shown::Complete, "errors: {:?}", s.errors);
    assert!(answer.pieces >= 3, "the answer streamed in pieces: {answer:?}");
    assert!(!partial_seen.is_empty(), "part of the answer was on screen before the end");
    assert!(partial_seen.windows(2).all(|w| answer.text.starts_with(&w[0]) && w[1].starts_with(&w[0])));
    assert!(answer.text.contains("Paris"), "{}", answer.text);
    assert!(h.query_by_label(&answer.text).is_some(), "the whole answer is on screen");
    assert!(s.last_stats.as_deref().is_some_and(|t| t.contains("from the warm cache")), "{:?}", s.last_stats);
    assert!(h.query_by_label("Copy").is_some(), "the answer can be copied");

    // The history is the store's: both messages, complete, and the title.
    let store = s.store.clone().unwrap();
    let conv = s.current.unwrap();
    let stored = store.messages(conv).unwrap();
    assert_eq!(stored.len(), 2);
    assert_eq!((stored[0].role, stored[0].text.as_str()), (StoreRole::User, "What is the capital of France?"));
    assert_eq!((stored[1].role, stored[1].state), (StoreRole::Assistant, MessageState::Complete));
    assert_eq!(stored[1].text, answer.text);
    assert_eq!(store.conversation(conv).unwrap().unwrap().title, "What is the capital of France?");
    wait_until(&mut h, "the conversation list to show the title", |h| {
        h.query_by_role_and_label(Role::Button, "What is the capital of France?").is_some()
    });

    // A new conversation, then back: the history comes from the store.
    h.get_by_label("New conversation").click();
    wait_until(&mut h, "a new conversation", |h| h.state().state.current != Some(conv) && h.state().state.messages.is_empty());
    h.get_by_role_and_label(Role::Button, "What is the capital of France?").click();
    wait_until(&mut h, "the first conversation again", |h| h.state().state.current == Some(conv));
    assert_eq!(h.state().state.messages.len(), 2);
    assert_eq!(h.state().state.messages[1].text, answer.text);
}

#[test]
fn stop_ends_the_answer_here_and_in_the_daemon() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(options(&d.socket, data.path(), 1500));
    ready(&mut h);
    type_message(&mut h, "Write a very long story about a dragon who learns to cook. Make it at least a thousand words.");
    h.key_press(Key::Enter);
    h.run_ok();
    let sent = std::time::Instant::now();
    wait_until(&mut h, "a few pieces of the answer", |h| {
        h.state().state.last_answer().is_some_and(|a| a.text.split_whitespace().count() >= 5)
    });
    h.get_by_label("Stop").click();
    let streamed_ms = sent.elapsed().as_millis() as u64;
    h.run_ok();
    wait_until(&mut h, "the answer to stop", |h| !h.state().state.streaming);
    let s = &h.state().state;
    let answer = s.last_answer().unwrap().clone();
    assert_eq!(answer.shown, Shown::Stopped, "errors: {:?}", s.errors);
    assert!(h.query_by_label("Stop").is_none() && h.query_by_label("Send").is_some());
    assert!(h.query_by_label("stopped").is_some());

    // Stored as shown, flagged incomplete (never passed off as a whole answer).
    let stored = s.store.clone().unwrap().messages(s.current.unwrap()).unwrap();
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[1].state, MessageState::Incomplete);
    assert_eq!(stored[1].text, answer.text);

    // The daemon dropped the generation: the next request does not queue
    // behind the rest of a 1500-token story (hundreds of tokens more than
    // the few shown; the bound scales with this machine's speed now).
    let done = block_on(async {
        let mut c = revis_client::Client::connect(&d.socket).await.unwrap();
        let req = pb::GenerateRequest { messages: vec![revis_client::message(pb::Role::User, "Hi")], max_tokens: 1, ..Default::default() };
        let mut stream = c.generate(req).await.unwrap();
        loop {
            match stream.message().await.unwrap().and_then(|e| e.event) {
                Some(pb::generate_event::Event::Done(d)) => break d,
                Some(_) => {}
                None => panic!("no Done"),
            }
        }
    });
    let bound = (10 * streamed_ms).max(1000);
    assert!(done.queue_ms < bound, "waited {} ms behind the stopped answer (bound {bound} ms)", done.queue_ms);

    // The conversation goes on.
    type_message(&mut h, "What is 2 + 2?");
    h.key_press(Key::Enter);
    wait_until(&mut h, "the next answer", |h| !h.state().state.streaming && h.state().state.messages.len() == 4);
    assert_eq!(h.state().state.last_answer().unwrap().shown, Shown::Complete, "{:?}", h.state().state.errors);
}
