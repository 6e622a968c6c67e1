//! revis-bench: measures revis through the whole stack (client library →
//! Unix socket → revisd → engine) and writes the results to docs/.
//!
//! One subcommand per benchmark (`cli`): `speed` against llama.cpp's own
//! `llama-bench` built from the same llama.cpp (docs/BENCHMARKS.md); `chat`
//! a chat turn with and without pre-prefill; `remote` the Unix socket
//! against server mode's mutual TLS; `http` `revis serve`'s OpenAI API
//! against the gRPC client; `dispatch` a second daemon through the
//! dispatcher, and fallback latency; `lookup` prompt lookup decoding;
//! `split` one model across two machines (network namespaces) against the
//! whole model on one; `batch` several answers in one batch; `faults` what
//! revis does under misbehaving callers and kill -9 (docs/RELIABILITY.md);
//! `quality` what the gears of a turn change (docs/QUALITY.md); `ensemble`
//! two models answering together (docs/ENSEMBLE.md); `contention` revis on
//! a busy machine against llama-bench at each fixed thread count. Each is a
//! `harness::Bench` (`benches`, `speed`, `ensemble`); `harness::measure`
//! runs it and saves what it measured.

mod alone;
mod batch;
mod benches;
mod chat;
mod cli;
mod contention;
mod daemon;
mod dispatch;
mod ensemble;
mod estimate;
mod faults;
mod harness;
mod http;
mod llama_bench;
mod lookup;
mod machine;
mod options;
mod proc;
mod prompts;
mod quality;
mod remote;
mod render;
mod report;
mod speed;
mod split;
mod stats;
mod turn;

use anyhow::bail;
use clap::Parser;

use crate::cli::Command;
use crate::harness::measure;
use crate::options::{Common, Gen, Rounds};

fn main() -> anyhow::Result<()> {
    let command = cli::Cli::parse().command;
    // One thread is enough for the client side; the engine threads do the work.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run(command))
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Speed(mut a) => {
            if a.common.quick {
                (a.n_prompt, a.n_prefix) = (128, 300);
            }
            quick(&a.common, Some(&mut a.rounds), Some(&mut a.gen_))?;
            if a.n_prompt < 16 || a.n_prefix < 16 {
                bail!("need --n-prompt ≥ 16 and --n-prefix ≥ 16");
            }
            if (a.n_prefix + 64).max(a.n_prompt + 8) >= a.common.context {
                bail!("--context {} is too small for --n-prefix {} / --n-prompt {}", a.common.context, a.n_prefix, a.n_prompt);
            }
            let output = a.output.clone();
            measure(&speed::Speed { args: a }, &output).await?;
        }
        Command::Chat(mut a) => {
            quick(&a.common, Some(&mut a.rounds), None)?;
            let output = a.output.clone();
            measure(&benches::Chat { args: a }, &output).await?;
        }
        Command::Remote(mut a) => {
            if a.common.quick {
                (a.pairs, a.connections) = (2, 3);
            }
            quick(&a.common, None, Some(&mut a.gen_))?;
            if a.pairs == 0 || a.connections == 0 {
                bail!("need --pairs ≥ 1 and --connections ≥ 1");
            }
            let output = a.output.clone();
            measure(&benches::Remote { args: a }, &output).await?;
        }
        Command::Http(mut a) => {
            if a.common.quick {
                a.pairs = 2;
            }
            quick(&a.common, None, Some(&mut a.gen_))?;
            if a.pairs == 0 {
                bail!("need --pairs ≥ 1");
            }
            let output = a.output.clone();
            measure(&benches::Http { args: a }, &output).await?;
        }
        Command::Dispatch(mut a) => {
            quick(&a.common, Some(&mut a.rounds), None)?;
            let output = a.output.clone();
            measure(&benches::Dispatch { args: a }, &output).await?;
        }
        Command::Lookup(mut a) => {
            quick(&a.common, Some(&mut a.rounds), None)?;
            let output = a.output.clone();
            measure(&benches::Lookup { args: a }, &output).await?;
        }
        Command::Split(mut a) => {
            quick(&a.common, Some(&mut a.rounds), Some(&mut a.gen_))?;
            let output = a.output.clone();
            measure(&benches::Split { args: a }, &output).await?;
        }
        Command::Batch(mut a) => {
            quick(&a.common, Some(&mut a.rounds), Some(&mut a.gen_))?;
            let output = a.output.clone();
            measure(&benches::Batch { args: a }, &output).await?;
        }
        Command::Faults(a) => {
            // Its own --quick sizes (faults::Settings::from_args).
            let c = &a.common;
            let settings = faults::Settings::from_args(&a.fault, c.quick, c.most_threads(), c.context, c.batch);
            let seed = settings.seed;
            let output = options::Output { write: false, doc: a.doc.clone() };
            let outcome = measure(&benches::Faults { args: a, settings }, &output).await?;
            if outcome.violations > 0 {
                bail!("{} invariant violation(s); seed {seed} (replay with --seed {seed})", outcome.violations);
            }
        }
        Command::Quality(a) => {
            for name in &a.common.models {
                measure(&benches::Quality { args: &a, name }, &a.output).await?;
            }
        }
        Command::Render(mut a) => {
            if a.common.quick {
                a.render.render_rounds = 20;
            }
            let output = a.output.clone();
            measure(&benches::Render { args: a }, &output).await?;
        }
        Command::Estimate(mut a) => {
            if a.common.quick {
                a.estimate.estimate_rounds = 1;
            }
            let output = a.output.clone();
            measure(&benches::Estimate { args: a }, &output).await?;
        }
        Command::Turn(a) => {
            for name in &a.common.models {
                measure(&benches::Turn { args: &a, name }, &a.output).await?;
            }
        }
        Command::Contention(mut a) => {
            if a.common.quick {
                a.n_prompt = 128;
            }
            quick(&a.common, Some(&mut a.rounds), Some(&mut a.gen_))?;
            let output = a.output.clone();
            measure(&benches::Contention { args: a }, &output).await?;
        }
        Command::Ensemble(a) => {
            let output = a.output.clone();
            measure(&ensemble::Ensemble { args: a }, &output).await?;
        }
    }
    Ok(())
}

/// `--quick` for the benchmarks that take rounds or generate: 1 round, 32
/// generated tokens; then the checks on what they were given.
fn quick(common: &Common, rounds: Option<&mut Rounds>, gen_: Option<&mut Gen>) -> anyhow::Result<()> {
    if common.threads.is_empty() {
        bail!("need at least one thread count");
    }
    if let Some(r) = rounds {
        if common.quick {
            r.rounds = 1;
        }
        if r.rounds == 0 {
            bail!("need --rounds ≥ 1");
        }
    }
    if let Some(g) = gen_ {
        if common.quick {
            g.n_gen = 32;
        }
        if g.n_gen < 2 {
            bail!("need --n-gen ≥ 2");
        }
    }
    Ok(())
}
