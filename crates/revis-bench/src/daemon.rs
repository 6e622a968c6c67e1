//! A real revisd for the measurements through the whole stack: started with
//! its own socket, config and server-mode state in a temporary directory,
//! reached through the revis client library, stopped with SIGTERM afterwards.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use revis_client::Client;
use revis_client::wire::v1 as pb;

use crate::proc::{set_parent_death_signal, wait_timeout};

/// Limit on any single request of the benchmark.
const RPC_TIMEOUT: Duration = Duration::from_secs(300);

/// How to start a revisd (see [`Daemon::start_wrapped`]).
#[derive(Clone, Copy)]
pub struct Launch<'a> {
    /// `daemon.threads`; 0 writes `"auto"` (chosen by measurement).
    pub threads: u32,
    pub context: u32,
    pub batch: u32,
    /// Server mode on this address (a free port with `:0`); None = off.
    pub listen: Option<&'a str>,
    /// Commands that run revisd, each exec'ing the next.
    pub wrap: &'a [String],
    /// `daemon.speculate` ("off", "auto", "always"): off everywhere but
    /// `revis-bench lookup`, so the other figures measure plain decoding, comparable
    /// with llama-bench's.
    pub speculate: &'a str,
    pub extra: Extra<'a>,
}

/// More config lines (TOML), for `revis-bench split`: in `[server]` and in every
/// `[tiers.X]` (the tiers share the one model, so they agree).
#[derive(Clone, Copy, Default)]
pub struct Extra<'a> {
    pub server: &'a str,
    pub tiers: &'a str,
    /// Lines for the `[daemon]` section (e.g. `streams = 8`).
    pub daemon: &'a str,
}

impl Extra<'_> {
    pub const NONE: Extra<'static> = Extra { server: "", tiers: "", daemon: "" };
}

impl Launch<'static> {
    /// `model` on every tier with `threads` threads, a context of `context`
    /// tokens and prompt batches of `batch`: server mode off, no wrapper,
    /// no speculation, no more config lines.
    pub fn plain(threads: u32, context: u32, batch: u32) -> Self {
        Launch { threads, context, batch, listen: None, wrap: &[], speculate: "off", extra: Extra::NONE }
    }

    /// [`Launch::plain`] with server mode on as well: mutual TLS on a free
    /// loopback port, never advertised over mDNS.
    pub fn server(threads: u32, context: u32, batch: u32) -> Self {
        Launch { listen: Some("127.0.0.1:0"), ..Self::plain(threads, context, batch) }
    }
}

/// A running revisd; stopped when dropped.
pub struct Daemon {
    pub client: Client,
    pub socket: PathBuf,
    pub log: PathBuf,
    child: Guard,
    _dir: tempfile::TempDir,
}

/// The daemon process, stopped when dropped.
struct Guard(Option<Child>);

