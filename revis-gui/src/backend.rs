//! The app's I/O side: one thread running a tokio runtime that owns the
//! client, the store, the orchestrator's [`Chat`], the keyring and the
//! pairing stream. The UI sends [`Command`]s and reads [`Event`]s; nothing
//! here runs on the UI thread, and nothing on the UI thread waits for it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

pub use revis_client::nodes::{Health, NodeRow, state_name};
use revis_client::nodes::{find_unpaired, node_rows, probe};
use revis_client::{Client, ClientError, Discovered, Keyring, SpawnOptions, interfaces_from_env, v1 as pb};
use revis_orchestrator::conversation::ChatError;
use revis_orchestrator::dispatch::{Deadlines, Dispatcher, Offload, Placement, offload_key};
use revis_orchestrator::{GateState, Phase};
use revis_store::{Conversation, ConversationId, Store, StoredMessage};
use tokio::sync::mpsc;

use crate::settings::Settings;

/// How long the app listens for other machines' advertisements.
pub const BROWSE_WAIT: Duration = Duration::from_millis(1500);
/// How often the daemon's status is read while connected.
pub const STATUS_EVERY: Duration = Duration::from_secs(3);

/// Where the app finds its daemon, data and settings.
#[derive(Clone, Debug)]
pub struct Options {
    /// The local daemon's socket.
    pub socket: PathBuf,
    /// Start a daemon on `socket` when none answers.
    pub start_daemon: bool,
    /// How a daemon is started (the revisd binary, its log).
    pub spawn: SpawnOptions,
    /// revis's data directory: the database (`db/`) and the keyring (`client/`).
    pub data_dir: PathBuf,
    /// revisd's configuration file (models per tier); the app's own
    /// settings (`gui.toml`) sit beside it.
    pub config: PathBuf,
    /// Without a keystroke for this long, typing counts as stopped.
    pub typing_idle: Duration,
    /// Where mDNS looks for other machines; None = discovery off
    /// (`REVIS_MDNS_INTERFACES=none`: nodes only at their last address).
    pub discovery: Option<revis_client::Interfaces>,
    /// Sampling for answers (None = the daemon's defaults).
    pub sampling: Option<pb::Sampling>,
    /// 0 = the daemon's default.
    pub max_tokens: u32,
}

impl Options {
    /// What the CLI uses: `$REVIS_SOCKET`, `$REVIS_DATA_DIR`, `$REVIS_CONFIG`
    /// and `$REVIS_MDNS_INTERFACES`, else the platform's defaults.
    pub fn from_env() -> anyhow::Result<Options> {
        Ok(Options {
            socket: std::env::var_os("REVIS_SOCKET")
                .filter(|s| !s.is_empty())
                .map_or_else(revis_client::default_socket_path, PathBuf::from),
            start_daemon: true,
            spawn: SpawnOptions { pull_default_model: true, config: Some(crate::settings::config_path()?), ..Default::default() },
            data_dir: revis_models::data_dir()?,
            config: crate::settings::config_path()?,
            typing_idle: Duration::from_secs(5),
            discovery: interfaces_from_env(),
            sampling: None,
            max_tokens: 0,
        })
    }
}

/// What the UI asks for.
#[derive(Debug)]
pub enum Command {
    /// Connect to the daemon (starting one if allowed), then read everything.
    Connect,
    RefreshStatus,
    NewConversation,
    OpenConversation(ConversationId),
    /// A key was pressed in the message box; `first` = the box was empty.
    Keystroke {
        first: bool,
    },
    /// The message box was emptied without sending.
    InputCleared,
    Send(String),
    Stop,
    Load(String),
    Unload(String),
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
        tier: String,
        on: bool,
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
    Status(Box<pb::StatusResponse>),
    /// The database, once open (the UI thread never reads it; tests do).
    StoreOpened(Store),
    Conversations(Vec<Conversation>),
    Opened {
        id: ConversationId,
        messages: Vec<StoredMessage>,
    },
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
    Phase(Phase),
    Gates(GateState),
    /// A tier's load or unload finished (either way).
    TierDone {
        tier: String,
        message: Result<String, String>,
    },
    Nodes {
        rows: Vec<NodeRow>,
        note: Option<String>,
    },
    PairResult(Result<String, String>),
    ServerMode(pb::ServerModeStatus),
    Pairing(PairingEvent),
    Devices(Vec<pb::PairedDeviceInfo>),
    Settings(Settings),
    SettingsSaved(Result<String, String>),
    /// Restarting revisd: started, then how it went.
    Restarting,
    Restarted(Result<String, String>),
    /// Where each tier runs now, in words ("this machine", "desk", ...), and whether it is offloaded.
    Placements(BTreeMap<String, TierPlacement>),
    /// Something failed; `what` says what was being done.
    Error {
        what: &'static str,
        message: String,
    },
}

