//! The client's brain: what runs when. Task types and their tiers and
//! priorities ([`task`]), the three gates ([`gates`]), pre-prefill while the
//! user types ([`prefill`]), prompts as static prefix + dynamic suffix
//! ([`prompt`]), structured output from a private reasoning tag
//! ([`structured`]), tier1's quick check ([`check`]), tier2's checklist
//! ([`checklist`]), and a conversation turn end to end ([`conversation`]).
//!
//! It is pure policy over revis-client's domain API: it runs every task
//! through a [`revis_client::Runner`] (one daemon, or the dispatcher over
//! this machine and the paired nodes) and never sees the wire. Unit tests
//! script a runner.

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
