//! Facts learned from what the person said: the model's extraction and
//! the guards that keep of it only facts about the person, each resting
//! on their own words ([`profile_facts`], [`follows`], [`grounded`]).

use revis_client::{Runner, Tier};
use serde_json::json;

use super::limits::MAX_FACT_CHARS;
use super::said::{FIRST_PERSON, names_in, words};
use crate::structured;

/// The facts the user states about themselves in `said`, as the model
/// extracts them (`{"facts": [...]}`), before [`grounded`] sorts them.
pub async fn extract_facts<D: Runner>(daemon: &D, tier: Tier, said: &str) -> Result<serde_json::Value, structured::StructuredError> {
    let task = format!(
        "Extract facts the user states about themselves (name, home, work, likes, plans) from this message, \
         as short sentences in the third person. If there are none, give an empty list.\n\nMessage: {said}"
    );
    let schema = json!({
        "type": "object",
        "properties": {"facts": {"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 120}, "maxItems": 5}},
        "required": ["facts"],
        "additionalProperties": false
    });
    structured::run(daemon, tier, &task, &schema).await
}

/// A fact for the profile and the person's own words it rests on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Learned {
    /// The fact as the profile shows it and prompts carry it.
    pub text: String,
    /// The words of the person's message it rests on, exactly as written.
    pub said: String,
}

/// The facts of an extraction (`{"facts": [...]}`) that may go into the
/// profile, from a message's [`statements`](super::statements): about the user (they say "the
/// user", speak of them as he, she or they, begin with a name the user gave
/// themselves or someone of theirs, "I'm Ada", "my sister Ines", or keep
/// the user's own first person, then [`grounded`] in what they said); the
/// model's list numbering is dropped, and each is kept once. "Paris is the
/// capital of France", taken from "I live in Paris", is not about the user.
///
/// Nothing is invented, by construction: each fact keeps the sentence it
/// rests on (the one sharing most of its words), exactly as written. A fact
/// in the first person is shown as the person's words: the fact itself when
/// they wrote exactly that, else their whole sentence, never the model's
/// rewording ("I'm a high school principal" from "I teach chemistry at a
/// high school"). A fact in other words is kept only if it [`follows`] from
/// its sentence: every name, number and word of substance in it is there.
/// A statement no kept fact rests on is kept whole, as the person's words.
pub fn profile_facts(extracted: &serde_json::Value, statements: &[&str]) -> Vec<Learned> {
    let said = statements.join(" ");
    let names: Vec<String> = statements.iter().flat_map(|s| names_in(s)).collect();
    let mut out: Vec<Learned> = Vec::new();
    for fact in extracted["facts"].as_array().into_iter().flatten().filter_map(|f| f.as_str()) {
        let fact = fact.trim().trim_start_matches(|c: char| c.is_ascii_digit() || matches!(c, '.' | ')' | '-' | '*' | ' ')).trim();
        let w = words(fact);
        let third = w
            .iter()
            .any(|w| matches!(w.as_str(), "user" | "user's" | "users" | "he" | "she" | "they" | "his" | "her" | "their" | "them" | "him"))
            || w.first().is_some_and(|first| names.contains(first));
        // A name alone ("Ottoline") says nothing by itself: the sentence it came from is kept, as the person's words.
        if w.iter().all(|w| names.contains(w)) {
            if let Some(source) = resting_on(fact, statements).filter(|_| !w.is_empty()) {
                let text = format!("The user said: \"{source}\"");
                if !out.iter().any(|k| k.text.eq_ignore_ascii_case(&text)) {
                    out.push(Learned { text, said: source.to_owned() });
                }
            }
            continue;
        }
        let first = w.iter().any(|w| FIRST_PERSON.contains(&w.as_str()));
        // A fact in other words must follow from its sentence (below); one
        // in the first person must share most of its words with what was said.
        let read_further = third || (first && grounded(fact, &said));
        if !read_further {
            continue;
        }
        let Some(source) = resting_on(fact, statements) else { continue };
        let learned = if third {
            if !follows(fact, source) {
                continue;
            }
            Learned { text: fact.to_owned(), said: source.to_owned() }
        } else {
            let quoted = verbatim(fact, statements).unwrap_or(source);
            Learned { text: format!("The user said: \"{quoted}\""), said: quoted.to_owned() }
        };
        if !out.iter().any(|k| k.text.eq_ignore_ascii_case(&learned.text)) {
            out.push(learned);
        }
    }
    // What the model left out: a statement no fact rests on is kept as the
    // person's own words (a small model often extracts nothing, or one fact
    // of several, and a sentence about oneself is a fact about oneself).
    for st in statements {
        let covered = out.iter().any(|l| st.contains(l.said.as_str()) || l.said.contains(st));
        let text = format!("The user said: \"{st}\"");
        if !covered && text.chars().count() <= MAX_FACT_CHARS {
            out.push(Learned { text, said: (*st).to_owned() });
        }
    }
    out
}

/// The first four letters of each word of four letters or more, lower-cased
/// (so "lives" meets "live", "teaches" meets "teach").
fn stems(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 4)
        .map(|w| w.to_lowercase().chars().take(4).collect())
        .collect()
}