/// How often the nodes are probed and the tiers' placement applied.
const PLACEMENT_EVERY: Duration = Duration::from_secs(3);

/// How long a restart waits for the old revisd to go.
const RESTART_WAIT: Duration = Duration::from_secs(15);

/// Whether process `pid` is still running. An exited child of this process
/// that nobody has reaped yet (a zombie) counts as gone: it holds nothing.
fn running(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid as i32, 0) } != 0 {
        return false;
    }
    // Linux says so in /proc; elsewhere revis reaps the daemons it starts.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// Where each tier runs, for the Tiers panel.
fn placements(d: &Dispatcher) -> BTreeMap<String, TierPlacement> {
    d.placements()
        .into_iter()
        .map(|(tier, p)| {
            let offloaded = d.offload(&tier).enabled;
            let runs_on = match p {
                Placement::Local => "this machine".to_owned(),
                Placement::Node(name) => name,
                Placement::FallenBack => "this machine (no node answers)".to_owned(),
            };
            (tier, TierPlacement { offloaded, runs_on })
        })
        .collect()
}

/// Sends events to the UI and wakes it.
#[derive(Clone)]
pub(crate) struct Sink {
    tx: std_mpsc::Sender<Event>,
    wake: Arc<dyn Fn() + Send + Sync>,
}

impl Sink {
    pub(crate) fn send(&self, e: Event) {
        let _ = self.tx.send(e);
        (self.wake)();
    }

    pub(crate) fn error(&self, what: &'static str, message: impl Into<String>) {
        self.send(Event::Error { what, message: message.into() });
    }
}

