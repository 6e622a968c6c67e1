//! `revis-bench turn`: a chat turn as a person gets it (the real [`Chat`]:
//! rules, profile, summaries, tier1's check, the loop guard, with the
//! model's chosen gears and its default sampling) against the bare model (no
//! system message, greedy, the same token limit), on the same items in the
//! same run, with each step switched on and off (docs/QUALITY.md).
//!
//! Parts (`--turn-parts`):
//! - `capitals`: "What is the capital of X?" (`../shared/eval/`), exact match;
//! - `piqa`: PIQA asked as a chat question ("Which is better, 1 or 2?"),
//!   the answer's first 1 or 2 taken as its choice;
//! - `rules`: the rules candidates (revis's house rules, the earlier ones,
//!   the model's own default system prompt, none) on both sets, greedy;
//! - `recall`: conversations in which the user says something about
//!   themselves and asks about it later (`data/quality/recall.jsonl`), asked
//!   in the same conversation and in a new one (the profile alone), each
//!   conversation one person with a data directory of their own;
//! - `people`: people who each tell revis ten things about themselves, one
//!   conversation a statement (`data/quality/people.jsonl`), then are asked
//!   about each in a new conversation: one person's profile of many facts;
//! - `profile`: the profile as stored, on a mixed set of messages
//!   (`data/quality/profile.jsonl`: statements about the user, questions,
//!   facts about others), on a first-person set (`data/quality/memory.jsonl`:
//!   100 messages in the forms people introduce themselves in, 149 facts),
//!   and the facts held after the capitals questions;
//! - `check`: tier1's "needs the deep tier" on the capitals questions
//!   (plain facts: every yes is a false escalation);
//! - `loops`: open questions answered at length, loops counted with the
//!   guard off and on.
//!
//! Two states: a fresh data directory, and one where `--history-turns`
//! earlier turns (introductions and everyday questions from
//! `data/quality/`) were had through the same `Chat`, background work and all.

mod recall;
mod report;
mod row;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::ValueEnum;
use revis_client::{Client, GenerateParams, Message, Priority, Runner, Sampling};
use revis_orchestrator::conversation::{Chat, RULES, about_user, extract_facts, profile_facts, repeats_itself, rules_for, statements};
use revis_orchestrator::{Policies, TaskKind, check};
use revis_store::Store;
use serde::Deserialize;

pub use self::report::{markers, report};
pub use self::row::Row;
use self::row::greedy;
use crate::daemon::{Daemon, Launch};
use crate::ensemble::data::{Capital, Piqa, load_capitals, load_piqa};
pub use crate::quality::Target;

/// The house rules before issue 29, kept as a candidate: the measured reason they went.
pub const EARLIER_RULES: &str = "You are revis, a private assistant running on the user's own computer. \
Answer helpfully, briefly and honestly. If you do not know, say so.";

