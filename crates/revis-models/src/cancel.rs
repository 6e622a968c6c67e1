//! Cancelling a pull: a handle its caller keeps (the desktop app's Cancel
//! button), which the download loops look at before each source, wheel and
//! request, and between reads of a body.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long [`sleep`] sleeps between looks at the handle.
const POLL: Duration = Duration::from_millis(20);

/// Stops a pull from another thread: [`crate::PullOptions::cancel`] holds a
/// clone, and [`Cancel::cancel`] on any clone stops it.
///
/// The pull notices before each source, wheel and request, between reads of
/// a body (at most 256 KiB apart) and while it waits to resume, and returns
/// [`Error::Cancelled`]; it is not retried, and no other source is tried. A
/// read already waiting on the network finishes first (it is bounded by
/// [`crate::PullOptions::read_timeout`]), and a file being hashed is hashed to
/// its end. What arrived is kept in its `.partial` file (a wheel fully
/// downloaded is kept whole), so pulling again resumes from it. A handle
/// once cancelled stays so: give the next pull a new one.
///
/// Clones share one state; two handles are equal when they are clones of one
/// another, as [`crate::Reporter`]s are.
#[derive(Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A handle not cancelled yet.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Stops the pulls holding this handle (or a clone of it); at once, from any thread.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`Cancel::cancel`] was called on this handle or a clone of it.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_cancelled() { "Cancel(cancelled)" } else { "Cancel" })
    }
}

impl PartialEq for Cancel {
    fn eq(&self, other: &Cancel) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Cancel {}

/// [`Error::Cancelled`] once `cancel` is cancelled; Ok while it is not, or without one.
pub(crate) fn check(cancel: Option<&Cancel>) -> Result<()> {
    if cancel.is_some_and(Cancel::is_cancelled) { Err(Error::Cancelled) } else { Ok(()) }
}

/// Sleeps `pause` (a pause before resuming), ending early with
/// [`Error::Cancelled`] when `cancel` is cancelled meanwhile.
pub(crate) fn sleep(cancel: Option<&Cancel>, pause: Duration) -> Result<()> {
    let Some(cancel) = cancel else {
        std::thread::sleep(pause);
        return Ok(());
    };
    let end = Instant::now() + pause;
    loop {
        check(Some(cancel))?;
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(POLL));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_one_state_and_compare_equal() {
        let cancel = Cancel::new();
        let clone = cancel.clone();
        assert_eq!(cancel, clone);
        assert_ne!(cancel, Cancel::new(), "another handle is another pull's");
        assert!(!clone.is_cancelled());
        assert!(check(Some(&clone)).is_ok() && check(None).is_ok());
        assert_eq!(format!("{cancel:?}"), "Cancel");

        cancel.cancel();
        assert!(clone.is_cancelled());
        assert!(matches!(check(Some(&clone)), Err(Error::Cancelled)));
        assert_eq!(format!("{clone:?}"), "Cancel(cancelled)");
    }

    #[test]
    fn a_pause_ends_when_cancelled() {
        let cancel = Cancel::new();
        let other = cancel.clone();
        let canceller = std::thread::spawn(move || other.cancel());
        // Far longer than any test may wait: only the cancel ends it (with Err; the pause would end Ok).
        assert!(matches!(sleep(Some(&cancel), Duration::from_secs(600)), Err(Error::Cancelled)));
        canceller.join().unwrap();
        assert!(sleep(None, Duration::ZERO).is_ok());
    }
}
