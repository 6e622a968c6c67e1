//! `revis-bench faults` chat-kill: `revis chat` killed with SIGKILL at random moments
//! of its answer, one process after another against one revisd and one
//! store; afterwards the store is opened and every turn checked against
//! what the process had printed: nothing the store reported complete is
//! lost, a complete reply holds exactly what was shown, and a cut reply is
//! marked incomplete with a prefix of what was shown.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use revis_store::{MessageState, Role, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::daemon::{Daemon, Launch};

/// Share of the kills timed from the process's start (anywhere: before it
/// connected, while it writes the user's message); the rest are timed from
/// the first text of the answer.
const FROM_START_SHARE: f64 = 0.25;
/// A process that printed nothing this long after its start is killed anyway.
const OUTPUT_CAP: Duration = Duration::from_secs(30);
/// How long a killed process's pipes may take to reach their end.
const REAP_DEADLINE: Duration = Duration::from_secs(10);
/// What `revis chat --verbose` prints to stderr once the answer was stored complete.
const COMPLETE_MARKER: &str = " prompt tokens (";
/// What the CLI prints when it had to move a damaged database aside.
const RECOVERED_MARKER: &str = "could not be read";

const TOPICS: &[&str] = &[
    "Describe how a bicycle works, step by step.",
    "Explain how bread is made, in detail.",
    "Tell me a story about a lighthouse keeper.",
    "List ten facts about the moon.",
    "How do plants turn sunlight into food?",
    "Write a poem about the sea and the wind.",
];

#[derive(Clone, Debug)]
pub struct Settings {
    pub kills: u32,
    /// The kill comes 0..window after the first answer text (or after the start).
    pub window: Duration,
    pub max_tokens: u32,
}

/// One process: what it was asked, what it printed, how it ended.
struct Turn {
    question: String,
    stdout: String,
    reported_complete: bool,
    when: When,
    /// Start → first answer text, if any came.
    first_text: Option<Duration>,
    /// Start → reaped.
    wall: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum When {
    BeforeText,
    MidAnswer,
    AfterComplete,
    ExitedByItself,
}

impl When {
    fn label(self) -> &'static str {
        match self {
            When::BeforeText => "before any answer text",
            When::MidAnswer => "mid-answer",
            When::AfterComplete => "after the answer was stored complete",
            When::ExitedByItself => "exited by itself (not killed)",
        }
    }
}

#[derive(Default)]
pub struct Result {
    pub iterations: u32,
    pub when: Vec<(&'static str, u32)>,
    pub complete: u32,
    pub incomplete_with_text: u32,
    pub incomplete_empty: u32,
    /// Turns with no reply record: killed before the reply was begun.
    pub no_reply: u32,
    /// Turns whose conversation never got its title: killed before anything of the turn was stored.
    pub no_conversation: u32,
    /// Characters shown but not in the stored incomplete reply.
    pub unsaved_chars: Vec<f64>,
    pub violations: Vec<String>,
    /// Per process: start → first answer text (those that printed any), and start → reaped, ms.
    pub first_text_ms: Vec<f64>,
    pub wall_ms: Vec<f64>,
    pub elapsed: Duration,
    pub log_tail: String,
}

impl Result {
    pub fn violations(&self) -> u64 {
        self.violations.len() as u64
    }
}

pub async fn run(revisd: &Path, revis: &Path, model: &Path, launch: Launch<'_>, s: &Settings, seed: u64) -> anyhow::Result<Result> {
    let data = tempfile::Builder::new().prefix("revis-bench-store-").tempdir()?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xC4A7_0000_0000_0001);
    let mut turns = Vec::new();
    let (elapsed, log_tail) = Daemon::around(revisd, model, launch, async |d| {
        let started = Instant::now();
        for i in 0..s.kills {
            let question = format!("Q{i}: {}", TOPICS[rng.random_range(0..TOPICS.len())]);
            let from_start = rng.random_bool(FROM_START_SHARE);
            let delay = Duration::from_micros(rng.random_range(0..=s.window.as_micros() as u64));
            let turn = one(revis, &d.socket, data.path(), &question, s.max_tokens, from_start, delay).await?;
            if (i + 1) % 100 == 0 {
                eprintln!("revis-bench: chat-kill: {} of {} ({:.0} s)", i + 1, s.kills, started.elapsed().as_secs_f64());
            }
            turns.push(turn);
        }
        Ok((started.elapsed(), d.log_tail()))
    })
    .await?;
    let dir = data.path().join("db");
    let mut result = tokio::task::spawn_blocking(move || check(&dir, &turns)).await??;
    result.iterations = s.kills;
    result.elapsed = elapsed;
    result.log_tail = log_tail;
    Ok(result)
}

