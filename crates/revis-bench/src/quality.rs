//! `revis-bench quality`: what the three gears of a turn change
//! (docs/QUALITY.md), on small labelled sets written for it by hand
//! (`crates/revis-bench/data/quality/`, see docs/QUALITY.md for how).
//!
//! Each model of `--models` serves every tier of one revisd; each figure
//! is given with and without its step, through the same library code a
//! chat turn runs:
//! - `language`: greedy answers to messages in six languages, with the
//!   checklist (its LANGUAGE line filled in when whatlang is sure of the
//!   message) and without; the answer's language is told by whatlang.
//! - `escalation`: tier1's `escalate` and the checklist's ESCALATE line
//!   against labels, and either of them (what starts tier3).
//! - `typos`: tier1's corrections with revis's guard and as the model
//!   proposed them; messages fixed, false corrections of correct messages.
//! - `facts`: the profile extraction on introductions, with and without
//!   the grounding guard; a labelled fact is found when an extracted one
//!   contains all its key words.
//! - `time`: time to the first token of the answer, the user having typed
//!   (pre-prefill) and paused (tier1 checks the draft), with tier1 off and
//!   on, and with the checklist.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::ValueEnum;
use revis_client::{Client, Runner, Sampling, Tier};
use revis_orchestrator::conversation::{Chat, extract_facts, grounded};
use revis_orchestrator::{Policies, PrefillPhase, check, checklist};
use revis_store::Store;
use serde::Deserialize;

use crate::daemon::{Daemon, Launch};

/// The options of `revis-bench quality`.
#[derive(clap::Args, Debug)]
pub struct QualityArgs {
    /// Parts to run.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = QPart::ALL)]
    pub quality_parts: Vec<QPart>,
    /// The folder of the labelled sets. Default: crates/revis-bench/data/quality.
    #[arg(long)]
    pub quality_data: Option<PathBuf>,
    /// Items of each set: the first N (0: all).
    #[arg(long, default_value_t = 0)]
    pub quality_items: usize,
    /// Turns of each kind in the time part.
    #[arg(long, default_value_t = 8)]
    pub time_turns: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QPart {
    Language,
    Escalation,
    Typos,
    Facts,
    Time,
}

impl QPart {
    pub const ALL: [QPart; 5] = [QPart::Language, QPart::Escalation, QPart::Typos, QPart::Facts, QPart::Time];
}

#[derive(Deserialize)]
struct LangItem {
    lang: String,
    text: String,
}

#[derive(Deserialize)]
struct EscItem {
    text: String,
    escalate: bool,
}

#[derive(Deserialize)]
struct TypoItem {
    text: String,
    fixed: String,
    typos: Vec<(String, String)>,
}

#[derive(Deserialize)]
struct FactLabel {
    keys: Vec<String>,
}

#[derive(Deserialize)]
struct FactItem {
    text: String,
    facts: Vec<FactLabel>,
}

fn load<T: for<'de> Deserialize<'de>>(dir: &Path, name: &str, items: usize) -> anyhow::Result<Vec<T>> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        out.push(serde_json::from_str(line).with_context(|| format!("{}:{}", path.display(), i + 1))?);
    }
    if items > 0 {
        out.truncate(items);
    }
    Ok(out)
}

/// One model's figures.
#[derive(Default, Debug, serde::Serialize)]
pub struct ModelResults {
    pub model: String,
    /// (language, items, right without the checklist, right with it, of which the LANGUAGE line was filled in)
    pub language: Vec<(String, usize, usize, usize, usize)>,
    pub language_examples: Vec<(String, String, String)>,
    /// Confusion counts (tp, fp, fn, tn) of tier1, the checklist, either.
    pub escalation: Option<[[usize; 4]; 3]>,
    pub typos: Option<TypoFigures>,
    pub facts: Option<FactFigures>,
    /// Time to first token in ms: tier1 off, tier1 on (checked in time), tier1 on with the checklist.
    pub time_ms: Option<[Vec<f64>; 3]>,
    /// Of the turns with tier1 on, how many found the check ready.
    pub time_checked: usize,
}

