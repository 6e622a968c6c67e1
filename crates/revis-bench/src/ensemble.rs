//! `revis-bench ensemble`: what two different models answering together
//! are worth, measured on public data (docs/ENSEMBLE.md).
//!
//! One revisd serves both models, each on a tier of its own (the first of
//! `--models` on tier1, the second on tier2). Three parts, each on the
//! first N items of its set (`--ensemble-items`, `--capitals-items`,
//! `--bits-items`):
//! - `piqa`: zero-shot two-choice scoring in lm-evaluation-harness's format
//!   (`Question: {goal}\nAnswer:` then ` {sol}`, no chat template), each
//!   model alone (acc and per byte) and the score-level combinations of
//!   [`choice`], reported on items before `--piqa-split` and from it apart,
//!   so a rule can be seen on items it was not chosen on.
//! - `capitals`: greedy answers to "What is the capital of X?" as a chat
//!   message, exact match, each model alone; with it, the cost of each
//!   (tokens per second, round trips per 100 bytes).
//! - `bits`: bits per byte of the PIQA goals with their right solutions as
//!   plain text, each model alone and the word-level mixtures of [`bpb`].
//!
//! Data default to `../shared/eval/` beside the workspace; the files are
//! options, so the same command runs on other splits of the same formats.

mod answer;
mod args;
mod bpb;
mod choice;
pub(crate) mod data;
mod report;
mod results;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use revis_client::{Client, ScoreParams, Scored, Tier, TokenLogprob};

pub use self::args::EnsembleArgs;
use self::args::Part;
use self::results::{Member, Results, progress};
use crate::daemon::{Daemon, Extra, Launch};
use crate::harness::{Bench, Place, Raw, Section, args_line, model_file, revisd_path, workspace_root};

/// `--quick`: the first 100 PIQA items (split at 50), 20 questions, 50 texts.
const QUICK: (usize, usize, usize, usize) = (100, 50, 20, 50);

/// The data directory beside the workspace.
fn eval_dir() -> PathBuf {
    workspace_root().join("../shared/eval")
}

/// What the parts run on, with the limits applied.
struct Sets {
    piqa: Vec<data::Piqa>,
    /// PIQA items scored (the first ones) and texts for bits per byte (the first ones).
    scored: usize,
    bits: usize,
    split: usize,
    capitals: Vec<data::Capital>,
}

fn load_sets(a: &EnsembleArgs, quick: bool) -> anyhow::Result<Sets> {
    let (mut piqa_n, mut split, mut cap_n, mut bits_n) = (a.ensemble_items, a.piqa_split, a.capitals_items, a.bits_items);
    if quick {
        let pick = |given: usize, q: usize| if given == 0 { q } else { given.min(q) };
        (piqa_n, split, cap_n, bits_n) = (pick(piqa_n, QUICK.0), split.min(QUICK.1), pick(cap_n, QUICK.2), pick(bits_n, QUICK.3));
    }
    let parts = &a.ensemble_parts;
    let needs_piqa = parts.contains(&Part::Piqa) || parts.contains(&Part::Bits);
    let piqa = if needs_piqa {
        let items = a.piqa.clone().unwrap_or_else(|| eval_dir().join("piqa-dev/valid.jsonl"));
        let labels = match &a.piqa_labels {
            Some(l) => l.clone(),
            None => items.with_file_name("valid-labels.lst"),
        };
        data::load_piqa(&items, &labels)?
    } else {
        Vec::new()
    };
    let capitals = if parts.contains(&Part::Capitals) || parts.contains(&Part::TwoMachines) {
        data::load_capitals(&a.capitals.clone().unwrap_or_else(|| eval_dir().join("capitals-dev.jsonl")))?
    } else {
        Vec::new()
    };
    let first = |on: bool, n: usize, len: usize| {
        if !on {
            0
        } else if n == 0 {
            len
        } else {
            n.min(len)
        }
    };
    let scored = first(parts.contains(&Part::Piqa), piqa_n, piqa.len());
    let bits = first(parts.contains(&Part::Bits), bits_n, piqa.len());
    let mut capitals = capitals;
    capitals.truncate(first(true, cap_n, capitals.len()));
    if split == 0 {
        bail!("--piqa-split must be at least 1");
    }
    Ok(Sets { piqa, scored, bits, split, capitals })
}

