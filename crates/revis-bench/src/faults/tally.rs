//! How the fault parts count what happened: calls tallied by kind and
//! outcome with the failures among them, the names a failed call is
//! reported by, and the figures the parts report (percentiles, a process's
//! memory).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use revis_client::{CallError, ClientError, Code};

/// Examples of broken invariants kept for the report (all are counted).
pub const MAX_EXAMPLES: usize = 8;

/// Outcomes counted per kind of call, with the failures among them.
#[derive(Default, Debug)]
pub struct Tally {
    /// (kind, outcome) → count.
    pub counts: BTreeMap<(String, String), u64>,
    /// (kind, outcome) pairs that are failures.
    pub failing: BTreeMap<(String, String), u64>,
    pub examples: Vec<String>,
}

impl Tally {
    pub fn ok(&mut self, kind: &str, outcome: &str) {
        *self.counts.entry((kind.to_owned(), outcome.to_owned())).or_default() += 1;
    }

    pub fn fail(&mut self, kind: &str, outcome: &str, detail: String) {
        self.ok(kind, outcome);
        *self.failing.entry((kind.to_owned(), outcome.to_owned())).or_default() += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(format!("{kind}: {outcome}: {detail}"));
        }
    }

    pub fn merge(&mut self, other: Tally) {
        for (k, v) in other.counts {
            *self.counts.entry(k).or_default() += v;
        }
        for (k, v) in other.failing {
            *self.failing.entry(k).or_default() += v;
        }
        for e in other.examples {
            if self.examples.len() < MAX_EXAMPLES {
                self.examples.push(e);
            }
        }
    }

    pub fn failures(&self) -> u64 {
        self.failing.values().sum()
    }

    /// The end of a part's report: whether the daemon answered afterwards
    /// (`answered` or `failed` and the error), then the first failures and
    /// the daemon's last log lines when there were any.
    pub fn report_end(&self, out: &mut String, after: &Result<(), String>, answered: &str, failed: &str, log_tail: &str) {
        let _ = match after {
            Ok(()) => writeln!(out, "{answered}"),
            Err(e) => writeln!(out, "{failed}: {e}**"),
        };
        if !self.examples.is_empty() {
            let _ = writeln!(out, "- Failures (first {}):", self.examples.len());
            for e in &self.examples {
                let _ = writeln!(out, "  - {}", e.replace('\n', " "));
            }
            let _ = writeln!(out, "- revisd log, last lines:\n\n```\n{log_tail}\n```");
        }
    }

    /// One row per kind: calls, outcomes, failures.
    pub fn table(&self, first_column: &str) -> String {
        let mut kinds: Vec<&str> = self.counts.keys().map(|(k, _)| k.as_str()).collect();
        kinds.dedup();
        let mut s = format!("| {first_column} | calls | outcomes | failures |\n|---|---|---|---|\n");
        for kind in kinds {
            let rows: Vec<(&str, u64)> = self.counts.iter().filter(|((k, _), _)| k == kind).map(|((_, o), n)| (o.as_str(), *n)).collect();
            let calls: u64 = rows.iter().map(|(_, n)| n).sum();
            let outcomes: Vec<String> = rows.iter().map(|(o, n)| format!("{o} {n}")).collect();
            let failed: u64 = self.failing.iter().filter(|((k, _), _)| k == kind).map(|(_, n)| n).sum();
            let _ = writeln!(
                s,
                "| {kind} | {calls} | {} | {} |",
                outcomes.join(", "),
                if failed > 0 { format!("**{failed}**") } else { "0".into() }
            );
        }
        s
    }
}

/// The canonical name of a gRPC status code.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A failed call as the report names it: the code, and "(transport)" when
/// the connection failed ([`CallError::broken`]) rather than the daemon
/// answering.
pub fn status_label(e: &CallError) -> String {
    if e.broken { format!("{} (transport)", code_name(e.code)) } else { code_name(e.code).to_owned() }
}

/// A failed call with its message, for the examples of failures.
pub fn status_detail(e: &CallError) -> String {
    format!("{}: {}", code_name(e.code), e.message)
}

/// How a call of the fault parts failed.
pub enum Failure {
    /// The daemon refused it, or the connection failed under it.
    Call(CallError),
    /// No daemon on the socket when the call (or its one retry) dialled it:
    /// a killed revisd not started again yet. Clean and retryable.
    NotRunning(String),
    Other(String),
}

impl Failure {
    pub fn detail(&self) -> String {
        match self {
            Failure::Call(e) => status_detail(e),
            Failure::NotRunning(t) | Failure::Other(t) => t.clone(),
        }
    }
}

impl From<CallError> for Failure {
    fn from(e: CallError) -> Self {
        Failure::Call(e)
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Call(c) => Failure::Call(c),
            e @ ClientError::NotRunning { .. } => Failure::NotRunning(e.to_string()),
            e => Failure::Other(e.to_string()),
        }
    }
}

impl From<Failure> for String {
    fn from(e: Failure) -> String {
        e.detail()
    }
}

/// A process's resident memory (VmRSS) and its peak (VmHWM), in KiB, from
/// /proc; None when the process is gone (or not Linux).
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()))
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Percentile `p` (0–100) by nearest rank; None for no samples.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    Some(v[rank.min(v.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn a_tally_counts_failures_per_kind() {
        let mut t = Tally::default();
        t.ok("Score", "OK");
        t.ok("Score", "OK");
        t.fail("Score", "INTERNAL", "boom".into());
        assert_eq!(t.failures(), 1);
        let table = t.table("request");
        assert!(table.contains("| Score | 3 | INTERNAL 1, OK 2 | **1** |"), "{table}");
    }
}
