//! `revis-bench lookup`: speculation from the context (prompt lookup decoding,
//! `daemon.speculate`) against plain decoding, through the whole stack.
//!
//! Two revisd with the same model and threads, one with `speculate = true`
//! and one with `false`, run the same calls in turn (which goes first
//! alternates by task). The calls are the orchestrator's own tasks on given
//! text, run by the orchestrator's code through a recording [`Runner`]:
//! extracting facts (reasoning, then JSON) from hand-written messages,
//! summarising conversations made of PIQA questions and answers (public data
//! written by others), and tier1's quick check of messages with typos; and
//! open chat: capitals and PIQA questions answered in free text, greedy and
//! with revis's default sampling. Speed is decode tokens ÷ Done.generate_us
//! summed over a group's calls. Greedy calls must give the same text on both.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use revis_client::{Done, GenerateParams, Message, PrefillParams, Prefilled, Runner, Sampling, Tier};
use revis_orchestrator::{check, conversation, structured};
use serde::Deserialize;

use crate::daemon::{Daemon, Extra, Launch};
use crate::machine::Machine;

pub struct Settings {
    pub threads: Vec<u32>,
    pub context: u32,
    pub batch: u32,
    pub rounds: u32,
    /// Items of each task.
    pub items: usize,
    pub max_tokens: u32,
}

/// What one call gave.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Call {
    pub generated: u32,
    pub generate_us: u64,
    pub drafted: u32,
    pub accepted: u32,
    pub greedy: bool,
    pub text: String,
}

/// A [`Runner`] over one daemon's client that keeps each call's Done.
#[derive(Clone)]
struct Recorder {
    client: revis_client::Client,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Runner for Recorder {
    async fn prefill(&self, req: PrefillParams) -> Result<Prefilled, revis_client::CallError> {
        Runner::prefill(&self.client, req).await
    }

    async fn generate(&self, req: GenerateParams, on_delta: impl FnMut(&str) + Send) -> Result<Done, revis_client::CallError> {
        let greedy = req.sampling.temperature == Some(0.0);
        let done = Runner::generate(&self.client, req, on_delta).await?;
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push(Call {
            generated: done.generated_tokens,
            generate_us: done.generate_us,
            drafted: done.draft_tokens,
            accepted: done.draft_accepted,
            greedy,
            text: done.text.clone(),
        });
        Ok(done)
    }

    async fn embed(&self, req: revis_client::EmbedParams) -> Result<revis_client::Embedded, revis_client::CallError> {
        Runner::embed(&self.client, req).await
    }

    async fn tiers(&self) -> Result<Vec<revis_client::TierStatus>, revis_client::CallError> {
        Runner::tiers(&self.client).await
    }
}

impl Recorder {
    fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[derive(Deserialize)]
struct Piqa {
    goal: String,
    sol1: String,
}

#[derive(Deserialize)]
struct Capital {
    question: String,
}

#[derive(Deserialize)]
struct Said {
    text: String,
}

fn jsonl<T: for<'de> Deserialize<'de>>(path: &Path, n: usize) -> anyhow::Result<Vec<T>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines().filter(|l| !l.trim().is_empty()).take(n).map(|l| Ok(serde_json::from_str(l)?)).collect()
}

/// The task groups, in report order.
pub const GROUPS: [(&str, &str); 5] = [
    ("facts", "copy-heavy: the orchestrator's fact extraction (reasoning at temperature 0.2, then JSON, greedy)"),
    ("summary", "copy-heavy: the orchestrator's summary of a conversation (reasoning, then JSON)"),
    ("check", "copy-heavy: tier1's quick check of a message with typos (JSON, greedy)"),
    ("chat", "open chat, greedy"),
    ("chat-sampled", "open chat, revis's default sampling (temperature 0.7, top-k 40, top-p 0.95, min-p 0.05)"),
];

struct Inputs {
    said: Vec<String>,
    conversations: Vec<String>,
    typos: Vec<String>,
    questions: Vec<String>,
}

fn inputs(items: usize) -> anyhow::Result<Inputs> {
    let root = crate::harness::workspace_root();
    let data = root.join("crates/revis-bench/data/quality");
    let eval = root.join("../shared/eval");
    let said = jsonl::<Said>(&data.join("facts.jsonl"), items)?.into_iter().map(|s| s.text).collect();
    let typos = jsonl::<Said>(&data.join("typos.jsonl"), items)?.into_iter().map(|s| s.text).collect();
    let piqa = jsonl::<Piqa>(&eval.join("piqa-dev/valid.jsonl"), items * 4)?;
    let conversations = piqa
        .chunks(3)
        .take(items)
        .map(|c| c.iter().map(|p| format!("User: {}\nAssistant: {}\n", p.goal, p.sol1)).collect::<String>())
        .collect();
    let capitals = jsonl::<Capital>(&eval.join("capitals-dev.jsonl"), items)?;
    let questions = capitals
        .into_iter()
        .map(|c| format!("{} Tell me a little about it.", c.question))
        .zip(piqa.iter().skip(items * 3).map(|p| p.goal.clone()))
        .flat_map(|(a, b)| [a, b])
        .take(items)
        .collect();
    Ok(Inputs { said, conversations, typos, questions })
}

/// Runs one group's calls on `r`; the calls made go to the recorder.
async fn run_group(r: &Recorder, group: &str, inputs: &Inputs, max_tokens: u32) -> anyhow::Result<()> {
    let tier = Tier::Tier2;
    match group {
        "facts" => {
            for said in &inputs.said {
                // A malformed answer is part of what is measured, not a failure of the run.
                let _ = conversation::extract_facts(r, tier, said).await;
            }
        }
        "summary" => {
            for text in &inputs.conversations {
                let (task, schema) = conversation::summary_task(text);
                let _ = structured::run(r, tier, &task, &schema).await;
            }
        }
        "check" => {
            for text in &inputs.typos {
                let _ = check::run(r, Tier::Tier1, text).await;
            }
        }
        "chat" | "chat-sampled" => {
            for q in &inputs.questions {
                let sampling = if group == "chat" {
                    Sampling { temperature: Some(0.0), ..Default::default() }
                } else {
                    Sampling { seed: Some(7), ..Default::default() }
                };
                let req = GenerateParams {
                    tier,
                    messages: vec![Message::user(q.clone())],
                    max_tokens: Some(max_tokens),
                    sampling,
                    ..Default::default()
                };
                Runner::generate(r, req, |_| {}).await.map_err(|e| anyhow::anyhow!("{}", e.message))?;
            }
        }
        _ => unreachable!("no group {group}"),
    }
    Ok(())
}

/// One model at one thread count: every group, both daemons.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Cell {
    pub model: String,
    pub threads: u32,
    /// group → (plain calls, lookup calls), over every round.
    pub groups: Vec<(String, Vec<Call>, Vec<Call>)>,
}

