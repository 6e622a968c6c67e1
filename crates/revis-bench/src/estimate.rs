//! `revis-bench estimate`: the default-model choice's speed estimates
//! (revis_models::choose, as `revis models` shows them) against the speeds
//! the models really decode at, quiet and beside one spinning process.
//!
//! Each round, interleaved: the machine's probes (revis_models::Machine::measure)
//! and, from them, three estimates per model: bandwidth alone (before
//! issue 46), the probes alone (no model downloaded: a first run), and the
//! probes with the real decode of the smallest model (`revisd
//! measure-speed`, what `revis models` runs); then what each model decodes:
//! `revisd measure-speed` (64 tokens, revisd's default thread choice) and
//! the engine alone (128 tokens, as `revis-bench speed`'s "engine alone
//! tg", but with revisd's default thread choice, `threads = "auto"`, up to
//! --threads, so that beside a busy process it decodes as revisd would).

use std::path::PathBuf;

use revis_models::{CatalogEntry, Machine};
use serde::Serialize;

use crate::alone::{self, Alone};
use crate::contention::Spinners;
use crate::stats::Summary;

pub const BEGIN: &str = "<!-- revis-bench estimate: begin -->";
pub const END: &str = "<!-- revis-bench estimate: end -->";

#[derive(clap::Args, Debug, Clone)]
pub struct EstimateArgs {
    /// Rounds per load.
    #[arg(long, default_value_t = 5)]
    pub estimate_rounds: usize,
}

/// One model under one load, over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub model: String,
    pub busy: bool,
    pub bandwidth_only: Vec<f64>,
    pub probes: Vec<f64>,
    pub calibrated: Vec<f64>,
    pub measure_speed: Vec<f64>,
    pub engine_alone: Vec<f64>,
}

/// The probes under one load, over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct Probes {
    pub busy: bool,
    pub bandwidth: Vec<f64>,
    pub arithmetic: Vec<f64>,
    pub others_cores: Vec<f64>,
    pub said_busy: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct Results {
    pub rounds: usize,
    pub threads: u32,
    pub probes: Vec<Probes>,
    pub cells: Vec<Cell>,
}

/// The estimate before issue 46: half the bandwidth ÷ the file size.
fn bandwidth_only(entry: &CatalogEntry, m: &Machine) -> f64 {
    revis_models::choose::DECODE_EFFICIENCY * m.bandwidth.median / entry.size as f64
}

