//! Speculation from the context (prompt lookup decoding, `daemon.speculate`):
//! drafts change how fast an answer comes, never which answer. (A long copy
//! starts past `lookup::EXACT_CONTEXT`, where drafting stops, and a
//! 300-token answer crosses it.)

use revis_client::wire::v1 as pb;
use revis_testkit::TestDaemon;

use crate::{generate, greedy, user};

/// revis_engine::lookup::EXACT_CONTEXT: no drafts past this many tokens.
const EXACT_CONTEXT: usize = 256;

const PASSAGE: &str = "The lighthouse keeper climbed the spiral stairs every evening at dusk. \
    He wound the clockwork, trimmed the wick and polished the great lens until it shone. \
    Ships passing the rocks at night saw the beam sweep across the water every ten seconds.";

/// Greedy requests that go through each way of picking a token (argmax, the
/// grammar, the repetition penalty) and end in each way (the model's end,
/// max_tokens inside a copied run, a stop string inside one: its stop is
/// cut from the "copy" answer by the test).
fn requests() -> Vec<(&'static str, pb::GenerateRequest)> {
    let copy = |max_tokens: u32| pb::GenerateRequest {
        messages: vec![user(&format!("Repeat this text exactly, word for word:\n\n{PASSAGE}"))],
        sampling: greedy(),
        max_tokens,
        ..Default::default()
    };
    let schema = r#"{"type":"object","properties":{"facts":{"type":"array","items":{"type":"string","maxLength":120},"maxItems":4}},"required":["facts"],"additionalProperties":false}"#;
    vec![
        ("copy", copy(96)),
        ("copy, max_tokens 7", copy(7)),
        (
            "long copy",
            pb::GenerateRequest {
                messages: vec![user(&format!("Repeat this text exactly, word for word:\n\n{}", [PASSAGE; 5].join("\n\n")))],
                sampling: greedy(),
                max_tokens: 40,
                ..Default::default()
            },
        ),
        ("copy, stop string", copy(96)),
        (
            "300-token answer",
            pb::GenerateRequest {
                // As JSON long enough that no model ends it early, so the
                // answer runs from below EXACT_CONTEXT to past it.
                messages: vec![user(&format!("Repeat this text exactly, word for word, as a JSON array of its sentences:\n\n{PASSAGE}"))],
                ..crate::long_answer(300)
            },
        ),
        (
            "JSON",
            pb::GenerateRequest {
                messages: vec![user(&format!("List the facts in this text as JSON: {PASSAGE}"))],
                sampling: greedy(),
                max_tokens: 120,
                format: pb::OutputFormat::Json as i32,
                json_schema: schema.as_bytes().to_vec().into(),
                ..Default::default()
            },
        ),
        (
            "repetition penalty",
            pb::GenerateRequest {
                messages: vec![user(&format!("Summarise in one sentence: {PASSAGE}"))],
                sampling: Some(pb::Sampling { temperature: Some(0.0), repeat_penalty: Some(1.1), ..Default::default() }),
                max_tokens: 60,
                ..Default::default()
            },
        ),
        (
            "open question",
            pb::GenerateRequest {
                messages: vec![user("Name three colours and say why people like them.")],
                sampling: greedy(),
                max_tokens: 64,
                ..Default::default()
            },
        ),
    ]
}

#[tokio::test]
async fn drafts_from_the_context_leave_greedy_text_unchanged() {
    for model in [revis_testkit::smollm2(), revis_testkit::gemma3()] {
        let off = TestDaemon::new().model(model.clone()).daemon("speculate = \"off\"").start();
        let always = TestDaemon::new().model(model.clone()).daemon("speculate = \"always\"").start();
        let (mut plain, mut drafting) = (off.client().await, always.client().await);
        let (mut drafted, mut accepted) = (0, 0);
        let mut copied = String::new();
        for (what, mut req) in requests() {
            if what == "copy, stop string" {
                // A stop string from the middle of the copy ends the same request before its first occurrence.
                req.stop = vec![crate::stop_from(&copied, 10).into_bytes().into()];
            }
            let a = generate(&mut plain, req.clone()).await.unwrap().done;
            let b = generate(&mut drafting, req.clone()).await.unwrap().done;
            let m = model.display();
            assert_eq!(a.text, b.text, "{m}, {what}: the same text with drafts");
            assert_eq!((a.finish_reason, a.generated_tokens), (b.finish_reason, b.generated_tokens), "{m}, {what}");
            assert_eq!(a.draft_tokens, 0, "{m}, {what}: speculate = \"off\" drafts nothing");
            match what {
                "copy" => copied = a.text.clone(),
                "copy, max_tokens 7" => assert_eq!(b.generated_tokens, 7, "{m}: a draft never runs past max_tokens"),
                "long copy" => {
                    assert_eq!(b.draft_tokens, 0, "{m}: past {EXACT_CONTEXT} tokens nothing is drafted");
                    assert!(b.prompt_tokens as usize > EXACT_CONTEXT, "{m}: the prompt is long enough");
                }
                "copy, stop string" => {
                    let stop = String::from_utf8(req.stop[0].to_vec()).unwrap();
                    let cut = &copied[..copied.find(&stop).unwrap()];
                    assert_eq!((b.finish_reason, b.text.as_str()), (pb::FinishReason::Stop as i32, cut), "{m}: stop {stop:?}");
                }
                "300-token answer" => {
                    assert_eq!(b.generated_tokens, 300, "{m}");
                    assert!((b.prompt_tokens as usize) < EXACT_CONTEXT && (b.prompt_tokens + 300) as usize > EXACT_CONTEXT, "{m}: {b:?}");
                }
                _ => {}
            }
            drafted += b.draft_tokens;
            accepted += b.draft_accepted;
        }
        assert!(
            accepted > 0 && drafted > accepted,
            "{}: drafts were verified, kept and rejected ({accepted} of {drafted} kept)",
            model.display()
        );
    }
}

/// A seed decides a sampled answer whether or not drafts are verified
/// (whether they are depends on what batches cost as the answer runs).
#[tokio::test]
async fn sampled_answers_with_drafts_follow_their_seed() {
    let off = TestDaemon::new().daemon("speculate = \"off\"").start();
    let always = TestDaemon::new().daemon("speculate = \"always\"").start();
    let (mut plain, mut drafting) = (off.client().await, always.client().await);
    let req = |seed: u64| pb::GenerateRequest {
        messages: vec![user(&format!("Repeat this text exactly, word for word:\n\n{PASSAGE}"))],
        sampling: Some(pb::Sampling { temperature: Some(0.8), seed: Some(seed), ..Default::default() }),
        max_tokens: 64,
        ..Default::default()
    };
    let (mut drafted, mut accepted) = (0, 0);
    for seed in [3, 4, 5] {
        let first = generate(&mut drafting, req(seed)).await.unwrap().done;
        let again = generate(&mut drafting, req(seed)).await.unwrap().done;
        let without = generate(&mut plain, req(seed)).await.unwrap().done;
        assert_eq!(first.text, again.text, "seed {seed}: same seed, same text");
        assert_eq!(first.text, without.text, "seed {seed}: the same text without drafts");
        assert_eq!(without.draft_tokens, 0, "speculate = \"off\" drafts nothing");
        drafted += first.draft_tokens;
        accepted += first.draft_accepted;
    }
    assert!(accepted > 0 && drafted > accepted, "drafts were verified, kept and rejected ({accepted} of {drafted} kept)");
}