/// The options of `revis-bench turn`.
#[derive(clap::Args, Debug)]
pub struct TurnArgs {
    /// Parts to run.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = TPart::ALL)]
    pub turn_parts: Vec<TPart>,
    /// Capitals questions: the first N (0: all 97).
    #[arg(long, default_value_t = 0)]
    pub capitals_items: usize,
    /// PIQA items asked as chat questions: the first N of the dev set.
    #[arg(long, default_value_t = 60)]
    pub piqa_items: usize,
    /// Longest answer, in tokens, for capitals and PIQA.
    #[arg(long, default_value_t = 32)]
    pub turn_max_tokens: u32,
    /// Earlier turns in the second state.
    #[arg(long, default_value_t = 40)]
    pub history_turns: usize,
    /// Open questions answered at length in the loops part.
    #[arg(long, default_value_t = 12)]
    pub loop_items: usize,
    /// Recall conversations: the first N (0: all).
    #[arg(long, default_value_t = 0)]
    pub recall_items: usize,
    /// The folder of the hand-written sets. Default: crates/revis-bench/data/quality.
    #[arg(long)]
    pub turn_data: Option<PathBuf>,
    /// The public sets. Default: ../shared/eval beside the workspace.
    #[arg(long)]
    pub eval: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
pub enum TPart {
    Capitals,
    Piqa,
    Rules,
    Recall,
    People,
    Profile,
    Check,
    Loops,
}

impl TPart {
    pub const ALL: [TPart; 8] =
        [TPart::Capitals, TPart::Piqa, TPart::Rules, TPart::Recall, TPart::People, TPart::Profile, TPart::Check, TPart::Loops];
}

/// How many draws the sampled turn is measured with against the bare
/// model ([`DRAWN`], [`AFTER_40`]).
const DRAWS: u64 = 3;

/// The sampled turn, each question asked [`DRAWS`] times: the row the
/// targets read for "the turn as revis gives it".
pub const DRAWN: &str = "the turn as revis gives it (default sampling), three draws a question";

/// The sampled turn after 40 turns of history, [`DRAWS`] draws a question.
pub const AFTER_40: &str = "after 40 turns: the turn (default sampling), three draws a question";

/// One way of answering a question.
#[derive(Clone, Debug, serde::Serialize)]
struct Way {
    name: String,
    /// None: the bare model (no system message, greedy). Some: a `Chat` with these rules.
    rules: Option<String>,
    sampled: bool,
    history: bool,
    guard: bool,
    /// The turn leaves its background work behind (profile, audit...), as in use.
    after_turn: bool,
    /// How many times each question is asked, each with its own seed (a
    /// sampled way: one draw a question measures the seeds as much as the
    /// sampling); the row counts every answer.
    draws: u64,
}

impl Way {
    fn bare() -> Way {
        Way { name: "bare model, greedy".into(), rules: None, sampled: false, history: false, guard: false, after_turn: false, draws: 1 }
    }
    fn turn(name: &str, rules: &str, sampled: bool) -> Way {
        Way { name: name.into(), rules: Some(rules.into()), sampled, history: false, guard: true, after_turn: false, draws: 1 }
    }
}

/// The choice a chat answer to a PIQA question makes: its first "1" or "2"
/// standing alone (not part of a longer number), else None.
pub fn choice_of(answer: &str) -> Option<usize> {
    let b = answer.as_bytes();
    for (i, c) in b.iter().enumerate() {
        if (*c == b'1' || *c == b'2')
            && !(i > 0 && b[i - 1].is_ascii_digit())
            && !b.get(i + 1).is_some_and(|n| n.is_ascii_digit() || *n == b'.' && b.get(i + 2).is_some_and(u8::is_ascii_digit))
        {
            return Some(usize::from(*c - b'1'));
        }
    }
    None
}

/// Whether an answer repeated a span of itself at some point (what the
/// loop guard stops at): some prefix of it [`repeats_itself`].
pub fn looped(answer: &str) -> bool {
    answer.char_indices().map(|(i, _)| i).chain([answer.len()]).step_by(4).any(|end| repeats_itself(&answer[..end]))
        || repeats_itself(answer)
}

fn piqa_question(p: &Piqa) -> String {
    format!("{}\n\n1. {}\n2. {}\n\nWhich is better, 1 or 2?", p.goal, p.sols[0], p.sols[1])
}

#[derive(Deserialize)]
struct FactItem {
    text: String,
    facts: Vec<FactLabel>,
}

#[derive(Deserialize)]
struct FactLabel {
    keys: Vec<String>,
}

#[derive(Deserialize)]
struct Plain {
    text: String,
    #[serde(default)]
    escalate: Option<bool>,
}

fn lines<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<Vec<T>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{}:{}", path.display(), i + 1)))
        .collect()
}

/// Profile figures: on the mixed set, and what the capitals questions left.
#[derive(Default, Debug, serde::Serialize)]
pub struct ProfileFigures {
    pub messages: usize,
    pub labelled: usize,
    pub stored: usize,
    pub correct: usize,
    pub found: usize,
    /// Facts the profile held after the capitals questions, as a person asks them (None: not run).
    pub after_capitals: Option<usize>,
}

impl ProfileFigures {
    /// Takes a set's counts (what the capitals questions left stays).
    fn add(&mut self, o: ProfileFigures) {
        (self.messages, self.labelled, self.stored, self.correct, self.found) = (o.messages, o.labelled, o.stored, o.correct, o.found);
    }

    fn precision(&self) -> f64 {
        if self.stored == 0 { 1.0 } else { self.correct as f64 / self.stored as f64 }
    }

    fn recall(&self) -> f64 {
        if self.labelled == 0 { 1.0 } else { self.found as f64 / self.labelled as f64 }
    }
}

/// One model's figures.
#[derive(Default, Debug, serde::Serialize)]
pub struct ModelTurns {
    pub model: String,
    /// The rules the model's gears name (empty: none), and whether they were measured.
    pub chosen_rules: String,
    pub measured: bool,
    pub rows: Vec<Row>,
    pub profile: Option<ProfileFigures>,
    /// The same on the first-person set (`memory.jsonl`: 100 messages in
    /// the forms people introduce themselves in, issue 42).
    pub memory: Option<ProfileFigures>,
    /// tier1's check on the capitals questions: said "needs the deep tier", of how many.
    pub escalations: Option<(usize, usize)>,
    pub minutes: f64,
}