/// Runs one `revis chat --new`, kills it as told, and returns what it printed.
async fn one(
    revis: &Path,
    socket: &Path,
    data: &Path,
    question: &str,
    max_tokens: u32,
    from_start: bool,
    delay: Duration,
) -> anyhow::Result<Turn> {
    let mut child = tokio::process::Command::new(revis)
        .args(["chat", "--new", "--verbose", "--max-tokens", &max_tokens.to_string()])
        .env("REVIS_SOCKET", socket)
        .env("REVIS_DATA_DIR", data)
        .env_remove("REVIS_NODE")
        .env_remove("REVIS_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let spawned = Instant::now();
    let pid = child.id().context("revis chat exited at once")?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    // The whole input at once, then its end: the process answers, then exits.
    let _ = stdin.write_all(format!("{question}\n").as_bytes()).await;
    drop(stdin);
    let out = Arc::new(Mutex::new(Vec::new()));
    let err = Arc::new(Mutex::new(Vec::new()));
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<Instant>();
    let stdout_reader = tokio::spawn(collect(child.stdout.take().expect("piped stdout"), out.clone(), Some(first_tx)));
    let stderr_reader = tokio::spawn(collect(child.stderr.take().expect("piped stderr"), err.clone(), None));

    let first_text = Mutex::new(None);
    let exited = async {
        if from_start {
            tokio::time::sleep(delay).await;
        } else {
            // The first answer text (or the process's end), then the delay.
            if let Ok(Ok(at)) = tokio::time::timeout(OUTPUT_CAP, first_rx).await {
                *first_text.lock().expect("time") = Some(at - spawned);
            }
            tokio::time::sleep(delay).await;
        }
    };
    let mut by_itself = false;
    tokio::select! {
        () = exited => {}
        _ = child.wait() => by_itself = true,
    }
    let mut when = When::ExitedByItself;
    if !by_itself {
        // What the process had printed by now decides what the kill interrupted.
        let text_seen = !out.lock().expect("buffer").is_empty();
        let complete_seen = String::from_utf8_lossy(&err.lock().expect("buffer")).contains(COMPLETE_MARKER);
        // SAFETY: kill by the PID of our own child, not yet reaped (wait() has not returned).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        when = if complete_seen {
            When::AfterComplete
        } else if text_seen {
            When::MidAnswer
        } else {
            When::BeforeText
        };
    }
    let _ = child.wait().await?;
    let _ = tokio::time::timeout(REAP_DEADLINE, async {
        let _ = stdout_reader.await;
        let _ = stderr_reader.await;
    })
    .await;
    let wall = spawned.elapsed();
    let first_text = first_text.into_inner().expect("time");
    let stdout = String::from_utf8_lossy(&out.lock().expect("buffer")).into_owned();
    let stderr = String::from_utf8_lossy(&err.lock().expect("buffer")).into_owned();
    let reported_complete = stderr.contains(COMPLETE_MARKER);
    if stderr.contains(RECOVERED_MARKER) {
        anyhow::bail!("`revis chat` found the store damaged after a kill:\n{stderr}");
    }
    Ok(Turn { question: question.to_owned(), stdout, reported_complete, when, first_text, wall })
}

/// Reads a pipe to its end into `buf`; signals `first` at the first byte.
async fn collect(
    mut pipe: impl tokio::io::AsyncRead + Unpin,
    buf: Arc<Mutex<Vec<u8>>>,
    mut first: Option<tokio::sync::oneshot::Sender<Instant>>,
) {
    let mut chunk = [0u8; 4096];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                buf.lock().expect("buffer").extend_from_slice(&chunk[..n]);
                if let Some(tx) = first.take() {
                    let _ = tx.send(Instant::now());
                }
            }
        }
    }
}

