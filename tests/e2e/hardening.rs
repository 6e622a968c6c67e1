//! Hardening: no caller can freeze or exhaust revisd. A caller that stops
//! reading is cut off after the stall timeout while the others go on, and a
//! flood of large calls on one connection is refused before it costs memory.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use revis_client::wire::v1 as pb;
use revis_testkit::TestDaemon;
use tonic::Code;
use tonic::codegen::http;

use crate::server_mode::{listen_addr, open_pairing, pairing_end, server_daemon};
use crate::{ask, generate, user};

/// One gRPC message on the wire: not compressed, its length, the message.
fn grpc_frame(msg: &impl prost::Message) -> Bytes {
    let body = msg.encode_to_vec();
    let mut frame = Vec::with_capacity(5 + body.len());
    frame.push(0);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    frame.into()
}

/// A figure from /proc/PID/status, in bytes (VmRSS: now; VmHWM: the peak).
fn vm_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let line = status.lines().find(|l| l.starts_with(&format!("{field}:"))).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// A caller that reads nothing: raw HTTP/2 whose stream window is 0, so not
/// one byte of an answer can reach it until it opens the window (`open`).
struct Frozen {
    response: http::Response<h2::RecvStream>,
    open: tokio::sync::oneshot::Sender<()>,
    _h2: h2::client::SendRequest<Bytes>,
}

async fn frozen_generate(socket: &Path, req: &pb::GenerateRequest) -> Frozen {
    frozen_generate_opening(socket, req, 1 << 20).await
}

/// [`frozen_generate`] whose window, once opened, is `window` bytes.
async fn frozen_generate_opening(socket: &Path, req: &pb::GenerateRequest, window: u32) -> Frozen {
    let io = tokio::net::UnixStream::connect(socket).await.unwrap();
    let (h2, mut conn) = h2::client::Builder::new().initial_window_size(0).handshake::<_, Bytes>(io).await.unwrap();
    let (open, opened) = tokio::sync::oneshot::channel::<()>();
    // The connection is driven (pings, settings) but grants no window until asked.
    tokio::spawn(async move {
        tokio::select! {
            _ = &mut conn => return,
            _ = opened => {}
        }
        conn.set_initial_window_size(window).unwrap();
        let _ = conn.await;
    });
    let mut h2 = h2.ready().await.unwrap();
    let request = http::Request::post("http://localhost/revis.v1.Inference/Generate")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut body) = h2.send_request(request, false).unwrap();
    body.send_data(grpc_frame(req), true).unwrap();
    // Response headers are not flow-controlled: they come once the job is in the queue.
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    Frozen { response, open, _h2: h2 }
}

#[tokio::test]
async fn a_caller_that_never_reads_does_not_hold_up_the_others() {
    const STALL: Duration = Duration::from_secs(2);
    let d = TestDaemon::new().daemon(&format!("stall_timeout_s = {}", STALL.as_secs())).start();
    let mut c = d.client().await;
    // The model is loaded, and this is what a short answer takes here.
    let t = Instant::now();
    generate(&mut c, ask("Say hello.")).await.unwrap();
    let own = t.elapsed();

    // A long answer (far more deltas than any buffer holds) for a caller that never reads.
    let mut long = ask("Write a very long essay about rivers.");
    long.max_tokens = 4000;
    // Queued (nothing else is), so it runs before anything asked after it.
    let frozen = frozen_generate(&d.socket, &long).await;

    // Another caller's answer comes within the stall timeout plus its own time
    // (and slack for a loaded 2-core machine), not when the frozen one leaves.
    let t = Instant::now();
    let bound = STALL + own * 2 + Duration::from_secs(8);
    let second = tokio::time::timeout(bound, generate(&mut c, ask("Say hello."))).await;
    let took = t.elapsed();
    assert!(second.is_ok(), "a second caller waited more than {bound:?} behind one that never reads");
    second.unwrap().unwrap();
    eprintln!("second answer after {took:?} (own time {own:?}, stall timeout {STALL:?})");

    // The two decode together, so the second did not wait for the stall
    // timeout; the frozen one is cancelled once it passes: the engine idles.
    let deadline = Instant::now() + STALL + Duration::from_secs(30);
    while c.status().await.unwrap().busy {
        assert!(Instant::now() < deadline, "the frozen caller's answer was never cancelled");
        tokio::time::sleep(Duration::from_millis(20)).await; // a polling interval, not a wait for an event
    }

    // The frozen caller, once it reads, learns why its answer stopped.
    let _ = frozen.open.send(());
    let mut body = frozen.response.into_body();
    let mut received = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        received += chunk.len();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    eprintln!("the frozen caller then received {received} bytes");
    let trailers = body.trailers().await.unwrap().expect("trailers");
    assert_eq!(trailers["grpc-status"], (Code::DeadlineExceeded as i32).to_string());
    let message = trailers["grpc-message"].to_str().unwrap();
    assert!(message.contains("stall_timeout_s"), "{message}");
}

