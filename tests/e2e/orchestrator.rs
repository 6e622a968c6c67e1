//! The orchestrator against a real daemon: pre-prefill makes the next
//! answer start from a warm cache, and structured tasks return JSON that
//! validates.

use revis_client::Runner;
use revis_orchestrator::prompt::{PromptContext, Speaker, Turn};
use revis_orchestrator::{EnterOutcome, Gates, PrePrefill, PrefillPhase, structured};
use revis_testkit::TestDaemon;
use serde_json::json;

fn context() -> PromptContext {
    PromptContext {
        rules: "You are revis, a helpful assistant. Answer briefly and kindly.".repeat(8),
        profile: vec!["The user's name is Ada.".into(), "Ada likes astronomy.".into()],
        summary: Some("Ada asked about telescopes earlier.".into()),
        turns: vec![
            Turn { speaker: Speaker::User, text: "Hello!".into() },
            Turn { speaker: Speaker::Assistant, text: "Hello Ada, how can I help?".into() },
        ],
    }
}

#[tokio::test]
async fn typing_warms_the_cache_and_the_answer_reuses_all_of_it() {
    let d = TestDaemon::new().start();
    let client = d.client().await;
    let gates = Gates::new();
    let pre = PrePrefill::new(client.clone(), gates.clone());
    let ctx = context();

    pre.typing_started(revis_client::Tier::Tier2, ctx.static_messages());
    assert!(gates.state().typing, "typing holds background work");
    // The user types for a while: the prefill gets to the daemon.
    let _ = pre.watch().wait_for(|p| *p != PrefillPhase::Queued).await;
    let outcome = pre.enter().await;
    assert!(matches!(outcome, EnterOutcome::Waited | EnterOutcome::WasReady), "{outcome:?}");

    let mut req = ctx.request(revis_client::Tier::Tier2, "Which planet is the largest?");
    req.sampling = revis_client::Sampling { temperature: Some(0.0), ..Default::default() };
    req.max_tokens = Some(24);
    let mut streamed = String::new();
    let done = Runner::generate(&client, req.clone(), |t| streamed.push_str(t)).await.unwrap();
    assert_eq!(streamed, done.text);
    // The static part (everything but the new message) came from the warm cache.
    let static_only = client
        .prefill(&revis_client::PrefillParams { tier: revis_client::Tier::Tier2, messages: ctx.static_messages(), ..Default::default() })
        .await
        .unwrap();
    assert!(
        done.cached_tokens >= static_only.prompt_tokens,
        "{} cached of a {}-token static part",
        done.cached_tokens,
        static_only.prompt_tokens
    );
    pre.consumed();
}

#[tokio::test]
async fn profile_extraction_returns_json_that_validates() {
    let d = TestDaemon::new().start();
    let client = d.client().await;
    let schema = json!({
        "type": "object",
        "properties": {
            "facts": {"type": "array", "items": {"type": "string", "maxLength": 80}, "maxItems": 5}
        },
        "required": ["facts"],
        "additionalProperties": false
    });
    let task = "Extract facts about the user from this message, as short sentences: \
                'Hi, I am Ada, I live in London and I love astronomy.'";
    let v = structured::run(&client, revis_client::Tier::Tier3, task, &schema).await.unwrap();
    let facts = v["facts"].as_array().unwrap_or_else(|| panic!("not the schema's shape: {v}"));
    assert!(facts.len() <= 5);
    assert!(facts.iter().all(|f| f.as_str().is_some_and(|s| s.chars().count() <= 80)), "{v}");
    assert_eq!(v.as_object().unwrap().len(), 1, "no other keys: {v}");
}

