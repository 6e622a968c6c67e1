//! `Db`: conversations, messages, facts, summaries and settings on sled, in
//! the one process that holds the database (`share.rs` makes it a `Store`
//! for every process).

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use sled::Transactional as _;
use sled::transaction::{ConflictableTransactionError, ConflictableTransactionResult, TransactionError};

use crate::error::{DbError, Result, StoreError};
use crate::keys::{decode_message_key, decode_u64, message_key, show, u64_key};
use crate::schema::{
    CONVERSATIONS, ConversationRecord, FACTS, FactRecord, MESSAGES, META, MessageRecord, NEXT_CONVERSATION_KEY, NEXT_FACT_KEY, SETTINGS,
    SUMMARIES, SummaryRecord, json,
};
use crate::{Conversation, ConversationId, Fact, FactId, MessageId, MessageState, Role, StoredMessage, Summary};

/// The database as the process holding sled's lock sees it: a cheap,
/// `Clone`, thread-safe handle. Every method blocks; every write except
/// `update_reply` is flushed to disk before it returns.
#[derive(Clone)]
pub(crate) struct Db {
    path: Arc<Path>,
    db: sled::Db,
    conversations: sled::Tree,
    messages: sled::Tree,
    facts: sled::Tree,
    summaries: sled::Tree,
    settings: sled::Tree,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("path", &self.path).finish_non_exhaustive()
    }
}

type TxResult<T> = ConflictableTransactionResult<T, StoreError>;