/// A caller that reads a trickle (one chunk of the answer every 1.5 s,
/// each within the 2 s stall timeout) keeps no place: it is cut off as a
/// frozen one is, and told why. What counts is progress, a quarter of the
/// delta buffer per stall timeout once it has fallen a buffer behind (the
/// rule's own cases are `rpc::stream`'s unit tests; through tonic's and
/// HTTP/2's buffers this reader is cut off under the old per-delta clock
/// too, so it guards the behaviour, not the change).
#[tokio::test]
async fn a_trickle_reader_is_cut_off_like_a_frozen_one() {
    const STALL: Duration = Duration::from_secs(2);
    let d = TestDaemon::new().daemon(&format!("stall_timeout_s = {}", STALL.as_secs())).start();
    let mut c = d.client().await;
    generate(&mut c, ask("Say hello.")).await.unwrap();
    // An answer that cannot end early, through a window of a few deltas.
    let frozen = frozen_generate_opening(&d.socket, &crate::long_answer(4000), 256).await;
    // The window opens, then the caller takes one chunk every 1.5 s.
    let _ = frozen.open.send(());
    let mut body = frozen.response.into_body();
    let t0 = Instant::now();
    // Once the answer is cut off, the caller reads the rest at once.
    let hurry = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = tokio::spawn({
        let hurry = hurry.clone();
        async move {
            while let Some(chunk) = body.data().await {
                let Ok(chunk) = chunk else { break };
                if !hurry.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(1500)).await; // the trickle itself, not a wait for an event
                }
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            body.trailers().await.ok().flatten()
        }
    });
    // The engine goes idle once the trickle is cut off.
    let deadline = t0 + Duration::from_secs(60);
    while c.status().await.unwrap().busy {
        assert!(Instant::now() < deadline, "a trickle reader held its answer for {:?}", t0.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await; // a polling interval, not a wait for an event
    }
    eprintln!("the trickle was cut off {:?} after it began", t0.elapsed());
    hurry.store(true, std::sync::atomic::Ordering::SeqCst);
    let trailers = reader.await.unwrap().expect("trailers");
    assert_eq!(trailers["grpc-status"], (Code::DeadlineExceeded as i32).to_string());
    let message = trailers["grpc-message"].to_str().unwrap();
    assert!(message.contains("stall_timeout_s"), "{message}");
}