/// The handle the UI holds: commands in, events out. Dropping it stops the
/// I/O thread (and cancels whatever it was doing).
pub struct Backend {
    tx: Option<mpsc::UnboundedSender<Command>>,
    rx: std_mpsc::Receiver<Event>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Backend {
    /// Starts the I/O thread; `wake` is called after each event (the UI's repaint).
    pub fn start(opts: Options, wake: impl Fn() + Send + Sync + 'static) -> Backend {
        let (tx, cmds) = mpsc::unbounded_channel();
        let (etx, rx) = std_mpsc::channel();
        let sink = Sink { tx: etx, wake: Arc::new(wake) };
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
        let backend = Backend { tx: Some(tx), rx, thread: Some(thread) };
        backend.send(Command::Connect);
        backend
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

impl Drop for Backend {
    fn drop(&mut self) {
        self.tx = None; // the command loop ends, then the runtime
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A failure in words a person can act on.
fn plain(e: &ClientError) -> String {
    match e {
        ClientError::Rpc(s) => s.message().to_owned(),
        other => other.to_string(),
    }
}

pub(crate) fn plain_chat(e: &ChatError) -> String {
    match e {
        ChatError::Daemon(m) => format!("revisd could not answer: {m}"),
        ChatError::Store(s) => format!("the conversation could not be saved: {s}"),
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
}

impl Io {
    fn new(opts: Options, sink: Sink) -> Io {
        Io { opts, sink, client: None, store: None, chat: None, dispatcher: None, pairing: None, seen: Default::default() }
    }

    async fn run(mut self, mut cmds: mpsc::UnboundedReceiver<Command>) {
        let mut tick = tokio::time::interval(STATUS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let cmd = tokio::select! {
                c = cmds.recv() => match c { Some(c) => c, None => break },
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
            | Command::Stop) => match &self.chat {
                Some(chat) => {
                    let _ = chat.send(c);
                }
                None if matches!(c, Command::Send(_)) => {
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
            Command::RestartDaemon => {
                self.sink.send(Event::Restarting);
                let r = self.restart_daemon().await;
                self.sink.send(Event::Restarted(r));
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

    /// Ends this machine's revisd (SIGTERM, by the PID it reports on its own
    /// user's socket), waits for that process to exit, and starts revisd
    /// again, so it reads its configuration again. The configuration is
    /// checked first: a typo in a model leaves the running daemon alone. A
    /// service manager or socket activation may start the new daemon
    /// first; then that one is used. The chat keeps its connection: it
    /// reconnects to the new daemon on its next call.
    async fn restart_daemon(&mut self) -> Result<String, String> {
        let Some(mut client) = self.client.clone() else { return Err("not connected to revisd yet".into()) };
        if !matches!(client.target(), revis_client::Target::Socket(_)) {
            return Err("only this machine's revisd can be restarted from here".into());
        }
        revis_client::check_config(&self.opts.spawn).await.map_err(|e| format!("revisd was not restarted: {e}"))?;
        let old = client.status().await.map_err(|e| plain(&e))?.pid;
        if old == 0 {
            return Err("revisd did not say its process ID, so it was not restarted".into());
        }
        // The PID is only what the daemon said: end_daemon signals it only if it is this user's revisd.
        revis_client::end_daemon(old).map_err(|e| format!("revisd was not restarted: {e}"))?;
        self.sink.send(Event::Connecting { starting: true });
        let result = self.start_again(old).await;
        match &result {
            Ok(_) => {}
            Err(e) => self.sink.send(Event::Disconnected(e.clone())),
        }
        result
    }

    /// After SIGTERM to `old`: waits for it to exit (revisd exits within 5 s
    /// of SIGTERM), then connects to revisd, starting it if none answers.
    async fn start_again(&mut self, old: u32) -> Result<String, String> {
        let deadline = Instant::now() + RESTART_WAIT;
        while running(old) {
            if Instant::now() >= deadline {
                return Err(format!("revisd (pid {old}) did not stop within {}s", RESTART_WAIT.as_secs()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut client = Client::connect_or_start(&self.opts.socket, &self.opts.spawn).await.map_err(|e| plain(&e))?;
        let new = client.status().await.map_err(|e| plain(&e))?.pid;
        self.sink.send(Event::Connected { target: client.target().to_string() });
        self.client = Some(client);
        self.status();
        Ok(format!("revisd restarted (pid {new}) with the saved settings."))
    }

    /// Opens the store, connects to (or starts) the daemon, and starts the chat.
    async fn connect(&mut self) {
        if self.store.is_none() {
            let dir = self.opts.data_dir.join("db");
            match tokio::task::spawn_blocking(move || Store::open(&dir)).await {
                Ok(Ok(opened)) => {
                    if let Some(r) = &opened.recovered {
                        self.sink.error("opening your conversations", r.to_string());
                    }
                    self.sink.send(Event::StoreOpened(opened.store.clone()));
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
                    self.sink.send(Event::Disconnected(plain(&e)));
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
                    self.sink.error("opening this machine's keyring", plain(&e));
                    None
                }
                Err(e) => {
                    self.sink.error("opening this machine's keyring", e.to_string());
                    None
                }
            };
            let offload = Offload::load_all(store);
            let dispatcher = Dispatcher::new(client.clone(), keyring, self.opts.discovery.clone(), offload, Deadlines::default());
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

    /// Switches a tier's offload: saved in the store, applied now (the
    /// model unloaded here, or loaded again when it comes home).
    fn offload(&self, tier: String, on: bool) {
        let (Some(d), Some(store)) = (self.dispatcher.clone(), self.store.clone()) else {
            return self.sink.error("switching offload", "not connected to revisd yet");
        };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            let setting = Offload { enabled: on, ..d.offload(&tier) };
            let json = setting.to_json();
            let key = offload_key(&tier);
            match tokio::task::spawn_blocking(move || store.set_setting(&key, &json)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return sink.error("saving the offload setting", e.to_string()),
                Err(e) => return sink.error("saving the offload setting", e.to_string()),
            }
            d.set_offload(&tier, setting);
            d.refresh().await;
            if !on && let Err(e) = d.local().admin.clone().load_model(pb::LoadModelRequest { tier: tier.clone() }).await {
                sink.error("loading the tier here again", e.message());
            }
            sink.send(Event::Placements(placements(&d)));
            if let Ok(s) = d.local().clone().status().await {
                sink.send(Event::Status(Box::new(s)));
            }
        });
    }

    fn status(&self) {
        let Some(mut c) = self.client.clone() else { return };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            match c.status().await {
                Ok(s) => {
                    if let Some(server) = &s.server {
                        sink.send(Event::ServerMode(server.clone()));
                    }
                    sink.send(Event::Status(Box::new(s)));
                }
                Err(e) => sink.send(Event::Disconnected(plain(&e))),
            }
        });
    }

    fn devices(&self) {
        let Some(mut c) = self.client.clone() else { return };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            match c.admin.list_devices(pb::ListDevicesRequest {}).await {
                Ok(r) => sink.send(Event::Devices(r.into_inner().devices)),
                Err(s) => sink.error("listing paired devices", s.message()),
            }
        });
    }

    fn tier(&self, tier: String, load: bool) {
        let Some(mut c) = self.client.clone() else {
            return self.sink.send(Event::TierDone { tier, message: Err("not connected to revisd".into()) });
        };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            let message = if load {
                c.load_model(pb::LoadModelRequest { tier: tier.clone() }).await.map(|r| {
                    let t = r.tier.unwrap_or_default();
                    format!("{} ready in {} ms ({} MiB)", t.model, r.elapsed_ms, t.memory_bytes >> 20)
                })
            } else {
                c.unload_model(pb::UnloadModelRequest { tier: tier.clone() }).await.map(|r| {
                    let t = r.tier.unwrap_or_default();
                    format!("{} unloaded; revisd now uses {} MiB (was {} MiB)", t.model, r.rss_after_bytes >> 20, r.rss_before_bytes >> 20)
                })
            };
            sink.send(Event::TierDone { tier, message: message.map_err(|e| plain(&e)) });
            if let Ok(s) = c.status().await {
                sink.send(Event::Status(Box::new(s)));
            }
        });
    }

    fn keyring_dir(&self) -> PathBuf {
        self.opts.data_dir.join("client")
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
                    tokio::task::spawn_blocking(move || Keyring::open(&d)).await.map_err(|e| e.to_string())?.map_err(|e| plain(&e))?;
                let me = revis_client::host_name("revis-client");
                let id = revis_client::pair(&mut keyring, addr, &name, &code, &me).await.map_err(|e| plain(&e))?;
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
                let mut keyring = Keyring::open(&d).map_err(|e| plain(&e))?;
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
        let Some(mut c) = self.client.clone() else { return self.sink.error("switching server mode", "not connected to revisd") };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            match c.admin.set_server_mode(pb::SetServerModeRequest { enabled: on }).await {
                Ok(r) => sink.send(Event::ServerMode(r.into_inner())),
                Err(s) => sink.error(if on { "turning server mode on" } else { "turning server mode off" }, s.message()),
            }
            if let Ok(s) = c.status().await {
                sink.send(Event::Status(Box::new(s)));
            }
        });
    }

    fn open_pairing(&mut self) {
        let Some(mut c) = self.client.clone() else { return self.sink.error("opening pairing", "not connected to revisd") };
        if let Some(p) = self.pairing.take() {
            p.abort();
        }
        let sink = self.sink.clone();
        let task = tokio::spawn(async move {
            let mut events = match c.admin.open_pairing(pb::OpenPairingRequest { window_s: 0 }).await {
                Ok(r) => r.into_inner(),
                Err(s) => return sink.error("opening pairing", s.message()),
            };
            loop {
                match events.message().await {
                    Ok(Some(pb::PairingEvent { event: Some(e) })) => {
                        let ev = match e {
                            pb::pairing_event::Event::Opened(o) => PairingEvent::Opened {
                                code: o.code,
                                expires_at: Instant::now() + Duration::from_secs(o.expires_in_s.into()),
                                listen_address: o.listen_address,
                                device_id: o.device_id,
                            },
                            pb::pairing_event::Event::Paired(p) => PairingEvent::Paired { name: p.name, device_id: p.device_id },
                            pb::pairing_event::Event::Closed(c) => PairingEvent::Closed { reason: c.reason },
                        };
                        let end = !matches!(ev, PairingEvent::Opened { .. });
                        sink.send(Event::Pairing(ev));
                        if end {
                            break;
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        sink.send(Event::Pairing(PairingEvent::Closed { reason: "revisd closed the window".into() }));
                        break;
                    }
                    Err(s) => {
                        sink.send(Event::Pairing(PairingEvent::Closed { reason: s.message().to_owned() }));
                        break;
                    }
                }
            }
            if let Ok(r) = c.admin.list_devices(pb::ListDevicesRequest {}).await {
                sink.send(Event::Devices(r.into_inner().devices));
            }
        });
        self.pairing = Some(task.abort_handle());
    }

    fn revoke(&self, device: String) {
        let Some(mut c) = self.client.clone() else { return };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            if let Err(s) = c.admin.revoke_device(pb::RevokeDeviceRequest { device }).await {
                sink.error("revoking a device", s.message());
            }
            match c.admin.list_devices(pb::ListDevicesRequest {}).await {
                Ok(r) => sink.send(Event::Devices(r.into_inner().devices)),
                Err(s) => sink.error("listing paired devices", s.message()),
            }
        });
    }
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
        Ok(Err(e)) => return sink.error("reading your paired nodes", plain(&e)),
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
