//! How much the profile holds: the budget consolidation keeps it to, the
//! most facts it ever holds, and the longest fact.

/// Facts kept in the profile before they are consolidated: merged, with
/// duplicates dropped, so the static part of every prompt stays short.
pub const PROFILE_BUDGET: usize = 12;

/// The most facts the profile holds, whatever consolidation achieves (a
/// small model may merge nothing): past it, new facts are not stored.
pub const MAX_PROFILE_FACTS: usize = 4 * PROFILE_BUDGET;

/// The longest fact stored, in characters (the extraction's schema asks
/// for at most 120).
pub const MAX_FACT_CHARS: usize = 160;
