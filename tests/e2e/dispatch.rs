//! Tier dispatch across machines: the test's own thread enters namespace b
//! (the laptop: its local daemon and the dispatcher) and the nodes run in
//! namespace a, across a veth the test can cut. No mDNS: nodes are reached
//! at the address they were paired at.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use revis_client::dispatch::{Deadlines, Dispatcher, Offload, Placement, Route};
use revis_client::wire::v1 as pb;
use revis_client::{Client, Keyring};
use revis_client::{Done, Format, GenerateParams, Message, PrefillParams, Priority, Runner, Sampling, Tier};
use revis_orchestrator::conversation::Chat;
use revis_store::{MessageState, Role, Store};
use revis_testkit::netns::NetnsPair;
use revis_testkit::{Running, TestDaemon};

use crate::server_mode::{listen_addr, open_pairing, pairing_end};

/// Our deadlines: a short gap, so a silent node shows within it (but not
/// so short that a busy two-core machine trips it).
const DEADLINES: Deadlines = Deadlines {
    first_token: Duration::from_secs(30),
    gap: Duration::from_secs(3),
    total: Duration::from_secs(120),
    probe: Duration::from_secs(3),
};

/// A node in namespace a: server mode on, not advertised, one thread (the
/// machines of these tests share two cores).
fn node(net: &NetnsPair, name: &str) -> Running {
    TestDaemon::new()
        .daemon("threads = 1")
        .netns(&net.a.name)
        .server(&format!("enabled = true\nlisten = \"0.0.0.0:0\"\nadvertise = false\nname = \"{name}\""))
        .start()
}

/// Pairs the keyring with a node (reached over the veth).
async fn pair(keyring: &mut Keyring, net: &NetnsPair, node: &Running, name: &str) {
    let mut local = node.client().await;
    let port = listen_addr(&mut local).await.port();
    let (code, mut events) = open_pairing(&mut local).await;
    let addr = std::net::SocketAddr::from((net.a.addr, port));
    revis_client::pair(keyring, addr, name, &code.parse().unwrap(), "laptop").await.unwrap();
    assert!(matches!(pairing_end(&mut events).await, pb::pairing_event::Event::Paired(_)));
}

fn offloaded(tier: Tier, keep_local: bool) -> BTreeMap<Tier, Offload> {
    BTreeMap::from([(tier, Offload { enabled: true, node: None, keep_local })])
}

fn greedy() -> Sampling {
    Sampling { temperature: Some(0.0), ..Default::default() }
}

fn user(text: &str) -> Message {
    Message::user(text)
}

/// A long, deterministic answer: plenty of tokens to cut in the middle of.
fn counting() -> String {
    "Write a long story about a dragon who learns to fly.".to_owned()
}

/// The request for [`counting`]: greedy, 300 tokens.
fn story() -> GenerateParams {
    GenerateParams { messages: vec![user(&counting())], sampling: greedy(), max_tokens: Some(300), ..Default::default() }
}

fn node_view(d: &Dispatcher, name: &str) -> revis_client::dispatch::NodeView {
    d.nodes().into_iter().find(|n| n.name == name).unwrap()
}

/// Checks that `answer` is the node's text up to the one fallback, then
/// exactly what this machine's daemon continues from there: nothing
/// repeated, nothing lost.
async fn check_continuation(d: &Dispatcher, local: &Client, base: GenerateParams, answer: &str) {
    let fallbacks = d.fallbacks();
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    let f = &fallbacks[0];
    assert!(f.shown_bytes > 0 && f.shown_bytes < answer.len(), "{f:?}");
    let (shown, rest) = answer.split_at(f.shown_bytes);
    let req = GenerateParams { max_tokens: base.max_tokens.map(|m| m - f.shown_tokens), answer_prefix: shown.to_owned(), ..base };
    assert_eq!(Runner::generate(local, req, |_| {}).await.unwrap().text, rest, "the continuation after {f:?}");
}

/// Three machines: this test's thread in namespace b with this machine's
/// daemon (one thread), and the nodes "desk" and "attic" in namespace a,
/// both paired. Every field is bound by the caller: one left out would drop
/// (the namespaces with it).
struct ThreeMachines {
    net: NetnsPair,
    desk: Running,
    attic: Running,
    laptop: Running,
    dir: tempfile::TempDir,
    keyring: Keyring,
}

