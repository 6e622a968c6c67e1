//! Ensembles with real daemons and the two real models (SmolLM2 and
//! Gemma 3, different tokenizers): on one machine, and on two network
//! namespaces over mutual TLS through the dispatcher.

use std::sync::Arc;
use std::time::{Duration, Instant};

use revis_client::dispatch::{Deadlines, Dispatcher};
use revis_client::ensemble::{Ensemble, EnsembleSpec, Member, Method};
use revis_client::wire::v1 as pb;
use revis_client::{Client, Done, FinishReason, Format, GenerateParams, Keyring, Message, Runner, Sampling, Tier};
use revis_testkit::netns::NetnsPair;
use revis_testkit::{TestDaemon, gemma3};

use crate::server_mode::{listen_addr, open_pairing, pairing_end};

fn spec(method: Method, span_tokens: u32) -> EnsembleSpec {
    EnsembleSpec { enabled: true, method, span_tokens, round_deadline: Duration::from_secs(30), ..Default::default() }
}

fn question(max_tokens: u32) -> GenerateParams {
    GenerateParams {
        tier: Tier::Tier2,
        messages: vec![Message::user("What is the capital of France?")],
        sampling: Sampling { temperature: Some(0.0), ..Default::default() },
        max_tokens: Some(max_tokens),
        ..Default::default()
    }
}

/// Generates through `runner`, returning the answer and the text shown.
async fn ask(runner: &impl Runner, req: GenerateParams) -> (Done, String) {
    let mut shown = String::new();
    let done = runner.generate(req, |t| shown.push_str(t)).await.unwrap();
    (done, shown)
}

#[tokio::test]
async fn each_method_answers_the_same_every_time_with_two_models_on_one_machine() {
    // One daemon: tier1 runs SmolLM2, tier2 Gemma 3.
    let d = TestDaemon::new().tier_model("tier2", gemma3()).start();
    let client = d.client().await;
    let members = vec![
        Member { name: "tier1".into(), client: client.clone(), tier: Tier::Tier1 },
        Member { name: "tier2".into(), client: client.clone(), tier: Tier::Tier2 },
    ];
    for method in Method::ALL {
        // merge with a gate of 1: the drafter is unsure of every token, so
        // the other member is asked wherever its draft has alternatives.
        let spec = EnsembleSpec { gate: 1.0, ..spec(method, 6) };
        let ensemble = Ensemble::new(members.clone(), spec);
        let (first, shown) = ask(&ensemble, question(14)).await;
        assert!(!first.text.trim().is_empty(), "{method}: an answer");
        assert_eq!(shown, first.text, "{method}: what was shown is the answer");
        let stats = ensemble.stats();
        assert!(stats.rounds >= 1 && stats.dropped == 0, "{method}: {stats:?}");
        // Every round asked every member (merge: the drafter, then the other
        // member at each unsure token, here every token with alternatives).
        match method {
            Method::Confident => assert_eq!(stats.calls, 2 * stats.rounds, "{method}: {stats:?}"),
            Method::Cross => assert!(stats.calls >= 3 * stats.rounds, "{method}: drafts and scores each round: {stats:?}"),
            Method::Merge => assert!(stats.calls > stats.rounds, "{method}: the other member was asked: {stats:?}"),
        }
        let (again, _) = ask(&ensemble, question(14)).await;
        assert_eq!(again.text, first.text, "{method}: greedy gives the same answer every time");
        eprintln!("{method}: {:?} ({stats:?})", first.text);
    }

    // A JSON answer goes through the ensemble whole, under the schema.
    let schema = r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#;
    let json = GenerateParams { format: Format::Json { schema: Some(schema.into()) }, ..question(24) };
    let ensemble = Ensemble::new(members, spec(Method::Cross, 6));
    let (done, shown) = ask(&ensemble, json).await;
    assert_eq!(shown, done.text, "shown once, whole");
    let value: serde_json::Value = serde_json::from_str(&done.text).unwrap_or_else(|e| panic!("{e}: {:?}", done.text));
    assert!(value["city"].is_string(), "{value}");
}

#[tokio::test]
async fn a_member_killed_mid_answer_leaves_one_whole_answer_from_the_other() {
    let smol = TestDaemon::new().daemon("threads = 1").start();
    let gemma = TestDaemon::new().daemon("threads = 1").model(gemma3()).start();
    let (smol_client, gemma_client) = (smol.client().await, gemma.client().await);
    let ensemble = Ensemble::new(
        vec![
            Member { name: "smol".into(), client: smol_client.clone(), tier: Tier::Tier2 },
            Member { name: "gemma".into(), client: gemma_client, tier: Tier::Tier2 },
        ],
        spec(Method::Cross, 4),
    );
    let gemma_pid = gemma.pid();
    let mut shown = String::new();
    let mut at_kill = None;
    let req = question(160);
    let done = ensemble
        .generate(req.clone(), |t| {
            shown.push_str(t);
            if at_kill.is_none() {
                at_kill = Some(shown.clone());
                // SAFETY: the PID of a child this test started.
                unsafe { libc::kill(gemma_pid as i32, libc::SIGKILL) };
            }
        })
        .await
        .expect("no error is shown: the other member finishes the answer");
    let at_kill = at_kill.expect("a first span");
    assert_eq!(shown, done.text, "what was shown is the answer");
    assert!(done.text.len() > at_kill.len(), "the answer went on after the kill: {:?}", done.text);
    assert_eq!(ensemble.stats().dropped, 1, "{:?}", ensemble.stats());
    // Nothing repeated or lost: the rest is exactly what SmolLM2 says
    // continuing from the text shown when the other member died.
    assert_eq!(done.finish_reason, FinishReason::End, "{done:?}");
    let rest = GenerateParams { answer_prefix: at_kill.clone(), ..req };
    let alone = Runner::generate(&smol_client, rest, |_| {}).await.unwrap();
    assert_eq!(format!("{at_kill}{}", alone.text), done.text);
}

