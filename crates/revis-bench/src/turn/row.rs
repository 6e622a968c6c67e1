//! One row of `revis-bench turn`'s results, and the sampling the bare
//! model's rows are asked with.

use revis_client::Sampling;

/// One row of results: a set, a way, how many right of how many.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub(super) set: String,
    pub(super) way: String,
    pub(super) right: usize,
    pub(super) n: usize,
    /// Answers that repeat a span of themselves (with the loop guard: stopped at the first repeat).
    pub(super) loops: usize,
    /// Characters of all answers together.
    pub(super) chars: usize,
    /// A few answers, for the reader.
    pub(super) examples: Vec<(String, String)>,
}

impl Row {
    pub(super) fn rate(&self) -> f64 {
        if self.n == 0 { 0.0 } else { self.right as f64 / self.n as f64 }
    }
}

/// The bare model's sampling: greedy.
pub(super) fn greedy() -> Sampling {
    Sampling { temperature: Some(0.0), seed: Some(0), ..Default::default() }
}