/// `revis-bench ensemble`.
pub struct Ensemble {
    pub args: EnsembleArgs,
}

/// What a run measured, and what its report says about the run.
pub struct Ran {
    results: Results,
    revisd: PathBuf,
    date: String,
    machine: crate::machine::Machine,
    elapsed: Duration,
}

impl Bench for Ensemble {
    type Results = Ran;
    const DOC: &'static str = "docs/ENSEMBLE.md";

    async fn run(&self) -> anyhow::Result<Ran> {
        let (c, a) = (&self.args.common, &self.args);
        if c.models.len() != 2 {
            bail!("revis-bench ensemble measures two models (--models A,B), not {}", c.models.len());
        }
        let sets = load_sets(a, c.quick)?;
        let revisd = revisd_path(c)?;
        let mut files = Vec::new();
        for name in &c.models {
            files.push(model_file(name).await?);
        }
        let members: Vec<Member> =
            c.models.iter().zip([Tier::Tier1, Tier::Tier2]).map(|(name, tier)| Member { name: name.clone(), tier }).collect();
        let threads = c.most_threads();
        let machine = crate::machine::Machine::detect();
        let date = crate::machine::utc_now();
        let started = Instant::now();

        let dir = tempfile::Builder::new().prefix("revis-bench-ensemble-").tempdir()?;
        let config = write_config(dir.path(), &files, threads, c.context, c.batch)?;
        // daemon.rs writes a one-model config; `env` in front (it execs revisd,
        // so the PID stays revisd's) puts this two-model one in its place.
        let wrap = ["env".to_owned(), format!("REVIS_CONFIG={}", config.display())];
        let launch =
            Launch { threads, context: c.context, batch: c.batch, listen: None, wrap: &wrap, speculate: "off", extra: Extra::NONE };
        let mut r = Results { members: members.clone(), piqa_split: sets.split, capitals_total: sets.capitals.len(), ..Default::default() };
        Daemon::around(&revisd, &files[0], launch, async |daemon| run_parts(&daemon.client, &members, &sets, a, &mut r).await).await?;
        if a.ensemble_parts.contains(&Part::TwoMachines) {
            let setup = answer::TwoMachines {
                revisd: &revisd,
                models: [files[0].clone(), files[1].clone()],
                context: c.context,
                batch: c.batch,
                span: a.span,
                max_tokens: a.capitals_max_tokens,
            };
            // A thread of its own: it enters a network namespace.
            r.two_machines = std::thread::scope(|s| s.spawn(|| answer::two_machines(&members, &sets.capitals, &setup)).join())
                .map_err(|_| anyhow::anyhow!("the two-machine part panicked"))??;
        }
        Ok(Ran { results: r, revisd, date, machine, elapsed: started.elapsed() })
    }

    fn report(&self, ran: &Ran) -> anyhow::Result<Vec<Section>> {
        let (c, a) = (&self.args.common, &self.args);
        let about = report::About {
            date: &ran.date,
            command: &args_line(),
            machine: &ran.machine,
            revisd: &ran.revisd,
            threads: c.most_threads(),
            context: c.context,
            elapsed: ran.elapsed,
            capitals_max_tokens: a.capitals_max_tokens,
        };
        Ok(report::sections(&ran.results, &about)
            .into_iter()
            .map(|(part, text)| Section { text, place: Place::Marked(Box::new(move |old, section| report::splice(old, part, section))) })
            .collect())
    }

    fn raw(&self, ran: &Ran) -> anyhow::Result<Option<Raw>> {
        Raw::new("last-ensemble-run.json", &report::raw_json(&ran.results), "per-item scores").map(Some)
    }
}

