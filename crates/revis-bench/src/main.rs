//! revis-bench: measures revis through the whole stack (client library →
//! Unix socket → revisd → engine) against llama.cpp's own `llama-bench` built
//! from the same llama.cpp, interleaved in one run, and writes the results
//! to docs/BENCHMARKS.md.
//!
//! Per model × thread count × round it runs, back to back: llama-bench
//! (pp + tg), the engine alone in this process (greedy decode), and a fresh
//! revisd (decode, prompt speed, cold and warm time to first token).
//! `--chat` measures a chat turn with and without pre-prefill instead;
//! `--remote` the Unix socket against server mode's mutual TLS;
//! `--http` `revis serve`'s OpenAI API against the gRPC client;
//! `--dispatch` a second daemon through the dispatcher, and fallback latency;
//! `--faults` what revis does under misbehaving callers and kill -9
//! (docs/RELIABILITY.md); `--split` one model across two machines; `--batch-streams` several answers in one batch
//! (network namespaces) against the whole model on one.

mod alone;
mod batch;
mod chat;
mod daemon;
mod dispatch;
mod ensemble;
mod faults;
mod http;
mod llama_bench;
mod lookup;
mod machine;
mod proc;
mod prompts;
mod quality;
mod remote;
mod report;
mod split;
mod stats;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use revis_client::wire::v1 as pb;

use crate::report::{Combo, Run, Samples};

