//! What the UI thread and the I/O side say to each other: [`Command`]s in,
//! [`Event`]s out (through a [`Sink`] that wakes the UI), and failures in
//! words a person can act on. The I/O side's parts ([`crate::io_thread`],
//! the chat actor) share these and not each other.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::Instant;

use revis_client::ensemble::EnsembleSpec;
use revis_client::nodes::NodeRow;
use revis_client::{DaemonStatus, DeviceInfo, ServerMode, Tier};
use revis_orchestrator::conversation::{ChatError, TurnNote, TurnRecord};
use revis_orchestrator::{GateState, PrefillPhase};
use revis_store::{Conversation, ConversationId, Fact, FactId, MessageId, StoredMessage};

use crate::settings::{Appearance, Settings};

/// What the UI asks for.
#[derive(Debug)]
pub enum Command {
    /// Connect to the daemon (starting one if allowed), then read everything.
    Connect,
    RefreshStatus,
    NewConversation,
    OpenConversation(ConversationId),
    /// A key was pressed in the message box; `first` = the box was empty;
    /// `draft` = what it holds now (tier1 checks it when the user pauses).
    Keystroke {
        first: bool,
        draft: String,
    },
    /// The message box was emptied without sending.
    InputCleared,
    Send(String),
    Stop,
    /// Ask tier3 for a deeper follow-up of this answer.
    GoDeeper(MessageId),
    /// Answer again: `from` (a message of the user's) and everything after
    /// it are removed, then `text` is sent in its place (the same text to
    /// regenerate the answer, an edited one to resend).
    Resend {
        from: MessageId,
        text: String,
    },
    /// Continue an answer that was stopped or cut off, from where it ended.
    Continue(MessageId),
    /// Which conversations hold `query` in their messages.
    Search(String),
    Rename {
        id: ConversationId,
        title: String,
    },
    /// Delete a conversation for good (the UI has already offered its undo).
    Delete(ConversationId),
    /// Read the catalog, what is downloaded, and what fits this machine.
    ListModels,
    /// Download a model: a catalog name or an `hf:` reference; a Hugging
    /// Face file larger than half this machine's memory waits for a yes
    /// (`anyway`) first.
    Pull {
        name: String,
        anyway: bool,
    },
    /// Stop the download under way; what was fetched is kept for the next try.
    CancelPull,
    /// Use a model for a tier (written to revisd.toml; applies once revisd restarts).
    UseModel {
        tier: Tier,
        model: String,
    },
    /// Save the look of the app (theme, text size) in gui.toml.
    SaveAppearance(Appearance),
    Load(Tier),
    Unload(Tier),
    RefreshNodes,
    /// Pair with a node (a discovered name or device ID, or HOST:PORT) using the code it shows.
    Pair {
        node: String,
        code: String,
    },
    /// Forget a paired node here.
    Forget(String),
    SetServerMode(bool),
    OpenPairing,
    ClosePairing,
    Revoke(String),
    SaveSettings(Settings),
    /// End this machine's revisd and start it again, so it reads the saved settings.
    RestartDaemon,
    /// Run a tier on paired nodes (its model unloaded here), or bring it home.
    SetOffload {
        tier: Tier,
        on: bool,
    },
    /// Set a tier's ensemble (on: its members answer the tier together;
    /// off: the tier answers alone, the members kept).
    SetEnsemble {
        tier: Tier,
        spec: EnsembleSpec,
    },
    /// The Memory view's work on the profile; each ends with the facts read again.
    Memory(MemoryCommand),
    /// Whether the chat learns facts from what the user says (the Memory
    /// view's switch, kept in gui.toml for the next start).
    SetLearning(bool),
}

/// What the Memory view asks of the profile.
#[derive(Debug)]
pub enum MemoryCommand {
    List,
    Forget(FactId),
    ForgetAll,
    /// Replace a fact by the person's own words (it becomes one they told revis).
    Edit {
        id: FactId,
        text: String,
    },
    /// A fact the person tells revis.
    Add(String),
}

/// Where a tier runs, as the Tiers panel shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierPlacement {
    /// The user's switch: offload on for this tier.
    pub offloaded: bool,
    /// In words: "this machine", a node's name, or why it is here after all.
    pub runs_on: String,
}

/// A pairing window on this daemon, as the Server panel shows it.
#[derive(Clone, Debug, PartialEq)]
pub enum PairingEvent {
    Opened { code: String, expires_at: Instant, listen_address: String, device_id: String },
    Paired { name: String, device_id: String },
    Closed { reason: String },
}

/// A catalog model, as the Models view shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelRow {
    pub name: String,
    pub params: String,
    pub description: String,
    /// The file's size, for people ("98 MB").
    pub size: String,
    /// Memory it needs once loaded, for people.
    pub memory: String,
    /// Expected decoding speed here.
    pub tokens_per_s: f64,
    /// `tokens_per_s` is what a real decode of it measured here (`revisd measure-speed`).
    pub measured: bool,
    /// It fits this machine's memory (half of it) and reaches reading speed.
    pub fits_memory: bool,
    pub fits: bool,
    pub downloaded: bool,
    /// The one revis would choose for this machine.
    pub recommended: bool,
}

