//! The three gates that decide whether background work may start now:
//! pipeline lock (an answer is streaming to the user), prefill freeze (a
//! pre-prefill is warming a cache) and typing hold (the user is typing).
//! User actions always pass. There are no cool-down delays: a gate opens
//! the moment its reason ends.

use tokio::sync::watch;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateState {
    /// Answers streaming to the user now.
    pub streaming: u32,
    /// Pre-prefills warming a cache now (a replaced one may still be finishing).
    pub prefilling: u32,
    /// The user is typing.
    pub typing: bool,
}

impl GateState {
    /// Background work may start only when no gate is closed.
    pub fn background_may_start(&self) -> bool {
        self.streaming == 0 && self.prefilling == 0 && !self.typing
    }
}

/// Shared gates; cheap to clone.
#[derive(Clone, Debug)]
pub struct Gates {
    tx: watch::Sender<GateState>,
}

impl Default for Gates {
    fn default() -> Self {
        Self::new()
    }
}

/// Holds the pipeline lock while an answer streams; dropping it releases it.
#[must_use = "the pipeline lock is released when this is dropped"]
pub struct StreamingGuard {
    gates: Gates,
}

impl Drop for StreamingGuard {
    fn drop(&mut self) {
        self.gates.tx.send_modify(|g| g.streaming = g.streaming.saturating_sub(1));
    }
}

/// Holds the prefill freeze while a pre-prefill computes.
#[must_use = "the prefill freeze is released when this is dropped"]
pub struct PrefillGuard {
    gates: Gates,
}

impl Drop for PrefillGuard {
    fn drop(&mut self) {
        self.gates.tx.send_modify(|g| g.prefilling = g.prefilling.saturating_sub(1));
    }
}

impl Gates {
    pub fn new() -> Self {
        Gates { tx: watch::Sender::new(GateState::default()) }
    }

    pub fn state(&self) -> GateState {
        *self.tx.borrow()
    }

    pub fn streaming(&self) -> StreamingGuard {
        self.tx.send_modify(|g| g.streaming += 1);
        StreamingGuard { gates: self.clone() }
    }

    pub fn prefilling(&self) -> PrefillGuard {
        self.tx.send_modify(|g| g.prefilling += 1);
        PrefillGuard { gates: self.clone() }
    }

    /// The user started (true) or stopped (false) typing.
    pub fn set_typing(&self, typing: bool) {
        self.tx.send_if_modified(|g| std::mem::replace(&mut g.typing, typing) != typing);
    }

    /// Watches the gate state.
    pub fn subscribe(&self) -> watch::Receiver<GateState> {
        self.tx.subscribe()
    }

    /// Waits until background work may start.
    pub async fn background_open(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(GateState::background_may_start).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn opens_within(g: &Gates, d: Duration) -> bool {
        tokio::time::timeout(d, g.background_open()).await.is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn each_gate_holds_background_work_until_it_opens() {
        let g = Gates::new();
        assert!(opens_within(&g, Duration::ZERO).await, "all open at first");

        let s = g.streaming();
        assert!(!opens_within(&g, Duration::from_secs(3600)).await, "pipeline lock holds");
        drop(s);
        assert!(opens_within(&g, Duration::ZERO).await, "opens the moment the answer ends");

        let p = g.prefilling();
        assert!(!opens_within(&g, Duration::from_secs(3600)).await, "prefill freeze holds");
        drop(p);
        assert!(opens_within(&g, Duration::ZERO).await);

        g.set_typing(true);
        assert!(!opens_within(&g, Duration::from_secs(3600)).await, "typing hold holds");
        g.set_typing(false);
        assert!(opens_within(&g, Duration::ZERO).await, "no cool-down after typing stops");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_wakes_when_the_last_gate_opens() {
        let g = Gates::new();
        let s1 = g.streaming();
        let s2 = g.streaming();
        g.set_typing(true);
        let waiter = tokio::spawn({
            let g = g.clone();
            async move { g.background_open().await }
        });
        drop(s1);
        g.set_typing(false);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one answer still streams");
        drop(s2);
        waiter.await.unwrap();
    }
}
