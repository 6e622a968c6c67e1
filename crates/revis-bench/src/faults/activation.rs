//! `revis-bench faults` daemon-kill: revisd under socket activation, killed with
//! SIGKILL at random moments while clients run Generate in a loop, and
//! started again on the same held socket (as systemd does). Every call must
//! end with an answer or a clean retryable error; none may hang.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use revis_client::{CallError, Client, Code, Event, GenerateParams, Message, Tier};
use revis_testkit::{HeldSocket, activated_revisd, activation_pipe};

use super::tally::{Failure, Tally, code_name, status_detail};
use crate::daemon::{Launch, log_tail, write_config};
use crate::proc::set_parent_death_signal;

/// How long a started revisd may take to say it serves (the first and the last start).
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// A killed revisd must be gone within this.
const EXIT_DEADLINE: Duration = Duration::from_secs(10);
/// The pause between a kill and the next start: 0..this, at random.
const RESTART_GAP_MAX: Duration = Duration::from_millis(100);
/// The outcome of a call that found no daemon on the socket (between a kill and the next start).
const NOT_RUNNING: &str = "not running (restarting)";
/// max_tokens of the clients' Generates.
const CLIENT_TOKENS: u32 = 24;

#[derive(Clone, Debug)]
pub struct Settings {
    pub kills: u32,
    /// Each kill comes 0..window after that revisd was started.
    pub window: Duration,
    pub clients: usize,
    /// A call still running after this is a hang (a failure).
    pub deadline: Duration,
}

pub struct Result {
    pub kills: u32,
    /// Kills that came before that revisd had said it serves.
    pub before_ready: u32,
    pub tally: Tally,
    /// After the last kill: a revisd started again on the held socket answers a Generate.
    pub after: std::result::Result<(), String>,
    pub elapsed: Duration,
    pub log_tail: String,
}

impl Result {
    pub fn violations(&self) -> u64 {
        self.tally.failures() + u64::from(self.after.is_err())
    }
}

/// One revisd on the held socket, and its readiness.
struct Started {
    child: tokio::process::Child,
    ready: tokio::task::JoinHandle<String>,
}

fn start(held: &HeldSocket, config: &Path, log: &Path) -> anyhow::Result<Started> {
    // The write end numbered 100 or above, clear of descriptor 3 (the socket, see `activated_revisd`).
    let (read_end, high) = activation_pipe().context("the readiness pipe")?;
    let log_file = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
    let mut cmd = activated_revisd(held.as_fd(), None);
    cmd.arg("--config")
        .arg(config)
        .env("REVIS_READY_FD", high.as_raw_fd().to_string())
        .env("REVIS_LOG", "info")
        .env_remove("REVIS_SOCKET")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    set_parent_death_signal(&mut cmd);
    let child = tokio::process::Command::from(cmd).kill_on_drop(true).spawn()?;
    drop(high); // only revisd holds it now: EOF means it exited
    let ready = tokio::task::spawn_blocking(move || {
        let mut s = String::new();
        let _ = std::fs::File::from(read_end).read_to_string(&mut s);
        s
    });
    Ok(Started { child, ready })
}

async fn wait_ready(s: &mut Started) -> anyhow::Result<()> {
    match tokio::time::timeout(READY_DEADLINE, &mut s.ready).await {
        Ok(Ok(text)) if text.starts_with("ready") => Ok(()),
        other => anyhow::bail!("revisd did not become ready ({other:?})"),
    }
}

async fn kill(s: &mut Started) -> anyhow::Result<()> {
    // None once reaped (it exited by itself): nothing to kill, and never kill(0, ...).
    let Some(pid) = s.child.id() else { return Ok(()) };
    // SAFETY: kill by the PID of our own child, not yet reaped.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    tokio::time::timeout(EXIT_DEADLINE, s.child.wait())
        .await
        .map_err(|_| anyhow::anyhow!("revisd {pid} still ran {EXIT_DEADLINE:?} after SIGKILL"))??;
    Ok(())
}

