//! The turn's background work against a scripted runner: what the
//! model says is known, so what is stored can be checked exactly.

use std::sync::{Arc, Mutex};

use revis_client::{CallError, Done, Format, GenerateParams, PrefillParams, Prefilled, Priority, Runner, Tier};
use revis_store::{MessageId, MessageState, Role, Store};
use tokio::sync::broadcast;

use super::*;
use crate::task::Policies;
use crate::{PrefillPhase, check, checklist, structured};

/// Answers the chat with a fixed text, each structured task (by its
/// schema) with a fixed verdict, tier1's check, tier2's notes and
/// tier3's follow-up with what the test set; records every request.
#[derive(Clone)]
struct Scripted {
    seen: Arc<Mutex<Vec<GenerateParams>>>,
    /// The chat answer, streamed a piece at a time (yielding between pieces).
    answer: Arc<Mutex<Vec<String>>>,
    check: Arc<Mutex<String>>,
    notes: Arc<Mutex<String>>,
}

impl Default for Scripted {
    fn default() -> Self {
        Scripted {
            seen: Arc::default(),
            answer: Arc::new(Mutex::new(vec![ANSWER.to_owned()])),
            check: Arc::new(Mutex::new(NO_TYPOS.to_owned())),
            notes: Arc::new(Mutex::new(" English\nTONE: friendly\nESCALATE: no, small talk\nDRAFT: hello".to_owned())),
        }
    }
}

const ANSWER: &str = "Nice to meet you.";
const DEEP: &str = "A longer, careful answer.";
const NO_TYPOS: &str = r#"{"typos":[],"kind":"chat","escalate":false}"#;
const VERDICT: &str = r#"{"ok":false,"problems":["scripted verdict"]}"#;
const FACTS: &str = r#"{"facts":["The user's name is Ada.","Ada lives in London.","Ada owns a red boat."]}"#;
const SUMMARY: &str = r#"{"summary":"Ada and revis counted turns."}"#;
/// The merged profile: two duplicates folded, one fact invented.
const MERGED: &str = r#"{"facts":["Ada lives in London.","Ada likes tea.","Ada flies to Mars."]}"#;

fn is_check(r: &GenerateParams) -> bool {
    matches!(&r.format, Format::Json { schema: Some(s) } if s.contains("escalate"))
}

fn is_notes(r: &GenerateParams) -> bool {
    r.answer_prefix.starts_with(structured::TAG_OPEN) && r.stop.iter().any(|s| s == structured::TAG_CLOSE)
}

fn is_deep(r: &GenerateParams) -> bool {
    r.messages.last().is_some_and(|m| m.text.starts_with(DEEP_ASK))
}

/// The prompt length [`Scripted`] reports when a call starts.
const SCRIPTED_PROMPT_TOKENS: u32 = 37;

impl Runner for Scripted {
    async fn prefill(&self, _: PrefillParams) -> Result<Prefilled, CallError> {
        Ok(Prefilled::default())
    }

    async fn embed(&self, _: revis_client::EmbedParams) -> Result<revis_client::Embedded, CallError> {
        Err(CallError::new(revis_client::Code::Unimplemented, "scripted: no embeddings"))
    }

    async fn tiers(&self) -> Result<Vec<revis_client::TierStatus>, CallError> {
        Ok(Vec::new())
    }

    /// Says every prompt is [`SCRIPTED_PROMPT_TOKENS`] long, then generates.
    async fn generate_started(
        &self,
        req: GenerateParams,
        mut on_started: impl FnMut(u32) + Send,
        on_delta: impl FnMut(&str) + Send,
    ) -> Result<Done, CallError> {
        on_started(SCRIPTED_PROMPT_TOKENS);
        self.generate(req, on_delta).await
    }

    async fn generate(&self, req: GenerateParams, mut on_delta: impl FnMut(&str) + Send) -> Result<Done, CallError> {
        self.seen.lock().unwrap().push(req.clone());
        let text = match &req.format {
            _ if is_check(&req) => self.check.lock().unwrap().clone(),
            _ if is_notes(&req) => self.notes.lock().unwrap().clone(),
            _ if is_deep(&req) => DEEP.to_owned(),
            Format::Json { .. } if req.messages.iter().any(|m| m.text.contains("Merge these facts")) => MERGED.to_owned(),
            Format::Json { schema: Some(s) } if s.contains("problems") => VERDICT.to_owned(),
            Format::Json { schema: Some(s) } if s.contains("facts") => FACTS.to_owned(),
            Format::Json { schema: Some(s) } if s.contains("summary") => SUMMARY.to_owned(),
            Format::Json { .. } => "{}".to_owned(),
            // The structured task's private reasoning.
            Format::Text if req.priority == Priority::Background => "<revis-notes>1. Read it.\nDraft: done".to_owned(),
            Format::Text => {
                let pieces = self.answer.lock().unwrap().clone();
                for p in &pieces {
                    on_delta(p);
                    tokio::task::yield_now().await;
                }
                return Ok(Done { text: pieces.concat(), ..Default::default() });
            }
        };
        on_delta(&text);
        Ok(Done { text, ..Default::default() })
    }
}

