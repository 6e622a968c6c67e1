//! The app's I/O side: one thread running a tokio runtime that owns the
//! client, the store, the orchestrator's [`Chat`], the keyring and the
//! pairing stream. The UI sends [`Command`]s and reads [`Event`]s; nothing
//! here runs on the UI thread, and nothing on the UI thread waits for it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use revis_client::dispatch::{Deadlines, Dispatcher, Offload, Placement};
use revis_client::ensemble::{EnsembleSpec, MemberProblem, MemberSpec};
pub use revis_client::nodes::{Health, NodeRow};
use revis_client::nodes::{find_unpaired, node_rows, probe};
use revis_client::{Client, ClientError, Discovered, Keyring, Tier};
use revis_store::Store;
use tokio::sync::mpsc;

mod memory;

pub use crate::options::Options;
use crate::protocol::Sink;
pub use crate::protocol::{Command, Event, PairingEvent, TierPlacement};
use crate::settings::Settings;

/// How long the app listens for other machines' advertisements.
pub const BROWSE_WAIT: Duration = Duration::from_millis(1500);
/// How often the daemon's status is read while connected.
pub const STATUS_EVERY: Duration = Duration::from_secs(3);

/// How often the nodes are probed and the tiers' placement applied.
const PLACEMENT_EVERY: Duration = Duration::from_secs(3);