/// Opens the store and checks every turn against what its process printed.
fn check(dir: &Path, turns: &[Turn]) -> anyhow::Result<Result> {
    let mut r = Result::default();
    let opened = Store::open(dir)?;
    if let Some(rec) = &opened.recovered {
        r.violations.push(format!("the store was damaged and moved aside: {rec}"));
    }
    let store = opened.store;
    let mut by_title: HashMap<String, Vec<revis_store::ConversationId>> = HashMap::new();
    for c in store.conversations()? {
        by_title.entry(c.title.clone()).or_default().push(c.id);
    }
    let mut when: HashMap<When, u32> = HashMap::new();
    for t in turns {
        *when.entry(t.when).or_default() += 1;
        r.wall_ms.push(t.wall.as_secs_f64() * 1e3);
        if let Some(f) = t.first_text {
            r.first_text_ms.push(f.as_secs_f64() * 1e3);
        }
        let title: String = t.question.chars().take(60).collect();
        // What the user saw of the answer: stdout, less the newline printed after a finished answer.
        let shown = t.stdout.strip_suffix('\n').filter(|_| t.reported_complete).unwrap_or(&t.stdout);
        let ids = by_title.get(&title).map(Vec::as_slice).unwrap_or_default();
        let [id] = ids else {
            if ids.len() > 1 {
                r.violations.push(format!("{title:?}: {} conversations with this title", ids.len()));
            } else if t.reported_complete || !shown.is_empty() {
                r.violations.push(format!(
                    "{title:?}: the answer was shown{} but its conversation is not in the store",
                    if t.reported_complete { " and reported complete" } else { "" }
                ));
            } else {
                r.no_conversation += 1;
            }
            continue;
        };
        let messages = store.messages(*id)?;
        let user: Vec<_> = messages.iter().filter(|m| m.role == Role::User).collect();
        let replies: Vec<_> = messages.iter().filter(|m| m.role == Role::Assistant).collect();
        if replies.len() > 1 || user.len() > 1 {
            r.violations.push(format!("{title:?}: {} user messages and {} replies for one turn", user.len(), replies.len()));
            continue;
        }
        if let Some(u) = user.first()
            && u.text != t.question
        {
            r.violations.push(format!("{title:?}: the user's message was stored as {:?}", u.text));
        }
        let Some(reply) = replies.first() else {
            if t.reported_complete || !shown.is_empty() {
                r.violations.push(format!("{title:?}: {} chars were shown but there is no reply record", shown.len()));
            } else {
                r.no_reply += 1;
            }
            continue;
        };
        if user.is_empty() {
            r.violations.push(format!("{title:?}: a reply without the user's message"));
        }
        match reply.state {
            MessageState::Complete => {
                r.complete += 1;
                if reply.text != shown {
                    r.violations.push(format!(
                        "{title:?}: stored complete with {} chars, but {} chars were shown ({:?} against {:?})",
                        reply.text.len(),
                        shown.len(),
                        tail(&reply.text),
                        tail(shown)
                    ));
                }
            }
            MessageState::Incomplete => {
                if t.reported_complete {
                    r.violations.push(format!("{title:?}: reported complete, but stored incomplete"));
                }
                if reply.text.is_empty() {
                    r.incomplete_empty += 1;
                } else {
                    r.incomplete_with_text += 1;
                }
                if shown.starts_with(&reply.text) {
                    r.unsaved_chars.push((shown.chars().count() - reply.text.chars().count()) as f64);
                } else {
                    r.violations.push(format!(
                        "{title:?}: the incomplete reply's {} chars are not what was shown ({:?} against {:?})",
                        reply.text.len(),
                        tail(&reply.text),
                        tail(shown)
                    ));
                }
            }
        }
    }
    let mut w: Vec<_> = when.into_iter().collect();
    w.sort();
    r.when = w.into_iter().map(|(k, n)| (k.label(), n)).collect();
    Ok(r)
}

/// The last 40 characters, for a report line.
fn tail(s: &str) -> String {
    let n = s.chars().count();
    s.chars().skip(n.saturating_sub(40)).collect()
}

