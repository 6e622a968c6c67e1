//! The settings the app edits. Which model each tier uses lives in revisd's
//! own configuration file (`$REVIS_CONFIG`, else `revisd.toml` in the
//! user's config directory), edited in place so the user's comments stay;
//! revisd reads it when it starts. Where revis keeps its data lives in
//! `gui.toml` beside it and applies from the app's next start
//! (`$REVIS_DATA_DIR` still wins; see [`crate::options::data_dir`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use revis_client::Tier;

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Settings {
    /// tier → model (a catalog name or a .gguf path); a tier not listed uses revisd's default.
    pub tiers: BTreeMap<Tier, String>,
    /// The data folder in use now.
    pub data_dir: PathBuf,
    /// The data folder to use from the next start ("" = the default).
    pub next_data_dir: String,
}

/// Light or dark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Theme {
    /// As the desktop is set (dark where the system does not say).
    #[default]
    System,
    Light,
    Dark,
}

impl Theme {
    pub const ALL: [Theme; 3] = [Theme::System, Theme::Light, Theme::Dark];

    pub fn as_str(self) -> &'static str {
        match self {
            Theme::System => "system",
            Theme::Light => "light",
            Theme::Dark => "dark",
        }
    }

    /// For the settings' menu.
    pub fn words(self) -> &'static str {
        match self {
            Theme::System => "Follow the system",
            Theme::Light => "Light",
            Theme::Dark => "Dark",
        }
    }
}

/// The look of the app, kept in `gui.toml`'s `[appearance]` and applied at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Appearance {
    pub theme: Theme,
    /// Text size in percent of egui's (every widget scales with it).
    pub text_percent: u32,
}

impl Default for Appearance {
    fn default() -> Self {
        Appearance { theme: Theme::System, text_percent: 100 }
    }
}

impl Appearance {
    /// The text sizes offered, in percent.
    pub const TEXT_PERCENT: std::ops::RangeInclusive<u32> = 75..=200;

    /// Reads `gui.toml` beside `config`; what is missing or not understood is the default.
    pub fn load(config: &Path) -> Appearance {
        let Ok(doc) = read(&gui_path(config)) else { return Appearance::default() };
        let a = doc.get("appearance");
        let theme = a.and_then(|a| a.get("theme")).and_then(|t| t.as_str()).and_then(|t| Theme::ALL.into_iter().find(|x| x.as_str() == t));
        let text = a.and_then(|a| a.get("text_percent")).and_then(|t| t.as_integer()).and_then(|t| u32::try_from(t).ok());
        Appearance { theme: theme.unwrap_or_default(), text_percent: text.filter(|t| Self::TEXT_PERCENT.contains(t)).unwrap_or(100) }
    }

    /// Writes it into `gui.toml`, keeping the rest of the file.
    pub fn save(&self, config: &Path) -> Result<(), SettingsError> {
        let gui = gui_path(config);
        let mut doc = read(&gui)?;
        let mut t = toml_edit::Table::new();
        t.insert("theme", toml_edit::value(self.theme.as_str()));
        t.insert("text_percent", toml_edit::value(i64::from(self.text_percent)));
        doc.insert("appearance", toml_edit::Item::Table(t));
        write(&gui, &doc)
    }