impl ModelTurns {
    fn row(&self, set: &str, way: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.set == set && r.way == way)
    }
}

struct Run<'a> {
    client: &'a Client,
    max_tokens: u32,
    fresh: Store,
    history: Option<Store>,
}

impl Run<'_> {
    /// Answers `question` the way `way` says; `seed` for a sampled way.
    async fn answer(&self, way: &Way, store: &Store, question: &str, seed: u64, max_tokens: u32) -> anyhow::Result<String> {
        let Some(rules) = &way.rules else {
            let req = GenerateParams {
                tier: Policies::default().get(TaskKind::ChatAnswer).tier,
                messages: vec![Message::user(question)],
                static_messages: Some(0),
                max_tokens: Some(max_tokens),
                sampling: Sampling { temperature: Some(0.0), seed: Some(0), ..Default::default() },
                priority: Priority::User,
                ..Default::default()
            };
            return Ok(Runner::generate(self.client, req, |_| {}).await?.text);
        };
        let conv = store.create_conversation("turn bench")?;
        let mut chat = Chat::new(self.client.clone(), store.clone(), conv, Policies::default());
        chat.fit_to_model().await?;
        chat.rules = rules.clone();
        chat.sampling = if way.sampled { Sampling { seed: Some(seed), ..Default::default() } } else { greedy() };
        chat.max_tokens = Some(max_tokens);
        chat.loop_guard = way.guard;
        chat.after_turn = way.after_turn;
        let done = chat.send(question, |_| {}).await?;
        if way.after_turn {
            chat.background_done().await;
        }
        Ok(done.text)
    }

    fn store(&self, way: &Way) -> anyhow::Result<&Store> {
        if way.history { self.history.as_ref().context("no history state was built") } else { Ok(&self.fresh) }
    }

    /// Answers every question of a set one way; `right` scores an answer.
    async fn set(
        &self,
        set: &str,
        way: &Way,
        store: &Store,
        questions: &[String],
        right: impl Fn(usize, &str) -> bool,
    ) -> anyhow::Result<Row> {
        let mut row = Row { set: set.into(), way: way.name.clone(), right: 0, n: 0, loops: 0, chars: 0, examples: Vec::new() };
        for draw in 0..way.draws {
            for (i, q) in questions.iter().enumerate() {
                let a = self.answer(way, store, q, i as u64 + 1000 * draw, self.max_tokens).await?;
                row.n += 1;
                row.right += usize::from(right(i, &a));
                row.loops += usize::from(looped(&a));
                row.chars += a.chars().count();
                if i < 3 && draw == 0 {
                    row.examples.push((q.clone(), a.chars().take(160).collect()));
                }
            }
        }
        eprintln!("revis-bench: turn {set}, {}: {}/{}", way.name, row.right, row.n);
        Ok(row)
    }
}

/// Has the earlier turns in `store`, through the default `Chat` (background
/// work and all), six to a conversation (what carries over to a new
/// conversation is the profile; a summary stays in its own).
async fn build_history(client: &Client, store: &Store, texts: &[String], max_tokens: u32) -> anyhow::Result<()> {
    let mut chat = Chat::new(client.clone(), store.clone(), store.create_conversation("history")?, Policies::default());
    chat.fit_to_model().await?;
    chat.max_tokens = Some(max_tokens);
    for (i, t) in texts.iter().enumerate() {
        if i > 0 && i % 6 == 0 {
            chat.open(store.create_conversation("history")?);
        }
        chat.sampling = Sampling { seed: Some(i as u64), ..Default::default() };
        chat.send(t, |_| {}).await?;
        chat.background_done().await;
        eprintln!("revis-bench: turn history {}/{}", i + 1, texts.len());
    }
    Ok(())
}

