//! tier1's check of the draft while the user types: once the draft has
//! stayed the same for [`DRAFT_PAUSE`] and no answer streams or pre-prefill
//! computes, tier1 checks it, so the answer can use the check if the
//! message sent is this draft. A newer draft replaces the check under way.

use std::sync::{Arc, Mutex};

use revis_client::{Priority, Runner, Tier};
use tokio::sync::watch;

use crate::Gates;
use crate::check::{self, QuickCheck};

/// How long a draft must stay unchanged before tier1 checks it (while the
/// user still types: a pause, not the end of typing).
pub const DRAFT_PAUSE: std::time::Duration = std::time::Duration::from_millis(400);

/// The draft tier1 checks while the user types, and what it found.
#[derive(Default)]
struct Draft {
    text: String,
    check: Option<QuickCheck>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// The draft check of one chat: the draft, its check (under way or found),
/// and who is told when it ends.
pub(super) struct DraftCheck<D: Runner> {
    daemon: D,
    gates: Gates,
    /// The tier that checks (tier1 by default).
    tier: Tier,
    draft: Arc<Mutex<Draft>>,
    /// The draft text whose check has ended.
    ready: watch::Sender<Option<String>>,
}

impl<D: Runner> Drop for DraftCheck<D> {
    fn drop(&mut self) {
        if let Some(t) = self.draft.lock().unwrap_or_else(|p| p.into_inner()).task.take() {
            t.abort();
        }
    }
}

impl<D: Runner> DraftCheck<D> {
    pub(super) fn new(daemon: D, gates: Gates, tier: Tier) -> Self {
        DraftCheck { daemon, gates, tier, draft: Arc::default(), ready: watch::Sender::new(None) }
    }

    /// Watches which draft's check has ended (its text), found or failed.
    pub(super) fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.ready.subscribe()
    }

    /// The draft is now `text`: its check starts after `pause` (only when
    /// `enabled`), replacing the one under way.
    pub(super) fn start(&self, text: &str, pause: std::time::Duration, enabled: bool) {
        let text = text.trim();
        let mut d = self.draft.lock().unwrap_or_else(|p| p.into_inner());
        if d.text == text && (d.check.is_some() || d.task.as_ref().is_some_and(|t| !t.is_finished())) {
            return;
        }
        if let Some(t) = d.task.take() {
            t.abort();
        }
        *d = Draft { text: text.to_owned(), ..Default::default() };
        self.ready.send_replace(None);
        if !enabled || text.is_empty() || text.len() > check::CHECK_MAX_BYTES {
            return;
        }
        let (daemon, gates, slot, ready, owned) =
            (self.daemon.clone(), self.gates.clone(), self.draft.clone(), self.ready.clone(), text.to_owned());
        let tier = self.tier;
        d.task = Some(tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            // Like the pre-prefill, it may run while the user types, but never
            // alongside an answer or a computing pre-prefill.
            let _ = gates.subscribe().wait_for(|g| g.streaming == 0 && g.prefilling == 0).await;
            // Below the user's own work in the daemon's queue: Enter's answer goes first.
            let found = check::run_with(&daemon, tier, &owned, Priority::Background).await;
            let mut d = slot.lock().unwrap_or_else(|p| p.into_inner());
            if d.text != owned {
                return;
            }
            match found {
                Ok(c) => d.check = Some(c),
                // The answer goes on without it, and the check runs again after the answer.
                Err(e) => tracing::debug!("the draft's quick check failed: {e}"),
            }
            ready.send_replace(Some(owned));
        }));
    }

    /// The check of `text`, if the draft check found one in time; else the
    /// check under way is stopped (the answer does not wait for it).
    pub(super) fn take(&self, text: &str) -> Option<QuickCheck> {
        let mut d = std::mem::take(&mut *self.draft.lock().unwrap_or_else(|p| p.into_inner()));
        self.ready.send_replace(None);
        if let Some(t) = d.task.take() {
            t.abort();
        }
        d.check.filter(|_| d.text == text.trim())
    }
}
