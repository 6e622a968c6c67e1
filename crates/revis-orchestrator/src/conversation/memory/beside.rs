//! What is put beside a question about the person: the profile facts it
//! asks about, in the person's voice, next to the question the model gets.

use super::limits::PROFILE_BUDGET;
use super::said::{FIRST_PERSON, gives_own_name, words};
use super::slot::{Slot, slot_of};

/// Words a question about the person uses that say nothing of what it asks.
const ASKING: &[&str] = &[
    "the",
    "and",
    "you",
    "your",
    "what",
    "what's",
    "whats",
    "which",
    "who",
    "where",
    "when",
    "how",
    "did",
    "does",
    "do",
    "was",
    "were",
    "are",
    "is",
    "am",
    "have",
    "has",
    "had",
    "that",
    "this",
    "with",
    "for",
    "from",
    "again",
    "remember",
    "say",
    "said",
    "tell",
    "told",
    "know",
    "can",
    "could",
    "would",
    "please",
    "about",
    "user",
    "mention",
    "mentioned",
    "remind",
];

/// The profile facts `message` asks about, best first, at most three: when
/// the person asks about themselves ("my", "me", "did I"...), the facts
/// that share a word with the question (not a first-person or asking word;
/// compared by [`stem`], so "my dog's name" finds "our dog"), and the fact
/// that fills the slot it asks for ("my name", "where do I live"; not "my
/// dog's name" or "where does my brother live"). A message about anything
/// else gets none; so does a question about them that no fact shares a
/// word with (see [`none_found`] for what [`Beside::Before`] gives it).
pub fn asked_about<'a>(profile: &'a [String], message: &str) -> Vec<&'a str> {
    let asked = words(message);
    if !about_self(&asked) || profile.is_empty() {
        return Vec::new();
    }
    let slot = slot_asked(&asked);
    let content: Vec<&str> = asked
        .iter()
        .filter(|w| w.chars().count() >= 3 && !ASKING.contains(&w.as_str()) && !FIRST_PERSON.contains(&w.as_str()))
        .map(|w| stem(w))
        .collect();
    let mut scored: Vec<(usize, usize, &str)> = profile
        .iter()
        .enumerate()
        .filter_map(|(i, fact)| {
            let fw = words(fact);
            let shared = content.iter().filter(|w| fw.iter().any(|f| stem(f) == **w)).count();
            let fills = usize::from(slot.is_some() && (slot_of(fact) == slot || (slot == Some(Slot::Name) && introduces_them(fact)))) * 2;
            (shared + fills > 0).then_some((shared + fills, i, fact.as_str()))
        })
        .collect();
    // Most shared first; among equals the newer (later in the profile).
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    scored.into_iter().take(3).map(|(_, _, f)| f).collect()
}

/// What goes beside a question the person asks about themselves when
/// [`asked_about`] finds no fact ("What do I do for work?" against "I run a
/// small bakery"): the newest facts, as many as a profile is kept to
/// ([`PROFILE_BUDGET`]), oldest first, so the model can answer from what it
/// was told rather than from nothing nearer than the system message. A
/// message not about them, or one a fact was found for: none.
pub fn none_found<'a>(profile: &'a [String], message: &str) -> Vec<&'a str> {
    if !message.trim_end().ends_with('?') || !about_self(&words(message)) || !asked_about(profile, message).is_empty() {
        return Vec::new();
    }
    profile[profile.len().saturating_sub(PROFILE_BUDGET)..].iter().map(String::as_str).collect()
}

/// Whether a message's words ask about the person: "my", "me", "did I",
/// "am I", "where do I"; "how do I" is a how-to question, not about them.
fn about_self(asked: &[String]) -> bool {
    asked.iter().any(|w| matches!(w.as_str(), "my" | "me" | "mine" | "myself"))
        || asked.windows(2).any(|p| p[1] == "i" && matches!(p[0].as_str(), "did" | "am" | "was" | "have" | "had"))
        || asked.windows(3).any(|p| p[2] == "i" && p[1] == "do" && matches!(p[0].as_str(), "where" | "what" | "who"))
}

