//! `revis-bench faults`: what revis does when callers misbehave and
//! processes die, counted against invariants (docs/RELIABILITY.md).
//!
//! Three parts, each bounded in count and time, on temporary directories and
//! Unix sockets only (no network): `load` (concurrent clients of every kind,
//! well-behaved or not, against one revisd), `chat-kill` (kill -9 of
//! `revis chat` mid-answer, then the store is checked) and `daemon-kill`
//! (kill -9 of a socket-activated revisd while clients run). Every run
//! prints its figures and appends them to docs/RELIABILITY.md; the process
//! exits non-zero when an invariant was broken.

mod activation;
mod chat_kill;
mod load;
mod tally;

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::machine::Machine;

/// Which parts run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Load,
    ChatKill,
    DaemonKill,
}

impl Part {
    pub const ALL: [Part; 3] = [Part::Load, Part::ChatKill, Part::DaemonKill];
}

/// What a `revis-bench faults` run does; every count and time is bounded here.
#[derive(Clone, Debug)]
pub struct Settings {
    pub parts: Vec<Part>,
    pub seed: u64,
    pub quick: bool,
    pub threads: u32,
    pub context: u32,
    pub batch: u32,
    pub load: load::Settings,
    pub chat_kill: chat_kill::Settings,
    pub daemon_kill: activation::Settings,
}

/// What the report says about where and how it ran.
pub struct About<'a> {
    pub date: &'a str,
    pub command: &'a str,
    pub machine: &'a Machine,
    pub revisd: &'a Path,
    pub revis: &'a Path,
    pub model: &'a str,
    pub model_bytes: u64,
}

/// Flags and their defaults (wired into main.rs's `Args`).
#[derive(clap::Args, Debug, Clone)]
pub struct FaultArgs {
    /// Which parts to run.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = Part::ALL)]
    pub fault_parts: Vec<Part>,
    /// The random seed (printed; pass it again to replay the same choices; timings still differ).
    #[arg(long)]
    pub seed: Option<u64>,
    /// load: seconds the clients run.
    #[arg(long, default_value_t = 30)]
    pub load_secs: u64,
    /// load: concurrent clients.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// A call that has not ended after this many seconds counts as a hang (a failure).
    /// More than the daemon's 10-s limit on a reader that takes nothing plus queueing,
    /// less than the 35 s a never-read stream is held.
    #[arg(long, default_value_t = 20)]
    pub call_deadline_s: u64,
    /// chat-kill: how many `revis chat` processes are killed with SIGKILL.
    #[arg(long, default_value_t = 1000)]
    pub chat_kills: u32,
    /// chat-kill: the kill comes 0..N ms after the first answer text (or after the start, for a quarter of them).
    #[arg(long, default_value_t = 400)]
    pub chat_kill_window_ms: u64,
    /// chat-kill: max_tokens of each answer.
    #[arg(long, default_value_t = 64)]
    pub chat_max_tokens: u32,
    /// daemon-kill: how many times the socket-activated revisd is killed with SIGKILL.
    #[arg(long, default_value_t = 200)]
    pub daemon_kills: u32,
    /// daemon-kill: the kill comes 0..N ms after revisd was started.
    #[arg(long, default_value_t = 1000)]
    pub daemon_kill_window_ms: u64,
    /// daemon-kill: concurrent clients running Generate in a loop.
    #[arg(long, default_value_t = 3)]
    pub daemon_clients: usize,
}

impl Settings {
    pub fn from_args(a: &FaultArgs, quick: bool, threads: u32, context: u32, batch: u32) -> Settings {
        use rand::Rng;
        let seed = a.seed.unwrap_or_else(|| rand::rng().random());
        let deadline = Duration::from_secs(a.call_deadline_s.max(1));
        // --quick: a smoke run of about a minute and a half.
        let (load_secs, clients, chat_kills, daemon_kills) = if quick {
            (8, a.clients.min(4), a.chat_kills.min(20), a.daemon_kills.min(5))
        } else {
            (a.load_secs, a.clients, a.chat_kills, a.daemon_kills)
        };
        Settings {
            parts: a.fault_parts.clone(),
            seed,
            quick,
            threads,
            context,
            batch,
            load: load::Settings {
                duration: Duration::from_secs(load_secs.max(1)),
                clients: clients.max(1),
                deadline,
                hold: if quick { Duration::from_secs(5) } else { load::NEVER_READ_HOLD },
            },
            chat_kill: chat_kill::Settings {
                kills: chat_kills,
                window: Duration::from_millis(a.chat_kill_window_ms),
                max_tokens: a.chat_max_tokens.max(1),
            },
            daemon_kill: activation::Settings {
                kills: daemon_kills,
                window: Duration::from_millis(a.daemon_kill_window_ms.max(1)),
                clients: a.daemon_clients.max(1),
                deadline,
            },
        }
    }

    /// A rough upper bound of the run's length, for the log.
    pub fn expected_minutes(&self) -> f64 {
        let mut s = 0.0;
        for p in &self.parts {
            s += match p {
                Part::Load => self.load.duration.as_secs_f64() + self.load.hold.as_secs_f64() + 10.0,
                Part::ChatKill => f64::from(self.chat_kill.kills) * 0.35,
                Part::DaemonKill => f64::from(self.daemon_kill.kills) * (0.3 + self.daemon_kill.window.as_secs_f64() / 2.0),
            };
        }
        s / 60.0
    }
}