#[derive(Default, Debug, serde::Serialize)]
pub struct TypoFigures {
    pub typo_messages: usize,
    pub correct_messages: usize,
    /// [guarded, as proposed]: messages fixed exactly, corrections made, of them right, correct messages changed.
    pub fixed: [usize; 2],
    pub made: [usize; 2],
    pub right: [usize; 2],
    pub false_changes: [usize; 2],
}

#[derive(Default, Debug, serde::Serialize)]
pub struct FactFigures {
    pub messages: usize,
    pub labelled: usize,
    /// [guarded, as extracted]: facts extracted, of them matching a label, labels found.
    pub extracted: [usize; 2],
    pub correct: [usize; 2],
    pub found: [usize; 2],
}

fn greedy() -> Sampling {
    Sampling { temperature: Some(0.0), seed: Some(0), ..Default::default() }
}

/// A chat for one measured turn: its own conversation, no background work.
fn chat(client: &Client, store: &Store, checklist: bool, quick_check: bool, max_tokens: u32) -> anyhow::Result<Chat<Client>> {
    let conv = store.create_conversation("quality")?;
    let mut chat = Chat::new(client.clone(), store.clone(), conv, Policies::default());
    chat.sampling = greedy();
    chat.max_tokens = Some(max_tokens);
    chat.checklist = checklist;
    chat.quick_check = quick_check;
    chat.after_turn = false;
    Ok(chat)
}

fn last_reply(store: &Store, chat: &Chat<Client>) -> anyhow::Result<revis_store::MessageId> {
    store.messages(chat.conversation)?.last().map(|m| m.id).context("no reply stored")
}

/// The language of an answer, as the judge sees it (whatlang's best guess).
fn judged(answer: &str) -> Option<&'static str> {
    whatlang::detect(answer).map(|i| i.lang().code())
}

async fn language(client: &Client, store: &Store, items: &[LangItem], r: &mut ModelResults) -> anyhow::Result<()> {
    let mut langs: Vec<String> = Vec::new();
    for it in items {
        if !langs.contains(&it.lang) {
            langs.push(it.lang.clone());
        }
    }
    let mut rows: Vec<(String, usize, usize, usize, usize)> = langs.iter().map(|l| (l.clone(), 0, 0, 0, 0)).collect();
    for (i, it) in items.iter().enumerate() {
        let row = rows.iter_mut().find(|row| row.0 == it.lang).context("language row")?;
        row.1 += 1;
        for with in [false, true] {
            let c = chat(client, store, with, false, 64)?;
            let done = c.send(&it.text, |_| {}).await?;
            let right = judged(&done.text) == Some(it.lang.as_str());
            if with {
                row.3 += usize::from(right);
                row.4 += usize::from(check::language(&it.text).is_some());
            } else {
                row.2 += usize::from(right);
            }
            if i % 12 == 0 {
                r.language_examples.push((
                    it.text.clone(),
                    if with { "checklist" } else { "plain" }.into(),
                    done.text.chars().take(160).collect(),
                ));
            }
        }
        eprintln!("revis-bench: quality language {}/{}", i + 1, items.len());
    }
    r.language = rows;
    Ok(())
}

async fn escalation(client: &Client, store: &Store, items: &[EscItem], r: &mut ModelResults) -> anyhow::Result<()> {
    let mut m = [[0usize; 4]; 3];
    let count = |m: &mut [usize; 4], said: bool, truth: bool| {
        let k = match (said, truth) {
            (true, true) => 0,
            (true, false) => 1,
            (false, true) => 2,
            (false, false) => 3,
        };
        m[k] += 1;
    };
    for (i, it) in items.iter().enumerate() {
        let by_check = check::run(client, Tier::Tier1, &it.text).await.map(|c| c.escalate).unwrap_or(false);
        let c = chat(client, store, true, false, 1)?;
        c.send(&it.text, |_| {}).await?;
        let notes = c.record(last_reply(store, &c)?)?.and_then(|rec| rec.notes).unwrap_or_default();
        let by_list = checklist::parse(&notes).escalate == Some(true);
        count(&mut m[0], by_check, it.escalate);
        count(&mut m[1], by_list, it.escalate);
        count(&mut m[2], by_check || by_list, it.escalate);
        eprintln!("revis-bench: quality escalation {}/{}", i + 1, items.len());
    }
    r.escalation = Some(m);
    Ok(())
}