fn chat() -> (Chat<Scripted>, Store, Scripted, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap().store;
    let conv = store.create_conversation("").unwrap();
    let runner = Scripted::default();
    (Chat::new(runner.clone(), store.clone(), conv, Policies::default()), store, runner, dir)
}

#[tokio::test]
async fn the_audits_verdict_is_stored_for_the_reply_it_judged() {
    let (mut chat, store, runner, _dir) = chat();
    chat.audit = true;
    chat.send("Hi! My name is Ada and I live in London.", |_| {}).await.unwrap();
    chat.send("What is a boat?", |_| {}).await.unwrap();
    chat.background().idle().await;
    let replies: Vec<_> = store.messages(chat.conversation).unwrap().into_iter().filter(|m| m.role == Role::Assistant).collect();
    assert_eq!(replies.len(), 2);
    for reply in &replies {
        let stored = store.setting(&audit_key(reply.id)).unwrap().expect("an audit for each reply");
        assert_eq!(stored, serde_json::from_str::<serde_json::Value>(VERDICT).unwrap());
    }
    // Each audit was asked about its own question and answer.
    let audits: Vec<String> = runner
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| matches!(&r.format, Format::Json { schema: Some(s) } if s.contains("problems")))
        .map(|r| r.messages.iter().map(|m| m.text.clone()).collect::<Vec<_>>().join("\n"))
        .collect();
    assert_eq!(audits.len(), 2);
    assert!(audits.iter().any(|a| a.contains("Question: What is a boat?") && a.contains(ANSWER)), "{audits:#?}");
}

#[tokio::test]
async fn the_facts_the_user_stated_are_stored_and_invented_ones_are_not() {
    let (chat, store, _runner, _dir) = chat();
    chat.send("Hi! My name is Ada and I live in London.", |_| {}).await.unwrap();
    chat.background().idle().await;
    let facts: Vec<String> = store.facts().unwrap().into_iter().map(|f| f.text).collect();
    assert_eq!(facts, ["The user's name is Ada.", "Ada lives in London."], "the boat was never mentioned");
    // The next prompt carries them.
    let system = chat.context().unwrap().system_text();
    assert!(system.contains("- The user's name is Ada.") && system.contains("- Ada lives in London."), "{system}");
}

/// `revis chat --no-memory`: the conversation learns nothing (no extraction
/// is asked for), and what the profile holds is still used.
#[tokio::test]
async fn a_conversation_that_learns_nothing_asks_for_no_facts_and_still_uses_the_profile() {
    let (mut chat, store, runner, _dir) = chat();
    store.add_fact("The user plays the cello.", None).unwrap();
    chat.learn = false;
    chat.send("Hi! My name is Ada and I live in London.", |_| {}).await.unwrap();
    chat.background().idle().await;
    let facts: Vec<String> = store.facts().unwrap().into_iter().map(|f| f.text).collect();
    assert_eq!(facts, ["The user plays the cello."]);
    let seen = runner.seen.lock().unwrap();
    assert!(
        !seen.iter().any(|r| matches!(&r.format, Format::Json { schema: Some(s) } if s.contains("\"facts\""))),
        "no extraction was asked for"
    );
    let answer = seen.iter().find(|r| r.priority == Priority::User).unwrap();
    assert!(answer.messages[0].text.contains("The user plays the cello."), "the profile still goes into the prompt");
}