/// Benchmark revis against llama.cpp's llama-bench (same llama.cpp build, model and threads).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Rounds; each round measures every model × thread count once, interleaved.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Catalog models to measure (pulled when missing).
    #[arg(long, value_delimiter = ',', default_value = "smollm2-135m-instruct,gemma3-270m")]
    models: Vec<String>,
    /// Thread counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<u32>,
    /// Prompt tokens for the prompt-speed test (llama-bench -p).
    #[arg(long, default_value_t = 512)]
    n_prompt: u32,
    /// Generated tokens for the decode test (llama-bench -n, revis max_tokens).
    #[arg(long, default_value_t = 128)]
    n_gen: u32,
    /// Tokens of the static prefix in the time-to-first-token test.
    #[arg(long, default_value_t = 1000)]
    n_prefix: u32,
    /// Context of the daemon and the engine (daemon.context).
    #[arg(long, default_value_t = 2048)]
    context: u32,
    /// Prompt batch size of revis (daemon.batch) and of llama-bench (-b, -ub).
    #[arg(long, default_value_t = 512)]
    batch: u32,
    /// Size of the buffer the read-bandwidth loop sums, in MiB.
    #[arg(long, default_value_t = 1024)]
    bandwidth_mib: usize,
    /// Stop starting new measurements after this many minutes (the run then reports what it has).
    #[arg(long, default_value_t = 14.0)]
    max_minutes: f64,
    /// A short run for development: 1 round, 32 generated tokens, 128-token prompt, 300-token prefix.
    #[arg(long)]
    quick: bool,
    /// Rewrite the results section of the benchmarks document (between its markers).
    #[arg(long)]
    write: bool,
    /// The benchmarks document. Default: docs/BENCHMARKS.md in the workspace.
    #[arg(long)]
    doc: Option<PathBuf>,
    /// The revisd binary. Default: next to this executable (target/release/revisd).
    #[arg(long)]
    revisd: Option<PathBuf>,
    /// A llama-bench binary to use as is. Default: target/llama-bench/llama-bench,
    /// (re)built by scripts/build-llama-bench.sh against the llama.cpp this binary links.
    #[arg(long)]
    llama_bench: Option<PathBuf>,
    /// Rebuild llama-bench even if it is up to date.
    #[arg(long)]
    rebuild_llama_bench: bool,
    /// Run only the chat-turn benchmark (pre-prefill on vs off), on the first model and the most threads.
    #[arg(long)]
    chat: bool,
    /// Run only the server-mode benchmark (Unix socket against mutual TLS on
    /// loopback, one revisd), on the first model and the most threads.
    #[arg(long, conflicts_with = "chat")]
    remote: bool,
    /// Run only the HTTP benchmark: `revis serve`'s streaming chat completions
    /// against the gRPC client on the same revisd (decode speed, first token),
    /// on the first model and the most threads.
    #[arg(long, conflicts_with_all = ["chat", "remote"])]
    http: bool,
    /// With --remote or --http: alternating decode pairs after one warm-up each.
    #[arg(long, default_value_t = 10)]
    pairs: u32,
    /// With --remote: new connections per transport (connect, then time to first token).
    #[arg(long, default_value_t = 10)]
    connections: u32,
    /// Run only the dispatch benchmark: 8 concurrent background tasks on one
    /// daemon against two (each pinned to a core), and fallback latency after
    /// a node is killed or its link cut (network namespaces; needs root).
    #[arg(long, conflicts_with_all = ["chat", "remote"])]
    dispatch: bool,
    /// With --dispatch: concurrent background tasks per burst.
    #[arg(long, default_value_t = 8)]
    tasks: usize,
    /// With --dispatch: fallback trials of each kind.
    #[arg(long, default_value_t = 3)]
    trials: u32,
    /// Run only the fault benchmark (docs/RELIABILITY.md): load with misbehaving
    /// callers, kill -9 of `revis chat` mid-answer, kill -9 of a socket-activated
    /// revisd; appends its figures to docs/RELIABILITY.md (or --doc) and exits
    /// non-zero when an invariant was broken.
    #[arg(long, conflicts_with_all = ["chat", "remote", "dispatch", "write"])]
    faults: bool,
    /// Run only the speculation benchmark: prompt lookup decoding against
    /// plain decoding (two revisd, daemon.speculate on and off) on the
    /// orchestrator's copy-heavy tasks and on open chat, each model of
    /// --models at each of --threads.
    #[arg(long, conflicts_with_all = ["chat", "remote", "dispatch", "http", "faults"])]
    lookup: bool,
    /// Run only the split benchmark: the first model of --models split
    /// across two one-core nodes (network namespaces, a veth shaped with tc
    /// netem; needs root) against the whole model on one node.
    #[arg(long, conflicts_with_all = ["chat", "remote", "dispatch", "http", "faults", "lookup"])]
    split: bool,
    /// Run only the batching benchmark: one stream alone, four at once, and
    /// a user stream beside three background ones (`daemon.streams`),
    /// against llama-batched-bench with the same shapes, each model of
    /// --models at the most --threads.
    #[arg(long, conflicts_with_all = ["chat", "remote", "dispatch", "http", "faults", "lookup", "split"])]
    batch_streams: bool,
    /// With --split: the share of layers kept on this machine.
    #[arg(long, default_value_t = 0.5)]
    split_local: f64,
    /// With --lookup: items of each task.
    #[arg(long, default_value_t = 6)]
    lookup_items: usize,
    #[command(flatten)]
    fault: faults::FaultArgs,
    #[command(flatten)]
    ens: ensemble::EnsembleArgs,
    #[command(flatten)]
    qual: quality::QualityArgs,
}

/// The workspace this binary was built from.
fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    here.canonicalize().unwrap_or(here)
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.faults {
        // Its own --quick sizes (faults::Settings::from_args).
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        return rt.block_on(run_faults(args));
    }
    if args.ens.ensemble {
        return tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(ensemble::run(&args));
    }
    if args.qual.quality {
        return tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(run_quality(&args));
    }
    if args.quick {
        args.rounds = 1;
        args.n_gen = 32;
        args.n_prompt = 128;
        args.n_prefix = 300;
        args.pairs = 2;
        args.connections = 3;
    }
    if args.n_gen < 2 || args.n_prompt < 16 || args.n_prefix < 16 || args.rounds == 0 || args.threads.is_empty() {
        bail!("need --n-gen ≥ 2, --n-prompt ≥ 16, --n-prefix ≥ 16, --rounds ≥ 1 and at least one thread count");
    }
    if (args.n_prefix + 64).max(args.n_prompt + 8) >= args.context {
        bail!("--context {} is too small for --n-prefix {} / --n-prompt {}", args.context, args.n_prefix, args.n_prompt);
    }
    // One thread is enough for the client side; the engine threads do the work.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    if args.chat {
        return rt.block_on(run_chat(args));
    }
    if args.dispatch {
        return rt.block_on(run_dispatch(args));
    }
    if args.lookup {
        return rt.block_on(run_lookup(args));
    }
    if args.batch_streams {
        return rt.block_on(run_batch(args));
    }
    if args.split {
        return run_split(args, &rt);
    }
    if args.http {
        if args.pairs == 0 {
            bail!("need --pairs ≥ 1");
        }
        return rt.block_on(run_http(args));
    }
    if args.remote {
        if args.pairs == 0 || args.connections == 0 {
            bail!("need --pairs ≥ 1 and --connections ≥ 1");
        }
        return rt.block_on(run_remote(args));
    }
    rt.block_on(run(args))
}

