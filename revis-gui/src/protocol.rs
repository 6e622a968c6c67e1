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
use revis_store::{Conversation, ConversationId, MessageId, StoredMessage};

use crate::settings::Settings;

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
    },
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