async fn three_machines() -> ThreeMachines {
    let net = NetnsPair::new();
    net.b.enter();
    let desk = node(&net, "desk");
    let attic = node(&net, "attic");
    let laptop = TestDaemon::new().daemon("threads = 1").start();
    let dir = tempfile::tempdir().unwrap();
    let mut keyring = Keyring::open(&dir.path().join("client")).unwrap();
    pair(&mut keyring, &net, &desk, "desk").await;
    pair(&mut keyring, &net, &attic, "attic").await;
    ThreeMachines { net, desk, attic, laptop, dir, keyring }
}

/// Two machines: this test's thread in namespace b with this machine's
/// daemon, and a node "desk" in namespace a, paired, with tier2 offloaded to
/// it and probed healthy.
struct Lan {
    net: NetnsPair,
    desk: Running,
    _laptop: Running,
    local: Client,
    d: Dispatcher,
    dir: tempfile::TempDir,
}

async fn lan(deadlines: Deadlines) -> Lan {
    let net = NetnsPair::new();
    net.b.enter();
    let desk = node(&net, "desk");
    let laptop = TestDaemon::new().start();
    let dir = tempfile::tempdir().unwrap();
    let mut keyring = Keyring::open(&dir.path().join("client")).unwrap();
    pair(&mut keyring, &net, &desk, "desk").await;
    let local = laptop.client().await;
    let d = Dispatcher::new(local.clone(), Some(Arc::new(keyring)), None, offloaded(Tier::Tier2, false), deadlines);
    d.refresh().await;
    assert_eq!(d.placements()[&Tier::Tier2], Placement::Node("desk".into()));
    Lan { net, desk, _laptop: laptop, local, d, dir }
}

#[tokio::test]
async fn a_node_killed_mid_answer_the_answer_continues_here_and_is_stored_once() {
    // The default deadlines: a dead node fails at once, whatever the gap.
    // Every field is bound: one left out would drop here (the namespaces with it).
    let Lan { net: _net, mut desk, _laptop, local, d, dir } = lan(Deadlines { probe: DEADLINES.probe, ..Deadlines::default() }).await;

    let store = Store::open(&dir.path().join("db")).unwrap().store;
    let conversation = store.create_conversation("").unwrap();
    let mut chat = Chat::new(d.clone(), store.clone(), conversation, Default::default());
    chat.sampling = greedy();
    chat.max_tokens = Some(300);
    // The whole greedy story, loops and all: the test compares it with the daemon's.
    chat.loop_guard = false;
    // Held closed for the whole test: the turn's background tasks (facts,
    // the audit) wait, so what ran here is the continuation alone.
    let _no_background = chat.gates().streaming();
    // What the chat sends: its prompt (rules and all), greedy, 300 tokens.
    let sent = GenerateParams { sampling: greedy(), max_tokens: Some(300), ..chat.context().unwrap().request(Tier::Tier2, &counting()) };
    let mut shown = String::new();
    let mut deltas = 0;
    let desk_pid = desk.pid();
    let done = chat
        .send(&counting(), |t| {
            shown.push_str(t);
            deltas += 1;
            if deltas == 20 {
                // SAFETY: the PID of a child this test started.
                unsafe { libc::kill(desk_pid as i32, libc::SIGKILL) };
            }
        })
        .await
        .unwrap();
    assert!(desk.wait_exit(Duration::from_secs(5)).is_some(), "the node was killed");
    assert!(deltas > 20, "the answer went on after the node died");
    assert_eq!(shown, done.text, "what was shown is the answer");
    check_continuation(&d, &local, sent, &done.text).await;
    assert!(!node_view(&d, "desk").healthy, "the breaker opened");
    assert_eq!(d.local_completed(), 1, "the continuation ran here, nothing else; fallbacks {:?}", d.fallbacks());
    let replies: Vec<_> = store.messages(conversation).unwrap().into_iter().filter(|m| m.role == Role::Assistant).collect();
    assert_eq!(replies.len(), 1);
    assert_eq!((replies[0].state, replies[0].text.as_str()), (MessageState::Complete, done.text.as_str()));
}