/// Three turns through the orchestrator, a client restart in between: the
/// history is in the store, the warm turn reuses its whole static part, and
/// the facts the user stated are extracted in the background and stored.
#[tokio::test]
async fn a_conversation_persists_across_client_restarts() {
    use revis_orchestrator::Policies;
    use revis_orchestrator::conversation::Chat;
    use revis_store::{MessageState, Store};

    let d = TestDaemon::new().start();
    let db = tempfile::tempdir().unwrap();
    let greedy = revis_client::Sampling { temperature: Some(0.0), ..Default::default() };
    let conversation = {
        let store = Store::open(db.path()).unwrap().store;
        let conv = store.create_conversation("test").unwrap();
        let mut chat = Chat::new(d.client().await, store.clone(), conv, Policies::default());
        chat.sampling = greedy;
        chat.max_tokens = Some(32);
        chat.audit = true;
        chat.send("Hi! My name is Ada and I live in London.", |_| {}).await.unwrap();
        // Turn 2: the user types first, so the static part is prefilled.
        chat.typing_started().unwrap();
        let _ = chat.pre_prefill().watch().wait_for(|p| *p == PrefillPhase::Ready).await;
        let static_len = client_prefill_len(&d, &chat).await;
        let done = chat.send("What is the capital of France?", |_| {}).await.unwrap();
        assert!(done.cached_tokens >= static_len, "turn 2 reused {} of a {static_len}-token static part", done.cached_tokens);
        chat.background().idle().await;
        assert_facts_are_grounded(&store, conv);
        conv
    };
    // The client restarts: a new store handle on the same directory, a new Chat.
    let store = Store::open(db.path()).unwrap().store;
    let mut chat = Chat::new(d.client().await, store.clone(), conversation, Policies::default());
    chat.sampling = greedy;
    chat.max_tokens = Some(32);
    chat.audit = true;
    assert_eq!(chat.context().unwrap().turns.len(), 4, "both earlier turns are back");
    chat.send("Thank you!", |_| {}).await.unwrap();
    chat.background().idle().await;
    let messages = store.messages(conversation).unwrap();
    assert_eq!(messages.len(), 6);
    assert!(messages.iter().all(|m| m.state == MessageState::Complete));
    assert_eq!(messages[2].text, "What is the capital of France?");
    // Every answer was audited in the background, and the verdict stored.
    for reply in messages.iter().filter(|m| m.role == revis_store::Role::Assistant) {
        let audit = store.setting(&revis_orchestrator::conversation::audit_key(reply.id)).unwrap().expect("an audit");
        assert!(audit["ok"].is_boolean() && audit["problems"].is_array(), "{audit}");
    }
}

/// Every fact in the profile rests on words of the user's message it names,
/// exactly as written (never a world fact from a question or the
/// assistant's reply): a fact shown as the user's words is exactly those
/// words, one in other words follows from them; and each is stored once.
fn assert_facts_are_grounded(store: &revis_store::Store, conv: revis_store::ConversationId) {
    use revis_orchestrator::conversation::follows;
    let said: std::collections::HashMap<revis_store::MessageId, String> =
        store.messages(conv).unwrap().into_iter().filter(|m| m.role == revis_store::Role::User).map(|m| (m.id, m.text)).collect();
    let stored = store.facts().unwrap();
    for f in &stored {
        let source = f.source.unwrap_or_else(|| panic!("{f:?} names no message"));
        let message = said.get(&source).unwrap_or_else(|| panic!("{f:?} names {source:?}, which is not a message of the user's"));
        let words = f.said.as_deref().unwrap_or_else(|| panic!("{f:?} keeps no words of the user's"));
        assert!(message.contains(words), "{f:?} rests on words not in {message:?}");
        match f.text.strip_prefix("The user said: \"") {
            Some(quoted) => assert_eq!(quoted.strip_suffix('"'), Some(words), "a quotation is exactly the user's words"),
            None => assert!(follows(&f.text, words), "{f:?} does not follow from the words it rests on"),
        }
    }
    let distinct: std::collections::BTreeSet<String> = stored.iter().map(|f| f.text.to_lowercase()).collect();
    assert_eq!(distinct.len(), stored.len(), "each fact once: {stored:?}");
}

/// How many tokens the static part of the chat's next prompt is.
async fn client_prefill_len<D: Runner>(d: &revis_testkit::Running, chat: &revis_orchestrator::conversation::Chat<D>) -> u32 {
    let req = revis_client::PrefillParams {
        tier: revis_client::Tier::Tier2,
        messages: chat.context().unwrap().static_messages(),
        ..Default::default()
    };
    // The cache already holds it, so this evaluates nothing new.
    d.client().await.prefill(&req).await.unwrap().prompt_tokens
}

