//! The agent programs people run, against `revis serve`, as their users run
//! them: Claude Code (print mode) and Codex (`exec`), the pinned native
//! builds `cargo xtask test` fetches, in their default configuration (only
//! the address, the key and the model set, as their docs for a gateway
//! say), in a network namespace with only loopback, so nothing they send
//! reaches anything but revis.
//!
//! Gemma 3 270M answers, with the context a config that sets none gives it
//! (its trained 32k): that holds their prompts (Claude Code's is about
//! 11,500 tokens, Codex's 6,000; SmolLM2's 8k holds only Codex's). A
//! model this small copies such a prompt instead of answering, so its
//! answers end at the daemon's token cap (`max_tokens_limit = 16` here, so
//! the test ends in minutes). What is checked is the protocol, which holds
//! for any model: every request each program sends is answered 200 and
//! read through, and each program ends either done or saying the answer ran
//! out of tokens, never with an API or connection error.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use revis_testkit::netns::Offline;
use revis_testkit::{TestDaemon, agent, gemma3};
use serde_json::json;

use crate::http_api::{Serve, post, serve_offline};

/// The most one program's run may take on a busy 2-core machine: its first
/// prompt read whole (about 80 s for Claude Code's here, quiet), then a few
/// short turns from the cached prefix.
const LIMIT: Duration = Duration::from_secs(480);

/// The lines of `revis serve`'s log that name requests to `route`.
fn requests(serve: &Serve, route: &str) -> Vec<String> {
    let log = std::fs::read_to_string(serve._data.path().join("serve.log")).unwrap_or_default();
    log.lines().filter(|l| l.contains(&format!("POST {route} "))).map(str::to_owned).collect()
}

/// Runs `cmd` to its end, within [`LIMIT`] (killed by its PID past it).
fn run(mut cmd: Command) -> Output {
    let child = cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let child = child.spawn().expect("start the agent program");
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let started = Instant::now();
    match rx.recv_timeout(LIMIT) {
        Ok(out) => out.expect("the agent program's output"),
        Err(_) => {
            // SAFETY: the PID of our own child, still running (not reaped: its waiter has not returned).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the agent program ran past {LIMIT:?} (started {:?} ago)", started.elapsed());
        }
    }
}

/// Every request to `route` was answered 200, and `out` is the program's
/// own end: done, or the answer's token limit (`limit_said`), never an
/// error of the API or the connection.
fn check(name: &str, serve: &Serve, route: &str, out: &Output, limit_said: &str) {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let lines = requests(serve, route);
    let log = std::fs::read_to_string(serve._data.path().join("serve.log")).unwrap_or_default();
    assert!(!lines.is_empty(), "{name} sent nothing to {route}; it said:\n{text}\nrevis serve's log:\n{log}");
    assert!(lines.iter().all(|l| l.contains(&format!("POST {route} 200 "))), "{name}: a request was refused:\n{log}\n{name} said:\n{text}");
    assert!(!log.contains(" failed after "), "{name}: an answer failed:\n{log}");
    assert!(
        out.status.success() || text.contains(limit_said),
        "{name} ended with {:?} and not at the model's token limit; it said:\n{text}\nrevis serve's log:\n{log}",
        out.status
    );
}

#[test]
fn claude_code_and_codex_complete_their_round_trips_against_revis_serve() {
    let ns = Offline::new();
    let d = TestDaemon::new().model(gemma3()).model_context().daemon("streams = 1\nmax_tokens_limit = 16\nthreads = \"auto\"").start();
    let serve = serve_offline(&d, &ns.0);
    let url = format!("http://{}", serve.addr);
    let key = serve.key.clone().expect("revis serve made a key");

    // Claude Code, as its docs say for a gateway: the address, the key, a model.
    let home = tempfile::tempdir().unwrap();
    let mut claude = ns.0.command(agent("claude"));
    claude
        .args(["-p", "--model", "tier3", "Say hi."])
        .current_dir(home.path())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home.path())
        .env("ANTHROPIC_BASE_URL", &url)
        .env("ANTHROPIC_API_KEY", &key)
        .env("DISABLE_TELEMETRY", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
    let out = run(claude);
    check("Claude Code", &serve, "/v1/messages", &out, "output token maximum");

    // Codex, with revis as a provider of the Responses API.
    let codex_home = tempfile::tempdir().unwrap();
    write_codex_config(codex_home.path(), &url);
    let mut codex = ns.0.command(agent("codex"));
    codex
        .args(["exec", "--skip-git-repo-check", "Say hi."])
        .current_dir(home.path())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home.path())
        .env("CODEX_HOME", codex_home.path())
        .env("REVIS_API_KEY", &key);
    let out = run(codex);
    check("Codex", &serve, "/v1/responses", &out, "max_output_tokens");
}

/// Codex's config for revis (README.md, "Use revis with Codex").
fn write_codex_config(dir: &Path, url: &str) {
    let config = format!(
        "model = \"tier3\"\nmodel_provider = \"revis\"\n\n[model_providers.revis]\nname = \"revis\"\nbase_url = \"{url}/v1\"\nwire_api = \"responses\"\nenv_key = \"REVIS_API_KEY\"\n"
    );
    std::fs::write(dir.join("config.toml"), config).unwrap();
}

/// The streams agents read carry no empty text before a call: no empty
/// content chunk (Chat Completions), no empty text block (Messages), no
/// empty message item or delta (Responses), when the answer is a call.
#[test]
fn a_streamed_call_comes_without_empty_text_before_it_in_each_api() {
    let d = TestDaemon::new().start();
    let s = crate::http_api::serve(&d, &[]);
    let ask = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let params = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});

    let chat = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "tier2", "messages": ask, "stream": true, "max_tokens": 64, "temperature": 0,
               "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": params}}], "tool_choice": "required"}),
    );
    assert_eq!(chat.status, 200, "{}", chat.body);
    assert!(chat.body.contains("\"tool_calls\""), "a call: {}", chat.body);
    let empty = chat.body.matches("\"content\":\"\"").count();
    assert!(empty <= 1, "only the first chunk (the role's) has empty content; {empty} do:\n{}", chat.body);

    let messages = post(
        &s,
        "/v1/messages",
        json!({"model": "tier2", "messages": ask, "stream": true, "max_tokens": 64, "temperature": 0,
               "tools": [{"name": "get_weather", "input_schema": params}], "tool_choice": {"type": "any"}}),
    );
    assert_eq!(messages.status, 200, "{}", messages.body);
    assert!(messages.body.contains("\"tool_use\""), "a call: {}", messages.body);
    assert!(
        !messages.body.contains("\"content_block\":{\"text\":\"\",\"type\":\"text\"}")
            && !messages.body.contains("\"type\":\"text\",\"text\":\"\""),
        "no empty text block before the call:\n{}",
        messages.body
    );
    assert!(!messages.body.contains("\"text_delta\""), "no text at all in a required call:\n{}", messages.body);

    let responses = post(
        &s,
        "/v1/responses",
        json!({"model": "tier2", "input": ask, "stream": true, "max_output_tokens": 64, "temperature": 0,
               "tools": [{"type": "function", "name": "get_weather", "parameters": params}], "tool_choice": "required"}),
    );
    assert_eq!(responses.status, 200, "{}", responses.body);
    assert!(responses.body.contains("response.function_call_arguments.done"), "a call: {}", responses.body);
    assert!(!responses.body.contains("response.output_text.delta"), "no text deltas before the call:\n{}", responses.body);
    assert!(!responses.body.contains("\"type\":\"message\""), "no empty message item:\n{}", responses.body);
}
