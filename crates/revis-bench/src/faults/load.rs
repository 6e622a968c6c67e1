//! `revis-bench faults` load: concurrent clients against one revisd for a fixed time,
//! mixing well-behaved Generates with Score, Prefill, Generates cancelled
//! mid-stream, Generates opened and never read, and connections that send
//! garbage. Every call must end in a proper gRPC status within the deadline.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use revis_client::wire::v1 as pb;
use revis_client::{CallError, Client, ClientError, Code, Event, GenerateParams, Message, PrefillParams, ScoreParams, Tier};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Endpoint, Uri};

use super::tally::{Failure, Tally, percentile, rss_kib, status_detail, status_label};
use crate::daemon::{Daemon, Launch};

/// How long a stream that is never read is held open before it is dropped
/// (even after the load's time is up): longer than a call's deadline, so a
/// daemon whose engine waits for that reader makes the other callers' calls
/// hang past it, and longer than the 10 s after which a daemon should give
/// up on a reader that takes nothing.
pub const NEVER_READ_HOLD: Duration = Duration::from_secs(35);
/// The HTTP/2 stream window of the never-reading connection: the daemon
/// may not send a single byte of the answer, as with a frozen caller.
const NEVER_READ_WINDOW: u32 = 0;
/// max_tokens of a never-read Generate: more than the daemon's channel and
/// buffers hold.
const NEVER_READ_TOKENS: u32 = 2048;
/// max_tokens of a well-behaved Generate.
const WELL_BEHAVED_TOKENS: u32 = 48;
/// max_tokens of a Generate that is cancelled mid-stream.
const CANCELLED_TOKENS: u32 = 256;
/// A garbage connection is cancelled after at most this many deltas.
const CANCEL_AFTER_MAX: u32 = 16;
/// Largest garbage write, bytes.
const GARBAGE_MAX: usize = 4096;
/// The daemon must close a connection that sent garbage (and then ended its side) within this.
const GARBAGE_CLOSE_DEADLINE: Duration = Duration::from_secs(5);
/// The HTTP/2 client preface, sent before half of the garbage so the frame parser sees it.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const QUESTIONS: &[&str] = &[
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "How many legs does a spider have?",
    "Say hello in Spanish.",
    "What do bees make?",
];

#[derive(Clone, Debug)]
pub struct Settings {
    pub duration: Duration,
    pub clients: usize,
    /// A call still running after this is a hang (a failure).
    pub deadline: Duration,
    /// How long a never-read stream is held ([`NEVER_READ_HOLD`]; shorter in a smoke run).
    pub hold: Duration,
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Generate,
    Score,
    Prefill,
    Cancel,
    NeverRead,
    Garbage,
}

/// Weights of the actions a client picks from, in percent.
const MIX: &[(Action, u32)] = &[
    (Action::Generate, 35),
    (Action::Score, 15),
    (Action::Prefill, 15),
    (Action::Cancel, 15),
    (Action::NeverRead, 5),
    (Action::Garbage, 15),
];

pub struct Result {
    pub tally: Tally,
    /// Time to first token of the well-behaved Generates, ms.
    pub ttft_ms: Vec<f64>,
    /// revisd's VmRSS at the start (after a warm-up) and at the end, and its peak (VmHWM), KiB.
    pub rss_start: Option<u64>,
    pub rss_end: Option<u64>,
    pub rss_peak: Option<u64>,
    /// A well-behaved Generate after the load ended: the daemon still serves.
    pub after: std::result::Result<(), String>,
    pub elapsed: Duration,
    pub log_tail: String,
}

impl Result {
    pub fn violations(&self) -> u64 {
        self.tally.failures() + u64::from(self.after.is_err())
    }
}

