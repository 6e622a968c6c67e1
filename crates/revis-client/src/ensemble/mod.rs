//! Ensembles: two or more different models (each a tier of this machine's
//! daemon or of a paired node's, nothing shared between them) answering
//! together, and compared per byte, never per token, so models with
//! different vocabularies can be combined.
//!
//! An [`Ensemble`] is a [`crate::Runner`], like a [`crate::Client`] or the
//! [`crate::dispatch::Dispatcher`]; the dispatcher runs a tier's answers
//! through one when the user switched the tier's ensemble on, so chat,
//! `revis run`, background tasks and the GUI use it unchanged.
//!
//! An answer is built in rounds. Each round adds a span of text for
//! everyone: every member continues from the same answer so far (the
//! daemon's `answer_prefix`, whose small chunks keep re-evaluation short).
//!
//! - `confident`: each member drafts up to K tokens (cut back to a word
//!   boundary); the draft with the highest log-probability per byte under
//!   its own model wins.
//! - `cross`: each member drafts; every member scores every draft (one
//!   Score call with several continuations); the draft with the highest
//!   weighted sum of per-byte log-probabilities wins. The weights follow
//!   how often each member's drafts win (multiplicative weights, with a
//!   floor), so a weak member fades out instead of dragging the answer down.
//! - `merge`: the first member drafts with its likeliest alternatives per
//!   token; at each position where its top probability is under the gate,
//!   every member gives its probability of each alternative's text, the
//!   probabilities are averaged, and the likeliest text continues. Where
//!   the mixture keeps the drafter's token, the draft goes on to its next
//!   unsure position; where it picks another, the span ends there. Where
//!   the drafter is sure, its draft stands (merging at every token hurts
//!   long answers).
//!
//! With temperature 0 every draft is greedy and every choice is a
//! deterministic argmax (ties go to the earlier member), so the same
//! question gives the same answer.
//!
//! A member that fails or misses a round's deadline sits out the rest of
//! the answer (and the dispatcher opens its breaker, so it rejoins after a
//! health check); when one member is left it finishes the answer alone from
//! the text so far, nothing repeated or lost. JSON answers go through the
//! ensemble whole: every member writes the whole answer under the schema
//! (each daemon enforces it) and the method picks one whole answer
//! (`confident`: per byte under its own model; `cross` and `merge`: scored
//! by every member); nothing is mixed inside a JSON answer.
//!
//! A stop string is checked by each member within its own drafts, so one
//! that would straddle two rounds' spans is not caught.

pub mod combine;
mod run;
mod settings;

pub use combine::Weights;
pub use run::{Ensemble, Member, Stats};
pub use settings::{EnsembleSpec, MAX_MEMBERS, MemberProblem, MemberSpec, Method, SPAN_TOKENS, check_members};
