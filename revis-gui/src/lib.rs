//! revis-gui, the desktop app of revis: a thin egui client over the same
//! libraries as the CLI (revis-client, revis-orchestrator, revis-store).
//!
//! Two threads: the UI thread ([`App`]: draw [`State`], turn clicks and keys
//! into [`Command`]s) and the I/O thread ([`backend`]: a tokio runtime that
//! owns the client, the store and the orchestrator's `Chat`, and answers
//! with [`Event`]s). The UI never waits on I/O; each event wakes it.

pub mod app;
pub mod backend;
mod chat_actor;
pub mod settings;
pub mod state;

pub use app::App;
pub use backend::{Command, Event, Options};
pub use state::{State, View};
