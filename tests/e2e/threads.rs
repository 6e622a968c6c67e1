//! Thread counts (`threads = "auto"` changes them with the load): what an
//! answer does not depend on. Prompts are evaluated bit-identically at any
//! count, and so is every decoding step while the answer attends over
//! fewer than 512 cells of cache; past that, llama.cpp's CPU attention for
//! a lone token splits the cache between the threads (ARCHITECTURE.md,
//! "Threads", and `examples/thread_numerics.rs`).

use revis_client::wire::v1 as pb;
use revis_testkit::TestDaemon;

use crate::{generate, greedy, system, user};

/// About 900 tokens of rules: a prompt of two batches, past 512 cells.
fn long_rules() -> String {
    let mut s = String::from("You are a careful assistant. Follow these house rules.\n");
    for i in 1..=72 {
        s.push_str(&format!("Rule {i}: answer briefly, stay polite, and never invent facts about topic {i}.\n"));
    }
    s
}

/// A greedy answer with its tokens' log-probabilities (3 alternatives each).
fn request(messages: Vec<pb::ChatMessage>, max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest { messages, sampling: greedy(), max_tokens, logprobs: true, top_logprobs: 3, ..Default::default() }
}

struct Answer {
    text: String,
    logprobs: Vec<pb::TokenLogprob>,
    done: pb::Done,
}

/// `reqs` on a fresh revisd with `threads` (TOML), one after another.
async fn answers(threads: &str, reqs: &[pb::GenerateRequest]) -> Vec<Answer> {
    let d = TestDaemon::new().daemon(&format!("threads = {threads}")).start();
    let mut c = d.client().await;
    let mut out = Vec::new();
    for req in reqs {
        let g = generate(&mut c, req.clone()).await.unwrap();
        out.push(Answer {
            text: g.deltas.iter().map(|d| d.text.as_str()).collect(),
            logprobs: g.deltas.iter().flat_map(|d| d.logprobs.clone()).collect(),
            done: g.done,
        });
    }
    let status = c.status().await.unwrap();
    let tier2 = status.tiers.iter().find(|t| t.tier.as_str() == "tier2").unwrap();
    assert_eq!(tier2.threads_auto, threads.starts_with('"'), "{tier2:?}");
    assert!(tier2.threads >= 1, "the tier reports the threads its steps run on: {tier2:?}");
    out
}

#[tokio::test]
async fn answers_and_prompts_are_the_same_on_one_thread_on_two_and_changing_count_at_every_call() {
    let reqs = [
        // A short answer: every step under 512 cells.
        request(vec![user("Name three colours and say one thing about each.")], 48),
        // A long prompt: its batches and the first token.
        request(vec![system(&long_rules()), user("Which rule is about topic 7?")], 1),
    ];
    let one = answers("1", &reqs).await;
    assert!(one[0].done.generated_tokens >= 8, "an answer long enough to compare: {:?}", one[0].done);
    assert!(one[1].done.prompt_tokens > 600, "the prompt is past 512 cells: {}", one[1].done.prompt_tokens);
    for threads in ["2", "\"cycle\"", "\"auto\""] {
        for (a, b) in answers(threads, &reqs).await.iter().zip(&one) {
            assert_eq!(a.text, b.text, "threads = {threads}");
            assert_eq!(a.logprobs, b.logprobs, "threads = {threads}: the same log-probabilities, bit for bit");
            assert_eq!(a.done.generated_tokens, b.done.generated_tokens);
        }
    }
}
