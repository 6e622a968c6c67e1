//! The command line: one subcommand per benchmark, each with the options
//! that mean something to it. The options several share are grouped in
//! `options.rs` (`Common`, `Output`, `Rounds`, `Gen`); a lab's own options
//! live with the lab (`faults::FaultArgs`, `quality::QualityArgs`; all of
//! `revis-bench ensemble`'s in `ensemble::EnsembleArgs`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::options::{Common, Gen, Output, Rounds};
use crate::{ensemble, faults, quality, turn};

/// Benchmark revis against llama.cpp's llama-bench (same llama.cpp build, model and threads).
#[derive(Parser, Debug)]
#[command(version, arg_required_else_help = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Speed against llama.cpp: per model × thread count × round, llama-bench
    /// (pp + tg), the engine alone in this process and a fresh revisd (decode,
    /// prompt speed, cold and warm time to first token); docs/BENCHMARKS.md.
    Speed(SpeedArgs),
    /// The chat-turn benchmark (pre-prefill on vs off), on the first model and the most threads.
    Chat(ChatArgs),
    /// The server-mode benchmark (Unix socket against mutual TLS on
    /// loopback, one revisd), on the first model and the most threads.
    Remote(RemoteArgs),
    /// The HTTP benchmark: `revis serve`'s streaming chat completions
    /// against the gRPC client on the same revisd (decode speed, first token),
    /// on the first model and the most threads.
    Http(HttpArgs),
    /// The dispatch benchmark: 8 concurrent background tasks on one
    /// daemon against two (each pinned to a core), and fallback latency after
    /// a node is killed or its link cut (network namespaces; needs root).
    Dispatch(DispatchArgs),
    /// The fault benchmark (docs/RELIABILITY.md): load with misbehaving
    /// callers, kill -9 of `revis chat` mid-answer, kill -9 of a socket-activated
    /// revisd; appends its figures to docs/RELIABILITY.md (or --doc) and exits
    /// non-zero when an invariant was broken.
    Faults(FaultsArgs),
    /// The speculation benchmark: prompt lookup decoding against
    /// plain decoding (two revisd, daemon.speculate on and off) on the
    /// orchestrator's copy-heavy tasks and on open chat, each model of
    /// --models at each of --threads.
    Lookup(LookupArgs),
    /// The split benchmark: the first model of --models split
    /// across two one-core nodes (network namespaces, a veth shaped like a
    /// LAN with tc tbf and a delaying relay; needs root) against the whole
    /// model on one node.
    Split(SplitArgs),
    /// The batching benchmark: one stream alone, four at once, and
    /// a user stream beside three background ones (`daemon.streams`),
    /// against llama-batched-bench with the same shapes, each model of
    /// --models at the most --threads.
    #[command(alias = "batch-streams")]
    Batch(BatchArgs),
    /// The busy-machine benchmark: decode and prompt speed of revisd with
    /// `threads = "auto"` and with every core, quiet, beside 1 and 3
    /// spinning processes and beside a second revisd decoding, against
    /// llama-bench at each fixed count, interleaved (docs/BENCHMARKS.md).
    Contention(ContentionArgs),
    /// The ensemble benchmark (docs/ENSEMBLE.md): PIQA scoring,
    /// capitals answers and bits per byte, with the two models of --models
    /// on two tiers of one revisd (about 15 minutes on 2 cores).
    Ensemble(ensemble::EnsembleArgs),
    /// The quality benchmark (docs/QUALITY.md): tier1's check,
    /// tier2's checklist and the profile extraction on the labelled sets,
    /// for each model of --models on every tier of one revisd.
    Quality(QualityArgs),
    /// The turn benchmark (docs/QUALITY.md): the chat turn as revis gives
    /// it against the bare model on the public sets, each step on and off,
    /// fresh and after 40 turns, for each model of --models.
    Turn(TurnArgs),
    /// What rendering chat templates in a process of their own costs on
    /// the first token, against rendering them in the caller's process
    /// (docs/BENCHMARKS.md).
    Render(RenderArgs),
    /// The default-model choice's speed estimates (`revis models`) against
    /// what the models decode, quiet and beside a spinning process (docs/BENCHMARKS.md).
    Estimate(EstimateArgs),
}

