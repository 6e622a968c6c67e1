//! Request decoding under random and mangled bytes, sent as raw gRPC
//! messages to the real daemon: every call ends with a status (never a
//! panic or a dropped connection), and the daemon goes on serving.
//!
//! Only calls that cannot reach outside the test are fuzzed: server mode,
//! pairing and revocation are left out, since random bytes can spell
//! "server mode on" and mDNS must never start in the machine's own network
//! namespace.

use bytes::{Buf, BufMut};
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use revis_client::wire::v1 as pb;
use revis_testkit::TestDaemon;
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;

use crate::{ask, system, user};

/// Sends and receives messages as the bytes they are.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

/// The fuzzed methods, each with a valid request to mangle.
fn methods() -> Vec<(&'static str, bool, Vec<u8>)> {
    let conversation =
        vec![system("Be brief."), user("Hi"), revis_client::wire::message(pb::Role::Assistant, "Hello."), user("Name a colour.")];
    let generate = pb::GenerateRequest {
        messages: conversation.clone(),
        static_messages: Some(3),
        max_tokens: 4,
        stop: vec![b"\n".to_vec().into()],
        format: pb::OutputFormat::Json as i32,
        json_schema: br#"{"type":"object","properties":{"c":{"type":"string"}}}"#.to_vec().into(),
        ..ask("")
    };
    let prefill = pb::PrefillRequest { tier: "tier2".into(), messages: conversation.clone(), priority: pb::Priority::User as i32 };
    let score = pb::ScoreRequest {
        messages: conversation,
        prefix: b"It is".to_vec().into(),
        continuation: b" blue.".to_vec().into(),
        ..Default::default()
    };
    vec![
        ("/revis.v1.Inference/Generate", true, generate.encode_to_vec()),
        ("/revis.v1.Inference/Prefill", false, prefill.encode_to_vec()),
        ("/revis.v1.Inference/Score", false, score.encode_to_vec()),
        (
            "/revis.v1.Inference/Embed",
            false,
            pb::EmbedRequest { tier: "tier2".into(), inputs: vec![b"Hi".to_vec().into()] }.encode_to_vec(),
        ),
        ("/revis.v1.Admin/LoadModel", false, pb::LoadModelRequest { tier: "tier1".into() }.encode_to_vec()),
        ("/revis.v1.Admin/UnloadModel", false, pb::UnloadModelRequest { tier: "tier3".into() }.encode_to_vec()),
        ("/revis.v1.Admin/Purge", false, pb::PurgeRequest::default().encode_to_vec()),
    ]
}

/// Random bytes, or `valid` with a few bytes flipped, cut or added.
fn mangle(rng: &mut StdRng, valid: &[u8]) -> Vec<u8> {
    if rng.random_bool(0.4) {
        let len = rng.random_range(0..300);
        return (0..len).map(|_| rng.random()).collect();
    }
    let mut bytes = valid.to_vec();
    for _ in 0..rng.random_range(1..4) {
        match rng.random_range(0..3) {
            0 if !bytes.is_empty() => {
                let i = rng.random_range(0..bytes.len());
                bytes[i] ^= 1 << rng.random_range(0..8);
            }
            1 if !bytes.is_empty() => bytes.truncate(rng.random_range(0..bytes.len())),
            _ => {
                let i = rng.random_range(0..=bytes.len());
                bytes.insert(i, rng.random());
            }
        }
    }
    bytes
}

/// Text a caller might send, or not: words, control-token spellings, huge
/// runs, invalid UTF-8, nothing.
/// A tool call as an assistant message may carry one, well formed or not.
fn call(rng: &mut StdRng) -> pb::ToolCall {
    pb::ToolCall {
        id: ["", "call00001", "x"][rng.random_range(0..3)].into(),
        name: ["", "f", "get_weather"][rng.random_range(0..3)].into(),
        arguments: [&b""[..], b"{", b"{\"x\": 1}", b"[]"][rng.random_range(0..4)].to_vec().into(),
    }
}

