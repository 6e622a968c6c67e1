//! Each subcommand as a [`Bench`]: its options turned into the lab's
//! settings, the lab's run, and where its report and raw samples go. The
//! labs themselves (what is measured, how it is reported) are the modules
//! named after them.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};

use crate::cli::{
    BatchArgs, ChatArgs, ContentionArgs, DispatchArgs, FaultsArgs, HttpArgs, LookupArgs, QualityArgs, RemoteArgs, SplitArgs, TurnArgs,
};
use crate::harness::{Bench, Place, Raw, Section, args_line, marked, model_file, revisd_path, workspace_root};
use crate::machine::{self, Machine};
use crate::options::Common;
use crate::{alone, batch, chat, contention, dispatch, faults, http, llama_bench, lookup, quality, remote, render, split, turn};

/// When and where a run was made, and how it was started.
pub struct Stamp {
    pub date: String,
    pub command: String,
    pub machine: Machine,
}

impl Stamp {
    pub fn now() -> Stamp {
        Stamp { machine: Machine::detect(), date: machine::utc_now(), command: args_line() }
    }
}

/// The models of --models, each with its file (pulled when missing).
async fn model_files(common: &Common) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut models = Vec::new();
    for name in &common.models {
        models.push((name.clone(), model_file(name).await?));
    }
    Ok(models)
}

/// `revis-bench chat`.
pub struct Chat {
    pub args: ChatArgs,
}

impl Bench for Chat {
    type Results = (chat::ChatTurn, String);
    const DOC: &'static str = "docs/BENCHMARKS.md";

    async fn run(&self) -> anyhow::Result<Self::Results> {
        let c = &self.args.common;
        let revisd = revisd_path(c)?;
        let model = model_file(&c.models[0]).await?;
        // About 1,000 tokens of history with these filler words.
        let result = chat::run(&revisd, &model, c.most_threads(), self.args.rounds.rounds, 620).await?;
        let date = String::from_utf8(std::process::Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]).output()?.stdout)?;
        Ok((result, date))
    }

    fn report(&self, (turn, date): &Self::Results) -> anyhow::Result<Vec<Section>> {
        let c = &self.args.common;
        let text = chat::report(turn, &c.models[0], c.most_threads(), date.trim(), &args_line());
        Ok(vec![Section { text, place: Place::Marked(Box::new(chat::splice)) }])
    }

    fn raw(&self, _: &Self::Results) -> anyhow::Result<Option<Raw>> {
        Ok(None)
    }
}

/// `revis-bench remote`.
pub struct Remote {
    pub args: RemoteArgs,
}

pub struct RemoteResults {
    result: remote::RemoteRun,
    settings: remote::Settings,
    stamp: Stamp,
    revisd: PathBuf,
    model_bytes: u64,
}

impl RemoteResults {
    fn about<'a>(&'a self, model: &'a str) -> remote::About<'a> {
        remote::About {
            date: &self.stamp.date,
            command: &self.stamp.command,
            machine: &self.stamp.machine,
            revisd: &self.revisd,
            model,
            model_bytes: self.model_bytes,
        }
    }
}

impl Bench for Remote {
    type Results = RemoteResults;
    const DOC: &'static str = "docs/BENCHMARKS.md";

    async fn run(&self) -> anyhow::Result<RemoteResults> {
        let (c, a) = (&self.args.common, &self.args);
        let revisd = revisd_path(c)?;
        let model = model_file(&c.models[0]).await?;
        let settings = remote::Settings {
            threads: c.most_threads(),
            context: c.context,
            batch: c.batch,
            n_gen: a.gen_.n_gen,
            pairs: a.pairs,
            connections: a.connections,
        };
        let stamp = Stamp::now();
        let result = remote::run(&revisd, &model, &settings).await?;
        Ok(RemoteResults { result, settings, stamp, revisd, model_bytes: std::fs::metadata(&model)?.len() })
    }

    fn report(&self, r: &RemoteResults) -> anyhow::Result<Vec<Section>> {
        let text = remote::report(&r.result, &r.settings, &r.about(&self.args.common.models[0]));
        Ok(vec![Section { text, place: Place::Marked(Box::new(remote::splice)) }])
    }

    fn raw(&self, r: &RemoteResults) -> anyhow::Result<Option<Raw>> {
        let json = remote::raw_json(&r.result, &r.settings, &r.about(&self.args.common.models[0]));
        Raw::new("last-remote-run.json", &json, "raw samples").map(Some)
    }
}

/// `revis-bench http`.
pub struct Http {
    pub args: HttpArgs,
}

