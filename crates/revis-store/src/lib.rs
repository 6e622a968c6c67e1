//! The client's database: conversations, messages, profile facts, summaries
//! and settings, on [sled](https://docs.rs/sled/0.34) (the only crate that
//! uses sled).
//!
//! ```no_run
//! # fn main() -> Result<(), revis_store::StoreError> {
//! use revis_store::Store;
//!
//! // Where: the client resolves it (`revis_client::Paths::store`, DATA/db).
//! let opened = Store::open(std::path::Path::new("/home/ada/.local/share/revis/db"))?;
//! if let Some(recovered) = &opened.recovered {
//!     eprintln!("warning: {recovered}"); // the damaged database was kept aside
//! }
//! let store = opened.store;
//! let conversation = store.create_conversation("Trip to Lisbon")?;
//! store.append_user(conversation, "What should I pack?")?; // on disk now
//! let reply = store.begin_reply(conversation, "tier2")?; // on disk, Incomplete
//! store.update_reply(reply, "Light clothes")?; // while streaming; not flushed
//! store.complete_reply(reply, "Light clothes and a jacket.")?; // Complete, on disk
//! # Ok(()) }
//! ```
//!
//! # API
//!
//! - [`Store::open`] → [`Opened`] `{ store, recovered }`.
//! - Conversations: [`create_conversation`](Store::create_conversation),
//!   [`conversations`](Store::conversations) (most recently updated first),
//!   [`conversation`](Store::conversation), [`set_title`](Store::set_title),
//!   [`delete_conversation`](Store::delete_conversation).
//! - Messages, ordered within their conversation: [`append_user`](Store::append_user),
//!   [`begin_reply`](Store::begin_reply), [`update_reply`](Store::update_reply),
//!   [`cut_reply`](Store::cut_reply), [`complete_reply`](Store::complete_reply),
//!   [`rewind`](Store::rewind) (a message and all after it, for an edit or a
//!   regeneration; seqs are never given twice), [`messages`](Store::messages), [`messages_after`](Store::messages_after),
//!   [`message`](Store::message).
//! - Profile facts: [`add_fact`](Store::add_fact), [`facts`](Store::facts),
//!   [`remove_fact`](Store::remove_fact).
//! - Summaries, one per conversation: [`put_summary`](Store::put_summary),
//!   [`summary`](Store::summary).
//! - Settings, JSON values by name: [`set_setting`](Store::set_setting),
//!   [`setting`](Store::setting), [`remove_setting`](Store::remove_setting).
//! - [`flush`](Store::flush).
//!
//! All methods block; from async code use `spawn_blocking`. A [`Store`] is a
//! cheap `Clone` handle. Any number of processes may open one directory: the
//! first holds it (sled allows one) and serves the others over a Unix socket
//! inside it, `<dir>/holder.sock`, to processes of the same user only; when
//! it ends, another takes over
//! ([`Store::is_holder`]; see `share.rs`).
//!
//! # Durability
//!
//! Every write is on disk (flushed) when it returns, except
//! [`update_reply`](Store::update_reply), which sled writes out within half a
//! second. A reply is stored [`MessageState::Incomplete`] from the start of
//! its stream; its final text and `Complete` are one record, written together.
//! A reply cut short while the client runs (Stop, a dropped or failed stream)
//! is ended with [`cut_reply`](Store::cut_reply): the text shown, still
//! `Incomplete`, flushed.
//! So after a crash (kill -9 included, tested) every message whose call
//! returned is there, and a reply that was cut off is flagged incomplete with
//! the text saved so far, never shown as whole.
//!
//! # Versions and damage
//!
//! The database stores its [`SCHEMA_VERSION`]. [`Store::open`] migrates an
//! older one and refuses a newer one ([`StoreError::NewerSchema`]). A damaged
//! database is renamed to `<dir>.damaged-<unix ms>`, replaced by an empty one
//! and reported in [`Opened::recovered`]; nothing is deleted or overwritten.
//! The layout is in `schema.rs`.

mod error;
mod keys;
mod open;
mod schema;
mod share;
mod store;
mod types;

pub use error::{DbError, Result, StoreError};
pub use open::Recovered;
pub use schema::SCHEMA_VERSION;
pub use share::{Opened, Store, socket_path};
pub use types::{Conversation, ConversationId, Fact, FactId, MessageId, MessageState, ParseIdError, Role, StoredMessage, Summary};