struct Setup {
    revisd: PathBuf,
    llama_bench: PathBuf,
    n_prompt: u32,
    n_gen: u32,
    context: u32,
    batch: u32,
}

/// The revisd to measure: --revisd, else the one next to this executable.
fn revisd_path(args: &Args) -> anyhow::Result<PathBuf> {
    let revisd = match &args.revisd {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("revisd"),
    };
    if !revisd.is_file() {
        bail!("no revisd at {}: build it first (cargo build --release -p revisd) or pass --revisd", revisd.display());
    }
    Ok(revisd)
}

/// The file of catalog model `name`, pulled when missing.
async fn model_file(name: &str) -> anyhow::Result<PathBuf> {
    let entry = revis_models::find(name).with_context(|| format!("{name} is not in the catalog"))?;
    let dir = revis_models::models_dir()?;
    tokio::task::spawn_blocking(move || {
        revis_models::pull(entry, &dir, &revis_models::PullOptions { progress: revis_models::Progress::Quiet, ..Default::default() })
    })
    .await?
    .map_err(Into::into)
}

/// `--quality`: each model of --models in turn (docs/QUALITY.md).
async fn run_quality(args: &Args) -> anyhow::Result<()> {
    let revisd = revisd_path(args)?;
    let root = workspace_root();
    let data = args.qual.quality_data.clone().unwrap_or_else(|| root.join("crates/revis-bench/data/quality"));
    let items = if args.quick && args.qual.quality_items == 0 { 12 } else { args.qual.quality_items };
    let threads = *args.threads.iter().max().unwrap_or(&2);
    let machine = machine::Machine::detect();
    let (date, command) = (machine::utc_now(), args_line());
    for name in &args.models {
        let model = model_file(name).await?;
        eprintln!("revis-bench: quality of {name}");
        let started = Instant::now();
        let target = quality::Target { revisd: &revisd, model: &model, name, threads, context: args.context };
        let results = [quality::run_model(&target, &args.qual, items, &data).await?];
        let about = format!(
            "- {date}, `{command}`, {:.1} min for this model\n- {} ({} cores, {:.0} GiB), {}; {threads} threads, every tier on {name}",
            started.elapsed().as_secs_f64() / 60.0,
            machine.cpu,
            machine.cores,
            machine.memory_gib,
            machine.os
        );
        let raw = root.join(format!("target/revis-bench/last-quality-run-{name}.json"));
        if let Some(dir) = raw.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&raw, serde_json::to_string_pretty(&results)?)?;
        eprintln!("revis-bench: raw figures in {}", raw.display());
        let parts = &args.qual.quality_parts;
        for time in [false, true] {
            if parts.iter().all(|p| (*p == quality::QPart::Time) != time) {
                continue;
            }
            let section = quality::report(&results, &about, time);
            println!("{section}");
            if args.write {
                let doc = args.doc.clone().unwrap_or_else(|| root.join("docs/QUALITY.md"));
                let old = std::fs::read_to_string(&doc).unwrap_or_else(|_| "# Quality".to_owned());
                let (begin, end) = quality::markers(name, if time { "time" } else { "quality" });
                let heading = if time { format!("## {name}: time to the first token") } else { format!("## {name}: latest run") };
                std::fs::write(&doc, report::splice_marked(&old, &begin, &end, &heading, &section))?;
                eprintln!("revis-bench: updated {}", doc.display());
            }
        }
    }
    Ok(())
}