pub async fn run(model: &Path, launch: Launch<'_>, s: &Settings, seed: u64) -> anyhow::Result<Result> {
    let dir = tempfile::Builder::new().prefix("revis-bench-activated-").tempdir()?;
    let config = write_config(dir.path(), model, &launch)?;
    let log = dir.path().join("revisd.log");
    let held = HeldSocket::new();
    let mut rng = StdRng::seed_from_u64(seed ^ 0xAC71_0000_0000_0002);

    let mut daemon = start(&held, &config, &log)?;
    if let Err(e) = wait_ready(&mut daemon).await {
        anyhow::bail!("{e:#}; log:\n{}", log_tail(&log));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..s.clients {
        clients.spawn(client_loop(held.path.clone(), stop.clone(), s.deadline));
    }

    let started = Instant::now();
    let mut before_ready = 0;
    let mut tally = Tally::default();
    for k in 0..s.kills {
        let delay = Duration::from_micros(rng.random_range(0..=s.window.as_micros() as u64));
        tokio::time::sleep(delay).await;
        if !daemon.ready.is_finished() {
            before_ready += 1;
        } else if let Ok(Some(status)) = daemon.child.try_wait() {
            // revisd must start on the socket its killed predecessor served.
            tally.fail("revisd start", "exited by itself", format!("{status} after a kill -9 of the one before; log:\n{}", log_tail(&log)));
        }
        kill(&mut daemon).await?;
        tokio::time::sleep(Duration::from_micros(rng.random_range(0..=RESTART_GAP_MAX.as_micros() as u64))).await;
        daemon = start(&held, &config, &log)?;
        if (k + 1) % 50 == 0 {
            eprintln!("revis-bench: daemon-kill: {} of {} ({:.0} s)", k + 1, s.kills, started.elapsed().as_secs_f64());
        }
    }
    let ready = wait_ready(&mut daemon).await;
    stop.store(true, Ordering::Relaxed);
    // Each client ends its call under way (bounded by the deadline), then stops.
    while let Some(r) = clients.join_next().await {
        match r {
            Ok(t) => tally.merge(t),
            Err(e) => tally.fail("client task", "panicked", e.to_string()),
        }
    }
    let elapsed = started.elapsed();
    let after = match ready {
        Err(e) => Err(format!("{e:#}")),
        Ok(()) => match Client::connect(&held.path).await {
            Err(e) => Err(e.to_string()),
            Ok(c) => match tokio::time::timeout(s.deadline, generate(&c)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err((e, _))) => Err(e.detail()),
                Err(_) => Err(format!("no answer within {} s", s.deadline.as_secs())),
            },
        },
    };
    // A clean stop for the last one.
    if let Some(pid) = daemon.child.id() {
        // SAFETY: kill by the PID of our own child, not yet reaped.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        if tokio::time::timeout(EXIT_DEADLINE, daemon.child.wait()).await.is_err() {
            kill(&mut daemon).await?;
        }
    }
    Ok(Result { kills: s.kills, before_ready, tally, after, elapsed, log_tail: log_tail(&log) })
}

/// A Generate through the client library (which sends it again once when
/// the connection failed before its first event), read to Done. Returns
/// whether any text had come.
async fn generate(c: &Client) -> std::result::Result<(), (Failure, bool)> {
    let req = GenerateParams {
        tier: Tier::Tier2,
        messages: vec![Message::user("Count from one to ten.")],
        max_tokens: Some(CLIENT_TOKENS),
        ..Default::default()
    };
    let mut stream = c.generate(&req).await.map_err(|e| (e.into(), false))?;
    let mut text = false;
    loop {
        match stream.next().await {
            Ok(Some(ev)) => match ev {
                Event::Delta { text: t, .. } if !t.is_empty() => text = true,
                Event::Done(_) => return Ok(()),
                _ => {}
            },
            Ok(None) => return Err((Failure::Other("the stream ended without Done".into()), text)),
            Err(e) => return Err((e.into(), text)),
        }
    }
}

/// Generate after Generate until told to stop, each bounded by `deadline`.
async fn client_loop(socket: PathBuf, stop: Arc<AtomicBool>, deadline: Duration) -> Tally {
    let mut tally = Tally::default();
    let client = match Client::connect(&socket).await {
        Ok(c) => c,
        Err(e) => {
            tally.fail("connect", "error", e.to_string());
            return tally;
        }
    };
    while !stop.load(Ordering::Relaxed) {
        let kind = "Generate";
        match tokio::time::timeout(deadline, generate(&client)).await {
            Ok(Ok(())) => tally.ok(kind, "answered"),
            Ok(Err((e, mid))) => record(&mut tally, kind, e, mid),
            Err(_) => tally.fail(kind, "hang", format!("no end within {} s", deadline.as_secs())),
        }
    }
    tally
}

