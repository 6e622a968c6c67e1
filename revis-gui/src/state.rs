//! What the UI shows, built only from the I/O side's [`Event`]s. Pure data:
//! applying an event never blocks. A message as shown lives in
//! [`message`], the Tiers view's ensemble fields in [`ensemble`].

mod ensemble;
mod message;

use std::collections::{BTreeMap, BTreeSet};

use revis_client::ensemble::EnsembleSpec;
use revis_client::nodes::NodeRow;
use revis_client::{DaemonStatus, DeviceInfo, ServerMode, Tier};
use revis_orchestrator::conversation::TurnNote;
use revis_orchestrator::{GateState, PrefillPhase};
use revis_store::{Conversation, ConversationId, MessageId, MessageState, Role};

pub use ensemble::EnsembleFields;
pub use message::{Deep, Gears, Message, Shown};
use message::{correction, escalation};

use crate::protocol::{Event, ModelsInfo, PairingEvent, TierPlacement};
use crate::settings::{Appearance, Settings};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Chat,
    Tiers,
    Nodes,
    Server,
    Models,
    Memory,
    Settings,
}

impl View {
    pub const ALL: [View; 7] = [View::Chat, View::Tiers, View::Nodes, View::Server, View::Models, View::Memory, View::Settings];

    pub fn title(self) -> &'static str {
        match self {
            View::Chat => "Chat",
            View::Tiers => "Tiers",
            View::Nodes => "Nodes",
            View::Server => "Server mode",
            View::Models => "Models",
            View::Memory => "Memory",
            View::Settings => "Settings",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Connection {
    Connecting,
    /// No daemon answered: starting one.
    Starting,
    Connected(String),
    Failed(String),
}

#[derive(Default)]
pub struct State {
    pub view: Option<View>,
    pub connection: Option<Connection>,
    /// Failures to show, in words, newest last.
    pub errors: Vec<String>,

    pub conversations: Vec<Conversation>,
    pub current: Option<ConversationId>,
    pub messages: Vec<Message>,
    pub input: String,
    pub streaming: bool,
    pub phase: Option<PrefillPhase>,
    pub gates: GateState,
    pub last_stats: Option<String>,
    /// What the conversation list is filtered by.
    pub search: String,
    /// The conversations whose messages hold `search` (titles are matched here).
    pub search_hits: Option<(String, Vec<ConversationId>)>,
    /// A conversation being renamed, and the title typed so far.
    pub renaming: Option<(ConversationId, String)>,
    /// A conversation deleted but not yet for good: its undo is offered until `until`.
    pub pending_delete: Option<(Conversation, std::time::Instant)>,
    /// A message of the user's being edited (its index on screen) and the text so far.
    pub editing: Option<(usize, String)>,
    /// Messages removed by a resend (their ids are never given again).
    pub gone: BTreeSet<MessageId>,

    /// The Models view's facts (None until read).
    pub models: Option<ModelsInfo>,
    /// What the Models view's "Hugging Face" field holds.
    pub pull_name: String,
    /// The download under way: model, file, bytes so far, size.
    pub pull: Option<(String, String, u64, Option<u64>)>,
    /// How the last download ended, in words.
    pub pull_note: Option<Result<String, String>>,
    /// A large download waiting for the user's yes (a model that does not
    /// fit): the model, and why it is large, in a sentence.
    pub pull_confirm: Option<(String, String)>,
    /// No model yet: why the Models view opened first.
    pub need_model: Option<String>,
    /// The look of the app (theme, text size), as shown.
    pub appearance: Appearance,
    /// The look as last written to gui.toml.
    pub appearance_saved: Option<Appearance>,

    pub status: Option<DaemonStatus>,
    /// Tiers with a load or unload in flight.
    pub tier_busy: BTreeSet<Tier>,
    pub tier_notes: BTreeMap<Tier, Result<String, String>>,
    /// Where each tier runs (from the dispatcher).
    pub placements: BTreeMap<Tier, TierPlacement>,
    /// Each tier's ensemble as stored, on or off (None until the I/O side has read them).
    pub ensembles: Option<BTreeMap<Tier, EnsembleSpec>>,
    /// What the Tiers view's ensemble fields hold, per tier.
    pub ensemble_fields: BTreeMap<Tier, EnsembleFields>,
    /// Tiers whose ensemble change is on its way: the switch's position meanwhile.
    pub ensemble_wanted: BTreeMap<Tier, bool>,
    /// Why a tier's last ensemble change was refused.
    pub ensemble_notes: BTreeMap<Tier, String>,

    pub nodes: Vec<NodeRow>,
    pub nodes_note: Option<String>,
    pub nodes_loading: bool,
    pub pair_node: String,
    pub pair_code: String,
    pub pairing_with: bool,
    pub pair_result: Option<Result<String, String>>,

    pub server: Option<ServerMode>,
    /// The switch's position while a change is on its way.
    pub server_wanted: Option<bool>,
    pub pairing: Option<PairingEvent>,
    pub devices: Vec<DeviceInfo>,

    pub settings: Option<Settings>,
    pub settings_draft: Option<Settings>,
    pub settings_note: Option<Result<String, String>>,
    /// A restart of revisd is under way.
    pub restarting: bool,

    /// The profile's facts (None until read).
    pub facts: Option<Vec<revis_store::Fact>>,
    /// What the Memory view's last change did, or why it was refused.
    pub facts_note: Option<Result<String, String>>,
    /// The fact being edited, and its text so far.
    pub fact_edit: Option<(revis_store::FactId, String)>,
    /// The Memory view's "tell revis" box.
    pub fact_draft: String,
    /// The chat learns facts from what the user says (the Memory view's
    /// switch, as gui.toml keeps it; None: on).
    pub learning: Option<bool>,
}

impl State {
    pub fn view(&self) -> View {
        self.view.unwrap_or(View::Chat)
    }

    pub fn apply(&mut self, e: Event) {
        match e {
            Event::Connecting { starting } => self.connection = Some(if starting { Connection::Starting } else { Connection::Connecting }),
            Event::Connected { target } => self.connection = Some(Connection::Connected(target)),
            Event::Placements(p) => self.placements = p,
            Event::Ensembles(all) => {
                for tier in Tier::ALL {
                    self.ensemble_fields.insert(tier, all.get(&tier).map(EnsembleFields::of).unwrap_or_default());
                }
                self.ensembles = Some(all);
            }
            Event::EnsembleSet { tier, result } => {
                self.ensemble_wanted.remove(&tier);
                match result {
                    Ok(spec) => {
                        self.ensemble_notes.remove(&tier);
                        self.ensembles.get_or_insert_default().insert(tier, spec);
                    }
                    Err(why) => {
                        self.ensemble_notes.insert(tier, why);
                    }
                }
            }
            Event::Disconnected(why) => self.connection = Some(Connection::Failed(why)),
            Event::Status(s) => {
                if matches!(self.connection, Some(Connection::Failed(_) | Connection::Starting)) {
                    self.connection = Some(Connection::Connected(String::new()));
                }
                self.status = Some(*s);
            }
            Event::Conversations(c) => self.conversations = c,
            Event::Opened { id, messages, records } => {
                self.current = Some(id);
                self.messages = messages
                    .into_iter()
                    .map(|m| Message {
                        from_user: m.role == Role::User,
                        shown: if m.state == MessageState::Complete { Shown::Complete } else { Shown::Incomplete },
                        pieces: 0,
                        gears: records.get(&m.id).map(Gears::of).unwrap_or_default(),
                        id: Some(m.id),
                        footer: m.tier.clone(),
                        tier: m.tier,
                        text: m.text,
                    })
                    .collect();
            }
            Event::Note(note) => self.note(note),
            Event::Delta(t) => {
                if let Some(m) = self.messages.last_mut().filter(|m| m.shown == Shown::Streaming) {
                    m.text.push_str(&t);
                    m.pieces += 1;
                }
            }
            Event::AnswerDone { text, stats, tier } => {
                let ran = self.ran_on(tier);
                self.end_answer(Some(text), Shown::Complete, Some(stats.clone()));
                if let Some(m) = self.messages.iter_mut().rev().find(|m| !m.from_user) {
                    m.tier = Some(tier.to_string());
                    m.footer = Some(format!("{tier} on {ran} · {stats}"));
                }
            }
            Event::TurnIds { user, reply } => {
                if let Some(i) = self.messages.iter().rposition(|m| !m.from_user && (m.id.is_none() || m.id == Some(reply))) {
                    self.messages[i].id = Some(reply);
                    if let Some(u) = user
                        && let Some(m) = self.messages[..i].iter_mut().rev().find(|m| m.from_user)
                    {
                        m.id = Some(u);
                    }
                }
            }
            Event::SearchHits { query, ids } => self.search_hits = Some((query, ids)),
            Event::Models(m) => self.models = Some(*m),
            Event::Facts { facts, note } => {
                self.facts = Some(facts);
                if note.is_some() {
                    self.facts_note = note;
                }
            }
            Event::PullProgress { model, label, done, total } => self.pull = Some((model, label, done, total)),
            Event::AppearanceSaved(a) => self.appearance_saved = Some(a),
            Event::PullTooLarge { model, why } => {
                self.pull = None;
                self.pull_confirm = Some((model, why));
            }
            Event::PullDone { result, .. } => {
                self.pull = None;
                if result.is_ok() {
                    self.need_model = None;
                }
                self.pull_note = Some(result);
            }
            Event::NeedModel(why) => {
                // The status bar says why nothing is connected (and Try again asks again).
                self.connection = Some(Connection::Failed("there is no model yet: choose one in Models".into()));
                self.need_model = Some(why);
                self.view = Some(View::Models);
            }
            Event::AnswerStopped { text } => self.end_answer(Some(text), Shown::Stopped, None),
            Event::AnswerFailed(why) => {
                self.end_answer(None, Shown::Failed, None);
                self.errors.push(why);
            }
            Event::Phase(p) => self.phase = Some(p),
            Event::Gates(g) => self.gates = g,
            Event::TierDone { tier, message } => {
                self.tier_busy.remove(&tier);
                self.tier_notes.insert(tier, message);
            }
            Event::Nodes { rows, note } => {
                self.nodes = rows;
                self.nodes_note = note;
                self.nodes_loading = false;
            }
            Event::PairResult(r) => {
                self.pairing_with = false;
                if r.is_ok() {
                    self.pair_code.clear();
                }
                self.pair_result = Some(r);
            }
            Event::ServerMode(s) => {
                self.server_wanted = None;
                if !s.enabled {
                    self.pairing = None;
                }
                self.server = Some(s);
            }
            Event::Pairing(p) => self.pairing = Some(p),
            Event::Devices(d) => self.devices = d,
            Event::Settings(s) => {
                self.settings_draft = Some(s.clone());
                self.settings = Some(s);
            }
            Event::Restarting => self.restarting = true,
            Event::Restarted(r) => {
                self.restarting = false;
                self.settings_note = Some(r);
            }
            Event::SettingsSaved(r) => {
                if r.is_ok() {
                    self.settings.clone_from(&self.settings_draft);
                }
                self.settings_note = Some(r);
            }
            Event::Error { what, message } => self.errors.push(format!("{what}: {message}")),
        }
    }

    /// The user sent `text`: it shows at once, with an empty answer that streams in.
    pub fn sent(&mut self, text: String) {
        self.messages.push(Message::user(text));
        self.messages.push(Message::answer());
        self.streaming = true;
        self.last_stats = None;
        self.editing = None;
    }

    /// The user's message at `index` is sent again as `text` (edited, or
    /// the same to regenerate): it and everything after it leave the
    /// screen, as they leave the store. The command to send, if that
    /// message is stored.
    pub fn resent(&mut self, index: usize, text: String) -> Option<crate::protocol::Command> {
        let from = self.messages.get(index).filter(|m| m.from_user)?.id?;
        // Notes still on their way about the answers removed must not land on the new one.
        self.gone.extend(self.messages[index..].iter().filter_map(|m| m.id));
        self.messages.truncate(index);
        self.sent(text.clone());
        Some(crate::protocol::Command::Resend { from, text })
    }

    /// The answer at the end, stopped or cut off, goes on: it streams
    /// again. The command to send, if it can.
    pub fn continuing(&mut self) -> Option<crate::protocol::Command> {
        let m = self.messages.last_mut().filter(|m| !m.from_user && matches!(m.shown, Shown::Stopped | Shown::Incomplete))?;
        let id = m.id?;
        m.shown = Shown::Streaming;
        m.footer = None;
        self.streaming = true;
        self.last_stats = None;
        Some(crate::protocol::Command::Continue(id))
    }

    /// Where `tier` runs now, in words: an ensemble, a split, a node, or this machine.
    pub fn ran_on(&self, tier: Tier) -> String {
        if let Some(e) = self.ensembles.as_ref().and_then(|e| e.get(&tier)).filter(|e| e.enabled) {
            let members: Vec<String> = e.members.iter().map(ToString::to_string).collect();
            return format!("an ensemble of {}", members.join(" and "));
        }
        let split = self.status.as_ref().and_then(|s| s.tiers.iter().find(|t| t.tier == tier)).map(|t| t.split.clone()).unwrap_or_default();
        match self.placements.get(&tier).map(|p| p.runs_on.as_str()) {
            None | Some("this machine") if !split.is_empty() => format!("this machine and others ({split})"),
            None => "this machine".to_owned(),
            Some(p) => p.to_owned(),
        }
    }

    /// The conversations the list shows: all, or those whose title or
    /// messages hold the search, without one being deleted.
    pub fn listed(&self) -> Vec<&Conversation> {
        let q = self.search.trim().to_lowercase();
        let hidden = self.pending_delete.as_ref().map(|(c, _)| c.id);
        self.conversations
            .iter()
            .filter(|c| Some(c.id) != hidden)
            .filter(|c| {
                q.is_empty()
                    || c.title.to_lowercase().contains(&q)
                    || self.search_hits.as_ref().is_some_and(|(hq, ids)| hq.trim().to_lowercase() == q && ids.contains(&c.id))
            })
            .collect()
    }

    /// The answer a note is about: the one with its id, else (a note about
    /// the answer just given, in this conversation) the last answer not yet
    /// knowing its id, which learns it.
    fn answer_for(&mut self, reply: MessageId) -> Option<&mut Message> {
        if self.gone.contains(&reply) {
            return None;
        }
        if let Some(i) = self.messages.iter().position(|m| m.id == Some(reply)) {
            return self.messages.get_mut(i);
        }
        if self.current != Some(reply.conversation) {
            return None;
        }
        let m = self.messages.iter_mut().rev().find(|m| !m.from_user).filter(|m| m.id.is_none())?;
        m.id = Some(reply);
        Some(m)
    }

    fn note(&mut self, note: TurnNote) {
        match note {
            TurnNote::Checked { reply, check, before_answer } => {
                if let Some(m) = self.answer_for(reply)
                    && !check.corrections.is_empty()
                {
                    m.gears.correction = Some(correction(&check, before_answer));
                }
            }
            TurnNote::Escalated { reply, escalation: e, queued } => {
                if let Some(m) = self.answer_for(reply) {
                    m.gears.escalation = Some(escalation(&e));
                    if queued && m.gears.deep == Deep::None {
                        m.gears.deep = Deep::Asked;
                    }
                }
            }
            TurnNote::DeepStarted { reply, .. } => {
                if let Some(m) = self.answer_for(reply) {
                    m.gears.deep = Deep::Writing;
                }
            }
            TurnNote::Deep { reply, text } => {
                if let Some(m) = self.answer_for(reply) {
                    m.gears.deep = Deep::Done(text);
                }
            }
            TurnNote::DeepFailed { reply, error } => {
                if let Some(m) = self.answer_for(reply) {
                    m.gears.deep = Deep::Failed(error);
                }
            }
        }
    }

    fn end_answer(&mut self, text: Option<String>, shown: Shown, stats: Option<String>) {
        self.streaming = false;
        if let Some(m) = self.messages.last_mut().filter(|m| m.shown == Shown::Streaming) {
            if let Some(t) = text {
                m.text = t;
            }
            m.shown = shown;
        }
        self.last_stats = stats;
    }

    pub fn connected(&self) -> bool {
        matches!(self.connection, Some(Connection::Connected(_)))
    }

    /// The last answer on screen, if any.
    pub fn last_answer(&self) -> Option<&Message> {
        self.messages.iter().rev().find(|m| !m.from_user)
    }
}

#[cfg(test)]
mod tests {
    use revis_orchestrator::conversation::{EscalatedBy, Escalation};

    use super::*;

    #[test]
    fn the_gears_notes_land_on_the_answer_they_are_about() {
        let mut s = State::default();
        let conv = ConversationId(1);
        s.current = Some(conv);
        s.sent("Waht is a monad?".into());
        let reply = MessageId { conversation: conv, seq: 1 };
        let check = revis_orchestrator::check::QuickCheck {
            corrected: "What is a monad?".into(),
            corrections: vec![revis_orchestrator::check::Correction { wrong: "Waht".into(), right: "What".into() }],
            ..Default::default()
        };
        s.apply(Event::Note(TurnNote::Checked { reply, check, before_answer: true }));
        s.apply(Event::Delta("A monad is".into()));
        s.apply(Event::AnswerDone { text: "A monad is a pattern.".into(), stats: String::new(), tier: Tier::Tier2 });
        s.apply(Event::Note(TurnNote::Escalated {
            reply,
            escalation: Escalation { by: EscalatedBy::Checklist, why: Some("it needs care".into()) },
            queued: true,
        }));
        assert_eq!(s.messages[1].gears.deep, Deep::Asked);
        s.apply(Event::Note(TurnNote::DeepStarted { reply, tier: Tier::Tier3 }));
        assert_eq!(s.messages[1].gears.deep, Deep::Writing);
        // A note about another conversation's answer changes nothing here.
        s.apply(Event::Note(TurnNote::Deep { reply: MessageId { conversation: ConversationId(9), seq: 1 }, text: "elsewhere".into() }));
        s.apply(Event::Note(TurnNote::Deep { reply, text: "Longer.".into() }));
        let answer = &s.messages[1];
        assert_eq!(answer.id, Some(reply));
        assert_eq!(answer.gears.correction.as_deref(), Some("Read your message as \u{201c}What is a monad?\u{201d} (Waht → What)"));
        assert_eq!(answer.gears.escalation.as_deref(), Some("tier2's checklist thinks this needs tier3: it needs care"));
        assert_eq!(answer.gears.deep, Deep::Done("Longer.".into()));
        assert_eq!(s.messages[0].gears, Gears::default(), "the user's message carries none");
    }
}
