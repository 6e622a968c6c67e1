//! The client's brain: what runs when. It is pure policy over
//! revis-client's domain API: it runs every task through a
//! [`revis_client::Runner`] (one daemon, or the dispatcher over this machine
//! and the paired nodes) and never sees the wire. Unit tests script a runner.
//!
//! Contents, one line a module:
//! - [`conversation`]: a conversation turn end to end, owned by [`conversation::Chat`]
//!   (typing, draft check, answer, record, escalation, memory work);
//! - [`task`]: task types, their tiers and priorities, the background runner;
//! - [`gates`]: the three gates that decide when background work may start;
//! - [`prefill`]: pre-prefill, the next prompt's static part warmed while the user types;
//! - [`prompt`]: prompts as a static prefix plus a dynamic suffix;
//! - [`structured`]: structured output (JSON) after a private reasoning tag;
//! - [`check`]: tier1's quick check of a message (typos, kind, escalation);
//! - [`checklist`]: tier2's private checklist before it answers;
//! - [`ensemble`]: where the user's ensembles live in the store;
//! - [`offload`]: where the user's offload choices live in the store.

pub mod check;
pub mod checklist;
pub mod conversation;
pub mod ensemble;
pub mod gates;
pub mod offload;
pub mod prefill;
pub mod prompt;
pub mod structured;
pub mod task;

pub use gates::{GateState, Gates};
pub use prefill::{EnterOutcome, PrePrefill, PrefillPhase};
pub use task::{Background, Policies, TaskKind, TaskPolicy, Urgency};