/// `revis ARGS --socket` on `d`'s socket, with its data in `data` and every stream piped.
fn spawn_revis(d: &revis_testkit::Running, data: &std::path::Path, args: &[&str]) -> std::process::Child {
    use std::process::{Command, Stdio};
    Command::new(revis_testkit::binary("revis"))
        .args(args)
        .arg("--socket")
        .arg(&d.socket)
        .env("REVIS_DATA_DIR", data)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `revis chat` with piped input: one message per line, each answer printed,
/// and the conversation is there for `revis history` afterwards.
#[test]
fn piped_chat_answers_each_line_and_history_keeps_it() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let revis = |args: &[&str], input: &str| {
        let mut child = spawn_revis(&d, data.path(), args);
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let first = "What is the capital of France?";
    let out = revis(&["chat", "--new", "--temperature", "0", "--max-tokens", "24"], &format!("{first}\n\nSay hello.\n"));
    // Each answer is printed as it is stored, and the first is the model's
    // greedy answer to that message in a new conversation.
    let replies: Vec<String> = {
        let store = revis_store::Store::open(&data.path().join("db")).unwrap().store;
        let conv = store.conversations().unwrap()[0].id;
        store.messages(conv).unwrap().into_iter().filter(|m| m.role == revis_store::Role::Assistant).map(|m| m.text).collect()
    };
    assert_eq!(replies.len(), 2, "two answers: {replies:?}");
    assert_eq!(out, format!("{}\n{}\n", replies[0], replies[1]), "what was printed is what was stored");
    let alone = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let tier = revis_orchestrator::Policies::default().get(revis_orchestrator::TaskKind::ChatAnswer).tier;
        let mut req = PromptContext { rules: default_model_rules(), ..Default::default() }.request(tier, first);
        req.sampling = revis_client::Sampling { temperature: Some(0.0), ..Default::default() };
        req.max_tokens = Some(24);
        Runner::generate(&d.client().await, req, |_| {}).await.unwrap().text
    });
    assert_eq!(replies[0], alone, "the first answer is the greedy answer to the first message");
    let list = revis(&["history"], "");
    assert!(list.contains("What is the capital of France?"), "{list}");
    let id = list.split_whitespace().next().unwrap();
    let shown = revis(&["history", "show", id], "");
    assert_eq!(shown.matches("you: ").count(), 2, "{shown}");
    assert_eq!(shown.matches("revis: ").count(), 2, "{shown}");
}

/// A prompt whose answer runs long (hundreds of tokens at greedy sampling).
const LONG: &str = "Write a long story about a dragon who learns to bake bread, with many details.";

/// A chat whose periodic save never comes during the test: whatever the store
/// holds of a cut reply was saved because the turn ended, not by the timer.
async fn chat_without_periodic_saves(
    d: &revis_testkit::Running,
    db: &std::path::Path,
) -> (revis_orchestrator::conversation::Chat<revis_client::Client>, revis_store::Store) {
    use revis_orchestrator::{Policies, conversation::Chat};
    let store = revis_store::Store::open(db).unwrap().store;
    let conv = store.create_conversation("cut").unwrap();
    let mut chat = Chat::new(d.client().await, store.clone(), conv, Policies::default());
    chat.sampling = revis_client::Sampling { temperature: Some(0.0), ..Default::default() };
    chat.max_tokens = Some(400);
    chat.partial_save_every = std::time::Duration::from_secs(3600);
    (chat, store)
}

/// The reply a cut turn left: incomplete, with exactly `shown`.
fn assert_cut_reply(messages: Vec<revis_store::StoredMessage>, shown: &str) {
    use revis_store::{MessageState, Role};
    let reply = messages.last().expect("the turn's messages");
    assert_eq!(reply.role, Role::Assistant);
    assert_eq!(reply.state, MessageState::Incomplete, "a cut reply is marked incomplete");
    assert!(!shown.is_empty(), "some text was shown before the cut");
    assert_eq!(reply.text, shown, "the store holds exactly the text that was shown");
}