/// What one run found.
pub struct Outcome {
    pub section: String,
    pub violations: u64,
}

/// Runs the parts `settings` asks for, one after another, each with its own revisd.
pub async fn run(revisd: &Path, revis: &Path, model: &Path, settings: &Settings, about: &About<'_>) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    eprintln!(
        "revis-bench: faults with seed {} (replay: --seed {}); parts {:?}; expected about {:.0} min",
        settings.seed,
        settings.seed,
        settings.parts,
        settings.expected_minutes().ceil()
    );
    let launch = crate::daemon::Launch {
        threads: settings.threads,
        context: settings.context,
        batch: settings.batch,
        listen: None,
        wrap: &[],
        speculate: "off",
        extra: crate::daemon::Extra::NONE,
    };
    let mut parts = Vec::new();
    let mut violations = 0;
    for part in &settings.parts {
        let t = Instant::now();
        let (text, bad) = match part {
            Part::Load => {
                eprintln!("revis-bench: load: {} clients for {} s", settings.load.clients, settings.load.duration.as_secs());
                let r = load::run(revisd, model, launch, &settings.load, settings.seed).await?;
                (load::report(&r, &settings.load), r.violations())
            }
            Part::ChatKill => {
                eprintln!("revis-bench: chat-kill: {} kill -9 of `revis chat`", settings.chat_kill.kills);
                let r = chat_kill::run(revisd, revis, model, launch, &settings.chat_kill, settings.seed).await?;
                (chat_kill::report(&r, &settings.chat_kill), r.violations())
            }
            Part::DaemonKill => {
                eprintln!("revis-bench: daemon-kill: {} kill -9 of a socket-activated revisd", settings.daemon_kill.kills);
                let r = activation::run(model, launch, &settings.daemon_kill, settings.seed).await?;
                (activation::report(&r, &settings.daemon_kill), r.violations())
            }
        };
        eprintln!("revis-bench: {part:?} done in {:.0} s, {bad} violation(s)", t.elapsed().as_secs_f64());
        parts.push(text);
        violations += bad;
    }
    let section = report(settings, about, &parts, violations, started.elapsed());
    Ok(Outcome { section, violations })
}

fn report(settings: &Settings, about: &About<'_>, parts: &[String], violations: u64, elapsed: Duration) -> String {
    let m = about.machine;
    let mut s = String::new();
    let kind = if settings.quick { "smoke run (`--quick`, reduced counts: not a result)" } else { "run" };
    let verdict = if violations == 0 { "PASS".to_owned() } else { format!("**FAIL: {violations} violation(s)**") };
    let _ = writeln!(s, "### {} {kind}: {verdict}\n", about.date);
    let _ = writeln!(s, "- Command: `{}`; done in {:.1} min.", about.command, elapsed.as_secs_f64() / 60.0);
    let _ = writeln!(s, "- Seed: {} (`--seed {}` replays the same choices; the timings differ).", settings.seed, settings.seed);
    let _ = writeln!(s, "- Machine: {} ({} cores visible, {:.1} GiB memory), {}.", m.cpu, m.cores, m.memory_gib, m.os);
    if let Some(l) = crate::machine::load_average() {
        let _ = writeln!(s, "- Load average at the end (1, 5, 15 min): {:.2}, {:.2}, {:.2}.", l[0], l[1], l[2]);
    }
    let _ = writeln!(
        s,
        "- `{}` and `{}`; {} ({:.1} MB) on every tier, {} threads, context {}, batch {}.",
        about.revisd.display(),
        about.revis.display(),
        about.model,
        about.model_bytes as f64 / 1e6,
        settings.threads,
        settings.context,
        settings.batch
    );
    for p in parts {
        s.push('\n');
        s.push_str(p);
    }
    s
}

/// Appends `section` to the reliability document (creating its results
/// heading when missing).
pub fn append(doc: &Path, section: &str) -> anyhow::Result<()> {
    let mut text = std::fs::read_to_string(doc).unwrap_or_default();
    if !text.contains(RESULTS_HEADING) {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("\n{RESULTS_HEADING}\n"));
    }
    if !text.ends_with("\n\n") {
        text.push('\n');
    }
    text.push_str(section);
    std::fs::write(doc, text)?;
    Ok(())
}

/// The heading the runs are appended under, newest last.
pub const RESULTS_HEADING: &str = "## Runs";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_appended_under_one_heading() {
        let dir = tempfile::tempdir().unwrap();
        let doc = dir.path().join("R.md");
        std::fs::write(&doc, "# Reliability\n\nintro\n").unwrap();
        append(&doc, "### one\n").unwrap();
        append(&doc, "### two\n").unwrap();
        let text = std::fs::read_to_string(&doc).unwrap();
        assert_eq!(text.matches(RESULTS_HEADING).count(), 1, "{text}");
        assert!(text.find("### one").unwrap() < text.find("### two").unwrap(), "{text}");
    }
}
