//! The conversations in the store: a write (rename, delete) followed by
//! the list again, and the search through their messages.

use revis_store::Store;

use super::Io;
use crate::protocol::Event;

impl Io {
    /// Runs a store write, then lists the conversations again.
    pub(super) async fn store_then_list(
        &self,
        what: &'static str,
        f: impl FnOnce(&Store) -> Result<(), revis_store::StoreError> + Send + 'static,
    ) {
        let Some(store) = self.store.clone() else { return self.sink.error(what, "the conversations are not open yet") };
        let r = tokio::task::spawn_blocking(move || f(&store).and_then(|()| store.conversations())).await;
        match r {
            Ok(Ok(list)) => self.sink.send(Event::Conversations(list)),
            Ok(Err(e)) => self.sink.error(what, e.to_string()),
            Err(e) => self.sink.error(what, e.to_string()),
        }
    }

    /// The conversations whose messages hold `query` (any case).
    pub(super) fn search(&self, query: String) {
        let Some(store) = self.store.clone() else { return };
        let sink = self.sink.clone();
        tokio::task::spawn_blocking(move || {
            let q = query.trim().to_lowercase();
            let mut ids = Vec::new();
            if !q.is_empty() {
                for c in store.conversations().unwrap_or_default() {
                    if store.messages(c.id).is_ok_and(|m| m.iter().any(|m| m.text.to_lowercase().contains(&q))) {
                        ids.push(c.id);
                    }
                }
            }
            sink.send(Event::SearchHits { query, ids });
        });
    }
}
