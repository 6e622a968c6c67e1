//! Every bad input gets the right code and a message naming the limit, and
//! the daemon keeps serving.

use revis_client::wire::v1 as pb;
use revis_testkit::TestDaemon;
use tonic::Code;

use crate::{ask, generate, user};

async fn expect_error(c: &mut revis_client::Client, req: pb::GenerateRequest, code: Code, needle: &str) {
    let err = match c.wire().inference.generate(req).await {
        Err(s) => s,
        Ok(r) => {
            let mut stream = r.into_inner();
            loop {
                match stream.message().await {
                    Err(s) => break s,
                    Ok(None) => panic!("expected {code:?} containing {needle:?}, got a normal answer"),
                    Ok(Some(_)) => {}
                }
            }
        }
    };
    assert_eq!(err.code(), code, "{}", err.message());
    assert!(err.message().contains(needle), "message {:?} should mention {needle:?}", err.message());
}

#[tokio::test]
async fn bad_requests_get_clear_errors_and_the_daemon_keeps_serving() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    let before = generate(&mut c, ask("What is the capital of France?")).await.unwrap().done;
    let base = ask("Hi");
    let with = |f: &dyn Fn(&mut pb::GenerateRequest)| {
        let mut r = base.clone();
        f(&mut r);
        r
    };
    let cases: Vec<(pb::GenerateRequest, Code, &str)> = vec![
        (with(&|r| r.messages.clear()), Code::InvalidArgument, "messages is empty"),
        (with(&|r| r.messages[0].content = Default::default()), Code::InvalidArgument, "messages[0].content is empty"),
        (with(&|r| r.messages[0].content = b"caf\xe9".to_vec().into()), Code::InvalidArgument, "not valid UTF-8"),
        (with(&|r| r.messages[0].role = 0), Code::InvalidArgument, "role must be"),
        (with(&|r| r.tier = "tier9".into()), Code::InvalidArgument, "unknown tier \"tier9\""),
        (with(&|r| r.max_tokens = 100_000), Code::InvalidArgument, "the limit is 4096"),
        (with(&|r| r.sampling.as_mut().unwrap().temperature = Some(5.0)), Code::InvalidArgument, "sampling.temperature"),
        (with(&|r| r.sampling.as_mut().unwrap().top_p = Some(0.0)), Code::InvalidArgument, "sampling.top_p"),
        (with(&|r| r.sampling.as_mut().unwrap().min_p = Some(f32::NAN)), Code::InvalidArgument, "sampling.min_p"),
        (with(&|r| r.sampling.as_mut().unwrap().repeat_penalty = Some(0.5)), Code::InvalidArgument, "sampling.repeat_penalty"),
        (with(&|r| r.sampling.as_mut().unwrap().top_k = Some(5000)), Code::InvalidArgument, "sampling.top_k"),
        (with(&|r| r.stop = vec![vec![b'x'; 100].into()]), Code::InvalidArgument, "1 to 64 bytes"),
        (
            with(&|r| {
                r.format = pb::OutputFormat::Json as i32;
                r.json_schema = b"{not json".to_vec().into();
            }),
            Code::InvalidArgument,
            "invalid JSON schema",
        ),
        (
            with(&|r| {
                r.format = pb::OutputFormat::Json as i32;
                r.json_schema = br##"{"type":"object","properties":{"a":{"$ref":"#/nowhere"}}}"##.to_vec().into();
            }),
            Code::InvalidArgument,
            "invalid JSON schema",
        ),
        (
            // Past llama.cpp's grammar repetition limit: the error names the limit, not the binding's "returned null".
            with(&|r| {
                r.format = pb::OutputFormat::Json as i32;
                r.json_schema = br#"{"type":"array","minItems":2500,"items":{"type":"integer"}}"#.to_vec().into();
            }),
            Code::InvalidArgument,
            "llama.cpp's grammars allow at most 2000",
        ),
        (
            // 1,500 values sharing a prefix: each kept open against the whole
            // vocabulary at every token, 30 tokens took 28 s and slowed the tier.
            with(&|r| {
                r.format = pb::OutputFormat::Json as i32;
                let values: Vec<String> = (0..1500).map(|i| format!("{:28}{i:04}", "")).collect();
                r.json_schema =
                    serde_json::json!({"type": "object", "properties": {"v": {"enum": values}}}).to_string().into_bytes().into();
            }),
            Code::InvalidArgument,
            "may hold at most 15000 characters",
        ),
        (
            with(&|r| {
                r.format = pb::OutputFormat::Json as i32;
                let values: Vec<String> = (0..1500).map(|i| format!("{i}")).collect();
                r.json_schema =
                    serde_json::json!({"type": "object", "properties": {"v": {"enum": values}}}).to_string().into_bytes().into();
            }),
            Code::InvalidArgument,
            "more than 1000 alternatives",
        ),
        (with(&|r| r.json_schema = b"{}".to_vec().into()), Code::InvalidArgument, "format is not OUTPUT_FORMAT_JSON"),
        (with(&|r| r.static_messages = Some(5)), Code::InvalidArgument, "static_messages"),
        // Over our own 1 MiB text limit but under tonic's 4 MiB transport limit.
        (with(&|r| r.messages[0].content = vec![b'a'; 2 << 20].into()), Code::ResourceExhausted, "the limit is 1048576 bytes"),
        // Longer than the 2,048-token context the test daemon has.
        (with(&|r| r.messages[0].content = "word ".repeat(3000).into_bytes().into()), Code::InvalidArgument, "context holds 2048 tokens"),
    ];
    for (req, code, needle) in cases {
        expect_error(&mut c, req, code, needle).await;
    }
    // Bigger than even the 4 MiB transport limit: tonic refuses it (and
    // resets the stream while the client still sends), and the daemon lives on.
    let huge = with(&|r| r.messages[0].content = vec![b'a'; 5 << 20].into());
    let Err(err) = c.wire().inference.generate(huge).await else { panic!("expected a refusal") };
    assert!(matches!(err.code(), Code::ResourceExhausted | Code::Internal), "{err:?}");

    let score = pb::ScoreRequest { prefix: b"x".to_vec().into(), ..Default::default() };
    let err = c.wire().inference.score(score).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("continuation is empty"));
    let err = c.wire().inference.prefill(pb::PrefillRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = c.wire().admin.load_model(pb::LoadModelRequest { tier: "tier0".into() }).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    let after = generate(&mut c, ask("What is the capital of France?")).await.unwrap().done;
    assert_eq!(after.text, before.text, "the same greedy answer after the bad requests as before them");
}