#[tokio::test]
async fn a_profile_past_its_budget_is_merged_without_losing_or_inventing_a_fact() {
    let (chat, store, _runner, _dir) = chat();
    let mut facts = vec!["Ada lives in London.", "Ada lives in London now.", "Ada likes tea.", "Ada likes tea a lot."];
    let distinct: Vec<String> = (0..PROFILE_BUDGET - 3).map(|i| format!("Ada owns {} bicycles number{i}.", i + 2)).collect();
    facts.extend(distinct.iter().map(String::as_str));
    for f in &facts {
        store.add_fact(f, None).unwrap();
    }
    assert!(facts.len() > PROFILE_BUDGET);
    chat.send("Hello.", |_| {}).await.unwrap();
    chat.background().idle().await;
    let after: Vec<String> = store.facts().unwrap().into_iter().map(|f| f.text).collect();
    // The duplicates are merged into the model's wording...
    for merged in ["Ada lives in London.", "Ada likes tea."] {
        assert_eq!(after.iter().filter(|f| f.as_str() == merged).count(), 1, "{after:#?}");
    }
    assert!(!after.iter().any(|f| f.contains("now") || f.contains("a lot")), "the duplicates are gone: {after:#?}");
    // ...nothing the user never said comes in, and no distinct fact is lost.
    assert!(!after.iter().any(|f| f.contains("Mars")), "{after:#?}");
    for d in &distinct {
        assert!(after.contains(d), "{d} was lost: {after:#?}");
    }
    assert_eq!(after.len(), facts.len() - 2);
}

#[tokio::test]
async fn a_profile_within_its_budget_is_left_alone() {
    let (chat, store, runner, _dir) = chat();
    store.add_fact("Ada lives in London.", None).unwrap();
    store.add_fact("Ada lives in London now.", None).unwrap();
    chat.send("Hello.", |_| {}).await.unwrap();
    chat.background().idle().await;
    assert_eq!(store.facts().unwrap().len(), 2);
    let asked = runner.seen.lock().unwrap().iter().any(|r| r.messages.iter().any(|m| m.text.contains("Merge these facts")));
    assert!(!asked, "no consolidation below the budget");
}

#[tokio::test]
async fn past_the_turn_budget_old_turns_are_summarised_and_the_summary_is_used() {
    let (chat, store, _runner, _dir) = chat();
    // Each send is two turns; one past the budget starts a summary.
    for i in 0..=TURN_BUDGET / 2 {
        chat.send(&format!("Message number {i}."), |_| {}).await.unwrap();
        chat.background().idle().await;
    }
    let summary = store.summary(chat.conversation).unwrap().expect("a summary past the budget");
    assert_eq!(summary.text, "Ada and revis counted turns.");
    let ctx = chat.context().unwrap();
    assert_eq!(ctx.summary.as_deref(), Some("Ada and revis counted turns."));
    assert!(ctx.turns.len() <= TURN_BUDGET, "the summarised turns are no longer shown in full: {}", ctx.turns.len());
}

/// Every note sent so far.
fn drain(rx: &mut broadcast::Receiver<TurnNote>) -> Vec<TurnNote> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

fn reply_of(store: &Store, chat: &Chat<Scripted>) -> MessageId {
    store.messages(chat.conversation).unwrap().into_iter().rev().find(|m| m.role == Role::Assistant).unwrap().id
}

#[tokio::test]
async fn the_checklist_stays_private_and_its_escalation_brings_tier3s_follow_up() {
    let (mut chat, store, runner, _dir) = chat();
    chat.checklist = true;
    chat.auto_deep = true;
    *runner.notes.lock().unwrap() = " English\nTONE: plain\nESCALATE: yes, it needs maths\nDRAFT: 42\n".to_owned();
    let mut notes = chat.notes();
    let mut shown = String::new();
    chat.send("How many ways can 8 rooks sit on a chessboard without attacking each other?", |t| shown.push_str(t)).await.unwrap();
    assert_eq!(shown, ANSWER, "only the answer reaches the user");
    let reply = reply_of(&store, &chat);
    assert_eq!(store.messages(chat.conversation).unwrap().last().unwrap().text, ANSWER, "only the answer is stored as the reply");
    {
        let seen = runner.seen.lock().unwrap();
        let ask = seen.iter().find(|r| is_notes(r)).expect("the notes were asked for");
        assert!(ask.messages[0].text.contains("ESCALATE:"), "the checklist is in the system message: the static part");
        assert_eq!(ask.max_tokens, Some(checklist::NOTES_MAX_TOKENS));
        let answer = seen.iter().find(|r| r.priority == Priority::User && !is_notes(r) && !is_check(r)).unwrap();
        assert!(answer.answer_prefix.contains("ESCALATE: yes, it needs maths"), "the answer continues after the notes");
        assert!(answer.answer_prefix.ends_with(&format!("{}\n", structured::TAG_CLOSE)));
        assert_eq!(answer.messages[..answer.messages.len() - 1], ask.messages[..ask.messages.len() - 1], "same prompt");
    }
    chat.background().idle().await;
    let record = chat.record(reply).unwrap().unwrap();
    assert_eq!(record.escalation, Some(Escalation { by: EscalatedBy::Checklist, why: Some("it needs maths".into()) }));
    assert_eq!(record.deep.as_deref(), Some(DEEP));
    assert!(record.notes.unwrap().contains("DRAFT: 42"));
    let seen = runner.seen.lock().unwrap().clone();
    let deep = seen.iter().find(|r| is_deep(r)).expect("tier3 was asked");
    assert_eq!((deep.tier, deep.priority), (Tier::Tier3, Priority::Background));
    assert!(deep.messages.iter().any(|m| m.text == ANSWER), "tier3 sees the short answer it follows up");
    let got = drain(&mut notes);
    assert!(got.contains(&TurnNote::Deep { reply, text: DEEP.into() }), "{got:#?}");
    assert!(
        matches!(got.iter().find(|n| matches!(n, TurnNote::Escalated { .. })), Some(TurnNote::Escalated { reply: r, queued: true, .. }) if *r == reply)
    );
    // The next prompt carries the follow-up as part of that reply.
    assert!(chat.context().unwrap().turns.iter().any(|t| t.text == format!("{ANSWER}\n\n{DEEP}")));
    assert!(!chat.deepen(reply).await, "once per reply");
}