/// Where each tier runs, for the Tiers panel.
fn placements(d: &Dispatcher) -> BTreeMap<Tier, TierPlacement> {
    d.placements()
        .into_iter()
        .map(|(tier, p)| {
            let offloaded = d.offload(tier).enabled;
            let runs_on = match p {
                Placement::Local => "this machine".to_owned(),
                Placement::Node(name) => name,
                Placement::FallenBack => "this machine (no node answers)".to_owned(),
            };
            (tier, TierPlacement { offloaded, runs_on })
        })
        .collect()
}

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
            | Command::SetLearning(_)
            | Command::GoDeeper(_)) => match &self.chat {
                Some(chat) => {
                    let _ = chat.send(c);
                }
                None if matches!(c, Command::Send(_) | Command::Resend { .. } | Command::Continue(_)) => {
                    self.sink.send(Event::AnswerFailed("not connected to revisd yet; the message was not sent".into()))
                }
                None => {}
            },
            Command::Load(tier) => self.tier(tier, true),
            Command::Unload(tier) => self.tier(tier, false),
            Command::RefreshNodes => self.nodes(),
            Command::Pair { node, code } => self.pair(node, code),
            Command::Forget(id) => self.forget(id),
            Command::SetServerMode(on) => self.server_mode(on),
            Command::OpenPairing => self.open_pairing(),
            Command::ClosePairing => {
                if let Some(p) = self.pairing.take() {
                    p.abort();
                    self.sink.send(Event::Pairing(PairingEvent::Closed { reason: "closed here".into() }));
                }
            }
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
            Command::UseModel { tier, model } => {
                let (sink, config, data) = (self.sink.clone(), self.opts.config.clone(), self.opts.data_dir.clone());
                tokio::task::spawn_blocking(move || {
                    let r = Settings::load(&config, &data).and_then(|mut s| {
                        s.tiers.insert(tier, model.clone());
                        s.save(&config)?;
                        Ok(s)
                    });
                    match r {
                        Ok(s) => {
                            sink.send(Event::Settings(s));
                            sink.send(Event::SettingsSaved(Ok(format!(
                                "{tier} uses {model} from revisd's next start (Settings: Restart revisd now)."
                            ))));
                        }
                        Err(e) => sink.send(Event::SettingsSaved(Err(e.to_string()))),
                    }
                });
            }
            Command::SaveAppearance(a) => {
                let (sink, config) = (self.sink.clone(), self.opts.config.clone());
                tokio::task::spawn_blocking(move || match a.save(&config) {
                    Ok(()) => sink.send(Event::AppearanceSaved(a)),
                    Err(e) => sink.error("saving the look of the app", e.to_string()),
                });
            }
            Command::SaveSettings(s) => {
                let (sink, config) = (self.sink.clone(), self.opts.config.clone());
                tokio::task::spawn_blocking(move || {
                    let r = s.save(&config).map_err(|e| e.to_string());
                    sink.send(Event::SettingsSaved(r));
                });
            }
        }
    }

    /// Ends this machine's revisd and starts it again, so it reads its
    /// configuration again ([`revis_client::restart_daemon`]: the
    /// configuration is checked first). The chat keeps its connection: it
    /// reconnects to the new daemon on its next call.
    async fn restart_daemon(&mut self) -> Result<String, String> {
        let Some(client) = self.client.clone() else { return Err("not connected to revisd yet".into()) };
        let sink = self.sink.clone();
        let mut ended = false;
        let restarted = revis_client::restart_daemon(&client, &self.opts.spawn, || {
            ended = true;
            sink.send(Event::Connecting { starting: true });
        })
        .await;
        match restarted {
            Ok(new) => {
                self.sink.send(Event::Connected { target: new.client.target().to_string() });
                self.client = Some(new.client);
                self.status();
                Ok(format!("revisd restarted (pid {}) with the saved settings.", new.pid))
            }
            Err(e) => {
                if ended {
                    self.sink.send(Event::Disconnected(e.clone()));
                }
                Err(e)
            }
        }
    }

    /// Opens the store, connects to (or starts) the daemon, and starts the chat.
    async fn connect(&mut self) {
        if self.store.is_none() {
            let dir = self.opts.paths().store();
            match tokio::task::spawn_blocking(move || Store::open(&dir)).await {
                Ok(Ok(opened)) => {
                    if let Some(r) = &opened.recovered {
                        self.sink.error("opening your conversations", r.to_string());
                    }
                    self.store = Some(opened.store);
                }
                Ok(Err(e)) => self.sink.error("opening your conversations", e.to_string()),
                Err(e) => self.sink.error("opening your conversations", e.to_string()),
            }
        }
        {
            let (sink, config, data) = (self.sink.clone(), self.opts.config.clone(), self.opts.data_dir.clone());
            tokio::task::spawn_blocking(move || match Settings::load(&config, &data) {
                Ok(s) => sink.send(Event::Settings(s)),
                Err(e) => sink.error("reading the settings", e.to_string()),
            });
        }
        if self.client.is_none() {
            self.sink.send(Event::Connecting { starting: false });
            let socket = self.opts.socket.clone();
            let client = match Client::answering(&socket).await {
                Ok(Some(c)) => Ok(c),
                // Not this user's socket, maybe: start nothing there.
                Err(e @ ClientError::Untrusted { .. }) => Err(e),
                // A first run: the model is chosen in the Models view, not downloaded unasked.
                _ if self.opts.start_daemon && self.no_model_yet().await => {
                    self.sink.send(Event::NeedModel(
                        "revis has no model yet. Choose one below (the one marked fits this machine best); revisd starts once it is downloaded."
                            .into(),
                    ));
                    self.list_models();
                    return;
                }
                _ if self.opts.start_daemon => {
                    self.sink.send(Event::Connecting { starting: true });
                    Client::connect_or_start(&socket, &self.opts.spawn).await
                }
                Ok(None) => Err(ClientError::NotRunning { path: socket.clone(), reason: "it does not answer".into() }),
                Err(e) => Err(e),
            };
            match client {
                Ok(c) => {
                    self.sink.send(Event::Connected { target: c.target().to_string() });
                    self.client = Some(c);
                }
                Err(e) => {
                    self.sink.send(Event::Disconnected(e.words()));
                    return;
                }
            }
        }
        self.status();
        self.devices();
        if self.chat.is_none()
            && let (Some(client), Some(store)) = (&self.client, &self.store)
        {
            let dir = self.keyring_dir();
            let keyring = match tokio::task::spawn_blocking(move || Keyring::open(&dir)).await {
                Ok(Ok(k)) => Some(Arc::new(k)),
                Ok(Err(e)) => {
                    self.sink.error("opening this machine's keyring", e.words());
                    None
                }
                Err(e) => {
                    self.sink.error("opening this machine's keyring", e.to_string());
                    None
                }
            };
            let offload = revis_orchestrator::offload::load_all(store);
            let dispatcher = Dispatcher::new(client.clone(), keyring, self.opts.discovery.clone(), offload, Deadlines::default());
            // The ensembles the user set answer from the first message on.
            let ensembles = revis_orchestrator::ensemble::load_all(store);
            revis_orchestrator::ensemble::apply(&dispatcher, ensembles.clone());
            self.sink.send(Event::Ensembles(ensembles));
            // Nodes' health, breakers and the tiers' placement stay current on their own.
            let supervisor = dispatcher.spawn_supervisor(PLACEMENT_EVERY);
            let (sink, d) = (self.sink.clone(), dispatcher.clone());
            tokio::spawn(async move {
                // Tell the UI after each pass; the pass itself runs in the supervisor.
                let mut tick = tokio::time::interval(PLACEMENT_EVERY);
                loop {
                    tick.tick().await;
                    if supervisor.is_finished() {
                        break;
                    }
                    sink.send(Event::Placements(placements(&d)));
                }
            });
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(crate::chat_actor::chat_actor(dispatcher.clone(), store.clone(), self.opts.clone(), rx, self.sink.clone()));
            self.chat = Some(tx);
            self.dispatcher = Some(dispatcher);
        }
    }

    /// No model downloaded and none named in revisd.toml: nothing to start revisd with.
    async fn no_model_yet(&self) -> bool {
        let (models, config, data) = (self.opts.paths().models(), self.opts.config.clone(), self.opts.data_dir.clone());
        tokio::task::spawn_blocking(move || {
            let named = Settings::load(&config, &data).is_ok_and(|s| s.tiers.values().any(|m| !m.trim().is_empty()));
            !named && !revis_models::any_downloaded(&models)
        })
        .await
        .unwrap_or(false)
    }

    /// Runs a store write, then lists the conversations again.
    async fn store_then_list(&self, what: &'static str, f: impl FnOnce(&Store) -> Result<(), revis_store::StoreError> + Send + 'static) {
        let Some(store) = self.store.clone() else { return self.sink.error(what, "the conversations are not open yet") };
        let r = tokio::task::spawn_blocking(move || f(&store).and_then(|()| store.conversations())).await;
        match r {
            Ok(Ok(list)) => self.sink.send(Event::Conversations(list)),
            Ok(Err(e)) => self.sink.error(what, e.to_string()),
            Err(e) => self.sink.error(what, e.to_string()),
        }
    }

    /// The conversations whose messages hold `query` (any case).
    fn search(&self, query: String) {
        let Some(store) = self.store.clone() else { return };
        let sink = self.sink.clone();
        tokio::task::spawn_blocking(move || {
            let q = query.trim().to_lowercase();
            let mut ids = Vec::new();
            if !q.is_empty() {
                for c in store.conversations().unwrap_or_default() {
                    if store.messages(c.id).is_ok_and(|m| m.iter().any(|m| m.text.to_lowercase().contains(&q))) {
                        ids.push(c.id);
                    }
                }
            }
            sink.send(Event::SearchHits { query, ids });
        });
    }

    /// The catalog as this machine sees it (memory, expected speed), and what is downloaded.
    fn list_models(&self) {
        let (sink, dir) = (self.sink.clone(), self.opts.paths().models());
        tokio::spawn(async move {
            let here = revis_client::speed::measure_here(&dir).await;
            sink.send(Event::Models(Box::new(models_info(&dir, here))));
        });
    }

    /// Downloads a model (catalog name or `hf:` reference) with progress;
    /// the first model of a machine becomes its default and revisd starts.
    fn pull(&mut self, name: String, anyway: bool) {
        if self.pull_cancel.is_some() {
            return self
                .sink
                .send(Event::PullDone { model: name, result: Err("another download is under way; wait for it or cancel it".into()) });
        }
        let model = match revis_models::ModelRef::parse_known(name.trim()) {
            Ok(m) => m,
            Err(e) => return self.sink.send(Event::PullDone { model: name, result: Err(e.to_string()) }),
        };
        let cancel = revis_models::Cancel::new();
        self.pull_cancel = Some(cancel.clone());
        let (sink, dir) = (self.sink.clone(), self.opts.paths().models());
        let first = !revis_models::any_downloaded(&dir);
        let shown = model.to_string();
        let progress = {
            let (sink, shown) = (sink.clone(), shown.clone());
            revis_models::Reporter::new(move |label, done, total| {
                sink.send(Event::PullProgress { model: shown.clone(), label: label.to_owned(), done, total });
            })
        };
        let opts = revis_models::PullOptions {
            progress: revis_models::Progress::Report(progress),
            cancel: Some(cancel),
            ..self.opts.pull.clone()
        };
        let task = tokio::task::spawn_blocking(move || {
            // A catalog model's memory is checked in the view; a Hugging Face file's size is known once the Hub is asked.
            if let (revis_models::ModelRef::HuggingFace(r), false) = (&model, anyway) {
                let file = revis_models::resolve_hf(r, &opts)?;
                let memory = revis_models::machine::memory_bytes();
                if file.size as f64 > revis_models::choose::MEMORY_SHARE * memory as f64 {
                    let size = revis_models::choose::human_bytes;
                    return Ok(Err(format!(
                        "Its file is {}, more than half of this machine's {} of memory; other programs may slow down.",
                        size(file.size),
                        size(memory)
                    )));
                }
            }
            let path = model.pull(&dir, &opts)?;
            if first {
                revis_models::set_default_model(&dir, &model)?;
            }
            Ok::<_, revis_models::Error>(Ok(path))
        });
        let tx = self.internal.clone();
        tokio::spawn(async move {
            let result = match task.await {
                Ok(Ok(Err(why))) => {
                    sink.send(Event::PullTooLarge { model: shown, why });
                    let _ = tx.send(Internal::PullEnded { start: false });
                    return;
                }
                Ok(Ok(Ok(path))) if first => {
                    Ok(format!("{shown} is downloaded ({}) and is the default model; starting revisd…", path.display()))
                }
                Ok(Ok(Ok(path))) => Ok(format!("{shown} is downloaded ({}). Use it for a tier below.", path.display())),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let start = first && result.is_ok();
            sink.send(Event::PullDone { model: shown, result });
            let _ = tx.send(Internal::PullEnded { start });
        });
    }

    /// Switches a tier's offload: saved in the store, applied now (the
    /// model unloaded here, or loaded again when it comes home).
    fn offload(&self, tier: Tier, on: bool) {
        let (Some(d), Some(store)) = (self.dispatcher.clone(), self.store.clone()) else {
            return self.sink.error("switching offload", "not connected to revisd yet");
        };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            let setting = Offload { enabled: on, ..d.offload(tier) };
            let saved = setting.clone();
            match tokio::task::spawn_blocking(move || revis_orchestrator::offload::save(&store, tier, &saved)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return sink.error("saving the offload setting", e.to_string()),
                Err(e) => return sink.error("saving the offload setting", e.to_string()),
            }
            d.set_offload(tier, setting);
            d.refresh().await;
            if !on && let Err(e) = d.local().load_model(tier).await {
                sink.error("loading the tier here again", e.words());
            }
            sink.send(Event::Placements(placements(&d)));
            if let Ok(s) = d.local().status().await {
                sink.send(Event::Status(Box::new(s)));
            }
        });
    }

    /// Sets a tier's ensemble: checked (its settings; each member a tier
    /// this machine's revisd serves or a tier of a paired node), saved in
    /// the store, then handed to the dispatcher, so the tier's next answer
    /// comes from it. One that is refused changes nothing.
    fn ensemble(&self, tier: Tier, spec: EnsembleSpec) {
        let (Some(d), Some(store)) = (self.dispatcher.clone(), self.store.clone()) else {
            return self.sink.send(Event::EnsembleSet { tier, result: Err("not connected to revisd yet".into()) });
        };
        let (sink, keyring) = (self.sink.clone(), self.keyring_dir());
        tokio::spawn(async move {
            let result = async {
                spec.check()?;
                if spec.enabled {
                    check_members(&d, keyring, &spec.members).await?;
                }
                let saved = spec.clone();
                match tokio::task::spawn_blocking(move || revis_orchestrator::ensemble::save(&store, tier, &saved)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(format!("the ensemble could not be saved: {e}")),
                    Err(e) => return Err(format!("the ensemble could not be saved: {e}")),
                }
                d.set_ensemble(tier, spec.clone());
                Ok(spec)
            }
            .await;
            sink.send(Event::EnsembleSet { tier, result });
        });
    }

    fn status(&self) {
        let Some(c) = self.client.clone() else { return };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            match c.status().await {
                Ok(s) => {
                    if let Some(server) = &s.server {
                        sink.send(Event::ServerMode(server.clone()));
                    }
                    sink.send(Event::Status(Box::new(s)));
                }
                Err(e) => sink.send(Event::Disconnected(e.words())),
            }
        });
    }

    fn devices(&self) {
        let Some(c) = self.client.clone() else { return };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            match c.list_devices().await {
                Ok(d) => sink.send(Event::Devices(d)),
                Err(e) => sink.error("listing paired devices", e.words()),
            }
        });
    }

    fn tier(&self, tier: Tier, load: bool) {
        let Some(c) = self.client.clone() else {
            return self.sink.send(Event::TierDone { tier, message: Err("not connected to revisd".into()) });
        };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            let message = if load {
                c.load_model(tier)
                    .await
                    .map(|r| format!("{} ready in {} ms ({} MiB)", r.tier.model, r.elapsed_ms, r.tier.memory_bytes >> 20))
            } else {
                c.unload_model(tier).await.map(|r| {
                    format!(
                        "{} unloaded; revisd now uses {} MiB (was {} MiB)",
                        r.tier.model,
                        r.rss_after_bytes >> 20,
                        r.rss_before_bytes >> 20
                    )
                })
            };
            sink.send(Event::TierDone { tier, message: message.map_err(|e| e.words()) });
            if let Ok(s) = c.status().await {
                sink.send(Event::Status(Box::new(s)));
            }
        });
    }

    fn keyring_dir(&self) -> PathBuf {
        self.opts.paths().keyring()
    }

    fn nodes(&self) {
        tokio::spawn(list_nodes(self.sink.clone(), self.keyring_dir(), self.opts.discovery.clone(), self.seen.clone()));
    }

    fn pair(&self, what: String, code: String) {
        let (sink, dir, seen, mdns) = (self.sink.clone(), self.keyring_dir(), self.seen.clone(), self.opts.discovery.clone());
        tokio::spawn(async move {
            let found = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let d = dir.clone();
            let r = async move {
                let code: revis_client::PairingCode = code.trim().parse().map_err(|e| format!("{e}"))?;
                let (addr, name) = find_unpaired(what.trim(), &found)?;
                let mut keyring =
                    tokio::task::spawn_blocking(move || Keyring::open(&d)).await.map_err(|e| e.to_string())?.map_err(|e| e.words())?;
                let me = revis_client::host_name("revis-client");
                let id = revis_client::pair(&mut keyring, addr, &name, &code, &me).await.map_err(|e| e.words())?;
                Ok::<_, String>(format!("Paired with {name} ({id}) at {addr}."))
            }
            .await;
            sink.send(Event::PairResult(r));
            list_nodes(sink, dir, mdns, seen).await;
        });
    }

    fn forget(&self, id: String) {
        let (sink, dir, seen, mdns) = (self.sink.clone(), self.keyring_dir(), self.seen.clone(), self.opts.discovery.clone());
        tokio::spawn(async move {
            let d = dir.clone();
            let r = tokio::task::spawn_blocking(move || {
                let mut keyring = Keyring::open(&d).map_err(|e| e.words())?;
                let dev =
                    keyring.store.find(&id).map_err(|e| e.to_string())?.cloned().ok_or_else(|| format!("no paired node is called {id}"))?;
                keyring.store.revoke(&dev.device_id).map_err(|e| e.to_string())?;
                Ok::<_, String>(())
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
            if let Err(e) = r {
                sink.error("forgetting a node", e);
            }
            list_nodes(sink, dir, mdns, seen).await;
        });
    }

    fn server_mode(&self, on: bool) {
        let Some(c) = self.client.clone() else { return self.sink.error("switching server mode", "not connected to revisd") };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            match c.set_server_mode(on).await {
                Ok(m) => sink.send(Event::ServerMode(m)),
                Err(e) => sink.error(if on { "turning server mode on" } else { "turning server mode off" }, e.words()),
            }
            if let Ok(s) = c.status().await {
                sink.send(Event::Status(Box::new(s)));
            }
        });
    }

    fn open_pairing(&mut self) {
        let Some(c) = self.client.clone() else { return self.sink.error("opening pairing", "not connected to revisd") };
        if let Some(p) = self.pairing.take() {
            p.abort();
        }
        let sink = self.sink.clone();
        let task = tokio::spawn(async move {
            let mut events = match c.open_pairing(0).await {
                Ok(events) => events,
                Err(e) => return sink.error("opening pairing", e.words()),
            };
            loop {
                let ev = match events.next().await {
                    Ok(Some(e)) => match e {
                        revis_client::PairingEvent::Opened { code, expires_in_s, listen_address, device_id } => PairingEvent::Opened {
                            code,
                            expires_at: Instant::now() + Duration::from_secs(expires_in_s.into()),
                            listen_address,
                            device_id,
                        },
                        revis_client::PairingEvent::Paired { name, device_id } => PairingEvent::Paired { name, device_id },
                        revis_client::PairingEvent::Closed { reason } => PairingEvent::Closed { reason },
                    },
                    Ok(None) => PairingEvent::Closed { reason: "revisd closed the window".into() },
                    Err(e) => PairingEvent::Closed { reason: e.words() },
                };
                let end = !matches!(ev, PairingEvent::Opened { .. });
                sink.send(Event::Pairing(ev));
                if end {
                    break;
                }
            }
            if let Ok(d) = c.list_devices().await {
                sink.send(Event::Devices(d));
            }
        });
        self.pairing = Some(task.abort_handle());
    }

    fn revoke(&self, device: String) {
        let Some(c) = self.client.clone() else { return };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            if let Err(e) = c.revoke_device(&device).await {
                sink.error("revoking a device", e.words());
            }
            match c.list_devices().await {
                Ok(d) => sink.send(Event::Devices(d)),
                Err(e) => sink.error("listing paired devices", e.words()),
            }
        });
    }
}

