//! What the commands share: the client's store, and the way to this
//! machine's daemon (connect, or start one on the default socket). Both
//! `commands` and `nodes` use it; neither uses the other's internals.

use std::io::IsTerminal;

use revis_client::{Client, Paths, SpawnOptions};
use revis_store::Store;

/// The daemon on `socket`, never started here (a socket the user chose is
/// theirs to run; `advise` says how).
pub async fn connect(socket: &std::path::Path) -> anyhow::Result<Client> {
    Ok(Client::connect(socket).await?)
}

/// The first command of a new user just works: with no daemon on the
/// default socket, start one (on first use choosing, pulling and recording
/// a model that fits this machine; else pulling the default model if missing).
pub async fn connect_or_start(socket: &std::path::Path, explicit: bool) -> anyhow::Result<Client> {
    if explicit {
        return connect(socket).await;
    }
    if let Ok(client) = Client::connect(socket).await {
        return Ok(client);
    }
    crate::models::first_use(&revis_models::models_dir()?).await?;
    let opts = SpawnOptions { pull_default_model: true, progress: std::io::stderr().is_terminal(), ..Default::default() };
    Ok(Client::connect_or_start(socket, &opts).await?)
}

/// The client's database; one that had to be recovered is reported.
pub fn open_store(paths: &Paths) -> anyhow::Result<Store> {
    let opened = Store::open(&paths.store())?;
    if let Some(r) = &opened.recovered {
        eprintln!("revis: {r}");
    }
    Ok(opened.store)
}
