//! `revis chat` as a person uses it, against a real revisd: typed at a
//! terminal (a pseudo-terminal the test drives), killed with SIGKILL
//! mid-answer, and a conversation long enough to be summarised.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use revis_client::{CallError, Client, Done, GenerateParams, PrefillParams, Prefilled, Role as Speaker, Runner, Tier};
use revis_orchestrator::conversation::{Chat, PARTIAL_SAVE_EVERY, TURN_BUDGET, rules_for};
use revis_orchestrator::prompt::PromptContext;
use revis_store::{MessageState, Role, Store};
use revis_testkit::TestDaemon;

/// How long one step may take on a busy 2-core machine (a model load, a short answer).
pub(crate) const STEP: Duration = Duration::from_secs(60);

/// What a process wrote to one output, and when each piece came.
#[derive(Default)]
pub(crate) struct Seen {
    bytes: Vec<u8>,
    /// (when, how many bytes had come by then), one per read.
    at: Vec<(Instant, usize)>,
    pub(crate) ended: bool,
}

impl Seen {
    /// How many bytes had come by `t`.
    fn len_at(&self, t: Instant) -> usize {
        self.at.iter().take_while(|(when, _)| *when <= t).last().map_or(0, |(_, n)| *n)
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Reads a process's output on a thread of its own, so the test can wait on
/// what it printed.
pub(crate) struct Transcript(Arc<(Mutex<Seen>, Condvar)>);

impl Transcript {
    pub(crate) fn start(mut from: impl Read + Send + 'static) -> Transcript {
        let shared = Arc::new((Mutex::new(Seen::default()), Condvar::new()));
        let t = shared.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                let n = from.read(&mut buf).unwrap_or(0); // a pseudo-terminal whose side closed reads EIO
                let mut seen = t.0.lock().unwrap();
                if n == 0 {
                    seen.ended = true;
                } else {
                    seen.bytes.extend_from_slice(&buf[..n]);
                    let total = seen.bytes.len();
                    seen.at.push((Instant::now(), total));
                }
                t.1.notify_all();
                if n == 0 {
                    return;
                }
            }
        });
        Transcript(shared)
    }

    /// Waits until `done` holds of what came so far (checked at each new
    /// piece, and every 10 ms for conditions on time); panics naming `what`
    /// with the output after `limit`.
    pub(crate) fn wait_until(&self, what: &str, limit: Duration, done: impl Fn(&Seen) -> bool) -> String {
        let deadline = Instant::now() + limit;
        let mut seen = self.0.0.lock().unwrap();
        while !done(&seen) {
            let now = Instant::now();
            assert!(now < deadline && !seen.ended, "{what}: not within {limit:?}; the output was:\n{}", seen.text());
            seen = self.0.1.wait_timeout(seen, (deadline - now).min(Duration::from_millis(10))).unwrap().0;
        }
        seen.text()
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.0.0.lock().unwrap())
    }
}

/// A `revis chat` of a test, killed (SIGKILL) and reaped when dropped, so a
/// test that fails half way leaves no process behind.
pub(crate) struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// Waits for a child's exit; SIGKILL and a panic showing `screen` after `limit`.
pub(crate) fn wait_exit(child: &mut Child, limit: Duration, screen: &Transcript) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("revis did not exit within {limit:?}; the screen:\n{}", screen.with(Seen::text));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `revis chat` on a pseudo-terminal: stdin, stdout and stderr, its
/// controlling terminal in a session of its own. Returns the child and the
/// terminal's other side (what the user types into, what the screen shows).
pub(crate) fn spawn_on_a_terminal(mut cmd: Command) -> (Reaped, std::fs::File) {
    use std::os::unix::process::CommandExt;
    let size = nix::pty::Winsize { ws_row: 24, ws_col: 120, ws_xpixel: 0, ws_ypixel: 0 };
    let pty = nix::pty::openpty(&size, None).expect("a pseudo-terminal");
    cmd.stdin(Stdio::from(pty.slave.try_clone().unwrap()))
        .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
        .stderr(Stdio::from(pty.slave))
        // rustyline edits lines only on a terminal it knows (not "dumb").
        .env("TERM", "xterm");
    // SAFETY: prctl, setsid and ioctl are async-signal-safe; they run in the child between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // Killed with the test, even one killed with SIGKILL: in a session of its own, nothing else would.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1
                || libc::setsid() == -1
                || libc::ioctl(0, libc::TIOCSCTTY as _, 0) == -1
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = Reaped(cmd.spawn().expect("start revis chat"));
    // The command held the terminal's slave side: dropped, so reads end when revis exits.
    drop(cmd);
    (child, std::fs::File::from(pty.master))
}