async fn run_remote(args: Args) -> anyhow::Result<()> {
    let revisd = revisd_path(&args)?;
    let name = &args.models[0];
    let model = model_file(name).await?;
    let settings = remote::Settings {
        threads: *args.threads.iter().max().unwrap_or(&2),
        context: args.context,
        batch: args.batch,
        n_gen: args.n_gen,
        pairs: args.pairs,
        connections: args.connections,
    };
    let machine = machine::Machine::detect();
    let date = machine::utc_now();
    let command = args_line();
    let result = remote::run(&revisd, &model, &settings).await?;
    let about = remote::About {
        date: &date,
        command: &command,
        machine: &machine,
        revisd: &revisd,
        model: name,
        model_bytes: std::fs::metadata(&model)?.len(),
    };
    let section = remote::report(&result, &settings, &about);
    println!("{section}");
    let root = workspace_root();
    let raw = root.join("target/revis-bench/last-remote-run.json");
    if let Some(dir) = raw.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&raw, serde_json::to_string_pretty(&remote::raw_json(&result, &settings, &about))?)?;
    eprintln!("revis-bench: raw samples in {}", raw.display());
    if args.write {
        let doc = args.doc.clone().unwrap_or_else(|| root.join("docs/BENCHMARKS.md"));
        let old = std::fs::read_to_string(&doc).unwrap_or_default();
        std::fs::write(&doc, remote::splice(&old, &section))?;
        eprintln!("revis-bench: updated {}", doc.display());
    }
    Ok(())
}

/// Prints a mode's section, keeps its raw samples in
/// `target/revis-bench/RAW`, and with --write replaces the section between
/// its markers (begin, end, and the heading it gets when first written) in
/// docs/BENCHMARKS.md (or --doc).
fn save_marked(args: &Args, raw: &str, data: &impl serde::Serialize, section: &str, marks: (&str, &str, &str)) -> anyhow::Result<()> {
    println!("{section}");
    let root = workspace_root();
    let raw = root.join("target/revis-bench").join(raw);
    if let Some(dir) = raw.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&raw, serde_json::to_string_pretty(data)?)?;
    eprintln!("revis-bench: raw samples in {}", raw.display());
    if args.write {
        let doc = args.doc.clone().unwrap_or_else(|| root.join("docs/BENCHMARKS.md"));
        let old = std::fs::read_to_string(&doc).unwrap_or_default();
        std::fs::write(&doc, report::splice_marked(&old, marks.0, marks.1, marks.2, section))?;
        eprintln!("revis-bench: updated {}", doc.display());
    }
    Ok(())
}

async fn run_lookup(args: Args) -> anyhow::Result<()> {
    let revisd = revisd_path(&args)?;
    let mut models = Vec::new();
    for name in &args.models {
        models.push((name.clone(), model_file(name).await?));
    }
    let settings = lookup::Settings {
        threads: args.threads.clone(),
        context: args.context,
        batch: args.batch,
        rounds: args.rounds,
        items: if args.quick { 2 } else { args.lookup_items },
        max_tokens: if args.quick { 48 } else { 128 },
    };
    let machine = machine::Machine::detect();
    let date = machine::utc_now();
    let command = args_line();
    let started = std::time::Instant::now();
    let cells = lookup::run(&revisd, &models, &settings).await?;
    let about = lookup::About { date: &date, command: &command, machine: &machine, minutes: started.elapsed().as_secs_f64() / 60.0 };
    let section = lookup::report(&cells, &settings, &about);
    save_marked(
        &args,
        "last-lookup-run.json",
        &cells,
        &section,
        (lookup::BEGIN, lookup::END, "## Speculation from the context (`--lookup`)"),
    )
}

