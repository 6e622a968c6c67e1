//! Embed: any model's hidden states, mean-pooled and L2-normalised, with
//! its limits named; through the RPC as the HTTP APIs use it.

use revis_client::wire::v1 as pb;
use revis_testkit::{TestDaemon, gemma3};
use tonic::Code;

/// Texts whose first two say the same thing and whose third does not.
pub const TEXTS: [&str; 3] = ["The cat sat on the mat.", "A cat was sitting on a mat.", "Quarterly tax filings are due in April."];

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Embeddings of [`TEXTS`]: the model's size, unit length, and the two
/// that mean the same closer to each other than either is to the third.
pub fn check_embeddings(v: &[Vec<f64>], dim: usize) {
    assert_eq!(v.len(), 3);
    for e in v {
        assert_eq!(e.len(), dim, "the model's hidden size");
        let norm = cosine(e, e).sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "unit length: {norm}");
    }
    let (same, other) = (cosine(&v[0], &v[1]), cosine(&v[0], &v[2]).max(cosine(&v[1], &v[2])));
    assert!(same > other, "a paraphrase is nearer than another subject: {same} against {other}");
}

fn request(tier: &str, inputs: &[&str]) -> pb::EmbedRequest {
    pb::EmbedRequest { tier: tier.into(), inputs: inputs.iter().map(|t| t.as_bytes().to_vec().into()).collect() }
}

fn vectors(r: &pb::EmbedResponse) -> Vec<Vec<f64>> {
    r.embeddings.iter().map(|e| e.values.iter().map(|&x| f64::from(x)).collect()).collect()
}

#[tokio::test]
async fn each_model_embeds_texts_the_same_way_every_time_and_leaves_the_answers_alone() {
    let d = TestDaemon::new().tier_model("tier3", gemma3()).start();
    let mut c = d.client().await;
    let answer = |c: &mut revis_client::Client| {
        let mut c = c.clone();
        async move { crate::generate(&mut c, pb::GenerateRequest { max_tokens: 16, ..crate::ask("Name three colours.") }).await.unwrap() }
    };
    let before = answer(&mut c).await;
    let r = c.wire().inference.embed(request("tier2", &TEXTS)).await.unwrap().into_inner();
    let status = c.wire().admin.status(pb::StatusRequest {}).await.unwrap().into_inner();
    let tier2 = status.tiers.iter().find(|t| t.tier == "tier2").unwrap();
    assert_eq!(r.model, tier2.model, "the model as Status names it");
    check_embeddings(&vectors(&r), 576);
    assert!(r.embeddings.iter().all(|e| e.tokens >= 5), "{:?}", r.embeddings.iter().map(|e| e.tokens).collect::<Vec<_>>());
    // One at a time gives the same numbers: texts do not leak into each other.
    let alone = c.wire().inference.embed(request("tier2", &TEXTS[2..])).await.unwrap().into_inner();
    assert_eq!(alone.embeddings[0], r.embeddings[2]);
    // A generation after it is what it was: the answer's cache is another context.
    assert_eq!(answer(&mut c).await.done.text, before.done.text);
    // Another model, another size (Gemma 3 270M: 640).
    let g = c.wire().inference.embed(request("tier3", &TEXTS)).await.unwrap().into_inner();
    assert_eq!(g.embeddings[0].values.len(), 640);
}

#[tokio::test]
async fn embed_limits_are_named() {
    let d = TestDaemon::new().start();
    let c = d.client().await;
    let many = vec!["a"; 65];
    let long = "word ".repeat(600);
    for (req, says) in [
        (request("tier2", &many), "65 inputs is over the limit of 64"),
        (request("tier2", &[]), "inputs is empty"),
        (request("tier2", &["a", ""]), "inputs[1] is empty"),
        (request("tier2", &["a", &long]), "the limit is 512 tokens a text"),
        (request("tier9", &["a"]), "tier9"),
    ] {
        let e = c.wire().inference.embed(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(says), "{:?} does not say {says:?}", e.message());
    }
    let bad = pb::EmbedRequest { tier: "tier2".into(), inputs: vec![vec![0xff, 0xfe].into()] };
    let e = c.wire().inference.embed(bad).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("inputs[0]") && e.message().contains("UTF-8"), "{}", e.message());
}