/// Streams [`story`] through `d`, calls `fail` after the 20th delta, and
/// returns the answer, the text shown, and the longest silence between two
/// deltas after the failure (text already on its way still arrives, then
/// nothing until the failure is noticed, then this machine continues).
async fn story_failing_at_20(d: &Dispatcher, mut fail: impl FnMut() + Send) -> (Done, String, Duration) {
    let (mut shown, mut deltas, mut last) = (String::new(), 0, Instant::now());
    let mut stall = None::<Duration>;
    let done = d
        .generate(story(), |t| {
            shown.push_str(t);
            deltas += 1;
            if let Some(s) = stall.as_mut() {
                *s = (*s).max(last.elapsed());
            }
            if deltas == 20 {
                fail();
                stall = Some(Duration::ZERO);
            }
            last = Instant::now();
        })
        .await
        .unwrap();
    (done, shown, stall.expect("the answer went past its 20th delta"))
}

#[tokio::test]
async fn a_node_that_goes_silent_is_given_up_at_the_gap_deadline() {
    let Lan { net: _net, desk, _laptop, local, d, dir: _dir } = lan(DEADLINES).await;
    // Frozen, not dead: the connection stays open and says nothing.
    let (done, shown, stall) = story_failing_at_20(&d, || desk.signal(libc::SIGSTOP)).await;
    desk.signal(libc::SIGCONT);
    eprintln!("silent node: the text stalled for {stall:?} (gap deadline {:?})", DEADLINES.gap);
    assert!(stall >= DEADLINES.gap, "given up before the gap deadline: {stall:?}");
    assert!(stall < DEADLINES.gap + Duration::from_secs(5), "given up after {stall:?}");
    assert_eq!(shown, done.text);
    check_continuation(&d, &local, story(), &done.text).await;
    assert!(!node_view(&d, "desk").healthy, "the breaker opened");
}

#[tokio::test]
async fn a_cut_link_is_noticed_within_the_gap_deadline_and_offload_resumes_when_it_is_back() {
    let Lan { net, desk: _desk, _laptop, local, d, dir: _dir } = lan(DEADLINES).await;

    let (done, shown, stall) = story_failing_at_20(&d, || net.set_link(false)).await;
    // Noticed by the gap deadline at the latest (a write into the downed
    // link may fail sooner), then this machine continues.
    eprintln!("link cut: the text stalled for {stall:?} (gap deadline {:?})", DEADLINES.gap);
    assert!(stall < DEADLINES.gap + Duration::from_secs(5), "noticed after {stall:?}; the gap deadline is {:?}", DEADLINES.gap);
    assert_eq!(shown, done.text);
    check_continuation(&d, &local, story(), &done.text).await;
    assert!(!node_view(&d, "desk").healthy, "the breaker opened");
    assert_eq!(d.placements()[&Tier::Tier2], Placement::FallenBack);

    // The link comes back: the next probe closes the breaker and work goes there again.
    net.set_link(true);
    d.refresh().await;
    assert!(node_view(&d, "desk").healthy, "{:?}", node_view(&d, "desk").last_error);
    assert_eq!(d.placements()[&Tier::Tier2], Placement::Node("desk".into()));
    // The pre-prefill goes to the node, and the answer follows it there,
    // on top of the prefix it warmed.
    let before = node_view(&d, "desk").completed;
    let history = vec![Message::system("You are terse."), user("Hi"), Message::assistant("Hello.")];
    let warm = PrefillParams { tier: Tier::Tier2, messages: history.clone(), priority: Priority::User };
    d.prefill(warm).await.unwrap();
    let mut next = history;
    next.push(user("How are you?"));
    let short = GenerateParams { messages: next, sampling: greedy(), max_tokens: Some(8), static_messages: Some(3), ..Default::default() };
    let done = d.generate(short, |_| {}).await.unwrap();
    assert_eq!(node_view(&d, "desk").completed, before + 1);
    assert!(done.cached_tokens > 0, "the answer used the prefix warmed on the node: {done:?}");
}

