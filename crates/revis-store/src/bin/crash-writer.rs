//! Test helper for the kill -9 test (`tests/it/crash.rs`): writes to the store
//! in `DIR` forever and prints an acknowledgement after each write returns.
//!
//! Lines on stdout, one per event, texts without newlines:
//! - `ack conv <id> <title>` after `create_conversation`
//! - `ack user <id> <text>` after `append_user`
//! - `ack begin <id>` after `begin_reply`
//! - `intent <id> <text>` before `complete_reply` (the text it will complete with)
//! - `ack complete <id>` after `complete_reply`
//! - `recovered <what>` if opening found a damaged database (then it exits 3)
//! - `unsure <what>` when the process holding the database (another writer)
//!   ended during a write: that write may or may not be stored; it goes on
//!   with the next message

use std::io::Write as _;
use std::path::PathBuf;

use revis_store::{Store, StoreError};

/// Messages per conversation before the next one starts.
const PER_CONVERSATION: u64 = 5;
/// `update_reply` calls per reply.
const CHUNKS: usize = 8;

fn main() {
    let dir: PathBuf = std::env::args_os().nth(1).expect("usage: revis-store-crash-writer DIR").into();
    let opened = Store::open(&dir).expect("open the store");
    let mut out = std::io::stdout().lock();
    if let Some(recovered) = opened.recovered {
        let _ = writeln!(out, "recovered {recovered}");
        std::process::exit(3);
    }
    let store = opened.store;
    let run = std::process::id();
    let mut ack = |line: String| {
        // The reader is gone (the test ended): stop.
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            std::process::exit(0);
        }
    };
    let mut conversation = None;
    // A write cut by the holder's end is told, not fatal: on with the next message.
    macro_rules! step {
        ($e:expr, $what:expr) => {
            match $e {
                Ok(v) => v,
                Err(StoreError::HolderGone { .. }) => {
                    ack(format!("unsure {}", $what));
                    continue;
                }
                Err(e) => panic!("{}: {e}", $what),
            }
        };
    }
    for n in 0u64.. {
        let conv = match conversation {
            Some(conv) if n % PER_CONVERSATION != 0 => conv,
            _ => {
                let title = format!("run {run} from message {n}");
                let conv = step!(store.create_conversation(&title), "create_conversation");
                ack(format!("ack conv {conv} {title}"));
                conversation = Some(conv);
                conv
            }
        };

        let user = format!("user {run}/{n} {}", filler(n, (n as usize * 37) % 700));
        let id = step!(store.append_user(conv, &user), "append_user");
        ack(format!("ack user {id} {user}"));

        let reply = step!(store.begin_reply(conv, "tier2"), "begin_reply");
        ack(format!("ack begin {reply}"));
        // Now and then a big reply (sled stores large values apart).
        let chunk_len = if n % 16 == 7 { 8000 } else { (n as usize * 53) % 300 };
        let mut text = String::new();
        let mut streamed = Ok(());
        for i in 0..CHUNKS {
            text.push_str(&format!("[{n}.{i}] {}", filler(n + i as u64, chunk_len)));
            streamed = store.update_reply(reply, &text);
            if streamed.is_err() {
                break;
            }
        }
        step!(streamed, "update_reply");
        // The final text differs from the last update, so a completion that
        // kept the streamed text would show.
        let text = format!("{text}[end {n}]");
        ack(format!("intent {reply} {text}"));
        step!(store.complete_reply(reply, &text), "complete_reply");
        ack(format!("ack complete {reply}"));
    }
}

/// About `len` bytes of varied text, some of it multi-byte, no newlines.
fn filler(seed: u64, len: usize) -> String {
    const WORDS: [&str; 6] = ["ça", "va", "🚀", "sled", "naïve", "日本"];
    let mut s = String::new();
    let mut i = seed as usize;
    while s.len() < len {
        s.push_str(WORDS[i % WORDS.len()]);
        s.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    s
}
