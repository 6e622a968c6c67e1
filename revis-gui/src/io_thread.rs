//! The app's I/O side: one thread running a tokio runtime that owns the
//! client, the store, the orchestrator's [`Chat`](revis_orchestrator::conversation::Chat), the keyring and the
//! pairing stream. The UI sends [`Command`]s and reads [`Event`]s; nothing
//! here runs on the UI thread, and nothing on the UI thread waits for it.
//!
//! This file holds the handle the UI keeps ([`IoThread`]), the I/O side's
//! state and its command loop; each kind of work has a room of its own:
//! the connection to revisd ([`connect`]), the conversations
//! ([`conversations`]), the profile ([`memory`]), the models and their
//! downloads ([`models`]), the tiers, offload and ensembles ([`tiers`]),
//! the nodes this machine pairs with ([`nodes`]), server mode ([`server`])
//! and the saved settings ([`settings`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use revis_client::dispatch::Dispatcher;
pub use revis_client::nodes::{Health, NodeRow};
use revis_client::{Client, Discovered};
use revis_store::Store;
use tokio::sync::mpsc;

mod connect;
mod conversations;
mod memory;
mod models;
mod nodes;
mod server;
mod settings;
mod tiers;

pub use nodes::BROWSE_WAIT;

pub use crate::options::Options;
use crate::protocol::Sink;
pub use crate::protocol::{Command, Event, PairingEvent, TierPlacement};

/// How often the daemon's status is read while connected.
pub const STATUS_EVERY: Duration = Duration::from_secs(3);

