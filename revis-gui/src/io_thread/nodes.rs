//! The nodes this machine pairs with: browse for them, pair with one by
//! its code, forget one, and list them with each paired one's health.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use revis_client::nodes::{find_unpaired, node_rows, probe};
use revis_client::{Discovered, Keyring};

use super::Io;
use crate::protocol::{Event, Sink};

/// How long the app listens for other machines' advertisements.
pub const BROWSE_WAIT: Duration = Duration::from_millis(1500);

impl Io {
    pub(super) fn nodes(&self) {
        tokio::spawn(list_nodes(self.sink.clone(), self.keyring_dir(), self.opts.discovery.clone(), self.seen.clone()));
    }

    pub(super) fn pair(&self, what: String, code: String) {
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

    pub(super) fn forget(&self, id: String) {
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