/// The Models view's facts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelsInfo {
    /// This machine, in words ("8 cores, 16.0 GB of memory read at 40 GB/s (±3%), …"), and whether it was busy.
    pub machine: String,
    /// Other programs kept the cores busy while it was measured.
    pub busy: bool,
    pub rows: Vec<ModelRow>,
    /// Models downloaded by Hugging Face reference: the name that finds them (`hf:…`), and their size.
    pub other: Vec<(String, String)>,
    /// The model tiers use when revisd.toml names none.
    pub default_model: String,
    /// Where models are kept.
    pub dir: String,
}

/// What the I/O side tells the UI.
#[derive(Debug)]
pub enum Event {
    Connecting {
        starting: bool,
    },
    Connected {
        target: String,
    },
    /// The daemon cannot be reached (and could not be started), in words.
    Disconnected(String),
    Status(Box<DaemonStatus>),
    Conversations(Vec<Conversation>),
    Opened {
        id: ConversationId,
        messages: Vec<StoredMessage>,
        /// Each answer's record (its check, escalation, deeper follow-up), where it has one.
        records: BTreeMap<MessageId, TurnRecord>,
    },
    /// What a turn's gears report: a correction, an escalation, tier3's follow-up.
    Note(TurnNote),
    Delta(String),
    AnswerDone {
        text: String,
        stats: String,
        /// The tier that answered.
        tier: Tier,
    },
    /// The stored ids of the turn just ended: the user's message (none for
    /// a continued answer) and the answer.
    TurnIds {
        user: Option<MessageId>,
        reply: MessageId,
    },
    /// The conversations whose messages hold `query`.
    SearchHits {
        query: String,
        ids: Vec<ConversationId>,
    },
    /// The catalog as this machine sees it.
    Models(Box<ModelsInfo>),
    /// The profile's facts, oldest first, and what the last change did (or why it was refused).
    Facts {
        facts: Vec<Fact>,
        note: Option<Result<String, String>>,
    },
    /// A download's progress: the file, bytes so far, its size when known.
    PullProgress {
        model: String,
        label: String,
        done: u64,
        total: Option<u64>,
    },
    /// The look was written to gui.toml (as it was then).
    AppearanceSaved(Appearance),
    /// A download was not started: the model is larger than this machine
    /// takes well (why, in a sentence); it waits for the user's yes.
    PullTooLarge {
        model: String,
        why: String,
    },
    /// A download ended: what now, or why not, in words.
    PullDone {
        model: String,
        result: Result<String, String>,
    },
    /// No model is downloaded yet and no revisd runs: the Models view is
    /// where the first one is chosen (why, in words).
    NeedModel(String),
    /// The answer was stopped; `text` is what had arrived (stored, flagged incomplete).
    AnswerStopped {
        text: String,
    },
    AnswerFailed(String),
    Phase(PrefillPhase),
    Gates(GateState),
    /// A tier's load or unload finished (either way).
    TierDone {
        tier: Tier,
        message: Result<String, String>,
    },
    Nodes {
        rows: Vec<NodeRow>,
        note: Option<String>,
    },
    PairResult(Result<String, String>),
    ServerMode(ServerMode),
    Pairing(PairingEvent),
    Devices(Vec<DeviceInfo>),
    Settings(Settings),
    SettingsSaved(Result<String, String>),
    /// Restarting revisd: started, then how it went.
    Restarting,
    Restarted(Result<String, String>),
    /// Where each tier runs now, in words ("this machine", "desk", ...), and whether it is offloaded.
    Placements(BTreeMap<Tier, TierPlacement>),
    /// The ensembles the user set (on or off), as stored, once the dispatcher has them.
    Ensembles(BTreeMap<Tier, EnsembleSpec>),
    /// A tier's ensemble was saved and applies from the next answer (the
    /// settings as saved), or was refused and nothing changed (why, in words).
    EnsembleSet {
        tier: Tier,
        result: Result<EnsembleSpec, String>,
    },
    /// Something failed; `what` says what was being done.
    Error {
        what: &'static str,
        message: String,
    },
}

/// Sends events to the UI and wakes it.
#[derive(Clone)]
pub(crate) struct Sink {
    tx: std_mpsc::Sender<Event>,
    wake: Arc<dyn Fn() + Send + Sync>,
}

impl Sink {
    pub(crate) fn new(tx: std_mpsc::Sender<Event>, wake: Arc<dyn Fn() + Send + Sync>) -> Sink {
        Sink { tx, wake }
    }

    pub(crate) fn send(&self, e: Event) {
        let _ = self.tx.send(e);
        (self.wake)();
    }

    pub(crate) fn error(&self, what: &'static str, message: impl Into<String>) {
        self.send(Event::Error { what, message: message.into() });
    }
}

pub(crate) fn plain_chat(e: &ChatError) -> String {
    match e {
        ChatError::Call(c) => format!("revisd could not answer: {}", c.message),
        ChatError::Store(s) => format!("the conversation could not be saved: {s}"),
        ChatError::Refused(why) => why.clone(),
        ChatError::Writer(w) => format!("the conversation could not be saved: {w}"),
    }
}