#[tokio::test(start_paused = true)]
async fn a_draft_checked_in_time_is_answered_corrected_and_kept_as_typed() {
    let (chat, store, runner, _dir) = chat();
    *runner.check.lock().unwrap() =
        r#"{"typos":[{"wrong":"teh","right":"the"},{"wrong":"Ada","right":"ada"}],"kind":"question","escalate":false}"#.to_owned();
    let typed = "What is teh time in London, Ada?";
    let mut ready = chat.draft_checked();
    chat.draft("What is teh");
    chat.draft(typed);
    ready.wait_for(|t| t.as_deref() == Some(typed)).await.unwrap();
    let mut notes = chat.notes();
    chat.send(typed, |_| {}).await.unwrap();
    let messages = store.messages(chat.conversation).unwrap();
    assert_eq!(messages[0].text, typed, "the message is kept as typed");
    let seen = runner.seen.lock().unwrap().clone();
    assert_eq!(seen.iter().filter(|r| is_check(r)).count(), 1, "the first draft's check was replaced before it ran");
    let answer = seen.iter().rfind(|r| r.priority == Priority::User && !is_check(r)).unwrap();
    assert_eq!(answer.messages.last().unwrap().text, "What is the time in London, Ada?", "the name is left alone");
    let reply = messages[1].id;
    let check = chat.record(reply).unwrap().unwrap().check.unwrap();
    assert_eq!(check.corrections, [check::Correction { wrong: "teh".into(), right: "the".into() }]);
    assert_eq!(drain(&mut notes), [TurnNote::Checked { reply, check, before_answer: true }]);
    chat.background().idle().await;
    assert_eq!(runner.seen.lock().unwrap().iter().filter(|r| is_check(r)).count(), 1, "no second check after the answer");
    assert!(chat.record(reply).unwrap().unwrap().checked_before);
}

#[tokio::test]
async fn a_check_not_ready_in_time_waits_for_the_answer_and_may_still_escalate() {
    let (mut chat, _store, runner, _dir) = chat();
    chat.auto_deep = true;
    *runner.check.lock().unwrap() = r#"{"typos":[],"kind":"request","escalate":true}"#.to_owned();
    let mut notes = chat.notes();
    chat.send("Write a parser for arithmetic expressions in Rust.", |_| {}).await.unwrap();
    assert!(!is_check(&runner.seen.lock().unwrap()[0]), "the answer did not wait for tier1");
    chat.background().idle().await;
    let seen = runner.seen.lock().unwrap().clone();
    let check = seen.iter().find(|r| is_check(r)).expect("checked after the answer");
    assert_eq!((check.tier, check.priority), (Tier::Tier1, Priority::Background));
    assert!(seen.iter().any(is_deep), "tier1's escalation reached tier3");
    let got = drain(&mut notes);
    assert!(got.iter().any(|n| matches!(n, TurnNote::Checked { before_answer: false, .. })), "{got:#?}");
    assert!(got.iter().any(|n| matches!(n, TurnNote::Escalated { escalation: Escalation { by: EscalatedBy::Check, .. }, .. })));
}

