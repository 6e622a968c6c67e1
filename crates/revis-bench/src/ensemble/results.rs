//! What the parts of a run measured: the members, PIQA's scores, the
//! capitals answers of each way of answering, the bits per byte; and the
//! progress printed on the way.

use std::time::{Duration, Instant};

use revis_client::Tier;

use super::{bpb, choice};

/// A model of the run: its catalog name and the tier it is served on.
#[derive(Clone, Debug)]
pub struct Member {
    pub name: String,
    pub tier: Tier,
}

/// What the parts measured.
#[derive(Default)]
pub struct Results {
    pub members: Vec<Member>,
    /// PIQA items as scored (in file order, from item 0), and the wall time of all Score calls.
    pub piqa: Vec<choice::Item>,
    pub piqa_wall: Duration,
    /// Of which each member's calls.
    pub piqa_member_wall: [Duration; 2],
    pub piqa_split: usize,
    /// One run per way of answering (each model alone, then the ensemble's methods).
    pub capitals: Vec<Answers>,
    /// The same, the members on two machines.
    pub two_machines: Vec<Answers>,
    pub capitals_total: usize,
    pub bits: Vec<bpb::TextBits>,
    /// Texts left out of the bits per byte, and why.
    pub bits_skipped: Vec<String>,
    pub bits_wall: Duration,
}

/// A set of capitals answers from one way of answering.
#[derive(Clone, Debug, Default)]
pub struct Answers {
    pub method: String,
    pub answers: Vec<String>,
    pub right: usize,
    pub generated_tokens: u64,
    /// Time spent generating as the daemon(s) reported it, summed.
    pub generate_us: u64,
    /// Client-side wall time of all answers.
    pub wall: Duration,
    /// Calls to a daemon (network round trips if the daemon were elsewhere).
    pub round_trips: u64,
    pub errors: Vec<String>,
}

impl Answers {
    pub fn bytes(&self) -> usize {
        self.answers.iter().map(String::len).sum()
    }
}

/// Prints how far a part is, every 100 items and at the end.
pub(crate) fn progress(what: &str, done: usize, total: usize, since: Instant) {
    if done == total || done.is_multiple_of(100) {
        eprintln!("revis-bench: {what}: {done}/{total} in {:.0} s", since.elapsed().as_secs_f64());
    }
}
