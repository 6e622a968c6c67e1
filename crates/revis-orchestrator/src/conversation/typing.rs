//! The typing timer: typing counts as stopped once no key has been pressed
//! for a while ([`crate::conversation::Chat::typing_idle`]). Each key arms
//! it again; when it runs out, the typing hold is released (background work
//! may go on; the warm cache stays).

use std::sync::Arc;

use revis_client::Runner;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::PrePrefill;

/// The timer's task and its deadline (`None`: the user is not typing).
pub(super) struct TypingTimer {
    deadline: Arc<watch::Sender<Option<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TypingTimer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TypingTimer {
    /// Starts the timer's task on the current runtime; it releases `pre`'s typing hold.
    pub(super) fn start<D: Runner>(pre: PrePrefill<D>) -> TypingTimer {
        let deadline = Arc::new(watch::Sender::new(None::<Instant>));
        let (tx, mut rx) = (deadline.clone(), deadline.subscribe());
        let task = tokio::spawn(async move {
            loop {
                let armed = *rx.borrow_and_update();
                let Some(at) = armed else {
                    if rx.changed().await.is_err() {
                        return;
                    }
                    continue;
                };
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {
                        // Checked and released in one step: a key pressed meanwhile arms it again first.
                        tx.send_if_modified(|d| {
                            if *d != Some(at) {
                                return false;
                            }
                            *d = None;
                            // A pause in typing: background work may go on; the warm cache stays.
                            pre.typing_stopped();
                            true
                        });
                    }
                    changed = rx.changed() => if changed.is_err() { return },
                }
            }
        });
        TypingTimer { deadline, task }
    }

    /// A key was pressed: typing stops `idle` from now unless another key is.
    pub(super) fn arm(&self, idle: std::time::Duration) {
        self.deadline.send_replace(Some(Instant::now() + idle));
    }

    /// Typing ended some other way (sent, cleared): the timer is off.
    pub(super) fn disarm(&self) {
        self.deadline.send_replace(None);
    }

    /// Resolves once the user is not typing (at once if they are not).
    pub(super) async fn stopped(&self) {
        let mut rx = self.deadline.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(Option::is_none).await;
    }
}
