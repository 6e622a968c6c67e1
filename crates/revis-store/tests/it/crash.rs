//! kill -9 during writes: a child process (`revis-store-crash-writer`) writes
//! and acknowledges; it is killed at random points, many times, into the same
//! database. After each kill every acknowledged write is there, and a reply
//! is either complete with exactly the text it was completed with or flagged
//! incomplete.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use revis_store::{ConversationId, MessageId, MessageState, Role};

use crate::{open, temp_db};

/// Kills per run (`REVIS_STORE_CRASH_KILLS` overrides, for soak runs).
const KILLS: usize = 50;
/// Acknowledgements to wait for before a kill: 1..=this, drawn per kill.
const MOST_ACKS: usize = 120;
/// The delay between the last acknowledgement read and the kill:
/// 0..this many microseconds, drawn per kill.
const MOST_JITTER_US: u64 = 3000;
/// The writer acknowledges thousands of writes a second; this long without
/// one means it is stuck.
const STALL: Duration = Duration::from_secs(20);

/// What the writer has acknowledged so far, over all runs.
#[derive(Default)]
struct Acked {
    conversations: BTreeMap<ConversationId, String>,
    users: BTreeMap<MessageId, String>,
    begun: BTreeSet<MessageId>,
    /// The text each reply was (about to be) completed with.
    intents: BTreeMap<MessageId, String>,
    completed: BTreeSet<MessageId>,
}

impl Acked {
    fn record(&mut self, line: &str) {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        let id_and_text = || rest.split_once(' ').map_or((rest, ""), |(id, text)| (id, text));
        let message = |id: &str| id.parse::<MessageId>().unwrap_or_else(|_| panic!("bad id in {line:?}"));
        match kind {
            "ack" => {
                let (what, rest) = rest.split_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
                let (id, text) = rest.split_once(' ').unwrap_or((rest, ""));
                match what {
                    "conv" => {
                        let id = id.parse().unwrap_or_else(|_| panic!("bad id in {line:?}"));
                        self.conversations.insert(id, text.to_owned());
                    }
                    "user" => {
                        self.users.insert(message(id), text.to_owned());
                    }
                    "begin" => {
                        self.begun.insert(message(id));
                    }
                    "complete" => {
                        self.completed.insert(message(id));
                    }
                    _ => panic!("unknown acknowledgement {line:?}"),
                }
            }
            "intent" => {
                let (id, text) = id_and_text();
                self.intents.insert(message(id), text.to_owned());
            }
            // A write cut by the holder's end: neither promised nor denied.
            "unsure" => {}
            _ => panic!("the writer said {line:?}"),
        }
    }
}

/// Checks the reopened database against everything acknowledged so far.
/// Returns how many replies were found cut off.
fn check(dir: &Path, acked: &Acked, kill: usize) -> usize {
    let store = open(dir);
    let at = |what: String| format!("after kill {kill}: {what}");

    for (&id, title) in &acked.conversations {
        let found = store.conversation(id).unwrap().unwrap_or_else(|| panic!("{}", at(format!("conversation {id} lost"))));
        assert_eq!(&found.title, title, "{}", at(format!("conversation {id}")));
    }
    for (&id, text) in &acked.users {
        let m = store.message(id).unwrap().unwrap_or_else(|| panic!("{}", at(format!("user message {id} lost"))));
        assert_eq!((m.role, m.state), (Role::User, MessageState::Complete), "{}", at(format!("message {id}")));
        assert_eq!(&m.text, text, "{}", at(format!("user message {id}")));
    }
    for &id in &acked.begun {
        let m = store.message(id).unwrap().unwrap_or_else(|| panic!("{}", at(format!("begun reply {id} lost"))));
        assert_eq!(m.role, Role::Assistant, "{}", at(format!("reply {id}")));
    }
    for &id in &acked.completed {
        let m = store.message(id).unwrap().unwrap();
        assert_eq!(m.state, MessageState::Complete, "{}", at(format!("completed reply {id} is not complete")));
    }

    // Every reply in the database, acknowledged or not: complete means
    // exactly the text it was completed with; incomplete means a prefix of it.
    let mut cut_off = 0;
    for conversation in store.conversations().unwrap() {
        let messages = store.messages(conversation.id).unwrap();
        let seqs: Vec<u64> = messages.iter().map(|m| m.id.seq).collect();
        assert_eq!(seqs, (0..conversation.message_count).collect::<Vec<_>>(), "{}", at("gaps".into()));
        for m in messages.iter().filter(|m| m.role == Role::Assistant) {
            let intent = acked.intents.get(&m.id);
            match m.state {
                MessageState::Complete => {
                    let intent = intent.unwrap_or_else(|| panic!("{}", at(format!("reply {} complete unasked", m.id))));
                    assert_eq!(&m.text, intent, "{}", at(format!("complete reply {} has other text", m.id)));
                }
                MessageState::Incomplete => {
                    cut_off += 1;
                    assert!(!acked.completed.contains(&m.id), "{}", at(format!("completed reply {} lost it", m.id)));
                    if let Some(intent) = intent {
                        assert!(intent.starts_with(&m.text), "{}", at(format!("reply {} text is no prefix", m.id)));
                    }
                }
            }
        }
    }
    cut_off
}