pub async fn run(revisd: &Path, model: &Path, launch: Launch<'_>, s: &Settings, seed: u64) -> anyhow::Result<Result> {
    Daemon::around(revisd, model, launch, async |d| {
        let pid = d.pid().unwrap_or(0);
        d.generate(vec![revis_client::wire::message(pb::Role::User, QUESTIONS[0])], None, 8).await?;
        let rss_start = rss_kib(pid).map(|r| r.0);
        let started = Instant::now();
        let end = started + s.duration;
        // One never-reading stream at a time: two would stall the daemon one after the other.
        let never_read = Arc::new(tokio::sync::Semaphore::new(1));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..s.clients {
            let socket = d.socket.clone();
            let (never_read, s) = (never_read.clone(), s.clone());
            let rng = StdRng::seed_from_u64(seed ^ (0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i as u64 + 1)));
            // The first client opens with a never-read stream, so every run has one at its start.
            tasks.spawn(client_loop(socket, rng, end, s, never_read, i == 0));
        }
        let mut tally = Tally::default();
        let mut ttft_ms = Vec::new();
        // Every task ends by itself: no new call after `end`, and each call is bounded.
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok((t, ttft)) => {
                    tally.merge(t);
                    ttft_ms.extend(ttft);
                }
                Err(e) => tally.fail("client task", "panicked", e.to_string()),
            }
        }
        let elapsed = started.elapsed();
        let rss = rss_kib(pid);
        let after = match tokio::time::timeout(s.deadline, well_behaved(&d.client, QUESTIONS[0])).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(format!("no answer within {} s", s.deadline.as_secs())),
        };
        let log_tail = d.log_tail();
        Ok(Result { tally, ttft_ms, rss_start, rss_end: rss.map(|r| r.0), rss_peak: rss.map(|r| r.1), after, elapsed, log_tail })
    })
    .await
}

fn pick(rng: &mut StdRng) -> Action {
    let total: u32 = MIX.iter().map(|(_, w)| w).sum();
    let mut x = rng.random_range(0..total);
    for &(a, w) in MIX {
        if x < w {
            return a;
        }
        x -= w;
    }
    Action::Generate
}

/// One client: its own connection, calls of random kinds until `end`.
async fn client_loop(
    socket: PathBuf,
    mut rng: StdRng,
    end: Instant,
    s: Settings,
    never_read: Arc<tokio::sync::Semaphore>,
    mut open_with_never_read: bool,
) -> (Tally, Vec<f64>) {
    let mut tally = Tally::default();
    let mut ttft = Vec::new();
    let client = match Client::connect(&socket).await {
        Ok(c) => c,
        Err(e) => {
            tally.fail("connect", "error", e.to_string());
            return (tally, ttft);
        }
    };
    while Instant::now() < end {
        let action = if std::mem::take(&mut open_with_never_read) { Action::NeverRead } else { pick(&mut rng) };
        match action {
            Action::Generate => {
                let kind = "Generate (reads to the end)";
                let q = QUESTIONS[rng.random_range(0..QUESTIONS.len())];
                match tokio::time::timeout(s.deadline, well_behaved(&client, q)).await {
                    Ok(Ok(ms)) => {
                        tally.ok(kind, "OK");
                        if let Some(ms) = ms {
                            ttft.push(ms);
                        }
                    }
                    Ok(Err(e)) => classify_text(&mut tally, kind, e),
                    Err(_) => tally.fail(kind, "hang", format!("no end within {} s", s.deadline.as_secs())),
                }
            }
            Action::Score => {
                let req = ScoreParams::one(Tier::Tier2, "The capital of France is", " Paris.");
                let r = tokio::time::timeout(s.deadline, client.score(&req)).await;
                record(&mut tally, "Score", r, s.deadline);
            }
            Action::Prefill => {
                let rules = "You are a helpful assistant. Answer briefly. ".repeat(rng.random_range(1..40));
                let req = PrefillParams { tier: Tier::Tier2, messages: vec![Message::system(rules)], ..Default::default() };
                let r = tokio::time::timeout(s.deadline, client.prefill(&req)).await;
                record(&mut tally, "Prefill", r, s.deadline);
            }
            Action::Cancel => {
                let after = rng.random_range(1..=CANCEL_AFTER_MAX);
                let kind = "Generate (cancelled mid-stream)";
                match tokio::time::timeout(s.deadline, cancelled(&client, after)).await {
                    Ok(Ok(outcome)) => tally.ok(kind, outcome),
                    Ok(Err(e)) => classify_text(&mut tally, kind, e),
                    Err(_) => tally.fail(kind, "hang", format!("no {after} deltas within {} s", s.deadline.as_secs())),
                }
            }
            Action::NeverRead => {
                let Ok(_permit) = never_read.clone().try_acquire_owned() else { continue };
                let hold = s.hold;
                let kind = "Generate (never read)";
                match tokio::time::timeout(s.deadline, open_never_read(&socket)).await {
                    Ok(Ok(stream)) => {
                        tokio::time::sleep(hold).await;
                        drop(stream);
                        tally.ok(kind, "held unread, then dropped");
                    }
                    Ok(Err(Opened::Call(e))) => classify(&mut tally, kind, &e),
                    Ok(Err(Opened::Connect(e))) => tally.fail(kind, "connect error", e),
                    Err(_) => tally.fail(kind, "hang", format!("no response headers within {} s", s.deadline.as_secs())),
                }
            }
            Action::Garbage => {
                let n = rng.random_range(1..=GARBAGE_MAX);
                let mut bytes = vec![0u8; n];
                rng.fill(&mut bytes[..]);
                if rng.random_bool(0.5) {
                    bytes.splice(0..0, H2_PREFACE.iter().copied());
                }
                let kind = "garbage bytes";
                match garbage(&socket, &bytes).await {
                    Ok(outcome) => tally.ok(kind, outcome),
                    Err(e) => tally.fail(kind, "left open", e),
                }
            }
        }
    }
    (tally, ttft)
}