impl Bench for Http {
    type Results = (http::HttpRun, http::Settings, Stamp);
    const DOC: &'static str = "docs/BENCHMARKS.md";

    async fn run(&self) -> anyhow::Result<Self::Results> {
        let (c, a) = (&self.args.common, &self.args);
        let revisd = revisd_path(c)?;
        let model = model_file(&c.models[0]).await?;
        let settings =
            http::Settings { threads: c.most_threads(), context: c.context, batch: c.batch, n_gen: a.gen_.n_gen, pairs: a.pairs };
        let stamp = Stamp::now();
        let result = http::run(&revisd, &model, &settings).await?;
        Ok((result, settings, stamp))
    }

    fn report(&self, (result, settings, s): &Self::Results) -> anyhow::Result<Vec<Section>> {
        let about = http::About { date: &s.date, command: &s.command, machine: &s.machine, model: &self.args.common.models[0] };
        Ok(vec![Section { text: http::report(result, settings, &about), place: Place::Marked(Box::new(http::splice)) }])
    }

    fn raw(&self, (result, _, _): &Self::Results) -> anyhow::Result<Option<Raw>> {
        Raw::new("last-http-run.json", &http::raw_json(result), "raw samples").map(Some)
    }
}

/// `revis-bench dispatch`.
pub struct Dispatch {
    pub args: DispatchArgs,
}

impl Bench for Dispatch {
    type Results = (dispatch::Results, dispatch::Settings, Stamp, PathBuf);
    const DOC: &'static str = "docs/BENCHMARKS.md";

    async fn run(&self) -> anyhow::Result<Self::Results> {
        let (c, a) = (&self.args.common, &self.args);
        let revisd = revisd_path(c)?;
        let model = model_file(&c.models[0]).await?;
        let settings = dispatch::Settings {
            rounds: if c.quick { 1 } else { a.rounds.rounds },
            tasks: a.tasks,
            max_tokens: if c.quick { 32 } else { 64 },
            trials: if c.quick { 1 } else { a.trials },
            context: c.context,
            batch: c.batch,
        };
        let stamp = Stamp::now();
        let result = dispatch::run(&revisd, &model, &settings).await?;
        Ok((result, settings, stamp, revisd))
    }

    fn report(&self, (result, settings, s, revisd): &Self::Results) -> anyhow::Result<Vec<Section>> {
        let about = dispatch::About { date: &s.date, command: &s.command, machine: &s.machine, revisd, model: &self.args.common.models[0] };
        Ok(vec![Section { text: dispatch::report(result, settings, &about), place: Place::Marked(Box::new(dispatch::splice)) }])
    }

    fn raw(&self, (result, ..): &Self::Results) -> anyhow::Result<Option<Raw>> {
        Raw::new("last-dispatch-run.json", &dispatch::raw_json(result), "raw samples").map(Some)
    }
}

/// `revis-bench faults`.
pub struct Faults {
    pub args: FaultsArgs,
    pub settings: faults::Settings,
}

impl Bench for Faults {
    type Results = faults::Outcome;
    const DOC: &'static str = "docs/RELIABILITY.md";

    async fn run(&self) -> anyhow::Result<faults::Outcome> {
        let c = &self.args.common;
        let revisd = revisd_path(c)?;
        let revis = revisd.with_file_name("revis");
        if !revis.is_file() {
            bail!("no revis at {}: build it first (cargo build --release -p revis-cli)", revis.display());
        }
        let name = &c.models[0];
        let model = model_file(name).await?;
        let s = Stamp::now();
        let about = faults::About {
            date: &s.date,
            command: &s.command,
            machine: &s.machine,
            revisd: &revisd,
            revis: &revis,
            model: name,
            model_bytes: std::fs::metadata(&model)?.len(),
        };
        faults::run(&revisd, &revis, &model, &self.settings, &about).await
    }

    fn report(&self, outcome: &faults::Outcome) -> anyhow::Result<Vec<Section>> {
        Ok(vec![Section { text: outcome.section.clone(), place: Place::Appended }])
    }

    fn raw(&self, _: &faults::Outcome) -> anyhow::Result<Option<Raw>> {
        Ok(None)
    }
}

/// `revis-bench lookup`.
pub struct Lookup {
    pub args: LookupArgs,
}

impl Bench for Lookup {
    type Results = (Vec<lookup::Cell>, lookup::Settings, Stamp, f64);
    const DOC: &'static str = "docs/BENCHMARKS.md";

