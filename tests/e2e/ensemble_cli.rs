//! `revis ensemble` as a user runs it: the real binary, a real revisd, a
//! private data directory (store, keyring), a node paired on loopback. Each
//! setting is checked where it lands (the store, `revis status`), and each
//! refusal by its exit status, its message, and a store left as it was.

use std::path::Path;
use std::process::Output;

use revis_store::Store;
use revis_testkit::{Running, TestDaemon};

use crate::server_mode::{listen_addr, open_pairing, pairing_end, revis, server_daemon};

/// `revis --socket SOCKET ARGS` with its own data directory.
fn run(data: &Path, socket: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--socket", socket.to_str().unwrap()];
    all.extend_from_slice(args);
    revis(data, &all)
}

/// A command that must succeed; its stdout.
fn ok(data: &Path, socket: &Path, args: &[&str]) -> String {
    let out = run(data, socket, args);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "revis {args:?} failed ({}):\n{text}{}", out.status, String::from_utf8_lossy(&out.stderr));
    text
}

/// A command that must be refused with `code`; its stderr.
fn refused(data: &Path, socket: &Path, args: &[&str], code: i32) -> String {
    let out = run(data, socket, args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "revis {args:?}: {err}{}", String::from_utf8_lossy(&out.stdout));
    err
}

/// What the store keeps for a tier's ensemble (the store let go again before
/// the next command: sled allows one process at a time).
fn stored(data: &Path, tier: &str) -> Option<serde_json::Value> {
    let store = Store::open(&data.join("db")).unwrap().store;
    store.setting(&format!("ensemble/{tier}")).unwrap()
}

/// Pairs this data directory's keyring with `node` under the name `desk`.
async fn pair_desk(data: &Path, socket: &Path, node: &Running) {
    let mut admin = node.client().await;
    let addr = listen_addr(&mut admin).await;
    let (code, mut events) = open_pairing(&mut admin).await;
    ok(data, socket, &["pair", &addr.to_string(), "--code", &code, "--as", "desk", "--name", "laptop"]);
    assert!(matches!(pairing_end(&mut events).await, revis_client::wire::v1::pairing_event::Event::Paired(_)));
}

#[tokio::test]
async fn an_ensemble_is_set_listed_shown_by_status_and_switched_off() {
    let desk = server_daemon();
    let laptop = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let (d, s) = (data.path(), laptop.socket.as_path());
    pair_desk(d, s, &desk).await;
    assert_eq!(ok(d, s, &["ensemble"]), "tier1: no ensemble\ntier2: no ensemble\ntier3: no ensemble\n");

    let out = ok(d, s, &["ensemble", "tier2", "--members", "tier2, desk/tier3", "--method", "confident", "--span", "8"]);
    let line = "tier2: ensemble on: tier2 + desk/tier3 (confident, spans of 8 tokens)";
    assert_eq!(out.trim_end(), line);
    let kept = stored(d, "tier2").expect("kept in the store");
    assert_eq!(kept["enabled"], true);
    assert_eq!(kept["members"], serde_json::json!(["tier2", "desk/tier3"]));
    assert_eq!((kept["method"].as_str(), kept["span_tokens"].as_u64()), (Some("confident"), Some(8)));
    assert_eq!(ok(d, s, &["ensemble"]), format!("tier1: no ensemble\n{line}\ntier3: no ensemble\n"));
    assert_eq!(ok(d, s, &["ensemble", "tier2"]).trim_end(), line);

    let status = ok(d, s, &["status"]);
    assert!(status.lines().any(|l| l == format!("  {line}")), "{status}");
    let json: serde_json::Value = serde_json::from_str(&ok(d, s, &["status", "--json"])).unwrap();
    assert_eq!(json["ensembles"]["tier2"]["members"], serde_json::json!(["tier2", "desk/tier3"]), "{json}");
    assert_eq!(json["ensembles"]["tier2"]["summary"], line.trim_start_matches("tier2: ensemble "));
    assert!(json["ensembles"].get("tier1").is_none(), "{json}");

    // One setting changed: the others stay as they were.
    let out = ok(d, s, &["ensemble", "tier2", "--method", "merge", "--gate", "0.3", "--deadline-ms", "2500"]);
    assert_eq!(out.trim_end(), "tier2: ensemble on: tier2 + desk/tier3 (merge, spans of 8 tokens)");
    let kept = stored(d, "tier2").unwrap();
    assert_eq!((kept["round_deadline_ms"].as_u64(), kept["gate"].as_f64().map(|g| (g * 100.0).round())), (Some(2500), Some(30.0)));

    let out = ok(d, s, &["ensemble", "tier2", "--off"]);
    assert_eq!(out.trim_end(), "tier2: ensemble off; tier2 answers alone.");
    assert_eq!(stored(d, "tier2").unwrap()["enabled"], false, "switched off, its members kept");
    assert_eq!(ok(d, s, &["ensemble", "tier2"]).trim_end(), "tier2: ensemble off: tier2 + desk/tier3 (merge, spans of 8 tokens)");
    assert!(!ok(d, s, &["status"]).contains("ensemble"), "status shows only ensembles that are on");
    let json: serde_json::Value = serde_json::from_str(&ok(d, s, &["status", "--json"])).unwrap();
    assert_eq!(json["ensembles"], serde_json::json!({}));
    assert_eq!(ok(d, s, &["ensemble", "tier2", "--off"]).trim_end(), "tier2 has no ensemble on; it answers alone.");
}