#[derive(clap::Args, Debug)]
pub struct SpeedArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub rounds: Rounds,
    #[command(flatten)]
    pub gen_: Gen,
    /// Prompt tokens for the prompt-speed test (llama-bench -p).
    #[arg(long, default_value_t = 512)]
    pub n_prompt: u32,
    /// Tokens of the static prefix in the time-to-first-token test.
    #[arg(long, default_value_t = 1000)]
    pub n_prefix: u32,
    /// Size of the buffer the read-bandwidth loop sums, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub bandwidth_mib: usize,
    /// Stop starting new measurements after this many minutes (the run then reports what it has).
    #[arg(long, default_value_t = 14.0)]
    pub max_minutes: f64,
    /// A llama-bench binary to use as is. Default: target/llama-bench/llama-bench,
    /// (re)built by scripts/build-llama-bench.sh against the llama.cpp this binary links.
    #[arg(long)]
    pub llama_bench: Option<PathBuf>,
    /// Rebuild llama-bench even if it is up to date.
    #[arg(long)]
    pub rebuild_llama_bench: bool,
}

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub rounds: Rounds,
}

#[derive(clap::Args, Debug)]
pub struct RemoteArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub gen_: Gen,
    /// Alternating decode pairs after one warm-up each.
    #[arg(long, default_value_t = 10)]
    pub pairs: u32,
    /// New connections per transport (connect, then time to first token).
    #[arg(long, default_value_t = 10)]
    pub connections: u32,
}

#[derive(clap::Args, Debug)]
pub struct HttpArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub gen_: Gen,
    /// Alternating decode pairs after one warm-up each.
    #[arg(long, default_value_t = 10)]
    pub pairs: u32,
}

#[derive(clap::Args, Debug)]
pub struct DispatchArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub rounds: Rounds,
    /// Concurrent background tasks per burst.
    #[arg(long, default_value_t = 8)]
    pub tasks: usize,
    /// Fallback trials of each kind.
    #[arg(long, default_value_t = 3)]
    pub trials: u32,
}

#[derive(clap::Args, Debug)]
pub struct FaultsArgs {
    #[command(flatten)]
    pub common: Common,
    /// The document the figures are appended to. Default: docs/RELIABILITY.md in the workspace.
    #[arg(long)]
    pub doc: Option<PathBuf>,
    #[command(flatten)]
    pub fault: faults::FaultArgs,
}

#[derive(clap::Args, Debug)]
pub struct LookupArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub rounds: Rounds,
    /// Items of each task.
    #[arg(long, default_value_t = 6)]
    pub lookup_items: usize,
}

#[derive(clap::Args, Debug)]
pub struct SplitArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub rounds: Rounds,
    #[command(flatten)]
    pub gen_: Gen,
    /// The share of layers kept on this machine.
    #[arg(long, default_value_t = 0.5)]
    pub split_local: f64,
}

#[derive(clap::Args, Debug)]
pub struct BatchArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub rounds: Rounds,
    #[command(flatten)]
    pub gen_: Gen,
    /// Rebuild llama-bench (and llama-batched-bench) even if it is up to date.
    #[arg(long)]
    pub rebuild_llama_bench: bool,
}

#[derive(clap::Args, Debug)]
pub struct ContentionArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub rounds: Rounds,
    #[command(flatten)]
    pub gen_: Gen,
    /// Prompt tokens of the prompt-speed test (llama-bench -p; revis's cold prompt of about as many).
    #[arg(long, default_value_t = 512)]
    pub n_prompt: u32,
    /// Rebuild llama-bench even if it is up to date.
    #[arg(long)]
    pub rebuild_llama_bench: bool,
}

#[derive(clap::Args, Debug)]
pub struct QualityArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub qual: quality::QualityArgs,
}

#[derive(clap::Args, Debug)]
pub struct TurnArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub turn: turn::TurnArgs,
}

#[derive(clap::Args, Debug)]
pub struct EstimateArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub estimate: crate::estimate::EstimateArgs,
}

#[derive(clap::Args, Debug)]
pub struct RenderArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub render: crate::render::RenderArgs,
}