#[tokio::test]
async fn background_tasks_spread_over_two_nodes_and_this_machine_and_each_completes_once() {
    let ThreeMachines { net: _net, desk: _desk, attic: _attic, laptop, dir: _dir, keyring } = three_machines().await;
    // Three daemons on two cores are slow: a gap deadline to match.
    let deadlines = Deadlines { gap: Duration::from_secs(20), ..DEADLINES };
    let d = Dispatcher::new(laptop.client().await, Some(Arc::new(keyring)), None, offloaded(Tier::Tier3, true), deadlines);
    d.refresh().await;
    assert_eq!(*d.parallelism().borrow(), 3);

    let gates = revis_orchestrator::Gates::new();
    let bg = revis_orchestrator::Background::start_with(gates, Some(d.parallelism()));
    let results: Vec<_> = (0..12)
        .map(|i| {
            let d = d.clone();
            bg.submit(1, async move {
                let req = GenerateParams {
                    tier: Tier::Tier3,
                    messages: vec![user(&format!("Write one sentence about the number {i}."))],
                    sampling: greedy(),
                    max_tokens: Some(24),
                    priority: Priority::Background,
                    ..Default::default()
                };
                d.generate(req, |_| {}).await
            })
        })
        .collect();
    let mut texts = 0;
    for r in results {
        assert!(!r.await.expect("each task reports once").expect("each task succeeds").text.is_empty());
        texts += 1;
    }
    let per_target = [node_view(&d, "desk").completed, node_view(&d, "attic").completed, d.local_completed()];
    eprintln!("tasks run by desk, attic, here: {per_target:?}");
    assert_eq!(texts, 12);
    assert_eq!(per_target.iter().sum::<u64>(), 12, "every task ran exactly once: {per_target:?}");
    assert!(per_target.iter().filter(|&&n| n > 0).count() >= 2, "spread: {per_target:?}");
}

#[tokio::test]
async fn offloading_a_tier_unloads_it_here_and_it_comes_home_when_its_node_is_gone() {
    let net = NetnsPair::new();
    net.b.enter();
    let mut desk = node(&net, "desk");
    // tier3 has a model of its own here, so it can go without the others.
    let laptop = TestDaemon::new().tier_model("tier3", revis_testkit::gemma3()).start();
    let data = tempfile::tempdir().unwrap();
    let local = laptop.client().await;
    for tier in ["tier2", "tier3"] {
        local.load_model(tier.parse().unwrap()).await.unwrap();
    }

    // The CLI, as a user would: pair, offload, status.
    let revis = |args: &[&str]| {
        let out = std::process::Command::new(revis_testkit::binary("revis"))
            .args(args)
            .env("REVIS_DATA_DIR", data.path())
            .env("REVIS_SOCKET", &laptop.socket)
            .env("REVIS_MDNS_INTERFACES", "none")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "revis {args:?}: {text}");
        text
    };
    let mut dl = desk.client().await;
    let port = listen_addr(&mut dl).await.port();
    let (code, mut events) = open_pairing(&mut dl).await;
    revis(&["pair", &format!("{}:{port}", net.a.addr), "--as", "desk", "--code", &code]);
    pairing_end(&mut events).await;
    let rss_before = local.status().await.unwrap().rss_bytes;
    let out = revis(&["offload", "tier3", "on"]);
    assert!(out.contains("tier3 runs on desk now; its model was unloaded here"), "{out}");
    let s = local.status().await.unwrap();
    assert_eq!(s.tiers[2].state, revis_client::ModelState::Unloaded, "tier3 unloaded here");
    assert_eq!(s.tiers[1].state, revis_client::ModelState::Ready, "tier2 stays");
    eprintln!("memory here: {} MiB -> {} MiB", rss_before >> 20, s.rss_bytes >> 20);
    assert!(s.rss_bytes < rss_before, "memory dropped: {rss_before} -> {}", s.rss_bytes);
    let status = revis(&["status"]);
    assert!(status.contains("tier3: offloaded to desk"), "{status}");

    // The node goes away; the tier comes home by itself and the next task runs here.
    let keyring = Keyring::open(&data.path().join("client")).unwrap();
    let d = Dispatcher::new(local.clone(), Some(Arc::new(keyring)), None, offloaded(Tier::Tier3, false), DEADLINES);
    d.refresh().await;
    assert_eq!(d.placements()[&Tier::Tier3], Placement::Node("desk".into()));
    drop(dl);
    desk.signal(libc::SIGKILL);
    assert!(desk.wait_exit(Duration::from_secs(5)).is_some());
    d.refresh().await;
    assert_eq!(d.placements()[&Tier::Tier3], Placement::FallenBack);
    assert_eq!(local.status().await.unwrap().tiers[2].state, revis_client::ModelState::Ready, "tier3 came home");
    let req = GenerateParams {
        tier: Tier::Tier3,
        messages: vec![user("What is the capital of France?")],
        sampling: greedy(),
        max_tokens: Some(16),
        ..Default::default()
    };
    let done = d.generate(req, |_| {}).await.unwrap();
    assert!(!done.text.is_empty());
    assert_eq!(d.local_completed(), 1);
}