async fn run_batch(args: Args) -> anyhow::Result<()> {
    let revisd = revisd_path(&args)?;
    let root = workspace_root();
    let bin = llama_bench::default_path(&root);
    llama_bench::build(&root, &bin, args.rebuild_llama_bench)?;
    let batched = bin.with_file_name("llama-batched-bench");
    let mut models = Vec::new();
    for name in &args.models {
        models.push((name.clone(), model_file(name).await?));
    }
    let settings = batch::Settings {
        threads: args.threads.iter().copied().max().unwrap_or(2),
        context: args.context,
        batch: args.batch,
        rounds: args.rounds,
        n_gen: args.n_gen,
    };
    let machine = machine::Machine::detect();
    let date = machine::utc_now();
    let command = args_line();
    let cells = batch::run(&revisd, &batched, &models, &settings).await?;
    let section = batch::report(&cells, &settings, &batch::About { date: &date, command: &command, machine: &machine });
    save_marked(&args, "last-batch-run.json", &cells, &section, (batch::BEGIN, batch::END, batch::HEADING))
}

fn run_split(args: Args, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let revisd = revisd_path(&args)?;
    let name = args.models.first().context("--models is empty")?.clone();
    let model = rt.block_on(model_file(&name))?;
    let settings = split::Settings {
        context: args.context.max(4096),
        batch: args.batch,
        rounds: args.rounds,
        sentences: if args.quick { 20 } else { 54 },
        n_gen: args.n_gen,
        local_share: args.split_local,
    };
    let machine = machine::Machine::detect();
    let date = machine::utc_now();
    let command = args_line();
    // On a thread of its own: it enters a network namespace for good.
    let results = std::thread::scope(|scope| scope.spawn(|| split::run(&revisd, &name, &model, &settings)).join())
        .map_err(|_| anyhow::anyhow!("the split benchmark panicked"))??;
    let section = split::report(&results, &settings, &split::About { date: &date, command: &command, machine: &machine });
    save_marked(&args, "last-split-run.json", &results, &section, (split::BEGIN, split::END, split::HEADING))
}

async fn run_http(args: Args) -> anyhow::Result<()> {
    let revisd = revisd_path(&args)?;
    let name = &args.models[0];
    let model = model_file(name).await?;
    let settings = http::Settings {
        threads: *args.threads.iter().max().unwrap_or(&2),
        context: args.context,
        batch: args.batch,
        n_gen: args.n_gen,
        pairs: args.pairs,
    };
    let machine = machine::Machine::detect();
    let date = machine::utc_now();
    let command = args_line();
    let result = http::run(&revisd, &model, &settings).await?;
    let section = http::report(&result, &settings, &http::About { date: &date, command: &command, machine: &machine, model: name });
    println!("{section}");
    let root = workspace_root();
    let raw = root.join("target/revis-bench/last-http-run.json");
    if let Some(dir) = raw.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&raw, serde_json::to_string_pretty(&http::raw_json(&result))?)?;
    eprintln!("revis-bench: raw samples in {}", raw.display());
    if args.write {
        let doc = args.doc.clone().unwrap_or_else(|| root.join("docs/BENCHMARKS.md"));
        let old = std::fs::read_to_string(&doc).unwrap_or_default();
        std::fs::write(&doc, http::splice(&old, &section))?;
        eprintln!("revis-bench: updated {}", doc.display());
    }
    Ok(())
}

async fn run_dispatch(args: Args) -> anyhow::Result<()> {
    let revisd = revisd_path(&args)?;
    let name = &args.models[0];
    let model = model_file(name).await?;
    let settings = dispatch::Settings {
        rounds: if args.quick { 1 } else { args.rounds },
        tasks: args.tasks,
        max_tokens: if args.quick { 32 } else { 64 },
        trials: if args.quick { 1 } else { args.trials },
        context: args.context,
        batch: args.batch,
    };
    let machine = machine::Machine::detect();
    let date = machine::utc_now();
    let command = args_line();
    let result = dispatch::run(&revisd, &model, &settings).await?;
    let about = dispatch::About { date: &date, command: &command, machine: &machine, revisd: &revisd, model: name };
    let section = dispatch::report(&result, &settings, &about);
    println!("{section}");
    let root = workspace_root();
    let raw = dispatch::raw_path(&root);
    if let Some(dir) = raw.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&raw, serde_json::to_string_pretty(&dispatch::raw_json(&result))?)?;
    if args.write {
        let doc = args.doc.clone().unwrap_or_else(|| root.join("docs/BENCHMARKS.md"));
        let old = std::fs::read_to_string(&doc).unwrap_or_default();
        std::fs::write(&doc, dispatch::splice(&old, &section))?;
        eprintln!("revis-bench: updated {}", doc.display());
    }
    Ok(())
}

