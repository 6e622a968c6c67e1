//! What ensembles need from the daemon: several continuations scored after
//! one prefix in one call, and per-token log-probabilities with the
//! likeliest alternatives, in Score and in Generate.

use revis_client::wire::v1 as pb;
use revis_testkit::TestDaemon;
use tonic::Code;

use crate::{ask, generate, user};

fn score_request(continuations: &[&str], top_logprobs: u32) -> pb::ScoreRequest {
    pb::ScoreRequest {
        messages: vec![user("Name a large city in France.")],
        prefix: b"One of them is".to_vec().into(),
        continuations: continuations.iter().map(|c| c.as_bytes().to_vec().into()).collect(),
        top_logprobs,
        ..Default::default()
    }
}

#[tokio::test]
async fn several_continuations_score_as_each_alone_warm_or_cold() {
    let d = TestDaemon::new().start();
    let c = d.client().await;
    let texts = [" Paris, the capital.", " Lyon", " a city of many bridges and old streets by the river"];
    let purge = |c: revis_client::Client| async move { c.wire().admin.purge(pb::PurgeRequest::default()).await.unwrap() };

    purge(c.clone()).await;
    let together = c.wire().inference.score(score_request(&texts, 3)).await.unwrap().into_inner();
    assert_eq!(together.results.len(), 3);
    // Warm: the prefix is in the cache now, and the numbers do not move.
    let again = c.wire().inference.score(score_request(&texts, 3)).await.unwrap().into_inner();
    assert_eq!(again.results, together.results, "the same call warm gives the same numbers");
    for (i, text) in texts.iter().enumerate() {
        purge(c.clone()).await;
        let alone = c.wire().inference.score(score_request(&[text], 3)).await.unwrap().into_inner();
        assert_eq!(alone.results[0], together.results[i], "{text:?} alone, cold, scores as it did among others");
        let r = &together.results[i];
        assert_eq!(r.byte_length as usize, text.len());
        let pieces: Vec<u8> = r.tokens.iter().flat_map(|t| t.piece.to_vec()).collect();
        assert_eq!(String::from_utf8(pieces).unwrap(), *text, "the tokens spell the continuation");
        let sum: f64 = r.tokens.iter().map(|t| t.logprob).sum();
        assert!((sum - r.logprob).abs() < 1e-9);
        for t in &r.tokens {
            assert_eq!(t.top.len(), 3, "three alternatives at every position");
            assert!(t.top.windows(2).all(|w| w[0].logprob >= w[1].logprob), "likeliest first: {:?}", t.top);
            assert!(t.logprob <= t.top[0].logprob + 1e-9, "no token beats the likeliest one");
            let mass: f64 = t.top.iter().map(|a| a.logprob.exp()).sum();
            assert!(mass <= 1.0 + 1e-6, "alternatives are probabilities: {mass}");
        }
    }
    // The one-continuation form still fills the top-level fields.
    assert_eq!(together.logprob, together.results[0].logprob);
}

#[tokio::test]
async fn greedy_generation_reports_the_likeliest_token_each_time() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    let req = pb::GenerateRequest { logprobs: true, top_logprobs: 2, max_tokens: 12, ..ask("Name three colours.") };
    let answer = generate(&mut c, req).await.unwrap();
    let tokens: Vec<&pb::TokenLogprob> = answer.deltas.iter().flat_map(|d| &d.logprobs).collect();
    let counted: u32 = answer.deltas.iter().map(|d| d.tokens).sum();
    // A turn that ends brings its end token too (with no text).
    let ended = answer.done.finish_reason == pb::FinishReason::End as i32;
    assert_eq!(tokens.len() as u32, counted + u32::from(ended), "one entry per generated token");
    let pieces: Vec<u8> = tokens.iter().flat_map(|t| t.piece.to_vec()).collect();
    assert_eq!(String::from_utf8(pieces).unwrap(), answer.done.text, "the pieces spell the answer");
    for t in &tokens {
        assert_eq!(t.top.len(), 2);
        assert!((t.logprob - t.top[0].logprob).abs() < 1e-9, "greedy takes the likeliest token: {t:?}");
        assert!(t.logprob <= 0.0);
    }
    // Without asking, nothing extra is sent.
    let plain = generate(&mut c, pb::GenerateRequest { max_tokens: 12, ..ask("Name three colours.") }).await.unwrap();
    assert!(plain.deltas.iter().all(|d| d.logprobs.is_empty()));
    assert_eq!(plain.done.text, answer.done.text, "asking for log-probabilities does not change the answer");
}

#[tokio::test]
async fn score_and_logprob_limits_are_named() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    let many: Vec<String> = (0..17).map(|i| format!(" {i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let cases = [
        (score_request(&many, 0), "limit of 16"),
        (score_request(&[" a"], 21), "at most 20"),
        (score_request(&[" a", ""], 0), "continuations[1] is empty"),
        (pb::ScoreRequest { continuation: b" a".to_vec().into(), ..score_request(&[" b"], 0) }, "one or the other"),
    ];
    for (req, says) in cases {
        let e = c.wire().inference.score(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(says), "{:?} does not say {says:?}", e.message());
    }
    for (req, says) in [
        (pb::GenerateRequest { logprobs: true, top_logprobs: 21, ..ask("Hi") }, "at most 20"),
        (pb::GenerateRequest { top_logprobs: 2, ..ask("Hi") }, "set logprobs too"),
    ] {
        let e = generate(&mut c, req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(says), "{:?} does not say {says:?}", e.message());
    }
}