#[tokio::test]
async fn a_json_answer_whose_node_dies_while_it_works_is_started_again_here_and_arrives_once_whole() {
    let Lan { net: _net, mut desk, _laptop, local, d, dir: _dir } = lan(Deadlines { probe: DEADLINES.probe, ..Deadlines::default() }).await;
    // Eight sentences: long enough that the node is still at work when it dies.
    let schema = r#"{"type":"object","properties":{"steps":{"type":"array","items":{"type":"string","minLength":20,"maxLength":60},"minItems":8,"maxItems":8}},"required":["steps"],"additionalProperties":false}"#;
    let req = GenerateParams {
        messages: vec![user("List eight steps to bake bread, as JSON.")],
        sampling: greedy(),
        max_tokens: Some(400),
        format: Format::Json { schema: Some(schema.to_owned()) },
        ..Default::default()
    };
    let desk_admin = desk.client().await;
    let desk_pid = desk.pid();
    let mut deltas = Vec::new();
    let answer = d.generate(req.clone(), |t| deltas.push(t.to_owned()));
    // The node dies as soon as its engine is at work on the answer.
    let kill = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !desk_admin.status().await.unwrap().busy {
            assert!(Instant::now() < deadline, "the node never started the answer");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // SAFETY: the PID of a child this test started.
        unsafe { libc::kill(desk_pid as i32, libc::SIGKILL) };
    };
    let (done, ()) = tokio::join!(answer, kill);
    let done = done.expect("the caller sees one result, not the node's failure");
    assert!(desk.wait_exit(Duration::from_secs(5)).is_some(), "the node was killed");

    // One delivery, whole, and exactly what this machine answers on its own.
    assert_eq!(deltas, std::slice::from_ref(&done.text), "a JSON answer is handed over once, whole");
    let v: serde_json::Value = serde_json::from_str(&done.text).unwrap_or_else(|e| panic!("{e}: {}", done.text));
    assert_eq!(v["steps"].as_array().map(Vec::len), Some(8), "{}", done.text);
    let here = Runner::generate(&local, req, |_| {}).await.unwrap();
    assert_eq!(done.text, here.text);
    assert_eq!(done.generated_tokens, here.generated_tokens, "tokens of the discarded attempt are not counted");
    let fallbacks = d.fallbacks();
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    assert_eq!((fallbacks[0].from.as_str(), fallbacks[0].shown_bytes), ("desk", 0), "{fallbacks:?}");
    assert_eq!(d.local_completed(), 1);
    assert!(!node_view(&d, "desk").healthy, "the breaker opened");
}

/// A short question: a few tokens, quick on any of the machines.
fn question() -> GenerateParams {
    GenerateParams { messages: vec![user("What is the capital of France?")], sampling: greedy(), max_tokens: Some(8), ..Default::default() }
}

/// How long `client`'s daemon takes to answer `req` whole, on this machine
/// now: the slack a deadline here may take to be noticed is twice that (a
/// busy machine slows both alike).
async fn noticed_within(client: &Client, req: GenerateParams) -> Duration {
    let t = Instant::now();
    Runner::generate(client, req, |_| {}).await.unwrap();
    2 * t.elapsed()
}