async fn run_faults(args: Args) -> anyhow::Result<()> {
    let revisd = revisd_path(&args)?;
    let revis = revisd.with_file_name("revis");
    if !revis.is_file() {
        bail!("no revis at {}: build it first (cargo build --release -p revis-cli)", revis.display());
    }
    let name = &args.models[0];
    let model = model_file(name).await?;
    let threads = *args.threads.iter().max().unwrap_or(&2);
    let settings = faults::Settings::from_args(&args.fault, args.quick, threads, args.context, args.batch);
    let machine = machine::Machine::detect();
    let date = machine::utc_now();
    let command = args_line();
    let about = faults::About {
        date: &date,
        command: &command,
        machine: &machine,
        revisd: &revisd,
        revis: &revis,
        model: name,
        model_bytes: std::fs::metadata(&model)?.len(),
    };
    let outcome = faults::run(&revisd, &revis, &model, &settings, &about).await?;
    println!("{}", outcome.section);
    let doc = args.doc.clone().unwrap_or_else(|| faults::default_doc(&workspace_root()));
    faults::append(&doc, &outcome.section)?;
    eprintln!("revis-bench: appended to {}", doc.display());
    if outcome.violations > 0 {
        bail!("{} invariant violation(s); seed {} (replay with --seed {})", outcome.violations, settings.seed, settings.seed);
    }
    Ok(())
}

async fn run_chat(args: Args) -> anyhow::Result<()> {
    let revisd = revisd_path(&args)?;
    let name = &args.models[0];
    let model = model_file(name).await?;
    let threads = *args.threads.iter().max().unwrap_or(&2);
    // About 1,000 tokens of history with these filler words.
    let result = chat::run(&revisd, &model, threads, args.rounds, 620).await?;
    let date = String::from_utf8(std::process::Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]).output()?.stdout)?;
    let section = chat::report(&result, name, threads, date.trim(), &args_line());
    println!("{section}");
    if args.write {
        let doc = args.doc.clone().unwrap_or_else(|| workspace_root().join("docs/BENCHMARKS.md"));
        let old = std::fs::read_to_string(&doc).unwrap_or_default();
        std::fs::write(&doc, chat::splice(&old, &section))?;
        eprintln!("revis-bench: updated {}", doc.display());
    }
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.max_minutes * 60.0);
    let root = workspace_root();
    let revisd = revisd_path(&args)?;
    let (llama_bench, build_info) = match &args.llama_bench {
        Some(bin) if bin.is_file() => (bin.clone(), llama_bench::build_info(bin)),
        Some(bin) => bail!("no llama-bench at {}", bin.display()),
        None => {
            let bin = llama_bench::default_path(&root);
            let info = llama_bench::build(&root, &bin, args.rebuild_llama_bench)?;
            (bin, info)
        }
    };

    let mut run = Run::new(&args_line(), machine::Machine::detect(), build_info, revisd.display().to_string());
    run.sample_load();

    // Models.
    let mut models = Vec::new();
    for name in &args.models {
        let entry = revis_models::find(name).with_context(|| format!("{name} is not in the catalog"))?;
        let path = model_file(name).await?;
        let file_bytes = std::fs::metadata(&path)?.len();
        // Prompts sized in this model's tokens (the engine alone loads it for the tokenizer).
        let probe = alone::Alone::load(alone::spec(&path, 1, args.context, args.batch)).await?;
        let prompts = probe.prompts(args.n_prompt as usize, args.n_prefix as usize)?;
        probe.unload().await;
        eprintln!(
            "revis-bench: {} ({:.1} MB): prompt {} tokens, notes {} tokens, question {} tokens",
            entry.name,
            file_bytes as f64 / 1e6,
            prompts.prompt_tokens,
            prompts.notes_tokens,
            prompts.question_tokens
        );
        models.push(report::Model { name: entry.name.to_owned(), path, file_bytes, prompts });
    }

    // Read bandwidth, before anything else holds memory.
    {
        let buffer = machine::bandwidth_buffer(args.bandwidth_mib << 20);
        for &t in &args.threads {
            let bw = machine::read_bandwidth(&buffer, t as usize, 5);
            eprintln!("revis-bench: read bandwidth with {t} thread(s): {:.1} GB/s", bw / 1e9);
            run.bandwidth.push((t, bw));
        }
        run.bandwidth_buffer_mib = args.bandwidth_mib;
    }

    let setup = Setup { revisd, llama_bench, n_prompt: args.n_prompt, n_gen: args.n_gen, context: args.context, batch: args.batch };
    for (m, _) in models.iter().enumerate() {
        for &t in &args.threads {
            run.combos.push(Combo { model: m, threads: t, samples: Samples::default() });
        }
    }
    run.models = models;

    'rounds: for round in 1..=args.rounds {
        for i in 0..run.combos.len() {
            if Instant::now() > deadline {
                run.notes.push(format!("stopped after {:.0} min (--max-minutes) in round {round}", args.max_minutes));
                break 'rounds;
            }
            run.sample_load();
            let (m, t) = (run.combos[i].model, run.combos[i].threads);
            let model = &run.models[m];
            eprintln!("revis-bench: round {round}/{}: {} with {t} thread(s)", args.rounds, model.name);
            let mut samples = std::mem::take(&mut run.combos[i].samples);
            let meter = machine::CpuMeter::start();
            let result = measure(&setup, model, t, &mut samples).await;
            samples.others_cpu_pct.extend(meter.others_percent());
            if let Err(e) = result {
                let note = format!("round {round}, {} t={t}: {e:#}", model.name);
                eprintln!("revis-bench: {note}");
                run.notes.push(note);
            }
            run.combos[i].samples = samples;
        }
        run.rounds_done = round;
    }
    run.sample_load();
    run.elapsed = started.elapsed();

    let section = report::markdown(&run, &setup_line(&args));
    println!("{section}");
    let raw = root.join("target/revis-bench/last-run.json");
    if let Some(dir) = raw.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&raw, serde_json::to_string_pretty(&report::raw_json(&run))?)?;
    eprintln!("revis-bench: raw samples in {}", raw.display());
    if args.write {
        let doc = args.doc.clone().unwrap_or_else(|| root.join("docs/BENCHMARKS.md"));
        report::write_section(&doc, &section)?;
        eprintln!("revis-bench: updated {}", doc.display());
    }
    Ok(())
}