#[tokio::test]
async fn a_full_queue_answers_resource_exhausted_with_a_retry_hint() {
    let d = TestDaemon::new().daemon("queue_capacity = 1\nstreams = 1").start();
    let mut c = d.client().await;
    let long = crate::long_answer(400);
    // One request running...
    let mut running = c.wire().inference.generate(long.clone()).await.unwrap().into_inner();
    loop {
        if let Some(pb::generate_event::Event::Delta(_)) = running.message().await.unwrap().unwrap().event {
            break;
        }
    }
    // ...one waiting fills the queue...
    let waiting = c.clone();
    let queued = waiting.wire().inference.generate(long).await.unwrap();
    // ...and the next is refused at once.
    let Err(err) = c.wire().inference.generate(ask("Hi")).await else { panic!("expected a refusal") };
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("queue is full"), "{}", err.message());
    assert_eq!(err.metadata().get("grpc-retry-pushback-ms").unwrap(), "1000");
    drop(running);
    drop(queued);
    // The daemon notices both callers left (the HTTP/2 resets arrive
    // asynchronously): watch its queue empty, then it serves again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while c.status().await.unwrap().queue_depth > 0 {
        assert!(std::time::Instant::now() < deadline, "abandoned requests still counted after 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut prompt = ask("Say hello to");
    prompt.messages.push(user("Say hello."));
    generate(&mut c, prompt).await.unwrap();
}
