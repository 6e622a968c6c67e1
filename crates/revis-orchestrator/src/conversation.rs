//! A conversation turn from start to finish, in three gears: tier1's quick
//! check of the message (typos, kind, escalation; [`crate::check`]) when it
//! is ready before the answer, the answer from tier2 on top of the warm
//! prefix, after its private checklist ([`crate::checklist`]), stored
//! (incomplete until its stream ends; cut short, exactly the text shown is
//! kept, see [`crate::reply`]), and, when tier1 or the checklist says so or
//! the user asks, tier3's deeper follow-up. Then, in the background, the
//! check if it was not ready in time, profile facts extracted, old turns
//! summarised and, once it outgrows its budget, the profile consolidated.
//! Their results are stored and folded into the static part of later prompts.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use revis_client::{CallError, Done, Message, Priority, Runner, Sampling, Tier};
use revis_store::{ConversationId, MessageId, MessageState, Role, Store};
use serde_json::json;
use tokio::sync::{broadcast, watch};

use crate::check::{self, QuickCheck};
use crate::checklist;
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

/// How long a draft must stay unchanged before tier1 checks it (while the
/// user still types: a pause, not the end of typing).
pub const DRAFT_PAUSE: std::time::Duration = std::time::Duration::from_millis(400);

/// The longest deeper follow-up tier3 writes, by default ([`Chat::deep_max_tokens`]).
pub const DEEP_MAX_TOKENS: u32 = 512;

/// What tier3 is asked when it follows an answer up.
pub const DEEP_ASK: &str = "Go deeper on my last message: a more thorough, careful answer, with the reasoning \
and details the short answer left out. Do not repeat the short answer.";

/// The settings key a turn's record ([`TurnRecord`]) is stored under.
pub fn turn_key(reply: MessageId) -> String {
    format!("turn/{reply}")
}

/// What a turn's gears found and did, stored with its reply.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TurnRecord {
    /// tier1's quick check, once it ran.
    pub check: Option<QuickCheck>,
    /// The check was ready before the answer, which then answered the corrected message.
    pub checked_before: bool,
    /// The language of the message, when revis was sure of it.
    pub language: Option<String>,
    /// The checklist tier2 went through (private: never shown as the answer).
    pub notes: Option<String>,
    pub escalation: Option<Escalation>,
    /// tier3's follow-up, once written.
    pub deep: Option<String>,
}

/// Why tier3 was asked to follow up.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Escalation {
    pub by: EscalatedBy,
    pub why: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EscalatedBy {
    /// tier1's quick check.
    Check,
    /// tier2's checklist said ESCALATE: yes.
    Checklist,
    /// The user asked (a command or a button).
    User,
}

/// What a turn's gears report as they go, for a CLI or GUI to show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TurnNote {
    /// tier1 checked the message: before the answer (its corrections were
    /// answered) or after it (shown only).
    Checked {
        reply: MessageId,
        check: QuickCheck,
        before_answer: bool,
    },
    /// tier1 or the checklist says the answer needs the deep tier, or the
    /// user asked; `queued`: tier3 follows up (when the gates let it).
    Escalated {
        reply: MessageId,
        escalation: Escalation,
        queued: bool,
    },
    /// tier3 started writing.
    DeepStarted {
        reply: MessageId,
        tier: Tier,
    },
    /// tier3's follow-up, whole.
    Deep {
        reply: MessageId,
        text: String,
    },
    DeepFailed {
        reply: MessageId,
        error: String,
    },
}

/// The draft tier1 checks while the user types, and what it found.
#[derive(Default)]
struct Draft {
    text: String,
    check: Option<QuickCheck>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Everything a background job of the turn needs, cloned out of the [`Chat`].
#[derive(Clone)]
struct Shared<D: Runner> {
    daemon: D,
    store: Store,
    background: Background,
    policies: Policies,
    sampling: Sampling,
    deep_max_tokens: Option<u32>,
    auto_deep: bool,
    notes: broadcast::Sender<TurnNote>,
    /// Replies tier3 was asked to follow up (once each).
    deepened: Arc<Mutex<HashSet<MessageId>>>,
    /// One read-modify-write of a turn record at a time.
    records: Arc<Mutex<()>>,
}

impl<D: Runner> Shared<D> {
    /// Changes a reply's record (blocks: store writes fsync).
    fn update(&self, reply: MessageId, f: impl FnOnce(&mut TurnRecord)) -> Result<TurnRecord, ChatError> {
        let _one = self.records.lock().unwrap_or_else(|p| p.into_inner());
        let mut record = turn_record(&self.store, reply)?.unwrap_or_default();
        f(&mut record);
        self.store.set_setting(&turn_key(reply), &serde_json::to_value(&record).map_err(|e| ChatError::Writer(e.to_string()))?)?;
        Ok(record)
    }