async fn typos(client: &Client, items: &[TypoItem], r: &mut ModelResults) -> anyhow::Result<()> {
    let mut f = TypoFigures::default();
    for (i, it) in items.iter().enumerate() {
        let done = Runner::generate(client, check::request(Tier::Tier1, &it.text), |_| {}).await?;
        let v: serde_json::Value = serde_json::from_str(&done.text).unwrap_or_default();
        let guarded = check::interpret(&it.text, &v).corrections;
        // As proposed: every pair whose word is in the message, no other guard.
        let proposed: Vec<check::Correction> = v["typos"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| Some((t["wrong"].as_str()?, t["right"].as_str()?)))
            .filter(|(w, r)| w != r && it.text.contains(w))
            .map(|(w, r)| check::Correction { wrong: w.into(), right: r.into() })
            .collect();
        let has_typos = !it.typos.is_empty();
        if has_typos {
            f.typo_messages += 1;
        } else {
            f.correct_messages += 1;
        }
        for (k, corr) in [guarded, proposed].iter().enumerate() {
            let corrected = check::apply(&it.text, corr);
            f.made[k] += corr.len();
            f.right[k] += corr.iter().filter(|c| it.typos.iter().any(|(w, r)| *w == c.wrong && *r == c.right)).count();
            if has_typos && corrected == it.fixed {
                f.fixed[k] += 1;
            }
            if !has_typos && corrected != it.text {
                f.false_changes[k] += 1;
            }
        }
        eprintln!("revis-bench: quality typos {}/{}", i + 1, items.len());
    }
    r.typos = Some(f);
    Ok(())
}

async fn facts(client: &Client, items: &[FactItem], r: &mut ModelResults) -> anyhow::Result<()> {
    let mut f = FactFigures::default();
    let matches = |fact: &str, l: &FactLabel| l.keys.iter().all(|k| fact.to_lowercase().contains(&k.to_lowercase()));
    for (i, it) in items.iter().enumerate() {
        f.messages += 1;
        f.labelled += it.facts.len();
        let v = extract_facts(client, Tier::Tier3, &it.text).await.unwrap_or_default();
        let raw: Vec<String> =
            v["facts"].as_array().into_iter().flatten().filter_map(|x| x.as_str()).map(|s| s.trim().to_owned()).collect();
        let kept: Vec<String> = raw.iter().filter(|x| grounded(x, &it.text)).cloned().collect();
        for (k, list) in [kept, raw].iter().enumerate() {
            f.extracted[k] += list.len();
            f.correct[k] += list.iter().filter(|x| it.facts.iter().any(|l| matches(x, l))).count();
            f.found[k] += it.facts.iter().filter(|l| list.iter().any(|x| matches(x, l))).count();
        }
        eprintln!("revis-bench: quality facts {}/{}", i + 1, items.len());
    }
    r.facts = Some(f);
    Ok(())
}

async fn time(client: &Client, store: &Store, items: &[LangItem], turns: usize, r: &mut ModelResults) -> anyhow::Result<()> {
    let english: Vec<&LangItem> = items.iter().filter(|i| i.lang == "eng").collect();
    let mut ms: [Vec<f64>; 3] = Default::default();
    let mut checked = 0;
    for t in 0..turns {
        let text = &english.get(t % english.len().max(1)).context("no English message for the time part")?.text;
        for (k, (quick, list)) in [(false, false), (true, false), (true, true)].into_iter().enumerate() {
            client.purge(Tier::DEFAULT).await?;
            let c = chat(client, store, list, quick, 8)?;
            // The user types (pre-prefill) and pauses on the whole message (tier1 checks it).
            let mut phase = c.pre_prefill().watch();
            c.typing_started()?;
            let mut ready = c.draft_checked();
            if quick {
                c.draft(text);
            }
            phase.wait_for(|p| *p == PrefillPhase::Ready).await?;
            if quick {
                ready.wait_for(|d| d.as_deref() == Some(text.as_str())).await?;
            }
            let enter = Instant::now();
            let mut first = None;
            c.send(text, |_| {
                first.get_or_insert_with(Instant::now);
            })
            .await?;
            ms[k].push(first.unwrap_or_else(Instant::now).duration_since(enter).as_secs_f64() * 1e3);
            if quick && c.record(last_reply(store, &c)?)?.is_some_and(|rec| rec.checked_before) {
                checked += 1;
            }
        }
        eprintln!("revis-bench: quality time {}/{turns}", t + 1);
    }
    r.time_ms = Some(ms);
    r.time_checked = checked;
    Ok(())
}