/// A failed call as a load outcome: the codes that mean the daemon or the
/// connection broke (UNKNOWN, INTERNAL, DATA_LOSS, a transport error) are failures.
fn classify(tally: &mut Tally, kind: &str, e: &CallError) {
    let label = status_label(e);
    if e.broken || matches!(e.code, Code::Unknown | Code::Internal | Code::DataLoss) {
        tally.fail(kind, &label, status_detail(e));
    } else {
        tally.ok(kind, &label);
    }
}

fn record<T>(
    tally: &mut Tally,
    kind: &str,
    r: std::result::Result<std::result::Result<T, ClientError>, tokio::time::error::Elapsed>,
    deadline: Duration,
) {
    match r {
        Ok(Ok(_)) => tally.ok(kind, "OK"),
        Ok(Err(ClientError::Call(e))) => classify(tally, kind, &e),
        Ok(Err(e)) => tally.fail(kind, "client error", e.to_string()),
        Err(_) => tally.fail(kind, "hang", format!("no answer within {} s", deadline.as_secs())),
    }
}

fn classify_text(tally: &mut Tally, kind: &str, e: Failure) {
    match e {
        Failure::Call(e) => classify(tally, kind, &e),
        // The daemon must stay up through the load: no daemon is a failure here.
        Failure::NotRunning(text) | Failure::Other(text) => tally.fail(kind, "error", text),
    }
}

fn generate_params(question: &str, max_tokens: u32) -> GenerateParams {
    GenerateParams { tier: Tier::Tier2, messages: vec![Message::user(question)], max_tokens: Some(max_tokens), ..Default::default() }
}

/// A Generate read to its Done; returns the time to its first text (ms), if any came.
async fn well_behaved(client: &Client, q: &str) -> std::result::Result<Option<f64>, Failure> {
    let sent = Instant::now();
    let mut stream = client.generate(&generate_params(q, WELL_BEHAVED_TOKENS)).await?;
    let mut first = None;
    while let Some(ev) = stream.next().await? {
        match ev {
            Event::Delta { text, .. } if !text.is_empty() => {
                first.get_or_insert_with(|| sent.elapsed().as_secs_f64() * 1e3);
            }
            Event::Done(_) => return Ok(first),
            _ => {}
        }
    }
    Err(Failure::Other("the stream ended without Done".into()))
}

/// A Generate dropped after `after` deltas.
async fn cancelled(client: &Client, after: u32) -> std::result::Result<&'static str, Failure> {
    let mut stream = client.generate(&generate_params("Tell me a long story about a dragon.", CANCELLED_TOKENS)).await?;
    let mut seen = 0;
    while let Some(ev) = stream.next().await? {
        match ev {
            Event::Delta { text, .. } if !text.is_empty() => {
                seen += 1;
                if seen >= after {
                    return Ok("cancelled by the client");
                }
            }
            Event::Done(_) => return Ok("OK (ended before the cancel)"),
            _ => {}
        }
    }
    Err(Failure::Other("the stream ended without Done".into()))
}

enum Opened {
    Call(CallError),
    Connect(String),
}

/// Opens a Generate on a connection of its own whose HTTP/2 window is
/// [`NEVER_READ_WINDOW`], and returns the stream without reading it.
async fn open_never_read(socket: &Path) -> std::result::Result<tonic::Streaming<pb::GenerateEvent>, Opened> {
    let socket = socket.to_path_buf();
    let channel = Endpoint::from_static("http://revisd.local")
        .initial_stream_window_size(NEVER_READ_WINDOW)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { tokio::net::UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| Opened::Connect(e.to_string()))?;
    let mut stub = pb::inference_client::InferenceClient::new(channel);
    let req = pb::GenerateRequest::from(&generate_params("Write a very long essay about the history of the world.", NEVER_READ_TOKENS));
    match stub.generate(req).await {
        Ok(r) => Ok(r.into_inner()),
        Err(s) => Err(Opened::Call(s.into())),
    }
}