impl Guard {
    /// SIGTERM, then SIGKILL if it has not exited within 10 s.
    fn stop(&mut self) {
        let Some(mut child) = self.0.take() else { return };
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        if !matches!(wait_timeout(&mut child, Duration::from_secs(10)), Ok(Some(_))) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Daemon {
    /// Starts a revisd as `launch` says, runs `body` on it, and stops it
    /// (SIGTERM; SIGKILL after 10 s) whatever `body` returned; when `body`
    /// failed, the tail of its log is printed first. The whole life of a
    /// benchmark's daemon, for the benchmarks that hold one at a time.
    pub async fn around<T>(
        revisd: &Path,
        model: &Path,
        launch: Launch<'_>,
        body: impl AsyncFnOnce(&mut Daemon) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let mut d = Self::start_wrapped(revisd, model, launch).await?;
        let result = body(&mut d).await;
        if result.is_err() {
            eprintln!("revis-bench: revisd log:\n{}", d.log_tail());
        }
        d.stop();
        result
    }

    /// Starts revisd as `wrap` says (e.g. `taskset -c 1`, `ip netns exec NS`,
    /// each of which execs the next, so the child's PID is revisd's), with
    /// server mode listening on `listen` when given (never advertised).
    pub async fn start_wrapped(revisd: &Path, model: &Path, launch: Launch<'_>) -> anyhow::Result<Daemon> {
        let mut dir = tempfile::Builder::new().prefix("revis-bench-").tempdir()?;
        // REVIS_BENCH_KEEP=1 keeps each daemon's directory (its log) to read afterwards.
        if std::env::var_os("REVIS_BENCH_KEEP").is_some() {
            dir.disable_cleanup(true);
            eprintln!("revis-bench: revisd's directory kept: {}", dir.path().display());
        }
        let socket = dir.path().join("revisd.sock");
        let log = dir.path().join("revisd.log");
        let config = write_config(dir.path(), model, &launch)?;
        let wrap = launch.wrap;
        let (read_end, write_end) = revis_client::readiness_pipe()?;
        let log_file = std::fs::File::create(&log)?;
        let mut cmd = match wrap.split_first() {
            None => Command::new(revisd),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(revisd);
                c
            }
        };
        cmd.arg("--socket")
            .arg(&socket)
            .env("REVIS_CONFIG", &config)
            .env("REVIS_READY_FD", write_end.as_raw_fd().to_string())
            .env_remove("REVIS_SOCKET")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        set_parent_death_signal(&mut cmd);
        let child = Guard(Some(cmd.spawn().with_context(|| format!("starting {}", revisd.display()))?));
        drop(write_end); // only the daemon holds it now: EOF means it exited
        let ready = tokio::task::spawn_blocking(move || {
            let mut s = String::new();
            let _ = std::fs::File::from(read_end).read_to_string(&mut s);
            s
        });
        match tokio::time::timeout(Duration::from_secs(120), ready).await {
            Ok(Ok(s)) if s.starts_with("ready") => {}
            _ => bail!("revisd did not become ready; its log:\n{}", log_tail(&log)),
        }
        let client = Client::connect(&socket).await?;
        Ok(Daemon { client, socket, log, child, _dir: dir })
    }

    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Drops every cached prefix (the KV cache), so the next prompt is evaluated cold.
    pub async fn purge(&mut self) -> anyhow::Result<()> {
        timed_out(self.client.wire().admin.purge(pb::PurgeRequest { tier: String::new() })).await?;
        Ok(())
    }

    pub async fn prefill(&mut self, messages: Vec<pb::ChatMessage>) -> anyhow::Result<pb::PrefillResponse> {
        let req = pb::PrefillRequest { tier: "tier2".into(), messages, priority: 0 };
        Ok(timed_out(self.client.wire().inference.prefill(req)).await?.into_inner())
    }

    /// A greedy Generate over this daemon's socket, timed on the client side.
    pub async fn generate(
        &mut self,
        messages: Vec<pb::ChatMessage>,
        static_messages: Option<u32>,
        max_tokens: u32,
    ) -> anyhow::Result<Timed> {
        generate(&mut self.client, messages, static_messages, max_tokens).await
    }

    /// The same Generate with revis's default sampling (none set in the
    /// request; SmolLM2 and Gemma 3 publish none, so revis's own), a fixed seed.
    pub async fn generate_sampled(&mut self, messages: Vec<pb::ChatMessage>, max_tokens: u32) -> anyhow::Result<Timed> {
        let req = pb::GenerateRequest {
            tier: "tier2".into(),
            messages,
            sampling: Some(pb::Sampling { seed: Some(1), ..Default::default() }),
            max_tokens,
            ..Default::default()
        };
        generate_req(&mut self.client, req).await
    }

    /// Its PID (revisd's own, whatever wrapped it).
    pub fn pid(&self) -> Option<u32> {
        self.child.0.as_ref().map(Child::id)
    }

    /// Stops the daemon (SIGTERM; SIGKILL after 10 s).
    pub fn stop(mut self) {
        self.child.stop();
    }
}

/// Writes the config of a benchmark revisd into `dir` (`revisd.toml`):
/// `model` on every tier, the threads, context and batch of `launch`, the
/// model loaded at start, and server mode as `launch.listen` says with its
/// state in `dir`. Returns the file's path.
pub fn write_config(dir: &Path, model: &Path, launch: &Launch<'_>) -> anyhow::Result<PathBuf> {
    let Launch { threads, context, batch, listen, speculate, extra, .. } = *launch;
    let threads = if threads == 0 { "\"auto\"".to_owned() } else { threads.to_string() };
    let config = dir.join("revisd.toml");
    let model_str = model.to_str().context("model path is not UTF-8")?;
    let state = dir.join("state");
    let state_str = state.to_str().context("temporary directory is not UTF-8")?;
    let tier = |t: &str| format!("[tiers.{t}]\nmodel = {}\n{}\n", toml_string(model_str), extra.tiers);
    std::fs::write(
        &config,
        format!(
            "# Written by revis-bench for one measurement.\n[daemon]\nthreads = {threads}\ncontext = {context}\nbatch = {batch}\nspeculate = \"{speculate}\"\nkeep_alive_s = 0\nload_at_start = true\n{}\n{}{}{}{}{}\n",
            extra.daemon,
            tier("tier1"),
            tier("tier2"),
            tier("tier3"),
            server_section(listen, state_str),
            extra.server
        ),
    )?;
    Ok(config)
}

/// The `[server]` section: always with its state (identity, paired
/// devices, the saved switch) in the temporary directory, never the user's,
/// so a user who turned server mode on does not get it in the benchmark too.
/// When on: a free loopback port, no mDNS (it would multicast on the real
/// network).
fn server_section(listen: Option<&str>, state_dir: &str) -> String {
    let state = format!("state_dir = {}\n", toml_string(state_dir));
    if let Some(listen) = listen {
        format!("[server]\nenabled = true\nlisten = {}\nadvertise = false\nname = \"bench\"\n{state}", toml_string(listen))
    } else {
        format!("[server]\nenabled = false\n{state}")
    }
}

/// A greedy Generate on `client` (any transport), timed on the client side.
pub async fn generate(
    client: &mut Client,
    messages: Vec<pb::ChatMessage>,
    static_messages: Option<u32>,
    max_tokens: u32,
) -> anyhow::Result<Timed> {
    let req = pb::GenerateRequest {
        tier: "tier2".into(),
        messages,
        static_messages,
        sampling: Some(pb::Sampling { temperature: Some(0.0), ..Default::default() }),
        max_tokens,
        ..Default::default()
    };
    generate_req(client, req).await
}

/// One Generate on `client`, timed on the client side.
pub async fn generate_req(client: &mut Client, req: pb::GenerateRequest) -> anyhow::Result<Timed> {
    // The raw stub: this measures the wire, one call, no retry.
    let run = async move {
        let sent = Instant::now();
        let mut stream = client.wire().inference.generate(req).await?.into_inner();
        let mut first = None;
        while let Some(ev) = stream.message().await? {
            match ev.event {
                Some(pb::generate_event::Event::Delta(d)) if !d.text.is_empty() => {
                    first.get_or_insert_with(Instant::now);
                }
                Some(pb::generate_event::Event::Done(done)) => {
                    let end = Instant::now();
                    return Ok(Timed { sent, first, end, done });
                }
                _ => {}
            }
        }
        bail!("the stream ended without a Done event")
    };
    match tokio::time::timeout(RPC_TIMEOUT, run).await {
        Ok(r) => r,
        Err(_) => bail!("Generate took longer than {} s", RPC_TIMEOUT.as_secs()),
    }
}

/// The last 20 lines of a daemon's log file.
pub fn log_tail(path: &Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A Generate as the client saw it.
#[derive(Clone, Debug)]
pub struct Timed {
    pub sent: Instant,
    pub first: Option<Instant>,
    pub end: Instant,
    pub done: pb::Done,
}

impl Timed {
    /// Request sent → first delta (or Done, if no text came).
    pub fn ttft(&self) -> Duration {
        self.first.unwrap_or(self.end) - self.sent
    }

    /// First delta → Done: `generated - 1` token steps.
    pub fn stream_wall(&self) -> Duration {
        self.first.map_or(Duration::ZERO, |f| self.end - f)
    }

    pub fn wall_us_per_token(&self) -> f64 {
        self.stream_wall().as_secs_f64() * 1e6 / f64::from(self.done.generated_tokens.saturating_sub(1).max(1))
    }
}

pub async fn timed_out<T>(f: impl std::future::Future<Output = Result<T, tonic::Status>>) -> anyhow::Result<T> {
    match tokio::time::timeout(RPC_TIMEOUT, f).await {
        Ok(r) => Ok(r.map_err(|s| anyhow::anyhow!("{} ({:?})", s.message(), s.code()))?),
        Err(_) => bail!("request took longer than {} s", RPC_TIMEOUT.as_secs()),
    }
}

fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string(r#"/a "b"\c"#), r#""/a \"b\"\\c""#);
    }

    #[test]
    fn server_mode_state_stays_in_the_temporary_directory() {
        assert_eq!(server_section(None, "/tmp/x/state"), "[server]\nenabled = false\nstate_dir = \"/tmp/x/state\"\n");
        let on = server_section(Some("127.0.0.1:0"), "/tmp/x/state");
        assert!(on.contains("advertise = false\n") && on.contains("listen = \"127.0.0.1:0\"\n"), "{on}");
        assert!(on.contains("state_dir = \"/tmp/x/state\"\n"), "{on}");
    }
}
