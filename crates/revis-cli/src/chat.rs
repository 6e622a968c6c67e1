//! `revis chat`: a conversation on the terminal (typing signals, Ctrl-C
//! that stops an answer, `/deep`) or over piped lines, the notes the
//! turns report, and the background work finished before revis ends.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use revis_client::{Runner, Sampling};
use revis_orchestrator::conversation::{Chat, EscalatedBy, TurnNote};
use revis_store::{ConversationId, MessageState, Role, Store};

use crate::input::{Input, Terminal};
use crate::run::print_stats;

#[derive(Args)]
pub struct ChatArgs {
    /// Start a new conversation instead of continuing the latest.
    #[arg(long)]
    new: bool,
    /// Continue this conversation (see `revis history`).
    #[arg(long, conflicts_with = "new")]
    conversation: Option<u64>,
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    max_tokens: Option<u32>,
    /// Print token counts and timings to stderr after each answer.
    #[arg(long)]
    verbose: bool,
    /// Seconds without a keystroke after which typing counts as stopped (background work may run again;
    /// the warm cache stays).
    #[arg(long, default_value_t = 5.0)]
    typing_idle_s: f64,
    /// No quick check by tier1 (typos, kind, whether tier3 should follow up). It runs only where tier1's
    /// model was measured precise enough (docs/QUALITY.md); the two small test models are not.
    #[arg(long)]
    no_check: bool,
    /// tier2 goes through a private checklist before answering (language, tone, escalate, draft). Off by
    /// default: it makes the small models' answers worse (docs/QUALITY.md).
    #[arg(long)]
    checklist: bool,
    /// tier3 follows an answer up by itself when tier1 or the checklist escalates (otherwise it says so, and
    /// /deep asks).
    #[arg(long)]
    auto_deep: bool,
    /// The longest deeper follow-up tier3 writes (after an escalation or /deep), in tokens.
    #[arg(long, default_value_t = revis_orchestrator::conversation::DEEP_MAX_TOKENS)]
    deep_max_tokens: u32,
    /// How often, in milliseconds, a streaming answer's text is saved while it grows (what a crash of the
    /// machine may lose; Ctrl-C loses nothing).
    #[arg(long, hide = true, default_value_t = revis_orchestrator::conversation::PARTIAL_SAVE_EVERY.as_millis() as u64)]
    save_every_ms: u64,
    /// Learn nothing from this conversation: no fact about you is taken from it (what revis already knows
    /// is still used; `revis profile` shows it).
    #[arg(long)]
    no_memory: bool,
    /// Let an answer that repeats itself run on to its end (for tests that need a long answer).
    #[arg(long, hide = true)]
    no_loop_guard: bool,
}
pub(crate) async fn chat<D: Runner>(daemon: D, store: Store, a: ChatArgs) -> anyhow::Result<ExitCode> {
    let conversation = match (a.conversation, a.new) {
        (Some(id), _) => {
            let id = ConversationId(id);
            store.conversation(id)?.with_context(|| format!("there is no conversation {id}; `revis history` lists them"))?;
            id
        }
        (None, false) if !store.conversations()?.is_empty() => store.conversations()?[0].id,
        _ => store.create_conversation("")?,
    };
    let mut chat = Chat::new(daemon, store.clone(), conversation, revis_orchestrator::Policies::default());
    chat.sampling = Sampling { temperature: a.temperature, ..Default::default() };
    chat.max_tokens = a.max_tokens;
    chat.partial_save_every = std::time::Duration::from_millis(a.save_every_ms);
    chat.quick_check = !a.no_check;
    chat.checklist = a.checklist;
    chat.auto_deep = a.auto_deep;
    chat.deep_max_tokens = Some(a.deep_max_tokens);
    chat.titling = true;
    chat.loop_guard = !a.no_loop_guard;
    chat.learn = !a.no_memory;
    // The rules and checks measured for the models that answer (docs/QUALITY.md).
    chat.fit_to_model().await?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        chat.typing_idle = std::time::Duration::from_secs_f64(a.typing_idle_s.max(0.1));
    }
    // What the turns' gears report (corrections, escalations, tier3's follow-ups).
    let notes = tokio::sync::Mutex::new(chat.notes());
    let interrupt = Interrupt::install()?;
    // Whether the answer ran to its end; Ctrl-C stops it, and revis then ends once what was printed is saved.
    let send = |text: String| {
        let (chat, verbose, interrupt, notes) = (&chat, a.verbose, &interrupt, &notes);
        async move {
            let mut out = std::io::stdout();
            let mut first = true;
            let turn = chat.send(&text, |t| {
                if std::mem::take(&mut first)
                    && let Ok(mut rx) = notes.try_lock()
                {
                    // A correction tier1 made before the answer: said before it.
                    print_notes(&mut rx);
                }
                let _ = out.write_all(t.as_bytes());
                let _ = out.flush();
            });
            let Some(done) = interrupt.unless_interrupted(turn).await else {
                // The turn was dropped and handed what it printed to the store's writer: wait for it.
                println!();
                chat.saved().await?;
                eprintln!("revis: stopped; the answer so far is kept, marked incomplete");
                return anyhow::Ok(false);
            };
            let done = done?;
            println!();
            if verbose {
                print_stats(&done);
            }
            print_notes(&mut *notes.lock().await);
            anyhow::Ok(true)
        }
    };
    if interactive {
        let n = store.messages(conversation)?.len();
        eprintln!(
            "revis chat, conversation {conversation}{} (Ctrl-D ends); {DEEP_COMMAND} has tier3 go deeper on the last answer",
            if n > 0 { format!(", {n} messages so far") } else { String::new() }
        );
        let mut term = Terminal::start("> ")?;
        loop {
            let ev = tokio::select! {
                ev = term.events.recv() => ev,
                note = async {
                    chat.typing_paused().await;
                    notes.lock().await.recv().await
                } => {
                    // Something arrived while the user reads (not while they type): printed above the line.
                    if let Ok(note) = note
                        && let Some(text) = describe_note(&note)
                    {
                        term.print(text);
                    }
                    continue;
                }
            };
            let Some(ev) = ev else { break };
            match ev {
                // Typing holds background work until a pause of --typing-idle-s; the first key warms the cache.
                Input::TypingStarted => chat.keystroke(true, None)?,
                Input::Typing(draft) => chat.keystroke(false, Some(&draft))?,
                Input::Line(line) if line.trim().is_empty() => {
                    chat.typing_stopped();
                    term.next();
                }
                Input::Line(line) if line.trim() == DEEP_COMMAND => {
                    chat.typing_stopped();
                    eprintln!("revis: {}", go_deeper(&chat, &store).await?);
                    term.next();
                }
                Input::Line(line) => {
                    if !send(line).await? {
                        return Ok(ExitCode::from(INTERRUPTED));
                    }
                    term.next();
                }
                Input::End => break,
            }
        }
        // The key that ended the input (Ctrl-D on an empty line) was reported as the start of typing, which holds
        // background work: release it, or the wait below never ends.
        chat.typing_stopped();
    } else {
        for line in std::io::stdin().lock().lines() {
            let line = line?;
            if line.trim() == DEEP_COMMAND {
                eprintln!("revis: {}", go_deeper(&chat, &store).await?);
            } else if !line.trim().is_empty() && !send(line).await? {
                return Ok(ExitCode::from(INTERRUPTED));
            }
        }
    }
    if chat.background_outstanding() > 0 {
        // On a terminal the person gets the shell back now, and the work
        // goes on in this process, apart from the terminal (crate::detach);
        // piped, a script's next command expects it done.
        if interactive && crate::detach::armed() {
            eprintln!(
                "revis: the profile, summaries and tier3's follow-ups are finished in the background (process {}); `revis history` shows them",
                std::process::id()
            );
            crate::detach::release();
            // Apart from the terminal nobody would notice it hang (its
            // daemon gone for good): it gives up after DETACHED_LIMIT.
            if tokio::time::timeout(DETACHED_LIMIT, chat.background_done()).await.is_err() {
                tracing::warn!("background work unfinished after {DETACHED_LIMIT:?}; given up");
            }
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!("revis: finishing background work (profile, summary, tier3's follow-ups)...");
        chat.background_done().await;
    }
    print_notes(&mut *notes.lock().await);
    Ok(ExitCode::SUCCESS)
}

