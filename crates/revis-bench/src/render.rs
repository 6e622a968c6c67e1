//! `revis-bench render`: what rendering a model's chat template in a
//! process of its own (revisd's way since issue 41: bounded memory, killed
//! past its time; revis_engine::render) costs on the first token, against
//! rendering it in the caller's process.
//!
//! The cost is all in building the prompt (the template rendered, then
//! tokenized), which every request does before its first token; the rest
//! of a request is the same either way. So this times `build_prompt` on
//! one loaded model's tokenizer, once with the template rendered here and
//! once in a `revisd render-worker`, interleaved, for a chat turn and for
//! an agent's long prompt, on a quiet machine and beside a spinning
//! process. It also times a model's first prompt, which starts its
//! rendering process.

use std::path::Path;
use std::time::{Duration, Instant};

use revis_engine::render::{RenderChild, RenderPlace};
use revis_engine::{Message, Role, build_prompt};
use serde::Serialize;

use crate::alone::{self, Alone};
use crate::contention::Spinners;
use crate::stats::Summary;

pub const BEGIN: &str = "<!-- revis-bench render: begin -->";
pub const END: &str = "<!-- revis-bench render: end -->";

#[derive(clap::Args, Debug, Clone)]
pub struct RenderArgs {
    /// Prompts built per conversation, place and load (interleaved).
    #[arg(long, default_value_t = 200)]
    pub render_rounds: usize,
}

/// One model × conversation × load: prompt-building times, in µs.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub model: String,
    pub conversation: &'static str,
    pub chars: usize,
    pub tokens: usize,
    pub busy: bool,
    pub here_us: Vec<f64>,
    pub child_us: Vec<f64>,
}

/// A model's first prompt in a rendering process (its start included), in µs.
#[derive(Clone, Debug, Serialize)]
pub struct First {
    pub model: String,
    pub first_us: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Results {
    pub cells: Vec<Cell>,
    pub firsts: Vec<First>,
    pub rounds: usize,
}

/// A chat turn: a system text and ten exchanges, then the user's message.
fn chat_turn() -> Vec<Message> {
    let mut m = vec![Message::new(Role::System, "You are a helpful assistant. Answer briefly and say when you are not sure.")];
    for i in 0..10 {
        m.push(Message::new(Role::User, format!("Question {i}: how long does it take to boil an egg so the yolk stays soft?")));
        m.push(Message::new(Role::Assistant, format!("Answer {i}: about six minutes in water that is already boiling, then cold water.")));
    }
    m.push(Message::new(Role::User, "And a hard one?"));
    m
}

/// An agent's prompt: about 25,000 characters of instructions (the size of
/// Codex's), then a user's request.
fn agent_prompt() -> Vec<Message> {
    let rule = "When you change a file, read it first, keep its style, run its tests, and say what you changed and why. ";
    vec![Message::new(Role::System, rule.repeat(250)), Message::new(Role::User, "Rename the function parse_args to read_args.")]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub async fn run(
    revisd: &Path,
    models: &[(String, std::path::PathBuf)],
    threads: u32,
    context: u32,
    batch: u32,
    rounds: usize,
) -> anyhow::Result<Results> {
    let mut cells = Vec::new();
    let mut firsts = Vec::new();
    for (name, path) in models {
        let here = Alone::load(alone::spec(path, threads, context.max(8192), batch)).await?;
        let mut spec = alone::spec(path, threads, context.max(8192), batch);
        let limit: u64 = 1 << 30;
        spec.render = RenderPlace::Child(RenderChild {
            program: revisd.to_owned(),
            args: vec!["render-worker".into(), "--memory-limit".into(), limit.to_string()],
            memory_limit: limit,
            timeout: Duration::from_secs(30),
        });
        let child = Alone::load(spec).await?;
        let (here, child) = (here.loaded.tokenizer.clone(), child.loaded.tokenizer.clone());
        let chat = chat_turn();
        let started = Instant::now();
        build_prompt(child.as_ref(), &chat, &[], 1)?;
        firsts.push(First { model: name.clone(), first_us: micros(started.elapsed()) });
        for busy in [false, true] {
            let _spinning = if busy { Some(Spinners::start(1)?) } else { None };
            for (conversation, messages) in [("chat turn", chat_turn()), ("agent prompt", agent_prompt())] {
                let tokens = build_prompt(here.as_ref(), &messages, &[], 1)?.tokens.len();
                let chars = messages.iter().map(|m| m.content.len()).sum();
                let (mut here_us, mut child_us) = (Vec::new(), Vec::new());
                for _ in 0..rounds {
                    for (tok, into) in [(&here, &mut here_us), (&child, &mut child_us)] {
                        let t = Instant::now();
                        let prompt = build_prompt(tok.as_ref(), &messages, &[], 1)?;
                        into.push(micros(t.elapsed()));
                        anyhow::ensure!(prompt.tokens.len() == tokens, "the two places built different prompts");
                    }
                }
                eprintln!("revis-bench: render {name} {conversation}{}", if busy { " (busy)" } else { "" });
                cells.push(Cell { model: name.clone(), conversation, chars, tokens, busy, here_us, child_us });
            }
        }
    }
    Ok(Results { cells, firsts, rounds })
}

pub fn report(r: &Results, about: &str) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{about}\n\nMedian (p90) time to build one prompt: the template rendered and the text tokenized, the work every \
         request does before its first token. \"Here\" renders in the caller's process (revisd before issue 41); \"own \
         process\" in a `revisd render-worker` over pipes, as revisd does now. {} prompts each, the two places \
         interleaved; \"busy\" beside one process spinning on a core.\n\n",
        r.rounds
    ));
    out.push_str("| Model | Conversation | Load | Here | Own process | Cost on the first token |\n|---|---|---|---:|---:|---:|\n");
    let p90 = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        s.get((s.len() * 9 / 10).min(s.len().saturating_sub(1))).copied().unwrap_or(f64::NAN)
    };
    for c in &r.cells {
        let (h, k) = (Summary::of(&c.here_us), Summary::of(&c.child_us));
        let (Some(h), Some(k)) = (h, k) else { continue };
        out.push_str(&format!(
            "| {} | {} ({} chars, {} tokens) | {} | {:.0} µs ({:.0}) | {:.0} µs ({:.0}) | {:+.0} µs |\n",
            c.model,
            c.conversation,
            c.chars,
            c.tokens,
            if c.busy { "busy" } else { "quiet" },
            h.median,
            p90(&c.here_us),
            k.median,
            p90(&c.child_us),
            k.median - h.median
        ));
    }
    out.push_str("\nA model's first prompt, which starts its rendering process: ");
    out.push_str(&r.firsts.iter().map(|f| format!("{} {:.1} ms", f.model, f.first_us / 1000.0)).collect::<Vec<_>>().join(", "));
    out.push_str(".\n");
    out
}
