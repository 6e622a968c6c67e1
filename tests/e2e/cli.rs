//! The `revis` command line as the README promises it, run as a user runs
//! it: the real binary, a real revisd, a private `REVIS_DATA_DIR` (store,
//! keyring, models dir), and each command checked by its effect (the
//! daemon's Status, the store, the keyring, which daemon did the work), not
//! only by its exit status. Nodes are paired on loopback, without mDNS.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use revis_client::wire::v1 as pb;
use revis_client::{Client, Keyring};
use revis_store::{MessageState, Role, Store};
use revis_testkit::{Running, TestDaemon};

use crate::server_mode::{listen_addr, open_pairing, pairing_end};
use crate::{ask, generate};

/// `revis` with a data directory of its own, one daemon's socket (or one
/// where nothing listens, so no command can start a daemon), and no mDNS.
struct Revis {
    data: tempfile::TempDir,
    socket: PathBuf,
}

impl Revis {
    fn new(daemon: Option<&Running>) -> Revis {
        let data = tempfile::Builder::new().prefix("revis-cli").tempdir().unwrap();
        let socket = daemon.map_or_else(|| data.path().join("no-daemon.sock"), |d| d.socket.clone());
        Revis { data, socket }
    }

    fn data(&self) -> &Path {
        self.data.path()
    }

    /// `revis ARGS` with this data directory and socket, stdin and stdout piped.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(revis_testkit::binary("revis"));
        cmd.args(args)
            .env("REVIS_DATA_DIR", self.data())
            .env("REVIS_SOCKET", &self.socket)
            .env("REVIS_MDNS_INTERFACES", "none")
            .env_remove("REVIS_NODE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn output(&self, args: &[&str], stdin: &str) -> Output {
        let mut child = self.command(args).spawn().expect("start revis");
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
        child.wait_with_output().expect("wait for revis")
    }

    /// Runs a command that must succeed; its stdout and stderr.
    fn ok_with(&self, args: &[&str], stdin: &str) -> (String, String) {
        let out = self.output(args, stdin);
        let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8_lossy(&out.stderr).into_owned());
        assert!(out.status.success(), "revis {args:?} failed ({}):\n{stdout}{stderr}", out.status);
        (stdout, stderr)
    }

    /// Runs a command that must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        self.ok_with(args, "").0
    }

    /// Runs a command that must fail; what it printed.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.output(args, "");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "revis {args:?} succeeded:\n{text}");
        text
    }

    /// The store in the data directory (shared with any `revis` running).
    fn store(&self) -> Store {
        Store::open(&self.data().join("db")).unwrap().store
    }

    /// Pairs with `node` (server mode on loopback) under `name`, as a user
    /// would: `revis pair HOST:PORT --code CODE --as NAME`.
    async fn pair(&self, node: &Running, name: &str) {
        let mut admin = node.client().await;
        let addr = listen_addr(&mut admin).await;
        let (code, mut events) = open_pairing(&mut admin).await;
        self.ok(&["pair", &addr.to_string(), "--code", &code, "--as", name, "--name", "laptop"]);
        assert!(matches!(pairing_end(&mut events).await, pb::pairing_event::Event::Paired(_)));
    }
}

/// A node in server mode on a free loopback port, not advertised, one thread.
fn node(name: &str, model: PathBuf) -> Running {
    TestDaemon::new()
        .model(model)
        .daemon("threads = 1")
        .server(&format!("enabled = true\nlisten = \"127.0.0.1:0\"\nadvertise = false\nname = \"{name}\""))
        .start()
}

/// This machine's daemon, tier2 on a model of its own (SmolLM2; the other
/// tiers share Gemma 3), so offloading tier2 can unload it here.
fn laptop() -> Running {
    TestDaemon::new().model(revis_testkit::gemma3()).tier_model("tier2", revis_testkit::smollm2()).start()
}

async fn tier(client: &mut Client, name: &str) -> revis_client::TierStatus {
    let s = client.status().await.unwrap();
    s.tiers.into_iter().find(|t| t.tier == name).unwrap_or_else(|| panic!("no {name} in Status"))
}

fn state(t: &revis_client::TierStatus) -> revis_client::ModelState {
    t.state
}

/// Whether a daemon's tier answered since it was loaded (its model holds a
/// sequence: a Generate evaluated one there). Load and unload evaluate none.
async fn worked(client: &mut Client, name: &str) -> bool {
    let t = tier(client, name).await;
    state(&t) == revis_client::ModelState::Ready && t.cached_prefixes > 0
}

/// Unloads a tier, so the next Generate there shows (see [`worked`]).
async fn unload(client: &mut Client, name: &str) {
    client.wire().admin.unload_model(pb::UnloadModelRequest { tier: name.into() }).await.unwrap();
    assert_eq!(state(&tier(client, name).await), revis_client::ModelState::Unloaded);
}

/// The line of `revis models` for a catalog entry.
fn model_line<'a>(out: &'a str, name: &str) -> &'a str {
    let lines: Vec<&str> = out.lines().filter(|l| l.split_whitespace().next() == Some(name)).collect();
    assert_eq!(lines.len(), 1, "one line for {name}:\n{out}");
    lines[0]
}