/// `revis chat --new --temperature 0 --max-tokens N --verbose` over `d`, with
/// data in `data`, on a terminal, once its first prompt shows: the child,
/// the terminal's other side and what it shows.
fn chat_on_a_terminal(d: &revis_testkit::Running, data: &std::path::Path, max_tokens: u32) -> (Reaped, std::fs::File, Transcript) {
    let mut cmd = Command::new(revis_testkit::binary("revis"));
    cmd.args(["chat", "--new", "--temperature", "0", "--max-tokens", &max_tokens.to_string(), "--verbose", "--socket"])
        .arg(&d.socket)
        .env("REVIS_DATA_DIR", data);
    let (child, terminal) = spawn_on_a_terminal(cmd);
    let screen = Transcript::start(terminal.try_clone().unwrap());
    screen.wait_until("the prompt", STEP, |s| prompt_after(&s.text(), "(Ctrl-D ends)"));
    (child, terminal, screen)
}

/// Whether the line editor's prompt (`> `, among its escape sequences) was shown after `mark`.
fn prompt_after(screen: &str, mark: &str) -> bool {
    screen.split_once(mark).is_some_and(|(_, rest)| rest.contains("> "))
}

/// The daemon's count of cached prefixes for tier2 (0 while its model is not loaded).
async fn tier2_prefixes(socket: &std::path::Path) -> u32 {
    let s = Client::connect(socket).await.unwrap().status().await.unwrap();
    s.tier(Tier::Tier2).expect("a tier2").cached_prefixes
}

/// What the profile holds in the keystroke test: a new conversation's
/// static part is then never empty, whatever rules the model has (none, for
/// some: then only the profile is static).
const KNOWN: &str = "The user's name is Ada.";

