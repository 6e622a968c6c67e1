//! A conversation turn from start to finish: the user's message is stored,
//! the answer streams from tier2 on top of the warm prefix and is stored
//! (incomplete until its stream ends; cut short, exactly the text shown is
//! kept, see [`crate::reply`]), and then, in the background, profile
//! facts are extracted, old turns summarised and, once it outgrows its
//! budget, the profile consolidated. Their results are stored and folded
//! into the static part of later prompts.

use revis_client::{CallError, Done, Runner, Sampling};
use revis_store::{ConversationId, MessageState, Role, Store};
use serde_json::json;

use crate::prompt::{PromptContext, Speaker, Turn};
use crate::reply::{OpenReply, Writer};
use crate::task::{Background, Policies, TaskKind};
use crate::{Gates, PrePrefill, structured};

/// The house rules every answer starts with.
pub const RULES: &str = "You are revis, a private assistant running on the user's own computer. \
Answer helpfully, briefly and honestly. If you do not know, say so.";

/// How often, by default, the text of a streaming reply is saved (unflushed)
/// while it grows ([`Chat::partial_save_every`]). A reply cut short while the
/// client runs is saved whole regardless; this bounds what a crash loses.
pub const PARTIAL_SAVE_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ChatError> + Send + 'static) -> Result<T, ChatError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ChatError::Writer(format!("a store task failed: {e}")))?
}

/// Turns shown in full before older ones are summarised.
pub const TURN_BUDGET: usize = 12;

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error(transparent)]
    Store(#[from] revis_store::StoreError),
    /// The answer could not be had (the daemon refused or failed it).
    #[error("the daemon failed: {}", .0.message)]
    Call(#[from] CallError),
    /// The reply's writer thread (or a store task) ended unexpectedly.
    #[error("{0}")]
    Writer(String),
}

/// The settings key an answer's audit is stored under.
pub fn audit_key(reply: revis_store::MessageId) -> String {
    format!("audit/{reply}")
}

impl<D: Runner> Chat<D> {
    /// Checks an answer after it was given; the verdict is stored under [`audit_key`].
    fn audit(&self, question: &str, reply: revis_store::MessageId, answer: &str) {
        let policy = *self.policies.get(TaskKind::Audit);
        let (daemon, store) = (self.daemon.clone(), self.store.clone());
        let task = format!("Check this answer for factual mistakes or unhelpfulness.\n\nQuestion: {question}\n\nAnswer: {answer}");
        let _done = self.background.submit(policy.rank, async move {
            let schema = json!({
                "type": "object",
                "properties": {
                    "ok": {"type": "boolean"},
                    "problems": {"type": "array", "items": {"type": "string", "maxLength": 160}, "maxItems": 3}
                },
                "required": ["ok", "problems"],
                "additionalProperties": false
            });
            match structured::run(&daemon, policy.tier, &task, &schema).await {
                Ok(v) => {
                    if let Err(e) = blocking(move || Ok(store.set_setting(&audit_key(reply), &v)?)).await {
                        tracing::warn!("storing an audit failed: {e}");
                    }
                }
                Err(e) => tracing::warn!("audit failed: {e}"),
            }
        });
    }
}

/// Stores the extracted facts that are new and grounded in what the user said (blocks).
fn store_facts(store: &Store, v: &serde_json::Value, said: &str, source: revis_store::MessageId) {
    let mut known: Vec<String> = store.facts().map(|f| f.into_iter().map(|f| f.text).collect()).unwrap_or_default();
    for fact in v["facts"].as_array().into_iter().flatten().filter_map(|f| f.as_str()) {
        let fact = fact.trim();
        if known.iter().any(|k| k.eq_ignore_ascii_case(fact)) || !grounded(fact, said) {
            continue;
        }
        match store.add_fact(fact, Some(source)) {
            Ok(_) => known.push(fact.to_owned()),
            Err(e) => tracing::warn!("storing a profile fact failed: {e}"),
        }
    }
}

/// A cheap guard against invented facts (small models make them up): most
/// of a fact's longer words must appear, by their first four letters (so
/// "lives" matches "live"), in what the user said. "User", the subject the
/// extraction asks for ("The user's name is Ada"), is not one of them.
pub fn grounded(fact: &str, said: &str) -> bool {
    let said = said.to_lowercase();
    let words: Vec<String> = fact
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 4)
        .map(str::to_lowercase)
        .filter(|w| !matches!(w.as_str(), "user" | "users"))
        .collect();
    if words.is_empty() {
        return false;
    }
    let found = words.iter().filter(|w| said.contains(&w.chars().take(4).collect::<String>())).count();
    found * 5 >= words.len() * 3
}