#[test]
fn models_lists_the_catalog_and_what_is_downloaded() {
    let revis = Revis::new(None);
    let dir = revis.data().join("models");
    std::fs::create_dir(&dir).unwrap();
    let (smollm2, gemma3) = (revis_models::find("smollm2-135m-instruct").unwrap(), revis_models::find("gemma3-270m").unwrap());
    // SmolLM2 is there (the file, by a link); Gemma 3 only in part.
    std::os::unix::fs::symlink(revis_testkit::smollm2(), smollm2.path_in(&dir)).unwrap();
    std::fs::write(gemma3.path_in(&dir), b"the first bytes of a download").unwrap();
    let out = revis.ok(&["models"]);
    for e in revis_models::catalog() {
        model_line(&out, e.name);
    }
    let line = model_line(&out, smollm2.name);
    assert!(line.contains(" downloaded") && !line.contains("not downloaded"), "{line}");
    assert!(line.contains("(default)") == (smollm2.name == revis_models::DEFAULT_MODEL), "{line}");
    assert!(model_line(&out, gemma3.name).contains("not downloaded"), "a partial file is not a model:\n{out}");
    assert!(out.contains(&format!("models directory: {}", dir.display())), "{out}");

    std::fs::remove_file(gemma3.path_in(&dir)).unwrap();
    std::os::unix::fs::symlink(revis_testkit::gemma3(), gemma3.path_in(&dir)).unwrap();
    let out = revis.ok(&["models"]);
    assert!(!model_line(&out, gemma3.name).contains("not downloaded"), "{out}");
}

/// The speed column of a `revis models` line ("...   98 t/s ...").
fn speed_of(line: &str) -> f64 {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "t/s").unwrap_or_else(|| panic!("no speed in {line}"));
    words[at - 1].parse().unwrap_or_else(|_| panic!("no speed in {line}"))
}

/// A process that keeps one core busy until dropped (ended by its PID).
struct Spinner(std::process::Child);

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// With a catalog model downloaded, `revis models` decodes a few tokens of
/// the smallest one (`revisd measure-speed`) and estimates the others from
/// that: the measured model shows what it decoded, a larger one less. With
/// another program keeping a core busy it says so. (How close the
/// estimates come to `revis-bench speed` is `revis-bench estimate`'s.)
#[test]
fn models_estimates_speeds_from_a_real_decode_and_says_when_the_machine_is_busy() {
    let revis = Revis::new(None);
    let dir = revis.data().join("models");
    std::fs::create_dir(&dir).unwrap();
    let (smollm2, gemma3) = (revis_models::find("smollm2-135m-instruct").unwrap(), revis_models::find("gemma3-270m").unwrap());
    std::os::unix::fs::symlink(revis_testkit::smollm2(), smollm2.path_in(&dir)).unwrap();
    std::os::unix::fs::symlink(revis_testkit::gemma3(), gemma3.path_in(&dir)).unwrap();
    let out = revis.ok(&["models"]);
    let smol = model_line(&out, smollm2.name);
    assert!(smol.ends_with("(speed measured here)"), "{out}");
    let said = format!("speeds scaled from {} decoding at ", smollm2.name);
    let decoded: f64 = out
        .split(&said)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(speed_of(smol), decoded, "the measured model shows what it decoded:\n{out}");
    let gemma = model_line(&out, gemma3.name);
    assert!(!gemma.contains("measured"), "{gemma}");
    assert!(speed_of(gemma) < decoded, "twice the parameters decode slower:\n{out}");
    assert!(out.contains("what smollm2-135m-instruct reached here"), "{out}");

    let _busy = Spinner(Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap());
    let out = revis.ok(&["models"]);
    assert!(out.contains("BUSY: other programs kept about"), "{out}");
}

/// REVIS_YES as people write it (the README says `REVIS_YES=1`); a value
/// that means nothing is an error that names the variable and what it
/// takes, before anything is done.
#[test]
fn revis_yes_takes_what_people_write_and_names_itself_when_wrong() {
    let revis = Revis::new(None);
    for value in ["1", "0", "yes", "no", "true", "false", "on", "off", "YES", ""] {
        let out = revis.command(&["models"]).env("REVIS_YES", value).output().unwrap();
        assert!(out.status.success(), "REVIS_YES={value:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = revis.command(&["models"]).env("REVIS_YES", "maybe").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("REVIS_YES") && err.contains("\"maybe\"") && err.contains("1 or 0, yes or no, true or false, on or off"), "{err}");
}

#[test]
fn profile_shows_the_facts_revis_has_learned_and_the_person_forgets_and_adds() {
    let revis = Revis::new(None);
    assert!(revis.ok(&["profile"]).contains("revis has not learned anything about you yet"));
    let store = revis.store();
    let conversation = store.create_conversation("").unwrap();
    let told = store.append_user(conversation, "Hi! I live in Lyon now.").unwrap();
    let facts = ["The user's name is Ada.", "The user lives in Lyon.", "The user plays the cello."];
    let ids: Vec<_> = facts
        .iter()
        .enumerate()
        .map(|(i, f)| {
            if i == 1 { store.add_fact_said(f, Some(told), Some("I live in Lyon now.")) } else { store.add_fact(f, None) }.unwrap()
        })
        .collect();
    store.remove_fact(ids[0]).unwrap();
    drop(store);
    let out = revis.ok(&["profile"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], format!("{:>4}  {}", ids[1].0, facts[1]), "{out}");
    assert_eq!(
        lines[1],
        format!("      from what you said in conversation {conversation} (message {told}), just now: \"I live in Lyon now.\""),
        "where and when: {out}"
    );
    assert_eq!(lines[2], format!("{:>4}  {}", ids[2].0, facts[2]), "{out}");
    assert_eq!(lines[3], "      added or merged just now", "{out}");
    assert_eq!(lines.len(), 4, "the facts the store holds, oldest first, with their ids: {out}");

    // Forgotten, it is gone; a fact that is not there is an error naming it.
    assert_eq!(revis.ok(&["profile", "forget", &ids[1].0.to_string()]).trim(), format!("forgot fact {}", ids[1]));
    assert!(!revis.ok(&["profile"]).contains(facts[1]));
    let err = revis.fails(&["profile", "forget", &ids[1].0.to_string()]);
    assert!(err.contains(&format!("there is no fact {}", ids[1])), "{err}");
    // Added in the first person, it is kept as the person's words; once.
    let added = revis.ok(&["profile", "add", "I'm vegetarian"]);
    assert!(added.ends_with("The user said: \"I'm vegetarian\"\n"), "{added}");
    assert!(revis.ok(&["profile", "add", "I'm vegetarian"]).contains("revis knows that already"));
    let long = "x".repeat(161);
    assert!(revis.fails(&["profile", "add", &long]).contains("at most 160"));
    assert_eq!(revis.store().facts().unwrap().len(), 2);
    assert_eq!(revis.ok(&["profile", "forget", "--all"]).trim(), "forgot 2 facts");
    assert!(revis.ok(&["profile"]).contains("revis has not learned anything about you yet"));
}

