//! The connection to revisd: open the store, connect to (or start) the
//! daemon, set up the dispatcher and the chat; restart the daemon; read
//! its status.

use std::sync::Arc;
use std::time::Duration;

use revis_client::dispatch::{Deadlines, Dispatcher};
use revis_client::{Client, ClientError, Keyring};
use revis_store::Store;
use tokio::sync::mpsc;

use super::Io;
use super::tiers::placements;
use crate::protocol::Event;
use crate::settings::Settings;

/// How often the nodes are probed and the tiers' placement applied.
const PLACEMENT_EVERY: Duration = Duration::from_secs(3);

impl Io {
    /// Ends this machine's revisd and starts it again, so it reads its
    /// configuration again ([`revis_client::restart_daemon`]: the
    /// configuration is checked first). The chat keeps its connection: it
    /// reconnects to the new daemon on its next call.
    pub(super) async fn restart_daemon(&mut self) -> Result<String, String> {
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
    pub(super) async fn connect(&mut self) {
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
    pub(super) async fn no_model_yet(&self) -> bool {
        let (models, config, data) = (self.opts.paths().models(), self.opts.config.clone(), self.opts.data_dir.clone());
        tokio::task::spawn_blocking(move || {
            let named = Settings::load(&config, &data).is_ok_and(|s| s.tiers.values().any(|m| !m.trim().is_empty()));
            !named && !revis_models::any_downloaded(&models)
        })
        .await
        .unwrap_or(false)
    }

    pub(super) fn status(&self) {
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
}
