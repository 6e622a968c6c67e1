//! Keeping a turn's record and doing what it asks for: the
//! [`RecordKeeper`] writes each reply's [`TurnRecord`] (one
//! read-modify-write at a time), reports each change as a [`TurnNote`], and
//! queues, as background work, tier1's check of a message the answer did not
//! wait for and tier3's deeper follow-up of an escalated reply (once each).

use std::collections::HashSet;
use std::ops::Bound;
use std::sync::{Arc, Mutex};

use revis_client::{Message, Priority, Runner, Sampling};
use revis_store::{MessageId, Store};
use tokio::sync::broadcast;

use super::context::build_context;
use super::error::{ChatError, blocking};
use super::record::{EscalatedBy, Escalation, TurnNote, TurnRecord, turn_key, turn_record};
use crate::check;
use crate::task::{Background, Policies, TaskKind};

/// The longest deeper follow-up tier3 writes, by default ([`crate::conversation::Chat::deep_max_tokens`]).
pub const DEEP_MAX_TOKENS: u32 = 512;

/// What tier3 is asked when it follows an answer up.
pub const DEEP_ASK: &str = "Go deeper on my last message: a more thorough, careful answer, with the reasoning \
and details the short answer left out. Do not repeat the short answer.";

/// Everything a background job of the turn needs to keep its record,
/// cloned out of the [`crate::conversation::Chat`] with the settings it has then.
#[derive(Clone)]
pub(super) struct RecordKeeper<D: Runner> {
    pub(super) daemon: D,
    pub(super) store: Store,
    pub(super) background: Background,
    pub(super) policies: Policies,
    pub(super) sampling: Sampling,
    /// The rules the answers were given under (the follow-up sees the same system message).
    pub(super) rules: String,
    /// Whether the profile is part of the prompts.
    pub(super) profile: bool,
    pub(super) deep_max_tokens: Option<u32>,
    pub(super) auto_deep: bool,
    pub(super) notes: broadcast::Sender<TurnNote>,
    /// Replies tier3 was asked to follow up (once each).
    pub(super) deepened: Arc<Mutex<HashSet<MessageId>>>,
    /// One read-modify-write of a turn record at a time.
    pub(super) records: Arc<Mutex<()>>,
}

impl<D: Runner> RecordKeeper<D> {
    /// Changes a reply's record (blocks: store writes fsync). A reply no
    /// longer stored (rewound: [`crate::conversation::Chat::rewind`]) keeps
    /// no record: a late check or follow-up of it writes nothing. Checked
    /// under the lock the rewind takes to remove records, so none is left
    /// behind.
    fn update(&self, reply: MessageId, f: impl FnOnce(&mut TurnRecord)) -> Result<TurnRecord, ChatError> {
        let _one = self.records.lock().unwrap_or_else(|p| p.into_inner());
        let mut record = turn_record(&self.store, reply)?.unwrap_or_default();
        f(&mut record);
        if self.store.message(reply)?.is_none() {
            tracing::debug!("reply {reply} was rewound: its record is not kept");
            return Ok(record);
        }
        self.store.set_setting(&turn_key(reply), &serde_json::to_value(&record).map_err(|e| ChatError::Writer(e.to_string()))?)?;
        Ok(record)
    }

    pub(super) async fn update_async(
        &self,
        reply: MessageId,
        f: impl FnOnce(&mut TurnRecord) + Send + 'static,
    ) -> Result<TurnRecord, ChatError> {
        let me = self.clone();
        blocking(move || me.update(reply, f)).await
    }

    pub(super) fn note(&self, n: TurnNote) {
        // No one listening is fine.
        let _ = self.notes.send(n);
    }

    /// Records why tier3 should follow `reply` up and (with `queue`) queues
    /// it, once per reply. An escalation not queued is recorded and shown
    /// only; the user may still ask.
    pub(super) async fn escalate(&self, reply: MessageId, escalation: Escalation, queue: bool) -> bool {
        if queue && !self.deepened.lock().unwrap_or_else(|p| p.into_inner()).insert(reply) {
            return false;
        }
        let e = escalation.clone();
        if let Err(err) = self.update_async(reply, move |r| r.escalation = Some(e)).await {
            tracing::warn!("storing an escalation failed: {err}");
        }
        self.note(TurnNote::Escalated { reply, escalation, queued: queue });
        if queue {
            self.deep(reply);
        }
        true
    }

    /// Queues tier3's follow-up of `reply`: background work, through the gates.
    fn deep(&self, reply: MessageId) {
        let policy = *self.policies.get(TaskKind::DeepAnswer);
        let me = self.clone();
        let _done = self.background.submit(policy.rank, async move {
            me.note(TurnNote::DeepStarted { reply, tier: policy.tier });
            let read = me.clone();
            let Ok((ctx, language)) = blocking(move || {
                let ctx = build_context(&read.store, reply.conversation, &read.rules, read.profile, false, Bound::Included(reply))?;
                Ok((ctx, turn_record(&read.store, reply)?.and_then(|r| r.language)))
            })
            .await
            else {
                me.note(TurnNote::DeepFailed { reply, error: "the conversation could not be read".into() });
                return;
            };
            let mut messages = ctx.static_messages();
            let static_count = messages.len() as u32;
            let ask = match language {
                Some(l) => format!("{DEEP_ASK} Write in {l}."),
                None => DEEP_ASK.to_owned(),
            };
            messages.push(Message::user(ask));
            let req = revis_client::GenerateParams {
                tier: policy.tier,
                messages,
                static_messages: Some(static_count),
                sampling: me.sampling,
                max_tokens: me.deep_max_tokens,
                priority: Priority::Background,
                ..Default::default()
            };
            match me.daemon.generate(req, |_| {}).await {
                Ok(done) => {
                    let text = done.text.trim().to_owned();
                    let t = text.clone();
                    if let Err(e) = me.update_async(reply, move |r| r.deep = Some(t)).await {
                        tracing::warn!("storing the deeper answer failed: {e}");
                    }
                    me.note(TurnNote::Deep { reply, text });
                }
                Err(e) => {
                    tracing::warn!("the deeper answer failed: {}", e.message);
                    me.note(TurnNote::DeepFailed { reply, error: e.message });
                }
            }
        });
    }

    /// Queues tier1's check of a message the answer did not wait for: the
    /// correction is shown, and an escalation still reaches tier3.
    pub(super) fn check_after(&self, reply: MessageId, text: String) {
        let policy = *self.policies.get(TaskKind::Classify);
        let me = self.clone();
        let _done = self.background.submit(policy.rank, async move {
            let c = match check::run_with(&me.daemon, policy.tier, &text, Priority::Background).await {
                Ok(c) => c,
                Err(e) => return tracing::warn!("the quick check failed: {e}"),
            };
            let stored = c.clone();
            if let Err(e) = me.update_async(reply, move |r| r.check = Some(stored)).await {
                tracing::warn!("storing the quick check failed: {e}");
            }
            me.note(TurnNote::Checked { reply, check: c.clone(), before_answer: false });
            if c.escalate {
                me.escalate(reply, Escalation { by: EscalatedBy::Check, why: None }, me.auto_deep).await;
            }
        });
    }
}