/// How long `revis chat`'s background work may go on after the terminal
/// was given back (crate::detach).
const DETACHED_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// The line that asks tier3 to go deeper on the last answer.
const DEEP_COMMAND: &str = "/deep";

/// `/deep`: tier3's follow-up of the conversation's last answer.
async fn go_deeper<D: Runner>(chat: &Chat<D>, store: &Store) -> anyhow::Result<&'static str> {
    let last =
        store.messages(chat.conversation)?.into_iter().rev().find(|m| m.role == Role::Assistant && m.state == MessageState::Complete);
    Ok(match last {
        None => "there is no answer to go deeper on yet",
        Some(m) if chat.deepen(m.id).await => "tier3 will follow the last answer up as soon as you pause",
        Some(_) => "tier3 was already asked to follow the last answer up",
    })
}

/// Prints what the gears reported since the last time (blocking nothing).
fn print_notes(rx: &mut tokio::sync::broadcast::Receiver<TurnNote>) {
    while let Ok(note) = rx.try_recv() {
        if let Some(text) = describe_note(&note) {
            match note {
                TurnNote::Deep { .. } => println!("{text}"),
                _ => eprintln!("{text}"),
            }
        }
    }
}

/// A note as `revis chat` shows it; None for those it keeps quiet about.
fn describe_note(note: &TurnNote) -> Option<String> {
    Some(match note {
        TurnNote::Checked { check, .. } if check.corrections.is_empty() => return None,
        TurnNote::Checked { check, before_answer, .. } => {
            let fixes: Vec<String> = check.corrections.iter().map(|c| format!("{} → {}", c.wrong, c.right)).collect();
            if *before_answer {
                format!("revis: read as \"{}\" ({})", check.corrected, fixes.join(", "))
            } else {
                format!("revis: tier1 noticed a typo: {}", fixes.join(", "))
            }
        }
        TurnNote::Escalated { escalation, queued, .. } => {
            let who = match escalation.by {
                EscalatedBy::Check => "tier1's check",
                EscalatedBy::Checklist => "tier2's checklist",
                EscalatedBy::User => return None,
            };
            let why = escalation.why.as_deref().map(|w| format!(" ({w})")).unwrap_or_default();
            if *queued {
                format!("revis: {who} asked tier3 to go deeper{why}; it follows when you pause")
            } else {
                format!("revis: {who} thinks this needs the deep tier{why}; {DEEP_COMMAND} asks tier3")
            }
        }
        TurnNote::DeepStarted { tier, .. } => format!("revis: {tier} is writing a deeper follow-up..."),
        TurnNote::Deep { text, .. } => format!("\n--- deeper (tier3) ---\n{text}\n---"),
        TurnNote::DeepFailed { error, .. } => format!("revis: tier3's follow-up failed: {error}"),
    })
}