pub async fn run(revisd: &Path, models: &[(String, PathBuf)], s: &Settings) -> anyhow::Result<Vec<Cell>> {
    let inputs = inputs(s.items)?;
    let mut cells = Vec::new();
    for (name, path) in models {
        for &threads in &s.threads {
            eprintln!("revis-bench: lookup, {name}, {threads} thread(s)");
            let launch =
                |speculate| Launch { threads, context: s.context, batch: s.batch, listen: None, wrap: &[], speculate, extra: Extra::NONE };
            let groups = Daemon::around(revisd, path, launch("off"), async |plain| {
                Daemon::around(revisd, path, launch("auto"), async |lookup| {
                    let rec = |d: &Daemon| Recorder { client: d.client.clone(), calls: Arc::default() };
                    let (plain_rec, lookup_rec) = (rec(&*plain), rec(&*lookup));
                    // A warm-up each (the lookup daemon probes its batches on its first draft).
                    for r in [&plain_rec, &lookup_rec] {
                        run_group(r, "chat", &Inputs { questions: inputs.questions[..1].to_vec(), ..inputs_empty() }, 16).await?;
                        r.take();
                    }
                    let mut groups: Vec<(String, Vec<Call>, Vec<Call>)> =
                        GROUPS.iter().map(|(g, _)| (g.to_string(), vec![], vec![])).collect();
                    for round in 0..s.rounds {
                        for (i, (group, plain_calls, lookup_calls)) in groups.iter_mut().enumerate() {
                            let order =
                                if (round as usize + i).is_multiple_of(2) { [&plain_rec, &lookup_rec] } else { [&lookup_rec, &plain_rec] };
                            for r in order {
                                run_group(r, group, &inputs, s.max_tokens).await?;
                            }
                            plain_calls.extend(plain_rec.take());
                            lookup_calls.extend(lookup_rec.take());
                        }
                    }
                    Ok(groups)
                })
                .await
            })
            .await?;
            cells.push(Cell { model: name.clone(), threads, groups });
        }
    }
    Ok(cells)
}

