//! The slots a person has one of at a time (their name, their home, their
//! work, their age), so that a newer statement of one replaces the older,
//! and a question about one finds it.

/// What a person has one of at a time, so that a newer statement replaces an older one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// What they are called.
    Name,
    /// Where they live.
    Home,
    /// What they do for a living.
    Work,
    /// How old they are.
    Age,
}

/// The [`Slot`] a statement about the person fills, if any: their own
/// words ("I live in", "I moved to", "call me", "my name is", "Hi, I'm
/// Ottoline", "Elif here", "Name:", "Home:", "I work as", "Job:", "I'm 34")
/// or a fact about "the user" ("The user lives in", "The user's name is").
/// Someone else's ("my sister lives in", "my son is 4") fills none; a
/// statement that would fill two is left alone.
pub fn slot_of(text: &str) -> Option<Slot> {
    let original = text.trim_start_matches("The user said: \"").trim_start_matches(['"', ' ']);
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
    let name = has(&["my name is", "my name's", "call me", "name:", "the user's name is", "the user is called", "the user is named"])
        || introduces_a_name(original);
    let work = has(&[
        "i work as",
        "i'm working as",
        "i am working as",
        "i work nights as",
        "i'm employed as",
        "i am employed as",
        "my job is",
        "my job's",
        "by profession",
        "by trade",
        "job:",
        "occupation:",
        "profession:",
        "the user works as",
        "the user's job is",
    ]);
    let age = gives_an_age(t);
    match (name, home, work, age) {
        (true, false, false, false) => Some(Slot::Name),
        (false, true, false, false) => Some(Slot::Home),
        (false, false, true, false) => Some(Slot::Work),
        (false, false, false, true) => Some(Slot::Age),
        _ => None,
    }
}

/// Capitalised words after "I'm" that are not names: where people are
/// from, what they believe or eat, how they are.
const NOT_NAMES: &[&str] = &[
    "american",
    "african",
    "asian",
    "european",
    "canadian",
    "mexican",
    "brazilian",
    "argentinian",
    "german",
    "italian",
    "indian",
    "korean",
    "russian",
    "australian",
    "austrian",
    "belgian",
    "nigerian",
    "egyptian",
    "iranian",
    "persian",
    "norwegian",
    "swedish",
    "danish",
    "finnish",
    "polish",
    "irish",
    "scottish",
    "welsh",
    "english",
    "british",
    "french",
    "dutch",
    "greek",
    "thai",
    "swiss",
    "turkish",
    "spanish",
    "christian",
    "catholic",
    "muslim",
    "jewish",
    "hindu",
    "buddhist",
    "atheist",
    "vegan",
    "vegetarian",
    "gay",
    "married",
    "single",
    "sorry",
    "fine",
    "good",
    "great",
    "ok",
    "okay",
    "back",
    "here",
    "new",
    "not",
    "so",
    "just",
    "also",
    "still",
    "really",
    "very",
    "currently",
    "now",
    "always",
    "never",
    "from",
    "in",
    "at",
    "on",
    "a",
    "an",
    "the",
    "your",
    "retired",
    "pregnant",
];

/// "I'm Ottoline", "Hi, I am Jules.", "I'm Radhika and I teach yoga",
/// "Elif here, a violinist": a capitalised word the person calls
/// themselves, ending the clause.
fn introduces_a_name(text: &str) -> bool {
    let word_end = |s: &str| s.find(|c: char| !(c.is_alphabetic() || c == '\'' || c == '-')).unwrap_or(s.len());
    let is_name = |w: &str| {
        let lower = w.to_lowercase();
        w.chars().next().is_some_and(char::is_uppercase)
            && w.chars().count() >= 2
            && !NOT_NAMES.contains(&lower.as_str())
            && !lower.ends_with("ese")
            && !lower.ends_with("ish")
    };
    let ends_clause = |rest: &str| {
        let r = rest.trim_start();
        r.is_empty()
            || r.starts_with([',', '.', '!', ';', ')'])
            || ["by the way", "here", "and ", "btw"].iter().any(|p| r.to_lowercase().starts_with(p))
    };
    for lead in ["I'm ", "I’m ", "I am ", "Im "] {
        for (at, _) in text.match_indices(lead) {
            let before = text[..at].trim_end();
            // The start of a sentence or a clause ("Hi! I'm", "Hello, I am", "and I'm").
            let opens =
                before.is_empty() || before.ends_with(['.', '!', '?', ',', ';', ':', '-']) || before.to_lowercase().ends_with(" and");
            let rest = &text[at + lead.len()..];
            let w = &rest[..word_end(rest)];
            if opens && is_name(w) && ends_clause(&rest[w.len()..]) {
                return true;
            }
        }
    }
    // "Elif here, a violinist from Istanbul."
    let first = &text[..word_end(text)];
    is_name(first)
        && text[first.len()..].trim_start().to_lowercase().starts_with("here")
        && ends_clause(&text[first.len()..].trim_start()["here".len()..])
}

/// "I'm 34", "I am 34 years old", "I just turned 40", "Age: 29".
fn gives_an_age(lower: &str) -> bool {
    let number_then = |rest: &str| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let after = rest[digits.len()..].trim_start();
        !digits.is_empty()
            && digits.parse::<u32>().is_ok_and(|n| (1..=120).contains(&n))
            && (after.is_empty() || after.starts_with([',', '.', '!', ';']) || after.starts_with("years") || after.starts_with("and "))
    };
    ["i'm ", "i am ", "i just turned ", "i turned ", "age: ", "age ", "the user is "].iter().any(|lead| {
        lower
            .match_indices(lead)
            .any(|(at, _)| (at == 0 || !lower[..at].ends_with(char::is_alphabetic)) && number_then(&lower[at + lead.len()..]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_read_in_the_forms_people_introduce_themselves() {
        for said in [
            "Hi! I'm Ottoline, by the way.",
            "I'm Radhika and I teach yoga in Pune.",
            "Hello, I am Jules.",
            "Elif here, a violinist from Istanbul.",
            "I'm Min-jun.",
        ] {
            assert_eq!(slot_of(said), Some(Slot::Name), "{said}");
        }
        for not in [
            "I'm Italian.",
            "I'm Japanese, living abroad.",
            "I'm British and proud.",
            "I'm going to Lyon.",
            "My sister is Maren.",
            "I'm a nurse.",
            "Lyon is here.",
        ] {
            assert_ne!(slot_of(not), Some(Slot::Name), "{not}");
        }
    }

    #[test]
    fn work_and_age_are_slots_and_someone_elses_are_not() {
        assert_eq!(slot_of("I work as a nurse in Leeds."), Some(Slot::Work));
        assert_eq!(slot_of("Job: electrician."), Some(Slot::Work));
        assert_eq!(slot_of("The user said: \"I'm a chef by trade.\""), Some(Slot::Work));
        assert_eq!(slot_of("I'm 34 and I love hiking."), Some(Slot::Age));
        assert_eq!(slot_of("I just turned 40!"), Some(Slot::Age));
        assert_eq!(slot_of("My son is 4."), None);
        assert_eq!(slot_of("I'm 5 minutes late."), None);
        assert_eq!(slot_of("My wife works as a nurse."), None, "someone else's work");
        assert_eq!(slot_of("I work as a nurse and I live in Leeds."), None, "two slots at once: left alone");
    }
}