async fn run_parts(client: &Client, members: &[Member], sets: &Sets, a: &EnsembleArgs, r: &mut Results) -> anyhow::Result<()> {
    if sets.scored > 0 {
        let t0 = Instant::now();
        for (i, item) in sets.piqa[..sets.scored].iter().enumerate() {
            let mut models = Vec::with_capacity(members.len());
            let conts = vec![item.continuation(0), item.continuation(1)];
            for (k, m) in members.iter().enumerate() {
                // One call: the prefix is evaluated once for both solutions.
                let sent = Instant::now();
                let s =
                    score(client, m.tier, &item.prefix(), conts.clone(), 0).await.with_context(|| format!("PIQA item {i}, {}", m.name))?;
                r.piqa_member_wall[k] += sent.elapsed();
                models.push(choice::Scores { logprob: [s[0].logprob, s[1].logprob], bytes: [s[0].byte_length, s[1].byte_length] });
            }
            r.piqa.push(choice::Item { label: item.label, models });
            progress("PIQA", i + 1, sets.scored, t0);
        }
        r.piqa_wall = t0.elapsed();
    }
    if a.ensemble_parts.contains(&Part::Capitals) {
        r.capitals = answer::one_machine(client, members, a.span, &sets.capitals, a.capitals_max_tokens).await;
    }
    if sets.bits > 0 {
        let t0 = Instant::now();
        for (i, item) in sets.piqa[..sets.bits].iter().enumerate() {
            let text = item.text();
            let Some((prefix, continuation)) = bpb::split_first_word(&text) else {
                r.bits_skipped.push(format!("item {i}: one word only"));
                continue;
            };
            let mut tokens = Vec::with_capacity(members.len());
            for m in members {
                // The top token at each position tells where `merge` would mix.
                let mut s = score(client, m.tier, prefix, vec![continuation.to_owned()], 1)
                    .await
                    .with_context(|| format!("bits, item {i}, {}", m.name))?;
                tokens.push(s.pop().map(|s| s.tokens).unwrap_or_default());
            }
            let views: Vec<&[TokenLogprob]> = tokens.iter().map(Vec::as_slice).collect();
            match bpb::text_bits(continuation, &views, bpb::merge_gate()) {
                Ok(b) => r.bits.push(b),
                Err(e) => r.bits_skipped.push(format!("item {i}: {e}")),
            }
            progress("bits per byte", i + 1, sets.bits, t0);
        }
        r.bits_wall = t0.elapsed();
    }
    Ok(())
}

/// One plain-text Score (no chat template: no messages) of `continuations`
/// after `prefix`, with `top` alternatives at each position.
async fn score(client: &Client, tier: Tier, prefix: &str, continuations: Vec<String>, top: u32) -> anyhow::Result<Vec<Scored>> {
    let n = continuations.len();
    let p = ScoreParams { tier, prefix: prefix.to_owned(), continuations, top_logprobs: top, ..Default::default() };
    let got = client.score(&p).await.map_err(|e| anyhow::anyhow!("Score: {e}"))?;
    if got.len() != n {
        bail!("Score answered {} results for {n} continuations", got.len());
    }
    Ok(got)
}

/// The two-model config: `models[0]` on tier1 (and tier3, unused), `models[1]` on tier2.
fn write_config(dir: &Path, models: &[PathBuf], threads: u32, context: u32, batch: u32) -> anyhow::Result<PathBuf> {
    let path = dir.join("revisd.toml");
    let quoted = |p: &Path| -> anyhow::Result<String> { Ok(serde_json::to_string(p.to_str().context("path is not UTF-8")?)?) };
    let state = dir.join("state");
    let (a, b) = (quoted(&models[0])?, quoted(&models[1])?);
    std::fs::write(
        &path,
        format!(
            "# Written by revis-bench ensemble.\n[daemon]\nthreads = {threads}\ncontext = {context}\nbatch = {batch}\nkeep_alive_s = 0\nload_at_start = true\n\
             [tiers.tier1]\nmodel = {a}\n[tiers.tier2]\nmodel = {b}\n[tiers.tier3]\nmodel = {a}\n[server]\nenabled = false\nstate_dir = {}\n",
            quoted(&state)?
        ),
    )?;
    Ok(path)
}
