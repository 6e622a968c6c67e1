//! The memory work a turn queues in the background: the answer audited,
//! the facts the person stated extracted into the profile, the profile
//! consolidated, old turns summarised.

use revis_client::Runner;
use revis_store::{ConversationId, MessageState, Role, Store};
use serde_json::json;

use super::learn::extract_facts;
use super::limits::PROFILE_BUDGET;
use super::profile::{replace_facts, store_facts};
use super::said::{about_user, statements};
use crate::conversation::error::blocking;
use crate::prompt::PromptContext;
use crate::structured;
use crate::task::{Background, Policies, TaskKind};

/// Turns shown in full before older ones are summarised.
pub const TURN_BUDGET: usize = 12;

/// The settings key an answer's audit is stored under.
pub fn audit_key(reply: revis_store::MessageId) -> String {
    format!("audit/{reply}")
}

/// The background runner and the store the memory work goes through.
pub(in crate::conversation) struct Memory<D: Runner> {
    pub(in crate::conversation) daemon: D,
    pub(in crate::conversation) store: Store,
    pub(in crate::conversation) background: Background,
    pub(in crate::conversation) policies: Policies,
}

impl<D: Runner> Memory<D> {
    /// Checks an answer after it was given; the verdict is stored under [`audit_key`].
    pub(in crate::conversation) fn audit(&self, question: &str, reply: revis_store::MessageId, answer: &str) {
        let policy = *self.policies.get(TaskKind::Audit);
        let (daemon, store) = (self.daemon.clone(), self.store.clone());
        let task = format!("Check this answer for factual mistakes or unhelpfulness.\n\nQuestion: {question}\n\nAnswer: {answer}");
        let _done = self.background.submit(policy.rank, async move {
            let schema = json!({
                "type": "object",
                "properties": {
                    "ok": {"type": "boolean"},
                    "problems": {"type": "array", "items": {"type": "string", "maxLength": 160}, "maxItems": 3}
                },
                "required": ["ok", "problems"],
                "additionalProperties": false
            });
            match structured::run(&daemon, policy.tier, &task, &schema).await {
                Ok(v) => {
                    if let Err(e) = blocking(move || Ok(store.set_setting(&audit_key(reply), &v)?)).await {
                        tracing::warn!("storing an audit failed: {e}");
                    }
                }
                Err(e) => tracing::warn!("audit failed: {e}"),
            }
        });
    }

    /// Queues the extraction of the facts the user stated in `user_text` (message `user`) into the profile.
    /// Only the sentences that say something about the user are read
    /// ([`about_user`]); a message with none (a question, a request, a fact
    /// about the world) costs no call and adds nothing.
    pub(in crate::conversation) fn extract(&self, user_text: &str, user: revis_store::MessageId) {
        let Some(said) = about_user(user_text) else { return };
        let message = user_text.to_owned();
        let facts = *self.policies.get(TaskKind::ExtractFacts);
        let (daemon, store) = (self.daemon.clone(), self.store.clone());
        let _done = self.background.submit(facts.rank, async move {
            match extract_facts(&daemon, facts.tier, &said).await {
                Ok(v) => {
                    // Store calls fsync: off the async runtime.
                    let _ = tokio::task::spawn_blocking(move || store_facts(&store, &v, &statements(&message), user)).await;
                }
                Err(e) => tracing::warn!("profile extraction failed: {e}"),
            }
        });
    }

    /// Queues a consolidation of the profile, which runs (after the turn's
    /// fact extraction, by rank) only if the profile outgrew [`PROFILE_BUDGET`].
    pub(in crate::conversation) fn consolidate(&self) {
        let policy = *self.policies.get(TaskKind::Consolidate);
        let (daemon, store) = (self.daemon.clone(), self.store.clone());
        let _done = self.background.submit(policy.rank, async move {
            let read = store.clone();
            let Ok(old) = blocking(move || Ok(read.facts()?)).await else { return };
            if old.len() <= PROFILE_BUDGET {
                return;
            }
            let list: String = old.iter().map(|f| format!("\n- {}", f.text)).collect();
            let task = format!(
                "Merge these facts about the user into a shorter list: combine facts that say the same thing, \
                 keep every distinct fact, add nothing new. Short sentences in the third person.\n\nFacts:{list}"
            );
            let schema = json!({
                "type": "object",
                "properties": {"facts": {"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 120}, "maxItems": PROFILE_BUDGET}},
                "required": ["facts"],
                "additionalProperties": false
            });
            match structured::run(&daemon, policy.tier, &task, &schema).await {
                Ok(v) => match blocking(move || replace_facts(&store, &old, &v)).await {
                    Ok(n) => tracing::debug!(facts = n, "profile consolidated"),
                    Err(e) => tracing::warn!("storing the consolidated profile failed: {e}"),
                },
                Err(e) => tracing::warn!("profile consolidation failed: {e}"),
            }
        });
    }

    /// Queues a summary of `conversation`'s old turns, folding in the
    /// previous one, if `ctx` (the next prompt's) shows more than [`TURN_BUDGET`] turns.
    pub(in crate::conversation) fn summarise(&self, conversation: ConversationId, ctx: PromptContext) {
        if ctx.turns.len() <= TURN_BUDGET {
            return;
        }
        let summarise = *self.policies.get(TaskKind::Summarise);
        let (daemon, store) = (self.daemon.clone(), self.store.clone());
        let _done = self.background.submit(summarise.rank, async move {
            // Summarise all but the last few turns, folding in the previous summary.
            let read = store.clone();
            let Ok((messages, covered)) = blocking(move || {
                // Only what the previous summary does not cover yet; it is folded in as text.
                Ok((read.messages(conversation)?, read.summary(conversation)?.map(|s| s.covers_up_to)))
            })
            .await
            else {
                return;
            };
            let keep = TURN_BUDGET / 2;
            let complete: Vec<_> =
                messages.into_iter().filter(|m| m.state == MessageState::Complete && covered.is_none_or(|c| m.id > c)).collect();
            if complete.len() <= keep {
                return;
            }
            let old = &complete[..complete.len() - keep];
            let mut text = ctx.summary.clone().map(|s| format!("Earlier summary: {s}\n")).unwrap_or_default();
            for m in old {
                text.push_str(if m.role == Role::User { "User: " } else { "Assistant: " });
                text.push_str(&m.text);
                text.push('\n');
            }
            let (task, schema) = summary_task(&text);
            match structured::run(&daemon, summarise.tier, &task, &schema).await {
                Ok(v) => {
                    if let (Some(s), Some(last)) = (v["summary"].as_str().map(str::to_owned), old.last().map(|m| m.id))
                        && let Err(e) = blocking(move || Ok(store.put_summary(conversation, last, &s)?)).await
                    {
                        tracing::warn!("storing a summary failed: {e}");
                    }
                }
                Err(e) => tracing::warn!("summary failed: {e}"),
            }
        });
    }
}

/// The summarising task for a conversation written out as `text` ("User:
/// ..." and "Assistant: ..." lines), and the schema of its answer.
pub fn summary_task(text: &str) -> (String, serde_json::Value) {
    let schema = json!({
        "type": "object",
        "properties": {"summary": {"type": "string", "minLength": 1, "maxLength": 800}},
        "required": ["summary"],
        "additionalProperties": false
    });
    (format!("Summarise this conversation in a few sentences, keeping names and decisions.\n\n{text}"), schema)
}