/// The catalog as this machine (`here`, measured) sees it.
fn models_info(dir: &std::path::Path, here: revis_client::speed::Here) -> crate::protocol::ModelsInfo {
    use revis_models::choose::human_bytes;
    let machine = here.machine;
    let catalog = revis_models::catalog();
    let recommended = revis_models::choose(&machine, catalog).entry.name;
    let rows = catalog
        .iter()
        .map(|e| {
            let est = revis_models::choose::estimate(e, &machine);
            crate::protocol::ModelRow {
                name: e.name.to_owned(),
                params: e.params.to_owned(),
                description: e.description.to_owned(),
                size: human_bytes(e.size),
                memory: human_bytes(est.memory_bytes),
                tokens_per_s: est.tokens_per_s,
                measured: machine.decode.as_ref().is_some_and(|d| d.model == e.name),
                fits_memory: est.fits_memory,
                fits: est.fits(),
                downloaded: e.is_present(dir),
                recommended: e.name == recommended,
            }
        })
        .collect();
    // Models pulled by Hugging Face reference, by the name that finds them again.
    let other = revis_models::downloaded_hf(dir).into_iter().map(|(name, size)| (name, human_bytes(size))).collect();
    crate::protocol::ModelsInfo {
        machine: match &here.note {
            Some(note) => format!("{}; {note}", machine.describe()),
            None => machine.describe(),
        },
        busy: machine.busy(),
        rows,
        other,
        default_model: revis_models::default_model(dir),
        dir: dir.display().to_string(),
    }
}