#[tokio::test]
async fn a_node_frozen_before_its_first_token_is_left_at_the_first_token_deadline_and_the_answer_runs_on_the_other_node() {
    let ThreeMachines { net: _net, desk, attic, laptop, dir: _dir, keyring } = three_machines().await;
    // Models loaded first, so the deadline measures a silent node, not a load.
    let mut slack = Duration::ZERO;
    for n in [&desk, &attic] {
        let c = n.client().await;
        c.load_model(Tier::Tier2).await.unwrap();
        slack = slack.max(noticed_within(&c, question()).await);
    }
    // Below the connection's own keepalive (NODE_PING_INTERVAL + NODE_PING_TIMEOUT = 10 s).
    let first_token = Duration::from_secs(3);
    let d = Dispatcher::new(
        laptop.client().await,
        Some(Arc::new(keyring)),
        None,
        offloaded(Tier::Tier2, false),
        Deadlines { first_token, ..DEADLINES },
    );
    d.refresh().await;
    assert_eq!(*d.parallelism().borrow(), 3, "{:?}", d.nodes());

    // The node the answer goes to is frozen before the call: the connection stays open, nothing answers.
    let Route::Node(first) = d.choose(Tier::Tier2, false, &[]) else { panic!("offloaded, two healthy nodes") };
    let (frozen, other) = if node_view(&d, "desk").device_id == first { (&desk, "attic") } else { (&attic, "desk") };
    let frozen_name = d.nodes().into_iter().find(|n| n.device_id == first).unwrap().name;
    frozen.signal(libc::SIGSTOP);
    let t0 = Instant::now();
    let mut shown = String::new();
    let done = d.generate(question(), |t| shown.push_str(t)).await;
    frozen.signal(libc::SIGCONT);
    let done = done.unwrap();

    let fallbacks = d.fallbacks();
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    let f = &fallbacks[0];
    assert_eq!((f.from.as_str(), f.shown_bytes, f.shown_tokens), (frozen_name.as_str(), 0, 0), "{f:?}");
    let waited = f.at - t0;
    eprintln!("frozen node given up after {waited:?} (first-token deadline {first_token:?}, slack {slack:?}): {}", f.error);
    assert!(waited >= first_token && waited < first_token + slack, "given up after {waited:?}");
    assert!(f.error.ends_with(&format!("within {:.1}s", first_token.as_secs_f64())), "{f:?}");
    // Not here: to the other node, and only there.
    assert_eq!((node_view(&d, other).completed, node_view(&d, &frozen_name).completed, d.local_completed()), (1, 0, 0));
    assert!(!node_view(&d, &frozen_name).healthy, "the breaker opened");
    assert_eq!(shown, done.text);
    assert!(!done.text.is_empty());
}

#[tokio::test]
async fn a_stream_that_runs_past_the_total_deadline_is_ended_there_and_the_answer_continues_here() {
    // The gap deadline and the connection's keepalive (a ping 5 s after the
    // last frame, unanswered for 5 s more) both end a stalled stream later
    // than the total deadline would.
    let total = Duration::from_secs(6);
    let deadlines = Deadlines { first_token: Duration::from_secs(30), gap: Duration::from_secs(20), total, probe: DEADLINES.probe };
    let Lan { net: _net, desk, _laptop, local, d, dir: _dir } = lan(deadlines).await;
    // Loaded here first, and short: the continuation has a total deadline of its own.
    local.load_model(Tier::Tier2).await.unwrap();
    let req = GenerateParams { max_tokens: Some(16), ..story() };
    let slack = noticed_within(&local, req.clone()).await;
    let t0 = Instant::now();
    let mut shown = String::new();
    // After its first token the node stalls (frozen): only the total deadline is short enough to end it.
    let done = d
        .generate(req.clone(), |t| {
            if shown.is_empty() {
                desk.signal(libc::SIGSTOP);
            }
            shown.push_str(t);
        })
        .await;
    desk.signal(libc::SIGCONT);
    let done = done.unwrap();

    let f = d.fallbacks().first().cloned().expect("the node's stream was ended");
    let waited = f.at - t0;
    eprintln!("over-long stream ended after {waited:?} (total deadline {total:?}, slack {slack:?}): {}", f.error);
    assert!(waited >= total && waited < total + slack, "ended after {waited:?}");
    let said = format!("no end of the answer within {:.1}s", total.as_secs_f64());
    assert_eq!((f.from.as_str(), f.error.as_str()), ("desk", said.as_str()), "{f:?}");
    assert_eq!(shown, done.text);
    check_continuation(&d, &local, req, &done.text).await;
}