    async fn run(&self) -> anyhow::Result<Self::Results> {
        let (c, a) = (&self.args.common, &self.args);
        let revisd = revisd_path(c)?;
        let models = model_files(c).await?;
        let settings = lookup::Settings {
            threads: c.threads.clone(),
            context: c.context,
            batch: c.batch,
            rounds: a.rounds.rounds,
            items: if c.quick { 2 } else { a.lookup_items },
            max_tokens: if c.quick { 48 } else { 128 },
        };
        let stamp = Stamp::now();
        let started = Instant::now();
        let cells = lookup::run(&revisd, &models, &settings).await?;
        Ok((cells, settings, stamp, started.elapsed().as_secs_f64() / 60.0))
    }

    fn report(&self, (cells, settings, s, minutes): &Self::Results) -> anyhow::Result<Vec<Section>> {
        let about = lookup::About { date: &s.date, command: &s.command, machine: &s.machine, minutes: *minutes };
        Ok(vec![Section {
            text: lookup::report(cells, settings, &about),
            place: marked(lookup::BEGIN, lookup::END, "## Speculation from the context (`revis-bench lookup`)"),
        }])
    }

    fn raw(&self, (cells, ..): &Self::Results) -> anyhow::Result<Option<Raw>> {
        Raw::new("last-lookup-run.json", cells, "raw samples").map(Some)
    }
}

/// `revis-bench batch`.
pub struct Batch {
    pub args: BatchArgs,
}

impl Bench for Batch {
    type Results = (Vec<batch::Cell>, batch::Settings, Stamp);
    const DOC: &'static str = "docs/BENCHMARKS.md";

    async fn run(&self) -> anyhow::Result<Self::Results> {
        let (c, a) = (&self.args.common, &self.args);
        let revisd = revisd_path(c)?;
        let root = workspace_root();
        let bin = llama_bench::default_path(&root);
        llama_bench::build(&root, &bin, a.rebuild_llama_bench)?;
        let batched = bin.with_file_name("llama-batched-bench");
        let models = model_files(c).await?;
        let settings =
            batch::Settings { threads: c.most_threads(), context: c.context, batch: c.batch, rounds: a.rounds.rounds, n_gen: a.gen_.n_gen };
        let stamp = Stamp::now();
        let cells = batch::run(&revisd, &batched, &models, &settings).await?;
        Ok((cells, settings, stamp))
    }

    fn report(&self, (cells, settings, s): &Self::Results) -> anyhow::Result<Vec<Section>> {
        let about = batch::About { date: &s.date, command: &s.command, machine: &s.machine };
        Ok(vec![Section { text: batch::report(cells, settings, &about), place: marked(batch::BEGIN, batch::END, batch::HEADING) }])
    }

    fn raw(&self, (cells, ..): &Self::Results) -> anyhow::Result<Option<Raw>> {
        Raw::new("last-batch-run.json", cells, "raw samples").map(Some)
    }
}

/// `revis-bench contention`.
pub struct Contention {
    pub args: ContentionArgs,
}

impl Bench for Contention {
    type Results = (Vec<contention::ModelRun>, contention::Settings, Stamp);
    const DOC: &'static str = "docs/BENCHMARKS.md";

    async fn run(&self) -> anyhow::Result<Self::Results> {
        let (c, a) = (&self.args.common, &self.args);
        let revisd = revisd_path(c)?;
        let root = workspace_root();
        let bin = llama_bench::default_path(&root);
        llama_bench::build(&root, &bin, a.rebuild_llama_bench)?;
        let mut models = Vec::new();
        for (name, path) in model_files(c).await? {
            // The cold prompt, sized in this model's tokens.
            let probe = alone::Alone::load(alone::spec(&path, 1, c.context, c.batch)).await?;
            let p = probe.prompts(a.n_prompt as usize, 64)?;
            probe.unload().await;
            models.push((name, path, p.long_user, p.prompt_tokens as u32));
        }
        let settings = contention::Settings {
            rounds: a.rounds.rounds,
            n_gen: a.gen_.n_gen,
            n_prompt: a.n_prompt,
            context: c.context,
            batch: c.batch,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        };
        let stamp = Stamp::now();
        let runs = contention::run(&revisd, &bin, &models, &settings).await?;
        Ok((runs, settings, stamp))
    }

    fn report(&self, (runs, settings, s): &Self::Results) -> anyhow::Result<Vec<Section>> {
        let about = contention::About { date: &s.date, command: &s.command, machine: &s.machine };
        Ok(vec![Section {
            text: contention::report(runs, settings, &about),
            place: marked(contention::BEGIN, contention::END, contention::HEADING),
        }])
    }

    fn raw(&self, (runs, ..): &Self::Results) -> anyhow::Result<Option<Raw>> {
        Raw::new("last-contention-run.json", runs, "raw samples").map(Some)
    }
}

