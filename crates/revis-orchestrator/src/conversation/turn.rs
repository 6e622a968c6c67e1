//! The turn: [`Chat`], one conversation driven by the orchestrator. It owns
//! what a turn needs from the first keystroke to the last background job:
//! the typing signal ([`Chat::keystroke`]: the typing hold, the pre-prefill,
//! the typing timer and tier1's draft check), the conversation's title, the
//! answer streamed and stored ([`super::reply`]), its record and escalation
//! ([`super::escalation`]) and the memory work it leaves behind
//! ([`super::memory`]); and going back on a turn: the conversation rewound
//! for an edit or a regeneration ([`Chat::rewind`]), a reply that was cut
//! off continued ([`Chat::continue_reply`]).

use std::collections::HashSet;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use revis_client::{CallError, Done, FinishReason, GenerateParams, Runner, Sampling};
use revis_models::{ChatGears, chat_gears};
use revis_store::{ConversationId, MessageId, MessageState, Role, Store, StoredMessage};
use tokio::sync::{broadcast, watch};

use super::context::{RULES, build_context, rules_for};
use super::draft::{DRAFT_PAUSE, DraftCheck};
use super::error::{ChatError, blocking};
use super::escalation::{DEEP_MAX_TOKENS, RecordKeeper};
use super::memory::{self, Memory, audit_key};
use super::record::{EscalatedBy, Escalation, TurnNote, TurnRecord, turn_key, turn_record};
use super::reply::{OpenReply, Writer, repeats_itself};
use super::typing::TypingTimer;
use crate::prompt::PromptContext;
use crate::task::{Background, Policies, TaskKind};
use crate::{GateState, Gates, PrePrefill, PrefillPhase, check, checklist};

/// How often, by default, the text of a streaming reply is saved (unflushed)
/// while it grows ([`Chat::partial_save_every`]). A reply cut short while the
/// client runs is saved whole regardless; this bounds what a crash loses.
pub const PARTIAL_SAVE_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// How long, by default, typing counts as going on after the last key ([`Chat::typing_idle`]).
pub const TYPING_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest message a turn sends, in bytes (256 KiB: more than the
/// context of any model revis runs holds; the daemon's own limit on a whole
/// request is 1 MiB).
pub const MAX_MESSAGE_BYTES: usize = 256 << 10;

/// How long a conversation title may be (the first message, cut).
pub const TITLE_CHARS: usize = 60;

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
    /// What opens the system message ([`RULES`] until [`Chat::fit_to_model`]
    /// sets the rules measured for the model; empty: no rules).
    pub rules: String,
    /// The profile: facts the user stated about themselves are learned and
    /// go into every prompt. On by default; off for a model measured to
    /// answer worse with it ([`Chat::fit_to_model`]).
    pub profile: bool,
    /// Facts the user states in this conversation are learned into the
    /// profile (on by default; `revis chat --no-memory` turns it off: the
    /// conversation learns nothing, and the profile is still used).
    pub learn: bool,
    /// A question about the person gets the profile facts it asks about
    /// beside it in the prompt (`memory::with_what_was_said`), not only in
    /// the system message. On by default; the turn benchmark turns it off
    /// to measure the two forms.
    pub facts_beside: bool,
    /// Sampling for answers (None = the daemon's defaults: the model's
    /// published settings where the catalog or its file has them).
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
    /// tier3 audits each answer in the background and stores its verdict
    /// ([`super::audit_key`]). Off by default: nothing reads the verdict
    /// yet, and it costs a tier3 call per turn (docs/QUALITY.md).
    pub audit: bool,
    /// Whether a turn leaves its background work behind (a quick check that
    /// was not ready in time, tier3's follow-up of an escalation, facts,
    /// audit, summary, consolidation); on by default, off only to measure an
    /// answer alone (an escalation is then recorded, not followed up).
    pub after_turn: bool,
    /// An untitled conversation is named after the message sent in it (its
    /// first [`TITLE_CHARS`] characters) before that message is answered.
    /// Off by default, so a measured turn does only the answer's store
    /// writes; the CLI and the GUI turn it on.
    pub titling: bool,
    /// The answer stops once it repeats a span of itself ([`repeats_itself`]);
    /// on by default.
    pub loop_guard: bool,
    /// Typing counts as stopped this long after the last key ([`Chat::keystroke`], [`TYPING_IDLE`]).
    pub typing_idle: std::time::Duration,
    drafts: DraftCheck<D>,
    memory: Memory<D>,
    typing: TypingTimer,
    /// Turns under way now ([`Chat::send`] not yet returned or dropped).
    turns: AtomicUsize,
    /// A key was pressed while a turn was under way: typing resumes after it ([`Chat::resume_typing`]).
    typed_in_turn: AtomicBool,
    notes: broadcast::Sender<TurnNote>,
    deepened: Arc<Mutex<HashSet<MessageId>>>,
    records: Arc<Mutex<()>>,
}