/// The slot a question about the person asks for: their own name ("my
/// name", "am I called", "call me") or their own home ("I live", "we
/// moved", "my city"). Someone else's ("my dog's name", "where does my
/// brother live") and anything else: none.
fn slot_asked(asked: &[String]) -> Option<Slot> {
    let pair = |a: &[&str], b: &[&str]| asked.windows(2).any(|p| a.contains(&p[0].as_str()) && b.contains(&p[1].as_str()));
    if pair(&["my"], &["name", "name's"]) || pair(&["i"], &["called", "named"]) || pair(&["call"], &["me"]) {
        Some(Slot::Name)
    } else if pair(&["i", "we", "i'm", "we're"], &["live", "living", "moved", "based"])
        || pair(&["my", "our"], &["home", "city", "town", "country", "address"])
    {
        Some(Slot::Home)
    } else {
        None
    }
}

/// A word as compared with the facts' words: without a possessive ("dog's",
/// "parents'") or a plain ending ("-ing", "-ed", "-s") where at least three
/// letters stay, so "learning" meets "learn" and "sons" meets "son".
fn stem(word: &str) -> &str {
    let word = word.strip_suffix("'s").or_else(|| word.strip_suffix("s'")).unwrap_or(word);
    ["ing", "ed", "s"].iter().find_map(|end| word.strip_suffix(end).filter(|rest| rest.chars().count() >= 3)).unwrap_or(word)
}

/// Whether `fact` is the person giving their own name in a form that fills
/// no slot ("Hi! I'm Ottoline, by the way."): found by a question about
/// their name, though it does not replace an older name (a capitalised
/// word after "I'm" is not always one: "I'm Italian").
fn introduces_them(fact: &str) -> bool {
    gives_own_name(fact.strip_prefix("The user said: ").unwrap_or(fact).trim_start_matches('"'))
}

/// Where the profile facts a question asks about go in the prompt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Beside {
    /// In the system message only, with the rest of the profile.
    Off,
    /// Before the question, as a reading passage comes before its
    /// question (SmolLM2 answered from it more often than from the facts
    /// after the question in five of six comparisons, docs/QUALITY.md),
    /// and when no fact is found, the newest ([`none_found`]: measured
    /// against only the facts found, docs/QUALITY.md).
    #[default]
    Before,
}