/// `revis-bench split`.
pub struct Split {
    pub args: SplitArgs,
}

impl Bench for Split {
    type Results = (split::Results, split::Settings, Stamp);
    const DOC: &'static str = "docs/BENCHMARKS.md";

    async fn run(&self) -> anyhow::Result<Self::Results> {
        let (c, a) = (&self.args.common, &self.args);
        let revisd = revisd_path(c)?;
        let name = c.models.first().context("--models is empty")?.clone();
        let model = model_file(&name).await?;
        let settings = split::Settings {
            context: c.context.max(4096),
            batch: c.batch,
            rounds: a.rounds.rounds,
            sentences: if c.quick { 20 } else { 54 },
            n_gen: a.gen_.n_gen,
            local_share: a.split_local,
        };
        let stamp = Stamp::now();
        // On a thread of its own: it enters a network namespace for good.
        let results = std::thread::scope(|scope| scope.spawn(|| split::run(&revisd, &name, &model, &settings)).join())
            .map_err(|_| anyhow::anyhow!("the split benchmark panicked"))??;
        Ok((results, settings, stamp))
    }

    fn report(&self, (results, settings, s): &Self::Results) -> anyhow::Result<Vec<Section>> {
        let about = split::About { date: &s.date, command: &s.command, machine: &s.machine };
        Ok(vec![Section { text: split::report(results, settings, &about), place: marked(split::BEGIN, split::END, split::HEADING) }])
    }

    fn raw(&self, (results, ..): &Self::Results) -> anyhow::Result<Option<Raw>> {
        Raw::new("last-split-run.json", results, "raw samples").map(Some)
    }
}

/// `revis-bench quality`, for one model of --models (each is measured and saved in turn).
pub struct Quality<'a> {
    pub args: &'a QualityArgs,
    pub name: &'a str,
}

pub struct QualityResults {
    results: [quality::ModelResults; 1],
    about: String,
}

impl Bench for Quality<'_> {
    type Results = QualityResults;
    const DOC: &'static str = "docs/QUALITY.md";
    const NEW_DOC: &'static str = "# Quality";

    async fn run(&self) -> anyhow::Result<QualityResults> {
        let (c, name) = (&self.args.common, self.name);
        let revisd = revisd_path(c)?;
        let data = self.args.qual.quality_data.clone().unwrap_or_else(|| workspace_root().join("crates/revis-bench/data/quality"));
        let items = if c.quick && self.args.qual.quality_items == 0 { 12 } else { self.args.qual.quality_items };
        let threads = *c.threads.iter().max().unwrap_or(&2);
        let machine = Machine::detect();
        let (date, command) = (machine::utc_now(), args_line());
        let model = model_file(name).await?;
        eprintln!("revis-bench: quality of {name}");
        let started = Instant::now();
        let target = quality::Target { revisd: &revisd, model: &model, name, threads, context: c.context };
        let results = [quality::run_model(&target, &self.args.qual, items, &data).await?];
        let about = format!(
            "- {date}, `{command}`, {:.1} min for this model\n- {} ({} cores, {:.0} GiB), {}; {threads} threads, every tier on {name}",
            started.elapsed().as_secs_f64() / 60.0,
            machine.cpu,
            machine.cores,
            machine.memory_gib,
            machine.os
        );
        Ok(QualityResults { results, about })
    }

    fn report(&self, r: &QualityResults) -> anyhow::Result<Vec<Section>> {
        let parts = &self.args.qual.quality_parts;
        let mut sections = Vec::new();
        for time in [false, true] {
            if parts.iter().all(|p| (*p == quality::QPart::Time) != time) {
                continue;
            }
            let (begin, end) = quality::markers(self.name, if time { "time" } else { "quality" });
            let heading = if time { format!("## {}: time to the first token", self.name) } else { format!("## {}: latest run", self.name) };
            sections.push(Section { text: quality::report(&r.results, &r.about, time), place: marked(&begin, &end, &heading) });
        }
        Ok(sections)
    }

    fn raw(&self, r: &QualityResults) -> anyhow::Result<Option<Raw>> {
        Raw::new(format!("last-quality-run-{}.json", self.name), &r.results, "raw figures").map(Some)
    }
}

/// `revis-bench turn`, for one model of --models (each is measured and saved in turn).
pub struct Turn<'a> {
    pub args: &'a TurnArgs,
    pub name: &'a str,
}

pub struct TurnResults {
    results: turn::ModelTurns,
    about: String,
}