    async fn update_async(&self, reply: MessageId, f: impl FnOnce(&mut TurnRecord) + Send + 'static) -> Result<TurnRecord, ChatError> {
        let me = self.clone();
        blocking(move || me.update(reply, f)).await
    }

    fn note(&self, n: TurnNote) {
        // No one listening is fine.
        let _ = self.notes.send(n);
    }

    /// Records why tier3 should follow `reply` up and (with `queue`) queues
    /// it, once per reply. An escalation not queued is recorded and shown
    /// only; the user may still ask.
    async fn escalate(&self, reply: MessageId, escalation: Escalation, queue: bool) -> bool {
        if queue && !self.deepened.lock().unwrap_or_else(|p| p.into_inner()).insert(reply) {
            return false;
        }
        let e = escalation.clone();
        if let Err(err) = self.update_async(reply, move |r| r.escalation = Some(e)).await {
            tracing::warn!("storing an escalation failed: {err}");
        }
        self.note(TurnNote::Escalated { reply, escalation, queued: queue });
        if queue {
            self.deep(reply);
        }
        true
    }

    /// Queues tier3's follow-up of `reply`: background work, through the gates.
    fn deep(&self, reply: MessageId) {
        let policy = *self.policies.get(TaskKind::DeepAnswer);
        let me = self.clone();
        let _done = self.background.submit(policy.rank, async move {
            me.note(TurnNote::DeepStarted { reply, tier: policy.tier });
            let read = me.clone();
            let Ok((ctx, language)) = blocking(move || {
                let ctx = build_context(&read.store, reply.conversation, false, Some(reply))?;
                Ok((ctx, turn_record(&read.store, reply)?.and_then(|r| r.language)))
            })
            .await
            else {
                me.note(TurnNote::DeepFailed { reply, error: "the conversation could not be read".into() });
                return;
            };
            let mut messages = ctx.static_messages();
            let static_count = messages.len() as u32;
            let ask = match language {
                Some(l) => format!("{DEEP_ASK} Write in {l}."),
                None => DEEP_ASK.to_owned(),
            };
            messages.push(Message::user(ask));
            let req = revis_client::GenerateParams {
                tier: policy.tier,
                messages,
                static_messages: Some(static_count),
                sampling: me.sampling,
                max_tokens: me.deep_max_tokens,
                priority: Priority::Background,
                ..Default::default()
            };
            match me.daemon.generate(req, |_| {}).await {
                Ok(done) => {
                    let text = done.text.trim().to_owned();
                    let t = text.clone();
                    if let Err(e) = me.update_async(reply, move |r| r.deep = Some(t)).await {
                        tracing::warn!("storing the deeper answer failed: {e}");
                    }
                    me.note(TurnNote::Deep { reply, text });
                }
                Err(e) => {
                    tracing::warn!("the deeper answer failed: {}", e.message);
                    me.note(TurnNote::DeepFailed { reply, error: e.message });
                }
            }
        });
    }