/// Facts kept in the profile before they are consolidated: merged, with
/// duplicates dropped, so the static part of every prompt stays short.
pub const PROFILE_BUDGET: usize = 12;

/// Replaces `old` facts by the model's merged list, losing nothing: a
/// merged fact is kept only if it is grounded in the old facts (nothing
/// invented), and an old fact is removed only if the merged list covers
/// its words (nothing dropped). Returns how many facts there are after.
fn replace_facts(store: &Store, old: &[revis_store::Fact], merged: &serde_json::Value) -> Result<usize, ChatError> {
    let old_text = old.iter().map(|f| f.text.as_str()).collect::<Vec<_>>().join("\n");
    let mut kept: Vec<String> = Vec::new();
    for fact in merged["facts"].as_array().into_iter().flatten().filter_map(|f| f.as_str()).map(str::trim) {
        if grounded(fact, &old_text) && !kept.iter().any(|k| k.eq_ignore_ascii_case(fact)) {
            kept.push(fact.to_owned());
        }
    }
    let merged_text = kept.join("\n");
    let covered: Vec<&revis_store::Fact> = old.iter().filter(|f| grounded(&f.text, &merged_text)).collect();
    if kept.is_empty() || kept.len() >= covered.len() {
        // Nothing merged (or nothing fewer): leave the profile as it is.
        return Ok(old.len());
    }
    for fact in &kept {
        store.add_fact(fact, None)?;
    }
    for f in &covered {
        store.remove_fact(f.id)?;
    }
    Ok(old.len() - covered.len() + kept.len())
}

/// One conversation, driven by the orchestrator.
pub struct Chat<D: Runner> {
    daemon: D,
    store: Store,
    gates: Gates,
    background: Background,
    pre: PrePrefill<D>,
    policies: Policies,
    writer: Writer,
    pub conversation: ConversationId,
    /// Sampling for answers (None = the daemon's defaults).
    pub sampling: Sampling,
    /// `None`: the daemon's default.
    pub max_tokens: Option<u32>,
    /// How often a streaming reply's text is saved while it grows ([`PARTIAL_SAVE_EVERY`]).
    pub partial_save_every: std::time::Duration,
}

impl<D: Runner> Chat<D> {
    /// Starts a background runner on the current runtime.
    pub fn new(daemon: D, store: Store, conversation: ConversationId, policies: Policies) -> Self {
        let gates = Gates::new();
        Chat {
            pre: PrePrefill::new(daemon.clone(), gates.clone()),
            background: Background::start_with(gates.clone(), daemon.parallelism()),
            daemon,
            store,
            gates,
            policies,
            writer: Writer::start(),
            conversation,
            sampling: Sampling::default(),
            max_tokens: None,
            partial_save_every: PARTIAL_SAVE_EVERY,
        }
    }

    pub fn gates(&self) -> &Gates {
        &self.gates
    }

    pub fn pre_prefill(&self) -> &PrePrefill<D> {
        &self.pre
    }

    pub fn background(&self) -> &Background {
        &self.background
    }

    /// What the next prompt is built from, as the store holds it now.
    pub fn context(&self) -> Result<PromptContext, ChatError> {
        let summary = self.store.summary(self.conversation)?;
        let turns = self
            .store
            .messages(self.conversation)?
            .into_iter()
            // A reply cut off by a crash is kept in the store, flagged, but not shown to the model.
            .filter(|m| m.state == MessageState::Complete && !m.text.is_empty())
            .filter(|m| summary.as_ref().is_none_or(|s| m.id > s.covers_up_to))
            .map(|m| Turn { speaker: if m.role == Role::User { Speaker::User } else { Speaker::Assistant }, text: m.text })
            .collect();
        Ok(PromptContext {
            rules: RULES.to_owned(),
            profile: self.store.facts()?.into_iter().map(|f| f.text).collect(),
            summary: summary.map(|s| s.text),
            turns,
        })
    }

    /// The user started typing: warm the cache with the next prompt's static part.
    pub fn typing_started(&self) -> Result<(), ChatError> {
        let tier = self.policies.get(TaskKind::ChatAnswer).tier;
        self.pre.typing_started(tier, self.context()?.static_messages());
        Ok(())
    }

    pub fn typing_stopped(&self) {
        self.pre.typing_stopped();
    }

    /// Resolves when every reply write handed over so far is done (a turn
    /// dropped mid-answer hands its text over as it drops): await it before
    /// the process exits. Fails if a cut reply could not be saved.
    pub async fn saved(&self) -> Result<(), ChatError> {
        self.writer.saved(&self.store).await
    }

