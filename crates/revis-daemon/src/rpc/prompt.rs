//! Prompts for the Inference calls: rendered and tokenized on a small pool
//! of threads of their own, off the async runtime, and checked against the
//! model's context.

use revis_engine::render::Bound;
use revis_engine::tools::{self, ToolSyntax};
use revis_engine::{EngineError, Grammar, Message, Prompt, Token, Tokenizer, Tool, ToolChoice, build_prompt, build_score_prefix};
use revis_proto::Tier;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::error::DaemonError;

/// Threads that render and tokenize prompts, off the async runtime. Two, so
/// a long prompt does not hold up a short one; a fixed few, because each
/// thread keeps the memory its largest prompt needed (a 1 MiB prompt takes
/// tens of MiB while tokenized, and the allocator keeps one arena per
/// thread), where tokio's blocking pool would spread that over dozens.
pub const TOKENIZER_THREADS: usize = 2;

pub fn tokenizer_pool(render_timeout: Duration) -> Tokenizers {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(TOKENIZER_THREADS)
        .thread_name(|i| format!("revis-tokenize-{i}"))
        .build()
        .expect("start the tokenizer threads");
    Tokenizers { pool, render_timeout, gates: Mutex::new(Vec::new()) }
}

/// The tokenizer threads, and for each loaded model's tokenizer a gate: one
/// of its prompts at a time on them (a model whose chat template runs long,
/// another's text in its GGUF, holds one thread, never both, so other
/// models' prompts go on), and, once one of its prompts ran past
/// `render_timeout`, the reason it is not used again.
pub struct Tokenizers {
    pool: rayon::ThreadPool,
    render_timeout: Duration,
    gates: Mutex<Vec<Gated>>,
}

/// A loaded model's tokenizer (held weakly: a model unloaded drops it) and its gate.
type Gated = (Weak<dyn Tokenizer>, Arc<Gate>);

struct Gate {
    one: Arc<tokio::sync::Semaphore>,
    broken: Mutex<Option<String>>,
}

