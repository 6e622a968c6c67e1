//! [`Store`]'s calls, made from the list in `ops.rs`: each is run here when
//! this process holds the database, else by the holder.

use super::Store;
use super::ops::{Field, for_each_operation};
use super::wire::Request;
use crate::error::Result;
use crate::{Conversation, ConversationId, Fact, FactId, MessageId, StoredMessage, Summary};

/// Makes [`Store`]'s method for each operation: the request a guest would
/// send, and the same call on the database here.
macro_rules! calls {
    ($(
        $(#[$doc:meta])*
        $kind:ident fn $method:ident($($arg:ident: $arg_type:ty),*) -> $output:ty
            = $variant:ident { $($(#[$field_attr:meta])* $field:ident: $field_type:ty),* };
    )*) => {
        impl Store {
            $(
                $(#[$doc])*
                pub fn $method(&self, $($arg: $arg_type),*) -> Result<$output> {
                    self.call(Request::$variant { $($field: Field::own($arg)),* }, |db| db.$method($($arg),*))
                }
            )*
        }
    };
}
for_each_operation!(calls);

impl Store {
    /// Adds a fact about the user (on disk when it returns).
    pub fn add_fact(&self, fact: &str, source: Option<MessageId>) -> Result<FactId> {
        self.add_fact_said(fact, source, None)
    }
}