/// Sends `bytes` on a new connection, ends its side, and waits for the
/// daemon to close the connection.
async fn garbage(socket: &Path, bytes: &[u8]) -> std::result::Result<&'static str, String> {
    let mut c = tokio::net::UnixStream::connect(socket).await.map_err(|e| format!("connect: {e}"))?;
    // The daemon may close before it read everything: a failed write is a close.
    if c.write_all(bytes).await.is_err() {
        return Ok("closed by the daemon");
    }
    let _ = c.shutdown().await;
    let mut buf = vec![0u8; 4096];
    let read_to_end = async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    match tokio::time::timeout(GARBAGE_CLOSE_DEADLINE, read_to_end).await {
        Ok(()) => Ok("closed by the daemon"),
        Err(_) => Err(format!("{} bytes sent; the connection was still open after {} s", bytes.len(), GARBAGE_CLOSE_DEADLINE.as_secs())),
    }
}

pub fn report(r: &Result, s: &Settings) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "#### Load: {} concurrent clients for {} s\n", s.clients, s.duration.as_secs());
    let _ = writeln!(
        out,
        "Each client has its own connection and picks calls at random (Generate read to the end {}%, Score, Prefill, Generate dropped after 1–{CANCEL_AFTER_MAX} deltas, a Generate on a connection with HTTP/2 window {NEVER_READ_WINDOW} never read and dropped after {} s, even past the load's time (one at a time, the first at the start), a connection sending 1–{GARBAGE_MAX} random bytes, half after the HTTP/2 preface). A call not ended within {} s is a hang. Failures: hangs, UNKNOWN, INTERNAL, DATA_LOSS, transport errors, a garbage connection still open {} s after it ended its side. Load ran {:.1} s (calls under way at the end were waited for).\n",
        MIX[0].1,
        s.hold.as_secs(),
        s.deadline.as_secs(),
        GARBAGE_CLOSE_DEADLINE.as_secs(),
        r.elapsed.as_secs_f64()
    );
    out.push_str(&r.tally.table("call"));
    let p = |q| percentile(&r.ttft_ms, q).map_or("n/a".to_owned(), |v| format!("{v:.0}"));
    let _ = writeln!(
        out,
        "\n- Time to first token of the well-behaved Generates ({} with text): p50 {} ms, p99 {} ms, max {} ms.",
        r.ttft_ms.len(),
        p(50.0),
        p(99.0),
        p(100.0)
    );
    let mib = |k: Option<u64>| k.map_or("n/a".to_owned(), |k| format!("{:.0} MiB", k as f64 / 1024.0));
    let _ = writeln!(
        out,
        "- revisd RSS: {} at the start (after a warm-up), {} at the end; peak {}.",
        mib(r.rss_start),
        mib(r.rss_end),
        mib(r.rss_peak)
    );
    r.tally.report_end(
        &mut out,
        &r.after,
        "- After the load, a well-behaved Generate was answered.",
        "- **After the load, a well-behaved Generate failed",
        &r.log_tail,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transport_error_or_a_broken_daemon_is_a_failure_a_refusal_is_not() {
        let mut tally = Tally::default();
        // As tonic says a connection reset: a status with a source.
        let reset: CallError = tonic::Status::from_error(Box::new(std::io::Error::other("connection reset"))).into();
        classify(&mut tally, "Score", &reset);
        assert_eq!(tally.failures(), 1, "a transport error is a failure whatever its code");
        assert!(tally.failing.keys().all(|(_, o)| o.ends_with(" (transport)")), "{:?}", tally.failing);
        classify(&mut tally, "Score", &CallError::new(Code::Internal, "boom"));
        classify(&mut tally, "Score", &CallError::new(Code::ResourceExhausted, "queue full"));
        let refused = ClientError::Call(CallError::new(Code::InvalidArgument, "empty"));
        record::<()>(&mut tally, "Score", Ok(Err(refused)), Duration::from_secs(1));
        assert_eq!(tally.failures(), 2, "{:?}", tally.examples);
        assert_eq!(tally.failing.get(&("Score".into(), "INTERNAL".into())), Some(&1));
        assert_eq!(tally.counts.get(&("Score".into(), "RESOURCE_EXHAUSTED".into())), Some(&1));
        assert_eq!(tally.counts.get(&("Score".into(), "INVALID_ARGUMENT".into())), Some(&1));
        let gone = ClientError::NotRunning { path: "/run/revisd.sock".into(), reason: "nothing listens on it".into() };
        classify_text(&mut tally, "Generate", gone.into());
        assert_eq!(tally.failures(), 3, "the daemon must stay up through the load");
    }
}