/// The command line as a user would type it.
fn args_line() -> String {
    let rest: Vec<String> = std::env::args().skip(1).collect();
    let mut s = "cargo run --release -p revis-bench --".to_owned();
    for a in rest {
        s.push(' ');
        s.push_str(&a);
    }
    s
}

fn setup_line(args: &Args) -> String {
    format!(
        "{} round(s); llama-bench `-p {} -n {} -b {b} -ub {b} -r 1` per round; revis: context {}, batch {b}, greedy, max_tokens {}; TTFT static text about {} tokens",
        args.rounds,
        args.n_prompt,
        args.n_gen,
        args.context,
        args.n_gen,
        args.n_prefix,
        b = args.batch
    )
}

/// One model × thread count, once: llama-bench, the engine alone, then revisd.
async fn measure(setup: &Setup, model: &report::Model, threads: u32, s: &mut Samples) -> anyhow::Result<()> {
    // 1. The reference.
    match llama_bench::run(&setup.llama_bench, &model.path, threads, setup.n_prompt, setup.n_gen, setup.batch, Duration::from_secs(600)) {
        Ok(r) => {
            s.lb_pp.extend(r.pp);
            s.lb_tg.extend(r.tg);
        }
        Err(e) => s.errors.push(format!("llama-bench: {e:#}")),
    }

    // 2. The engine alone, in this process.
    let engine = alone::Alone::load(alone::spec(&model.path, threads, setup.context, setup.batch)).await?;
    let g = engine.decode_run(setup.n_gen).await;
    let sampled = engine.decode_run_sampled(setup.n_gen).await;
    engine.unload().await;
    let g = g?;
    let sampled = sampled?;
    if sampled.generate_us > 0 {
        // Wall clock from the first delta, like the greedy figure it is compared with.
        s.alone_tg_sampled.push(1e6 / sampled.wall_us_per_token());
    }
    s.alone_us_per_token.push(g.wall_us_per_token());
    s.alone_generated.push(g.generated);
    if g.generate_us > 0 {
        s.alone_tg_done.push(f64::from(g.generated) * 1e6 / g.generate_us as f64);
    }

    // 3. The whole stack: client library → socket → revisd.
    let mut d = daemon::Daemon::start(&setup.revisd, &model.path, threads, setup.context, setup.batch).await?;
    let result = measure_daemon(setup, model, &mut d, s).await;
    if result.is_err() {
        eprintln!("revis-bench: revisd log:\n{}", d.log_tail());
    }
    d.stop();
    result
}

