//! Chat templates rendered in a process of their own.
//!
//! A GGUF's chat template is another's text. The fuel and the width bounds
//! of [`crate::template`] stop a template that loops or asks for a huge
//! string at once, but not one that builds memory up step by step within
//! its fuel (`s ~ s` doubled thirty times is gigabytes) or spends long on
//! one step: in revisd's own process the first aborts the daemon (every
//! tier and caller gone), and a thread cannot be stopped.
//!
//! So revisd renders each model's template in a rendering process
//! ([`serve`], `revisd render-worker`) with an address-space limit
//! (`RLIMIT_AS`, [`RenderChild::memory_limit`]), killed past
//! [`RenderChild::timeout`]. A rendering that needs more memory ends that
//! process, not revisd; the request fails with [`EngineError::TemplateLimit`]
//! and revisd stops using the template. Each loaded model has its own
//! processes ([`Renderers`]), started on its first prompt and ended when it
//! is unloaded; one that ended is started again on the next prompt.
//!
//! The wire is the process's stdin and stdout: frames of a 4-byte
//! little-endian length and JSON, `{"source": template, "context": what it
//! renders}` in, `{"text": …}` or `{"error": …}` out. The process keeps the
//! templates it compiled (a model's is the same every time).
//!
//! On macOS `RLIMIT_AS` is not enforced: there a rendering that needs too
//! much memory still ends only its own process (the allocator's abort), but
//! only when the machine refuses it. Not run on macOS.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::EngineError;
pub use crate::error::Bound;
use crate::template::ChatTemplate;

/// Where a model's chat template renders.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RenderPlace {
    /// In the caller's process (tools, benchmarks, tests of the engine alone).
    #[default]
    Here,
    /// In rendering processes with bounded memory and time (revisd).
    Child(RenderChild),
}

/// How to start a rendering process, and its bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderChild {
    /// The program and its arguments (revisd: itself, `render-worker`);
    /// it must call [`serve`] with [`RenderChild::memory_limit`].
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Bytes of address space the process may hold (what `args` passes on).
    pub memory_limit: u64,
    /// The longest one rendering may take before its process is killed.
    pub timeout: Duration,
}

/// The most bytes one frame may hold: a rendered prompt is at most
/// [`crate::template::MAX_RENDERED_BYTES`], a request at most what the
/// daemon accepts; this only guards against a broken peer.
const MAX_FRAME: usize = 1 << 30;

/// Rendering processes kept idle for a model: it renders one prompt at a
/// time in revisd (its tokenizer's gate), so one is enough.
const KEPT: usize = 1;

/// A model's rendering processes.
pub struct Renderers {
    child: RenderChild,
    idle: Mutex<Vec<Worker>>,
}

/// One rendering process. Killed (by its PID, which it is) and reaped when dropped.
struct Worker {
    process: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Renderers {
    pub fn new(child: RenderChild) -> Renderers {
        Renderers { child, idle: Mutex::new(Vec::new()) }
    }

    /// Renders `context` with the template `source` in a rendering process.
    pub fn render(&self, source: &str, context: &Json) -> Result<String, EngineError> {
        let request = serde_json::to_vec(&json!({ "source": source, "context": context }))
            .map_err(|e| EngineError::Template(format!("the prompt could not be written for rendering: {e}")))?;
        let taken = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut worker = match taken {
            Some(w) => w,
            None => self.start()?,
        };
        match self.exchange(&mut worker, &request) {
            Ok(answer) => {
                let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                if idle.len() < KEPT {
                    idle.push(worker);
                }
                answer
            }
            Err(ended) => Err(ended),
        }
    }

    fn start(&self) -> Result<Worker, EngineError> {
        let mut process = Command::new(&self.child.program)
            .args(&self.child.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| EngineError::Template(format!("could not start a rendering process ({}): {e}", self.child.program.display())))?;
        let (stdin, stdout) = (process.stdin.take(), process.stdout.take());
        match (stdin, stdout) {
            (Some(stdin), Some(stdout)) => Ok(Worker { process, stdin, stdout }),
            _ => Err(EngineError::Template("a rendering process started without its pipes".into())),
        }
    }

    /// One request and its answer. The outer error means the process is
    /// gone (it ended, or was killed past the timeout); the inner one is the
    /// template's own failure, reported by a process that carries on.
    fn exchange(&self, worker: &mut Worker, request: &[u8]) -> Result<Result<String, EngineError>, EngineError> {
        let deadline = Instant::now() + self.child.timeout;
        let sent = write_frame(&mut worker.stdin, request);
        let answer = sent.and_then(|()| read_frame(&mut worker.stdout, Some(deadline)));
        match answer {
            Ok(bytes) => {
                let answer: Json = serde_json::from_slice(&bytes)
                    .map_err(|e| EngineError::Template(format!("a rendering process answered what is not JSON: {e}")))?;
                Ok(match (answer.get("text").and_then(Json::as_str), answer.get("error").and_then(Json::as_str)) {
                    (Some(text), _) => Ok(text.to_owned()),
                    (None, Some(error)) => Err(EngineError::Template(error.to_owned())),
                    (None, None) => Err(EngineError::Template("a rendering process answered neither text nor an error".into())),
                })
            }
            Err(Failure::TimedOut) => {
                let _ = worker.process.kill();
                let _ = worker.process.wait();
                Err(EngineError::TemplateLimit {
                    what: format!("took over {}s to render one prompt", self.child.timeout.as_secs()),
                    bound: Bound::Time,
                })
            }
            Err(Failure::Io(e)) => {
                // Ended: the allocator aborts when the address-space limit refuses it.
                let status = worker.process.wait().map(|s| describe(&s)).unwrap_or_else(|_| e.to_string());
                Err(EngineError::TemplateLimit {
                    what: format!(
                        "ended its rendering process ({status}): it needed more than the {} MiB a rendering may hold, or crashed",
                        self.child.memory_limit >> 20
                    ),
                    bound: Bound::Memory,
                })
            }
        }
    }
}

/// How a process ended, in words.
fn describe(status: &std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return match signal {
                libc::SIGABRT => "aborted".into(),
                libc::SIGKILL => "killed".into(),
                libc::SIGSEGV => "a segmentation fault".into(),
                s => format!("signal {s}"),
            };
        }
    }
    status.to_string()
}

