//! The store's operations, listed once: each call of [`Store`](crate::Store)
//! with its docs and arguments, the request a guest sends the holder for it,
//! and whether asking that again is harmless. `wire.rs` makes the request
//! type from this list and `calls.rs` makes [`Store`](crate::Store)'s methods.

use crate::{ConversationId, FactId, MessageId};

/// Hands the list of operations to the macro `$then`, one entry each:
///
/// ```text
/// /// docs of the Store method
/// read|write fn method(arg: ArgType, ...) -> Output = Variant { field: FieldType, ... };
/// ```
///
/// `method` is both [`Store`](crate::Store)'s method and the
/// [`Db`](crate::store::Db) method that runs it, with the same arguments in
/// the same order; `Variant` is the request a guest sends, its fields (named
/// as on the wire, which must not change) holding the arguments in order
/// (see [`Field`] for how each is held). `read` marks an operation that
/// changes nothing, so a guest may ask it again when the holder goes before
/// replying. Names in the list are resolved where `$then` is invoked.
macro_rules! for_each_operation {
    ($then:ident) => {
        $then! {
            /// Flushes everything written so far to disk.
            read fn flush() -> () = Flush {};

            /// Creates an empty conversation.
            write fn create_conversation(title: &str) -> ConversationId = CreateConversation { title: String };

            /// Every conversation, most recently updated first.
            read fn conversations() -> Vec<Conversation> = Conversations {};

            /// One conversation, if it exists.
            read fn conversation(id: ConversationId) -> Option<Conversation> = Conversation { id: ConversationId };

            /// Renames a conversation.
            write fn set_title(id: ConversationId, title: &str) -> () = SetTitle { id: ConversationId, title: String };

            /// Deletes a conversation with its messages and summary; false if there was none.
            write fn delete_conversation(id: ConversationId) -> bool = DeleteConversation { id: ConversationId };

            /// Appends a user message (on disk when it returns).
            write fn append_user(conversation: ConversationId, text: &str) -> MessageId = AppendUser { conversation: ConversationId, text: String };

            /// Starts a reply by `tier`, stored [`crate::MessageState::Incomplete`] (on disk when it returns).
            write fn begin_reply(conversation: ConversationId, tier: &str) -> MessageId = BeginReply { conversation: ConversationId, tier: String };

            /// The text of a reply so far, while it streams (written out by sled within half a second).
            write fn update_reply(id: MessageId, text_so_far: &str) -> () = UpdateReply { id: MessageId, text: String };

            /// Ends a reply cut short with the text shown, still incomplete (on disk when it returns).
            write fn cut_reply(id: MessageId, shown: &str) -> () = CutReply { id: MessageId, shown: String };

            /// Completes a reply with its final text (on disk when it returns).
            write fn complete_reply(id: MessageId, final_text: &str) -> () = CompleteReply { id: MessageId, text: String };

            /// Removes `from` and every later message of its conversation, with the
            /// summary if it covers any of them, in one transaction (on disk when it
            /// returns); returns the removed messages, in order (none when nothing is
            /// at or after `from`). Their seqs are never given again: the next
            /// message gets a seq above every removed one.
            write fn rewind(from: MessageId) -> Vec<StoredMessage> = Rewind { from: MessageId };

            /// A conversation's messages, in order.
            read fn messages(conversation: ConversationId) -> Vec<StoredMessage> = Messages { conversation: ConversationId };

            /// The messages after `after` in its conversation, in order.
            read fn messages_after(after: MessageId) -> Vec<StoredMessage> = MessagesAfter { after: MessageId };

            /// One message, if it exists.
            read fn message(id: MessageId) -> Option<StoredMessage> = Message { id: MessageId };

            /// Adds a fact about the user with the message it came from and the
            /// words of that message it rests on (see [`crate::Fact::said`]).
            write fn add_fact_said(fact: &str, source: Option<MessageId>, said: Option<&str>) -> FactId = AddFact {
                fact: String,
                source: Option<MessageId>,
                #[serde(default, skip_serializing_if = "Option::is_none")]
                said: Option<String>
            };

            /// Every fact, oldest first.
            read fn facts() -> Vec<Fact> = Facts {};

            /// Removes a fact; false if there was none.
            write fn remove_fact(id: FactId) -> bool = RemoveFact { id: FactId };

            /// Sets a conversation's summary, covering its messages up to `covers_up_to`.
            write fn put_summary(conversation: ConversationId, covers_up_to: MessageId, text: &str) -> () = PutSummary {
                conversation: ConversationId,
                covers_up_to: MessageId,
                text: String
            };

            /// A conversation's summary, if it has one.
            read fn summary(conversation: ConversationId) -> Option<Summary> = Summary { conversation: ConversationId };

            /// Sets a setting (a JSON value by name; on disk when it returns).
            write fn set_setting(key: &str, value: &serde_json::Value) -> () = SetSetting { key: String, value: serde_json::Value };

            /// A setting, if set.
            read fn setting(key: &str) -> Option<serde_json::Value> = Setting { key: String };

            /// Removes a setting; false if it was not set.
            write fn remove_setting(key: &str) -> bool = RemoveSetting { key: String };
        }
    };
}
pub(super) use for_each_operation;

/// How a request holds one argument of its call: owned, to be sent, and
/// lent back in the form the call takes it, to be run.
pub(super) trait Field {
    /// The argument as [`Store`](crate::Store)'s method takes it.
    type Arg<'a>
    where
        Self: 'a;
    /// The argument, kept in the request.
    fn own(arg: Self::Arg<'_>) -> Self;
    /// The argument back, for the database's method.
    fn lend(&self) -> Self::Arg<'_>;
}

impl Field for String {
    type Arg<'a> = &'a str;
    fn own(arg: &str) -> Self {
        arg.into()
    }
    fn lend(&self) -> &str {
        self
    }
}

impl Field for Option<String> {
    type Arg<'a> = Option<&'a str>;
    fn own(arg: Option<&str>) -> Self {
        arg.map(str::to_owned)
    }
    fn lend(&self) -> Option<&str> {
        self.as_deref()
    }
}

impl Field for serde_json::Value {
    type Arg<'a> = &'a serde_json::Value;
    fn own(arg: &serde_json::Value) -> Self {
        arg.clone()
    }
    fn lend(&self) -> &serde_json::Value {
        self
    }
}

/// Ids are taken and held by value.
macro_rules! by_value {
    ($($t:ty),*) => {$(
        impl Field for $t {
            type Arg<'a> = $t;
            fn own(arg: $t) -> Self {
                arg
            }
            fn lend(&self) -> $t {
                *self
            }
        }
    )*};
}
by_value!(ConversationId, MessageId, FactId, Option<MessageId>);