impl Gate {
    fn broken(&self) -> Option<String> {
        self.broken.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Tokenizers {
    /// `tok`'s gate (made on its first use; a model loaded again has a new
    /// tokenizer, and so a new gate).
    fn gate(&self, tok: &Arc<dyn Tokenizer>) -> Arc<Gate> {
        let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        gates.retain(|(t, _)| t.strong_count() > 0);
        if let Some((_, g)) = gates.iter().find(|(t, _)| t.upgrade().is_some_and(|t| Arc::ptr_eq(&t, tok))) {
            return g.clone();
        }
        let g = Arc::new(Gate { one: Arc::new(tokio::sync::Semaphore::new(1)), broken: Mutex::new(None) });
        gates.push((Arc::downgrade(tok), g.clone()));
        g
    }
}

/// Runs tokenizer work for `tok`'s model on the [`Tokenizers`], off the
/// async runtime: it waits at most `daemon.render_timeout_s` for its
/// model's turn (UNAVAILABLE past it), then runs for at most as long. A run
/// past that fails the call and marks the model: its next calls fail at
/// once, naming why, until it is loaded again; so does a rendering past its
/// process's memory bound (`daemon.render_memory_mb`, revis_engine::render).
/// A rendering past the time is killed a little later (its process), which
/// frees its model's turn and its thread.
pub(super) async fn blocking<T: Send + 'static>(
    tokenizers: &Tokenizers,
    tok: &Arc<dyn Tokenizer>,
    f: impl FnOnce() -> Result<T, EngineError> + Send + 'static,
) -> Result<T, DaemonError> {
    let gate = tokenizers.gate(tok);
    if let Some(why) = gate.broken() {
        return Err(DaemonError::TemplateBroken(why));
    }
    let limit = tokenizers.render_timeout;
    // Marks the model (once: the first reason stays) and fails the call.
    let mark = |gate: &Gate, what: String| {
        let why = gate.broken().unwrap_or_else(|| {
            let why = format!(
                "this model's chat template {what}, so revisd stopped using it: its GGUF's template may be broken or \
                 hostile. `revis unload` the tier and use it again to try once more, or give the tier another model"
            );
            *gate.broken.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
            tracing::warn!("{why}");
            why
        });
        DaemonError::TemplateBroken(why)
    };
    let past = |gate: &Gate| mark(gate, format!("took over {}s to render one prompt (daemon.render_timeout_s)", limit.as_secs()));
    // The model's turn: behind its other prompts, or one that ran past the limit.
    let turn = match tokio::time::timeout(limit, gate.one.clone().acquire_owned()).await {
        Ok(Ok(turn)) => turn,
        Ok(Err(_)) => return Err(DaemonError::ShuttingDown),
        Err(_) => {
            return Err(gate.broken().map(DaemonError::TemplateBroken).unwrap_or_else(|| {
                DaemonError::Busy(format!(
                    "this model's other prompts held its tokenizer for over {}s (daemon.render_timeout_s); retry",
                    limit.as_secs()
                ))
            }));
        }
    };
    // Its own rendering has the whole limit.
    let deadline = tokio::time::Instant::now() + limit;
    let (tx, rx) = oneshot::channel();
    tokenizers.pool.spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
        drop(turn);
    });
    match tokio::time::timeout_at(deadline, rx).await {
        // Past its rendering process's bounds (revis_engine::render): memory, or killed past the time.
        Ok(Ok(Ok(Err(EngineError::TemplateLimit { what, bound })))) => {
            let setting = match bound {
                Bound::Memory => "daemon.render_memory_mb",
                Bound::Time => "daemon.render_timeout_s",
            };
            Err(mark(&gate, format!("{what} ({setting})")))
        }
        Ok(Ok(Ok(r))) => r.map_err(DaemonError::from),
        Ok(Ok(Err(_))) => Err(DaemonError::Engine(EngineError::Llama("the tokenizer panicked".into()))),
        Ok(Err(_)) => Err(DaemonError::ShuttingDown),
        Err(_) => Err(past(&gate)),
    }
}

/// What Generate asks of a model besides its messages.
pub(super) struct Asked {
    pub answer_prefix: String,
    pub json: Option<Option<String>>,
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
}

/// Generate's prompt; its grammar when JSON output or function calls were
/// asked for; and, when the model may call, how its calls are written.
pub(super) fn generate(
    tok: &dyn Tokenizer,
    messages: &[Message],
    static_count: usize,
    asked: Asked,
) -> Result<(Prompt, Option<Grammar>, Option<ToolSyntax>), EngineError> {
    let Asked { answer_prefix, json, tools, tool_choice, parallel_tool_calls } = asked;
    let plan = tools::plan(tok.tool_format(), messages, &tools, &tool_choice, parallel_tool_calls, |s| tok.json_grammar(Some(s)))?;
    if let Some(g) = &plan.grammar {
        tok.check_grammar(g)?;
    }
    // The generic prompt may add a system message: the static part grows by it.
    let static_count = static_count + plan.messages.len().saturating_sub(messages.len());
    let mut prompt = build_prompt(tok, &plan.messages, &plan.tools, static_count)?;
    // Continuing an answer: its text so far follows the turn's
    // opening, as the model's own text (special-token names in it
    // stay text).
    if !answer_prefix.is_empty() {
        prompt.continue_answer(&tok.tokenize_plain(&answer_prefix));
    }
    let json = json.map(|schema| tok.json_grammar(schema.as_deref()).map(Grammar::strict)).transpose()?;
    Ok((prompt, plan.grammar.or(json), plan.syntax))
}