/// An ensemble's member on a node names a paired node; a member here names a
/// tier this machine's revisd serves (as `revis ensemble` checks them).
async fn check_members(d: &Dispatcher, keyring: PathBuf, members: &[MemberSpec]) -> Result<(), String> {
    let nodes: Vec<String> = members.iter().filter_map(|m| m.node.clone()).collect();
    let paired = tokio::task::spawn_blocking(move || -> Result<Vec<String>, String> {
        if nodes.is_empty() {
            return Ok(nodes);
        }
        let keyring = Keyring::open(&keyring).map_err(|e| e.words())?;
        let mut paired = Vec::new();
        for n in nodes {
            if keyring.store.find(&n).map_err(|e| e.to_string())?.is_some() {
                paired.push(n);
            }
        }
        Ok(paired)
    })
    .await
    .map_err(|e| e.to_string())??;
    let served = if members.iter().any(|m| m.node.is_none()) {
        d.local().status().await.map_err(|e| e.words())?.tiers.iter().map(|t| t.tier).collect()
    } else {
        Vec::new()
    };
    revis_client::ensemble::check_members(members, |n| paired.iter().any(|p| p == n), || served).map_err(|e| match e {
        MemberProblem::NotPaired(_) => format!("{e}; the Nodes view lists them and pairs one"),
        _ => e.to_string(),
    })
}