pub fn report(r: &Result, s: &Settings) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "#### kill -9 of `revis chat` mid-answer: {} processes\n", r.iterations);
    let _ = writeln!(
        out,
        "One `revis chat --new --max-tokens {}` after another, a question on its stdin, against one revisd and one store (`REVIS_DATA_DIR` in a temporary directory); each is killed with SIGKILL {} ms after its first answer text (for {:.0}% of them: after its start) unless it exited first. Then the store is opened and each turn checked against what its process printed: a reply the process reported stored (`--verbose` prints its numbers after the store said complete) must be there, complete; a complete reply must hold exactly the text shown; an incomplete one a prefix of it. {:.1} s in all.\n",
        s.max_tokens,
        format_args!("0–{}", s.window.as_millis()),
        FROM_START_SHARE * 100.0,
        r.elapsed.as_secs_f64()
    );
    let _ = writeln!(out, "| killed | processes |\n|---|---|");
    for (label, n) in &r.when {
        let _ = writeln!(out, "| {label} | {n} |");
    }
    let _ = writeln!(
        out,
        "\n| stored as | turns |\n|---|---|\n| complete | {} |\n| incomplete, with text | {} |\n| incomplete, empty | {} |\n| no reply yet (user message only) | {} |\n| nothing (killed before the turn was stored) | {} |\n| **violations** | {} |\n",
        r.complete,
        r.incomplete_with_text,
        r.incomplete_empty,
        r.no_reply,
        r.no_conversation,
        r.violations.len()
    );
    let med = |v: &[f64]| super::tally::percentile(v, 50.0).map_or("n/a".to_owned(), |x| format!("{x:.0}"));
    let _ = writeln!(
        out,
        "- Per process: start to first answer text median {} ms (of those timed from it), start to reaped median {} ms.",
        med(&r.first_text_ms),
        med(&r.wall_ms)
    );
    if !r.unsaved_chars.is_empty() {
        let p = |q| super::tally::percentile(&r.unsaved_chars, q).unwrap_or(0.0);
        let _ = writeln!(
            out,
            "- Text shown but not in the stored incomplete reply (lost to the kill, since the last periodic save): median {:.0}, p99 {:.0}, max {:.0} characters over {} cut replies.",
            p(50.0),
            p(99.0),
            p(100.0),
            r.unsaved_chars.len()
        );
    }
    if !r.violations.is_empty() {
        let _ = writeln!(out, "- Violations (first {}):", r.violations.len().min(super::tally::MAX_EXAMPLES));
        for v in r.violations.iter().take(super::tally::MAX_EXAMPLES) {
            let _ = writeln!(out, "  - {}", v.replace('\n', " "));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(question: &str, stdout: &str, reported_complete: bool) -> Turn {
        Turn {
            question: question.into(),
            stdout: stdout.into(),
            reported_complete,
            when: When::MidAnswer,
            first_text: None,
            wall: Duration::ZERO,
        }
    }

    /// A store holding one turn per (question, reply text, complete?).
    fn store_with(dir: &Path, turns: &[(&str, Option<(&str, bool)>)]) {
        let store = Store::open(dir).unwrap().store;
        for (q, reply) in turns {
            let c = store.create_conversation("").unwrap();
            store.set_title(c, q).unwrap();
            store.append_user(c, q).unwrap();
            if let Some((text, complete)) = reply {
                let r = store.begin_reply(c, "tier2").unwrap();
                if *complete {
                    store.complete_reply(r, text).unwrap();
                } else if !text.is_empty() {
                    store.update_reply(r, text).unwrap();
                }
            }
        }
        store.flush().unwrap();
    }

    #[test]
    fn what_was_shown_and_reported_must_be_in_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        store_with(
            &db,
            &[
                ("Q0: a", Some(("Hello there.", true))),
                ("Q1: b", Some(("Hel", false))),
                ("Q2: c", Some(("", false))),
                ("Q3: d", None),
                // Broken: reported complete but stored incomplete; a complete text that is not what was shown;
                // an incomplete text that is not a prefix of it.
                ("Q4: e", Some(("Par", false))),
                ("Q5: f", Some(("Something else", true))),
                ("Q6: g", Some(("Nope", false))),
            ],
        );
        let turns = [
            turn("Q0: a", "Hello there.\n", true),
            turn("Q1: b", "Hello", false),
            turn("Q2: c", "He", false),
            turn("Q3: d", "", false),
            turn("Q4: e", "Paris.\n", true),
            turn("Q5: f", "Something", false),
            turn("Q6: g", "Yes", false),
            // Shown, but nothing of it in the store.
            turn("Q7: h", "Lost", false),
        ];
        let r = check(&db, &turns).unwrap();
        assert_eq!((r.complete, r.incomplete_with_text, r.incomplete_empty, r.no_reply), (2, 3, 1, 1));
        assert_eq!(r.violations.len(), 4, "{:#?}", r.violations);
        for (v, q) in r.violations.iter().zip(["Q4", "Q5", "Q6", "Q7"]) {
            assert!(v.starts_with(&format!("\"{q}")), "{v}");
        }
        // Q1 lost 2 characters to the kill, Q2 two, Q4 three.
        assert_eq!(r.unsaved_chars, vec![2.0, 2.0, 3.0]);
    }
}