/// A turn under way: counted while it lives; dropped before it finished
/// (Stop), the warm prefix is taken as used, as a finished answer takes it.
struct TurnGuard<'a, D: Runner> {
    chat: &'a Chat<D>,
    finished: bool,
}

impl<D: Runner> TurnGuard<'_, D> {
    /// The turn returned (answered or failed): it already settled the pre-prefill.
    fn finish(mut self) {
        self.finished = true;
    }
}

impl<D: Runner> Drop for TurnGuard<'_, D> {
    fn drop(&mut self) {
        self.chat.turns.fetch_sub(1, Ordering::SeqCst);
        if !self.finished {
            self.chat.pre.consumed();
        }
    }
}

impl<D: Runner> Chat<D> {
    /// Starts a background runner and the typing timer on the current runtime.
    pub fn new(daemon: D, store: Store, conversation: ConversationId, policies: Policies) -> Self {
        let gates = Gates::new();
        let background = Background::start_with(gates.clone(), daemon.parallelism());
        let pre = PrePrefill::new(daemon.clone(), gates.clone());
        Chat {
            typing: TypingTimer::start(pre.clone()),
            pre,
            drafts: DraftCheck::new(daemon.clone(), gates.clone(), policies.get(TaskKind::Classify).tier),
            memory: Memory { daemon: daemon.clone(), store: store.clone(), background: background.clone(), policies: policies.clone() },
            background,
            daemon,
            store,
            gates,
            policies,
            writer: Writer::start(),
            conversation,
            rules: RULES.to_owned(),
            profile: true,
            learn: true,
            facts_beside: true,
            sampling: Sampling::default(),
            max_tokens: None,
            partial_save_every: PARTIAL_SAVE_EVERY,
            quick_check: true,
            checklist: false,
            auto_deep: false,
            deep_max_tokens: Some(DEEP_MAX_TOKENS),
            audit: false,
            after_turn: true,
            titling: false,
            typing_idle: TYPING_IDLE,
            loop_guard: true,
            turns: AtomicUsize::new(0),
            typed_in_turn: AtomicBool::new(false),
            notes: broadcast::channel(64).0,
            deepened: Arc::default(),
            records: Arc::default(),
        }
    }

    /// Fits the turn to the models that run it, as the daemon reports them:
    /// the rules measured for the answering model (tier2's) and whether it
    /// gets the profile, and tier1's
    /// quick check only where tier1's model was measured precise enough
    /// ([`revis_models::chat_gears`], docs/QUALITY.md); a check switched off
    /// before stays off. A model nobody measured keeps [`RULES`] and the
    /// check. Returns the answering model's gears.
    pub async fn fit_to_model(&mut self) -> Result<ChatGears, ChatError> {
        let tiers = self.daemon.tiers().await?;
        let gears_of = |kind: TaskKind| {
            let tier = self.policies.get(kind).tier;
            tiers.iter().find(|t| t.tier == tier).map_or(ChatGears::UNMEASURED, |t| chat_gears(&t.model, &t.model_path))
        };
        let (answer, check) = (gears_of(TaskKind::ChatAnswer), gears_of(TaskKind::Classify));
        self.rules = rules_for(&answer);
        self.profile &= answer.profile;
        self.quick_check &= check.quick_check;
        Ok(answer)
    }