/// Interactive `revis chat`: the first keystroke on an empty line sends the
/// static part of the next prompt to the daemon (a Prefill), before Enter;
/// the answer then reuses all of it, and is shown and stored.
#[test]
fn the_first_keystroke_prefills_before_enter() {
    let d = TestDaemon::new().start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let data = tempfile::tempdir().unwrap();
    Store::open(&data.path().join("db")).unwrap().store.add_fact(KNOWN, None).unwrap();
    let (mut child, mut terminal, screen) = chat_on_a_terminal(&d, data.path(), 16);
    assert_eq!(rt.block_on(tier2_prefixes(&d.socket)), 0, "nothing is cached before the user types");

    // One key, no Enter: the daemon gets the prefill.
    terminal.write_all(b"W").unwrap();
    let deadline = Instant::now() + STEP;
    while rt.block_on(tier2_prefixes(&d.socket)) == 0 {
        assert!(Instant::now() < deadline, "one keystroke sent no prefill within {STEP:?}; the screen:\n{}", screen.with(Seen::text));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.try_wait().unwrap().is_none(), "revis chat is still waiting for the line");

    // The rest of the line, then Enter (a carriage return, as a terminal sends it).
    let question = "What is the capital of France?";
    terminal.write_all(format!("{}\r", &question[1..]).as_bytes()).unwrap();
    let shown = screen.wait_until("the answer's numbers (--verbose)", STEP, |s| s.text().contains("generated, prompt"));
    let stats = shown.split(" prompt tokens (").nth(1).expect("the numbers");
    let cached: u32 = stats.split(' ').next().unwrap().parse().expect("the cached token count");
    // The static part (the model's rules and the profile; nothing else yet in a new conversation) as the daemon counts it.
    let rules = rules_for(&revis_models::find(revis_models::DEFAULT_MODEL).unwrap().chat);
    let static_part = PromptContext { rules, profile: vec![KNOWN.into()], ..Default::default() }.static_messages();
    let static_len = rt.block_on(async {
        let req = PrefillParams { tier: Tier::Tier2, messages: static_part, ..Default::default() };
        Client::connect(&d.socket).await.unwrap().prefill(&req).await.unwrap().prompt_tokens
    });
    assert!(cached >= static_len, "the answer reused {cached} tokens of a {static_len}-token static part: {shown}");

    // Ctrl-D on the empty line: revis exits (background work, if any, goes on apart from the terminal).
    screen.wait_until("the next prompt", STEP, |s| prompt_after(&s.text(), "generated, prompt"));
    terminal.write_all(b"\x04").unwrap();
    let status = wait_exit(&mut child, STEP, &screen);
    let screen = screen.wait_until("the terminal's end", STEP, |s| s.ended).replace("\r\n", "\n");
    assert!(status.success(), "{status:?}; the screen:\n{screen}");

    let store = Store::open(&data.path().join("db")).unwrap().store;
    let conv = store.conversations().unwrap()[0].id;
    let messages = store.messages(conv).unwrap();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0].text, question, "the first key went into the line too");
    let answer = &messages[1];
    assert_eq!(answer.state, MessageState::Complete);
    assert!(!answer.text.is_empty() && screen.contains(&format!("{}\n", answer.text)), "the stored answer {answer:?} was shown:\n{screen}");
}

/// The profile's facts in the database of `data`, as text.
fn facts_in(data: &std::path::Path) -> Vec<String> {
    Store::open(&data.join("db")).unwrap().store.facts().unwrap().into_iter().map(|f| f.text).collect()
}

/// A process this test did not start but must not leave behind (the chat
/// that finishes its work after the terminal is given back): ended by its
/// PID when dropped, if it still runs.
struct Leftover(i32);

impl Leftover {
    /// Running: it exists and has not exited (an exited one waits as a
    /// zombie for whoever adopted it, which may never reap it).
    fn alive(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0)).unwrap_or_default();
        stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    }
}

