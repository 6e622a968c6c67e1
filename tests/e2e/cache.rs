//! KV-cache prefix reuse, Prefill and Score.

use revis_client::wire::v1 as pb;
use revis_testkit::TestDaemon;

use crate::{generate, greedy, system, user};

/// A system prompt of roughly 300 tokens.
fn long_rules() -> String {
    let mut s = String::from("You are a careful assistant. Follow these house rules.\n");
    for i in 1..=24 {
        s.push_str(&format!("Rule {i}: answer briefly, stay polite, and never invent facts about topic {i}.\n"));
    }
    s
}

#[tokio::test]
async fn a_shared_system_prompt_is_reused_from_the_cache() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    let rules = long_rules();
    let req =
        |q: &str| pb::GenerateRequest { messages: vec![system(&rules), user(q)], sampling: greedy(), max_tokens: 16, ..Default::default() };
    let first = generate(&mut c, req("What is two plus two?")).await.unwrap().done;
    assert!(first.prompt_tokens > 300, "the system prompt is long enough: {}", first.prompt_tokens);
    let second = generate(&mut c, req("Name a fruit.")).await.unwrap().done;
    assert!(second.cached_tokens >= 290, "only {} of {} prompt tokens came from the cache", second.cached_tokens, second.prompt_tokens);
    // A request with another system prompt in between: the first prefix is still kept.
    let other = pb::GenerateRequest { messages: vec![system(&long_rules().replace("house", "garden")), user("Hi")], ..req("") };
    generate(&mut c, other).await.unwrap();
    let third = generate(&mut c, req("Name a tree.")).await.unwrap().done;
    assert!(third.cached_tokens >= 290, "a saved prefix was restored: {} cached", third.cached_tokens);
    let s = c.status().await.unwrap();
    assert!(s.tiers[1].cached_prefixes >= 2, "status counts cached prefixes: {:?}", s.tiers[1]);
}

#[tokio::test]
async fn prefill_then_generate_reuses_the_prefill_and_matches_a_cold_run() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    let history = vec![
        system(&long_rules()),
        user("My name is Ada and I like astronomy."),
        pb::ChatMessage { role: pb::Role::Assistant as i32, content: b"Nice to meet you, Ada!".to_vec().into(), ..Default::default() },
    ];
    let mut messages = history.clone();
    messages.push(user("Which planet is the largest?"));
    let req = pb::GenerateRequest {
        messages,
        static_messages: Some(history.len() as u32),
        sampling: greedy(),
        max_tokens: 40,
        ..Default::default()
    };

    let cold = generate(&mut c, req.clone()).await.unwrap().done;
    assert_eq!(cold.cached_tokens, 0);
    c.wire().admin.purge(pb::PurgeRequest::default()).await.unwrap();

    let pre = c.wire().inference.prefill(pb::PrefillRequest { messages: history, ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(pre.cached_tokens, 0);
    let warm = generate(&mut c, req).await.unwrap().done;
    assert_eq!(warm.cached_tokens, pre.prompt_tokens, "every prefilled token was reused");
    assert_eq!(warm.text, cold.text, "a warm prefix gives exactly the cold answer");
    assert!(warm.prompt_us < cold.prompt_us, "warm prompt {} us vs cold {} us", warm.prompt_us, cold.prompt_us);
}

#[tokio::test]
async fn score_prefers_the_models_own_greedy_answer_to_its_reversal() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    // What the model answers greedily is, token by token, its likeliest
    // continuation; the same characters reversed are not.
    let question = "Describe the sea in one sentence.";
    let answer = generate(&mut c, pb::GenerateRequest { max_tokens: 24, ..crate::ask(question) }).await.unwrap().done.text;
    let reversed: String = answer.chars().rev().collect();
    assert!(answer.chars().count() >= 2 && reversed != answer, "an answer to reverse: {answer:?}");
    let req = pb::ScoreRequest {
        messages: vec![user(question)],
        continuations: vec![answer.clone().into_bytes().into(), reversed.into_bytes().into()],
        ..Default::default()
    };
    let scores = c.wire().inference.score(req).await.unwrap().into_inner().results;
    let (own, other) = (&scores[0], &scores[1]);
    assert!(own.logprob > other.logprob, "log p(answer) {} vs log p(reversed) {}", own.logprob, other.logprob);
    assert_eq!(own.byte_length as usize, answer.len());
    assert!(!own.tokens.is_empty());
    let sum: f64 = own.tokens.iter().map(|t| t.logprob).sum();
    assert!((sum - own.logprob).abs() < 1e-9);
    assert!(own.tokens.iter().all(|t| t.logprob <= 0.0));
}

/// With room for one saved prefix, A, B, A: saving B evicts A, so the third
/// request is evaluated cold, and its answer is exactly the first one (a
/// wrongly restored prefix would change it).
#[tokio::test]
async fn a_full_prefix_cache_never_restores_the_wrong_prefix() {
    let d = TestDaemon::new().daemon("cache_slots = 1\nstreams = 1").start();
    let mut c = d.client().await;
    let req = |rules: &str| pb::GenerateRequest {
        messages: vec![system(rules), user("Name one colour.")],
        sampling: greedy(),
        max_tokens: 16,
        ..Default::default()
    };
    let a = long_rules();
    let b = long_rules().replace("house", "garden");
    let first = generate(&mut c, req(&a)).await.unwrap().done;
    generate(&mut c, req(&b)).await.unwrap();
    let again = generate(&mut c, req(&a)).await.unwrap().done;
    assert_eq!(again.text, first.text);
    // A and B differ inside their static parts, so no batch boundary is
    // shared past 0: the third request is cold only because saving B evicted
    // A. Anything cached here means the eviction this test is about never
    // happened, and the equal texts would prove nothing.
    assert_eq!(again.cached_tokens, 0, "saving B evicted A, so A is evaluated cold");
}