    /// Queues tier1's check of a message the answer did not wait for: the
    /// correction is shown, and an escalation still reaches tier3.
    fn check_after(&self, reply: MessageId, text: String) {
        let policy = *self.policies.get(TaskKind::Classify);
        let me = self.clone();
        let _done = self.background.submit(policy.rank, async move {
            let c = match check::run_with(&me.daemon, policy.tier, &text, Priority::Background).await {
                Ok(c) => c,
                Err(e) => return tracing::warn!("the quick check failed: {e}"),
            };
            let stored = c.clone();
            if let Err(e) = me.update_async(reply, move |r| r.check = Some(stored)).await {
                tracing::warn!("storing the quick check failed: {e}");
            }
            me.note(TurnNote::Checked { reply, check: c.clone(), before_answer: false });
            if c.escalate {
                me.escalate(reply, Escalation { by: EscalatedBy::Check, why: None }, me.auto_deep).await;
            }
        });
    }
}

/// A reply's record, if it has one.
pub fn turn_record(store: &Store, reply: MessageId) -> Result<Option<TurnRecord>, ChatError> {
    Ok(store.setting(&turn_key(reply))?.and_then(|v| serde_json::from_value(v).ok()))
}

/// What the next prompt is built from, as the store holds it now (up to
/// and including `upto`, when given); the checklist joins the rules when on.
/// A reply's deeper follow-up is part of that reply, for the model.
fn build_context(
    store: &Store,
    conversation: ConversationId,
    checklist: bool,
    upto: Option<MessageId>,
) -> Result<PromptContext, ChatError> {
    let summary = store.summary(conversation)?;
    let mut turns = Vec::new();
    for m in store.messages(conversation)? {
        // A reply cut off by a crash is kept in the store, flagged, but not shown to the model.
        if m.state != MessageState::Complete || m.text.is_empty() || upto.is_some_and(|u| m.id > u) {
            continue;
        }
        if summary.as_ref().is_some_and(|s| m.id <= s.covers_up_to) {
            continue;
        }
        let mut text = m.text;
        if m.role == Role::Assistant
            && let Some(deep) = turn_record(store, m.id)?.and_then(|r| r.deep).filter(|d| !d.is_empty())
        {
            text.push_str("\n\n");
            text.push_str(&deep);
        }
        turns.push(Turn { speaker: if m.role == Role::User { Speaker::User } else { Speaker::Assistant }, text });
    }
    let rules = if checklist { format!("{RULES}\n\n{}", checklist::instructions()) } else { RULES.to_owned() };
    Ok(PromptContext { rules, profile: store.facts()?.into_iter().map(|f| f.text).collect(), summary: summary.map(|s| s.text), turns })
}

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

/// The summarising task for a conversation written out as `text` ("User:
/// ..." and "Assistant: ..." lines), and the schema of its answer.
pub fn summary_task(text: &str) -> (String, serde_json::Value) {
    let schema = json!({
        "type": "object",
        "properties": {"summary": {"type": "string", "minLength": 1, "maxLength": 800}},
        "required": ["summary"],
        "additionalProperties": false
    });
    (format!("Summarise this conversation in a few sentences, keeping names and decisions.\n\n{text}"), schema)
}

/// The facts the user states about themselves in `said`, as the model
/// extracts them (`{"facts": [...]}`), before [`grounded`] sorts them.
pub async fn extract_facts<D: Runner>(daemon: &D, tier: Tier, said: &str) -> Result<serde_json::Value, structured::StructuredError> {
    let task = format!(
        "Extract facts the user states about themselves (name, home, work, likes, plans) from this message, \
         as short sentences in the third person. If there are none, give an empty list.\n\nMessage: {said}"
    );
    let schema = json!({
        "type": "object",
        "properties": {"facts": {"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 120}, "maxItems": 5}},
        "required": ["facts"],
        "additionalProperties": false
    });
    structured::run(daemon, tier, &task, &schema).await
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
    /// tier1 checks each message (on by default: its corrections pass a
    /// guard that keeps false ones rare, docs/QUALITY.md).
    pub quick_check: bool,
    /// tier2 goes through its checklist before answering. Off by default:
    /// with the small models measured (docs/QUALITY.md) it makes answers
    /// worse; for models that can follow it.
    pub checklist: bool,
    /// An escalation (tier1's or the checklist's) has tier3 follow up by
    /// itself. Off by default (the small models' escalations are little
    /// better than chance, docs/QUALITY.md): the escalation is shown, and
    /// tier3 follows up when the user asks ([`Chat::deepen`]).
    pub auto_deep: bool,
    /// The longest follow-up tier3 writes ([`DEEP_MAX_TOKENS`]; `None`: the daemon's default).
    pub deep_max_tokens: Option<u32>,
    /// Whether a turn leaves its background work behind (a quick check that
    /// was not ready in time, tier3's follow-up of an escalation, facts,
    /// audit, summary, consolidation); on by default, off only to measure an
    /// answer alone (an escalation is then recorded, not followed up).
    pub after_turn: bool,
    draft: Arc<Mutex<Draft>>,
    /// The draft text whose check has ended.
    draft_ready: watch::Sender<Option<String>>,
    notes: broadcast::Sender<TurnNote>,
    deepened: Arc<Mutex<HashSet<MessageId>>>,
    records: Arc<Mutex<()>>,
}

impl<D: Runner> Drop for Chat<D> {
    fn drop(&mut self) {
        if let Some(t) = self.draft.lock().unwrap_or_else(|p| p.into_inner()).task.take() {
            t.abort();
        }
    }
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
            quick_check: true,
            checklist: false,
            auto_deep: false,
            deep_max_tokens: Some(DEEP_MAX_TOKENS),
            after_turn: true,
            draft: Arc::default(),
            draft_ready: watch::Sender::new(None),
            notes: broadcast::channel(64).0,
            deepened: Arc::default(),
            records: Arc::default(),
        }
    }

    fn shared(&self) -> Shared<D> {
        Shared {
            daemon: self.daemon.clone(),
            store: self.store.clone(),
            background: self.background.clone(),
            policies: self.policies.clone(),
            sampling: self.sampling,
            deep_max_tokens: self.deep_max_tokens,
            auto_deep: self.auto_deep,
            notes: self.notes.clone(),
            deepened: self.deepened.clone(),
            records: self.records.clone(),
        }
    }

    /// What the turns report as they go ([`TurnNote`]): corrections,
    /// escalations, tier3's follow-ups.
    pub fn notes(&self) -> broadcast::Receiver<TurnNote> {
        self.notes.subscribe()
    }

    /// A reply's record: its check, checklist, escalation and deeper follow-up.
    pub fn record(&self, reply: MessageId) -> Result<Option<TurnRecord>, ChatError> {
        turn_record(&self.store, reply)
    }

    /// The user asked for tier3's deeper follow-up of `reply` (a command, a
    /// button). False if one was already asked for.
    pub async fn deepen(&self, reply: MessageId) -> bool {
        self.shared().escalate(reply, Escalation { by: EscalatedBy::User, why: None }, true).await
    }

    /// The draft being typed, as it stands now: once it has stayed the same
    /// for [`DRAFT_PAUSE`] and no answer streams or pre-prefill computes,
    /// tier1 checks it, so the answer can use the check if the message sent
    /// is this draft. A newer draft replaces the check under way.
    pub fn draft(&self, text: &str) {
        self.start_draft_check(text, DRAFT_PAUSE);
    }

    /// Watches which draft's check has ended (its text), found or failed.
    pub fn draft_checked(&self) -> watch::Receiver<Option<String>> {
        self.draft_ready.subscribe()
    }

    fn start_draft_check(&self, text: &str, pause: std::time::Duration) {
        let text = text.trim();
        let mut d = self.draft.lock().unwrap_or_else(|p| p.into_inner());
        if d.text == text && (d.check.is_some() || d.task.as_ref().is_some_and(|t| !t.is_finished())) {
            return;
        }
        if let Some(t) = d.task.take() {
            t.abort();
        }
        *d = Draft { text: text.to_owned(), ..Default::default() };
        self.draft_ready.send_replace(None);
        if !self.quick_check || text.is_empty() || text.len() > check::CHECK_MAX_BYTES {
            return;
        }
        let (daemon, gates, slot, ready, owned) =
            (self.daemon.clone(), self.gates.clone(), self.draft.clone(), self.draft_ready.clone(), text.to_owned());
        let tier = self.policies.get(TaskKind::Classify).tier;
        d.task = Some(tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            // Like the pre-prefill, it may run while the user types, but never
            // alongside an answer or a computing pre-prefill.
            let _ = gates.subscribe().wait_for(|g| g.streaming == 0 && g.prefilling == 0).await;
            // Below the user's own work in the daemon's queue: Enter's answer goes first.
            let found = check::run_with(&daemon, tier, &owned, Priority::Background).await;
            let mut d = slot.lock().unwrap_or_else(|p| p.into_inner());
            if d.text != owned {
                return;
            }
            match found {
                Ok(c) => d.check = Some(c),
                // The answer goes on without it, and the check runs again after the answer.
                Err(e) => tracing::debug!("the draft's quick check failed: {e}"),
            }
            ready.send_replace(Some(owned));
        }));
    }

    /// The check of `text`, if the draft check found one in time; else the
    /// check under way is stopped (the answer does not wait for it).
    fn take_draft_check(&self, text: &str) -> Option<QuickCheck> {
        let mut d = std::mem::take(&mut *self.draft.lock().unwrap_or_else(|p| p.into_inner()));
        self.draft_ready.send_replace(None);
        if let Some(t) = d.task.take() {
            t.abort();
        }
        d.check.filter(|_| d.text == text.trim())
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
        build_context(&self.store, self.conversation, self.checklist, None)
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
    ///
    /// The answer never waits for tier1: if the draft's check is ready, the
    /// corrected message is answered (the stored message stays as typed),
    /// else the check runs after the answer. With the checklist on, the
    /// notes come first, hidden; `on_delta` sees only the answer.
    pub async fn send(&self, text: &str, mut on_delta: impl FnMut(&str) + Send) -> Result<Done, ChatError> {
        let tier = self.policies.get(TaskKind::ChatAnswer).tier;
        let ctx = self.context()?;
        let check = if self.quick_check { self.take_draft_check(text) } else { None };
        let language = check::language(text);
        let (store, conv, owned) = (self.store.clone(), self.conversation, text.to_owned());
        let t = tier.as_str();
        // Store writes fsync: keep them off the async runtime.
        let (user, reply) = blocking(move || Ok((store.append_user(conv, &owned)?, store.begin_reply(conv, t)?))).await?;
        let shared = self.shared();
        if let Some(c) = &check {
            let (stored, lang) = (c.clone(), language.map(str::to_owned));
            shared
                .update_async(reply, move |r| {
                    r.check = Some(stored);
                    r.checked_before = true;
                    r.language = lang;
                })
                .await?;
            shared.note(TurnNote::Checked { reply, check: c.clone(), before_answer: true });
        } else if let Some(l) = language {
            shared.update_async(reply, move |r| r.language = Some(l.to_owned())).await?;
        }
        let asked = check.as_ref().map_or(text, |c| c.corrected.as_str());
        // Take the pipeline lock before Enter releases the typing hold and the
        // prefill freeze, so no background job slips in ahead of the answer.
        let streaming = self.gates.streaming();
        self.pre.enter().await;
        let mut req = ctx.request(tier, asked);
        req.sampling = self.sampling;
        req.max_tokens = self.max_tokens;
        // From here on, however this turn ends, what was shown is saved.
        let mut open = OpenReply::new(self.writer.clone(), self.store.clone(), reply, self.partial_save_every);
        let mut notes = None;
        let mut result = Ok(Done::default());
        if self.checklist {
            let prefix = checklist::notes_prefix(language);
            let mut ask = req.clone();
            ask.answer_prefix = prefix.clone();
            ask.stop = checklist::notes_stop();
            ask.max_tokens = Some(checklist::NOTES_MAX_TOKENS);
            match self.daemon.generate(ask, |_| {}).await {
                Ok(n) => {
                    req.answer_prefix = checklist::answer_prefix(&prefix, &n.text);
                    notes = Some(format!("{prefix}{}", n.text.trim_end()));
                }
                Err(e) => result = Err(e),
            }
        }
        if result.is_ok() {
            result = self
                .daemon
                .generate(req, |t| {
                    // Recorded in the same step as it is shown: a drop comes before both or after both.
                    open.shown(t);
                    on_delta(t);
                })
                .await;
        }
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
        let parsed = notes.as_deref().map(checklist::parse);
        if let Some(n) = notes {
            shared.update_async(reply, move |r| r.notes = Some(n)).await?;
        }
        if check.as_ref().is_some_and(|c| c.escalate) {
            shared.escalate(reply, Escalation { by: EscalatedBy::Check, why: None }, self.after_turn && self.auto_deep).await;
        } else if let Some(n) = parsed.filter(|n| n.escalate == Some(true)) {
            shared.escalate(reply, Escalation { by: EscalatedBy::Checklist, why: n.why }, self.after_turn && self.auto_deep).await;
        }
        if self.after_turn {
            if self.quick_check && check.is_none() && text.len() <= check::CHECK_MAX_BYTES {
                shared.check_after(reply, text.to_owned());
            }
            self.after_turn(text, user, reply, &done.text);
        }
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
        let _done = self.background.submit(facts.rank, async move {
            match extract_facts(&daemon, facts.tier, &said).await {
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
            let (task, schema) = summary_task(&text);
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

    use revis_client::{CallError, Done, Format, GenerateParams, PrefillParams, Prefilled, Priority, Runner, Tier};

    use super::*;
    use crate::task::Policies;

    /// Answers the chat with a fixed text, each structured task (by its
    /// schema) with a fixed verdict, tier1's check, tier2's notes and
    /// tier3's follow-up with what the test set; records every request.
    #[derive(Clone)]
    struct Scripted {
        seen: Arc<Mutex<Vec<GenerateParams>>>,
        check: Arc<Mutex<String>>,
        notes: Arc<Mutex<String>>,
    }

    impl Default for Scripted {
        fn default() -> Self {
            Scripted {
                seen: Arc::default(),
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
                Format::Text => ANSWER.to_owned(),
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
}
