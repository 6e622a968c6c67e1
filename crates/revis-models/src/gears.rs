//! How a chat turn treats a model: which rules open its system message and
//! whether tier1's quick check runs, decided per model by measurement
//! (`revis-bench turn`, docs/QUALITY.md), so that revis never makes a model
//! answer worse than it does bare. Models nobody measured get revis's
//! defaults ([`ChatGears::UNMEASURED`]).

use crate::catalog::{find, find_file};

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

/// The gears of the model a tier runs, by its name (a catalog name) or,
/// failing that, its file's name (a path to a catalog file).
pub fn chat_gears(name: &str, path: &str) -> ChatGears {
    let file = std::path::Path::new(path).file_name().and_then(|f| f.to_str()).unwrap_or_default();
    find(name).or_else(|| find_file(file)).map_or(ChatGears::UNMEASURED, |e| e.chat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_catalog_model_is_known_by_name_or_by_file_and_anything_else_is_unmeasured() {
        let smol = find("smollm2-135m-instruct").unwrap();
        assert!(smol.chat.measured);
        assert_eq!(chat_gears("smollm2-135m-instruct", ""), smol.chat);
        assert_eq!(chat_gears("/some/where/my-copy", "/models/SmolLM2-135M-Instruct.Q4_1.gguf"), smol.chat);
        assert_eq!(chat_gears("/models/mine.gguf", "/models/mine.gguf"), ChatGears::UNMEASURED);
    }
}