/// A failed call, counted: clean and retryable, or a failure (see [`classify`]).
fn record(tally: &mut Tally, kind: &str, e: Failure, mid_answer: bool) {
    match e {
        Failure::Call(e) => classify(tally, kind, &e, mid_answer),
        Failure::NotRunning(_) => tally.ok(kind, NOT_RUNNING),
        Failure::Other(t) => tally.fail(kind, "error", t),
    }
}

/// A clean retryable error: the daemon could not be reached or said it
/// cannot serve now (UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED), or the
/// connection broke under the call (UNKNOWN or CANCELLED with
/// [`CallError::broken`]: the client library's own rule for sending a call
/// again). Anything else is a failure.
fn classify(tally: &mut Tally, kind: &str, e: &CallError, mid_answer: bool) {
    let retryable = matches!(e.code, Code::Unavailable | Code::ResourceExhausted | Code::Aborted)
        || (e.broken && matches!(e.code, Code::Unknown | Code::Cancelled));
    let label = format!(
        "{}{}{}",
        code_name(e.code),
        if e.broken { " (connection broke)" } else { "" },
        if mid_answer { " mid-answer" } else { "" }
    );
    if retryable {
        tally.ok(kind, &label);
    } else {
        tally.fail(kind, &label, status_detail(e));
    }
}

pub fn report(r: &Result, s: &Settings) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "#### kill -9 of revisd under socket activation: {} kills\n", r.kills);
    let _ = writeln!(
        out,
        "The benchmark holds the listening socket (as systemd's socket unit does) and starts revisd on it (descriptor 3, LISTEN_FDS=1); {} clients run Generate (max_tokens {CLIENT_TOKENS}) in a loop through the client library, one connection each. revisd is killed with SIGKILL 0–{} ms after each start ({} of the kills came before it said it serves) and started again on the same socket after 0–{} ms. A call must end with an answer or a clean retryable error (UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, the connection broke under it, or no daemon on the socket yet); one not ended within {} s is a hang. {:.1} s in all.\n",
        s.clients,
        s.window.as_millis(),
        r.before_ready,
        RESTART_GAP_MAX.as_millis(),
        s.deadline.as_secs(),
        r.elapsed.as_secs_f64()
    );
    out.push_str(&r.tally.table("call"));
    r.tally.report_end(
        &mut out,
        &r.after,
        "\n- After the last kill, the revisd started again answered a new client's Generate.",
        "\n- **After the last kill, no answer",
        &r.log_tail,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use revis_client::ClientError;

    #[test]
    fn no_daemon_on_the_socket_is_a_clean_retryable_error() {
        let mut tally = Tally::default();
        let gone = ClientError::NotRunning { path: "/run/revisd.sock".into(), reason: "nothing listens on it".into() };
        record(&mut tally, "Generate", gone.into(), false);
        assert_eq!(tally.failures(), 0);
        assert_eq!(tally.counts.get(&("Generate".into(), NOT_RUNNING.into())), Some(&1));
        record(&mut tally, "Generate", ClientError::Spawn("no".into()).into(), false);
        assert_eq!(tally.failures(), 1, "any other client error is a failure");
    }

    #[test]
    fn a_connection_broken_under_the_call_is_clean_an_unknown_answer_is_not() {
        let mut tally = Tally::default();
        // As tonic says a connection reset: a status with a source.
        let reset: CallError = tonic::Status::from_error(Box::new(std::io::Error::other("connection reset"))).into();
        let reset = CallError { code: Code::Unknown, ..reset };
        record(&mut tally, "Generate", reset.into(), true);
        assert_eq!(tally.failures(), 0, "{:?}", tally.examples);
        assert_eq!(tally.counts.get(&("Generate".into(), "UNKNOWN (connection broke) mid-answer".into())), Some(&1));
        record(&mut tally, "Generate", CallError::new(Code::ResourceExhausted, "queue full").into(), false);
        assert_eq!(tally.failures(), 0, "a full queue is retryable");
        record(&mut tally, "Generate", CallError::new(Code::Unknown, "the daemon said so").into(), false);
        record(&mut tally, "Generate", CallError::new(Code::InvalidArgument, "empty").into(), false);
        assert_eq!(tally.failures(), 2, "an UNKNOWN the daemon sent, and a refusal, are failures");
        assert_eq!(tally.failing.get(&("Generate".into(), "UNKNOWN".into())), Some(&1));
        assert!(tally.examples.iter().any(|e| e == "Generate: INVALID_ARGUMENT: INVALID_ARGUMENT: empty"), "{:?}", tally.examples);
    }
}