#[tokio::test]
async fn unload_frees_the_tier_and_status_shows_it_unloaded() {
    let d = TestDaemon::new().start();
    let revis = Revis::new(Some(&d));
    let mut c = d.client().await;
    let out = revis.ok(&["load", "tier1"]);
    let loaded = tier(&mut c, "tier1").await;
    assert!(out.starts_with(&format!("tier1: {} ready in", loaded.model)), "{out}");
    assert_eq!(state(&loaded), revis_client::ModelState::Ready);
    assert!(loaded.memory_bytes > 0);

    let out = revis.ok(&["unload", "tier1"]);
    assert!(out.starts_with(&format!("tier1: {} unloaded; daemon memory ", loaded.model)), "{out}");
    let t = tier(&mut c, "tier1").await;
    assert_eq!((state(&t), t.memory_bytes), (revis_client::ModelState::Unloaded, 0));
    // What it printed is the daemon's memory before and after: it fell.
    let mib: Vec<u64> =
        out.trim_end().trim_end_matches(" MiB").split(" MiB -> ").map(|s| s.rsplit(' ').next().unwrap().parse().unwrap()).collect();
    assert!(mib[1] < mib[0], "{out}");
    let json: serde_json::Value = serde_json::from_str(&revis.ok(&["status", "--json"])).unwrap();
    assert_eq!(json["tiers"][0]["tier"], "tier1");
    assert_eq!(json["tiers"][0]["state"], "unloaded", "{json}");

    let out = revis.fails(&["unload", "tier9"]);
    assert!(out.contains("tier9"), "{out}");
}

#[tokio::test]
async fn run_with_a_seed_samples_the_same_answer_and_the_seed_decides_it() {
    let d = TestDaemon::new().start();
    let revis = Revis::new(Some(&d));
    let run = |seed: u64| {
        let seed = seed.to_string();
        let args = ["run", "--temperature", "1.0", "--max-tokens", "16", "--seed", &seed, "--verbose", "Write a sentence about the sea."];
        let (text, stats) = revis.ok_with(&args, "");
        assert!(stats.contains(&format!("seed {seed}]")), "the daemon used the seed given: {stats}");
        text
    };
    let first = run(42);
    assert!(!first.trim().is_empty());
    assert_eq!(run(42), first, "the same seed, the same answer");
    // Sampled at temperature 1: some other seed gives another answer.
    assert!((1..=3).any(|seed| run(seed) != first), "every seed gave {first:?}");
}

