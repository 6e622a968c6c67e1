//! The turn itself, [`Chat::send`]: counted from the moment it is asked
//! for, the conversation titled, the message checked and stored, the answer
//! streamed (after the checklist's notes, when on) and stored whatever way
//! it ends, its escalation, and the work it leaves behind in the background.

use std::sync::atomic::Ordering;

use revis_client::{CallError, Done, FinishReason, GenerateParams, Runner, Tier};
use revis_store::MessageId;

use super::{Chat, MAX_MESSAGE_BYTES, TITLE_CHARS};
use crate::conversation::error::{ChatError, blocking};
use crate::conversation::memory;
use crate::conversation::record::{EscalatedBy, Escalation, TurnNote};
use crate::conversation::reply::{OpenReply, repeats_itself};
use crate::prompt::PromptContext;
use crate::task::TaskKind;
use crate::{check, checklist};

/// A turn under way: counted while it lives; dropped before it finished
/// (Stop), the warm prefix is taken as used, as a finished answer takes it.
pub(super) struct TurnGuard<'a, D: Runner> {
    chat: &'a Chat<D>,
    finished: bool,
}

impl<D: Runner> TurnGuard<'_, D> {
    /// The turn returned (answered or failed): it already settled the pre-prefill.
    pub(super) fn finish(mut self) {
        self.finished = true;
    }
}

impl<D: Runner> Drop for TurnGuard<'_, D> {
    fn drop(&mut self) {
        self.chat.turns.fetch_sub(1, Ordering::SeqCst);
        if !self.finished {
            self.chat.pre.consumed();
        }
    }
}

