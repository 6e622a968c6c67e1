//! Answers as a person reads them: Markdown laid out (headings, lists,
//! emphasis, code), each code block with its own Copy button, and a long
//! conversation laid out only around what is on screen.

use eframe::egui::OutputCommand;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use revis_gui::App;
use revis_testkit::TestDaemon;

use crate::{harness, options, ready, wait_until};

const ANSWER: &str = "## Boiling an egg\n\n1. **Heat** the water\n2. Add the egg\n\n| Minutes | Yolk |\n|---|---|\n| 6 | soft |\n\n```python\nprint(\"done\")\nprint(\"eat\")\n```\n";

/// The app on a real revisd, opened on a conversation of `turns` (question, answer) stored first.
fn opened_on(turns: &[(String, String)]) -> (revis_testkit::Running, tempfile::TempDir, Harness<'static, App>) {
    let d = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let opts = options(&d.socket, data.path(), 16);
    let store = opts.store.clone().unwrap();
    let c = store.create_conversation("Stored").unwrap();
    for (q, a) in turns {
        store.append_user(c, q).unwrap();
        let r = store.begin_reply(c, "tier2").unwrap();
        store.complete_reply(r, a).unwrap();
    }
    let mut h = harness(opts);
    ready(&mut h);
    wait_until(&mut h, "the conversation", |h| h.state().state.current == Some(c) && h.state().state.messages.len() == 2 * turns.len());
    (d, data, h)
}

#[test]
fn answers_are_laid_out_as_markdown_and_a_code_block_copies_its_code() {
    let (_d, _data, mut h) = opened_on(&[("How do I boil an egg?".into(), ANSWER.into())]);

    // Markdown's marks are gone: the heading, the bold word and the table's cells are text of their own.
    assert!(h.query_by_label("Boiling an egg").is_some(), "the heading");
    assert!(h.query_by_label("Heat").is_some(), "the emphasised word");
    assert!(h.query_by_label("soft").is_some(), "a table cell");
    assert!(h.query_by_label_contains("## ").is_none() && h.query_by_label_contains("**").is_none(), "no raw Markdown shown");

    // The code block's own button copies the code alone.
    h.get_by_label("Copy code").click();
    h.step();
    let copied: Vec<String> = h
        .output()
        .platform_output
        .commands
        .iter()
        .filter_map(|c| if let OutputCommand::CopyText(t) = c { Some(t.clone()) } else { None })
        .collect();
    assert_eq!(copied, ["print(\"done\")\nprint(\"eat\")"]);
}

#[test]
fn a_long_conversation_lays_out_only_what_is_near_the_screen() {
    let turns: Vec<(String, String)> =
        (0..100).map(|i| (format!("Question number {i}"), format!("Answer number {i}, with *some* Markdown."))).collect();
    let (_d, _data, mut h) = opened_on(&turns);
    // A few frames: the list sticks to the bottom as heights become known.
    for _ in 0..5 {
        h.run_ok();
    }
    let laid_out = h.state().layout.laid_out;
    assert!(laid_out < 60, "{laid_out} of 200 messages laid out");
    assert!(h.query_by_label("Question number 99").is_some(), "the newest messages are on screen");
    assert!(h.query_by_label("Question number 0").is_none(), "the oldest are not laid out");
}
