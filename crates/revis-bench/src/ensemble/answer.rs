//! The capitals questions answered by one model alone or by an ensemble
//! (each generation method), on one revisd or on two machines: this
//! machine's revisd and a node's in a network namespace, reached over
//! mutual TLS, each pinned to a core of its own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use revis_client::ensemble::{Ensemble, EnsembleSpec, Member as EnsembleMember, Method};
use revis_client::{Client, GenerateParams, Message, Runner, Sampling, Tier};
use revis_testkit::netns::NetnsPair;

use super::data::Capital;
use super::results::{Answers, Member, progress};
use crate::daemon::{Daemon, Extra, Launch};

/// The question as a chat message, greedy.
fn question(tier: Tier, q: &Capital, max_tokens: u32) -> GenerateParams {
    GenerateParams {
        tier,
        messages: vec![Message::user(q.question.clone())],
        sampling: Sampling { temperature: Some(0.0), ..Default::default() },
        max_tokens: Some(max_tokens),
        ..Default::default()
    }
}

/// Every question through `runner`; `calls` tells how many calls to a
/// daemon the runner has made so far (round trips, were it elsewhere).
async fn ask_all(
    label: String,
    runner: &impl Runner,
    tier: Tier,
    questions: &[Capital],
    max_tokens: u32,
    calls: impl Fn() -> u64,
) -> Answers {
    let mut out = Answers { method: label, ..Default::default() };
    let (t0, calls0) = (Instant::now(), calls());
    for (i, q) in questions.iter().enumerate() {
        match runner.generate(question(tier, q, max_tokens), |_| {}).await {
            Ok(done) => {
                out.right += usize::from(q.is_right(&done.text));
                out.generated_tokens += u64::from(done.generated_tokens);
                out.generate_us += done.generate_us;
                out.answers.push(done.text);
            }
            Err(e) => {
                out.errors.push(format!("question {i}: {}", e.message));
                out.answers.push(String::new());
            }
        }
        progress(&format!("capitals, {}", out.method), i + 1, questions.len(), t0);
    }
    out.wall = t0.elapsed();
    out.round_trips = calls() - calls0;
    out
}

/// Each model alone, then each method over both, with spans of `span` tokens.
/// `members[i]` is reached through `clients[i]`.
async fn all_ways(members: &[Member], clients: &[Client], span: u32, questions: &[Capital], max_tokens: u32) -> Vec<Answers> {
    let mut out = Vec::new();
    for (m, c) in members.iter().zip(clients) {
        // One Generate a question.
        let n = questions.len() as u64;
        let mut a = ask_all(m.name.clone(), c, m.tier, questions, max_tokens, || 0).await;
        a.round_trips = n;
        out.push(a);
    }
    for method in Method::ALL {
        let spec = EnsembleSpec { enabled: true, method, span_tokens: span, ..Default::default() };
        let ensemble_members =
            members.iter().zip(clients).map(|(m, c)| EnsembleMember { name: m.name.clone(), client: c.clone(), tier: m.tier }).collect();
        let e = Ensemble::new(ensemble_members, spec);
        let label = format!("`{method}` (K = {span})");
        out.push(ask_all(label, &e, members[0].tier, questions, max_tokens, || e.stats().calls).await);
    }
    out
}

/// The capitals part on one revisd serving both members.
pub async fn one_machine(client: &Client, members: &[Member], span: u32, questions: &[Capital], max_tokens: u32) -> Vec<Answers> {
    let clients = vec![client.clone(); members.len()];
    all_ways(members, &clients, span, questions, max_tokens).await
}

/// How the two-machine part is set up.
pub struct TwoMachines<'a> {
    pub revisd: &'a Path,
    /// The first member's model (here) and the second's (on the node).
    pub models: [PathBuf; 2],
    pub context: u32,
    pub batch: u32,
    pub span: u32,
    pub max_tokens: u32,
}

/// The capitals part on two machines: the first member on this machine's
/// revisd (core 0), the second on a node's in a network namespace (core 1),
/// paired and reached over mutual TLS across a veth. Each revisd has one
/// thread. Needs root (`ip netns`) and `taskset`.
pub fn two_machines(members: &[Member], questions: &[Capital], s: &TwoMachines<'_>) -> anyhow::Result<Vec<Answers>> {
    // This thread enters the client's namespace; the runtime's threads
    // would not, so the runtime runs on this thread alone.
    let net = NetnsPair::new();
    net.b.enter();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let launch =
            |listen, wrap| Launch { threads: 1, context: s.context, batch: s.batch, listen, wrap, speculate: "off", extra: Extra::NONE };
        let here_wrap = crate::dispatch::pinned(0);
        let mut node_wrap = vec!["ip".to_owned(), "netns".into(), "exec".into(), net.a.name.clone()];
        node_wrap.extend(crate::dispatch::pinned(1));
        let keys = tempfile::tempdir()?;
        Daemon::around(s.revisd, &s.models[0], launch(None, &here_wrap), async |here| {
            Daemon::around(s.revisd, &s.models[1], launch(Some("0.0.0.0:0"), &node_wrap), async |node| {
                let addr = SocketAddr::from((net.a.addr, crate::dispatch::port(node).await?));
                let (keyring, paired) = crate::remote::pair(node, keys.path(), addr).await?;
                let remote = Client::connect_node(&keyring, &paired).await.context("connecting to the node over mutual TLS")?;
                // Each daemon serves its one model on every tier: ask each on the member's tier.
                let clients = vec![here.client.clone(), remote];
                Ok(all_ways(members, &clients, s.span, questions, s.max_tokens).await)
            })
            .await
        })
        .await
    })
}