/// Discovered and paired nodes; the paired ones probed over mutual TLS
/// (two events: the list at once, then with each node's health).
async fn list_nodes(
    sink: Sink,
    dir: PathBuf,
    discovery: Option<revis_client::Interfaces>,
    seen_cache: Arc<std::sync::Mutex<Vec<Discovered>>>,
) {
    let keyring = match tokio::task::spawn_blocking(move || Keyring::open(&dir)).await {
        Ok(Ok(k)) => k,
        Ok(Err(e)) => return sink.error("reading your paired nodes", e.words()),
        Err(e) => return sink.error("reading your paired nodes", e.to_string()),
    };
    // Discovery off (REVIS_MDNS_INTERFACES=none): no multicast at all.
    let (seen, note) = match discovery {
        None => (Vec::new(), Some("Discovery is off (REVIS_MDNS_INTERFACES=none): pair by address, HOST:PORT.".to_owned())),
        Some(interfaces) => match revis_client::browse(&interfaces, BROWSE_WAIT, |_| false).await {
            Ok(s) => (s, None),
            Err(e) => (Vec::new(), Some(format!("Could not look for other machines: {e}"))),
        },
    };
    *seen_cache.lock().unwrap_or_else(|p| p.into_inner()) = seen.clone();
    let mut rows = node_rows(&keyring, &seen);
    sink.send(Event::Nodes { rows: rows.clone(), note: note.clone() });
    for row in rows.iter_mut().filter(|r| r.paired) {
        row.health = probe(&keyring, row).await;
    }
    sink.send(Event::Nodes { rows, note });
}