#[test]
fn every_acknowledged_write_survives_kill_9() {
    let env = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    let seed = env("REVIS_STORE_CRASH_SEED").unwrap_or(20_260_801);
    let kills = env("REVIS_STORE_CRASH_KILLS").map_or(KILLS, |k| k as usize);
    let mut rng = StdRng::seed_from_u64(seed);
    let (_tmp, dir) = temp_db();
    let mut acked = Acked::default();
    let started = Instant::now();
    let mut cut_off = 0;
    for kill in 1..=kills {
        let (acks, jitter) = (rng.random_range(1..=MOST_ACKS), Duration::from_micros(rng.random_range(0..MOST_JITTER_US)));
        let mut writer = Writer::start(&dir);
        writer.acks(acks, &mut acked);
        // Not a wait for anything: it spreads the kills over the writer's
        // cycle (a write takes well under a millisecond here).
        let chosen = Instant::now();
        while chosen.elapsed() < jitter {
            std::hint::spin_loop();
        }
        // Lines printed before the kill but not read yet were acknowledged too.
        writer.kill(&mut acked);
        cut_off = check(&dir, &acked, kill);
    }
    eprintln!(
        "seed {seed}: {kills} kills in {:.1?}; {} user messages and {} replies acknowledged, {} completed; \
         {cut_off} replies cut off",
        started.elapsed(),
        acked.users.len(),
        acked.begun.len(),
        acked.completed.len(),
    );
    // The kills did land inside replies, so the incomplete path was tested.
    assert!(cut_off > 0, "no kill interrupted a reply (seed {seed})");
}

/// A writer process and the lines it printed, read on a thread of its own.
struct Writer {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(dir: &Path) -> Writer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_revis-store-crash-writer"))
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the writer");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut stdout = std::io::BufReader::new(stdout);
            loop {
                let mut line = Vec::new();
                match stdout.read_until(b'\n', &mut line) {
                    Ok(_) if line.last() == Some(&b'\n') => {
                        line.pop();
                        if tx.send(String::from_utf8(line).expect("UTF-8")).is_err() {
                            return;
                        }
                    }
                    _ => return,
                }
            }
        });
        Writer { child, lines, reader: Some(reader) }
    }

    /// Reads until `n` more acknowledgements came; records every line.
    fn acks(&mut self, n: usize, acked: &mut Acked) {
        let mut seen = 0;
        while seen < n {
            let line = self.lines.recv_timeout(STALL).unwrap_or_else(|e| {
                let _ = self.child.kill();
                panic!("the writer stopped ({e}): {:?}", self.child.wait());
            });
            seen += usize::from(line.starts_with("ack "));
            acked.record(&line);
        }
    }

    /// kill -9; records what it printed before.
    fn kill(mut self, acked: &mut Acked) {
        self.child.kill().unwrap();
        let status = self.child.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "the writer ended by itself: {status}");
        self.reader.take().unwrap().join().unwrap();
        for line in self.lines.try_iter() {
            acked.record(&line);
        }
    }
}

/// Two processes writing to one database at once: the first holds it and
/// serves the second. kill -9 of the holder mid-write: the second takes the
/// database over and goes on writing, and every write either acknowledged
/// is there (kill -9 of the second as well, then).
#[test]
fn two_writers_share_the_database_and_a_holder_killed_loses_nothing() {
    let (_tmp, dir) = temp_db();
    let mut acked = Acked::default();
    for round in 0..3 {
        let mut holder = Writer::start(&dir);
        holder.acks(20, &mut acked);
        let mut guest = Writer::start(&dir);
        guest.acks(20, &mut acked);
        holder.acks(20, &mut acked);
        holder.kill(&mut acked);
        // The guest goes on: it holds the database now.
        guest.acks(40, &mut acked);
        guest.kill(&mut acked);
        check(&dir, &acked, round);
        crate::wait_closed(&dir);
    }
    assert!(acked.completed.len() > 20, "few replies were completed: {}", acked.completed.len());
}
