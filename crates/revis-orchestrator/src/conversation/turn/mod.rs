//! The turn: [`Chat`], one conversation driven by the orchestrator. It owns
//! what a turn needs from the first keystroke to the last background job:
//! the typing signal ([`Chat::keystroke`]: the typing hold, the pre-prefill,
//! the typing timer and tier1's draft check), the conversation's title, the
//! answer streamed and stored ([`super::reply`]), its record and escalation
//! ([`super::escalation`]) and the memory work it leaves behind
//! ([`super::memory`]); and going back on a turn: the conversation rewound
//! for an edit or a regeneration ([`Chat::rewind`]), a reply that was cut
//! off continued ([`Chat::continue_reply`]).
//!
//! One job a file: here [`Chat`], its settings, the typing signal and what
//! it hands out; `answer.rs`, the turn itself, from the message sent to the
//! stored answer and the work it leaves behind; `rewind.rs`, going back on
//! a turn. Both use this file's [`Chat`]; this file names neither.

mod answer;
mod rewind;

use std::collections::HashSet;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use revis_client::{Runner, Sampling};
use revis_models::{ChatGears, chat_gears};
use revis_store::{ConversationId, MessageId, Store};
use tokio::sync::{broadcast, watch};

use super::context::{RULES, build_context, rules_for};
use super::draft::{DRAFT_PAUSE, DraftCheck};
use super::error::ChatError;
use super::escalation::{DEEP_MAX_TOKENS, RecordKeeper};
use super::memory::{Beside, Memory};
use super::record::{EscalatedBy, Escalation, TurnNote, TurnRecord, turn_record};
use super::reply::Writer;
use super::typing::TypingTimer;
use crate::prompt::PromptContext;
use crate::task::{Background, Policies, TaskKind};
use crate::{GateState, Gates, PrePrefill, PrefillPhase};

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
    /// Where a question about the person gets the profile facts it asks
    /// about in the prompt (`memory::with_what_was_said`), besides the
    /// system message: before it by default; the turn benchmark measures
    /// the forms.
    pub facts_beside: Beside,
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
    /// The answer stops once it repeats a span of itself ([`super::repeats_itself`]);
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
            facts_beside: Beside::default(),
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
}
