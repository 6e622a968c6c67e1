//! The slots a person has one of at a time (their name, their home), so
//! that a newer statement of one replaces the older.

/// What a person has one of at a time, so that a newer statement replaces an older one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// What they are called.
    Name,
    /// Where they live.
    Home,
}

/// The [`Slot`] a statement about the person fills, if any: their own
/// words ("I live in", "I moved to", "call me", "my name is", "Name:",
/// "Home:") or a fact about "the user" ("The user lives in", "The user's
/// name is"). Someone else's home or name ("my sister lives in") fills none.
pub fn slot_of(text: &str) -> Option<Slot> {
    let t = text.to_lowercase().replace('’', "'");
    let t = t.trim_start_matches("the user said: \"").trim_start_matches(['"', ' ']);
    let has = |phrases: &[&str]| phrases.iter().any(|p| t.starts_with(p) || t.contains(&format!(" {p}")) || t.contains(&format!(";{p}")));
    let home = has(&[
        "i live in",
        "i'm living in",
        "i am living in",
        "i moved to",
        "i've moved to",
        "i have moved to",
        "i'm based in",
        "i am based in",
        "we live in",
        "we moved to",
        "home:",
        "location:",
        "city:",
        "the user lives in",
        "the user moved to",
        "the user is based in",
    ]);
    let name = has(&["my name is", "my name's", "call me", "name:", "the user's name is", "the user is called", "the user is named"]);
    match (name, home) {
        (true, false) => Some(Slot::Name),
        (false, true) => Some(Slot::Home),
        _ => None,
    }
}