/// The model a run measures, and how revisd runs it.
pub struct Target<'a> {
    pub revisd: &'a Path,
    pub model: &'a Path,
    pub name: &'a str,
    pub threads: u32,
    pub context: u32,
}

/// Runs the parts for one model: the first `items` of each set (0: all) from `data`.
pub async fn run_model(t: &Target<'_>, args: &QualityArgs, items: usize, data: &Path) -> anyhow::Result<ModelResults> {
    let (name, threads, context) = (t.name, t.threads, t.context);
    Daemon::around(t.revisd, t.model, Launch::plain(threads, context, 512), async |d| {
        let db = tempfile::tempdir()?;
        let store = Store::open(db.path())?.store;
        let mut r = ModelResults { model: name.to_owned(), ..Default::default() };
        let parts = &args.quality_parts;
        if parts.contains(&QPart::Language) || parts.contains(&QPart::Time) {
            let langs: Vec<LangItem> = load(data, "language.jsonl", 0)?;
            if parts.contains(&QPart::Language) {
                // The first N of each language, so every language is measured.
                let per = if items > 0 { items.div_ceil(6) } else { usize::MAX };
                let mut taken: Vec<LangItem> = Vec::new();
                for it in langs.iter() {
                    if taken.iter().filter(|t| t.lang == it.lang).count() < per {
                        taken.push(LangItem { lang: it.lang.clone(), text: it.text.clone() });
                    }
                }
                language(&d.client, &store, &taken, &mut r).await?;
            }
            if parts.contains(&QPart::Time) {
                time(&d.client, &store, &langs, args.time_turns, &mut r).await?;
            }
        }
        if parts.contains(&QPart::Escalation) {
            escalation(&d.client, &store, &load(data, "escalation.jsonl", items)?, &mut r).await?;
        }
        if parts.contains(&QPart::Typos) {
            typos(&d.client, &load(data, "typos.jsonl", items)?, &mut r).await?;
        }
        if parts.contains(&QPart::Facts) {
            facts(&d.client, &load(data, "facts.jsonl", items)?, &mut r).await?;
        }
        Ok(r)
    })
    .await
}