/// The statement `fact` shares most of its words with (the first on a tie), if any.
pub(super) fn resting_on<'a>(fact: &str, statements: &[&'a str]) -> Option<&'a str> {
    let fact = stems(fact);
    let shared = |s: &str| {
        let s = s.to_lowercase();
        fact.iter().filter(|w| s.contains(w.as_str())).count()
    };
    let (best, n) = statements.iter().map(|s| (*s, shared(s))).fold((None, 0), |b, (s, n)| if n > b.1 { (Some(s), n) } else { b });
    best.filter(|_| n > 0)
}

/// `fact` (without its closing punctuation) where a statement holds it
/// exactly: that part of the statement.
fn verbatim<'a>(fact: &str, statements: &[&'a str]) -> Option<&'a str> {
    let fact = fact.trim_end_matches(['.', '!', ';', ',', ' ']);
    if fact.is_empty() {
        return None;
    }
    statements.iter().find_map(|s| s.find(fact).map(|at| &s[at..at + fact.len()]))
}

/// Words a fact in other words may use that its sentence need not hold:
/// how facts about a person are put ("The user's name is…", "lives in…").
const PHRASING: &[&str] = &[
    "user",
    "user's",
    "users",
    "name",
    "named",
    "called",
    "lives",
    "living",
    "works",
    "working",
    "likes",
    "loves",
    "enjoys",
    "years",
    "their",
    "them",
    "they",
    "have",
    "been",
    "with",
    "from",
    "that",
    "this",
    "currently",
    "also",
    "there",
    "person",
    "whose",
    "which",
    "where",
    "when",
    "owns",
    "some",
    "about",
    "being",
    "does",
    "used",
    "wants",
    "would",
    "into",
];

/// Whether a fact in other words follows from `sentence`: every number in
/// it, every capitalised word but its first (a name, a place), and every
/// other word of four letters or more, but [`PHRASING`], is in the sentence
/// (words by their first four letters).
pub fn follows(fact: &str, sentence: &str) -> bool {
    let lower = sentence.to_lowercase();
    let numbers_there = fact.split(|c: char| !c.is_ascii_digit()).filter(|n| !n.is_empty()).all(|n| sentence.contains(n));
    let tokens: Vec<&str> = fact.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '’')).filter(|w| !w.is_empty()).collect();
    let words_there = tokens.iter().enumerate().all(|(i, w)| {
        let plain = w.to_lowercase().replace('’', "'");
        let name = i > 0 && w.chars().next().is_some_and(char::is_uppercase) && *w != "I";
        if name {
            return lower.contains(plain.trim_end_matches("'s"));
        }
        if plain.chars().count() < 4 || PHRASING.contains(&plain.as_str()) || plain.chars().all(|c| c.is_ascii_digit()) {
            return true;
        }
        lower.contains(&plain.chars().take(4).collect::<String>())
    });
    numbers_there && words_there
}