impl Bench for Turn<'_> {
    type Results = TurnResults;
    const DOC: &'static str = "docs/QUALITY.md";
    const NEW_DOC: &'static str = "# Quality";

    async fn run(&self) -> anyhow::Result<TurnResults> {
        let (c, name) = (&self.args.common, self.name);
        let revisd = revisd_path(c)?;
        let root = workspace_root();
        let data = self.args.turn.turn_data.clone().unwrap_or_else(|| root.join("crates/revis-bench/data/quality"));
        let eval = self.args.turn.eval.clone().unwrap_or_else(|| root.join("../shared/eval"));
        let threads = *c.threads.iter().max().unwrap_or(&2);
        let machine = Machine::detect();
        let (date, command) = (machine::utc_now(), args_line());
        let model = model_file(name).await?;
        eprintln!("revis-bench: turn of {name}");
        let target = turn::Target { revisd: &revisd, model: &model, name, threads, context: c.context };
        let results = turn::run_model(&target, &self.args.turn, c.quick, &data, &eval).await?;
        let about = format!(
            "- {date}, `{command}`, {:.1} min for this model\n- {} ({} cores, {:.0} GiB), {}; {threads} threads, every tier on {name}",
            results.minutes, machine.cpu, machine.cores, machine.memory_gib, machine.os
        );
        Ok(TurnResults { results, about })
    }

    fn report(&self, r: &TurnResults) -> anyhow::Result<Vec<Section>> {
        let (begin, end) = turn::markers(self.name);
        let heading = format!("## {}: the turn against the bare model", self.name);
        Ok(vec![Section { text: turn::report(&r.results, &r.about), place: marked(&begin, &end, &heading) }])
    }

    fn raw(&self, r: &TurnResults) -> anyhow::Result<Option<Raw>> {
        Raw::new(format!("last-turn-run-{}.json", self.name), &r.results, "raw figures").map(Some)
    }
}

/// `revis-bench render`.
pub struct Estimate {
    pub args: crate::cli::EstimateArgs,
}

impl Bench for Estimate {
    type Results = (crate::estimate::Results, Stamp);
    const DOC: &'static str = "docs/BENCHMARKS.md";

    async fn run(&self) -> anyhow::Result<Self::Results> {
        let c = &self.args.common;
        let models = model_files(c).await?;
        let stamp = Stamp::now();
        let results = crate::estimate::run(&models, c.most_threads(), c.context, c.batch, self.args.estimate.estimate_rounds).await?;
        Ok((results, stamp))
    }

    fn report(&self, (r, s): &Self::Results) -> anyhow::Result<Vec<Section>> {
        let m = &s.machine;
        let about = format!("- {}, `{}`\n- {} ({} cores, {:.0} GiB), {}", s.date, s.command, m.cpu, m.cores, m.memory_gib, m.os);
        Ok(vec![Section {
            text: format!("{}\n{}\n{}\n", crate::estimate::BEGIN, crate::estimate::report(r, &about).trim_end(), crate::estimate::END),
            place: marked(crate::estimate::BEGIN, crate::estimate::END, "## The default model's speed estimate (`revis-bench estimate`)"),
        }])
    }

    fn raw(&self, (r, _): &Self::Results) -> anyhow::Result<Option<Raw>> {
        Raw::new("last-estimate-run.json", r, "raw samples").map(Some)
    }
}

pub struct Render {
    pub args: crate::cli::RenderArgs,
}

impl Bench for Render {
    type Results = (render::Results, Stamp);
    const DOC: &'static str = "docs/BENCHMARKS.md";

    async fn run(&self) -> anyhow::Result<Self::Results> {
        let c = &self.args.common;
        let revisd = revisd_path(c)?;
        let models = model_files(c).await?;
        let stamp = Stamp::now();
        let results = render::run(&revisd, &models, c.most_threads(), c.context, c.batch, self.args.render.render_rounds).await?;
        Ok((results, stamp))
    }

    fn report(&self, (r, s): &Self::Results) -> anyhow::Result<Vec<Section>> {
        let m = &s.machine;
        let about = format!("- {}, `{}`\n- {} ({} cores, {:.0} GiB), {}", s.date, s.command, m.cpu, m.cores, m.memory_gib, m.os);
        Ok(vec![Section {
            text: format!("{}\n{}\n{}\n", render::BEGIN, render::report(r, &about).trim_end(), render::END),
            place: marked(render::BEGIN, render::END, "## Chat templates in a process of their own (`revis-bench render`)"),
        }])
    }

    fn raw(&self, (r, _): &Self::Results) -> anyhow::Result<Option<Raw>> {
        Raw::new("last-render-run.json", r, "raw samples").map(Some)
    }
}