/// Score's prefix and its continuations, tokenized.
pub(super) fn score(
    tok: &dyn Tokenizer,
    messages: &[Message],
    static_count: usize,
    prefix: &str,
    continuations: &[String],
) -> Result<(Prompt, Vec<Vec<Token>>), EngineError> {
    let prefix = if messages.is_empty() {
        // Plain text: the prefix alone, in the usual batches.
        let tokens = build_score_prefix(tok, messages, prefix)?;
        Prompt { split: tokens.len(), answer: tokens.len(), tokens }
    } else {
        // A conversation: as Generate builds it, `prefix` as its answer so far.
        let mut prompt = build_prompt(tok, messages, &[], static_count)?;
        if !prefix.is_empty() {
            prompt.continue_answer(&tok.tokenize_plain(prefix));
        }
        prompt
    };
    Ok((prefix, continuations.iter().map(|c| tok.tokenize_plain(c)).collect::<Vec<_>>()))
}

/// Embed's texts, tokenized.
pub(super) fn embed(tok: &dyn Tokenizer, inputs: &[String]) -> Vec<Vec<Token>> {
    inputs.iter().map(|t| tok.tokenize(t, true)).collect()
}

/// A prompt longer than the model's context.
pub(super) fn too_long(tokens: usize, n_ctx: u32, tier: Tier) -> DaemonError {
    DaemonError::Invalid(format!(
        "the prompt is {tokens} tokens; {tier}'s context holds {n_ctx} tokens (config daemon.context or tiers.{tier}.context), so shorten the conversation"
    ))
}

/// The characters of a generation's functions, system text and the rest
/// of its conversation: what took the room of a prompt too long.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Shares {
    pub tools: (usize, usize),
    pub system: usize,
    pub conversation: usize,
}

impl Shares {
    pub(super) fn of(messages: &[Message], tools: &[revis_engine::Tool]) -> Shares {
        let chars = |m: &Message| m.content.len() + m.tool_calls.iter().map(|c| c.name.len() + c.arguments.len()).sum::<usize>();
        Shares {
            tools: (tools.len(), tools.iter().map(|t| t.name.len() + t.description.len() + t.parameters.len()).sum()),
            system: messages.iter().filter(|m| m.role == revis_engine::Role::System).map(chars).sum(),
            conversation: messages.iter().filter(|m| m.role != revis_engine::Role::System).map(chars).sum(),
        }
    }
}

/// [`too_long`] for a generation, saying about how much of the prompt its
/// functions, its system text and its conversation took (shared out by
/// their characters), since an agent's functions and instructions alone
/// may not fit, and then shortening the conversation does not help.
pub(super) fn too_long_with(tokens: usize, n_ctx: u32, tier: Tier, shares: Shares) -> DaemonError {
    let total = (shares.tools.1 + shares.system + shares.conversation).max(1);
    let about = |chars: usize| chars * tokens / total;
    let mut parts = vec![format!("the conversation about {}", about(shares.conversation))];
    if shares.system > 0 {
        parts.insert(0, format!("the system text about {}", about(shares.system)));
    }
    if shares.tools.0 > 0 {
        parts.insert(0, format!("{} functions about {}", shares.tools.0, about(shares.tools.1)));
    }
    DaemonError::Invalid(format!(
        "the prompt is {tokens} tokens ({}); {tier}'s context holds {n_ctx} tokens (config daemon.context or tiers.{tier}.context): use a model with a longer context, or send less",
        parts.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_too_long_says_what_took_its_room() {
        let tool = Tool { name: "f".into(), description: "d".repeat(699), parameters: String::new() };
        let messages = [Message::new(revis_engine::Role::System, "s".repeat(200)), Message::new(revis_engine::Role::User, "u".repeat(100))];
        let shares = Shares::of(&messages, &[tool]);
        assert_eq!(shares, Shares { tools: (1, 700), system: 200, conversation: 100 });
        let e = too_long_with(5000, 4096, Tier::Tier2, shares).to_string();
        assert!(
            e.contains("the prompt is 5000 tokens (1 functions about 3500, the system text about 1000, the conversation about 500); tier2's context holds 4096 tokens"),
            "{e}"
        );
    }
}