/// A cheap guard against invented facts (small models make them up): most
/// of a fact's longer words must appear, by their first four letters (so
/// "lives" matches "live"), in what the user said. "User", the subject the
/// extraction asks for ("The user's name is Ada"), is not one of them.
pub fn grounded(fact: &str, said: &str) -> bool {
    let said = said.to_lowercase();
    let words: Vec<String> = fact
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 4)
        .map(str::to_lowercase)
        .filter(|w| !matches!(w.as_str(), "user" | "users"))
        .collect();
    if words.is_empty() {
        return false;
    }
    let found = words.iter().filter(|w| said.contains(&w.chars().take(4).collect::<String>())).count();
    found * 5 >= words.len() * 3
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::conversation::memory::said::statements;

    #[test]
    fn only_grounded_facts_about_the_user_are_kept() {
        let texts =
            |v: &serde_json::Value, message: &str| profile_facts(v, &statements(message)).into_iter().map(|l| l.text).collect::<Vec<_>>();
        let own = json!({"facts": ["1. I'm 71 and took up painting.", "2. I'm 71 and took up painting.", "I am a famous astronaut."]});
        assert_eq!(
            profile_facts(&own, &statements("I'm 71 and just took up watercolour painting.")),
            vec![Learned {
                text: "The user said: \"I'm 71 and just took up watercolour painting.\"".into(),
                said: "I'm 71 and just took up watercolour painting.".into()
            }],
            "the model's rewording is not shown as the person's words: their sentence is"
        );
        let said = "My sister Ines lives in Porto and I teach maths.";
        let v = json!({"facts": [
            "The user's sister Ines lives in Porto.",
            "The user teaches maths.",
            "Porto is a city in Portugal.",
            "The user is a famous astronaut.",
        ]});
        assert_eq!(texts(&v, said), vec!["The user's sister Ines lives in Porto.", "The user teaches maths."]);
        let named = json!({"facts": ["Ada lives in London.", "2. Ines is a nurse.", "3. Ines is a nurse.", "London is in England."]});
        assert_eq!(
            texts(&named, "I'm Ada and I live in London; my sister Ines is a nurse."),
            vec!["Ada lives in London.", "Ines is a nurse."]
        );
        assert_eq!(
            texts(&json!({"facts": ["Ottoline", "Aiko,"]}), "Hi! I'm Ottoline, by the way."),
            vec!["The user said: \"I'm Ottoline, by the way.\""],
            "a name alone is not a fact: the sentence it came from is kept"
        );
        assert_eq!(
            texts(&json!({"facts": ["Ottoline", "The user likes running."]}), "I'm Ottoline and I like running."),
            vec!["The user said: \"I'm Ottoline and I like running.\"", "The user likes running."],
            "the name is kept, in the person's sentence, beside another fact from it"
        );
        assert_eq!(
            texts(&json!({}), said),
            vec![format!("The user said: \"{said}\"")],
            "nothing extracted: the statement is kept as the person's words"
        );
    }

    /// The invented quotations and details: none is stored as said.
    #[test]
    fn quotations_are_the_persons_words_and_details_are_not_added() {
        let message = "I moved to Vancouver last year; I teach chemistry at a high school. Call me Priya.";
        let v = json!({"facts": ["I'm a high school principal.", "The user teaches chemistry at a high school in Vancouver.", "The user's name is Priya."]});
        let got = profile_facts(&v, &statements(message));
        let quoted: Vec<&str> = got.iter().filter_map(|l| l.text.strip_prefix("The user said: \"")).collect();
        assert!(quoted.iter().all(|q| message.contains(q.trim_end_matches('"'))), "{got:?}");
        assert!(got.iter().any(|l| l.text == "The user's name is Priya." && l.said == "Call me Priya."), "{got:?}");
        let guard = "I work nights as a security guard in Chicago.";
        let v = json!({"facts": ["The user is a security guard at a high-end hotel in Chicago.", "The user works nights as a security guard in Chicago."]});
        let got = profile_facts(&v, &statements(guard));
        assert_eq!(got.iter().map(|l| l.text.as_str()).collect::<Vec<_>>(), vec!["The user works nights as a security guard in Chicago."]);
        assert!(!follows("The user is 34.", "I'm 43 and I live in Oslo."), "a number not said");
        assert!(!follows("The user's daughter Maren is a pilot.", "My sister is Maren and my cat is Tom."), "words not said");
        assert!(follows("The user's sister is Maren.", "My sister is Maren and my cat is Tom."));
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// For any message and any extraction (a model says anything),
        /// every fact rests on words the person wrote, exactly, and every
        /// fact shown as their words is exactly those words.
        #[test]
        fn every_stored_quotation_is_the_persons_own_words(
            message in proptest::collection::vec(
                proptest::sample::select(vec!["I", "I'm", "my", "we", "live", "in", "Lyon", "Ada", "teach", "call", "me", "sister", "is", "a", "nurse", "34", "and", ".", ";", "!", "?", "\n", "What", "the", "user"]),
                0..30,
            ).prop_map(|w| w.join(" ")),
            facts in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::sample::select(vec!["I", "I'm", "my", "The", "user", "user's", "she", "lives", "live", "in", "Lyon", "Ada", "teaches", "nurse", "34", "43", "sister", "Paris", "."]),
                    0..12,
                ).prop_map(|w| w.join(" ")),
                0..6,
            ),
        ) {
            let said = statements(&message);
            for l in profile_facts(&json!({"facts": facts}), &said) {
                proptest::prop_assert!(message.contains(&l.said), "{l:?} rests on words not in {message:?}");
                if let Some(q) = l.text.strip_prefix("The user said: \"") {
                    proptest::prop_assert_eq!(q.strip_suffix('"'), Some(l.said.as_str()));
                }
            }
        }
    }
}
