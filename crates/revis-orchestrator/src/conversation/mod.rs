//! A conversation turn from start to finish, in three gears: tier1's quick
//! check of the message (typos, kind, escalation; [`crate::check`]) when it
//! is ready before the answer, the answer from tier2 on top of the warm
//! prefix, after its private checklist ([`crate::checklist`]), stored
//! (incomplete until its stream ends; cut short, exactly the text shown is
//! kept, see `reply.rs`), and, when tier1 or the checklist says so or the
//! user asks, tier3's deeper follow-up. Then, in the background, the check
//! if it was not ready in time, profile facts extracted, old turns
//! summarised and, once it outgrows its budget, the profile consolidated.
//! Their results are stored and folded into the static part of later prompts.
//!
//! The room, one job a file. [`Chat`] owns the draft check, the typing
//! timer, the reply writer and the memory work, and hands a record keeper
//! (with its settings of the moment) to each turn and follow-up:
//! - `turn/`: [`Chat`], its settings and the typing signal (`mod.rs`); the
//!   turn itself, from the message sent to the stored answer, and the
//!   conversation's title (`answer.rs`); going back on a turn, the
//!   conversation rewound for an edit or a regeneration, a reply that was
//!   cut off continued (`rewind.rs`);
//! - `typing.rs`: the typing timer that ends the typing hold after a pause;
//! - `draft.rs`: tier1's check of the draft while the user types;
//! - `reply.rs`: the reply saved while it streams, whatever way it ends;
//! - `record.rs`: the turn's stored record and the notes it reports;
//! - `escalation.rs`: the record kept, and what it asks for (tier1's late
//!   check, tier3's follow-up);
//! - `context.rs`: the next prompt's parts, read back from the store;
//! - `memory/`: the audit, the profile and the summaries: the background
//!   jobs, the profile's store side, what goes beside a question, the facts
//!   kept of an extraction, the slots a newer fact replaces, the person's
//!   own statements (one file each);
//! - `error.rs`: [`ChatError`].

mod context;
mod draft;
mod error;
mod escalation;
mod memory;
mod record;
mod reply;
mod turn;
mod typing;

#[cfg(test)]
mod tests;

pub use context::{RULES, rules_for};
pub use draft::DRAFT_PAUSE;
pub use error::ChatError;
pub use escalation::{DEEP_ASK, DEEP_MAX_TOKENS};
pub use memory::{
    Beside, Learned, MAX_FACT_CHARS, MAX_PROFILE_FACTS, PROFILE_BUDGET, TURN_BUDGET, Told, about_user, as_told, asked_about, audit_key,
    extract_facts, follows, grounded, none_found, profile_facts, provenance, statements, summary_task, tell,
};
pub use record::{EscalatedBy, Escalation, TurnNote, TurnRecord, turn_key, turn_record};
pub use reply::{LOOP_SPAN, repeats_itself};
pub use turn::{Chat, MAX_MESSAGE_BYTES, PARTIAL_SAVE_EVERY, TITLE_CHARS, TYPING_IDLE};
