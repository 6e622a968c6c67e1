//! The orchestrator against a real daemon: pre-prefill makes the next
//! answer start from a warm cache, and structured tasks return JSON that
//! validates.

use revis_orchestrator::prompt::{PromptContext, Speaker, Turn};
use revis_orchestrator::{Daemon, EnterOutcome, Gates, Phase, PrePrefill, structured};
use revis_testkit::TestDaemon;
use serde_json::json;

fn context() -> PromptContext {
    PromptContext {
        rules: "You are revis, a helpful assistant. Answer briefly and kindly.".repeat(8),
        profile: vec!["The user's name is Ada.".into(), "Ada likes astronomy.".into()],
        summary: Some("Ada asked about telescopes earlier.".into()),
        turns: vec![
            Turn { speaker: Speaker::User, text: "Hello!".into() },
            Turn { speaker: Speaker::Assistant, text: "Hello Ada, how can I help?".into() },
        ],
    }
}

#[tokio::test]
async fn typing_warms_the_cache_and_the_answer_reuses_all_of_it() {
    let d = TestDaemon::new().start();
    let client = d.client().await;
    let gates = Gates::new();
    let pre = PrePrefill::new(client.clone(), gates.clone());
    let ctx = context();

    pre.typing_started("tier2", ctx.static_messages());
    assert!(gates.state().typing, "typing holds background work");
    // The user types for a while: the prefill gets to the daemon.
    let _ = pre.watch().wait_for(|p| *p != Phase::Queued).await;
    let outcome = pre.enter().await;
    assert!(matches!(outcome, EnterOutcome::Waited | EnterOutcome::WasReady), "{outcome:?}");

    let mut req = ctx.request("tier2", "Which planet is the largest?");
    req.sampling = Some(revis_client::v1::Sampling { temperature: Some(0.0), ..Default::default() });
    req.max_tokens = 24;
    let mut streamed = String::new();
    let done = client.generate(req.clone(), |t| streamed.push_str(t)).await.unwrap();
    assert_eq!(streamed, done.text);
    // The static part (everything but the new message) came from the warm cache.
    let static_only = client
        .clone()
        .inference
        .prefill(revis_client::v1::PrefillRequest { tier: "tier2".into(), messages: ctx.static_messages(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(done.cached_tokens >= static_only.prompt_tokens, "{} cached of a {}-token static part", done.cached_tokens, static_only.prompt_tokens);
    pre.consumed();
}

#[tokio::test]
async fn profile_extraction_returns_json_that_validates() {
    let d = TestDaemon::new().start();
    let client = d.client().await;
    let schema = json!({
        "type": "object",
        "properties": {
            "facts": {"type": "array", "items": {"type": "string", "maxLength": 80}, "maxItems": 5}
        },
        "required": ["facts"],
        "additionalProperties": false
    });
    let task = "Extract facts about the user from this message, as short sentences: \
                'Hi, I am Ada, I live in London and I love astronomy.'";
    let v = structured::run(&client, "tier3", task, &schema).await.unwrap();
    let facts = v["facts"].as_array().unwrap_or_else(|| panic!("not the schema's shape: {v}"));
    assert!(facts.len() <= 5);
    assert!(facts.iter().all(|f| f.as_str().is_some_and(|s| s.chars().count() <= 80)), "{v}");
    assert_eq!(v.as_object().unwrap().len(), 1, "no other keys: {v}");
}