#[tokio::test]
async fn the_supervisor_finds_a_node_gone_and_brings_its_tier_home_without_being_asked() {
    let net = NetnsPair::new();
    net.b.enter();
    let mut desk = node(&net, "desk");
    // tier3 has a model of its own here, so offloading it unloads it.
    let laptop = TestDaemon::new().tier_model("tier3", revis_testkit::gemma3()).start();
    let local = laptop.client().await;
    local.load_model(Tier::Tier3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut keyring = Keyring::open(&dir.path().join("client")).unwrap();
    pair(&mut keyring, &net, &desk, "desk").await;
    let d = Dispatcher::new(local.clone(), Some(Arc::new(keyring)), None, offloaded(Tier::Tier3, false), DEADLINES);
    d.refresh().await;
    assert_eq!(d.placements()[&Tier::Tier3], Placement::Node("desk".into()));
    let tier3_here = || async { local.status().await.unwrap().tier(Tier::Tier3).unwrap().state };
    assert_eq!(tier3_here().await, revis_client::ModelState::Unloaded, "offloaded: unloaded here");

    let supervisor = d.spawn_supervisor(Duration::from_millis(200));
    desk.signal(libc::SIGKILL);
    assert!(desk.wait_exit(Duration::from_secs(5)).is_some());
    // No refresh from here on: the supervisor's own probes must notice.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(d.placements()[&Tier::Tier3] == Placement::FallenBack && tier3_here().await == revis_client::ModelState::Ready) {
        assert!(Instant::now() < deadline, "tier3 did not come home: {:?}, {:?}", d.placements(), d.nodes());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!node_view(&d, "desk").healthy);
    supervisor.abort();
}

#[tokio::test]
async fn a_node_paired_or_forgotten_through_another_keyring_gets_work_or_loses_it_at_the_next_refresh() {
    let net = NetnsPair::new();
    net.b.enter();
    let desk = node(&net, "desk");
    let laptop = TestDaemon::new().start();
    let dir = tempfile::tempdir().unwrap();
    let keyring_dir = dir.path().join("client");
    // Running, offload on, nothing paired yet.
    let keyring = Arc::new(Keyring::open(&keyring_dir).unwrap());
    let d = Dispatcher::new(laptop.client().await, Some(keyring), None, offloaded(Tier::Tier2, false), DEADLINES);
    d.refresh().await;
    assert!(d.nodes().is_empty());
    assert_eq!(d.placements()[&Tier::Tier2], Placement::FallenBack);

    // Paired through another instance on the same directory, as the GUI or `revis pair` does.
    let mut other = Keyring::open(&keyring_dir).unwrap();
    pair(&mut other, &net, &desk, "desk").await;
    d.refresh().await;
    assert_eq!(d.placements()[&Tier::Tier2], Placement::Node("desk".into()), "{:?}", d.nodes());
    d.generate(question(), |_| {}).await.unwrap();
    assert_eq!((node_view(&d, "desk").completed, d.local_completed()), (1, 0), "it ran on the node just paired");

    // Forgotten there (as `revis unpair` does): the next task runs here.
    let id = other.store.find("desk").unwrap().unwrap().device_id;
    assert!(other.store.revoke(&id).unwrap());
    d.refresh().await;
    assert!(d.nodes().is_empty(), "{:?}", d.nodes());
    assert_eq!(d.placements()[&Tier::Tier2], Placement::FallenBack);
    d.generate(question(), |_| {}).await.unwrap();
    assert_eq!(d.local_completed(), 1, "it ran here");
}