/// `ensemble tier2 EXTRA...`.
fn set<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    [&["ensemble", "tier2"][..], extra].concat()
}

#[tokio::test]
async fn bad_settings_and_members_that_are_not_there_are_refused_and_nothing_is_kept() {
    let laptop = TestDaemon::new().start();
    let data = tempfile::tempdir().unwrap();
    let (d, s) = (data.path(), laptop.socket.as_path());

    // Refused as clap refuses a bad command line (2), with the limit named.
    for (args, says) in [
        (set(&["--members", "tier2"]), "an ensemble needs at least two members, it has 1"),
        (set(&["--members", "tier1,tier2,tier3,a/tier1,b/tier2"]), "an ensemble has at most 4 members, not 5"),
        (set(&["--members", "tier2,tier2"]), "ensemble member tier2 is listed twice"),
        (set(&["--members", "tier1,tier3", "--span", "65"]), "the span is 65 tokens: it must be between 1 and 64"),
        (set(&["--members", "tier1,tier3", "--span", "0"]), "the span is 0 tokens: it must be between 1 and 64"),
        (set(&["--members", "tier1,tier3", "--gate", "1.5"]), "the merge gate is 1.5: it must be above 0 and at most 1"),
        (set(&["--members", "tier1,tier3", "--deadline-ms", "0"]), "it must be between 1 ms and 600 s"),
        (set(&["--members", "tier1,tier9"]), "\"tier9\" is not a tier"),
        (set(&["--members", "tier1,tier3", "--method", "vote"]), "use confident, cross or merge"),
        (set(&["--members", "tier1,tier3", "--off"]), "cannot be used with"),
    ] {
        let err = refused(d, s, &args, 2);
        assert!(err.contains(says), "revis {args:?} said:\n{err}");
    }
    // Settings alone, with no members kept for the tier, cannot make an ensemble.
    assert!(refused(d, s, &set(&["--method", "merge"]), 2).contains("needs at least two members, it has 0"));

    // A member on a node that is not paired here.
    let err = refused(d, s, &set(&["--members", "tier2,cellar/tier3"]), 1);
    assert!(err.contains("ensemble member cellar/tier3: no paired node is called or has the ID \"cellar\""), "{err}");
    assert_eq!(stored(d, "tier2"), None, "nothing refused was kept");

    // A member on this machine while no revisd answers there.
    let none = d.join("nobody.sock");
    let out = run(d, &none, &set(&["--members", "tier1,tier3"]));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no revisd answers"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stored(d, "tier2"), None);

    // What is refused leaves a kept ensemble as it was.
    ok(d, s, &["ensemble", "tier2", "--members", "tier1,tier3"]);
    let before = stored(d, "tier2").unwrap();
    refused(d, s, &set(&["--span", "99"]), 2);
    assert_eq!(stored(d, "tier2").unwrap(), before);
}