impl<D: Runner> Chat<D> {
    /// Sends the user's message and streams the answer through `on_delta`.
    /// The reply is stored as incomplete when its stream starts, its text so
    /// far is saved as it grows, and it is marked complete when it ends.
    /// If the stream fails, or this future is dropped (Stop), exactly the
    /// text passed to `on_delta` is saved, still incomplete: on return for a
    /// failure, after [`Chat::saved`] for a drop.
    ///
    /// The answer never waits for tier1: if the draft's check is ready, the
    /// corrected message is answered (the stored message stays as typed),
    /// else the check runs after the answer. With the checklist on, the
    /// notes come first, hidden; `on_delta` sees only the answer.
    ///
    /// Typing ends here (the typing timer is off); keys pressed while the
    /// turn runs only update the draft ([`Chat::keystroke`]).
    ///
    /// The turn counts from the moment this is called, before the future
    /// is first polled: a key pressed in between belongs to it.
    pub fn send<'a>(&'a self, text: &'a str, on_delta: impl FnMut(&str) + Send + 'a) -> impl Future<Output = Result<Done, ChatError>> + 'a {
        let guard = self.begin_turn();
        async move {
            let result = self.turn(text, on_delta).await;
            guard.finish();
            result
        }
    }

    /// Counts a turn from now, before its future is first polled (a key
    /// pressed in between belongs to it), and ends typing.
    pub(super) fn begin_turn(&self) -> TurnGuard<'_, D> {
        self.typing.disarm();
        self.typed_in_turn.store(false, Ordering::SeqCst);
        self.turns.fetch_add(1, Ordering::SeqCst);
        TurnGuard { chat: self, finished: false }
    }

    /// Names an untitled conversation after `text`, its first message.
    async fn title(&self, text: &str) -> Result<(), ChatError> {
        let (store, conversation, title) = (self.store.clone(), self.conversation, text.chars().take(TITLE_CHARS).collect::<String>());
        // A flushed write: off the async runtime.
        blocking(move || {
            if store.conversation(conversation)?.is_some_and(|c| c.title.is_empty()) {
                store.set_title(conversation, &title)?;
            }
            Ok(())
        })
        .await
    }

    /// [`Chat::send`]'s turn, once it is counted.
    async fn turn(&self, text: &str, mut on_delta: impl FnMut(&str) + Send) -> Result<Done, ChatError> {
        if text.trim().is_empty() {
            return Err(ChatError::Refused("the message is empty: there is nothing to answer".into()));
        }
        if text.len() > MAX_MESSAGE_BYTES {
            return Err(ChatError::Refused(format!(
                "the message is {} bytes; the limit is {MAX_MESSAGE_BYTES} bytes (256 KiB): send a shorter one",
                text.len()
            )));
        }
        if self.titling {
            self.title(text).await?;
        }
        let tier = self.policies.get(TaskKind::ChatAnswer).tier;
        let ctx = self.context()?;
        let check = if self.quick_check { self.drafts.take(text) } else { None };
        let language = check::language(text);
        let (store, conv, owned) = (self.store.clone(), self.conversation, text.to_owned());
        let t = tier.as_str();
        // Store writes fsync: keep them off the async runtime.
        let (user, reply) = blocking(move || Ok((store.append_user(conv, &owned)?, store.begin_reply(conv, t)?))).await?;
        let keeper = self.keeper();
        if let Some(c) = &check {
            let (stored, lang) = (c.clone(), language.map(str::to_owned));
            keeper
                .update_async(reply, move |r| {
                    r.check = Some(stored);
                    r.checked_before = true;
                    r.language = lang;
                })
                .await?;
            keeper.note(TurnNote::Checked { reply, check: c.clone(), before_answer: true });
        } else if let Some(l) = language {
            keeper.update_async(reply, move |r| r.language = Some(l.to_owned())).await?;
        }
        let asked = check.as_ref().map_or(text, |c| c.corrected.as_str());
        // Take the pipeline lock before Enter releases the typing hold and the
        // prefill freeze, so no background job slips in ahead of the answer.
        let streaming = self.gates.streaming();
        self.pre.enter().await;
        let mut req = self.answer_request(&ctx, tier, asked);
        // From here on, however this turn ends, what was shown is saved.
        let mut open = OpenReply::new(self.writer.clone(), self.store.clone(), reply, self.partial_save_every);
        let mut notes = None;
        let mut result = Ok(Done::default());
        if self.checklist {
            let prefix = checklist::notes_prefix(language);
            let mut ask = req.clone();
            ask.answer_prefix = prefix.clone();
            ask.stop = checklist::notes_stop();
            ask.max_tokens = Some(checklist::NOTES_MAX_TOKENS);
            match self.daemon.generate(ask, |_| {}).await {
                Ok(n) => {
                    req.answer_prefix = checklist::answer_prefix(&prefix, &n.text);
                    notes = Some(format!("{prefix}{}", n.text.trim_end()));
                }
                Err(e) => result = Err(e),
            }
        }
        if result.is_ok() {
            result = self.stream_answer(req, &mut open, &mut on_delta).await;
        }
        drop(streaming);
        self.pre.consumed();
        let done = match result {
            Ok(done) => done,
            Err(failed) => {
                if let Err(e) = open.cut().await {
                    tracing::warn!("saving the cut reply failed: {e}");
                }
                return Err(ChatError::Call(failed));
            }
        };
        open.complete(done.text.clone()).await?;
        let parsed = notes.as_deref().map(checklist::parse);
        if let Some(n) = notes {
            keeper.update_async(reply, move |r| r.notes = Some(n)).await?;
        }
        if check.as_ref().is_some_and(|c| c.escalate) {
            keeper.escalate(reply, Escalation { by: EscalatedBy::Check, why: None }, self.after_turn && self.auto_deep).await;
        } else if let Some(n) = parsed.filter(|n| n.escalate == Some(true)) {
            keeper.escalate(reply, Escalation { by: EscalatedBy::Checklist, why: n.why }, self.after_turn && self.auto_deep).await;
        }
        if self.after_turn {
            if self.quick_check && check.is_none() && text.len() <= check::CHECK_MAX_BYTES {
                keeper.check_after(reply, text.to_owned());
            }
            self.after_turn(text, user, reply, &done.text);
        }
        Ok(done)
    }

    /// The request for the answer to `asked` (the user's message as the
    /// model gets it: corrected, when the turn's check corrected it), on
    /// top of `ctx`: with the profile facts it asks about beside it where
    /// [`Chat::facts_beside`] says ([`memory::with_what_was_said`]), and
    /// the turn's sampling and length.
    pub(super) fn answer_request(&self, ctx: &PromptContext, tier: Tier, asked: &str) -> GenerateParams {
        let mut req = ctx.request(tier, &memory::with_what_was_said(&ctx.profile, asked, self.facts_beside));
        req.sampling = self.sampling;
        req.max_tokens = self.max_tokens;
        req
    }

    /// Streams `req`'s answer into `open` (which saves it) and `on_delta`.
    /// The loop guard: once the reply (with any text it began with)
    /// repeats a span of itself, the generation is dropped (the daemon
    /// stops it within a token) and the answer ends there, as shown. The
    /// text returned is what followed the reply's text at the start, as
    /// the daemon's own is.
    pub(super) async fn stream_answer(
        &self,
        req: GenerateParams,
        open: &mut OpenReply,
        mut on_delta: impl FnMut(&str) + Send,
    ) -> Result<Done, CallError> {
        let start = open.text().len();
        let looped = tokio::sync::Notify::new();
        let mut prompt_tokens = 0;
        let finished = {
            let generate = self.daemon.generate_started(
                req,
                |n| prompt_tokens = n,
                |t| {
                    // Recorded in the same step as it is shown: a drop comes before both or after both.
                    open.shown(t);
                    on_delta(t);
                    if self.loop_guard && repeats_itself(open.text()) {
                        looped.notify_one();
                    }
                },
            );
            tokio::select! {
                biased;
                () = looped.notified() => None,
                r = generate => Some(r),
            }
        };
        finished.unwrap_or_else(|| {
            tracing::debug!("the answer repeats itself: stopped there");
            // Dropped before the daemon's Done: the prompt's length is known,
            // the daemon's counts and times are not (0).
            Ok(Done { finish_reason: FinishReason::Stop, text: open.text()[start..].to_owned(), prompt_tokens, ..Done::default() })
        })
    }

    /// Queues the background work a turn leaves behind.
    pub(super) fn after_turn(&self, user_text: &str, user: MessageId, reply: MessageId, answer: &str) {
        if self.audit {
            self.memory.audit(user_text, reply, answer);
        }
        if self.profile && self.learn {
            self.memory.extract(user_text, user);
            self.memory.consolidate();
        }
        let Ok(ctx) = self.context() else { return };
        self.memory.summarise(self.conversation, ctx);
    }
}