    /// Applies it to the window.
    pub fn apply(&self, ctx: &eframe::egui::Context) {
        use eframe::egui::ThemePreference;
        ctx.set_theme(match self.theme {
            Theme::System => ThemePreference::System,
            Theme::Light => ThemePreference::Light,
            Theme::Dark => ThemePreference::Dark,
        });
        ctx.set_zoom_factor(self.text_percent as f32 / 100.0);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not valid TOML: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: `{key}` is not a table")]
    NotATable { path: PathBuf, key: String },
    #[error("there is no config directory for this user")]
    NoConfigDir,
}

/// revisd's configuration file, found as revisd finds it.
pub fn config_path() -> Result<PathBuf, SettingsError> {
    if let Some(p) = std::env::var_os("REVIS_CONFIG").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    directories::ProjectDirs::from("", "", "revis").map(|d| d.config_dir().join("revisd.toml")).ok_or(SettingsError::NoConfigDir)
}

/// The app's own settings file, beside revisd's.
pub fn gui_path(config: &Path) -> PathBuf {
    config.with_file_name("gui.toml")
}

/// Whether the chat learns facts from what the person says (the Memory
/// view's switch), kept in `gui.toml` as `[memory] learn`: on unless the
/// person turned it off, also when the file is missing or not understood.
pub fn learning(config: &Path) -> bool {
    let Ok(doc) = read(&gui_path(config)) else { return true };
    doc.get("memory").and_then(|m| m.get("learn")).and_then(|l| l.as_bool()).unwrap_or(true)
}

/// Writes the Memory view's switch into `gui.toml`, keeping the rest of the file.
pub fn save_learning(config: &Path, on: bool) -> Result<(), SettingsError> {
    let gui = gui_path(config);
    let mut doc = read(&gui)?;
    match doc.get_mut("memory") {
        Some(toml_edit::Item::Table(t)) => {
            t.insert("learn", toml_edit::value(on));
        }
        Some(_) => return Err(SettingsError::NotATable { path: gui, key: "memory".into() }),
        None => {
            let mut t = toml_edit::Table::new();
            t.insert("learn", toml_edit::value(on));
            doc.insert("memory", toml_edit::Item::Table(t));
        }
    }
    write(&gui, &doc)
}

/// The data folder chosen in the settings, if any.
pub fn saved_data_dir(config: &Path) -> Option<PathBuf> {
    let doc = read(&gui_path(config)).ok()?;
    doc.get("data_dir")?.as_str().filter(|s| !s.trim().is_empty()).map(PathBuf::from)
}

fn read(path: &Path) -> Result<toml_edit::DocumentMut, SettingsError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => return Err(SettingsError::Io { path: path.into(), source }),
    };
    text.parse().map_err(|e: toml_edit::TomlError| SettingsError::Parse { path: path.into(), message: e.to_string() })
}