#[tokio::test]
async fn by_default_an_escalation_is_shown_and_tier3_waits_for_the_user() {
    let (chat, store, runner, _dir) = chat();
    *runner.check.lock().unwrap() = r#"{"typos":[],"kind":"request","escalate":true}"#.to_owned();
    let mut notes = chat.notes();
    chat.send("Write a parser for arithmetic expressions in Rust.", |_| {}).await.unwrap();
    chat.background().idle().await;
    assert!(!runner.seen.lock().unwrap().iter().any(is_deep), "no follow-up unasked");
    let reply = reply_of(&store, &chat);
    let record = chat.record(reply).unwrap().unwrap();
    assert_eq!(record.escalation, Some(Escalation { by: EscalatedBy::Check, why: None }));
    assert!(drain(&mut notes).iter().any(|n| matches!(n, TurnNote::Escalated { queued: false, .. })));
    assert!(chat.deepen(reply).await, "the user can still ask");
    chat.background().idle().await;
    assert_eq!(chat.record(reply).unwrap().unwrap().deep.as_deref(), Some(DEEP));
}

#[tokio::test]
async fn with_the_gears_off_the_answer_is_one_plain_call_and_the_user_can_still_go_deeper() {
    let (mut chat, store, runner, _dir) = chat();
    chat.quick_check = false;
    chat.checklist = false;
    chat.send("Can you suggest a few things to do on a rainy weekend with two children?", |_| {}).await.unwrap();
    chat.background().idle().await;
    {
        let seen = runner.seen.lock().unwrap();
        assert!(!seen.iter().any(|r| is_check(r) || is_notes(r) || is_deep(r)), "no check, no notes, no follow-up");
        let answer = seen.iter().find(|r| r.priority == Priority::User).unwrap();
        assert!(answer.answer_prefix.is_empty() && !answer.messages[0].text.contains("ESCALATE"));
    }
    let reply = reply_of(&store, &chat);
    assert!(chat.deepen(reply).await);
    chat.background().idle().await;
    let record = chat.record(reply).unwrap().unwrap();
    assert_eq!(record.escalation, Some(Escalation { by: EscalatedBy::User, why: None }));
    assert_eq!(record.deep.as_deref(), Some(DEEP));
    assert_eq!(record.language.as_deref(), Some("English"));
}

#[test]
fn facts_must_come_from_what_the_user_said() {
    let said = "Hi! My name is Ada and I live in London.";
    assert!(grounded("The user's name is Ada and she lives in London.", said), "both statements in one fact");
    assert!(grounded("Ada lives in London.", said));
    assert!(grounded("The user's name is Ada.", said), "the third person the extraction asks for");
    assert!(!grounded("The user owns a red boat.", said));
    assert!(!grounded("I love to travel and love to eat.", said));
    assert!(!grounded("", said));
}

#[tokio::test(start_paused = true)]
async fn typing_holds_background_work_until_a_pause_and_each_key_extends_it() {
    let (mut chat, _store, _runner, _dir) = chat();
    chat.typing_idle = std::time::Duration::from_secs(5);
    let typing = |chat: &Chat<Scripted>| chat.gates().state().typing;
    chat.keystroke(true, Some("H")).unwrap();
    assert!(typing(&chat), "the first key holds background work");
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    chat.keystroke(false, Some("Hi")).unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert!(typing(&chat), "the second key moved the pause on");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(!typing(&chat), "five seconds without a key is a pause");
    chat.typing_paused().await;
    chat.keystroke(false, Some("Hi t")).unwrap();
    assert!(typing(&chat), "typing resumed after the pause");
    chat.typing_stopped();
    assert!(!typing(&chat));
    chat.typing_paused().await;
}

#[tokio::test]
async fn keys_pressed_during_a_turn_only_change_the_draft_and_typing_resumes_after_it() {
    let (chat, _store, _runner, _dir) = chat();
    let turn = chat.send("Hello.", |_| {});
    // Pressed before the turn was first polled: it still belongs to the turn.
    chat.keystroke(true, Some("And")).unwrap();
    assert!(!chat.gates().state().typing);
    turn.await.unwrap();
    assert!(!chat.gates().state().typing, "typing waits for the front end to show the answer");
    chat.resume_typing().unwrap();
    assert!(chat.gates().state().typing);
    chat.typing_stopped();
    chat.resume_typing().unwrap();
    assert!(!chat.gates().state().typing, "only once per turn");
}

#[tokio::test]
async fn with_titling_on_an_untitled_conversation_is_named_after_its_first_message() {
    let (mut chat, store, _runner, _dir) = chat();
    chat.send("Untitled stays untitled.", |_| {}).await.unwrap();
    assert_eq!(store.conversation(chat.conversation).unwrap().unwrap().title, "", "off by default");
    chat.titling = true;
    let long = "What is the difference between a boat and a ship, and how big must a boat be to be a ship?";
    chat.send(long, |_| {}).await.unwrap();
    chat.send("And a canoe?", |_| {}).await.unwrap();
    let title = store.conversation(chat.conversation).unwrap().unwrap().title;
    assert_eq!(title, long.chars().take(TITLE_CHARS).collect::<String>());
}