/// Runs the parts for one model.
pub async fn run_model(t: &Target<'_>, a: &TurnArgs, quick: bool, data: &Path, eval: &Path) -> anyhow::Result<ModelTurns> {
    let started = Instant::now();
    Daemon::around(t.revisd, t.model, Launch::plain(t.threads, t.context, 512), async |d| {
        let client = &d.client;
        let parts = &a.turn_parts;
        let take = |n: usize, quick_n: usize| if quick { if n == 0 { quick_n } else { n.min(quick_n) } } else { n };
        let mut capitals: Vec<Capital> = load_capitals(&eval.join("capitals-dev.jsonl"))?;
        capitals.truncate(match take(a.capitals_items, 12) {
            0 => usize::MAX,
            n => n,
        });
        let mut piqa: Vec<Piqa> = load_piqa(&eval.join("piqa-dev/valid.jsonl"), &eval.join("piqa-dev/valid-labels.lst"))?;
        piqa.truncate(take(a.piqa_items, 12));

        // The gears the model has, as a first turn would find them.
        let (fresh_dir, history_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
        let fresh = Store::open(fresh_dir.path())?.store;
        let mut probe = Chat::new(client.clone(), fresh.clone(), fresh.create_conversation("probe")?, Policies::default());
        let gears = probe.fit_to_model().await?;
        drop(probe);
        let chosen = rules_for(&gears);
        let mut r = ModelTurns { model: t.name.into(), chosen_rules: chosen.clone(), measured: gears.measured, ..Default::default() };

        let history = if parts.contains(&TPart::Capitals) || parts.contains(&TPart::Piqa) {
            let mut texts: Vec<String> = lines::<Plain>(&data.join("facts.jsonl"))?.into_iter().map(|p| p.text).collect();
            texts.extend(lines::<Plain>(&data.join("escalation.jsonl"))?.into_iter().filter(|p| p.escalate == Some(false)).map(|p| p.text));
            texts.truncate(take(a.history_turns, 4));
            let store = Store::open(history_dir.path())?.store;
            build_history(client, &store, &texts, 64).await?;
            Some(store)
        } else {
            None
        };
        let run = Run { client, max_tokens: a.turn_max_tokens, fresh: fresh.clone(), history };

        let bare = Way::bare();
        let default = Way { after_turn: true, ..Way::turn("the turn as revis gives it (default sampling)", &chosen, true) };
        let greedy_turn = Way::turn("the turn, greedy", &chosen, false);
        let history_default = Way { history: true, draws: DRAWS, ..Way::turn(AFTER_40, &chosen, true) };
        let drawn = Way { draws: DRAWS, ..Way::turn(DRAWN, &chosen, true) };
        let mut candidates = vec![
            Way::turn("rules: revis's house rules, greedy", RULES, false),
            Way::turn("rules: the earlier house rules, greedy", EARLIER_RULES, false),
            Way::turn("rules: none, greedy", "", false),
        ];
        if let Some(own) = revis_models::find(t.name).and_then(|e| e.system_prompt) {
            candidates.push(Way::turn("rules: the model's own system prompt, greedy", own, false));
        }
        // The chosen rules are "the turn, greedy" already.
        candidates.retain(|w| w.rules.as_deref() != Some(chosen.as_str()));

        if parts.contains(&TPart::Capitals) {
            let qs: Vec<String> = capitals.iter().map(|c| c.question.clone()).collect();
            let right = |i: usize, a: &str| capitals[i].is_right(a);
            // The default turn keeps its own data directory: it leaves its background work, as in use.
            let own_dir = tempfile::tempdir()?;
            let own = Store::open(own_dir.path())?.store;
            r.rows.push(run.set("capitals", &default, &own, &qs, right).await?);
            r.profile.get_or_insert_default().after_capitals = Some(own.facts()?.len());
            let mut ways = vec![bare.clone(), greedy_turn.clone(), drawn.clone()];
            if run.history.is_some() {
                ways.push(history_default.clone());
            }
            for w in &ways {
                r.rows.push(run.set("capitals", w, run.store(w)?, &qs, right).await?);
            }
        }
        if parts.contains(&TPart::Piqa) {
            let qs: Vec<String> = piqa.iter().map(piqa_question).collect();
            let right = |i: usize, a: &str| choice_of(a) == Some(piqa[i].label);
            let mut ways = vec![bare.clone(), greedy_turn.clone(), drawn.clone()];
            if run.history.is_some() {
                ways.push(history_default.clone());
            }
            for w in &ways {
                r.rows.push(run.set("piqa-chat", w, run.store(w)?, &qs, right).await?);
            }
        }
        if parts.contains(&TPart::Rules) {
            let cq: Vec<String> = capitals.iter().map(|c| c.question.clone()).collect();
            let pq: Vec<String> = piqa.iter().map(piqa_question).collect();
            for w in &candidates {
                r.rows.push(run.set("capitals", w, &fresh, &cq, |i, a| capitals[i].is_right(a)).await?);
                r.rows.push(run.set("piqa-chat", w, &fresh, &pq, |i, a| choice_of(a) == Some(piqa[i].label)).await?);
            }
        }
        if parts.contains(&TPart::Check) {
            let tier = Policies::default().get(TaskKind::Classify).tier;
            let mut said = 0;
            for c in &capitals {
                said += usize::from(check::run(client, tier, &c.question).await.is_ok_and(|c| c.escalate));
            }
            r.escalations = Some((said, capitals.len()));
            eprintln!("revis-bench: turn check: {said} escalations of {}", capitals.len());
        }
        if parts.contains(&TPart::Profile) {
            let mixed = profile(client, &data.join("profile.jsonl"), take(0, 12)).await?;
            r.profile.get_or_insert_default().add(mixed);
            r.memory = Some(profile(client, &data.join("memory.jsonl"), take(0, 12)).await?);
        }
        if parts.contains(&TPart::Recall) {
            let mut items: Vec<recall::Recall> = lines(&data.join("recall.jsonl"))?;
            items.truncate(match take(a.recall_items, 3) {
                0 => usize::MAX,
                n => n,
            });
            r.rows.extend(recall::recall(client, &items, default.rules.as_deref().unwrap_or_default()).await?);
        }
        if parts.contains(&TPart::People) {
            let mut people: Vec<recall::Person> = lines(&data.join("people.jsonl"))?;
            people.truncate(if quick { 1 } else { usize::MAX });
            r.rows.extend(recall::people(client, &people, default.rules.as_deref().unwrap_or_default()).await?);
        }
        if parts.contains(&TPart::Loops) {
            let qs: Vec<String> = piqa.iter().take(take(a.loop_items, 3)).map(|p| p.goal.clone()).collect();
            let long = Run { max_tokens: 256, fresh: fresh.clone(), history: None, client };
            let sampled_no_guard = Way { guard: false, ..Way::turn("the turn (default sampling), no loop guard", &chosen, true) };
            let sampled_guard = Way::turn("the turn (default sampling), loop guard", &chosen, true);
            for w in [&bare, &sampled_no_guard, &sampled_guard] {
                r.rows.push(long.set("loops (256 tokens)", w, &fresh, &qs, |_, _| true).await?);
            }
        }
        r.minutes = started.elapsed().as_secs_f64() / 60.0;
        Ok(r)
    })
    .await
}

/// The profile as stored (only sentences about the user are read, only
/// facts about them grounded in those kept) on the mixed set.
async fn profile(client: &Client, set: &Path, quick_items: usize) -> anyhow::Result<ProfileFigures> {
    let mut items: Vec<FactItem> = lines(set)?;
    if quick_items > 0 {
        items.truncate(quick_items);
    }
    let tier = Policies::default().get(TaskKind::ExtractFacts).tier;
    let mut figures = ProfileFigures::default();
    let f = &mut figures;
    let matches = |fact: &str, l: &FactLabel| l.keys.iter().all(|k| fact.to_lowercase().contains(&k.to_lowercase()));
    for (i, it) in items.iter().enumerate() {
        f.messages += 1;
        f.labelled += it.facts.len();
        let (extracted, stored) = match about_user(&it.text) {
            Some(said) => {
                let v = extract_facts(client, tier, &said).await.unwrap_or_default();
                let stored: Vec<String> = profile_facts(&v, &statements(&it.text)).into_iter().map(|l| l.text).collect();
                (v["facts"].to_string(), stored)
            }
            None => ("(not asked)".to_owned(), Vec::new()),
        };
        if std::env::var_os("REVIS_BENCH_SHOW").is_some() {
            eprintln!("{:?}\n  extracted {extracted}\n  stored {stored:?}", it.text);
        }
        f.stored += stored.len();
        f.correct += stored.iter().filter(|x| it.facts.iter().any(|l| matches(x, l))).count();
        f.found += it.facts.iter().filter(|l| stored.iter().any(|x| matches(x, l))).count();
        eprintln!("revis-bench: turn profile {}/{} ({})", i + 1, items.len(), set.display());
    }
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_choice_is_the_first_lone_one_or_two() {
        assert_eq!(choice_of("2. Use a spoon."), Some(1));
        assert_eq!(choice_of("Option 1 is better than 2"), Some(0));
        assert_eq!(choice_of("In 2019, 12 people said 1"), Some(0));
        assert_eq!(choice_of("It takes 1.5 hours; 2 is better"), Some(1));
        assert_eq!(choice_of("Neither."), None);
    }

    #[test]
    fn a_loop_in_the_middle_counts_as_one() {
        let sentence = "The cage needs fresh bedding, a water bottle and a food dish every week. ";
        assert!(looped(&format!("{sentence}{sentence}And then something else entirely, which goes on and on without repeating.")));
        assert!(!looped(sentence));
    }
}