fn write(path: &Path, doc: &toml_edit::DocumentMut) -> Result<(), SettingsError> {
    let io = |source| SettingsError::Io { path: path.into(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    // Written whole, then renamed over: a crash leaves the old file or the new one.
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, doc.to_string()).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

impl Settings {
    pub fn load(config: &Path, data_dir: &Path) -> Result<Settings, SettingsError> {
        let doc = read(config)?;
        let mut tiers = BTreeMap::new();
        if let Some(t) = doc.get("tiers").and_then(|t| t.as_table_like()) {
            // A table that names no tier is revisd's to refuse; it stays in the file as it is.
            for (name, tier) in t.iter() {
                if let (Ok(name), Some(model)) = (name.parse::<Tier>(), tier.get("model").and_then(|m| m.as_str())) {
                    tiers.insert(name, model.to_owned());
                }
            }
        }
        let next = saved_data_dir(config).map(|p| p.display().to_string()).unwrap_or_default();
        Ok(Settings { tiers, data_dir: data_dir.to_owned(), next_data_dir: next })
    }

    /// Writes the models into revisd's file (keeping everything else in it)
    /// and the data folder into `gui.toml`.
    pub fn save(&self, config: &Path) -> Result<String, SettingsError> {
        let mut doc = read(config)?;
        let not_table = |key: &str| SettingsError::NotATable { path: config.into(), key: key.into() };
        let tiers = doc.entry("tiers").or_insert_with(|| {
            let mut t = toml_edit::Table::new();
            t.set_implicit(true);
            toml_edit::Item::Table(t)
        });
        let tiers = tiers.as_table_like_mut().ok_or_else(|| not_table("tiers"))?;
        for (tier, model) in &self.tiers {
            let tier = tier.as_str();
            let model = model.trim();
            if model.is_empty() {
                if let Some(t) = tiers.get_mut(tier).and_then(|t| t.as_table_like_mut()) {
                    t.remove("model");
                }
                continue;
            }
            let t = tiers.entry(tier).or_insert(toml_edit::Item::Table(toml_edit::Table::new()));
            let t = t.as_table_like_mut().ok_or_else(|| not_table(&format!("tiers.{tier}")))?;
            t.insert("model", toml_edit::value(model));
        }
        write(config, &doc)?;

        let gui = gui_path(config);
        let mut g = read(&gui)?;
        if self.next_data_dir.trim().is_empty() {
            g.remove("data_dir");
        } else {
            g["data_dir"] = toml_edit::value(self.next_data_dir.trim());
        }
        write(&gui, &g)?;
        Ok(format!(
            "Saved to {}. revisd uses the models from its next start; the data folder applies when revis starts again.",
            config.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_written_into_revisd_toml_and_comments_stay() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("revisd.toml");
        std::fs::write(
            &config,
            "# my notes\n[daemon]\nthreads = 2 # two cores\n\n[tiers.tier3]\nmodel = \"gemma3-270m\"\ncontext = 8192\n\n[tiers.fast]\nmodel = \"x\"\n",
        )
        .unwrap();
        let mut s = Settings::load(&config, dir.path()).unwrap();
        assert_eq!(s.tiers.get(&Tier::Tier3).map(String::as_str), Some("gemma3-270m"));
        s.tiers.insert(Tier::Tier1, "smollm2-135m-instruct".into());
        s.tiers.insert(Tier::Tier3, "/models/big.gguf".into());
        s.next_data_dir = "/srv/revis".into();
        s.save(&config).unwrap();
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(text.contains("# my notes") && text.contains("threads = 2 # two cores"), "{text}");
        assert!(text.contains("context = 8192"), "{text}");
        // A table that names no tier is left as it is, for revisd to refuse.
        assert!(text.contains("[tiers.fast]\nmodel = \"x\""), "{text}");
        let back = Settings::load(&config, dir.path()).unwrap();
        assert_eq!(back.tiers.get(&Tier::Tier1).map(String::as_str), Some("smollm2-135m-instruct"));
        assert_eq!(back.tiers.get(&Tier::Tier3).map(String::as_str), Some("/models/big.gguf"));
        assert_eq!(saved_data_dir(&config), Some(PathBuf::from("/srv/revis")));
        // Cleared: revisd's default again, and no data folder.
        let mut cleared = back.clone();
        cleared.tiers.insert(Tier::Tier1, String::new());
        cleared.next_data_dir.clear();
        cleared.save(&config).unwrap();
        let back = Settings::load(&config, dir.path()).unwrap();
        assert!(!back.tiers.contains_key(&Tier::Tier1));
        assert_eq!(saved_data_dir(&config), None);
    }

    #[test]
    fn the_look_is_kept_beside_the_data_folder_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("revisd.toml");
        assert_eq!(Appearance::load(&config), Appearance::default(), "no file yet");
        std::fs::write(gui_path(&config), "data_dir = \"/srv/revis\"\n").unwrap();
        let a = Appearance { theme: Theme::Light, text_percent: 125 };
        a.save(&config).unwrap();
        assert_eq!(Appearance::load(&config), a);
        assert_eq!(saved_data_dir(&config), Some(PathBuf::from("/srv/revis")), "the data folder stays");
        std::fs::write(gui_path(&config), "[appearance]\ntheme = \"purple\"\ntext_percent = 900\n").unwrap();
        assert_eq!(Appearance::load(&config), Appearance::default(), "what is not understood is the default");
    }

    #[test]
    fn the_memory_switch_is_kept_with_the_rest_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("revisd.toml");
        assert!(learning(&config), "on before anything is written");
        let a = Appearance { theme: Theme::Dark, text_percent: 150 };
        a.save(&config).unwrap();
        save_learning(&config, false).unwrap();
        assert!(!learning(&config));
        assert_eq!(Appearance::load(&config), a, "the look stays");
        save_learning(&config, true).unwrap();
        assert!(learning(&config));
        std::fs::write(gui_path(&config), "[memory]\nlearn = \"maybe\"\n").unwrap();
        assert!(learning(&config), "what is not understood is on");
        std::fs::write(gui_path(&config), "memory = 3\n").unwrap();
        assert!(save_learning(&config, false).is_err(), "a file it cannot read right is reported, not overwritten");
    }

    #[test]
    fn a_broken_file_is_reported_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("revisd.toml");
        std::fs::write(&config, "[tiers\n").unwrap();
        let err = Settings::load(&config, dir.path()).unwrap_err().to_string();
        assert!(err.contains("is not valid TOML"), "{err}");
        assert!(Settings::default().save(&config).is_err());
        assert_eq!(std::fs::read_to_string(&config).unwrap(), "[tiers\n");
    }
}