    /// The record keeper, with the settings as they are now.
    fn keeper(&self) -> RecordKeeper<D> {
        RecordKeeper {
            daemon: self.daemon.clone(),
            store: self.store.clone(),
            background: self.background.clone(),
            policies: self.policies.clone(),
            sampling: self.sampling,
            rules: self.rules.clone(),
            profile: self.profile,
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
        self.keeper().escalate(reply, Escalation { by: EscalatedBy::User, why: None }, true).await
    }

    /// Goes on with conversation `id` instead: the prefix warmed for the
    /// other one is no longer of use.
    pub fn open(&mut self, id: ConversationId) {
        self.conversation = id;
        self.pre.consumed();
    }

    /// A key was pressed in the message being typed. `first`: the message
    /// was empty before it (the typing signal starts the pre-prefill even if
    /// typing was already on); `draft`: the message as it reads now, when
    /// known.
    ///
    /// Typing holds background work until no key has been pressed for
    /// [`Chat::typing_idle`] (or [`Chat::typing_stopped`], or the message is
    /// sent); when typing starts (or resumes after such a pause) the static
    /// part of the next prompt is warmed ([`Chat::typing_started`]), and
    /// the draft is checked when the user pauses ([`Chat::draft`]). While a
    /// turn is under way only the draft is checked: typing resumes when the
    /// front end says the turn is over ([`Chat::resume_typing`]).
    ///
    /// Fails only when the next prompt could not be read to warm it; the
    /// draft is checked all the same.
    pub fn keystroke(&self, first: bool, draft: Option<&str>) -> Result<(), ChatError> {
        if self.turns.load(Ordering::SeqCst) > 0 {
            self.typed_in_turn.store(true, Ordering::SeqCst);
            if let Some(d) = draft {
                self.draft(d);
            }
            return Ok(());
        }
        self.typing.arm(self.typing_idle);
        let warmed = if first || !self.gates.state().typing { self.typing_started() } else { Ok(()) };
        if let Some(d) = draft {
            self.draft(d);
        }
        warmed
    }

    /// A turn is over and shown (answered, failed or stopped): if keys were
    /// pressed while it ran, typing resumes now, as [`Chat::keystroke`]
    /// starts it, warming the prompt that includes the turn.
    pub fn resume_typing(&self) -> Result<(), ChatError> {
        if !self.typed_in_turn.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        self.typing.arm(self.typing_idle);
        self.typing_started()
    }

    /// Resolves once the user is not typing (at once if they are not): no
    /// key pressed for [`Chat::typing_idle`], or typing ended another way.
    pub async fn typing_paused(&self) {
        self.typing.stopped().await;
    }

    /// The draft being typed, as it stands now: once it has stayed the same
    /// for [`DRAFT_PAUSE`] and no answer streams or pre-prefill computes,
    /// tier1 checks it, so the answer can use the check if the message sent
    /// is this draft. A newer draft replaces the check under way.
    pub fn draft(&self, text: &str) {
        self.drafts.start(text, DRAFT_PAUSE, self.quick_check);
    }

    /// Watches which draft's check has ended (its text), found or failed.
    pub fn draft_checked(&self) -> watch::Receiver<Option<String>> {
        self.drafts.subscribe()
    }

    /// The gates (the CLI and the GUI go through [`Chat::keystroke`] and
    /// [`Chat::watch_gates`]; tests and benchmarks hold them directly).
    pub fn gates(&self) -> &Gates {
        &self.gates
    }

    /// The pre-prefill (the CLI and the GUI go through [`Chat::keystroke`]
    /// and [`Chat::watch_prefill`]; tests and benchmarks use it directly).
    pub fn pre_prefill(&self) -> &PrePrefill<D> {
        &self.pre
    }

    /// The background runner (the CLI and the GUI go through
    /// [`Chat::background_outstanding`] and [`Chat::background_done`]).
    pub fn background(&self) -> &Background {
        &self.background
    }

    /// Watches the gates (for a UI).
    pub fn watch_gates(&self) -> watch::Receiver<GateState> {
        self.gates.subscribe()
    }

    /// Watches the pre-prefill's phase (for a UI).
    pub fn watch_prefill(&self) -> watch::Receiver<PrefillPhase> {
        self.pre.watch()
    }

    /// Background jobs queued or running now.
    pub fn background_outstanding(&self) -> usize {
        self.background.outstanding()
    }

    /// Resolves when every background job queued so far has run.
    pub async fn background_done(&self) {
        self.background.idle().await;
    }

    /// What the next prompt is built from, as the store holds it now.
    pub fn context(&self) -> Result<PromptContext, ChatError> {
        build_context(&self.store, self.conversation, &self.rules, self.profile, self.checklist, Bound::Unbounded)
    }

    /// The user started typing: warm the cache with the next prompt's static part.
    pub fn typing_started(&self) -> Result<(), ChatError> {
        let tier = self.policies.get(TaskKind::ChatAnswer).tier;
        self.pre.typing_started(tier, self.context()?.static_messages());
        Ok(())
    }

    /// The user stopped typing without sending (the message was cleared, a
    /// command was entered): background work may go on; the warm cache
    /// stays. While a turn is under way, only forgets the keys pressed during it.
    pub fn typing_stopped(&self) {
        if self.turns.load(Ordering::SeqCst) > 0 {
            self.typed_in_turn.store(false, Ordering::SeqCst);
            return;
        }
        self.typing.disarm();
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
    ///
    /// Typing ends here (the typing timer is off); keys pressed while the
    /// turn runs only update the draft ([`Chat::keystroke`]).
    ///
    /// The turn counts from the moment this is called, before the future
    /// is first polled: a key pressed in between belongs to it.
    pub fn send<'a>(&'a self, text: &'a str, on_delta: impl FnMut(&str) + Send + 'a) -> impl Future<Output = Result<Done, ChatError>> + 'a {
        let guard = self.begin_turn();
        async move {
            let result = self.turn(text, on_delta).await;
            guard.finish();
            result
        }
    }