#[tokio::test]
async fn an_empty_or_oversized_message_is_refused_with_the_reason_and_nothing_is_stored() {
    let (chat, store, runner, _dir) = chat();
    chat.send("Hello.", |_| {}).await.unwrap();
    let before = store.messages(chat.conversation).unwrap();
    for (text, says) in [(String::new(), "empty"), ("  \n\t ".to_owned(), "empty"), ("x".repeat(MAX_MESSAGE_BYTES + 1), "262144 bytes")] {
        let e = chat.send(&text, |_| {}).await.unwrap_err();
        assert!(matches!(e, ChatError::Refused(_)) && e.to_string().contains(says), "{e}");
    }
    assert_eq!(store.messages(chat.conversation).unwrap(), before, "nothing stored, nothing lost");
    assert_eq!(runner.seen.lock().unwrap().iter().filter(|r| r.format == Format::Text && r.priority == Priority::User).count(), 1);
}

#[tokio::test]
async fn an_answer_that_repeats_itself_is_stopped_and_stored_as_shown() {
    let (chat, store, runner, _dir) = chat();
    let sentence = "I am a detective named Emile and I live in Paris, France. ";
    *runner.answer.lock().unwrap() = vec![sentence.to_owned(); 20];
    let mut shown = String::new();
    let done = chat.send("What is the capital of France?", |t| shown.push_str(t)).await.unwrap();
    assert!(shown.len() < sentence.len() * 4, "stopped soon after the first repeat: {} bytes", shown.len());
    assert!(shown.starts_with(sentence) && repeats_itself(&shown));
    assert_eq!(done.text, shown);
    // Dropped before the daemon's Done, the answer still says its prompt's
    // length (`revis chat --verbose` printed zeros).
    assert_eq!((done.prompt_tokens, done.generated_tokens), (SCRIPTED_PROMPT_TOKENS, 0));
    let reply = store.messages(chat.conversation).unwrap().into_iter().rfind(|m| m.role == Role::Assistant).unwrap();
    assert_eq!((reply.text.as_str(), reply.state), (shown.as_str(), revis_store::MessageState::Complete));

    // With the guard off the answer runs to its end.
    let mut chat = chat;
    chat.loop_guard = false;
    let done = chat.send("And of Spain?", |_| {}).await.unwrap();
    assert_eq!(done.text, sentence.repeat(20));
}

#[tokio::test]
async fn a_full_profile_takes_no_more_facts() {
    let (chat, store, _runner, _dir) = chat();
    for i in 0..MAX_PROFILE_FACTS {
        store.add_fact(&format!("The user owns plant number {i}."), None).unwrap();
    }
    chat.send("Hi! My name is Ada and I live in London.", |_| {}).await.unwrap();
    chat.background().idle().await;
    let facts: Vec<String> = store.facts().unwrap().into_iter().map(|f| f.text).collect();
    assert!(facts.len() <= MAX_PROFILE_FACTS && !facts.iter().any(|f| f.contains("Ada")), "{facts:?}");
}

#[tokio::test]
async fn with_the_profile_off_nothing_is_learned_and_nothing_known_is_shown() {
    let (mut chat, store, runner, _dir) = chat();
    store.add_fact("The user's name is Ada.", None).unwrap();
    chat.profile = false;
    chat.send("Hi! I live in London.", |_| {}).await.unwrap();
    chat.background().idle().await;
    assert_eq!(store.facts().unwrap().len(), 1, "nothing learned");
    assert!(chat.context().unwrap().profile.is_empty(), "nothing shown");
    let seen = runner.seen.lock().unwrap();
    assert!(!seen.iter().any(|r| matches!(&r.format, Format::Json { schema: Some(s) } if s.contains("facts"))), "no extraction asked");
    assert!(!seen.iter().any(|r| r.messages.iter().any(|m| m.text.contains("Ada"))), "no prompt carries the profile");
}

/// Sends `text` and stops the turn (drops its future) as soon as its first
/// piece is shown; returns what was shown, once it is saved.
async fn send_and_stop(chat: &Chat<Scripted>, text: &str) -> String {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut shown = {
        let turn = chat.send(text, move |t| {
            let _ = tx.send(t.to_owned());
        });
        tokio::pin!(turn);
        tokio::select! {
            biased;
            Some(first) = rx.recv() => first,
            r = &mut turn => panic!("the turn ended before it could be stopped: {r:?}"),
        }
        // The turn's future is dropped here: Stop.
    };
    chat.saved().await.unwrap();
    while let Ok(t) = rx.try_recv() {
        shown.push_str(&t);
    }
    shown
}

