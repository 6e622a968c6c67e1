//! The API is plain standard gRPC: Google's Python grpcio talks to revisd
//! using nothing but the .proto files.

use std::path::Path;
use std::process::Command;

use revis_client::{FinishReason, GenerateParams, Message, Runner, Sampling};
use revis_testkit::TestDaemon;

#[tokio::test]
async fn python_grpcio_calls_status_and_generate() {
    let d = TestDaemon::new().start();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new(revis_testkit::python())
        .arg(root.join("tests/python/grpcio_client.py"))
        .arg(&d.socket)
        .arg(root.join("proto"))
        .output()
        .expect("the tests' Python runs");
    assert!(out.status.success(), "grpcio client failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(v["tiers"], serde_json::json!(["tier1", "tier2", "tier3"]));
    assert_eq!(v["streamed"], v["text"], "the deltas add up to Done's text");

    // Greedy: the same request through revis's own client gets the same answer, counts and end.
    let req = GenerateParams {
        messages: vec![Message::user(v["question"].as_str().unwrap())],
        sampling: Sampling { temperature: Some(0.0), ..Default::default() },
        max_tokens: Some(v["max_tokens"].as_u64().unwrap() as u32),
        ..Default::default()
    };
    let ours = Runner::generate(&d.client().await, req, |_| {}).await.unwrap();
    assert!(!ours.text.is_empty(), "an answer");
    assert_eq!(v["text"], ours.text);
    let reason = match ours.finish_reason {
        FinishReason::End => "FINISH_REASON_END",
        FinishReason::Length => "FINISH_REASON_LENGTH",
        FinishReason::Stop => "FINISH_REASON_STOP",
        FinishReason::ToolCalls => "FINISH_REASON_TOOL_CALLS",
    };
    assert_eq!(v["finish_reason"], reason, "{v}");
    assert_eq!(
        (v["prompt_tokens"].as_u64(), v["generated_tokens"].as_u64()),
        (Some(ours.prompt_tokens.into()), Some(ours.generated_tokens.into()))
    );
}
