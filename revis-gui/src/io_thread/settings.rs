//! The saved settings: the model a tier uses, the look of the app, and
//! the whole settings form, each written off the runtime and answered
//! with what was saved or why not.

use revis_client::Tier;

use super::Io;
use crate::protocol::Event;
use crate::settings::{Appearance, Settings};

impl Io {
    /// Names `model` as `tier`'s model in revisd.toml (used from revisd's next start).
    pub(super) fn use_model(&self, tier: Tier, model: String) {
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

    pub(super) fn save_appearance(&self, a: Appearance) {
        let (sink, config) = (self.sink.clone(), self.opts.config.clone());
        tokio::task::spawn_blocking(move || match a.save(&config) {
            Ok(()) => sink.send(Event::AppearanceSaved(a)),
            Err(e) => sink.error("saving the look of the app", e.to_string()),
        });
    }

    /// Keeps the Memory view's switch for the app's next start.
    pub(super) fn save_learning(&self, on: bool) {
        let (sink, config) = (self.sink.clone(), self.opts.config.clone());
        tokio::task::spawn_blocking(move || {
            if let Err(e) = crate::settings::save_learning(&config, on) {
                sink.error("keeping whether revis learns from your chats", e.to_string());
            }
        });
    }

    pub(super) fn save_settings(&self, s: Settings) {
        let (sink, config) = (self.sink.clone(), self.opts.config.clone());
        tokio::task::spawn_blocking(move || {
            let r = s.save(&config).map_err(|e| e.to_string());
            sink.send(Event::SettingsSaved(r));
        });
    }
}