#[tokio::test]
async fn run_json_with_a_schema_answers_json_that_matches_the_schema() {
    let d = TestDaemon::new().start();
    let revis = Revis::new(Some(&d));
    // Keys the model would not choose on its own: only the schema names them.
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "harbour_name": {"type": "string", "minLength": 2, "maxLength": 24},
            "ship_count": {"type": "integer", "minimum": 3, "maximum": 9},
            "has_lighthouse": {"type": "boolean"},
            "weather": {"enum": ["calm", "windy", "stormy"]}
        },
        "required": ["harbour_name", "ship_count", "has_lighthouse", "weather"],
        "additionalProperties": false
    });
    let path = revis.data().join("harbour.json");
    std::fs::write(&path, schema.to_string()).unwrap();
    let path = path.to_str().unwrap();
    let out = revis.ok(&["run", "--json", "--schema", path, "--temperature", "0", "--max-tokens", "160", "Describe a small harbour."]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    let o = v.as_object().unwrap_or_else(|| panic!("not an object: {v}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["harbour_name", "has_lighthouse", "ship_count", "weather"], "{v}");
    let name = o["harbour_name"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!((2..=24).contains(&name.chars().count()), "{v}");
    assert!(o["ship_count"].as_u64().is_some_and(|n| (3..=9).contains(&n)), "{v}");
    assert!(o["has_lighthouse"].is_boolean(), "{v}");
    assert!(["calm", "windy", "stormy"].iter().any(|w| o["weather"] == *w), "{v}");
    // A schema that cannot be read is said so, by its path.
    let missing = revis.data().join("missing.json");
    let out = revis.fails(&["run", "--json", "--schema", missing.to_str().unwrap(), "Hi"]);
    assert!(out.contains(&format!("reading schema {}", missing.display())), "{out}");
}

/// The prompt and generated token counts `--verbose` printed, one per answer.
fn token_counts(stderr: &str) -> Vec<(u32, u32)> {
    stderr
        .lines()
        .filter_map(|l| {
            let l = l.strip_prefix('[')?;
            let (prompt, rest) = l.split_once(" prompt tokens (")?;
            let generated = rest.split_once(" generated")?.0.rsplit(' ').next()?;
            Some((prompt.parse().ok()?, generated.parse().ok()?))
        })
        .collect()
}

/// The daemon's largest `max_tokens` in the chat test: the answers ask for
/// fewer, the turn's background tasks (facts and audit: 256 and 512 tokens)
/// for more, so the daemon refuses those at once and each `revis chat` ends
/// with its answer (they take about 20 s a turn on SmolLM2 here). So no fact
/// is learned either, and only earlier turns lengthen a prompt.
const CHAT_TOKEN_LIMIT: &str = "max_tokens_limit = 64\ndefault_max_tokens = 64";

#[tokio::test]
async fn chat_continues_the_latest_conversation_with_what_was_said_before() {
    let d = TestDaemon::new().daemon(CHAT_TOKEN_LIMIT).start();
    let revis = Revis::new(Some(&d));
    let line = "Name a colour.";
    // One piped message; its answer, and the prompt and generated token counts.
    let chat = |extra: &[&str]| {
        let mut args = vec!["chat", "--temperature", "0", "--max-tokens", "12", "--verbose"];
        args.extend_from_slice(extra);
        let (answer, stderr) = revis.ok_with(&args, &format!("{line}\n"));
        let counts = token_counts(&stderr);
        assert_eq!(counts.len(), 1, "one answer: {stderr}");
        (answer.trim().to_owned(), counts[0])
    };
    use {MessageState::Complete, Role::*};
    // The conversations, most recently updated first: each one's messages.
    let conversations = || {
        let store = revis.store();
        assert!(store.facts().unwrap().is_empty(), "no fact was learned");
        let all = store.conversations().unwrap();
        all.iter()
            .map(|c| store.messages(c.id).unwrap().into_iter().map(|m| (m.role, m.text.trim().to_owned(), m.state)).collect())
            .collect::<Vec<Vec<_>>>()
    };
    let turn = |role, text: &str| (role, text.to_owned(), Complete);

    let (first, (prompt1, generated1)) = chat(&[]);
    let (second, (prompt2, _)) = chat(&[]);
    assert!(
        prompt2 >= prompt1 + generated1,
        "the second chat's prompt ({prompt2} tokens) holds the first turn ({prompt1} + an answer of {generated1})"
    );
    let one = vec![turn(User, line), turn(Assistant, &first), turn(User, line), turn(Assistant, &second)];
    assert_eq!(conversations(), std::slice::from_ref(&one), "the second chat continued the first");

    // --new starts another; then the latest is that one, not the first.
    let (third, (prompt3, _)) = chat(&["--new"]);
    assert_eq!(prompt3, prompt1, "a new conversation starts from nothing");
    let (fourth, (prompt4, _)) = chat(&[]);
    assert_eq!(prompt4, prompt2, "the same history, as long");
    let two = vec![turn(User, line), turn(Assistant, &third), turn(User, line), turn(Assistant, &fourth)];
    assert_eq!(conversations(), [two, one]);
}

/// Several client processes at once on one database: a `revis chat` left
/// open holds it; `revis history` and a second `revis chat` work beside it
/// and see its turn; killed with -9, the next process holds the database,
/// and nothing acknowledged is lost. Before, the second process failed with
/// "the database ... is in use by another process".
#[tokio::test]
async fn chat_history_and_another_chat_run_side_by_side_and_survive_kill_9() {
    let d = TestDaemon::new().daemon(CHAT_TOKEN_LIMIT).start();
    let revis = Revis::new(Some(&d));
    let mut open_chat =
        revis.command(&["chat", "--temperature", "0", "--max-tokens", "8"]).stderr(Stdio::null()).spawn().expect("start revis chat");
    let mut input = open_chat.stdin.take().unwrap();
    std::io::Write::write_all(&mut input, b"Name a colour.\n").unwrap();
    // Its answer printed is its turn stored; the chat stays open for more.
    let mut answer = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(open_chat.stdout.take().unwrap()), &mut answer).unwrap();
    let listed = revis.ok(&["history"]);
    assert!(listed.contains("Name a colour."), "another process lists the open chat's turn:\n{listed}");
    // A second chat beside it continues the same (latest) conversation.
    let (second, _) = revis.ok_with(&["chat", "--temperature", "0", "--max-tokens", "8"], "Name a fruit.\n");
    assert!(!second.trim().is_empty());
    // The first, killed with -9 while it holds the database.
    open_chat.kill().unwrap();
    open_chat.wait().unwrap();
    drop(input);
    let id = revis.ok(&["history"]).split_whitespace().next().unwrap().to_owned();
    let shown = revis.ok(&["history", "show", &id]);
    assert_eq!(shown.matches("you: ").count(), 2, "both turns, from both processes:\n{shown}");
    assert_eq!(shown.matches("revis: ").count(), 2, "{shown}");
    assert!(shown.contains(answer.trim()), "the first process's answer as it printed it:\n{shown}");
}

#[tokio::test]
async fn unpair_forgets_the_node_here() {
    let desk = node("desk", revis_testkit::smollm2());
    let revis = Revis::new(None);
    revis.pair(&desk, "desk").await;
    let status: serde_json::Value = serde_json::from_str(&revis.ok(&["--node", "desk", "status", "--json"])).unwrap();
    assert_eq!(status["name"], "desk");
    let id = status["device_id"].as_str().unwrap().to_owned();

    let out = revis.ok(&["unpair", "desk"]);
    assert!(out.starts_with(&format!("Forgot desk ({id})")), "{out}");
    let keyring = Keyring::open(&revis.data().join("client")).unwrap();
    assert!(keyring.store.devices().is_empty(), "the keyring still pins {:?}", keyring.store.devices());
    drop(keyring);
    assert!(revis.fails(&["--node", "desk", "status"]).contains("desk"));
    assert!(revis.fails(&["unpair", "desk"]).contains("no paired node is called or has the ID \"desk\""));
    assert!(revis.fails(&["offload", "tier2", "on"]).contains("no node is paired yet"));
}

/// Tokens of the short answers of the offload tests.
const SHORT: u32 = 16;

/// `revis run`, greedy, [`SHORT`]; what it printed.
fn run_greedy(revis: &Revis, prompt: &str) -> String {
    revis.ok(&["run", "--temperature", "0", "--max-tokens", &SHORT.to_string(), prompt]).trim_end().to_owned()
}

#[tokio::test]
async fn offload_on_sends_revis_run_to_the_node_and_off_brings_it_home() {
    // Different models, so an answer tells which daemon wrote it.
    let desk = node("desk", revis_testkit::gemma3());
    let laptop = laptop();
    let revis = Revis::new(Some(&laptop));
    let (mut there, mut here) = (desk.client().await, laptop.client().await);
    let prompt = "Name three rivers.";
    let from_desk = generate(&mut there, pb::GenerateRequest { max_tokens: SHORT, ..ask(prompt) }).await.unwrap().done.text;
    let from_here = generate(&mut here, pb::GenerateRequest { max_tokens: SHORT, ..ask(prompt) }).await.unwrap().done.text;
    assert_ne!(from_desk.trim_end(), from_here.trim_end(), "the two models answer alike; pick another prompt");
    unload(&mut there, "tier2").await;
    revis.pair(&desk, "desk").await;

    let out = revis.ok(&["offload", "tier2", "on"]);
    assert_eq!(out.trim_end(), "tier2 runs on desk now; its model was unloaded here.");
    assert_eq!(state(&tier(&mut here, "tier2").await), revis_client::ModelState::Unloaded);
    let status = revis.ok(&["status"]);
    assert!(status.contains("  tier2: offloaded to desk ("), "{status}");
    assert_eq!(run_greedy(&revis, prompt), from_desk.trim_end(), "the node's answer");
    assert!(worked(&mut there, "tier2").await, "the node ran it");
    assert_eq!(state(&tier(&mut here, "tier2").await), revis_client::ModelState::Unloaded, "this machine's daemon got no Generate");

    let out = revis.ok(&["offload", "tier2", "off"]);
    assert_eq!(out.trim_end(), "tier2 runs here.");
    assert!(!worked(&mut here, "tier2").await, "loaded again, nothing run yet");
    assert_eq!(state(&tier(&mut here, "tier2").await), revis_client::ModelState::Ready, "the model was loaded here again");
    assert!(!revis.ok(&["status"]).contains("offloaded"));
    unload(&mut there, "tier2").await;
    assert_eq!(run_greedy(&revis, prompt), from_here.trim_end(), "this machine's answer");
    assert!(worked(&mut here, "tier2").await);
    assert_eq!(state(&tier(&mut there, "tier2").await), revis_client::ModelState::Unloaded, "the node got no Generate");
}

#[tokio::test]
async fn offload_to_a_named_node_runs_there_only() {
    let desk = node("desk", revis_testkit::smollm2());
    let mut attic = node("attic", revis_testkit::smollm2());
    let laptop = laptop();
    let revis = Revis::new(Some(&laptop));
    revis.pair(&desk, "desk").await;
    revis.pair(&attic, "attic").await;
    let mut here = laptop.client().await;
    let mut nodes = [("desk", desk.client().await), ("attic", attic.client().await)];
    assert!(revis.fails(&["offload", "tier2", "on", "--node", "cellar"]).contains("no paired node is called or has the ID \"cellar\""));

    // Each in turn, so one of them is not the node the dispatcher would pick by itself.
    for chosen in ["attic", "desk"] {
        let out = revis.ok(&["offload", "tier2", "on", "--node", chosen]);
        assert_eq!(out.trim_end(), format!("tier2 runs on {chosen} now; its model was unloaded here."));
        let status = revis.ok(&["status"]);
        assert!(status.contains(&format!("  tier2: offloaded to {chosen} (")), "{status}");
        for (_, c) in &mut nodes {
            if state(&tier(c, "tier2").await) == revis_client::ModelState::Ready {
                unload(c, "tier2").await;
            }
        }
        assert!(!run_greedy(&revis, "Name a fruit.").is_empty());
        for (name, c) in &mut nodes {
            assert_eq!(worked(c, "tier2").await, *name == chosen, "{name} ran it: offload --node {chosen}");
        }
        assert_eq!(state(&tier(&mut here, "tier2").await), revis_client::ModelState::Unloaded, "nothing ran here");
    }

    // The named node gone, the other one healthy: the tier runs here, not there.
    revis.ok(&["offload", "tier2", "on", "--node", "attic"]);
    drop(nodes);
    attic.signal(libc::SIGKILL);
    assert!(attic.wait_exit(std::time::Duration::from_secs(5)).is_some());
    let out = revis.ok(&["offload", "tier2", "on", "--node", "attic"]);
    assert_eq!(out.trim_end(), "tier2 is offloaded, but no paired node that serves it answers now: it runs here until one does.");
    let mut desk_admin = desk.client().await;
    unload(&mut desk_admin, "tier2").await;
    assert!(!run_greedy(&revis, "Name a fruit.").is_empty());
    assert!(worked(&mut here, "tier2").await, "it ran here");
    assert_eq!(state(&tier(&mut desk_admin, "tier2").await), revis_client::ModelState::Unloaded, "not on the node it was not offloaded to");
}

#[tokio::test]
async fn offload_keep_local_keeps_the_model_here_and_answers_still_run_on_the_node() {
    let desk = node("desk", revis_testkit::smollm2());
    let laptop = laptop();
    let revis = Revis::new(Some(&laptop));
    revis.pair(&desk, "desk").await;
    let (mut there, mut here) = (desk.client().await, laptop.client().await);
    revis.ok(&["load", "tier2"]);

    let out = revis.ok(&["offload", "tier2", "on", "--keep-local"]);
    assert_eq!(out.trim_end(), "tier2 runs on desk now (and here).");
    let status = revis.ok(&["status"]);
    assert!(status.contains("  tier2: offloaded to desk ("), "{status}");
    let model = tier(&mut here, "tier2").await.model;
    let line = status.lines().find(|l| l.trim_start().starts_with(&format!("tier2: {model}"))).unwrap_or_else(|| panic!("{status}"));
    assert!(line.contains(" ready "), "kept loaded here: {status}");
    assert!(!run_greedy(&revis, "Name a fruit.").is_empty());
    assert!(worked(&mut there, "tier2").await, "the node ran it");
    let t = tier(&mut here, "tier2").await;
    assert_eq!((state(&t), t.cached_prefixes), (revis_client::ModelState::Ready, 0), "loaded here, and it ran nothing here");

    // Without --keep-local the same switch unloads it here...
    let out = revis.ok(&["offload", "tier2", "on"]);
    assert_eq!(out.trim_end(), "tier2 runs on desk now; its model was unloaded here.");
    assert_eq!(state(&tier(&mut here, "tier2").await), revis_client::ModelState::Unloaded);
    // ...and with it again the model is here again, as it says.
    let out = revis.ok(&["offload", "tier2", "on", "--keep-local"]);
    assert_eq!(out.trim_end(), "tier2 runs on desk now (and here).");
    assert_eq!(state(&tier(&mut here, "tier2").await), revis_client::ModelState::Ready, "--keep-local loads it here");
}

#[tokio::test]
async fn offloading_a_tier_whose_model_another_tier_uses_here_says_the_model_stays() {
    let desk = node("desk", revis_testkit::smollm2());
    // Every tier on one model here: tier1 and tier3 still run here.
    let laptop = TestDaemon::new().start();
    let revis = Revis::new(Some(&laptop));
    revis.pair(&desk, "desk").await;
    let (mut there, mut here) = (desk.client().await, laptop.client().await);
    revis.ok(&["load", "tier2"]);

    let out = revis.ok(&["offload", "tier2", "on"]);
    let t = tier(&mut here, "tier2").await;
    assert_eq!(state(&t), revis_client::ModelState::Ready, "tier1 and tier3 still use the model here");
    assert_eq!(out.trim_end(), "tier2 runs on desk now; its model stays loaded here for tier1 and tier3.");
    assert!(!run_greedy(&revis, "Name a fruit.").is_empty());
    assert!(worked(&mut there, "tier2").await, "the node ran it");
    assert_eq!(tier(&mut here, "tier2").await.cached_prefixes, 0, "nothing ran here");
}

/// A URL where nothing listens: connection refused at once.
fn nothing_listens() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

/// `revis run "Hi"` as a new user runs it (the default socket, no daemon), with
/// Hugging Face and PyPI where nothing listens, in `home`: its stderr.
fn run_where_nothing_can_be_downloaded(home: &Path, config: Option<&Path>) -> (bool, String) {
    let runtime = home.join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let (hf, pypi) = (nothing_listens(), nothing_listens());
    let mut cmd = Command::new(revis_testkit::binary("revis"));
    cmd.args(["run", "Hi"])
        .env("HOME", home)
        .env("REVIS_DATA_DIR", home.join("data"))
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("HF_ENDPOINT", &hf)
        .env("HF_HOME", home.join("hf"))
        .env("PIP_INDEX_URL", format!("{pypi}/simple"))
        .env("REVIS_MDNS_INTERFACES", "none")
        .env_remove("REVIS_SOCKET")
        .env_remove("REVIS_NODE")
        .env_remove("REVIS_YES")
        .env_remove("HF_TOKEN")
        .stdin(Stdio::null());
    match config {
        Some(c) => cmd.env("REVIS_CONFIG", c),
        None => cmd.env_remove("REVIS_CONFIG"),
    };
    let out = cmd.output().unwrap();
    assert!(!runtime.join("revis").exists(), "no daemon was started");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// First use (no model in revisd.toml, none downloaded): revis measures the
/// machine, says what it chose and why, and where Hugging Face cannot be
/// reached falls back to the smallest model. Here PyPI cannot be reached
/// either, so that pull fails too, and nothing at all is downloaded. With a
/// model named in revisd.toml, or one downloaded, it is not first use.
#[test]
fn first_use_chooses_for_the_machine_and_falls_back_to_the_smallest() {
    let home = tempfile::tempdir().unwrap();
    let (ok, err) = run_where_nothing_can_be_downloaded(home.path(), None);
    assert!(!ok, "{err}");
    let chose = err.lines().find(|l| l.starts_with("revis: this machine has ")).unwrap_or_else(|| panic!("no choice said:\n{err}"));
    assert!(chose.contains(" of memory read at ") && chose.contains(" multiply-adds/s ") && chose.contains("tokens/s here"), "{chose}");
    let smallest = revis_models::DEFAULT_MODEL;
    if !chose.contains(&format!("so the smallest: {smallest} ")) {
        // A larger model was chosen: Hugging Face was asked for it, and could not be reached.
        assert!(err.contains("/api/models/") && err.contains("Hugging Face cannot be reached"), "{err}");
        assert!(err.contains(&format!("using the smallest model, {smallest}")), "{err}");
    }
    let failed = format!("cannot pull {smallest}: all 2 source(s) failed");
    assert!(err.contains(&failed), "{err}");
    let models = home.path().join("data/models");
    let left: Vec<_> = std::fs::read_dir(&models).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "nothing downloaded, nothing recorded: {left:?}");

    // revisd.toml names a model: not first use (the default model is pulled, as before).
    let config = home.path().join("revisd.toml");
    std::fs::write(&config, "[tiers.tier3]\nmodel = \"gemma3-270m\"\n").unwrap();
    let (ok, err) = run_where_nothing_can_be_downloaded(home.path(), Some(&config));
    assert!(!ok && err.contains(&failed) && !err.contains("choosing one that fits"), "{err}");

    // A catalog model is downloaded: not first use either.
    std::fs::create_dir_all(&models).unwrap();
    let gemma3 = revis_models::find("gemma3-270m").unwrap();
    std::os::unix::fs::symlink(revis_testkit::gemma3(), gemma3.path_in(&models)).unwrap();
    let (ok, err) = run_where_nothing_can_be_downloaded(home.path(), None);
    assert!(!ok && err.contains(&failed) && !err.contains("choosing one that fits"), "{err}");
}

/// A Hugging Face stand-in on loopback: it lists each catalog file as the
/// catalog pins it (so revis learns its size) and serves no file (404).
/// The path of every request it got.
fn listing_only_hub() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let (mut head, mut buf) = (Vec::new(), [0u8; 1024]);
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let path = String::from_utf8_lossy(&head).split_whitespace().nth(1).unwrap_or_default().to_owned();
            let listing = revis_models::catalog().iter().find_map(|e| {
                e.sources.iter().find_map(|s| match s {
                    revis_models::Source::HuggingFace { repo, revision, file }
                        if path.starts_with(&format!("/api/models/{repo}/tree/{revision}")) =>
                    {
                        let lfs = serde_json::json!({"oid": format!("sha256:{}", e.sha256), "size": e.size});
                        Some(serde_json::json!([{"type": "file", "path": file, "size": e.size, "lfs": lfs}]).to_string())
                    }
                    _ => None,
                })
            });
            record.lock().unwrap().push(path);
            let (status, body) = listing.map_or(("404 Not Found", String::new()), |b| ("200 OK", b));
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, seen)
}

