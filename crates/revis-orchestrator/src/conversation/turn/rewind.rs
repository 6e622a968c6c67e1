//! Going back on a turn: the conversation rewound for an edit or a
//! regeneration ([`Chat::rewind`]), a reply that was cut off continued
//! ([`Chat::continue_reply`]).

use std::ops::Bound;
use std::sync::atomic::Ordering;

use revis_client::{Done, Runner};
use revis_store::{MessageId, MessageState, Role, StoredMessage};

use super::Chat;
use crate::check;
use crate::conversation::context::build_context;
use crate::conversation::error::{ChatError, blocking};
use crate::conversation::memory::audit_key;
use crate::conversation::record::{EscalatedBy, Escalation, turn_key, turn_record};
use crate::conversation::reply::OpenReply;
use crate::task::TaskKind;

impl<D: Runner> Chat<D> {
    /// Removes `from` and every later message of this conversation, and
    /// returns them (in order): to edit a message, rewind from it and
    /// [`send`](Chat::send) the new text; to have an answer written again,
    /// rewind from the question and send it again.
    ///
    /// The removed replies' records go with them ([`turn_key`], and the
    /// audit under [`audit_key`]), and so does a summary that covered any
    /// of them (the store's [`Store::rewind`](revis_store::Store::rewind)); a late check or follow-up
    /// of a removed reply keeps nothing. The prefix warmed for the old
    /// history is dropped (a prefill under way for it is cancelled). Ids
    /// are never given twice: the next message comes after every removed
    /// one. Reply writes still pending (a reply just stopped) land first.
    ///
    /// Refused, with nothing removed, while a turn is under way (stop it
    /// first: drop its future) and for a message that is not in this
    /// conversation. Facts the profile learned from a removed message stay.
    pub async fn rewind(&self, from: MessageId) -> Result<Vec<StoredMessage>, ChatError> {
        if self.turns.load(Ordering::SeqCst) > 0 {
            return Err(ChatError::Refused("a reply is being written: stop it before editing or regenerating".into()));
        }
        let conversation = self.conversation;
        if from.conversation != conversation {
            return Err(ChatError::Refused(format!(
                "message {from} belongs to conversation {}, not to the one open here ({conversation}): nothing was removed",
                from.conversation
            )));
        }
        // A reply just stopped hands its text to the writer as it drops: that
        // save must not land after the removal (it would fail, or bring the
        // reply back).
        if let Err(e) = self.saved().await {
            tracing::warn!("a reply cut short before the rewind was not saved: {e}");
        }
        let (store, records) = (self.store.clone(), self.records.clone());
        let removed = blocking(move || {
            if store.message(from)?.is_none() {
                return Err(ChatError::Refused(format!(
                    "message {from} is not in this conversation (it may have been removed already): nothing was removed"
                )));
            }
            let removed = store.rewind(from)?;
            // Under the record keeper's lock: a record being written now is
            // written before this removes it, and a later one is not written.
            let _one = records.lock().unwrap_or_else(|p| p.into_inner());
            for reply in removed.iter().filter(|m| m.role == Role::Assistant) {
                for key in [turn_key(reply.id), audit_key(reply.id)] {
                    // Left behind it names no message (ids are never given twice): harmless.
                    if let Err(e) = store.remove_setting(&key) {
                        tracing::warn!("removing {key} of a rewound reply failed: {e}");
                    }
                }
            }
            Ok(removed)
        })
        .await;
        self.pre.forget();
        removed
    }