    /// Sends the user's message and streams the answer through `on_delta`.
    /// The reply is stored as incomplete when its stream starts, its text so
    /// far is saved as it grows, and it is marked complete when it ends.
    /// If the stream fails, or this future is dropped (Stop), exactly the
    /// text passed to `on_delta` is saved, still incomplete: on return for a
    /// failure, after [`Chat::saved`] for a drop.
    pub async fn send(&self, text: &str, mut on_delta: impl FnMut(&str) + Send) -> Result<Done, ChatError> {
        let tier = self.policies.get(TaskKind::ChatAnswer).tier;
        let ctx = self.context()?;
        let (store, conv, owned) = (self.store.clone(), self.conversation, text.to_owned());
        let t = tier.as_str();
        // Store writes fsync: keep them off the async runtime.
        let (user, reply) = blocking(move || Ok((store.append_user(conv, &owned)?, store.begin_reply(conv, t)?))).await?;
        // Take the pipeline lock before Enter releases the typing hold and the
        // prefill freeze, so no background job slips in ahead of the answer.
        let streaming = self.gates.streaming();
        self.pre.enter().await;
        let mut req = ctx.request(tier, text);
        req.sampling = self.sampling;
        req.max_tokens = self.max_tokens;
        // From here on, however this turn ends, what was shown is saved.
        let mut open = OpenReply::new(self.writer.clone(), self.store.clone(), reply, self.partial_save_every);
        let result = self
            .daemon
            .generate(req, |t| {
                // Recorded in the same step as it is shown: a drop comes before both or after both.
                open.shown(t);
                on_delta(t);
            })
            .await;
        drop(streaming);
        self.pre.consumed();
        let done = match result {
            Ok(done) => done,
            Err(failed) => {
                if let Err(e) = open.cut().await {
                    tracing::warn!("saving the cut reply failed: {e}");
                }
                return Err(ChatError::Call(failed));
            }
        };
        open.complete(done.text.clone()).await?;
        self.after_turn(text, user, reply, &done.text);
        Ok(done)
    }