/// The chat answers (not a check, notes or background task) the runner was asked for, in order.
fn answers(runner: &Scripted) -> Vec<GenerateParams> {
    runner
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.priority == Priority::User && r.format == Format::Text && !is_notes(r))
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_stopped_reply_is_continued_in_the_same_message_from_exactly_what_was_shown() {
    let (chat, store, runner, _dir) = chat();
    chat.send("Hello.", |_| {}).await.unwrap();
    let story = "Tell me a story about a boat.";
    *runner.answer.lock().unwrap() = vec!["Once ".into(), "upon ".into(), "a time.".into()];
    let shown = send_and_stop(&chat, story).await;
    assert_eq!(shown, "Once ");
    let reply = reply_of(&store, &chat);
    let stopped = store.message(reply).unwrap().unwrap();
    assert_eq!((stopped.text.as_str(), stopped.state), ("Once ", MessageState::Incomplete));

    *runner.answer.lock().unwrap() = vec!["upon a time, ".into(), "a boat sailed.".into()];
    let mut more = String::new();
    let done = chat.continue_reply(reply, |t| more.push_str(t)).await.unwrap();
    assert_eq!(more, "upon a time, a boat sailed.", "only the new text is streamed");
    assert_eq!(done.text, "Once upon a time, a boat sailed.", "Done has the whole reply");
    let messages = store.messages(chat.conversation).unwrap();
    assert_eq!(messages.len(), 4, "no message was added");
    let continued = messages.last().unwrap();
    assert_eq!((continued.id, continued.text.as_str(), continued.state), (reply, done.text.as_str(), MessageState::Complete));

    let asked = answers(&runner);
    let (stopped_turn, continuation) = (&asked[asked.len() - 2], &asked[asked.len() - 1]);
    assert_eq!(continuation.answer_prefix, "Once ", "the model goes on from the text shown");
    assert_eq!(continuation.messages, stopped_turn.messages, "asked what the stopped turn was asked");
    assert_eq!(continuation.static_messages, stopped_turn.static_messages);
    let texts: Vec<&str> = continuation.messages.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts.iter().filter(|t| **t == story).count(), 1, "the question once: {texts:#?}");
    assert_eq!(texts.last(), Some(&story));
    assert!(!texts.iter().any(|t| t.contains("Once")), "the cut reply is not part of the history: {texts:#?}");
    assert!(texts.contains(&ANSWER), "the earlier turn is: {texts:#?}");

    // The turn is over and settled: the next one is an ordinary turn after the whole reply.
    chat.background().idle().await;
    *runner.answer.lock().unwrap() = vec![ANSWER.to_owned()];
    chat.send("Thanks.", |_| {}).await.unwrap();
    let last = answers(&runner).pop().unwrap();
    assert!(last.messages.iter().any(|m| m.text == done.text), "the next prompt has the continued reply");
}

#[tokio::test]
async fn a_continuation_stopped_again_keeps_everything_shown() {
    let (chat, store, runner, _dir) = chat();
    *runner.answer.lock().unwrap() = vec!["One, ".into(), "two, ".into()];
    send_and_stop(&chat, "Count to five.").await;
    let reply = reply_of(&store, &chat);
    *runner.answer.lock().unwrap() = vec!["two, ".into(), "three, ".into()];
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    {
        let turn = chat.continue_reply(reply, move |t| {
            let _ = tx.send(t.to_owned());
        });
        tokio::pin!(turn);
        tokio::select! {
            biased;
            Some(_) = rx.recv() => {}
            r = &mut turn => panic!("the continuation ended before it could be stopped: {r:?}"),
        }
    }
    chat.saved().await.unwrap();
    let m = store.message(reply).unwrap().unwrap();
    assert_eq!((m.text.as_str(), m.state), ("One, two, ", MessageState::Incomplete));
    assert!(!chat.gates().state().typing && chat.gates().state().streaming == 0, "the stopped turn let go of the gates");
}

