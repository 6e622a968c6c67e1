//! How a chat turn treats a model: which rules open its system message and
//! whether tier1's quick check runs, decided per model by measurement
//! (`revis-bench turn`, docs/QUALITY.md), so that revis never makes a model
//! answer worse than it does bare. Models nobody measured get revis's
//! defaults ([`ChatGears::UNMEASURED`]).

/// What opens the system message of a chat answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rules {
    /// revis's house rules (the orchestrator's `RULES`).
    House,
    /// The model's own default system prompt (the one its chat template adds when none is given).
    Own(&'static str),
    /// No rules: the system message holds only the profile and the summary,
    /// and there is none while both are empty.
    Nothing,
}

/// The gears of a chat turn for one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChatGears {
    pub rules: Rules,
    /// tier1's quick check of each message (typo corrections, "needs the
    /// deep tier" hints) runs and is shown: only for models whose hints were
    /// measured precise enough (false escalation on plain questions at most
    /// 10%).
    pub quick_check: bool,
    /// The profile (facts the user stated about themselves) is learned and
    /// goes into every prompt: off for a model measured to answer worse with it.
    pub profile: bool,
    /// Whether these were measured for this model (false: revis's defaults).
    pub measured: bool,
}

impl ChatGears {
    /// A model nobody measured: the house rules and the quick check.
    pub const UNMEASURED: ChatGears = ChatGears { rules: Rules::House, quick_check: true, profile: true, measured: false };
}