/// The exit status after Ctrl-C (128 + SIGINT, as the shell reports a process it ended).
const INTERRUPTED: u8 = 130;

/// Ctrl-C in `revis chat`: while an answer streams it stops the answer (the
/// caller saves what was printed, then exits); at any other moment revis
/// ends at once, as it would without a handler. Each answer has its own
/// stop signal, so a Ctrl-C that comes as one answer ends is not left over
/// to stop the next one.
#[derive(Clone, Default)]
struct Interrupt {
    /// The stop signal of the answer streaming now, if one is.
    turn: std::sync::Arc<std::sync::Mutex<Option<std::sync::Arc<tokio::sync::Notify>>>>,
}

impl Interrupt {
    fn install() -> anyhow::Result<Interrupt> {
        let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).context("watching for Ctrl-C")?;
        let it = Interrupt::default();
        let handler = it.clone();
        tokio::spawn(async move {
            while sigint.recv().await.is_some() {
                if !handler.interrupt() {
                    std::process::exit(INTERRUPTED.into());
                }
            }
        });
        Ok(it)
    }

    /// A Ctrl-C: stops the answer streaming now; false when none is.
    fn interrupt(&self) -> bool {
        match &*self.turn.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(stop) => {
                stop.notify_one();
                true
            }
            None => false,
        }
    }

    /// Runs `f` to its end, or drops it on Ctrl-C (None).
    async fn unless_interrupted<T>(&self, f: impl std::future::Future<Output = T>) -> Option<T> {
        let stop = std::sync::Arc::new(tokio::sync::Notify::new());
        *self.turn.lock().unwrap_or_else(|e| e.into_inner()) = Some(stop.clone());
        let r = tokio::select! {
            r = f => Some(r),
            () = stop.notified() => None,
        };
        // A Ctrl-C after this turn's end is spent on this turn's signal, dropped here.
        *self.turn.lock().unwrap_or_else(|e| e.into_inner()) = None;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::{Interrupt, describe_note};
    use revis_orchestrator::check::{Correction, QuickCheck, RequestKind};
    use revis_orchestrator::conversation::TurnNote;
    use revis_store::{ConversationId, MessageId};

    fn checked(corrections: &[(&str, &str)], before_answer: bool) -> TurnNote {
        let message = "Waht is teh tiem?";
        let corrections: Vec<Correction> = corrections.iter().map(|(w, r)| Correction { wrong: (*w).into(), right: (*r).into() }).collect();
        let check = QuickCheck {
            corrected: revis_orchestrator::check::apply(message, &corrections),
            corrections,
            kind: RequestKind::Question,
            escalate: false,
        };
        TurnNote::Checked { reply: MessageId { conversation: ConversationId(1), seq: 1 }, check, before_answer }
    }

    /// `revis: read as "..."` says exactly when the answer was to a corrected
    /// message: what was answered and each fix; a check after the answer
    /// only names the typos, and one that found none says nothing.
    #[test]
    fn read_as_is_said_when_and_only_when_a_corrected_message_was_answered() {
        let two = [("teh", "the"), ("tiem", "time")];
        assert_eq!(describe_note(&checked(&two, true)).as_deref(), Some("revis: read as \"Waht is the time?\" (teh → the, tiem → time)"));
        assert_eq!(describe_note(&checked(&two, false)).as_deref(), Some("revis: tier1 noticed a typo: teh → the, tiem → time"));
        assert_eq!(describe_note(&checked(&[], true)), None, "nothing corrected, nothing said");
        assert_eq!(describe_note(&checked(&[], false)), None);
    }

    /// A Ctrl-C that comes as an answer ends (its signal already sent, the
    /// turn not yet cleared) must not stop the next answer at once.
    #[tokio::test]
    async fn a_ctrl_c_as_an_answer_ends_does_not_stop_the_next() {
        let it = Interrupt::default();
        let _ = it
            .unless_interrupted(async {
                assert!(it.interrupt(), "an answer is streaming");
                1
            })
            .await;
        let next = it
            .unless_interrupted(async {
                tokio::task::yield_now().await;
                2
            })
            .await;
        assert_eq!(next, Some(2));
        // A Ctrl-C during an answer still stops it; between answers, revis ends.
        let stopped = it
            .unless_interrupted(async {
                it.interrupt();
                std::future::pending::<()>().await
            })
            .await;
        assert_eq!(stopped, None);
        assert!(!it.interrupt(), "no answer streams: revis ends");
    }
}
