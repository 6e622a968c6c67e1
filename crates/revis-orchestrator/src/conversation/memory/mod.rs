//! The memory work a turn leaves behind, in the background: the answer
//! audited when asked (its verdict stored under [`audit_key`]), the facts
//! the user stated about themselves extracted into the profile (only from
//! what they said of themselves, [`about_user`], and only facts about them,
//! [`profile_facts`]), the profile consolidated once it
//! outgrows [`PROFILE_BUDGET`], and old turns summarised past [`TURN_BUDGET`].
//! Their results are stored and folded into the static part of later prompts.
//!
//! The room, one job a file (each names only the files below it here):
//! - `jobs.rs`: [`Memory`], the work queued in the background (audit,
//!   extraction, consolidation, summary);
//! - `profile.rs`: the store side: learned facts stored, the consolidated
//!   list put in place, a fact told directly ([`tell`]), [`provenance`];
//! - `beside.rs`: what is put beside a question about the person
//!   ([`asked_about`], where: [`Beside`], [`with_what_was_said`]);
//! - `learn.rs`: the facts of the model's extraction that are kept
//!   ([`profile_facts`]), and its guards;
//! - `slot.rs`: the slots a newer fact replaces (`Slot`);
//! - `said.rs`: the sentences in which the person speaks of themselves
//!   ([`statements`]) and the names they give (their own or their people's);
//! - `limits.rs`: how much the profile holds.

mod beside;
mod jobs;
mod learn;
mod limits;
mod profile;
mod said;
mod slot;

pub use beside::{Beside, asked_about, none_found, with_what_was_said};
pub(super) use jobs::Memory;
pub use jobs::{TURN_BUDGET, audit_key, summary_task};
pub use learn::{Learned, extract_facts, follows, grounded, profile_facts};
pub use limits::{MAX_FACT_CHARS, MAX_PROFILE_FACTS, PROFILE_BUDGET};
pub use profile::{Told, as_told, provenance, tell};
pub use said::{about_user, statements};