/// `revis ARGS` as a new user runs it, in `home`, with `hub` as Hugging Face and PyPI where nothing listens.
fn new_user(home: &Path, hub: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(revis_testkit::binary("revis"));
    cmd.args(args)
        .env("HOME", home)
        .env("REVIS_DATA_DIR", home.join("data"))
        .env("XDG_RUNTIME_DIR", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("HF_ENDPOINT", hub)
        .env("HF_HOME", home.join("hf"))
        .env("PIP_INDEX_URL", format!("{}/simple", nothing_listens()))
        .env("REVIS_MDNS_INTERFACES", "none")
        .env_remove("REVIS_CONFIG")
        .env_remove("REVIS_SOCKET")
        .env_remove("REVIS_NODE")
        .env_remove("REVIS_YES")
        .env_remove("HF_TOKEN");
    cmd
}

/// The catalog model revis chose, from the line that says why.
fn chosen(stderr: &str) -> &'static revis_models::CatalogEntry {
    let line = stderr.lines().find(|l| l.starts_with("revis: this machine has ")).unwrap_or_else(|| panic!("no choice said:\n{stderr}"));
    // The machine first, then (on a busy machine) "BUSY: ...", then the model.
    line.split("; ")
        .skip(1)
        .find_map(|part| part.split_whitespace().next().and_then(revis_models::find))
        .unwrap_or_else(|| panic!("no catalog model named: {line}"))
}