/// `revis ARGS --socket SOCKET` with `input` on its stdin, which must succeed; its stdout.
fn ok_with_input(data: &Path, socket: &Path, args: &[&str], input: &str) -> String {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(revis_testkit::binary("revis"))
        .args(args)
        .arg("--socket")
        .arg(socket)
        .env("REVIS_DATA_DIR", data)
        .env("REVIS_MDNS_INTERFACES", "none")
        .env_remove("REVIS_SOCKET")
        .env_remove("REVIS_NODE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "revis {args:?} failed ({}):\n{text}{}", out.status, String::from_utf8_lossy(&out.stderr));
    text
}

/// With tier2's ensemble on, `revis run` and `revis chat` answer through it:
/// greedy, their answers are the ones the same ensemble gives through the
/// client library, and the other member's tier (a model of its own, which
/// nothing else here uses) ran.
#[tokio::test]
async fn run_and_chat_answer_through_the_tiers_ensemble() {
    use revis_client::ensemble::{Ensemble, EnsembleSpec, Member};
    use revis_client::{Runner, Sampling, Tier};
    use revis_orchestrator::prompt::PromptContext;
    // tier1 runs SmolLM2, tier2 and tier3 Gemma 3.
    let laptop = TestDaemon::new().model(revis_testkit::gemma3()).tier_model("tier1", revis_testkit::smollm2()).start();
    let data = tempfile::tempdir().unwrap();
    let (d, s) = (data.path(), laptop.socket.as_path());
    ok(d, s, &["ensemble", "tier2", "--members", "tier2,tier1", "--method", "cross", "--span", "6"]);
    let client = laptop.client().await;
    let tier1_ran = || async {
        let status = client.status().await.unwrap();
        status.tier(Tier::Tier1).expect("a tier1").cached_prefixes > 0
    };
    assert!(!tier1_ran().await);

    // The ensemble as the client library runs it, from the settings revis stored.
    let spec = EnsembleSpec::from_json(&stored(d, "tier2").expect("kept in the store"));
    assert!(spec.enabled, "{spec:?}");
    let ensemble = || {
        let member = |name: &str, tier| Member { name: name.into(), client: client.clone(), tier };
        Ensemble::new(vec![member("tier2", Tier::Tier2), member("tier1", Tier::Tier1)], spec.clone())
    };
    let greedy = |mut req: revis_client::GenerateParams| {
        req.sampling = Sampling { temperature: Some(0.0), ..Default::default() };
        req.max_tokens = Some(14);
        req
    };
    let prompt = "Name three rivers in Europe.";

    let out = ok(d, s, &["run", "--temperature", "0", "--max-tokens", "14", prompt]);
    assert!(tier1_ran().await, "the ensemble's other member ran");
    let req = greedy(revis_client::GenerateParams {
        tier: Tier::Tier2,
        messages: vec![revis_client::Message::user(prompt)],
        ..Default::default()
    });
    let expected = Runner::generate(&ensemble(), req.clone(), |_| {}).await.unwrap().text;
    assert_eq!(out, format!("{expected}\n"), "revis run answered through the ensemble");
    let alone = Runner::generate(&client, req, |_| {}).await.unwrap().text;
    eprintln!("ensemble: {expected:?}; tier2 alone: {alone:?}");

    client.unload_model(Tier::Tier1).await.unwrap();
    assert!(!tier1_ran().await);
    let out = ok_with_input(d, s, &["chat", "--new", "--no-check", "--temperature", "0", "--max-tokens", "14"], &format!("{prompt}\n"));
    assert!(tier1_ran().await, "the ensemble's other member ran");
    // `revis chat` opens with the rules of tier2's model (Gemma 3's gears, docs/QUALITY.md).
    let rules = revis_orchestrator::conversation::rules_for(&revis_models::find("gemma3-270m").unwrap().chat);
    let req = greedy(PromptContext { rules, ..Default::default() }.request(Tier::Tier2, prompt));
    let expected = Runner::generate(&ensemble(), req, |_| {}).await.unwrap().text;
    assert_eq!(out, format!("{expected}\n"), "revis chat answered through the ensemble");
}
