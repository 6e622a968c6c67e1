//! Chat: typing is the typing signal, Enter sends, the answer streams in
//! piece by piece and is stored; Stop stops it, in the daemon too.

use std::time::{Duration, Instant};

use eframe::egui::accesskit::Role;
use eframe::egui::{Key, Modifiers, OutputCommand};
use egui_kittest::kittest::Queryable;
use revis_gui::state::Shown;
use revis_orchestrator::conversation::rules_for;
use revis_orchestrator::prompt::PromptContext;
use revis_orchestrator::{Policies, PrefillPhase, TaskKind};
use revis_store::{MessageState, Role as StoreRole};
use revis_testkit::TestDaemon;

use crate::{block_on, daemon_status, harness, options, ready, wait_until};

/// Types `text` into the message box (the first key is the typing signal).
fn type_message(h: &mut egui_kittest::Harness<'static, revis_gui::App>, text: &str) {
    let input = h.get_by_role_and_label(Role::MultilineTextInput, "Message:");
    input.focus();
    input.type_text(text);
    h.run_ok();
}

/// What the last frame put on the clipboard.
fn copied(h: &egui_kittest::Harness<'static, revis_gui::App>) -> Vec<String> {
    h.output()
        .platform_output
        .commands
        .iter()
        .filter_map(|c| match c {
            OutputCommand::CopyText(t) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

/// Streams `req` to the end with a client of the test's own.
fn generate(socket: &std::path::Path, req: revis_client::GenerateParams) -> revis_client::Done {
    block_on(async {
        let c = revis_client::Client::connect(socket).await.unwrap();
        let mut stream = c.generate(&req).await.unwrap();
        loop {
            match stream.next().await.unwrap() {
                Some(revis_client::Event::Done(d)) => break d,
                Some(_) => {}
                None => panic!("no Done"),
            }
        }
    })
}

/// A fact in the profile of the first test.
const KNOWN: &str = "The user's name is Ada.";

/// The rules the app opens a chat with on the test model (its gears, docs/QUALITY.md).
fn model_rules() -> String {
    rules_for(&revis_models::find(revis_models::DEFAULT_MODEL).unwrap().chat)
}

#[test]
fn a_typed_question_streams_its_answer_and_is_stored() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let opts = options(&d.socket, data.path(), 48);
    let store = opts.store.clone().unwrap();
    // Something in the profile: a new conversation's static part is never
    // empty then, whatever rules the model has.
    store.add_fact(KNOWN, None).unwrap();
    let mut h = harness(opts);
    ready(&mut h);

    type_message(&mut h, "What is the capital of France?");
    // The first keystroke holds background work and starts the pre-prefill.
    wait_until(&mut h, "the typing hold and a pre-prefill", |h| {
        let s = &h.state().state;
        s.gates.typing && matches!(s.phase, Some(PrefillPhase::Queued | PrefillPhase::Computing | PrefillPhase::Ready))
    });
    wait_until(&mut h, "the pre-prefill to finish", |h| h.state().state.phase == Some(PrefillPhase::Ready));

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
    assert!(h.query_by_label(&answer.text).is_some(), "the whole answer is on screen");
    assert!(s.last_stats.as_deref().is_some_and(|t| t.contains("from the warm cache")), "{:?}", s.last_stats);

    // The history is the store's: both messages, complete, and the title.
    let conv = s.current.unwrap();
    let stored = store.messages(conv).unwrap();
    assert_eq!(stored.len(), 2);
    assert_eq!((stored[0].role, stored[0].text.as_str()), (StoreRole::User, "What is the capital of France?"));
    assert_eq!((stored[1].role, stored[1].state), (StoreRole::Assistant, MessageState::Complete));
    assert_eq!(stored[1].text, answer.text);
    assert_eq!(store.conversation(conv).unwrap().unwrap().title, "What is the capital of France?");
    // The answer is the model's greedy answer over gRPC to the message it
    // was asked: as typed, or as tier1 corrected it before the answer.
    let record = revis_orchestrator::conversation::turn_record(&store, stored[1].id).unwrap();
    let asked = record.filter(|r| r.checked_before).and_then(|r| r.check).map_or(stored[0].text.clone(), |c| c.corrected);
    let tier = Policies::default().get(TaskKind::ChatAnswer).tier;
    let mut req = PromptContext { rules: model_rules(), profile: vec![KNOWN.into()], ..Default::default() }.request(tier, &asked);
    req.sampling = revis_client::Sampling { temperature: Some(0.0), ..Default::default() };
    req.max_tokens = Some(48);
    assert_eq!(answer.text, generate(&d.socket, req).text, "the shown answer is the greedy answer to {asked:?}");
    // Copy puts exactly the answer on the clipboard (egui's CopyText command, in
    // the frame that sees the click; the window hands it to the platform).
    h.get_by_label("Copy").click();
    h.step();
    assert_eq!(copied(&h), std::slice::from_ref(&answer.text), "what Copy copied");
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

/// A message the model answers at length.
const STORY: &str = "Write a very long story about a dragon who learns to cook. Make it at least a thousand words.";
/// Tokens the model, left alone, writes at least for [`STORY`] (checked).
const STORY_TOKENS: u32 = 200;

#[test]
fn stop_ends_the_answer_here_and_in_the_daemon() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let opts = options(&d.socket, data.path(), 1500);
    let store = opts.store.clone().unwrap();
    let mut h = harness(opts);
    ready(&mut h);

    // What the app will send for STORY as a new conversation's first message
    // (greedy, as the test's options ask), run uncancelled: the model goes on
    // to the token limit, it does not end on its own early. The app's answer
    // below is a prefix of this one, so it is the same generation.
    let tier = Policies::default().get(TaskKind::ChatAnswer).tier;
    let mut req = PromptContext { rules: model_rules(), ..Default::default() }.request(tier, STORY);
    req.sampling = revis_client::Sampling { temperature: Some(0.0), ..Default::default() };
    req.max_tokens = Some(STORY_TOKENS);
    let uncancelled = generate(&d.socket, req);
    assert_eq!(
        (uncancelled.finish_reason, uncancelled.generated_tokens),
        (revis_client::FinishReason::Length, STORY_TOKENS),
        "the story runs to the limit: {uncancelled:?}"
    );
    let story_time = Duration::from_micros(uncancelled.generate_us);

    type_message(&mut h, STORY);
    h.key_press(Key::Enter);
    h.run_ok();
    let sent = Instant::now();
    wait_until(&mut h, "a few pieces of the answer", |h| {
        h.state().state.last_answer().is_some_and(|a| a.text.split_whitespace().count() >= 5)
    });
    // Still streaming, here and in the daemon, when Stop is pressed.
    assert!(h.state().state.streaming && h.state().state.last_answer().unwrap().shown == Shown::Streaming);
    assert!(daemon_status(&d.socket).busy, "the daemon is generating the answer");
    h.get_by_label("Stop").click();
    let stopped = Instant::now();
    h.run_ok();

    // The daemon goes idle at once: nothing queued, nothing running. Left
    // alone it would have gone on for STORY_TOKENS tokens, which took
    // `story_time` just now: idle by half that after Enter is a cancellation.
    let bound = story_time / 2;
    let busy_for = block_on(async {
        let c = revis_client::Client::connect(&d.socket).await.unwrap();
        loop {
            let s = c.status().await.unwrap();
            if !s.busy && s.queue_depth == 0 {
                break sent.elapsed();
            }
            assert!(sent.elapsed() < bound, "the daemon is still busy {bound:?} after Enter, the story takes {story_time:?}: {s:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    eprintln!("idle {:?} after Stop, {busy_for:?} after Enter; uncancelled the story took {story_time:?}", sent + busy_for - stopped);

    wait_until(&mut h, "the answer to stop", |h| !h.state().state.streaming);
    let s = &h.state().state;
    let answer = s.last_answer().unwrap().clone();
    assert_eq!(answer.shown, Shown::Stopped, "errors: {:?}", s.errors);
    assert!(uncancelled.text.starts_with(&answer.text), "the app's answer {:?} is the story's start", answer.text);
    assert!(h.query_by_label("Stop").is_none() && h.query_by_label("Send").is_some());
    assert!(h.query_by_label("stopped").is_some());

    // Stored as shown, flagged incomplete (never passed off as a whole answer).
    let stored = store.messages(s.current.unwrap()).unwrap();
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[1].state, MessageState::Incomplete);
    assert_eq!(stored[1].text, answer.text);

    // The conversation goes on.
    type_message(&mut h, "What is 2 + 2?");
    h.key_press(Key::Enter);
    wait_until(&mut h, "the next answer", |h| !h.state().state.streaming && h.state().state.messages.len() == 4);
    assert_eq!(h.state().state.last_answer().unwrap().shown, Shown::Complete, "{:?}", h.state().state.errors);
}

#[test]
fn shift_enter_starts_a_new_line_and_enter_sends_both() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let opts = options(&d.socket, data.path(), 8);
    let store = opts.store.clone().unwrap();
    let mut h = harness(opts);
    ready(&mut h);
    type_message(&mut h, "First line");
    h.key_press_modifiers(Modifiers::SHIFT, Key::Enter);
    h.run_ok();
    assert_eq!(h.state().state.input, "First line\n", "Shift+Enter put a new line in the box");
    assert!(!h.state().state.streaming && h.state().state.messages.is_empty(), "and sent nothing");
    type_message(&mut h, "second line");
    assert_eq!(h.state().state.input, "First line\nsecond line");

    h.key_press(Key::Enter);
    h.run_ok();
    assert!(h.state().state.streaming, "Enter sent the message");
    assert_eq!(h.state().state.input, "");
    h.get_by_role_and_label(Role::Label, "First line\nsecond line");
    wait_until(&mut h, "the answer", |h| !h.state().state.streaming);
    let s = &h.state().state;
    let stored = store.messages(s.current.unwrap()).unwrap();
    assert_eq!((stored[0].role, stored[0].text.as_str()), (StoreRole::User, "First line\nsecond line"));
}

/// The app and `revis` commands at once on one database: the app's process
/// holds it, `revis history` and `revis chat` in other processes work beside
/// it, and each sees the other's writes. Before, those commands failed with
/// "the database ... is in use by another process" while the app was open.
#[test]
fn the_app_and_revis_commands_share_the_database() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let opts = options(&d.socket, data.path(), 8);
    let store = opts.store.clone().unwrap();
    let mut h = harness(opts);
    ready(&mut h);
    type_message(&mut h, "Name a colour.");
    h.key_press(Key::Enter);
    h.run_ok();
    wait_until(&mut h, "the answer to finish", |h| !h.state().state.streaming);
    let revis = |args: &[&str], stdin: &str| {
        let mut child = std::process::Command::new(revis_testkit::binary("revis"))
            .args(args)
            .env("REVIS_DATA_DIR", data.path())
            .env("REVIS_SOCKET", &d.socket)
            .env("REVIS_MDNS_INTERFACES", "none")
            .env_remove("REVIS_NODE")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start revis");
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "revis {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    let listed = revis(&["history"], "");
    assert!(listed.contains("Name a colour."), "revis history lists the app's conversation:\n{listed}");
    revis(&["chat", "--new", "--temperature", "0", "--max-tokens", "8"], "Name a fruit.\n");
    let titles: Vec<String> = store.conversations().unwrap().into_iter().map(|c| c.title).collect();
    assert_eq!(titles.len(), 2, "{titles:?}");
    assert!(titles.iter().any(|t| t == "Name a fruit."), "the app's database holds revis chat's turn: {titles:?}");
    assert!(store.is_holder(), "the app's process held the database throughout");
}