fn pct(n: usize, d: usize) -> String {
    if d == 0 { "–".into() } else { format!("{:.0}%", 100.0 * n as f64 / d as f64) }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

/// The markers around one model's generated section of docs/QUALITY.md,
/// `quality` (the labelled sets) or `time`: a run replaces only its own.
pub fn markers(model: &str, kind: &str) -> (String, String) {
    (format!("<!-- revis-bench:{kind}-{model}:begin"), format!("<!-- revis-bench:{kind}-{model}:end -->"))
}

/// One model's generated section of docs/QUALITY.md: the time part
/// (`time`) or the others.
pub fn report(results: &[ModelResults], about: &str, time: bool) -> String {
    let mut o = String::new();
    let name = results.first().map_or("none", |r| r.model.as_str());
    let (begin, end) = markers(name, if time { "time" } else { "quality" });
    let _ = writeln!(o, "{begin} (written by revis-bench quality; edit outside the markers) -->\n");
    let _ = writeln!(o, "{about}\n");
    if !time && results.iter().any(|r| !r.language.is_empty()) {
        let _ = writeln!(o, "### Language: answers in the user's language (whatlang judges the answer)\n");
        let _ = writeln!(o, "| model | language | messages | without the checklist | with it | LANGUAGE filled in by revis |");
        let _ = writeln!(o, "|---|---|---|---|---|---|");
        for r in results {
            let (mut n, mut a, mut b, mut f) = (0, 0, 0, 0);
            for (lang, items, off, on, filled) in &r.language {
                let _ = writeln!(
                    o,
                    "| {} | {lang} | {items} | {} | {} | {} |",
                    r.model,
                    pct(*off, *items),
                    pct(*on, *items),
                    pct(*filled, *items)
                );
                (n, a, b, f) = (n + items, a + off, b + on, f + filled);
            }
            if n > 0 {
                let _ = writeln!(o, "| {} | **all** | {n} | **{}** | **{}** | {} |", r.model, pct(a, n), pct(b, n), pct(f, n));
            }
        }
        o.push('\n');
    }
    if !time && results.iter().any(|r| r.escalation.is_some()) {
        let _ = writeln!(o, "### Escalation: precision and recall of \"needs the deep tier\" against the labels\n");
        let _ = writeln!(o, "| model | who says so | said yes | precision | recall |");
        let _ = writeln!(o, "|---|---|---|---|---|");
        for r in results {
            let Some(m) = &r.escalation else { continue };
            for (who, c) in ["tier1's check", "tier2's checklist", "either (starts tier3)"].iter().zip(m) {
                let [tp, fp, fneg, _] = *c;
                let _ = writeln!(o, "| {} | {who} | {} | {} | {} |", r.model, tp + fp, pct(tp, tp + fp), pct(tp, tp + fneg));
            }
        }
        o.push('\n');
    }
    if !time && results.iter().any(|r| r.typos.is_some()) {
        let _ = writeln!(o, "### Typos: tier1's corrections, with revis's guard and as the model proposed them\n");
        let _ = writeln!(
            o,
            "| model | corrections | messages with typos fixed exactly | corrections made | of them right | correct messages changed (false corrections) |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|");
        for r in results {
            let Some(t) = &r.typos else { continue };
            for (k, how) in ["with the guard (what revis does)", "as proposed"].iter().enumerate() {
                let _ = writeln!(
                    o,
                    "| {} | {how} | {} of {} ({}) | {} | {} | {} of {} ({}) |",
                    r.model,
                    t.fixed[k],
                    t.typo_messages,
                    pct(t.fixed[k], t.typo_messages),
                    t.made[k],
                    pct(t.right[k], t.made[k]),
                    t.false_changes[k],
                    t.correct_messages,
                    pct(t.false_changes[k], t.correct_messages)
                );
            }
        }
        o.push('\n');
    }
    if !time && results.iter().any(|r| r.facts.is_some()) {
        let _ = writeln!(o, "### Profile facts: extraction from introductions\n");
        let _ = writeln!(o, "| model | facts | extracted | precision | recall |");
        let _ = writeln!(o, "|---|---|---|---|---|");
        for r in results {
            let Some(f) = &r.facts else { continue };
            for (k, how) in ["kept by the grounding guard (stored)", "as extracted"].iter().enumerate() {
                let _ = writeln!(
                    o,
                    "| {} | {how} | {} | {} | {} of {} ({}) |",
                    r.model,
                    f.extracted[k],
                    pct(f.correct[k], f.extracted[k]),
                    f.found[k],
                    f.labelled,
                    pct(f.found[k], f.labelled)
                );
            }
        }
        o.push('\n');
    }
    if time && results.iter().any(|r| r.time_ms.is_some()) {
        let _ = writeln!(o, "### Time to the first token of the answer (median ms, after typing and a pause; pre-prefill on)\n");
        let _ = writeln!(o, "| model | turns | tier1 off | tier1 on | change | tier1 on + checklist | checks ready in time |");
        let _ = writeln!(o, "|---|---|---|---|---|---|---|");
        for r in results {
            let Some(t) = &r.time_ms else { continue };
            let (off, on, list) = (median(&t[0]), median(&t[1]), median(&t[2]));
            let _ = writeln!(
                o,
                "| {} | {} | {off:.0} | {on:.0} | {:+.0} ms | {list:.0} | {} of {} |",
                r.model,
                t[0].len(),
                on - off,
                r.time_checked,
                t[1].len() + t[2].len()
            );
        }
        o.push('\n');
    }
    if !time && results.iter().any(|r| !r.language_examples.is_empty()) {
        let _ = writeln!(o, "<details><summary>Some answers, as given (first 160 characters)</summary>\n");
        for r in results {
            for (q, how, a) in &r.language_examples {
                let _ = writeln!(o, "- {} ({how}): {q} → {}", r.model, a.replace('\n', " ").replace('|', "\\|"));
            }
        }
        let _ = writeln!(o, "\n</details>\n");
    }
    let _ = writeln!(o, "{end}");
    o
}
