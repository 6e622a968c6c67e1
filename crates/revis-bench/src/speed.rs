//! `revis-bench speed`: revis through the whole stack (client library →
//! Unix socket → revisd → engine) against llama.cpp's own `llama-bench` built
//! from the same llama.cpp, interleaved in one run (docs/BENCHMARKS.md).
//!
//! Per model × thread count × round it runs, back to back: llama-bench
//! (pp + tg), the engine alone in this process (greedy decode), and a fresh
//! revisd (decode, prompt speed, cold and warm time to first token).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use revis_client::wire::v1 as pb;

use crate::cli::SpeedArgs;
use crate::harness::{Bench, Place, Raw, Section, args_line, model_file, revisd_path, workspace_root};
use crate::report::{Combo, Run, Samples};
use crate::{alone, daemon, llama_bench, machine, prompts, report};

/// The speed benchmark, its options with --quick applied.
pub struct Speed {
    pub args: SpeedArgs,
}

impl Bench for Speed {
    type Results = Run;
    const DOC: &'static str = "docs/BENCHMARKS.md";

    async fn run(&self) -> anyhow::Result<Run> {
        run(&self.args).await
    }

    fn report(&self, run: &Run) -> anyhow::Result<Vec<Section>> {
        Ok(vec![Section { text: report::markdown(run, &setup_line(&self.args)), place: Place::Marked(Box::new(report::splice)) }])
    }

    fn raw(&self, run: &Run) -> anyhow::Result<Option<Raw>> {
        Raw::new("last-run.json", &report::raw_json(run), "raw samples").map(Some)
    }
}

struct Setup {
    revisd: PathBuf,
    llama_bench: PathBuf,
    n_prompt: u32,
    n_gen: u32,
    context: u32,
    batch: u32,
}

/// Every model × thread count, round after round, until --rounds or --max-minutes.
async fn run(args: &SpeedArgs) -> anyhow::Result<Run> {
    let c = &args.common;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.max_minutes * 60.0);
    let root = workspace_root();
    let revisd = revisd_path(c)?;
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
    for name in &c.models {
        let entry = revis_models::find(name).with_context(|| format!("{name} is not in the catalog"))?;
        let path = model_file(name).await?;
        let file_bytes = std::fs::metadata(&path)?.len();
        // Prompts sized in this model's tokens (the engine alone loads it for the tokenizer).
        let probe = alone::Alone::load(alone::spec(&path, 1, c.context, c.batch)).await?;
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
        for &t in &c.threads {
            let bw = machine::read_bandwidth(&buffer, t as usize, 5);
            eprintln!("revis-bench: read bandwidth with {t} thread(s): {:.1} GB/s", bw / 1e9);
            run.bandwidth.push((t, bw));
        }
        run.bandwidth_buffer_mib = args.bandwidth_mib;
    }

    let setup = Setup { revisd, llama_bench, n_prompt: args.n_prompt, n_gen: args.gen_.n_gen, context: c.context, batch: c.batch };
    for (m, _) in models.iter().enumerate() {
        for &t in &c.threads {
            run.combos.push(Combo { model: m, threads: t, samples: Samples::default() });
        }
    }
    run.models = models;

    'rounds: for round in 1..=args.rounds.rounds {
        for i in 0..run.combos.len() {
            if Instant::now() > deadline {
                run.notes.push(format!("stopped after {:.0} min (--max-minutes) in round {round}", args.max_minutes));
                break 'rounds;
            }
            run.sample_load();
            let (m, t) = (run.combos[i].model, run.combos[i].threads);
            let model = &run.models[m];
            eprintln!("revis-bench: round {round}/{}: {} with {t} thread(s)", args.rounds.rounds, model.name);
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

    Ok(run)
}

fn setup_line(args: &SpeedArgs) -> String {
    format!(
        "{} round(s); llama-bench `-p {} -n {} -b {b} -ub {b} -r 1` per round; revis: context {}, batch {b}, greedy, max_tokens {}; TTFT static text about {} tokens",
        args.rounds.rounds,
        args.n_prompt,
        args.gen_.n_gen,
        args.common.context,
        args.gen_.n_gen,
        args.n_prefix,
        b = args.common.batch
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
    let launch = daemon::Launch::plain(threads, setup.context, setup.batch);
    daemon::Daemon::around(&setup.revisd, &model.path, launch, async |d| measure_daemon(setup, model, d, s).await).await
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
        revis_engine::Role::Tool => pb::Role::Tool,
    };
    revis_client::wire::message(role, &m.content)
}