/// Stop (the GUI drops the turn's future) right after text was shown and
/// before any periodic save: the store holds exactly that text, incomplete.
#[tokio::test]
async fn a_stopped_answer_keeps_exactly_the_text_shown() {
    let d = TestDaemon::new().start();
    let db = tempfile::tempdir().unwrap();
    let (chat, store) = chat_without_periodic_saves(&d, db.path()).await;
    let shown = std::sync::Mutex::new(String::new());
    let (pieces, stop) = (std::sync::atomic::AtomicUsize::new(0), tokio::sync::Notify::new());
    tokio::select! {
        r = chat.send(LONG, |t| {
            shown.lock().unwrap().push_str(t);
            if pieces.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == 5 {
                stop.notify_one();
            }
        }) => panic!("the answer ended before the test stopped it: {r:?}"),
        () = stop.notified() => {}
    }
    // The turn's future is dropped here, as Stop drops it; the reply is written by the writer thread.
    chat.saved().await.unwrap();
    let shown = shown.into_inner().unwrap();
    assert_cut_reply(store.messages(chat.conversation).unwrap(), &shown);
}

/// The daemon dies mid-answer (kill -9): the turn fails, and the store holds
/// exactly the text shown before it did, incomplete, by the time `send` returns.
#[tokio::test]
async fn a_failed_stream_keeps_exactly_the_text_shown() {
    let d = TestDaemon::new().start();
    let db = tempfile::tempdir().unwrap();
    let (chat, store) = chat_without_periodic_saves(&d, db.path()).await;
    let mut shown = String::new();
    let mut pieces = 0;
    let err = chat
        .send(LONG, |t| {
            shown.push_str(t);
            pieces += 1;
            if pieces == 5 {
                d.signal(libc::SIGKILL);
            }
        })
        .await
        .expect_err("the daemon was killed mid-answer");
    assert!(pieces >= 5, "the answer ended before the daemon was killed: {err}");
    assert_cut_reply(store.messages(chat.conversation).unwrap(), &shown);
}

