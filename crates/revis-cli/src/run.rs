//! `revis run`: one prompt answered, streamed to stdout, with its counts
//! and timings when asked.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use revis_client::{Done, Format, GenerateParams, Message, Runner, Sampling, Tier};

#[derive(Args)]
pub struct RunArgs {
    /// tier1, tier2 (default) or tier3.
    #[arg(long, default_value_t = Tier::DEFAULT)]
    tier: Tier,
    /// 0 = greedy (same answer every time). Default: the model's own (its GGUF file, else the catalog), else 0.7.
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long)]
    max_tokens: Option<u32>,
    /// A system message to start with.
    #[arg(long)]
    system: Option<String>,
    /// Answer in JSON (always parses).
    #[arg(long)]
    json: bool,
    /// A JSON schema file the answer must match (with --json).
    #[arg(long, requires = "json")]
    schema: Option<PathBuf>,
    /// Print token counts and timings to stderr at the end.
    #[arg(long)]
    verbose: bool,
    prompt: String,
}

/// Streams one answer to stdout; returns the Done event.
async fn stream_answer(daemon: &impl Runner, req: GenerateParams) -> anyhow::Result<Done> {
    let mut out = std::io::stdout();
    let done = daemon
        .generate(req, |t| {
            let _ = out.write_all(t.as_bytes());
            let _ = out.flush();
        })
        .await?;
    println!();
    Ok(done)
}

pub(crate) async fn run_prompt(daemon: &impl Runner, a: RunArgs) -> anyhow::Result<ExitCode> {
    let schema = match &a.schema {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading schema {}", p.display()))?),
        None => None,
    };
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(Message::system(s.clone()));
    }
    messages.push(Message::user(a.prompt));
    let req = GenerateParams {
        tier: a.tier,
        messages,
        sampling: Sampling { temperature: a.temperature, seed: a.seed, ..Default::default() },
        max_tokens: a.max_tokens,
        format: if a.json { Format::Json { schema } } else { Format::Text },
        ..Default::default()
    };
    let d = stream_answer(daemon, req).await?;
    if a.verbose {
        print_stats(&d);
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn print_stats(d: &Done) {
    if d.generated_tokens == 0 && !d.text.is_empty() {
        // The loop guard dropped the answer before the daemon's counts came:
        // the same line, "-" for what is not known.
        eprintln!(
            "[{} prompt tokens (- cached), - generated, prompt - ms, - tokens/s, seed -; stopped where the answer repeated itself]",
            d.prompt_tokens
        );
        return;
    }
    eprintln!(
        "[{} prompt tokens ({} cached), {} generated, prompt {:.1} ms, {:.1} tokens/s, seed {}]",
        d.prompt_tokens,
        d.cached_tokens,
        d.generated_tokens,
        d.prompt_us as f64 / 1000.0,
        d.generated_tokens as f64 / (d.generate_us.max(1) as f64 / 1e6),
        d.seed
    );
}