    /// Queues a consolidation of the profile, which runs (after the turn's
    /// fact extraction, by rank) only if the profile outgrew [`PROFILE_BUDGET`].
    fn consolidate(&self) {
        let policy = *self.policies.get(TaskKind::Consolidate);
        let (daemon, store) = (self.daemon.clone(), self.store.clone());
        let _done = self.background.submit(policy.rank, async move {
            let read = store.clone();
            let Ok(old) = blocking(move || Ok(read.facts()?)).await else { return };
            if old.len() <= PROFILE_BUDGET {
                return;
            }
            let list: String = old.iter().map(|f| format!("\n- {}", f.text)).collect();
            let task = format!(
                "Merge these facts about the user into a shorter list: combine facts that say the same thing, \
                 keep every distinct fact, add nothing new. Short sentences in the third person.\n\nFacts:{list}"
            );
            let schema = json!({
                "type": "object",
                "properties": {"facts": {"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 120}, "maxItems": PROFILE_BUDGET}},
                "required": ["facts"],
                "additionalProperties": false
            });
            match structured::run(&daemon, policy.tier, &task, &schema).await {
                Ok(v) => match blocking(move || replace_facts(&store, &old, &v)).await {
                    Ok(n) => tracing::debug!(facts = n, "profile consolidated"),
                    Err(e) => tracing::warn!("storing the consolidated profile failed: {e}"),
                },
                Err(e) => tracing::warn!("profile consolidation failed: {e}"),
            }
        });
    }

    /// Queues the background work a turn leaves behind.
    fn after_turn(&self, user_text: &str, user: revis_store::MessageId, reply: revis_store::MessageId, answer: &str) {
        self.audit(user_text, reply, answer);
        let facts = *self.policies.get(TaskKind::ExtractFacts);
        let (daemon, store) = (self.daemon.clone(), self.store.clone());
        let said = user_text.to_owned();
        let task = format!(
            "Extract facts the user states about themselves (name, home, work, likes, plans) from this message, \
             as short sentences in the third person. If there are none, give an empty list.\n\nMessage: {user_text}"
        );
        let _done = self.background.submit(facts.rank, async move {
            let schema = json!({
                "type": "object",
                "properties": {"facts": {"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 120}, "maxItems": 5}},
                "required": ["facts"],
                "additionalProperties": false
            });
            match structured::run(&daemon, facts.tier, &task, &schema).await {
                Ok(v) => {
                    // Store calls fsync: off the async runtime.
                    let _ = tokio::task::spawn_blocking(move || store_facts(&store, &v, &said, user)).await;
                }
                Err(e) => tracing::warn!("profile extraction failed: {e}"),
            }
        });
        self.consolidate();

        let Ok(ctx) = self.context() else { return };
        if ctx.turns.len() <= TURN_BUDGET {
            return;
        }
        let summarise = *self.policies.get(TaskKind::Summarise);
        let (daemon, store, conversation) = (self.daemon.clone(), self.store.clone(), self.conversation);
        let _done = self.background.submit(summarise.rank, async move {
            // Summarise all but the last few turns, folding in the previous summary.
            let read = store.clone();
            let Ok((messages, covered)) = blocking(move || {
                // Only what the previous summary does not cover yet; it is folded in as text.
                Ok((read.messages(conversation)?, read.summary(conversation)?.map(|s| s.covers_up_to)))
            })
            .await
            else {
                return;
            };
            let keep = TURN_BUDGET / 2;
            let complete: Vec<_> =
                messages.into_iter().filter(|m| m.state == MessageState::Complete && covered.is_none_or(|c| m.id > c)).collect();
            if complete.len() <= keep {
                return;
            }
            let old = &complete[..complete.len() - keep];
            let mut text = ctx.summary.clone().map(|s| format!("Earlier summary: {s}\n")).unwrap_or_default();
            for m in old {
                text.push_str(if m.role == Role::User { "User: " } else { "Assistant: " });
                text.push_str(&m.text);
                text.push('\n');
            }
            let schema = json!({
                "type": "object",
                "properties": {"summary": {"type": "string", "minLength": 1, "maxLength": 800}},
                "required": ["summary"],
                "additionalProperties": false
            });
            let task = format!("Summarise this conversation in a few sentences, keeping names and decisions.\n\n{text}");
            match structured::run(&daemon, summarise.tier, &task, &schema).await {
                Ok(v) => {
                    if let (Some(s), Some(last)) = (v["summary"].as_str().map(str::to_owned), old.last().map(|m| m.id))
                        && let Err(e) = blocking(move || Ok(store.put_summary(conversation, last, &s)?)).await
                    {
                        tracing::warn!("storing a summary failed: {e}");
                    }
                }
                Err(e) => tracing::warn!("summary failed: {e}"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    //! The turn's background work against a scripted runner: what the
    //! model says is known, so what is stored can be checked exactly.

    use std::sync::{Arc, Mutex};

    use revis_client::{CallError, Done, Format, GenerateParams, PrefillParams, Prefilled, Priority, Runner};

    use super::*;
    use crate::task::Policies;

    /// Answers the chat with a fixed text and each structured task (by its
    /// schema) with a fixed verdict; records every request.
    #[derive(Clone, Default)]
    struct Scripted {
        seen: Arc<Mutex<Vec<GenerateParams>>>,
    }

    const ANSWER: &str = "Nice to meet you.";
    const VERDICT: &str = r#"{"ok":false,"problems":["scripted verdict"]}"#;
    const FACTS: &str = r#"{"facts":["The user's name is Ada.","Ada lives in London.","Ada owns a red boat."]}"#;
    const SUMMARY: &str = r#"{"summary":"Ada and revis counted turns."}"#;
    /// The merged profile: two duplicates folded, one fact invented.
    const MERGED: &str = r#"{"facts":["Ada lives in London.","Ada likes tea.","Ada flies to Mars."]}"#;

    impl Runner for Scripted {
        async fn prefill(&self, _: PrefillParams) -> Result<Prefilled, CallError> {
            Ok(Prefilled::default())
        }

        async fn generate(&self, req: GenerateParams, mut on_delta: impl FnMut(&str) + Send) -> Result<Done, CallError> {
            self.seen.lock().unwrap().push(req.clone());
            let text = match &req.format {
                Format::Json { .. } if req.messages.iter().any(|m| m.text.contains("Merge these facts")) => MERGED,
                Format::Json { schema: Some(s) } if s.contains("problems") => VERDICT,
                Format::Json { schema: Some(s) } if s.contains("facts") => FACTS,
                Format::Json { schema: Some(s) } if s.contains("summary") => SUMMARY,
                Format::Json { .. } => "{}",
                // The structured task's private reasoning.
                Format::Text if req.priority == Priority::Background => "<revis-notes>1. Read it.\nDraft: done",
                Format::Text => ANSWER,
            };
            on_delta(text);
            Ok(Done { text: text.to_owned(), ..Default::default() })
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
        let (chat, store, runner, _dir) = chat();
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

    #[test]
    fn facts_must_come_from_what_the_user_said() {
        let said = "Hi! My name is Ada and I live in London.";
        assert!(grounded("The user's name is Ada and she lives in London.", said) || grounded("Ada lives in London.", said));
        assert!(grounded("Ada lives in London.", said));
        assert!(grounded("The user's name is Ada.", said), "the third person the extraction asks for");
        assert!(!grounded("The user owns a red boat.", said));
        assert!(!grounded("I love to travel and love to eat.", said));
        assert!(!grounded("", said));
    }
}
