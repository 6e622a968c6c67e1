//! The option groups several subcommands share: what every benchmark runs
//! on (`Common`), where its results go (`Output`), how many rounds it
//! measures (`Rounds`) and how long each generated answer is (`Gen`).

use std::path::PathBuf;

/// What every benchmark runs on.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// Catalog models to measure (pulled when missing).
    #[arg(long, value_delimiter = ',', default_value = "smollm2-135m-instruct,gemma3-270m")]
    pub models: Vec<String>,
    /// Thread counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<u32>,
    /// Context of the daemon and the engine (daemon.context).
    #[arg(long, default_value_t = 2048)]
    pub context: u32,
    /// Prompt batch size of revis (daemon.batch) and of llama-bench (-b, -ub).
    #[arg(long, default_value_t = 512)]
    pub batch: u32,
    /// The revisd binary. Default: next to this executable (target/release/revisd).
    #[arg(long)]
    pub revisd: Option<PathBuf>,
    /// A short run for development: 1 round, 32 generated tokens (speed: 128-token prompt,
    /// 300-token prefix; remote, http: 2 pairs, 3 connections; the others their own reduced counts).
    #[arg(long)]
    pub quick: bool,
}

impl Common {
    /// The most threads of --threads (the benchmarks that run one count).
    pub fn most_threads(&self) -> u32 {
        self.threads.iter().copied().max().unwrap_or(2)
    }
}

/// Where the results go.
#[derive(clap::Args, Debug, Clone)]
pub struct Output {
    /// Rewrite the results section of the benchmarks document (between its markers).
    #[arg(long)]
    pub write: bool,
    /// The benchmarks document. Default: the benchmark's own in docs/ of the workspace.
    #[arg(long)]
    pub doc: Option<PathBuf>,
}

/// How many times each measurement is repeated.
#[derive(clap::Args, Debug, Clone)]
pub struct Rounds {
    /// Rounds; each round measures every model × thread count once, interleaved.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
}

/// How long each generated answer is.
#[derive(clap::Args, Debug, Clone)]
pub struct Gen {
    /// Generated tokens for the decode test (llama-bench -n, revis max_tokens).
    #[arg(long, default_value_t = 128)]
    pub n_gen: u32,
}
