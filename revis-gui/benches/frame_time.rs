//! Frame time of the chat view while an answer streams at 100 tokens/s
//! into a 200-message conversation, on the renderer this machine has (Mesa's
//! CPU renderer where there is no GPU). Each frame is one egui pass (layout,
//! Markdown, tessellation), then a render through egui's wgpu renderer with
//! the picture read back (which a window would not do, so the render figure
//! is an upper bound). No revisd: the messages are put in the app's state,
//! and the stream is the app's own Delta events, 100 a second.
//!
//! `cargo bench -p revis-gui --bench frame_time` (release build); the target
//! is a frame under 16 ms (60 frames a second). Figures: docs/BENCHMARKS.md.

use std::time::{Duration, Instant};

use egui_kittest::Harness;
use revis_gui::state::{Message, Shown};
use revis_gui::{App, Event};

const MESSAGES: usize = 200;
const FRAMES: usize = 300;
const FRAME_EVERY: Duration = Duration::from_millis(16);
const TOKENS_PER_S: f64 = 100.0;
/// Tokens in each streamed answer.
const ANSWER_TOKENS: usize = 120;

/// A typical answer: a paragraph, a list, some code.
fn answer(i: usize) -> String {
    format!(
        "Here is answer {i}. A paragraph with **bold** and *emphasis*, and a [link](https://example.org), long enough to wrap \
         over a few lines in a window of ordinary width, the way real answers do.\n\n1. First step\n2. Second step with `code`\n\
         3. Third step\n\n```rust\nfn main() {{\n    println!(\"{i}\");\n}}\n```\n"
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let opts = revis_gui::Options {
        socket: dir.path().join("no-revisd.sock"),
        start_daemon: false,
        spawn: Default::default(),
        data_dir: dir.path().to_owned(),
        store: None,
        config: dir.path().join("config/revisd.toml"),
        typing_idle: Duration::from_secs(30),
        discovery: None,
        sampling: Default::default(),
        max_tokens: None,
        pull: Default::default(),
    };
    let app = App::with_wake(opts, || {});
    let mut h: Harness<'static, App> =
        Harness::builder().with_size([1100.0, 760.0]).wgpu().build_ui_state(|ui, app: &mut App| app.ui(ui), app);
    {
        let s = &mut h.state_mut().state;
        for i in 0..MESSAGES - 2 {
            s.messages.push(if i % 2 == 0 {
                Message { text: format!("Question {i}: how do I do this?"), ..Message::user_message() }
            } else {
                Message { text: answer(i), from_user: false, ..Message::user_message() }
            });
        }
        s.sent("And one more question, answered while you watch.".into());
        assert_eq!(s.messages.len(), MESSAGES);
    }
    // Settle: the list sticks to the bottom once heights are known.
    for _ in 0..10 {
        h.step();
    }
    let (mut pass, mut render) = (Vec::with_capacity(FRAMES), Vec::with_capacity(FRAMES));
    let words: Vec<String> = answer(999).split_inclusive(' ').map(str::to_owned).collect();
    let (start, mut sent) = (Instant::now(), 0usize);
    for f in 0..FRAMES {
        // The tokens due by this frame's time, at 100 a second.
        let due = ((f + 1) as f64 * FRAME_EVERY.as_secs_f64() * TOKENS_PER_S) as usize;
        while sent < due {
            let s = &mut h.state_mut().state;
            s.apply(Event::Delta(words[sent % words.len()].clone()));
            sent += 1;
            // An answer of ANSWER_TOKENS, then the next question: the conversation keeps moving.
            if sent % ANSWER_TOKENS == 0 {
                let text = s.messages.last().map(|m| m.text.clone()).unwrap_or_default();
                s.apply(Event::AnswerDone { text, stats: String::new(), tier: revis_client::Tier::Tier2 });
                s.sent(format!("Question {sent}: and then?"));
            }
        }
        let t = Instant::now();
        h.step();
        pass.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let image = h.render().expect("a rendered frame");
        render.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(image);
    }
    let wall = start.elapsed();
    let laid_out = h.state().layout.laid_out;
    assert_eq!(h.state().state.messages.last().map(|m| m.shown), Some(Shown::Streaming));
    let messages = h.state().state.messages.len();
    let total: Vec<f64> = pass.iter().zip(&render).map(|(a, b)| a + b).collect();
    println!(
        "frame time, chat view, {MESSAGES} to {messages} messages, {sent} tokens streamed at {TOKENS_PER_S} tokens/s \
         ({ANSWER_TOKENS} an answer) over {FRAMES} frames ({:.1} s)",
        wall.as_secs_f64()
    );
    println!("messages laid out in the last frame: {laid_out} of {messages}");
    // The reference: the same window with an empty conversation, so that the
    // renderer's own cost per frame is told apart from the conversation's.
    h.state_mut().state.messages.clear();
    for _ in 0..10 {
        h.step();
    }
    let mut empty = Vec::with_capacity(FRAMES / 3);
    for _ in 0..FRAMES / 3 {
        h.step();
        let t = Instant::now();
        std::hint::black_box(h.render().expect("a rendered frame"));
        empty.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!("{:<34} {:>8} {:>8} {:>8}", "ms per frame", "p50", "p95", "max");
    for (name, mut v) in
        [("egui pass (layout, Markdown)", pass), ("render + read back", render), ("both", total), ("render + read back, empty chat", empty)]
    {
        v.sort_by(f64::total_cmp);
        println!("{name:<34} {:>8.2} {:>8.2} {:>8.2}", percentile(&v, 0.5), percentile(&v, 0.95), v[v.len() - 1]);
    }
}
