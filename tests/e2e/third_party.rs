//! The API is plain standard gRPC: Google's Python grpcio talks to revisd
//! using nothing but the .proto files.

use std::path::Path;
use std::process::Command;

use revis_testkit::TestDaemon;

#[test]
fn python_grpcio_calls_status_and_generate() {
    let d = TestDaemon::new().start();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new("python3")
        .arg(root.join("tests/python/grpcio_client.py"))
        .arg(&d.socket)
        .arg(root.join("proto"))
        .output()
        .expect("python3 runs (install grpcio and grpcio-tools: see .ci/run)");
    assert!(out.status.success(), "grpcio client failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(v["tiers"], serde_json::json!(["tier1", "tier2", "tier3"]));
    assert_eq!(v["finish_reason"], "FINISH_REASON_END");
    assert_eq!(v["streamed"], v["text"]);
    assert!(v["text"].as_str().unwrap().contains("Paris"), "{v}");
}