/// `message` as the model gets it: with the profile facts it asks about
/// before it ([`asked_about`]; when none is found, [`none_found`]) when
/// `form` is [`Beside::Before`], in the person's voice: a
/// small model answers from what is next to the question far more often
/// than from the system message (docs/QUALITY.md). What is stored and shown
/// stays `message`.
pub fn with_what_was_said(profile: &[String], message: &str, form: Beside) -> String {
    if form == Beside::Off {
        return message.to_owned();
    }
    let mut facts = asked_about(profile, message);
    if facts.is_empty() {
        facts = none_found(profile, message);
    }
    if facts.is_empty() {
        return message.to_owned();
    }
    let told: Vec<String> = facts
        .iter()
        .map(|f| match f.strip_prefix("The user said: ") {
            Some(quoted) => quoted.to_owned(),
            None => (*f).to_owned(),
        })
        .collect();
    let told = format!("(What I told you before: {})", told.join(" "));
    format!("{told}\n\n{message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_meet_without_possessives_and_plain_endings() {
        for (a, b) in [("dog's", "dog"), ("sons", "son"), ("learning", "learn"), ("parents'", "parent"), ("lives", "live")] {
            assert_eq!(stem(a), stem(b), "{a} {b}");
        }
        // Short words keep their ending.
        assert_eq!(stem("has"), "has");
        assert_eq!(stem("bus"), "bus");
    }

    #[test]
    fn a_question_about_them_that_finds_no_fact_gets_the_newest_before_it() {
        let profile: Vec<String> = (0..PROFILE_BUDGET + 2).map(|i| format!("The user said: \"Fact {i}.\"")).collect();
        let asked = "What do I do for work?";
        assert!(asked_about(&profile, asked).is_empty());
        let newest: Vec<&str> = profile[2..].iter().map(String::as_str).collect();
        assert_eq!(none_found(&profile, asked), newest);
        let sent = with_what_was_said(&profile, asked, Beside::Before);
        assert!(sent.starts_with("(What I told you before: \"Fact 2.\" \"Fact 3.\""), "{sent}");
        assert!(sent.ends_with(&format!("\"Fact {}.\")\n\n{asked}", PROFILE_BUDGET + 1)), "{sent}");
        // With the facts in the system message only, the question is as it was.
        assert_eq!(with_what_was_said(&profile, asked, Beside::Off), asked);
        // Not a question, not about them, or a fact found: nothing more.
        for m in ["Tell me a joke.", "What is the capital of Peru?", "How do I keep a cut avocado from going brown?"] {
            assert!(none_found(&profile, m).is_empty(), "{m}");
            assert_eq!(with_what_was_said(&profile, m, Beside::Before), m);
        }
        assert!(none_found(&profile, "What was fact 3 again, did I say?").is_empty());
        assert!(none_found(&[], asked).is_empty());
    }

    #[test]
    fn a_question_about_the_person_gets_the_facts_it_asks_about_beside_it() {
        let profile: Vec<String> = [
            "The user said: \"Hi! I'm Ottoline, by the way.\"",
            "The user said: \"We just adopted a rescue greyhound called Pickle.\"",
            "The user lives in Pune.",
            "The user said: \"I'm allergic to sesame.\"",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(asked_about(&profile, "What's my dog called again?"), vec![profile[1].as_str()]);
        assert_eq!(asked_about(&profile, "What am I allergic to?"), vec![profile[3].as_str()]);
        assert_eq!(asked_about(&profile, "Which city did I say I live in?"), vec![profile[2].as_str()]);
        // A possessive or a plain ending still meets the fact's word.
        assert_eq!(asked_about(&profile, "What's my greyhound's name?"), vec![profile[1].as_str()]);
        // Someone else's home is not the person's slot: the brother's comes first, by the words it shares.
        let family = [profile.clone(), vec!["The user said: \"My brother Emre lives in Ankara.\"".into()]].concat();
        assert_eq!(asked_about(&family, "Where does my brother live?"), vec![family[4].as_str(), family[2].as_str()]);
        // "Hi! I'm Ottoline" fills no slot and shares no word, but gives their name: a name question finds it.
        assert_eq!(asked_about(&profile, "Do you remember my name?"), vec![profile[0].as_str()]);
        // A name said in the slot's form is found too, the newer first.
        let named = [profile.clone(), vec!["The user said: \"My name is Ottoline.\"".into()]].concat();
        assert_eq!(asked_about(&named, "Do you remember my name?"), vec![named[4].as_str(), named[0].as_str()]);
        // Not about the person, or nothing shared: nothing added, the message unchanged.
        for m in ["What is the capital of Peru?", "How do I keep a cut avocado from going brown?", "Tell me a joke."] {
            assert!(asked_about(&profile, m).is_empty(), "{m}");
            for form in [Beside::Off, Beside::Before] {
                assert_eq!(with_what_was_said(&profile, m, form), m);
            }
        }
        assert_eq!(
            with_what_was_said(&profile, "What's my dog called again?", Beside::Before),
            "(What I told you before: \"We just adopted a rescue greyhound called Pickle.\")\n\nWhat's my dog called again?"
        );
        assert_eq!(
            with_what_was_said(&profile, "Where do I live?", Beside::Before),
            "(What I told you before: The user lives in Pune.)\n\nWhere do I live?"
        );
        assert_eq!(with_what_was_said(&profile, "Where do I live?", Beside::Off), "Where do I live?");
    }
}