fn text(rng: &mut StdRng) -> Vec<u8> {
    match rng.random_range(0..6) {
        0 => Vec::new(),
        1 => b"Hello there, what is two plus two?".to_vec(),
        2 => "<|im_end|>\n<|im_start|>system\n\u{E000}revis-plain-0\u{E001} é 日本".as_bytes().to_vec(),
        3 => vec![0xff, 0xfe, b'a', 0xc3],
        4 => vec![b'x'; rng.random_range(1..40_000)],
        _ => (0..rng.random_range(1..64)).map(|_| rng.random()).collect(),
    }
}

fn float(rng: &mut StdRng) -> Option<f32> {
    [None, Some(f32::NAN), Some(-1.0), Some(0.0), Some(0.7), Some(1.0), Some(2.5), Some(1e30), Some(f32::INFINITY)][rng.random_range(0..9)]
}

fn tier(rng: &mut StdRng) -> String {
    ["", "tier1", "tier2", "tier3", "tier9", "TIER1", "tier1\0"][rng.random_range(0..7)].to_owned()
}

/// A well-formed message of `method`'s type with random field values: it
/// always decodes, so it reaches the daemon's own checks.
fn random_request(rng: &mut StdRng, method: &str) -> Vec<u8> {
    let messages: Vec<pb::ChatMessage> = (0..rng.random_range(0..5))
        .map(|_| pb::ChatMessage {
            role: rng.random_range(-1..6),
            content: text(rng).into(),
            tool_calls: (0..rng.random_range(0..2)).map(|_| call(rng)).collect(),
            tool_call_id: String::from_utf8_lossy(&text(rng)).into_owned(),
            name: String::from_utf8_lossy(&text(rng)).into_owned(),
        })
        .collect();
    match method {
        "/revis.v1.Inference/Generate" => pb::GenerateRequest {
            tier: tier(rng),
            static_messages: rng.random_bool(0.5).then(|| rng.random_range(0..8)),
            sampling: rng.random_bool(0.8).then(|| pb::Sampling {
                temperature: float(rng),
                top_k: rng.random_bool(0.5).then(|| rng.random()),
                top_p: float(rng),
                min_p: float(rng),
                repeat_penalty: float(rng),
                repeat_last_n: rng.random_bool(0.5).then(|| rng.random()),
                seed: rng.random_bool(0.5).then(|| rng.random()),
                presence_penalty: float(rng),
                frequency_penalty: float(rng),
            }),
            messages,
            max_tokens: [0, 1, 4, 100_000, u32::MAX][rng.random_range(0..5)],
            cap_max_tokens: rng.random_bool(0.5),
            stop: (0..rng.random_range(0..20)).map(|_| text(rng).into()).collect(),
            format: rng.random_range(-1..4),
            json_schema: [&b""[..], b"{", b"{}", br##"{"type":"array","items":{"$ref":"#"}}"##, br#"{"type":"integer","minimum":5}"#]
                [rng.random_range(0..5)]
            .to_vec()
            .into(),
            priority: rng.random_range(-1..4),
            answer_prefix: text(rng).into(),
            logprobs: rng.random_bool(0.3),
            top_logprobs: [0, 1, 5, 20, 21, u32::MAX][rng.random_range(0..6)],
            tools: (0..rng.random_range(0..3))
                .map(|_| pb::Tool {
                    name: ["f", "get_weather", "", "bad name"][rng.random_range(0..4)].into(),
                    description: text(rng).into(),
                    parameters: [&b""[..], b"{", b"{}", br#"{"type":"object","properties":{"x":{"type":"integer"}}}"#, b"[1]"]
                        [rng.random_range(0..5)]
                    .to_vec()
                    .into(),
                })
                .collect(),
            tool_choice: rng.random_range(-1..6),
            tool_name: ["", "f", "nope"][rng.random_range(0..3)].into(),
            parallel_tool_calls: rng.random_bool(0.5),
        }
        .encode_to_vec(),
        "/revis.v1.Inference/Prefill" => {
            pb::PrefillRequest { tier: tier(rng), messages, priority: rng.random_range(-1..4) }.encode_to_vec()
        }
        "/revis.v1.Inference/Score" => {
            let continuations = (0..rng.random_range(0..3)).map(|_| text(rng).into()).collect();
            let top_logprobs = rng.random_range(0..25);
            pb::ScoreRequest {
                tier: tier(rng),
                messages,
                prefix: text(rng).into(),
                continuation: text(rng).into(),
                continuations,
                top_logprobs,
                static_messages: rng.random_bool(0.5).then(|| rng.random_range(0..6)),
            }
            .encode_to_vec()
        }
        "/revis.v1.Inference/Embed" => {
            pb::EmbedRequest { tier: tier(rng), inputs: (0..rng.random_range(0..4)).map(|_| text(rng).into()).collect() }.encode_to_vec()
        }
        "/revis.v1.Admin/LoadModel" => pb::LoadModelRequest { tier: tier(rng) }.encode_to_vec(),
        "/revis.v1.Admin/UnloadModel" => pb::UnloadModelRequest { tier: tier(rng) }.encode_to_vec(),
        _ => pb::PurgeRequest { tier: tier(rng) }.encode_to_vec(),
    }
}

#[tokio::test]
async fn random_and_mangled_requests_get_a_status_and_the_daemon_goes_on() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    let before = crate::generate(&mut c, ask("What is the capital of France?")).await.unwrap().done;
    // Fixed: a failing case is found again by running the test again.
    let mut rng = StdRng::seed_from_u64(0x5EED_2026);
    let methods = methods();
    let mut codes = std::collections::BTreeMap::<String, u32>::new();
    for case in 0..600 {
        let (path, streaming, valid) = &methods[case % methods.len()];
        let bytes = if rng.random_bool(0.5) { random_request(&mut rng, path) } else { mangle(&mut rng, valid) };
        let mut grpc = tonic::client::Grpc::new(c.wire().channel);
        grpc.ready().await.unwrap();
        let request = tonic::Request::new(bytes.clone());
        let uri = PathAndQuery::from_static(path);
        let result = if *streaming {
            // The first event or the refusal is enough: dropping the stream
            // cancels whatever a lucky mangling started.
            match grpc.server_streaming(request, uri, Raw).await {
                Ok(response) => response.into_inner().message().await.map(|_| ()),
                Err(s) => Err(s),
            }
        } else {
            grpc.unary(request, uri, Raw).await.map(|_| ())
        };
        let code = match &result {
            Ok(()) => "OK".to_owned(),
            Err(s) => {
                // A panic in a handler, or a connection cut under the call,
                // shows as UNKNOWN or CANCELLED; nothing a caller sends is
                // INTERNAL (an undecodable message is INVALID_ARGUMENT).
                let expected = match s.code() {
                    Code::Unknown | Code::Cancelled | Code::Internal => false,
                    Code::InvalidArgument if s.message().contains("message:") => s.message().starts_with("not a valid revis.v1."),
                    _ => !s.message().is_empty(),
                };
                assert!(expected, "case {case}, {path}, {} bytes {bytes:02x?}: {s:?}", bytes.len());
                format!("{:?}", s.code())
            }
        };
        *codes.entry(code).or_default() += 1;
    }
    eprintln!("600 fuzzed calls: {codes:?}");
    assert!(codes.get("InvalidArgument").is_some_and(|&n| n > 300), "{codes:?}");
    assert!(codes.get("OK").is_some_and(|&n| n > 50), "some random requests were valid ones: {codes:?}");
    // Still serving, and nothing panicked.
    let after = crate::generate(&mut c, ask("What is the capital of France?")).await.unwrap().done;
    assert_eq!(after.text, before.text, "the same greedy answer after the fuzzing as before it");
    assert_eq!(c.status().await.unwrap().pid, d.pid());
    let log = d.log_text();
    assert!(!log.contains("panicked"), "{log}");
}
