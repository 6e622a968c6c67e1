//! How a pull reports progress: an `indicatif` bar on stderr, or nothing.

use indicatif::{ProgressBar, ProgressStyle};

/// How [`crate::pull`] shows its progress.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Progress {
    /// A bar per file on stderr (bytes, rate, ETA); drawn only when stderr is a terminal.
    #[default]
    Bar,
    /// Nothing at all (tests, the daemon, scripts).
    Quiet,
}

/// The bar for one file, or nothing.
pub(crate) struct Meter(Option<ProgressBar>);

impl Meter {
    /// Starts a meter for `label`, `total` bytes if known, `start` of them already there.
    pub(crate) fn new(mode: Progress, label: &str, total: Option<u64>, start: u64) -> Self {
        if mode == Progress::Quiet {
            return Meter(None);
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
        Meter(Some(bar))
    }

    pub(crate) fn inc(&self, n: u64) {
        if let Some(bar) = &self.0 {
            bar.inc(n);
        }
    }

    /// Leaves the finished bar on screen.
    pub(crate) fn finish(self) {
        if let Some(bar) = self.0 {
            bar.finish();
        }
    }

    /// Leaves the bar where it stopped (the download was interrupted).
    pub(crate) fn abandon(self) {
        if let Some(bar) = self.0 {
            bar.abandon();
        }
    }
}