/// `n` Generate calls at once on `c`'s connection, each with the one
/// message `text`: how each ended and when, counted from `started`.
async fn burst(c: &revis_client::Client, text: &Bytes, n: usize, started: Instant) -> Vec<(Result<(), tonic::Status>, Duration)> {
    let calls: Vec<_> = (0..n)
        .map(|_| {
            let mut inference = c.wire().inference.clone();
            let mut req = ask("");
            req.messages = vec![pb::ChatMessage { content: text.clone(), ..user("") }];
            tokio::spawn(async move {
                let r = inference.generate(req).await.map(|_| ());
                (r, started.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for call in calls {
        out.push(call.await.unwrap());
    }
    out
}

/// Peak resident memory since the last reset, over `before`; resets the peak.
fn peak_growth(pid: u32, before: u64) -> u64 {
    let peak = vm_bytes(pid, "VmHWM");
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak RSS");
    peak.saturating_sub(before)
}

/// The bound is measured on the same daemon: first as many calls as it
/// admits (QUEUE + 1), then CALLS of them. The flood may cost at most twice
/// what the admitted calls cost (or twice their request bytes, if less
/// showed); before admission came first, every call was decoded and
/// tokenized at once (over 1 GiB here).
#[tokio::test]
async fn a_flood_of_large_calls_on_one_connection_is_refused_before_it_costs_memory() {
    const CALLS: usize = 300;
    const QUEUE: usize = 16;
    /// Every refusal arrives within this time of the first call.
    const REFUSED_WITHIN: Duration = Duration::from_secs(10);

    let d = TestDaemon::new().daemon(&format!("queue_capacity = {QUEUE}\nstreams = 1")).start();
    let c = d.client().await;
    generate(&mut c.clone(), ask("Say hello.")).await.unwrap();
    let pid = d.pid();
    // Start the peak (VmHWM) afresh, past the model load's own.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak RSS");
    let before = vm_bytes(pid, "VmRSS");

    // Just under the request text limit, so size alone does not refuse it.
    let text = Bytes::from("word ".repeat(((1 << 20) - 1024) / 5));
    // What the daemon lets in at once, and what that costs it.
    let admitted = QUEUE + 1;
    for (result, _) in burst(&c, &text, admitted, Instant::now()).await {
        let e = result.expect_err("a 1 MiB prompt cannot fit a 2048-token context, yet it was accepted");
        assert!(matches!(e.code(), Code::InvalidArgument | Code::ResourceExhausted), "{e:?}");
    }
    let admitted_cost = peak_growth(pid, before).max(admitted as u64 * text.len() as u64);

    let started = Instant::now();
    let mut refused = 0;
    for (result, at) in burst(&c, &text, CALLS, started).await {
        let Err(e) = result else { panic!("a 1 MiB prompt cannot fit a 2048-token context, yet it was accepted") };
        match e.code() {
            Code::ResourceExhausted => {
                assert!(e.message().contains("daemon.queue_capacity"), "{}", e.message());
                assert!(at < REFUSED_WITHIN, "a refusal took {at:?}");
                refused += 1;
            }
            // Admitted, then found too long for the context after tokenizing.
            Code::InvalidArgument => assert!(e.message().contains("context"), "{}", e.message()),
            other => panic!("unexpected {other:?}: {}", e.message()),
        }
    }
    let flood_cost = peak_growth(pid, before);
    eprintln!(
        "{refused} of {CALLS} refused; RSS before {} MiB; peak growth {} MiB for {admitted} calls, {} MiB for {CALLS}; all done in {:?}",
        before >> 20,
        admitted_cost >> 20,
        flood_cost >> 20,
        started.elapsed()
    );
    assert!(refused >= CALLS - admitted, "only {refused} of {CALLS} refused");
    assert!(
        flood_cost < 2 * admitted_cost,
        "{CALLS} calls grew the peak RSS by {} MiB, {admitted} admitted ones by {} MiB",
        flood_cost >> 20,
        admitted_cost >> 20
    );
    // And the daemon serves as before.
    generate(&mut c.clone(), ask("Say hello.")).await.unwrap();
}

#[tokio::test]
async fn a_paired_device_s_status_carries_no_local_paths_or_pid() {
    let d = server_daemon();
    let mut local = d.client().await;
    let addr = listen_addr(&mut local).await;
    let mine = local.status().await.unwrap();
    assert_eq!(mine.pid, d.pid(), "the local socket still sees the PID");
    assert!(mine.tiers.iter().all(|t| t.model_path.starts_with('/')), "and the model files");

    let dir = tempfile::tempdir().unwrap();
    let (code, mut events) = open_pairing(&mut local).await;
    let mut keyring = revis_client::Keyring::open(dir.path()).unwrap();
    let id = revis_client::pair(&mut keyring, addr, "desk", &code.parse().unwrap(), "laptop").await.unwrap();
    assert!(matches!(pairing_end(&mut events).await, pb::pairing_event::Event::Paired(_)));
    let node = revis_client::Node { name: "desk".into(), device_id: id, addr };
    let remote = revis_client::Client::connect_node(&keyring, &node).await.unwrap();
    let theirs = remote.wire().admin.status(pb::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(theirs.pid, 0);
    assert_eq!(theirs.tiers.len(), 3);
    let home = std::env::var("HOME").unwrap_or_default();
    for t in &theirs.tiers {
        assert_eq!(t.model_path, "", "{t:?}");
        // The test's config names the model by its path: only the file name goes out.
        assert!(!t.model.contains('/') && !t.model.is_empty(), "{t:?}");
    }
    let text = format!("{theirs:?}");
    assert!(home.is_empty() || !text.contains(&home), "{text}");
    assert!(!text.contains(&d.dir().display().to_string()), "{text}");
}

/// A template that builds memory up within its fuel (a string doubled
/// forty times: a terabyte) aborted revisd when it rendered in revisd's own
/// process. Now it renders in a process bounded by `daemon.render_memory_mb`:
/// that process ends, the request fails naming the setting, the model is
/// marked, revisd and the other tier go on, and the model loaded again
/// renders in a new process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_template_that_takes_memory_without_end_fails_its_request_and_revisd_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let greedy = dir.path().join("greedy-template.gguf");
    let template = "{% if messages[-1]['content'] == 'boom' %}{% set s = namespace(v='ab') %}\
                    {% for i in range(40) %}{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v | length }}{% endif %}\
                    {% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}\
                    {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    revis_testkit::gguf_with_chat_template(&revis_testkit::smollm2(), &greedy, template).unwrap();
    let d = TestDaemon::new().tier_model("tier1", greedy).daemon("render_memory_mb = 256").start();
    let tier1 = |text: &str| pb::GenerateRequest { tier: "tier1".into(), messages: vec![user(text)], max_tokens: 4, ..Default::default() };
    let mut c = d.client().await;
    generate(&mut c, tier1("Hi")).await.expect("an ordinary prompt renders");
    let boom = generate(&mut c, tier1("boom")).await.expect_err("past the memory bound");
    assert_eq!(boom.code(), Code::FailedPrecondition, "{boom:?}");
    assert!(boom.message().contains("256 MiB") && boom.message().contains("daemon.render_memory_mb"), "{boom:?}");
    assert!(Path::new(&format!("/proc/{}", d.pid())).exists(), "revisd is still running");
    let again = generate(&mut c, tier1("Hi")).await.expect_err("the model is marked");
    assert!(again.code() == Code::FailedPrecondition && again.message().contains("stopped using it"), "{again:?}");
    generate(&mut c, pb::GenerateRequest { tier: "tier2".into(), ..ask("Say hello.") }).await.expect("tier2 answers");
    c.wire().admin.unload_model(pb::UnloadModelRequest { tier: "tier1".into() }).await.unwrap();
    generate(&mut c, tier1("Hi")).await.expect("loaded again, it renders in a new process");
}

/// A model whose GGUF carries a chat template that runs long (another's
/// text, as any GGUF's template is: here each pass measures an 8 MB string,
/// minutes a prompt within the fuel): its requests fail at
/// `daemon.render_timeout_s`, the model is marked so its next request fails
/// at once naming why, and another tier answers meanwhile, although two of
/// its prompts were rendering. Before, the two took both tokenizer threads
/// for minutes and every tier waited behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_template_that_runs_long_fails_its_requests_and_other_tiers_answer() {
    let dir = tempfile::tempdir().unwrap();
    let slow = dir.path().join("slow-template.gguf");
    let template = "{% set s = namespace(v='a') %}{% for i in range(23) %}{% set s.v = s.v ~ s.v %}{% endfor %}\
                    {% for i in range(100000) %}{% set n = s.v | length %}{% endfor %}{{ messages[0]['content'] }}";
    revis_testkit::gguf_with_chat_template(&revis_testkit::smollm2(), &slow, template).unwrap();
    let d = TestDaemon::new().tier_model("tier1", slow).daemon("render_timeout_s = 3").start();
    let slow_one = |text: &'static str| {
        let d = &d;
        let req = pb::GenerateRequest { tier: "tier1".into(), messages: vec![user(text)], max_tokens: 4, ..Default::default() };
        async move { generate(&mut d.client().await, req).await }
    };
    let (first, second, other) = tokio::join!(slow_one("Hi"), slow_one("Hello"), async {
        let mut c = d.client().await;
        generate(&mut c, pb::GenerateRequest { tier: "tier2".into(), ..ask("What is the capital of France?") }).await
    });
    other.expect("tier2 answers while tier1's template runs");
    let (first, second) = (first.expect_err("past the limit"), second.expect_err("past the limit"));
    let marked = |s: &tonic::Status| s.code() == Code::FailedPrecondition && s.message().contains("daemon.render_timeout_s");
    assert!(marked(&first) || marked(&second), "{first:?} {second:?}");
    for s in [&first, &second] {
        assert!(marked(s) || s.code() == Code::Unavailable, "{s:?}");
    }
    let again = generate(&mut d.client().await, pb::GenerateRequest { tier: "tier1".into(), ..ask("Hi") }).await.expect_err("marked");
    assert!(marked(&again) && again.message().contains("stopped using it"), "{again:?}");
    let mut c = d.client().await;
    generate(&mut c, pb::GenerateRequest { tier: "tier2".into(), ..ask("Say hello.") }).await.expect("tier2 still answers");
}
