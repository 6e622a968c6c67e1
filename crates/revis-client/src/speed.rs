//! How fast the catalog's models would decode here: the machine's probes
//! (revis_models::Machine::measure), and a real decode of the smallest
//! downloaded catalog model by `revisd measure-speed`, which the estimates
//! then follow (revis_models::choose). `revis models`, the first run's
//! choice and the GUI's models view all read it from here.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use revis_models::machine::Decode;
use revis_models::{CatalogEntry, Machine};

/// A decode that takes longer than this is stopped and the probes alone count.
pub const DECODE_TIMEOUT: Duration = Duration::from_secs(120);

/// This machine as measured, and why its real decode is missing when a model was there to run.
#[derive(Clone, Debug)]
pub struct Here {
    pub machine: Machine,
    /// Why no real decode counts, when a downloaded model could have given one.
    pub note: Option<String>,
}

/// Measures this machine (a quarter of a second), then, when a catalog model
/// is downloaded in `models_dir`, decodes a few tokens of the smallest one
/// with `revisd measure-speed` (about a second for SmolLM2).
pub async fn measure_here(models_dir: &Path) -> Here {
    let machine = match tokio::task::spawn_blocking(Machine::measure).await {
        Ok(m) => m,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    let Some(entry) = smallest_downloaded(models_dir) else { return Here { machine, note: None } };
    if let Some(d) = recent(entry) {
        return Here { machine: machine.with_decode(d), note: None };
    }
    match real_decode(entry, models_dir).await {
        Ok(d) => {
            *LAST.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), d.clone()));
            Here { machine: machine.with_decode(d), note: None }
        }
        Err(why) => {
            Here { machine, note: Some(format!("no real decode of {} counts ({why}); the speeds are the probes' estimate", entry.name)) }
        }
    }
}

/// A real decode is kept this long in a process that measures again (the
/// GUI, each time its models view opens), so that looking twice does not
/// take the cores for a second each time. The probes run every time.
pub const KEEP_DECODE: Duration = Duration::from_secs(600);

/// The last real decode in this process, and when it ran.
static LAST: Mutex<Option<(Instant, Decode)>> = Mutex::new(None);

/// The last real decode of `entry`, when younger than [`KEEP_DECODE`].
fn recent(entry: &CatalogEntry) -> Option<Decode> {
    let last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    last.as_ref().filter(|(at, d)| d.model == entry.name && at.elapsed() < KEEP_DECODE).map(|(_, d)| d.clone())
}

/// The smallest catalog model whose file is in `models_dir`.
fn smallest_downloaded(models_dir: &Path) -> Option<&'static CatalogEntry> {
    revis_models::catalog().iter().filter(|e| e.is_present(models_dir)).min_by_key(|e| e.size)
}

/// Runs `revisd measure-speed` on `entry` and reads its line.
pub async fn real_decode(entry: &'static CatalogEntry, models_dir: &Path) -> Result<Decode, String> {
    let program = crate::spawn::revisd_program(None);
    let mut command = tokio::process::Command::new(&program);
    command.arg("measure-speed").arg(entry.path_in(models_dir)).stdin(std::process::Stdio::null()).kill_on_drop(true);
    command.env("REVIS_LOG", "warn");
    let out = tokio::time::timeout(DECODE_TIMEOUT, command.output())
        .await
        .map_err(|_| format!("`{} measure-speed` took over {} s", program.display(), DECODE_TIMEOUT.as_secs()))?
        .map_err(|e| format!("`{} measure-speed` cannot run: {e}", program.display()))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        return Err(said.lines().last().unwrap_or("it failed").trim().to_owned());
    }
    parse(entry, &String::from_utf8_lossy(&out.stdout))
}

/// Reads `{"tokens":..,"seconds":..,"tokens_per_s":..}`.
fn parse(entry: &CatalogEntry, line: &str) -> Result<Decode, String> {
    let v: serde_json::Value = serde_json::from_str(line.trim()).map_err(|e| format!("its answer is not JSON: {e}"))?;
    let tokens_per_s = v["tokens_per_s"].as_f64().filter(|t| t.is_finite() && *t > 0.0).ok_or("its answer has no speed")?;
    Ok(Decode { model: entry.name.to_owned(), parameters: entry.parameters(), size: entry.size, tokens_per_s })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decode_line_is_read_or_refused() {
        let smol = revis_models::find("smollm2-135m-instruct").unwrap();
        let d = parse(smol, "{\"tokens\":64,\"seconds\":0.5,\"tokens_per_s\":128.0}\n").unwrap();
        assert_eq!((d.model.as_str(), d.tokens_per_s, d.size), (smol.name, 128.0, smol.size));
        assert!(parse(smol, "{\"tokens_per_s\":0}").is_err());
        assert!(parse(smol, "warming up").is_err());
    }

    #[test]
    fn the_smallest_downloaded_model_is_the_one_decoded() {
        let dir = tempfile::tempdir().unwrap();
        assert!(smallest_downloaded(dir.path()).is_none());
        let gemma = revis_models::find("gemma3-270m").unwrap();
        let smol = revis_models::find("smollm2-135m-instruct").unwrap();
        // Present means a file of its name and size (sparse here; the hash is the pull's business).
        let place = |e: &CatalogEntry| std::fs::File::create(e.path_in(dir.path())).unwrap().set_len(e.size).unwrap();
        place(gemma);
        assert_eq!(smallest_downloaded(dir.path()).map(|e| e.name), Some(gemma.name));
        place(smol);
        assert_eq!(smallest_downloaded(dir.path()).map(|e| e.name), Some(smol.name));
    }
}