enum Failure {
    TimedOut,
    Io(std::io::Error),
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        Failure::Io(e)
    }
}

fn write_frame(to: &mut impl Write, bytes: &[u8]) -> Result<(), Failure> {
    let len = u32::try_from(bytes.len()).ok().filter(|&l| l as usize <= MAX_FRAME);
    let len = len.ok_or_else(|| Failure::Io(std::io::Error::other("a frame over 1 GiB")))?;
    to.write_all(&len.to_le_bytes())?;
    to.write_all(bytes)?;
    to.flush()?;
    Ok(())
}

/// Reads one frame; with a deadline, waits for each read at most until it
/// (the rendering process writes its answer only when it is done).
fn read_frame(from: &mut ChildStdout, deadline: Option<Instant>) -> Result<Vec<u8>, Failure> {
    let mut len = [0u8; 4];
    read_exact_by(from, &mut len, deadline)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(Failure::Io(std::io::Error::other("a frame over 1 GiB")));
    }
    let mut bytes = vec![0u8; len];
    read_exact_by(from, &mut bytes, deadline)?;
    Ok(bytes)
}

fn read_exact_by(from: &mut ChildStdout, mut buf: &mut [u8], deadline: Option<Instant>) -> Result<(), Failure> {
    while !buf.is_empty() {
        if let Some(deadline) = deadline {
            wait_readable(from, deadline)?;
        }
        match from.read(buf) {
            Ok(0) => return Err(Failure::Io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Failure::Io(e)),
        }
    }
    Ok(())
}

/// Waits until `from` has bytes (or its end) to read, or `deadline` passes.
#[cfg(unix)]
fn wait_readable(from: &ChildStdout, deadline: Instant) -> Result<(), Failure> {
    use std::os::fd::AsRawFd;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure::TimedOut);
        }
        let mut fd = libc::pollfd { fd: from.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd, for the call's duration.
        let n = unsafe { libc::poll(&mut fd, 1, ms) };
        match n {
            n if n > 0 => return Ok(()),
            0 => {}
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(Failure::Io(e));
                }
            }
        }
    }
}

#[cfg(not(unix))]
fn wait_readable(_from: &ChildStdout, _deadline: Instant) -> Result<(), Failure> {
    Ok(())
}

/// The rendering process's side: limits its own address space to
/// `memory_limit` bytes, then answers frames on stdin until it closes
/// (revisd ended, or dropped it). Not the parent-death signal: it follows
/// the thread that started the process, and tokio retires its threads.
/// Templates compiled are kept (the last few).
pub fn serve(memory_limit: u64) -> std::io::Result<()> {
    limit_memory(memory_limit)?;
    let (mut input, mut output) = (std::io::stdin().lock(), std::io::stdout().lock());
    let mut compiled: Vec<(String, ChatTemplate)> = Vec::new();
    loop {
        let mut len = [0u8; 4];
        match input.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(std::io::Error::other("a frame over 1 GiB"));
        }
        let mut request = vec![0u8; len];
        input.read_exact(&mut request)?;
        let answer = match answer(&request, &mut compiled) {
            Ok(text) => json!({ "text": text }),
            Err(e) => json!({ "error": e }),
        };
        drop(request);
        let bytes = serde_json::to_vec(&answer).map_err(std::io::Error::other)?;
        write_frame(&mut output, &bytes).map_err(|f| match f {
            Failure::Io(e) => e,
            Failure::TimedOut => std::io::Error::other("timed out"),
        })?;
    }
}

/// Templates a rendering process keeps compiled.
const COMPILED_KEPT: usize = 4;

fn answer(request: &[u8], compiled: &mut Vec<(String, ChatTemplate)>) -> Result<String, String> {
    let request: Json = serde_json::from_slice(request).map_err(|e| format!("a rendering request is not JSON: {e}"))?;
    let source = request.get("source").and_then(Json::as_str).ok_or("a rendering request without its template")?;
    let context = request.get("context").ok_or("a rendering request without its context")?;
    let at = match compiled.iter().position(|(s, _)| s == source) {
        Some(at) => at,
        None => {
            // bos and eos come in the context.
            let template = ChatTemplate::new(source, "", "").map_err(|e| e.to_string())?;
            compiled.insert(0, (source.to_owned(), template));
            compiled.truncate(COMPILED_KEPT);
            0
        }
    };
    compiled[at].1.render_context(context).map_err(|e| match e {
        EngineError::Template(why) => why,
        e => e.to_string(),
    })
}

/// Bounds this process's address space (`RLIMIT_AS`).
#[cfg(unix)]
fn limit_memory(bytes: u64) -> std::io::Result<()> {
    let limit = libc::rlimit { rlim_cur: bytes as libc::rlim_t, rlim_max: bytes as libc::rlim_t };
    // SAFETY: a valid rlimit, read during the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) } != 0 {
        let e = std::io::Error::last_os_error();
        // macOS does not take RLIMIT_AS lower than what is mapped; it does not enforce it either.
        if cfg!(target_os = "macos") {
            tracing::debug!("RLIMIT_AS not set: {e}");
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

#[cfg(not(unix))]
fn limit_memory(_bytes: u64) -> std::io::Result<()> {
    Ok(())
}
