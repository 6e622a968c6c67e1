//! How a pull reports progress: an `indicatif` bar on stderr, a caller's
//! function (revis serve's Ollama `/api/pull` streams it), or nothing.

use std::cell::Cell;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};

/// How [`crate::pull`](fn@crate::pull) shows its progress.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Progress {
    /// A bar per file on stderr (bytes, rate, ETA); drawn only when stderr is a terminal.
    #[default]
    Bar,
    /// Nothing at all (tests, the daemon, scripts).
    Quiet,
    /// Each file's progress told to a function.
    Report(Reporter),
}

/// Told a file's progress as it comes: its label, the bytes there so far,
/// and its whole size when known.
#[derive(Clone)]
pub struct Reporter(Arc<Report>);

/// What a [`Reporter`] calls: label, bytes so far, whole size.
type Report = dyn Fn(&str, u64, Option<u64>) + Send + Sync;

impl Reporter {
    pub fn new(f: impl Fn(&str, u64, Option<u64>) + Send + Sync + 'static) -> Reporter {
        Reporter(Arc::new(f))
    }
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reporter")
    }
}

impl PartialEq for Reporter {
    fn eq(&self, other: &Reporter) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Reporter {}

/// The bar for one file, the reports of it, or nothing.
pub(crate) enum Meter {
    Nothing,
    Bar(ProgressBar),
    Report { to: Reporter, label: String, total: Option<u64>, at: Cell<u64> },
}

impl Meter {
    /// Starts a meter for `label`, `total` bytes if known, `start` of them already there.
    pub(crate) fn new(mode: &Progress, label: &str, total: Option<u64>, start: u64) -> Self {
        match mode {
            Progress::Quiet => return Meter::Nothing,
            Progress::Report(to) => {
                (to.0)(label, start, total);
                return Meter::Report { to: to.clone(), label: label.to_owned(), total, at: Cell::new(start) };
            }
            Progress::Bar => {}
        }
        let bar = match total {
            Some(total) => ProgressBar::new(total).with_style(
                ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}")
                    .expect("valid progress template")
                    .progress_chars("=> "),
            ),
            None => ProgressBar::new_spinner().with_style(
                ProgressStyle::with_template("{msg} {spinner} {bytes} {binary_bytes_per_sec}").expect("valid progress template"),
            ),
        };
        bar.set_message(label.to_owned());
        bar.set_position(start);
        bar.reset_eta();
        Meter::Bar(bar)
    }

    pub(crate) fn inc(&self, n: u64) {
        match self {
            Meter::Nothing => {}
            Meter::Bar(bar) => bar.inc(n),
            Meter::Report { to, label, total, at } => {
                at.set(at.get() + n);
                (to.0)(label, at.get(), *total);
            }
        }
    }

    /// Leaves the finished bar on screen.
    pub(crate) fn finish(self) {
        if let Meter::Bar(bar) = self {
            bar.finish();
        }
    }

    /// Leaves the bar where it stopped (the download was interrupted).
    pub(crate) fn abandon(self) {
        if let Meter::Bar(bar) = self {
            bar.abandon();
        }
    }
}