fn abort<T>(e: StoreError) -> TxResult<T> {
    Err(ConflictableTransactionError::Abort(e))
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Db {
    /// Wraps an open, migrated database.
    pub(crate) fn from_db(path: Arc<Path>, db: sled::Db) -> sled::Result<Db> {
        Ok(Db {
            conversations: db.open_tree(CONVERSATIONS)?,
            messages: db.open_tree(MESSAGES)?,
            facts: db.open_tree(FACTS)?,
            summaries: db.open_tree(SUMMARIES)?,
            settings: db.open_tree(SETTINGS)?,
            path,
            db,
        })
    }

    /// Flushes everything written so far to disk.
    pub fn flush(&self) -> Result<()> {
        self.db.flush().map(drop).map_err(|e| self.db_err(e))
    }

    // ---- conversations ----

    /// Creates an empty conversation.
    pub fn create_conversation(&self, title: &str) -> Result<ConversationId> {
        let now = now_ms();
        let meta: &sled::Tree = &self.db;
        let id = self.tx((meta, &self.conversations).transaction(|(meta, conversations)| {
            let id = self.next_id(meta, NEXT_CONVERSATION_KEY)?;
            let record = ConversationRecord { title: title.to_owned(), created_ms: now, updated_ms: now, next_seq: 0, removed: 0 };
            conversations.insert(&u64_key(id), json(&record))?;
            Ok(ConversationId(id))
        }))?;
        self.flush()?;
        Ok(id)
    }

    /// All conversations, most recently updated first.
    pub fn conversations(&self) -> Result<Vec<Conversation>> {
        let mut all = Vec::new();
        for entry in self.conversations.iter() {
            let (key, value) = entry.map_err(|e| self.db_err(e))?;
            let id = ConversationId(self.key_u64(CONVERSATIONS, &key)?);
            all.push(conversation(id, self.decode(CONVERSATIONS, &key, &value)?));
        }
        all.sort_by_key(|c| std::cmp::Reverse((c.updated_ms, c.id)));
        Ok(all)
    }

    /// One conversation.
    pub fn conversation(&self, id: ConversationId) -> Result<Option<Conversation>> {
        Ok(self.conversation_record(id)?.map(|record| conversation(id, record)))
    }

    /// Renames a conversation.
    pub fn set_title(&self, id: ConversationId, title: &str) -> Result<()> {
        let now = now_ms();
        self.tx(self.conversations.transaction(|conversations| {
            let mut record = self.tx_conversation(conversations, id)?;
            record.title = title.to_owned();
            record.updated_ms = now;
            conversations.insert(&u64_key(id.0), json(&record))?;
            Ok(())
        }))?;
        self.flush()
    }

    /// Deletes a conversation with its messages and summary, atomically.
    /// Facts learned from it stay (their `source` then points nowhere).
    /// Returns whether it existed.
    pub fn delete_conversation(&self, id: ConversationId) -> Result<bool> {
        let existed =
            self.tx((&self.conversations, &self.messages, &self.summaries).transaction(|(conversations, messages, summaries)| {
                let Some(bytes) = conversations.get(u64_key(id.0))? else {
                    return Ok(false);
                };
                let record: ConversationRecord = self.decode(CONVERSATIONS, &u64_key(id.0), &bytes).or_else(abort)?;
                // Every message's seq is one of 0..next_seq; those a rewind
                // removed are gaps, and removing a missing key does nothing.
                for seq in 0..record.next_seq {
                    messages.remove(&message_key(MessageId { conversation: id, seq }))?;
                }
                summaries.remove(&u64_key(id.0))?;
                conversations.remove(&u64_key(id.0))?;
                Ok(true)
            }))?;
        self.flush()?;
        Ok(existed)
    }

    // ---- messages ----

    /// Appends the user's message; on disk when this returns.
    pub fn append_user(&self, conversation: ConversationId, text: &str) -> Result<MessageId> {
        let now = now_ms();
        self.append(
            conversation,
            MessageRecord {
                role: Role::User,
                text: text.to_owned(),
                state: MessageState::Complete,
                tier: None,
                created_ms: now,
                completed_ms: Some(now),
            },
        )
    }

    /// Starts an assistant reply from `tier`: empty and
    /// [`MessageState::Incomplete`], on disk when this returns, so a crash
    /// during the stream leaves it flagged, never missing.
    pub fn begin_reply(&self, conversation: ConversationId, tier: &str) -> Result<MessageId> {
        self.append(
            conversation,
            MessageRecord {
                role: Role::Assistant,
                text: String::new(),
                state: MessageState::Incomplete,
                tier: Some(tier.to_owned()),
                created_ms: now_ms(),
                completed_ms: None,
            },
        )
    }

    /// Saves the text streamed so far (the whole of it, replacing the last
    /// save). Not flushed: cheap enough to call every few tokens; sled writes
    /// it out within half a second, and a crash loses at most that much.
    /// Fails with [`StoreError::NotAnOpenReply`] once the reply is complete.
    pub fn update_reply(&self, id: MessageId, text_so_far: &str) -> Result<()> {
        self.tx(self.messages.transaction(|messages| {
            let mut record = self.tx_open_reply(messages, id)?;
            record.text = text_so_far.to_owned();
            messages.insert(&message_key(id), json(&record))?;
            Ok(())
        }))
    }

    /// Ends a reply that was cut short (stopped by the user, its stream
    /// dropped or failed): `shown` (everything the user was shown of it)
    /// replaces the saved text, it stays [`MessageState::Incomplete`], and it
    /// is flushed before this returns.
    /// Fails with [`StoreError::NotAnOpenReply`] once the reply is complete.
    pub fn cut_reply(&self, id: MessageId, shown: &str) -> Result<()> {
        self.update_reply(id, shown)?;
        self.flush()
    }

    /// Ends a reply: its final text and [`MessageState::Complete`] are
    /// written together (one record), and flushed before this returns.
    pub fn complete_reply(&self, id: MessageId, final_text: &str) -> Result<()> {
        let now = now_ms();
        self.tx((&self.conversations, &self.messages).transaction(|(conversations, messages)| {
            let mut record = self.tx_open_reply(messages, id)?;
            record.text = final_text.to_owned();
            record.state = MessageState::Complete;
            record.completed_ms = Some(now);
            messages.insert(&message_key(id), json(&record))?;
            let mut conversation = self.tx_conversation(conversations, id.conversation)?;
            conversation.updated_ms = now;
            conversations.insert(&u64_key(id.conversation.0), json(&conversation))?;
            Ok(())
        }))?;
        self.flush()
    }

    /// Removes `from` and every later message of its conversation, and the
    /// summary if it covers any of them (it summarised text that is gone),
    /// atomically; flushed before it returns. Returns the removed messages,
    /// in order: none when nothing is at or after `from`.
    ///
    /// Seqs are never given again: the next message gets the seq it would
    /// have got without the rewind, so a removed id never names another
    /// message (settings and facts that name one point nowhere).
    pub fn rewind(&self, from: MessageId) -> Result<Vec<StoredMessage>> {
        let now = now_ms();
        let conversation = from.conversation;
        let removed =
            self.tx((&self.conversations, &self.messages, &self.summaries).transaction(|(conversations, messages, summaries)| {
                let mut record = self.tx_conversation(conversations, conversation)?;
                let mut removed = Vec::new();
                // Inside the transaction, so no append can slip in between
                // the reading of next_seq and the removals.
                for seq in from.seq..record.next_seq {
                    let id = MessageId { conversation, seq };
                    let key = message_key(id);
                    if let Some(bytes) = messages.remove(&key)? {
                        removed.push(stored_message(id, self.decode(MESSAGES, &key, &bytes).or_else(abort)?));
                    }
                }
                let Some(first) = removed.first().map(|m| m.id.seq) else {
                    return Ok(removed);
                };
                let summary_key = u64_key(conversation.0);
                if let Some(bytes) = summaries.get(summary_key)? {
                    let summary: SummaryRecord = self.decode(SUMMARIES, &summary_key, &bytes).or_else(abort)?;
                    if summary.covers_up_to >= first {
                        summaries.remove(&summary_key)?;
                    }
                }
                record.removed += removed.len() as u64;
                record.updated_ms = now;
                conversations.insert(&u64_key(conversation.0), json(&record))?;
                Ok(removed)
            }))?;
        self.flush()?;
        Ok(removed)
    }

    /// A conversation's messages, in order.
    pub fn messages(&self, conversation: ConversationId) -> Result<Vec<StoredMessage>> {
        self.require_conversation(conversation)?;
        self.collect_messages(self.messages.scan_prefix(u64_key(conversation.0)))
    }

    /// The messages of `after`'s conversation that come after it, in order
    /// (e.g. those a summary does not cover yet).
    pub fn messages_after(&self, after: MessageId) -> Result<Vec<StoredMessage>> {
        self.require_conversation(after.conversation)?;
        let Some(next) = after.seq.checked_add(1) else {
            return Ok(Vec::new());
        };
        let start = message_key(MessageId { conversation: after.conversation, seq: next });
        let end = message_key(MessageId { conversation: after.conversation, seq: u64::MAX });
        self.collect_messages(self.messages.range(start..=end))
    }

    /// One message.
    pub fn message(&self, id: MessageId) -> Result<Option<StoredMessage>> {
        let key = message_key(id);
        match self.messages.get(key).map_err(|e| self.db_err(e))? {
            Some(bytes) => Ok(Some(stored_message(id, self.decode(MESSAGES, &key, &bytes)?))),
            None => Ok(None),
        }
    }

    // ---- profile facts ----

    /// Adds a fact about the user with the message it came from and the
    /// words of that message it rests on.
    pub fn add_fact_said(&self, fact: &str, source: Option<MessageId>, said: Option<&str>) -> Result<FactId> {
        let now = now_ms();
        let meta: &sled::Tree = &self.db;
        let said = said.map(str::to_owned);
        let id = self.tx((meta, &self.facts).transaction(|(meta, facts)| {
            let id = self.next_id(meta, NEXT_FACT_KEY)?;
            facts.insert(&u64_key(id), json(&FactRecord { text: fact.to_owned(), source, said: said.clone(), created_ms: now }))?;
            Ok(FactId(id))
        }))?;
        self.flush()?;
        Ok(id)
    }

    /// All facts, oldest first.
    pub fn facts(&self) -> Result<Vec<Fact>> {
        let mut all = Vec::new();
        for entry in self.facts.iter() {
            let (key, value) = entry.map_err(|e| self.db_err(e))?;
            let record: FactRecord = self.decode(FACTS, &key, &value)?;
            all.push(Fact {
                id: FactId(self.key_u64(FACTS, &key)?),
                text: record.text,
                source: record.source,
                said: record.said,
                created_ms: record.created_ms,
            });
        }
        Ok(all)
    }

    /// Removes a fact; returns whether it existed.
    pub fn remove_fact(&self, id: FactId) -> Result<bool> {
        let existed = self.facts.remove(u64_key(id.0)).map_err(|e| self.db_err(e))?.is_some();
        self.flush()?;
        Ok(existed)
    }

    // ---- summaries ----

    /// Sets the conversation's summary (replacing any earlier one), covering
    /// its messages up to and including `covers_up_to`.
    pub fn put_summary(&self, conversation: ConversationId, covers_up_to: MessageId, text: &str) -> Result<()> {
        if covers_up_to.conversation != conversation {
            return Err(StoreError::WrongConversation { message: covers_up_to, conversation });
        }
        let now = now_ms();
        self.tx((&self.conversations, &self.messages, &self.summaries).transaction(|(conversations, messages, summaries)| {
            self.tx_conversation(conversations, conversation)?;
            // A seq below next_seq may be a gap a rewind left: the message itself must be there.
            if messages.get(message_key(covers_up_to))?.is_none() {
                return abort(StoreError::NoMessage(covers_up_to));
            }
            let summary = SummaryRecord { covers_up_to: covers_up_to.seq, text: text.to_owned(), created_ms: now };
            summaries.insert(&u64_key(conversation.0), json(&summary))?;
            Ok(())
        }))?;
        self.flush()
    }

    /// The conversation's summary, if one was written.
    pub fn summary(&self, conversation: ConversationId) -> Result<Option<Summary>> {
        let key = u64_key(conversation.0);
        let Some(bytes) = self.summaries.get(key).map_err(|e| self.db_err(e))? else {
            return Ok(None);
        };
        let record: SummaryRecord = self.decode(SUMMARIES, &key, &bytes)?;
        Ok(Some(Summary {
            conversation,
            covers_up_to: MessageId { conversation, seq: record.covers_up_to },
            text: record.text,
            created_ms: record.created_ms,
        }))
    }

    // ---- settings ----

    /// Sets a setting to any JSON value.
    pub fn set_setting(&self, key: &str, value: &serde_json::Value) -> Result<()> {
        self.settings.insert(key.as_bytes(), json(value)).map_err(|e| self.db_err(e))?;
        self.flush()
    }

    /// A setting's value, if set.
    pub fn setting(&self, key: &str) -> Result<Option<serde_json::Value>> {
        match self.settings.get(key.as_bytes()).map_err(|e| self.db_err(e))? {
            Some(bytes) => Ok(Some(self.decode(SETTINGS, key.as_bytes(), &bytes)?)),
            None => Ok(None),
        }
    }

    /// Removes a setting; returns whether it was set.
    pub fn remove_setting(&self, key: &str) -> Result<bool> {
        let existed = self.settings.remove(key.as_bytes()).map_err(|e| self.db_err(e))?.is_some();
        self.flush()?;
        Ok(existed)
    }

    // ---- helpers ----

    fn append(&self, conversation: ConversationId, message: MessageRecord) -> Result<MessageId> {
        let id = self.tx((&self.conversations, &self.messages).transaction(|(conversations, messages)| {
            let mut record = self.tx_conversation(conversations, conversation)?;
            let id = MessageId { conversation, seq: record.next_seq };
            record.next_seq += 1;
            record.updated_ms = message.created_ms;
            conversations.insert(&u64_key(conversation.0), json(&record))?;
            messages.insert(&message_key(id), json(&message))?;
            Ok(id)
        }))?;
        self.flush()?;
        Ok(id)
    }

    fn collect_messages(&self, entries: sled::Iter) -> Result<Vec<StoredMessage>> {
        let mut all = Vec::new();
        for entry in entries {
            let (key, value) = entry.map_err(|e| self.db_err(e))?;
            let id = decode_message_key(&key).ok_or_else(|| self.bad_key(MESSAGES, &key))?;
            all.push(stored_message(id, self.decode(MESSAGES, &key, &value)?));
        }
        Ok(all)
    }

    fn conversation_record(&self, id: ConversationId) -> Result<Option<ConversationRecord>> {
        let key = u64_key(id.0);
        match self.conversations.get(key).map_err(|e| self.db_err(e))? {
            Some(bytes) => Ok(Some(self.decode(CONVERSATIONS, &key, &bytes)?)),
            None => Ok(None),
        }
    }

    fn require_conversation(&self, id: ConversationId) -> Result<()> {
        match self.conversations.contains_key(u64_key(id.0)).map_err(|e| self.db_err(e))? {
            true => Ok(()),
            false => Err(StoreError::NoConversation(id)),
        }
    }

    /// Inside a transaction: the conversation's record, or abort.
    fn tx_conversation(&self, conversations: &sled::transaction::TransactionalTree, id: ConversationId) -> TxResult<ConversationRecord> {
        let key = u64_key(id.0);
        match conversations.get(key)? {
            Some(bytes) => self.decode(CONVERSATIONS, &key, &bytes).or_else(abort),
            None => abort(StoreError::NoConversation(id)),
        }
    }

    /// Inside a transaction: the reply's record if it is still open, or abort.
    fn tx_open_reply(&self, messages: &sled::transaction::TransactionalTree, id: MessageId) -> TxResult<MessageRecord> {
        let key = message_key(id);
        let Some(bytes) = messages.get(key)? else {
            return abort(StoreError::NoMessage(id));
        };
        let record: MessageRecord = self.decode(MESSAGES, &key, &bytes).or_else(abort)?;
        if record.role != Role::Assistant || record.state != MessageState::Incomplete {
            return abort(StoreError::NotAnOpenReply(id));
        }
        Ok(record)
    }

    /// Inside a transaction: takes the next id from a counter in `meta`.
    fn next_id(&self, meta: &sled::transaction::TransactionalTree, counter: &[u8]) -> TxResult<u64> {
        let Some(bytes) = meta.get(counter)? else {
            // Written by the migration to version 1, so its absence is damage.
            return abort(StoreError::Damaged {
                path: self.path.to_path_buf(),
                reason: format!("the {} counter is missing", show(counter)),
            });
        };
        let id: u64 = self.decode(META, counter, &bytes).or_else(abort)?;
        meta.insert(counter, json(&(id + 1)))?;
        Ok(id)
    }

    fn tx<T>(&self, result: Result<T, TransactionError<StoreError>>) -> Result<T> {
        result.map_err(|e| match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => self.db_err(e),
        })
    }

    fn decode<T: DeserializeOwned>(&self, tree: &'static str, key: &[u8], bytes: &[u8]) -> Result<T> {
        serde_json::from_slice(bytes).map_err(|source| StoreError::Decode { path: self.path.to_path_buf(), tree, key: show(key), source })
    }

    fn key_u64(&self, tree: &'static str, key: &[u8]) -> Result<u64> {
        decode_u64(key).ok_or_else(|| self.bad_key(tree, key))
    }

    fn bad_key(&self, tree: &'static str, key: &[u8]) -> StoreError {
        StoreError::Damaged { path: self.path.to_path_buf(), reason: format!("a {tree} key is malformed: {}", show(key)) }
    }

    fn db_err(&self, source: sled::Error) -> StoreError {
        StoreError::Db { path: self.path.to_path_buf(), source: DbError(source) }
    }
}

fn conversation(id: ConversationId, record: ConversationRecord) -> Conversation {
    Conversation {
        id,
        title: record.title,
        created_ms: record.created_ms,
        updated_ms: record.updated_ms,
        message_count: record.next_seq.saturating_sub(record.removed),
    }
}

fn stored_message(id: MessageId, record: MessageRecord) -> StoredMessage {
    StoredMessage {
        id,
        role: record.role,
        text: record.text,
        state: record.state,
        tier: record.tier,
        created_ms: record.created_ms,
        completed_ms: record.completed_ms,
    }
}