async fn measure_daemon(setup: &Setup, model: &report::Model, d: &mut daemon::Daemon, s: &mut Samples) -> anyhow::Result<()> {
    let msg = revis_client::wire::message;
    let user = pb::Role::User;
    d.generate(vec![msg(user, prompts::WARMUP_PROMPT)], None, 8).await?;

    // Decode through the whole stack.
    d.purge().await?;
    let t = d.generate(vec![msg(user, prompts::DECODE_PROMPT)], None, setup.n_gen).await?;
    let n = t.done.generated_tokens;
    s.rv_generated.push(n);
    if n >= 2 && t.first.is_some() {
        s.rv_tg_wall.push(f64::from(n - 1) / t.stream_wall().as_secs_f64());
        s.grpc_us_per_token.push(t.wall_us_per_token());
    }
    if t.done.generate_us > 0 {
        s.rv_tg_done.push(f64::from(n) * 1e6 / t.done.generate_us as f64);
    }
    d.purge().await?;
    let t = d.generate_sampled(vec![msg(user, prompts::DECODE_PROMPT)], setup.n_gen).await?;
    if t.done.generated_tokens >= 2 && t.first.is_some() {
        s.rv_tg_sampled.push(f64::from(t.done.generated_tokens - 1) / t.stream_wall().as_secs_f64());
    }

    // Prompt speed, cold.
    d.purge().await?;
    let t = d.generate(vec![msg(user, &model.prompts.long_user)], None, 1).await?;
    let evaluated = t.done.prompt_tokens.saturating_sub(t.done.cached_tokens);
    s.rv_pp_tokens.push(evaluated);
    if t.done.prompt_us > 0 {
        s.rv_pp.push(f64::from(evaluated) * 1e6 / t.done.prompt_us as f64);
    }

    // Time to first token: cold, then warm after a Prefill of the static part.
    for (layout, ttft) in prompts::Layout::ALL.into_iter().zip(s.ttft.iter_mut()) {
        let statics: Vec<pb::ChatMessage> = layout.static_messages(&model.prompts.notes).iter().map(to_pb).collect();
        let mut convo = statics.clone();
        convo.push(msg(user, prompts::QUESTION));
        let n_static = Some(statics.len() as u32);
        d.purge().await?;
        let cold = d.generate(convo.clone(), n_static, 1).await?;
        ttft.cold_ms.push(cold.ttft().as_secs_f64() * 1e3);
        d.purge().await?;
        let pre = d.prefill(statics).await?;
        ttft.prefill_ms.push(pre.elapsed_us as f64 / 1e3);
        ttft.prefill_tokens.push(pre.prompt_tokens);
        let warm = d.generate(convo, n_static, 1).await?;
        ttft.warm_ms.push(warm.ttft().as_secs_f64() * 1e3);
        ttft.reused.push(warm.done.cached_tokens);
        ttft.prompt_tokens.push(warm.done.prompt_tokens);
    }
    Ok(())
}

fn to_pb(m: &revis_engine::Message) -> pb::ChatMessage {
    let role = match m.role {
        revis_engine::Role::System => pb::Role::System,
        revis_engine::Role::User => pb::Role::User,
        revis_engine::Role::Assistant => pb::Role::Assistant,
    };
    revis_client::wire::message(role, &m.content)
}