#[tokio::test]
async fn only_the_last_reply_cut_off_can_be_continued() {
    let (chat, store, runner, _dir) = chat();
    chat.send("Hello.", |_| {}).await.unwrap();
    let complete = reply_of(&store, &chat);
    send_and_stop(&chat, "Tell me a story.").await;
    let stopped = reply_of(&store, &chat);
    chat.send("Never mind.", |_| {}).await.unwrap();
    let user = store.messages(chat.conversation).unwrap()[0].id;
    let other = store.create_conversation("other").unwrap();
    let elsewhere = store.append_user(other, "elsewhere").unwrap();
    let before = (store.messages(chat.conversation).unwrap(), answers(&runner).len());

    let mut refusals = Vec::new();
    for id in [complete, stopped, user, elsewhere, MessageId { conversation: chat.conversation, seq: 99 }] {
        match chat.continue_reply(id, |_| panic!("nothing is streamed")).await {
            Err(ChatError::Refused(why)) => refusals.push(why),
            other => panic!("{id}: {other:?}"),
        }
    }
    assert_eq!(
        refusals,
        [
            "message 1:1 cannot be continued: it is complete; only a reply that was cut off (stopped, or failed) can be continued",
            "message 1:3 cannot be continued: later messages follow it; only the last message can be continued",
            "message 1:0 cannot be continued: it is the user's; only a reply can be continued",
            "message 2:0 cannot be continued: it belongs to conversation 2, not to the one open here (1)",
            "message 1:99 cannot be continued: it is not in this conversation (it may have been removed)",
        ]
    );
    assert_eq!((store.messages(chat.conversation).unwrap(), answers(&runner).len()), before, "nothing asked, nothing stored");
    chat.keystroke(true, None).unwrap();
    assert!(chat.gates().state().typing, "a refused continuation is no turn under way");
    chat.typing_stopped();
}

#[tokio::test]
async fn a_rewound_turn_leaves_no_record_and_the_message_sent_again_gets_a_new_id() {
    let (mut chat, store, runner, _dir) = chat();
    chat.audit = true;
    chat.send("Can you suggest a few things to do on a rainy weekend with two children?", |_| {}).await.unwrap();
    chat.background().idle().await;
    let ids: Vec<MessageId> = store.messages(chat.conversation).unwrap().into_iter().map(|m| m.id).collect();
    let &[user, reply] = &ids[..] else { panic!("one turn: {ids:?}") };
    assert!(chat.record(reply).unwrap().is_some() && store.setting(&audit_key(reply)).unwrap().is_some());
    // A prefix warmed for the history that is about to change.
    chat.keystroke(true, None).unwrap();
    chat.watch_prefill().wait_for(|p| *p == PrefillPhase::Ready).await.unwrap();
    chat.typing_stopped();

    let removed = chat.rewind(user).await.unwrap();
    assert_eq!(removed.iter().map(|m| m.id).collect::<Vec<_>>(), [user, reply]);
    assert!(store.messages(chat.conversation).unwrap().is_empty());
    assert_eq!(chat.record(reply).unwrap(), None, "the turn record went with its reply");
    assert_eq!(store.setting(&audit_key(reply)).unwrap(), None, "and its audit");
    assert_eq!(chat.pre_prefill().phase(), PrefillPhase::Idle, "the warm prefix of the old history is dropped");
    // A follow-up of the removed reply, asked late, keeps nothing.
    chat.deepen(reply).await;
    chat.background().idle().await;
    assert_eq!(chat.record(reply).unwrap(), None);

    chat.send("What can we cook tonight with two children?", |_| {}).await.unwrap();
    let now: Vec<MessageId> = store.messages(chat.conversation).unwrap().into_iter().map(|m| m.id).collect();
    assert_eq!(now.len(), 2);
    assert!(now.iter().all(|id| id.seq > reply.seq), "ids are never given twice: {now:?}");
    let asked = answers(&runner).pop().unwrap();
    assert!(!asked.messages.iter().any(|m| m.text.contains("rainy")), "the old turn is gone from the prompt");

    // Refused, with nothing removed: a message gone already, another conversation's, and during a turn.
    let other = store.create_conversation("other").unwrap();
    let elsewhere = store.append_user(other, "elsewhere").unwrap();
    for (id, says) in [(reply, "not in this conversation"), (elsewhere, "belongs to conversation 2")] {
        let e = chat.rewind(id).await.unwrap_err();
        assert!(matches!(&e, ChatError::Refused(why) if why.contains(says)), "{e}");
    }
    let turn = chat.send("Hello.", |_| {});
    let e = chat.rewind(now[0]).await.unwrap_err();
    assert!(matches!(&e, ChatError::Refused(why) if why.contains("stop it")), "{e}");
    drop(turn);
    assert_eq!(store.messages(chat.conversation).unwrap().len(), 2);
    assert_eq!(store.messages(other).unwrap().len(), 1);
}