#[tokio::test]
async fn when_every_member_is_gone_the_error_says_so_and_counts_what_was_shown() {
    // Both members are tiers of one daemon, killed after the first span.
    let d = TestDaemon::new().daemon("threads = 1").tier_model("tier2", gemma3()).start();
    let client = d.client().await;
    let members = vec![
        Member { name: "tier1".into(), client: client.clone(), tier: Tier::Tier1 },
        Member { name: "tier2".into(), client, tier: Tier::Tier2 },
    ];
    let ensemble = Ensemble::new(members, spec(Method::Cross, 4));
    let pid = d.pid();
    let mut shown = String::new();
    let e = ensemble
        .generate(question(160), |t| {
            if shown.is_empty() {
                // SAFETY: the PID of a child this test started.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            shown.push_str(t);
        })
        .await
        .expect_err("no member is left to answer");
    assert!(!shown.is_empty(), "a first span was shown");
    assert_eq!(e.delivered, shown.len(), "the error counts what was shown: {e:?}");
    assert_eq!(e.code, revis_client::Code::Unavailable, "{e:?}");
    assert_eq!(ensemble.stats().dropped, 2, "{:?}", ensemble.stats());
}

#[tokio::test]
async fn a_paired_node_answers_with_this_machine_and_is_dropped_within_the_round_deadline_when_its_link_is_cut() {
    let net = NetnsPair::new();
    net.b.enter();
    // The node "desk" in namespace a runs Gemma 3 as tier2; this machine SmolLM2.
    let desk = TestDaemon::new()
        .daemon("threads = 1")
        .model(gemma3())
        .netns(&net.a.name)
        .server("enabled = true\nlisten = \"0.0.0.0:0\"\nadvertise = false\nname = \"desk\"")
        .start();
    let laptop = TestDaemon::new().daemon("threads = 1").start();
    let dir = tempfile::tempdir().unwrap();
    let mut keyring = Keyring::open(&dir.path().join("client")).unwrap();
    {
        let mut c = desk.client().await;
        let port = listen_addr(&mut c).await.port();
        let (code, mut events) = open_pairing(&mut c).await;
        let addr = std::net::SocketAddr::from((net.a.addr, port));
        revis_client::pair(&mut keyring, addr, "desk", &code.parse().unwrap(), "laptop").await.unwrap();
        assert!(matches!(pairing_end(&mut events).await, pb::pairing_event::Event::Paired(_)));
    }
    let local: Client = laptop.client().await;
    let deadlines = Deadlines { probe: Duration::from_secs(3), ..Deadlines::default() };
    let d = Dispatcher::new(local, Some(Arc::new(keyring)), None, Default::default(), deadlines);
    let round_deadline = Duration::from_secs(8);
    d.set_ensemble(
        Tier::Tier2,
        EnsembleSpec {
            members: vec!["tier2".parse().unwrap(), "desk/tier2".parse().unwrap()],
            round_deadline,
            ..spec(Method::Confident, 4)
        },
    );
    d.refresh().await;
    let ensemble = d.ensemble_for(Tier::Tier2).expect("the tier has an ensemble");
    assert_eq!(ensemble.members().len(), 2, "both members are reachable");

    // Through the dispatcher, as chat sends it: the ensemble answers, over mutual TLS.
    let (through, _) = ask(&d, question(12)).await;
    let (direct, _) = ask(&ensemble, question(12)).await;
    assert_eq!(through.text, direct.text, "the dispatcher ran the tier's ensemble");
    assert_eq!(ensemble.stats().dropped, 0);

    // The link is cut after the first span: the node sits out within the
    // round deadline and this machine finishes the answer.
    let mut shown = String::new();
    let mut cut_at: Option<Instant> = None;
    let mut stall = Duration::ZERO;
    let done = ensemble
        .generate(question(60), |t| {
            shown.push_str(t);
            match cut_at {
                None => {
                    net.set_link(false);
                    cut_at = Some(Instant::now());
                }
                Some(at) if stall.is_zero() => stall = at.elapsed(),
                Some(_) => {}
            }
        })
        .await
        .expect("no error is shown");
    net.set_link(true);
    assert_eq!(shown, done.text);
    assert!(!stall.is_zero(), "text came after the cut: {:?}", done.text);
    eprintln!("link cut: the next span came after {stall:?} (round deadline {round_deadline:?})");
    assert!(stall < round_deadline + Duration::from_secs(5), "the node was dropped after {stall:?}");
    assert_eq!(ensemble.stats().dropped, 1);
    let desk_view = d.nodes().into_iter().find(|n| n.name == "desk").unwrap();
    assert!(!desk_view.healthy, "the node's breaker opened: it rejoins after a health check");
    // With the node's breaker open, the ensemble is this machine alone.
    assert_eq!(d.ensemble_for(Tier::Tier2).map(|e| e.members().len()), Some(1));
}