impl Drop for Leftover {
    fn drop(&mut self) {
        if self.alive() {
            // SAFETY: the PID revis chat named as its own, still running.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
}

/// Leaving an interactive `revis chat` gives the terminal back at once, even
/// while its background work cannot run at all (revisd stopped): the work
/// goes on in the chat's process, apart from the terminal, and stores what
/// waiting for it stores (the same message piped, where revis chat waits
/// for its work, as a script needs). One stream: the turn's background
/// calls (the audit, the profile's extraction) then each run alone, as
/// they must for "the same" to hold; batched together their text may
/// differ in its last bits, whichever process waits (ARCHITECTURE.md,
/// "Batching"), and which ones overlap is a matter of timing.
#[test]
fn leaving_revis_chat_never_waits_for_its_background_work_and_loses_none_of_it() {
    let d = TestDaemon::new().daemon("streams = 1").start();
    let said = "My name is Ada and I live in Lyon, where I teach chemistry.";
    let args = ["chat", "--new", "--temperature", "0", "--max-tokens", "16", "--verbose", "--socket"];

    let piped = tempfile::tempdir().unwrap();
    let out = Command::new(revis_testkit::binary("revis"))
        .args(args)
        .arg(&d.socket)
        .env("REVIS_DATA_DIR", piped.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(format!("{said}\n").as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let waited = facts_in(piped.path());

    let data = tempfile::tempdir().unwrap();
    let (mut child, mut terminal, screen) = chat_on_a_terminal(&d, data.path(), 16);
    terminal.write_all(format!("{said}\r").as_bytes()).unwrap();
    screen.wait_until("the next prompt", STEP, |s| prompt_after(&s.text(), "generated, prompt"));
    // The profile's extraction (a model call of its own) has just been
    // queued after the answer: with revisd stopped it cannot end.
    d.signal(libc::SIGSTOP);
    terminal.write_all(b"\x04").unwrap();
    let status = wait_exit(&mut child, STEP, &screen);
    let shown = screen.wait_until("the terminal's end", STEP, |s| s.ended);
    let leftover = shown
        .split("in the background (process ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .map(Leftover)
        .unwrap_or_else(|| panic!("revis chat said where its background work goes on; the screen:\n{shown}"));
    d.signal(libc::SIGCONT);
    assert!(status.success(), "{status:?}; the screen:\n{shown}");
    assert!(leftover.alive(), "the work goes on after the terminal was given back");

    // It ends once it has done its work, and stored what waiting stores.
    let deadline = Instant::now() + STEP;
    while leftover.alive() {
        assert!(Instant::now() < deadline, "the background work did not end within {STEP:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(facts_in(data.path()), waited, "the profile, with and without waiting");
    let store = Store::open(&data.path().join("db")).unwrap().store;
    let conv = store.conversations().unwrap()[0].id;
    let messages = store.messages(conv).unwrap();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0].text, said);
}

/// Keys typed while an answer streams are not echoed into it: they wait,
/// and the next prompt's line shows them, as a line editor's type-ahead.
#[test]
fn keys_typed_while_an_answer_streams_wait_for_the_next_prompt() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let (mut child, mut terminal, screen) = chat_on_a_terminal(&d, data.path(), 300);
    terminal.write_all(format!("{LONG}\r").as_bytes()).unwrap();
    // Words of the answer (letters, not the line editor's escape sequences after the echoed line).
    screen.wait_until("the answer's first words", STEP, |s| {
        s.text().rsplit_once(LONG).is_some_and(|(_, a)| a.chars().filter(|c| c.is_alphabetic()).count() > 20)
    });
    terminal.write_all(b"qzxv").unwrap();
    let typed_while_streaming = !screen.with(Seen::text).contains("generated, prompt");
    // The line editor draws the prompt, then the keys it reads (cursor moves between them).
    let shown = screen.wait_until("the next prompt, with the keys", STEP, |s| {
        s.text()
            .split_once("generated, prompt")
            .and_then(|(_, after)| after.split_once("> "))
            .is_some_and(|(_, line)| line.contains("qzxv"))
    });
    let (answer, _) = shown.rsplit_once(LONG).unwrap().1.split_once("generated, prompt").unwrap();
    assert!(typed_while_streaming, "the keys came after the answer had ended: nothing was tested; the screen:\n{shown}");
    assert!(!answer.contains("qzxv"), "the keys were echoed into the answer:\n{shown}");
    terminal.write_all(b"\x15\x04").unwrap(); // Ctrl-U (the line cleared), Ctrl-D
    let status = wait_exit(&mut child, STEP, &screen);
    assert!(status.success(), "{status:?}");
}

/// A prompt whose answer runs long (hundreds of tokens at greedy sampling).
const LONG: &str = "Write a long story about a dragon who learns to bake bread, with many details.";

/// What `revis chat` may have printed and not saved when it is killed: the
/// partial-save interval, sled's own write-out of unflushed writes (every
/// 500 ms, see `Store::update_reply`), and room for a busy machine.
const MAY_LOSE: Duration = PARTIAL_SAVE_EVERY.saturating_add(Duration::from_millis(500 + 1000));

/// `revis chat` killed with SIGKILL mid-answer (no handler runs): the
/// store holds the reply incomplete, its text a prefix of what was printed,
/// and everything printed more than [`MAY_LOSE`] before the kill is in it.
#[test]
fn revis_chat_killed_mid_answer_has_saved_what_it_printed() {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let mut child = Reaped(
        Command::new(revis_testkit::binary("revis"))
            .args(["chat", "--new", "--temperature", "0", "--max-tokens", "1000", "--no-loop-guard", "--socket"])
            .arg(&d.socket)
            .env("REVIS_DATA_DIR", data.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    child.stdin.take().unwrap().write_all(format!("{LONG}\n").as_bytes()).unwrap();
    let out = Transcript::start(child.stdout.take().unwrap());
    // Enough text printed long enough ago that the periodic saves must hold it.
    out.wait_until("200 bytes printed, MAY_LOSE ago", STEP, |s| s.len_at(Instant::now() - MAY_LOSE) >= 200);
    assert!(child.try_wait().unwrap().is_none(), "the answer ended before the kill:\n{}", out.with(Seen::text));
    let killed_at = Instant::now();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let printed = out.wait_until("stdout's end", STEP, |s| s.ended);
    let must_hold = out.with(|s| s.len_at(killed_at - MAY_LOSE));

    let store = Store::open(&data.path().join("db")).unwrap().store;
    let conv = store.conversations().unwrap()[0].id;
    let messages = store.messages(conv).unwrap();
    assert_eq!(messages.len(), 2, "{messages:?}");
    let reply = &messages[1];
    assert_eq!((reply.role, reply.state), (Role::Assistant, MessageState::Incomplete), "a cut reply is flagged");
    assert!(printed.starts_with(&reply.text), "the stored reply is not what was printed:\n{:?}\n{printed:?}", reply.text);
    assert!(
        reply.text.len() >= must_hold,
        "{} bytes saved, but {must_hold} were printed {MAY_LOSE:?} before the kill (of {} in all)",
        reply.text.len(),
        printed.len()
    );
}

/// A real daemon, with each Generate request it is asked kept for the test.
#[derive(Clone)]
struct Recording {
    client: Client,
    asked: Arc<Mutex<Vec<GenerateParams>>>,
}

impl Runner for Recording {
    async fn prefill(&self, req: PrefillParams) -> Result<Prefilled, CallError> {
        Runner::prefill(&self.client, req).await
    }

    async fn generate(&self, req: GenerateParams, on_delta: impl FnMut(&str) + Send) -> Result<Done, CallError> {
        self.asked.lock().unwrap().push(req.clone());
        Runner::generate(&self.client, req, on_delta).await
    }

    async fn embed(&self, req: revis_client::EmbedParams) -> Result<revis_client::Embedded, CallError> {
        Runner::embed(&self.client, req).await
    }

    async fn tiers(&self) -> Result<Vec<revis_client::TierStatus>, CallError> {
        Runner::tiers(&self.client).await
    }
}

/// A conversation that outgrows [`TURN_BUDGET`]: after its next turn the
/// older messages are summarised in the background by the real model, the
/// summary is stored, and the prompt of the turn after carries it in place
/// of the messages it covers.
#[tokio::test]
async fn a_long_conversation_is_summarised_and_the_summary_is_used() {
    let d = TestDaemon::new().start();
    let db = tempfile::tempdir().unwrap();
    let store = Store::open(db.path()).unwrap().store;
    // Earlier sessions: TURN_BUDGET messages, complete. One more turn goes over the budget.
    let conv = store.create_conversation("cats").unwrap();
    for i in 1..=TURN_BUDGET / 2 {
        store.append_user(conv, &format!("Note {i}: my cat number {i} is called Tom{i}.")).unwrap();
        let reply = store.begin_reply(conv, "tier2").unwrap();
        store.complete_reply(reply, &format!("Noted: cat {i} is Tom{i}.")).unwrap();
    }
    let daemon = Recording { client: d.client().await, asked: Default::default() };
    let mut chat = Chat::new(daemon.clone(), store.clone(), conv, revis_orchestrator::Policies::default());
    chat.sampling.temperature = Some(0.0);
    chat.max_tokens = Some(16);
    chat.send("How many cats do I have?", |_| {}).await.unwrap();

    // The turn's background work: the summary (first by rank) is stored.
    let deadline = Instant::now() + STEP;
    let summary = loop {
        if let Some(s) = store.summary(conv).unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no summary within {STEP:?} of a turn over the budget");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let messages = store.messages(conv).unwrap();
    assert_eq!(messages.len(), TURN_BUDGET + 2);
    assert!(messages.iter().all(|m| m.state == MessageState::Complete), "{messages:?}");
    // All but the last TURN_BUDGET / 2 messages are summarised.
    let covered = messages.len() - TURN_BUDGET / 2;
    assert_eq!(summary.covers_up_to, messages[covered - 1].id);
    assert!(!summary.text.is_empty());

    // The next turn: the summary in the system message, only the messages after it in full.
    chat.send("Thanks!", |_| {}).await.unwrap();
    let asked = daemon.asked.lock().unwrap().iter().rfind(|r| r.messages.last().is_some_and(|m| m.text == "Thanks!")).cloned();
    let asked = asked.expect("the answer's request");
    let texts: Vec<&str> = asked.messages.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(asked.messages[0].role, Speaker::System);
    assert!(texts[0].ends_with(&format!("Summary of the conversation so far:\n{}", summary.text)), "{texts:?}");
    let mut expected: Vec<&str> = messages[covered..].iter().map(|m| m.text.as_str()).collect();
    expected.push("Thanks!");
    assert_eq!(texts[1..], expected, "the covered messages are left out, the rest shown in full");
}

/// A first turn in a fresh data directory, as `revis chat` and the GUI set
/// it up (`Chat::fit_to_model`), sends what `revis-bench turn` chose for the
/// model it falls back to (docs/QUALITY.md): that model's rules as the whole
/// system message (none when it has none), its sampling left to the daemon,
/// which fills in the model card's, and no quick check where tier1's model
/// was measured too imprecise for one.
#[tokio::test]
async fn a_first_use_turn_sends_the_rules_and_sampling_measured_for_the_model() {
    let d = TestDaemon::new().start();
    let db = tempfile::tempdir().unwrap();
    let store = Store::open(db.path()).unwrap().store;
    let conv = store.create_conversation("").unwrap();
    let daemon = Recording { client: d.client().await, asked: Default::default() };
    let mut chat = Chat::new(daemon.clone(), store.clone(), conv, revis_orchestrator::Policies::default());
    chat.max_tokens = Some(8);
    let gears = chat.fit_to_model().await.unwrap();

    let model = revis_models::find(revis_models::DEFAULT_MODEL).unwrap();
    assert!(gears.measured && gears == model.chat, "the test model's gears are the catalog's: {gears:?}");
    let rules = rules_for(&model.chat);
    assert_eq!(chat.rules, rules);
    assert_eq!(chat.quick_check, model.chat.quick_check);

    let question = "What is the capital of France?";
    chat.send(question, |_| {}).await.unwrap();
    let asked = daemon.asked.lock().unwrap().clone();
    let answer = asked.iter().find(|r| r.format == revis_client::Format::Text).expect("the answer's request");
    let mut expected = Vec::new();
    if !rules.is_empty() {
        expected.push((Speaker::System, rules.clone()));
    }
    expected.push((Speaker::User, question.to_owned()));
    let sent: Vec<(Speaker, String)> = answer.messages.iter().map(|m| (m.role, m.text.clone())).collect();
    assert_eq!(sent, expected, "the first turn's prompt");
    assert_eq!(answer.sampling, revis_client::Sampling::default(), "the sampling is left to the daemon");
    // What the daemon fills in for the model: the card's settings.
    let card = revis_models::sampling_defaults(revis_models::DEFAULT_MODEL, &revis_testkit::smollm2());
    assert_eq!((card.temperature, card.top_p), (model.sampling.temperature, model.sampling.top_p));
    assert!(card.temperature.is_some_and(|t| t < 0.7), "the model card's temperature, not revis's generic 0.7: {card:?}");
    if !model.chat.quick_check {
        assert!(asked.iter().all(|r| r.tier != revis_client::Tier::Tier1), "no quick check ran: {asked:#?}");
    }
}