pub async fn run(models: &[(String, PathBuf)], threads: u32, context: u32, batch: u32, rounds: usize) -> anyhow::Result<Results> {
    let entries: Vec<(&'static CatalogEntry, PathBuf)> = models
        .iter()
        .map(|(name, path)| Ok((revis_models::find(name).ok_or_else(|| anyhow::anyhow!("{name} is not a catalog model"))?, path.clone())))
        .collect::<anyhow::Result<_>>()?;
    let dir = entries.first().and_then(|(_, p)| p.parent()).ok_or_else(|| anyhow::anyhow!("no models"))?.to_owned();
    let smallest = entries.iter().map(|(e, _)| *e).min_by_key(|e| e.size).expect("models");
    let (mut all_probes, mut cells) = (Vec::new(), Vec::new());
    for busy in [false, true] {
        let _spinning = if busy { Some(Spinners::start(1)?) } else { None };
        let mut probes = Probes { busy, bandwidth: vec![], arithmetic: vec![], others_cores: vec![], said_busy: 0 };
        let mut row: Vec<Cell> = entries
            .iter()
            .map(|(e, _)| Cell {
                model: e.name.to_owned(),
                busy,
                bandwidth_only: vec![],
                probes: vec![],
                calibrated: vec![],
                measure_speed: vec![],
                engine_alone: vec![],
            })
            .collect();
        for round in 0..rounds {
            let machine = tokio::task::spawn_blocking(Machine::measure).await?;
            probes.bandwidth.push(machine.bandwidth.median);
            probes.arithmetic.push(machine.arithmetic.median);
            probes.others_cores.push(machine.load.map_or(f64::NAN, |l| l.others_cores));
            probes.said_busy += usize::from(machine.busy());
            let decode = revis_client::speed::real_decode(smallest, &dir).await.map_err(anyhow::Error::msg)?;
            let calibrated = machine.clone().with_decode(decode);
            for ((entry, path), cell) in entries.iter().zip(row.iter_mut()) {
                cell.bandwidth_only.push(bandwidth_only(entry, &machine));
                cell.probes.push(revis_models::estimate(entry, &machine).tokens_per_s);
                cell.calibrated.push(revis_models::estimate(entry, &calibrated).tokens_per_s);
                cell.measure_speed.push(revis_client::speed::real_decode(entry, &dir).await.map_err(anyhow::Error::msg)?.tokens_per_s);
                let mut spec = alone::spec(path, threads, context, batch);
                spec.threads = revis_engine::Threads::Auto { most: threads };
                let engine = Alone::load(spec).await?;
                let g = engine.decode_run(128).await?;
                engine.unload().await;
                cell.engine_alone.push(1e6 / g.wall_us_per_token());
            }
            eprintln!("revis-bench: estimate round {} of {rounds}{}", round + 1, if busy { " (busy)" } else { "" });
        }
        all_probes.push(probes);
        cells.extend(row);
    }
    Ok(Results { rounds, threads, probes: all_probes, cells })
}

fn median_range(v: &[f64], scale: f64, digits: usize) -> String {
    match Summary::of(v) {
        Some(s) => format!("{:.*} ({:.*}–{:.*})", digits, s.median / scale, digits, s.min / scale, digits, s.max / scale),
        None => "–".into(),
    }
}

fn median(v: &[f64]) -> f64 {
    Summary::of(v).map_or(f64::NAN, |s| s.median)
}

pub fn report(r: &Results, about: &str) -> String {
    let mut o = String::new();
    o.push_str(&format!(
        "{about}\n\nMedian (min–max) over {} rounds per load; \"busy\" beside one process spinning on a core. Each round \
         measures the machine as `revis models` does, then what each model decodes.\n\n",
        r.rounds
    ));
    o.push_str("| Load | Read bandwidth GB/s | Multiply-adds G/s | Others' use, cores | Rounds said busy |\n|---|---|---|---|---|\n");
    for p in &r.probes {
        o.push_str(&format!(
            "| {} | {} | {} | {} | {} of {} |\n",
            if p.busy { "busy" } else { "quiet" },
            median_range(&p.bandwidth, 1e9, 1),
            median_range(&p.arithmetic, 1e9, 2),
            median_range(&p.others_cores, 1.0, 2),
            p.said_busy,
            p.bandwidth.len()
        ));
    }
    o.push_str(&format!(
        "\nTokens per second. Estimates: *bandwidth only* = 50% of the read bandwidth ÷ file size (before issue 46); \
         *probes* = the slower of reading and computing, arithmetic from the probe (a first run, nothing downloaded); \
         *with a real decode* = computing at what the smallest model reached in `revisd measure-speed` (what `revis models` \
         shows once a model is downloaded). Measured: *measure-speed* = `revisd measure-speed` (64 tokens, revisd's own \
         thread choice); *engine alone* = 128 greedy tokens, revisd's thread choice up to {} threads (as `revis-bench speed`'s \
         engine-alone tg, which fixes the count). Ratio = estimate ÷ engine alone; the target is within ±30% quiet; \
         busy, the estimates are for the moment of measuring, and its load moves.\n\n",
        r.threads
    ));
    o.push_str(
        "| Model | Load | Bandwidth only | Probes | With a real decode | measure-speed | Engine alone | Ratio: bandwidth only / probes / real decode | ±30% (probes, real decode) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for c in &r.cells {
        let truth = median(&c.engine_alone);
        let ratio = |v: &[f64]| median(v) / truth;
        let within = |v: &[f64]| if (0.7..=1.3).contains(&ratio(v)) { "yes" } else { "**no**" };
        o.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} / {:.2} / {:.2} | {} |\n",
            c.model,
            if c.busy { "busy" } else { "quiet" },
            median_range(&c.bandwidth_only, 1.0, 0),
            median_range(&c.probes, 1.0, 0),
            median_range(&c.calibrated, 1.0, 0),
            median_range(&c.measure_speed, 1.0, 0),
            median_range(&c.engine_alone, 1.0, 0),
            ratio(&c.bandwidth_only),
            ratio(&c.probes),
            ratio(&c.calibrated),
            if c.busy {
                format!("({}, {})", within(&c.probes), within(&c.calibrated))
            } else {
                format!("{}, {}", within(&c.probes), within(&c.calibrated))
            },
        ));
    }
    o
}