/// The file of a catalog entry on Hugging Face.
fn hf_file(entry: &revis_models::CatalogEntry) -> &'static str {
    entry.sources.iter().find_map(|s| if let revis_models::Source::HuggingFace { file, .. } = s { Some(*file) } else { None }).unwrap()
}

/// Whether revis asks before it downloads `entry` as its choice for this machine.
fn asks_about(entry: &revis_models::CatalogEntry) -> bool {
    entry.name != revis_models::choose::smallest(revis_models::catalog()).name && entry.size > revis_models::choose::ASK_ABOVE_BYTES
}

/// `revis pull` with no model chooses one for this machine; a download of
/// over 1 GB is asked about first. "n" downloads nothing of it (revis asked
/// Hugging Face only for its size) and says so; with no terminal it is not
/// downloaded either, and the message says why; `--yes` asks nothing and
/// goes for it. (Where this machine's choice is 1 GB or less, the test
/// checks that no question comes.)
#[test]
fn a_download_over_1_gb_is_asked_about_and_yes_answers_for_scripts() {
    use crate::chat::{STEP, Transcript, spawn_on_a_terminal, wait_exit};
    use revis_models::choose::human_bytes;
    let (hub, seen) = listing_only_hub();
    let smallest = revis_models::choose::smallest(revis_models::catalog());
    let fetched =
        |entry: &revis_models::CatalogEntry| seen.lock().unwrap().iter().any(|p| p.contains("/resolve/") && p.ends_with(hf_file(entry)));
    let question = |entry: &revis_models::CatalogEntry| {
        format!("revis: download {} ({}) from Hugging Face? [Y/n] ", entry.name, human_bytes(entry.size))
    };

    // On a terminal, answered "n".
    let home = tempfile::tempdir().unwrap();
    let (mut child, mut terminal) = spawn_on_a_terminal(new_user(home.path(), &hub, &["pull"]));
    let screen = Transcript::start(terminal.try_clone().unwrap());
    let said = screen.wait_until("the choice", STEP, |s| s.text().contains("tokens/s here")).replace("\r\n", "\n");
    let entry = chosen(&said);
    if asks_about(entry) {
        screen.wait_until("the question", STEP, |s| s.text().contains(&question(entry)));
        assert!(!fetched(entry), "nothing is downloaded before the answer");
        std::io::Write::write_all(&mut terminal, b"n\r").unwrap();
    }
    wait_exit(&mut child, STEP, &screen);
    let screen = screen.wait_until("the terminal's end", STEP, |s| s.ended).replace("\r\n", "\n");
    assert_eq!(
        screen.contains("[Y/n]"),
        asks_about(entry),
        "asked exactly when the choice is over 1 GB ({} is {} bytes):\n{screen}",
        entry.name,
        entry.size
    );
    if asks_about(entry) {
        let instead =
            format!("revis: using the smallest model, {}, instead; `revis pull {}` fetches the other later", smallest.name, entry.name);
        assert!(screen.contains(&instead), "{screen}");
        assert!(!fetched(entry), "no request for the declined file: {:?}", seen.lock().unwrap());
        let models = std::fs::read_dir(home.path().join("data/models"))
            .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
            .unwrap_or_default();
        assert!(!models.iter().any(|f| f.to_string_lossy().contains(entry.file_name)), "{models:?}");
    }

    // No terminal to ask on, no --yes: not downloaded, and why.
    let home = tempfile::tempdir().unwrap();
    let out = new_user(home.path(), &hub, &["pull"]).stdin(Stdio::null()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let entry = chosen(&err);
    let why = format!(
        "revis: not downloading {} ({}) without asking (no terminal to ask on; --yes or REVIS_YES=1 answers yes)",
        entry.name,
        human_bytes(entry.size)
    );
    assert_eq!(err.contains(&why), asks_about(entry), "{err}");
    assert!(!err.contains("[Y/n]"), "{err}");
    if asks_about(entry) {
        assert!(!fetched(entry), "no request for the file not asked about: {:?}", seen.lock().unwrap());
    }

    // --yes: no question, and the chosen file is asked for (this hub has none: it fails at once).
    let home = tempfile::tempdir().unwrap();
    let out = new_user(home.path(), &hub, &["--yes", "pull"]).stdin(Stdio::null()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let entry = chosen(&err);
    assert!(!err.contains("[Y/n]") && !err.contains("without asking"), "{err}");
    assert!(fetched(entry), "--yes went for {}: {:?}\n{err}", entry.name, seen.lock().unwrap());
}

/// `revis chat`'s gears, each seen where it acts (piped, greedy, short):
/// by default tier1 (a model nobody measured) checks each message (after the answer, piped) and the
/// check is stored with the turn; `--no-check` sends tier1 nothing (tier1
/// has a model of its own here, so Status shows whether it ran);
/// `--checklist` stores tier2's private notes with the turn and prints only
/// the stored answer.
#[tokio::test]
async fn chat_switches_tier1s_check_and_the_checklist() {
    use revis_client::Tier;
    // tier1's check runs only for a model measured precise enough, or one
    // nobody measured: SmolLM2 under a name the catalog does not know.
    let models = tempfile::tempdir().unwrap();
    let unmeasured = models.path().join("tiny-unmeasured.gguf");
    std::os::unix::fs::symlink(revis_testkit::smollm2(), &unmeasured).unwrap();
    let d = TestDaemon::new().tier_model("tier1", unmeasured).model(revis_testkit::gemma3()).start();
    let client = d.client().await;
    let tier1_ran = async || client.status().await.unwrap().tier(Tier::Tier1).expect("a tier1").cached_prefixes > 0;
    let chat = |flags: &[&str]| {
        let revis = Revis::new(Some(&d));
        let args = [&["chat", "--new", "--temperature", "0", "--max-tokens", "12"], flags].concat();
        let (printed, _) = revis.ok_with(&args, "Name a fruit.\n");
        let store = revis.store();
        let conv = store.conversations().unwrap()[0].id;
        let reply = store.messages(conv).unwrap().into_iter().rfind(|m| m.role == Role::Assistant).expect("an answer");
        let record = revis_orchestrator::conversation::turn_record(&store, reply.id).unwrap().unwrap_or_default();
        assert_eq!(printed, format!("{}\n", reply.text), "{flags:?}: what was printed is the stored answer");
        record
    };

    let record = chat(&["--no-check"]);
    assert!(!tier1_ran().await, "--no-check: tier1 was sent nothing");
    assert!(record.check.is_none() && record.notes.is_none(), "{record:?}");

    let record = chat(&[]);
    assert!(tier1_ran().await, "by default tier1 checks the message");
    assert!(record.check.is_some(), "the check is stored with the turn: {record:?}");
    assert!(record.notes.is_none(), "no checklist unless asked: {record:?}");

    let record = chat(&["--no-check", "--checklist"]);
    let notes = record.notes.expect("--checklist: tier2's notes are stored with the turn");
    assert!(!notes.trim().is_empty());
}