/// The handle the UI holds: commands in, events out. Dropping it stops the
/// I/O thread (and cancels whatever it was doing).
pub struct IoThread {
    tx: Option<mpsc::UnboundedSender<Command>>,
    rx: std_mpsc::Receiver<Event>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl IoThread {
    /// Starts the I/O thread; `wake` is called after each event (the UI's repaint).
    pub fn start(opts: Options, wake: impl Fn() + Send + Sync + 'static) -> IoThread {
        let (tx, cmds) = mpsc::unbounded_channel();
        let (etx, rx) = std_mpsc::channel();
        let sink = Sink::new(etx, Arc::new(wake));
        let thread = std::thread::Builder::new()
            .name("revis-gui-io".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => return sink.send(Event::Disconnected(format!("could not start the I/O runtime: {e}"))),
                };
                rt.block_on(Io::new(opts, sink).run(cmds));
                rt.shutdown_timeout(Duration::from_secs(2));
            })
            .expect("spawn the I/O thread");
        let io = IoThread { tx: Some(tx), rx, thread: Some(thread) };
        io.send(Command::Connect);
        io
    }

    pub fn send(&self, c: Command) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(c);
        }
    }

    pub fn try_recv(&self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// Waits up to `limit` for the next event.
    pub fn recv_timeout(&self, limit: Duration) -> Option<Event> {
        self.rx.recv_timeout(limit).ok()
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        self.tx = None; // the command loop ends, then the runtime
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The state of the I/O side.
struct Io {
    opts: Options,
    sink: Sink,
    client: Option<Client>,
    store: Option<Store>,
    chat: Option<mpsc::UnboundedSender<Command>>,
    /// Which daemon runs which task (this machine, or a node for offloaded tiers).
    dispatcher: Option<Dispatcher>,
    pairing: Option<tokio::task::AbortHandle>,
    /// What the last browse saw, to pair by name.
    seen: Arc<std::sync::Mutex<Vec<Discovered>>>,
    /// The download under way, to cancel it.
    pull_cancel: Option<revis_models::Cancel>,
    /// What the I/O side's own tasks tell its loop.
    internal: mpsc::UnboundedSender<Internal>,
    internal_rx: Option<mpsc::UnboundedReceiver<Internal>>,
}

/// What the I/O side's own tasks tell its loop.
enum Internal {
    /// A download ended; `start`: it was the machine's first model, so revisd can start now.
    PullEnded { start: bool },
}

impl Io {
    fn new(opts: Options, sink: Sink) -> Io {
        let store = opts.store.clone();
        let (internal, internal_rx) = mpsc::unbounded_channel();
        Io {
            opts,
            sink,
            client: None,
            store,
            chat: None,
            dispatcher: None,
            pairing: None,
            seen: Default::default(),
            pull_cancel: None,
            internal,
            internal_rx: Some(internal_rx),
        }
    }

    async fn run(mut self, mut cmds: mpsc::UnboundedReceiver<Command>) {
        let mut tick = tokio::time::interval(STATUS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let Some(mut internal) = self.internal_rx.take() else { return };
        loop {
            let cmd = tokio::select! {
                c = cmds.recv() => match c { Some(c) => c, None => break },
                Some(i) = internal.recv() => match i {
                    Internal::PullEnded { start } => {
                        self.pull_cancel = None;
                        if start {
                            self.connect().await;
                        }
                        self.list_models();
                        continue;
                    }
                },
                _ = tick.tick() => {
                    if self.client.is_some() {
                        self.status();
                    }
                    continue;
                }
            };
            self.handle(cmd).await;
        }
        if let Some(p) = self.pairing.take() {
            p.abort();
        }
    }

    /// Hands a command to the chat task, once connected (a message before
    /// then is answered that it was not sent).
    fn to_chat(&self, c: Command) {
        match &self.chat {
            Some(chat) => {
                let _ = chat.send(c);
            }
            None if matches!(c, Command::Send(_) | Command::Resend { .. } | Command::Continue(_)) => {
                self.sink.send(Event::AnswerFailed("not connected to revisd yet; the message was not sent".into()))
            }
            None => {}
        }
    }

    async fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Connect => self.connect().await,
            Command::RefreshStatus => self.status(),
            c @ (Command::NewConversation
            | Command::OpenConversation(_)
            | Command::Keystroke { .. }
            | Command::InputCleared
            | Command::Send(_)
            | Command::Resend { .. }
            | Command::Continue(_)
            | Command::Stop
            | Command::GoDeeper(_)) => self.to_chat(c),
            Command::SetLearning(on) => {
                self.save_learning(on);
                self.to_chat(Command::SetLearning(on));
            }
            Command::Load(tier) => self.tier(tier, true),
            Command::Unload(tier) => self.tier(tier, false),
            Command::RefreshNodes => self.nodes(),
            Command::Pair { node, code } => self.pair(node, code),
            Command::Forget(id) => self.forget(id),
            Command::SetServerMode(on) => self.server_mode(on),
            Command::OpenPairing => self.open_pairing(),
            Command::ClosePairing => self.close_pairing(),
            Command::Revoke(device) => self.revoke(device),
            Command::SetOffload { tier, on } => self.offload(tier, on),
            Command::SetEnsemble { tier, spec } => self.ensemble(tier, spec),
            Command::RestartDaemon => {
                self.sink.send(Event::Restarting);
                let r = self.restart_daemon().await;
                self.sink.send(Event::Restarted(r));
            }
            Command::Search(query) => self.search(query),
            Command::Rename { id, title } => {
                let title = title.trim().to_owned();
                self.store_then_list("renaming the conversation", move |s| s.set_title(id, &title)).await;
            }
            // Done here, not in a task of its own: the app's last command on exit is often this one.
            Command::Delete(id) => self.store_then_list("deleting the conversation", move |s| s.delete_conversation(id).map(|_| ())).await,
            Command::ListModels => self.list_models(),
            Command::Memory(m) => self.memory(m).await,
            Command::Pull { name, anyway } => self.pull(name, anyway),
            Command::CancelPull => {
                if let Some(c) = &self.pull_cancel {
                    c.cancel();
                }
            }
            Command::UseModel { tier, model } => self.use_model(tier, model),
            Command::SaveAppearance(a) => self.save_appearance(a),
            Command::SaveSettings(s) => self.save_settings(s),
        }
    }

    fn keyring_dir(&self) -> PathBuf {
        self.opts.paths().keyring()
    }
}
