//! What crosses the socket, one JSON line each way: a guest's request (one
//! of [`Store`](crate::Store)'s calls, made from the list in `ops.rs`), and
//! the holder's reply, a value or an error a guest rebuilds.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::ops::{Field, for_each_operation};
use crate::error::{Result, StoreError};
use crate::store::Db;
use crate::{ConversationId, FactId, MessageId};

/// The longest request or reply line (a conversation's messages included).
pub(super) const MAX_LINE: usize = 256 << 20;

/// Makes [`Request`] from the list of operations.
macro_rules! requests {
    ($(
        $(#[$doc:meta])*
        $kind:ident fn $method:ident($($arg:ident: $arg_type:ty),*) -> $output:ty
            = $variant:ident { $($(#[$field_attr:meta])* $field:ident: $field_type:ty),* };
    )*) => {
        /// One call of [`Store`](crate::Store)'s, as a guest sends it.
        #[derive(Clone, Debug, Serialize, Deserialize)]
        #[serde(tag = "op", rename_all = "snake_case")]
        pub(super) enum Request {
            $($variant { $($(#[$field_attr])* $field: $field_type),* },)*
        }

        impl Request {
            /// Whether running it twice changes nothing (so it may be asked again).
            pub(super) fn reads_only(&self) -> bool {
                match self {
                    $(Self::$variant { .. } => requests!(@reads_only $kind),)*
                }
            }

            /// Runs it on the holder's database.
            pub(super) fn run(self, db: &Db) -> Result<serde_json::Value> {
                fn v<T: Serialize>(r: Result<T>) -> Result<serde_json::Value> {
                    r.map(|x| serde_json::to_value(x).expect("store values serialize"))
                }
                match self {
                    $(Self::$variant { $($field),* } => v(db.$method($(Field::lend(&$field)),*)),)*
                }
            }
        }
    };
    (@reads_only read) => { true };
    (@reads_only write) => { false };
}
for_each_operation!(requests);

/// The holder's reply: a value, or the error as a guest rebuilds it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Reply {
    Ok(serde_json::Value),
    Err(WireError),
}

/// A [`StoreError`] across the socket: the ones a caller may act on by
/// kind, the rest by their words.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum WireError {
    NoConversation(ConversationId),
    NoMessage(MessageId),
    NotAnOpenReply(MessageId),
    WrongConversation { message: MessageId, conversation: ConversationId },
    Other(String),
}

impl From<StoreError> for WireError {
    fn from(e: StoreError) -> WireError {
        match e {
            StoreError::NoConversation(c) => WireError::NoConversation(c),
            StoreError::NoMessage(m) => WireError::NoMessage(m),
            StoreError::NotAnOpenReply(m) => WireError::NotAnOpenReply(m),
            StoreError::WrongConversation { message, conversation } => WireError::WrongConversation { message, conversation },
            other => WireError::Other(other.to_string()),
        }
    }
}

impl Reply {
    pub(super) fn into_result<T: DeserializeOwned>(self, dir: &Path) -> Result<T> {
        match self {
            Reply::Ok(v) => serde_json::from_value(v)
                .map_err(|e| StoreError::Shared { path: dir.to_path_buf(), message: format!("a reply this revis cannot read: {e}") }),
            Reply::Err(WireError::NoConversation(c)) => Err(StoreError::NoConversation(c)),
            Reply::Err(WireError::NoMessage(m)) => Err(StoreError::NoMessage(m)),
            Reply::Err(WireError::NotAnOpenReply(m)) => Err(StoreError::NotAnOpenReply(m)),
            Reply::Err(WireError::WrongConversation { message, conversation }) => {
                Err(StoreError::WrongConversation { message, conversation })
            }
            Reply::Err(WireError::Other(message)) => Err(StoreError::Shared { path: dir.to_path_buf(), message }),
        }
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    /// The requests on the wire, as every revis before the list in `ops.rs`
    /// wrote them (a guest and a holder of different builds must agree),
    /// and which of them may be asked again.
    #[test]
    fn requests_keep_their_wire_form() {
        let c = ConversationId(3);
        let m = MessageId { conversation: c, seq: 4 };
        let all = [
            Request::Flush {},
            Request::CreateConversation { title: "t".into() },
            Request::Conversations {},
            Request::Conversation { id: c },
            Request::SetTitle { id: c, title: "t".into() },
            Request::DeleteConversation { id: c },
            Request::AppendUser { conversation: c, text: "x".into() },
            Request::BeginReply { conversation: c, tier: "tier2".into() },
            Request::UpdateReply { id: m, text: "x".into() },
            Request::CutReply { id: m, shown: "x".into() },
            Request::CompleteReply { id: m, text: "x".into() },
            Request::Rewind { from: m },
            Request::Messages { conversation: c },
            Request::MessagesAfter { after: m },
            Request::Message { id: m },
            Request::AddFact { fact: "f".into(), source: Some(m), said: None },
            Request::AddFact { fact: "f".into(), source: None, said: Some("s".into()) },
            Request::Facts {},
            Request::RemoveFact { id: FactId(2) },
            Request::PutSummary { conversation: c, covers_up_to: m, text: "s".into() },
            Request::Summary { conversation: c },
            Request::SetSetting { key: "k".into(), value: serde_json::json!({"a": 1}) },
            Request::Setting { key: "k".into() },
            Request::RemoveSetting { key: "k".into() },
        ];
        let mut out = String::new();
        for request in &all {
            let line = serde_json::to_string(request).unwrap();
            let back: Request = serde_json::from_str(&line).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), line);
            out += &format!("{line} {}\n", request.reads_only());
        }
        expect![[r#"
            {"op":"flush"} true
            {"op":"create_conversation","title":"t"} false
            {"op":"conversations"} true
            {"op":"conversation","id":3} true
            {"op":"set_title","id":3,"title":"t"} false
            {"op":"delete_conversation","id":3} false
            {"op":"append_user","conversation":3,"text":"x"} false
            {"op":"begin_reply","conversation":3,"tier":"tier2"} false
            {"op":"update_reply","id":{"conversation":3,"seq":4},"text":"x"} false
            {"op":"cut_reply","id":{"conversation":3,"seq":4},"shown":"x"} false
            {"op":"complete_reply","id":{"conversation":3,"seq":4},"text":"x"} false
            {"op":"rewind","from":{"conversation":3,"seq":4}} false
            {"op":"messages","conversation":3} true
            {"op":"messages_after","after":{"conversation":3,"seq":4}} true
            {"op":"message","id":{"conversation":3,"seq":4}} true
            {"op":"add_fact","fact":"f","source":{"conversation":3,"seq":4}} false
            {"op":"add_fact","fact":"f","source":null,"said":"s"} false
            {"op":"facts"} true
            {"op":"remove_fact","id":2} false
            {"op":"put_summary","conversation":3,"covers_up_to":{"conversation":3,"seq":4},"text":"s"} false
            {"op":"summary","conversation":3} true
            {"op":"set_setting","key":"k","value":{"a":1}} false
            {"op":"setting","key":"k"} true
            {"op":"remove_setting","key":"k"} false
        "#]]
        .assert_eq(&out);
    }
}