/// Ctrl-C in `revis chat` mid-answer: revis ends (130) only after what it
/// printed is saved; `revis history show` has exactly that text, flagged.
#[test]
fn ctrl_c_in_revis_chat_keeps_exactly_the_text_printed() {
    use std::io::{Read, Write};
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let mut child = spawn_revis(
        &d,
        data.path(),
        &["chat", "--new", "--temperature", "0", "--max-tokens", "400", "--save-every-ms", "3600000", "--no-loop-guard"],
    );
    child.stdin.take().unwrap().write_all(format!("{LONG}\n").as_bytes()).unwrap();
    let printed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut stdout = child.stdout.take().unwrap();
    let reader = {
        let printed = printed.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                printed.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while printed.lock().unwrap().len() < 40 {
        assert!(std::time::Instant::now() < deadline, "revis chat printed no answer within 60 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SAFETY: kill with the PID of a child we started and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let printed = String::from_utf8(printed.lock().unwrap().clone()).unwrap();
    // The answer, then the line end revis adds when it stops.
    let printed = printed.strip_suffix('\n').unwrap_or_else(|| panic!("no line end after the stopped answer: {printed:?}"));

    let store = revis_store::Store::open(&data.path().join("db")).unwrap().store;
    let conv = store.conversations().unwrap()[0].id;
    assert_cut_reply(store.messages(conv).unwrap(), printed);
    assert_eq!(status.code(), Some(130), "revis ends as Ctrl-C ends a process: {status:?}; stderr: {stderr}");
    drop(store);
    let out = std::process::Command::new(revis_testkit::binary("revis"))
        .args(["history", "show", &conv.to_string()])
        .env("REVIS_DATA_DIR", data.path())
        .output()
        .unwrap();
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(shown.contains(&format!("revis [incomplete: cut off before it ended]: {printed}\n")), "{shown}");
}

/// The three gears of a turn with the real model: tier1 checks the draft
/// before Enter and the answer uses it, tier2's checklist is evaluated but
/// never streamed nor stored as the answer, and tier3 writes a follow-up
/// when asked, stored with the turn and seen by the next prompt.
#[tokio::test]
async fn the_checklist_stays_private_and_tier3_follows_up_when_asked() {
    use revis_orchestrator::Policies;
    use revis_orchestrator::conversation::{Chat, EscalatedBy, Escalation, TurnNote};
    use revis_orchestrator::structured::TAG_OPEN;
    use revis_store::{Role, Store};

    let d = TestDaemon::new().start();
    let db = tempfile::tempdir().unwrap();
    let store = Store::open(db.path()).unwrap().store;
    let conv = store.create_conversation("gears").unwrap();
    let mut chat = Chat::new(d.client().await, store.clone(), conv, Policies::default());
    chat.sampling = revis_client::Sampling { temperature: Some(0.0), ..Default::default() };
    chat.max_tokens = Some(24);
    chat.deep_max_tokens = Some(32);
    chat.checklist = true;
    let mut notes = chat.notes();

    let typed = "Could you explain why the sky looks blue during the day and red at sunset?";
    let mut checked = chat.draft_checked();
    chat.typing_started().unwrap();
    chat.draft(typed);
    checked.wait_for(|t| t.as_deref() == Some(typed)).await.unwrap();
    chat.typing_stopped();
    let mut streamed = String::new();
    let done = chat.send(typed, |t| streamed.push_str(t)).await.unwrap();
    assert_eq!(streamed, done.text, "the stream is the answer");
    let messages = store.messages(conv).unwrap();
    let reply = messages.iter().rfind(|m| m.role == Role::Assistant).unwrap();
    assert_eq!(reply.text, streamed, "the stored reply is what was shown");
    let record = chat.record(reply.id).unwrap().expect("the turn's record");
    assert!(record.check.is_some() && record.checked_before, "tier1's check of the draft was used: {record:?}");
    let private = record.notes.clone().expect("the checklist's notes");
    assert!(private.starts_with(&format!("{TAG_OPEN}\nLANGUAGE: English\nTONE:")), "{private}");
    assert!(!streamed.contains(TAG_OPEN) && !streamed.contains(&private), "the notes never reach the user: {streamed}");

    // Without --auto-deep an escalation only says so: the user asks.
    assert!(chat.deepen(reply.id).await, "the user asks");
    assert!(!chat.deepen(reply.id).await, "once per reply");
    chat.background().idle().await;
    let record = chat.record(reply.id).unwrap().unwrap();
    let deep = record.deep.clone().expect("tier3's follow-up is stored with the turn");
    assert!(!deep.is_empty());
    // tier3 wrote because the user asked: the record says so. If tier1's
    // check or the checklist escalated first, that was shown, not queued.
    assert_eq!(record.escalation, Some(Escalation { by: EscalatedBy::User, why: None }), "{record:?}");
    let seen: Vec<TurnNote> = std::iter::from_fn(|| notes.try_recv().ok()).collect();
    let escalations: Vec<(EscalatedBy, bool)> = seen
        .iter()
        .filter_map(|n| match n {
            TurnNote::Escalated { reply: r, escalation, queued } if *r == reply.id => Some((escalation.by, *queued)),
            _ => None,
        })
        .collect();
    let mut expected = Vec::new();
    if record.check.as_ref().unwrap().escalate {
        expected.push((EscalatedBy::Check, false));
    } else if revis_orchestrator::checklist::parse(&private).escalate == Some(true) {
        expected.push((EscalatedBy::Checklist, false));
    }
    expected.push((EscalatedBy::User, true));
    assert_eq!(escalations, expected, "{seen:#?}");
    assert!(seen.contains(&TurnNote::Deep { reply: reply.id, text: deep.clone() }), "{seen:#?}");
    assert!(chat.context().unwrap().turns.iter().any(|t| t.text.ends_with(&deep)), "the next prompt sees the follow-up");
}

/// `revis chat` with piped input: `/deep` asks tier3 to follow the last
/// answer up, and the follow-up is printed as its own part.
#[test]
fn piped_chat_goes_deeper_when_asked() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let mut child = spawn_revis(&d, data.path(), &["chat", "--new", "--temperature", "0", "--max-tokens", "16", "--deep-max-tokens", "24"]);
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"/deep\nWhat is a prime number?\n/deep\n/deep\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("there is no answer to go deeper on yet"), "{stderr}");
    assert!(stderr.contains("tier3 was already asked"), "{stderr}");
    assert_eq!(stdout.matches("--- deeper (tier3) ---").count(), 1, "one follow-up: {stdout}");
}

/// The rules `revis chat` opens with on the default test model (its gears, docs/QUALITY.md).
fn default_model_rules() -> String {
    revis_orchestrator::conversation::rules_for(&revis_models::find(revis_models::DEFAULT_MODEL).unwrap().chat)
}