fn inputs_empty() -> Inputs {
    Inputs { said: vec![], conversations: vec![], typos: vec![], questions: vec![] }
}

fn rate(calls: &[Call]) -> f64 {
    let tokens: u64 = calls.iter().map(|c| u64::from(c.generated)).sum();
    let us: u64 = calls.iter().map(|c| c.generate_us).sum();
    if us == 0 { 0.0 } else { tokens as f64 * 1e6 / us as f64 }
}

/// Targets: copy-heavy ≥ 1.5 × plain decoding, open chat ≥ 0.98 ×.
fn target(group: &str) -> f64 {
    if group.starts_with("chat") { 0.98 } else { 1.5 }
}

pub struct About<'a> {
    pub date: &'a str,
    pub command: &'a str,
    pub machine: &'a Machine,
    pub minutes: f64,
}

pub const BEGIN: &str = "<!-- revis-bench:lookup:begin";
pub const END: &str = "<!-- revis-bench:lookup:end -->";

pub fn report(cells: &[Cell], s: &Settings, a: &About<'_>) -> String {
    let mut out = String::new();
    out.push_str(&format!("{BEGIN} (generated by `revis-bench lookup --write`; edits inside are overwritten) -->\n"));
    out.push_str("### Latest speculation run\n\n");
    out.push_str(&format!("- Date: {}; {} round(s) in {:.1} min.\n", a.date, s.rounds, a.minutes));
    let m = a.machine;
    out.push_str(&format!("- Machine: {} ({} cores visible, {:.1} GiB memory), {}.\n", m.cpu, m.cores, m.memory_gib, m.os));
    out.push_str(&format!("- Command: `{}`\n", a.command));
    out.push_str(&format!(
        "- Setup: two revisd per row (daemon.speculate \"auto\" and \"off\"), context {}, batch {}, {} item(s) a task, chat answers up to {} tokens; calls alternate between them.\n",
        s.context, s.batch, s.items, s.max_tokens
    ));
    for (g, what) in GROUPS {
        out.push_str(&format!("- `{g}`: {what}.\n"));
    }
    out.push_str("\nt/s = generated tokens ÷ Done.generate_us over the group's calls. Drafted = draft tokens verified per generated token; kept = share of them the model accepted. Same text = greedy calls whose text is identical on both daemons (sampled calls are compared by speed only).\n\n");
    out.push_str("| model | threads | task | calls | plain t/s | lookup t/s | ratio | target | result | drafted | kept | same text |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for c in cells {
        for (group, plain, lookup) in &c.groups {
            let (p, l) = (rate(plain), rate(lookup));
            let ratio = if p > 0.0 { l / p } else { 0.0 };
            let t = target(group);
            let generated: u64 = lookup.iter().map(|c| u64::from(c.generated)).sum();
            let drafted: u64 = lookup.iter().map(|c| u64::from(c.drafted)).sum();
            let accepted: u64 = lookup.iter().map(|c| u64::from(c.accepted)).sum();
            // Only where the calls pair up one to one with the same input
            // (the structured tasks' JSON follows a sampled reasoning).
            let compared = group == "chat" || group == "check";
            let greedy_pairs: Vec<_> = plain.iter().zip(lookup).filter(|(a, b)| compared && a.greedy && b.greedy).collect();
            let same = greedy_pairs.iter().filter(|(a, b)| a.text == b.text).count();
            let same = if greedy_pairs.is_empty() { "—".to_owned() } else { format!("{same}/{}", greedy_pairs.len()) };
            out.push_str(&format!(
                "| {} | {} | {} | {} | {:.1} | {:.1} | {:.3} | ≥ {} | {} | {:.2} | {:.0}% | {} |\n",
                c.model,
                c.threads,
                group,
                lookup.len(),
                p,
                l,
                ratio,
                t,
                if ratio >= t { "PASS" } else { "**MISS**" },
                drafted as f64 / generated.max(1) as f64,
                100.0 * accepted as f64 / drafted.max(1) as f64,
                same
            ));
        }
    }
    out.push_str(END);
    out.push('\n');
    out
}
