//! The reference: llama.cpp's own `llama-bench`, built at benchmark time by
//! `scripts/build-llama-bench.sh` against the llama.cpp that revis links, and
//! run as a child process with JSON output.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::proc::{run_with_timeout, set_parent_death_signal};

/// The OUT_DIR of the llama-cpp-sys-2 build this binary was linked with (from build.rs).
pub const LLAMA_SYS_OUT: &str = env!("REVIS_LLAMA_SYS_OUT");

/// Runs the build script (it skips what is up to date, and relinks when the
/// llama.cpp libraries changed) so that `bin` is llama-bench built from the
/// libraries this binary links. `force` rebuilds even when up to date.
/// Returns the build description the script wrote.
pub fn build(root: &Path, bin: &Path, force: bool) -> anyhow::Result<String> {
    let script = root.join("scripts/build-llama-bench.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).env("REVIS_LLAMA_BENCH_DIR", bin.parent().unwrap_or(Path::new(".")));
    if !LLAMA_SYS_OUT.is_empty() && Path::new(LLAMA_SYS_OUT).is_dir() {
        cmd.arg("--llama-sys-out").arg(LLAMA_SYS_OUT);
    }
    if force {
        cmd.arg("--force");
    }
    let status = cmd.stdout(Stdio::null()).status().with_context(|| format!("running {}", script.display()))?;
    if !status.success() || !bin.is_file() {
        bail!("{} failed ({status}); see its output above", script.display());
    }
    Ok(build_info(bin))
}

/// What the build script recorded next to `bin` about how it was built.
pub fn build_info(bin: &Path) -> String {
    std::fs::read_to_string(bin.with_file_name("build-info.txt"))
        .unwrap_or_else(|_| format!("{} (given on the command line; how it was built is not recorded)", bin.display()))
}

/// One llama-bench invocation's results, tokens per second.
#[derive(Clone, Debug, Default)]
pub struct Result {
    pub pp: Option<f64>,
    pub tg: Option<f64>,
    /// Bytes of the weights as llama-bench reports them.
    pub model_size: Option<u64>,
}

/// Runs `llama-bench -m MODEL -t T -p n_prompt -n n_gen -r 1 -b batch -ub batch -o json`.
pub fn run(bin: &Path, model: &Path, threads: u32, n_prompt: u32, n_gen: u32, batch: u32, timeout: Duration) -> anyhow::Result<Result> {
    let mut cmd = Command::new(bin);
    cmd.arg("-m")
        .arg(model)
        .args(["-t", &threads.to_string()])
        .args(["-p", &n_prompt.to_string()])
        .args(["-n", &n_gen.to_string()])
        .args(["-b", &batch.to_string(), "-ub", &batch.to_string()])
        .args(["-r", "1", "-o", "json"]);
    set_parent_death_signal(&mut cmd);
    let out = run_with_timeout(cmd, timeout).with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!("llama-bench failed ({}): {}", out.status, tail(&out.stderr));
    }
    parse(&out.stdout).with_context(|| format!("parsing llama-bench output: {}", tail(&out.stdout)))
}

fn tail(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let s = s.trim();
    s.char_indices().rev().nth(600).map_or(s, |(i, _)| &s[i..]).to_owned()
}

/// Parses llama-bench's `-o json` output: one object per test with
/// `n_prompt`, `n_gen` and `avg_ts`.
pub fn parse(stdout: &[u8]) -> anyhow::Result<Result> {
    let v: serde_json::Value = serde_json::from_slice(stdout)?;
    let mut r = Result::default();
    for t in v.as_array().context("not a JSON array")? {
        let n_prompt = t["n_prompt"].as_u64().unwrap_or(0);
        let n_gen = t["n_gen"].as_u64().unwrap_or(0);
        let ts = t["avg_ts"].as_f64();
        r.model_size = r.model_size.or(t["model_size"].as_u64());
        match (n_prompt > 0, n_gen > 0) {
            (true, false) => r.pp = ts,
            (false, true) => r.tg = ts,
            _ => {}
        }
    }
    if r.pp.is_none() && r.tg.is_none() {
        bail!("no pp or tg test in the output");
    }
    Ok(r)
}

/// Where the binary goes: `<workspace>/target/llama-bench/llama-bench`.
pub fn default_path(root: &Path) -> PathBuf {
    root.join("target/llama-bench/llama-bench")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pp_and_tg() {
        let json = br#"[
          {"n_prompt": 512, "n_gen": 0, "avg_ts": 250.5, "model_size": 96576768},
          {"n_prompt": 0, "n_gen": 128, "avg_ts": 80.25, "model_size": 96576768}
        ]"#;
        let r = parse(json).unwrap();
        assert_eq!((r.pp, r.tg, r.model_size), (Some(250.5), Some(80.25), Some(96_576_768)));
        assert!(parse(b"[]").is_err());
    }
}
