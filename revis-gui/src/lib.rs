//! revis-gui, the desktop app of revis: a thin egui client over the same
//! libraries as the CLI (revis-client, revis-orchestrator, revis-store).
//!
//! Two threads: the UI thread ([`App`]: draw [`State`], turn clicks and keys
//! into [`Command`]s) and the I/O thread ([`io_thread::IoThread`]: a tokio runtime that
//! owns the client, the store and the orchestrator's `Chat`, and answers
//! with [`Event`]s, defined in [`protocol`]). The UI never waits on I/O; each
//! event wakes it. [`Options`] holds every path, resolved once at start-up.

pub mod app;
mod chat_actor;
pub mod io_thread;
pub mod options;
pub mod protocol;
pub mod settings;
pub mod state;

pub use app::App;
pub use options::Options;
pub use protocol::{Command, Event};
pub use state::{State, View};