    /// Counts a turn from now, before its future is first polled (a key
    /// pressed in between belongs to it), and ends typing.
    fn begin_turn(&self) -> TurnGuard<'_, D> {
        self.typing.disarm();
        self.typed_in_turn.store(false, Ordering::SeqCst);
        self.turns.fetch_add(1, Ordering::SeqCst);
        TurnGuard { chat: self, finished: false }
    }

    /// Names an untitled conversation after `text`, its first message.
    async fn title(&self, text: &str) -> Result<(), ChatError> {
        let (store, conversation, title) = (self.store.clone(), self.conversation, text.chars().take(TITLE_CHARS).collect::<String>());
        // A flushed write: off the async runtime.
        blocking(move || {
            if store.conversation(conversation)?.is_some_and(|c| c.title.is_empty()) {
                store.set_title(conversation, &title)?;
            }
            Ok(())
        })
        .await
    }

    /// [`Chat::send`]'s turn, once it is counted.
    async fn turn(&self, text: &str, mut on_delta: impl FnMut(&str) + Send) -> Result<Done, ChatError> {
        if text.trim().is_empty() {
            return Err(ChatError::Refused("the message is empty: there is nothing to answer".into()));
        }
        if text.len() > MAX_MESSAGE_BYTES {
            return Err(ChatError::Refused(format!(
                "the message is {} bytes; the limit is {MAX_MESSAGE_BYTES} bytes (256 KiB): send a shorter one",
                text.len()
            )));
        }
        if self.titling {
            self.title(text).await?;
        }
        let tier = self.policies.get(TaskKind::ChatAnswer).tier;
        let ctx = self.context()?;
        let check = if self.quick_check { self.drafts.take(text) } else { None };
        let language = check::language(text);
        let (store, conv, owned) = (self.store.clone(), self.conversation, text.to_owned());
        let t = tier.as_str();
        // Store writes fsync: keep them off the async runtime.
        let (user, reply) = blocking(move || Ok((store.append_user(conv, &owned)?, store.begin_reply(conv, t)?))).await?;
        let keeper = self.keeper();
        if let Some(c) = &check {
            let (stored, lang) = (c.clone(), language.map(str::to_owned));
            keeper
                .update_async(reply, move |r| {
                    r.check = Some(stored);
                    r.checked_before = true;
                    r.language = lang;
                })
                .await?;
            keeper.note(TurnNote::Checked { reply, check: c.clone(), before_answer: true });
        } else if let Some(l) = language {
            keeper.update_async(reply, move |r| r.language = Some(l.to_owned())).await?;
        }
        let asked = check.as_ref().map_or(text, |c| c.corrected.as_str());
        // Take the pipeline lock before Enter releases the typing hold and the
        // prefill freeze, so no background job slips in ahead of the answer.
        let streaming = self.gates.streaming();
        self.pre.enter().await;
        let mut req =
            if self.facts_beside { ctx.request(tier, &memory::with_what_was_said(&ctx.profile, asked)) } else { ctx.request(tier, asked) };
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
            result = self.stream_answer(req, &mut open, &mut on_delta).await;
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
            keeper.update_async(reply, move |r| r.notes = Some(n)).await?;
        }
        if check.as_ref().is_some_and(|c| c.escalate) {
            keeper.escalate(reply, Escalation { by: EscalatedBy::Check, why: None }, self.after_turn && self.auto_deep).await;
        } else if let Some(n) = parsed.filter(|n| n.escalate == Some(true)) {
            keeper.escalate(reply, Escalation { by: EscalatedBy::Checklist, why: n.why }, self.after_turn && self.auto_deep).await;
        }
        if self.after_turn {
            if self.quick_check && check.is_none() && text.len() <= check::CHECK_MAX_BYTES {
                keeper.check_after(reply, text.to_owned());
            }
            self.after_turn(text, user, reply, &done.text);
        }
        Ok(done)
    }

    /// Streams `req`'s answer into `open` (which saves it) and `on_delta`.
    /// The loop guard: once the reply (with any text it began with)
    /// repeats a span of itself, the generation is dropped (the daemon
    /// stops it within a token) and the answer ends there, as shown. The
    /// text returned is what followed the reply's text at the start, as
    /// the daemon's own is.
    async fn stream_answer(
        &self,
        req: GenerateParams,
        open: &mut OpenReply,
        mut on_delta: impl FnMut(&str) + Send,
    ) -> Result<Done, CallError> {
        let start = open.text().len();
        let looped = tokio::sync::Notify::new();
        let mut prompt_tokens = 0;
        let finished = {
            let generate = self.daemon.generate_started(
                req,
                |n| prompt_tokens = n,
                |t| {
                    // Recorded in the same step as it is shown: a drop comes before both or after both.
                    open.shown(t);
                    on_delta(t);
                    if self.loop_guard && repeats_itself(open.text()) {
                        looped.notify_one();
                    }
                },
            );
            tokio::select! {
                biased;
                () = looped.notified() => None,
                r = generate => Some(r),
            }
        };
        finished.unwrap_or_else(|| {
            tracing::debug!("the answer repeats itself: stopped there");
            // Dropped before the daemon's Done: the prompt's length is known,
            // the daemon's counts and times are not (0).
            Ok(Done { finish_reason: FinishReason::Stop, text: open.text()[start..].to_owned(), prompt_tokens, ..Done::default() })
        })
    }

    /// Removes `from` and every later message of this conversation, and
    /// returns them (in order): to edit a message, rewind from it and
    /// [`send`](Chat::send) the new text; to have an answer written again,
    /// rewind from the question and send it again.
    ///
    /// The removed replies' records go with them ([`turn_key`], and the
    /// audit under [`audit_key`]), and so does a summary that covered any
    /// of them (the store's [`Store::rewind`]); a late check or follow-up
    /// of a removed reply keeps nothing. The prefix warmed for the old
    /// history is dropped (a prefill under way for it is cancelled). Ids
    /// are never given twice: the next message comes after every removed
    /// one. Reply writes still pending (a reply just stopped) land first.
    ///
    /// Refused, with nothing removed, while a turn is under way (stop it
    /// first: drop its future) and for a message that is not in this
    /// conversation. Facts the profile learned from a removed message stay.
    pub async fn rewind(&self, from: MessageId) -> Result<Vec<StoredMessage>, ChatError> {
        if self.turns.load(Ordering::SeqCst) > 0 {
            return Err(ChatError::Refused("a reply is being written: stop it before editing or regenerating".into()));
        }
        let conversation = self.conversation;
        if from.conversation != conversation {
            return Err(ChatError::Refused(format!(
                "message {from} belongs to conversation {}, not to the one open here ({conversation}): nothing was removed",
                from.conversation
            )));
        }
        // A reply just stopped hands its text to the writer as it drops: that
        // save must not land after the removal (it would fail, or bring the
        // reply back).
        if let Err(e) = self.saved().await {
            tracing::warn!("a reply cut short before the rewind was not saved: {e}");
        }
        let (store, records) = (self.store.clone(), self.records.clone());
        let removed = blocking(move || {
            if store.message(from)?.is_none() {
                return Err(ChatError::Refused(format!(
                    "message {from} is not in this conversation (it may have been removed already): nothing was removed"
                )));
            }
            let removed = store.rewind(from)?;
            // Under the record keeper's lock: a record being written now is
            // written before this removes it, and a later one is not written.
            let _one = records.lock().unwrap_or_else(|p| p.into_inner());
            for reply in removed.iter().filter(|m| m.role == Role::Assistant) {
                for key in [turn_key(reply.id), audit_key(reply.id)] {
                    // Left behind it names no message (ids are never given twice): harmless.
                    if let Err(e) = store.remove_setting(&key) {
                        tracing::warn!("removing {key} of a rewound reply failed: {e}");
                    }
                }
            }
            Ok(removed)
        })
        .await;
        self.pre.forget();
        removed
    }

    /// Continues a reply that was cut off (stopped, or its stream failed):
    /// the last message of this conversation, still
    /// [`MessageState::Incomplete`]. The model is asked again what the
    /// reply answers (the conversation up to and including the user's
    /// message before it, as [`Chat::send`] asked it, the message corrected
    /// if the turn's check corrected it), with the reply's text so far as
    /// the start of its answer (`answer_prefix`), and goes on from there.
    /// The new text streams through `on_delta` and is added to the same
    /// message, completed when the stream ends; the [`Done`] returned has
    /// the whole reply's text (the earlier text and what followed), its
    /// counts are the continuation's. `max_tokens` counts the continuation
    /// alone. The work a finished turn leaves behind (the check, the
    /// facts, the summary) is queued then, as for a turn never stopped.
    ///
    /// As [`Chat::send`]: a counted turn from the moment this is called,
    /// typing ends, the answer holds the gates and uses the warm prefix; a
    /// failure or a drop (Stop) saves exactly the text shown, the earlier
    /// text included, still incomplete, so it can be continued again. The
    /// checklist is not gone through again: its notes began the answer
    /// that was cut off and were never kept.
    ///
    /// Refused, before anything is asked or stored, for a message that is
    /// not in this conversation, not a reply, complete, or not the last.
    pub fn continue_reply<'a>(
        &'a self,
        reply: MessageId,
        on_delta: impl FnMut(&str) + Send + 'a,
    ) -> impl Future<Output = Result<Done, ChatError>> + 'a {
        let guard = self.begin_turn();
        async move {
            let result = self.continuation(reply, on_delta).await;
            guard.finish();
            result
        }
    }

    /// [`Chat::continue_reply`]'s turn, once it is counted.
    async fn continuation(&self, reply: MessageId, on_delta: impl FnMut(&str) + Send) -> Result<Done, ChatError> {
        // A reply just stopped is saved when the writes handed over are done:
        // continue from exactly what was shown, not an older save.
        self.saved().await?;
        let (store, conversation, rules, profile) = (self.store.clone(), self.conversation, self.rules.clone(), self.profile);
        let (user, cut, asked, ctx) = blocking(move || {
            let refuse = |why: String| Err(ChatError::Refused(format!("message {reply} cannot be continued: {why}")));
            if reply.conversation != conversation {
                return refuse(format!("it belongs to conversation {}, not to the one open here ({conversation})", reply.conversation));
            }
            let mut messages = store.messages(conversation)?;
            let Some(at) = messages.iter().position(|m| m.id == reply) else {
                return refuse("it is not in this conversation (it may have been removed)".into());
            };
            match &messages[at] {
                m if m.role != Role::Assistant => return refuse("it is the user's; only a reply can be continued".into()),
                m if m.state == MessageState::Complete => {
                    return refuse("it is complete; only a reply that was cut off (stopped, or failed) can be continued".into());
                }
                _ if at + 1 != messages.len() => {
                    return refuse("later messages follow it; only the last message can be continued".into());
                }
                _ => {}
            }
            let cut = messages.remove(at);
            let Some(user) = at.checked_sub(1).map(|i| messages.swap_remove(i)).filter(|m| m.role == Role::User) else {
                return refuse("no message of the user's comes before it, so there is nothing it answers".into());
            };
            // The turn answered the corrected message if its check was ready in time.
            let asked = turn_record(&store, reply)?
                .filter(|r| r.checked_before)
                .and_then(|r| r.check)
                .map_or_else(|| user.text.clone(), |c| c.corrected);
            // Up to the user's message, which the request adds (once); the
            // reply itself, incomplete, is never part of the history.
            let ctx = build_context(&store, conversation, &rules, profile, false, Bound::Excluded(user.id))?;
            Ok((user, cut, asked, ctx))
        })
        .await?;
        let tier = self.policies.get(TaskKind::ChatAnswer).tier;
        let streaming = self.gates.streaming();
        self.pre.enter().await;
        let mut req = if self.facts_beside {
            ctx.request(tier, &memory::with_what_was_said(&ctx.profile, &asked))
        } else {
            ctx.request(tier, &asked)
        };
        req.sampling = self.sampling;
        req.max_tokens = self.max_tokens;
        req.answer_prefix = cut.text.clone();
        // From here on, however this ends, what was shown (the earlier text with it) is saved.
        let mut open = OpenReply::resume(self.writer.clone(), self.store.clone(), reply, cut.text.clone(), self.partial_save_every);
        let result = self.stream_answer(req, &mut open, on_delta).await;
        drop(streaming);
        self.pre.consumed();
        let done = match result {
            Ok(done) => Done { text: format!("{}{}", cut.text, done.text), ..done },
            Err(failed) => {
                if let Err(e) = open.cut().await {
                    tracing::warn!("saving the cut reply failed: {e}");
                }
                return Err(ChatError::Call(failed));
            }
        };
        open.complete(done.text.clone()).await?;
        // What the stopped turn did not get to: its escalation, or the check it did not wait for.
        let read = self.store.clone();
        let record = blocking(move || turn_record(&read, reply)).await?.unwrap_or_default();
        let keeper = self.keeper();
        match &record.check {
            Some(c) if c.escalate && record.escalation.is_none() => {
                keeper.escalate(reply, Escalation { by: EscalatedBy::Check, why: None }, self.after_turn && self.auto_deep).await;
            }
            None if self.after_turn && self.quick_check && user.text.len() <= check::CHECK_MAX_BYTES => {
                keeper.check_after(reply, user.text.clone());
            }
            _ => {}
        }
        if self.after_turn {
            self.after_turn(&user.text, user.id, reply, &done.text);
        }
        Ok(done)
    }

    /// Queues the background work a turn leaves behind.
    fn after_turn(&self, user_text: &str, user: MessageId, reply: MessageId, answer: &str) {
        if self.audit {
            self.memory.audit(user_text, reply, answer);
        }
        if self.profile && self.learn {
            self.memory.extract(user_text, user);
            self.memory.consolidate();
        }
        let Ok(ctx) = self.context() else { return };
        self.memory.summarise(self.conversation, ctx);
    }
}