    /// Continues a reply that was cut off (stopped, or its stream failed):
    /// the last message of this conversation, still
    /// [`MessageState::Incomplete`]. The model is asked again what the
    /// reply answers (the conversation up to and including the user's
    /// message before it, as [`Chat::send`] asked it, the message corrected
    /// if the turn's check corrected it), with the reply's text so far as
    /// the start of its answer (`answer_prefix`), and goes on from there.
    /// The new text streams through `on_delta` and is added to the same
    /// message, completed when the stream ends; the [`Done`] returned has
    /// the whole reply's text (the earlier text and what followed), its
    /// counts are the continuation's. `max_tokens` counts the continuation
    /// alone. The work a finished turn leaves behind (the check, the
    /// facts, the summary) is queued then, as for a turn never stopped.
    ///
    /// As [`Chat::send`]: a counted turn from the moment this is called,
    /// typing ends, the answer holds the gates and uses the warm prefix; a
    /// failure or a drop (Stop) saves exactly the text shown, the earlier
    /// text included, still incomplete, so it can be continued again. The
    /// checklist is not gone through again: its notes began the answer
    /// that was cut off and were never kept.
    ///
    /// Refused, before anything is asked or stored, for a message that is
    /// not in this conversation, not a reply, complete, or not the last.
    pub fn continue_reply<'a>(
        &'a self,
        reply: MessageId,
        on_delta: impl FnMut(&str) + Send + 'a,
    ) -> impl Future<Output = Result<Done, ChatError>> + 'a {
        let guard = self.begin_turn();
        async move {
            let result = self.continuation(reply, on_delta).await;
            guard.finish();
            result
        }
    }

    /// [`Chat::continue_reply`]'s turn, once it is counted.
    async fn continuation(&self, reply: MessageId, on_delta: impl FnMut(&str) + Send) -> Result<Done, ChatError> {
        // A reply just stopped is saved when the writes handed over are done:
        // continue from exactly what was shown, not an older save.
        self.saved().await?;
        let (store, conversation, rules, profile) = (self.store.clone(), self.conversation, self.rules.clone(), self.profile);
        let (user, cut, asked, ctx) = blocking(move || {
            let refuse = |why: String| Err(ChatError::Refused(format!("message {reply} cannot be continued: {why}")));
            if reply.conversation != conversation {
                return refuse(format!("it belongs to conversation {}, not to the one open here ({conversation})", reply.conversation));
            }
            let mut messages = store.messages(conversation)?;
            let Some(at) = messages.iter().position(|m| m.id == reply) else {
                return refuse("it is not in this conversation (it may have been removed)".into());
            };
            match &messages[at] {
                m if m.role != Role::Assistant => return refuse("it is the user's; only a reply can be continued".into()),
                m if m.state == MessageState::Complete => {
                    return refuse("it is complete; only a reply that was cut off (stopped, or failed) can be continued".into());
                }
                _ if at + 1 != messages.len() => {
                    return refuse("later messages follow it; only the last message can be continued".into());
                }
                _ => {}
            }
            let cut = messages.remove(at);
            let Some(user) = at.checked_sub(1).map(|i| messages.swap_remove(i)).filter(|m| m.role == Role::User) else {
                return refuse("no message of the user's comes before it, so there is nothing it answers".into());
            };
            // The turn answered the corrected message if its check was ready in time.
            let asked = turn_record(&store, reply)?
                .filter(|r| r.checked_before)
                .and_then(|r| r.check)
                .map_or_else(|| user.text.clone(), |c| c.corrected);
            // Up to the user's message, which the request adds (once); the
            // reply itself, incomplete, is never part of the history.
            let ctx = build_context(&store, conversation, &rules, profile, false, Bound::Excluded(user.id))?;
            Ok((user, cut, asked, ctx))
        })
        .await?;
        let tier = self.policies.get(TaskKind::ChatAnswer).tier;
        let streaming = self.gates.streaming();
        self.pre.enter().await;
        let mut req = self.answer_request(&ctx, tier, &asked);
        req.answer_prefix = cut.text.clone();
        // From here on, however this ends, what was shown (the earlier text with it) is saved.
        let mut open = OpenReply::resume(self.writer.clone(), self.store.clone(), reply, cut.text.clone(), self.partial_save_every);
        let result = self.stream_answer(req, &mut open, on_delta).await;
        drop(streaming);
        self.pre.consumed();
        let done = match result {
            Ok(done) => Done { text: format!("{}{}", cut.text, done.text), ..done },
            Err(failed) => {
                if let Err(e) = open.cut().await {
                    tracing::warn!("saving the cut reply failed: {e}");
                }
                return Err(ChatError::Call(failed));
            }
        };
        open.complete(done.text.clone()).await?;
        // What the stopped turn did not get to: its escalation, or the check it did not wait for.
        let read = self.store.clone();
        let record = blocking(move || turn_record(&read, reply)).await?.unwrap_or_default();
        let keeper = self.keeper();
        match &record.check {
            Some(c) if c.escalate && record.escalation.is_none() => {
                keeper.escalate(reply, Escalation { by: EscalatedBy::Check, why: None }, self.after_turn && self.auto_deep).await;
            }
            None if self.after_turn && self.quick_check && user.text.len() <= check::CHECK_MAX_BYTES => {
                keeper.check_after(reply, user.text.clone());
            }
            _ => {}
        }
        if self.after_turn {
            self.after_turn(&user.text, user.id, reply, &done.text);
        }
        Ok(done)
    }
}
