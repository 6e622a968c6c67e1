//! What the person said about themselves: the sentences of a message that
//! are statements in the first person (or introduce them), the words they
//! are made of, and the names the person gives. Nothing else of a message
//! reaches the profile.

/// The words of the first person ("I", "my", "we"...), lower-cased.
pub(super) const FIRST_PERSON: &[&str] =
    &["i", "i'm", "im", "i've", "i'd", "i'll", "me", "my", "mine", "myself", "we", "we're", "we've", "we'll", "us", "our", "ours"];

/// The words of `text`, lower-cased, apostrophes kept (typographic ones made plain).
pub(super) fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '’'))
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase().replace('’', "'"))
        .collect()
}

/// The sentences of `message` that say something about the user, joined,
/// or None: those in the first person ("I", "my", "we"...) that are
/// statements, not questions ("What should I cook?"), requests ("Help me
/// with my essay") or hypotheticals ("If I were a cat..."). Facts about the
/// world, questions and the assistant's words never reach the profile.
pub fn about_user(message: &str) -> Option<String> {
    let kept = statements(message);
    (!kept.is_empty()).then(|| kept.join(" "))
}

/// The sentences [`about_user`] keeps, each exactly as the person wrote it
/// (a part of `message`, trimmed).
pub fn statements(message: &str) -> Vec<&str> {
    const NOT_A_STATEMENT: &[&str] = &[
        "if",
        "suppose",
        "imagine",
        "what",
        "please",
        "can",
        "could",
        "would",
        "will",
        "should",
        "help",
        "tell",
        "give",
        "show",
        "explain",
        "write",
        "make",
        "suggest",
        "recommend",
        "translate",
        "summarise",
        "summarize",
        "list",
        "describe",
        "find",
        "let",
    ];
    let mut kept = Vec::new();
    let mut start = 0;
    for (i, c) in message.char_indices() {
        if matches!(c, '.' | '!' | '?' | '\n') || i + c.len_utf8() == message.len() {
            let end = i + c.len_utf8();
            let sentence = message[start..end].trim();
            start = end;
            let words = words(sentence);
            let question = sentence.ends_with('?');
            let opener = words.first().is_some_and(|w| NOT_A_STATEMENT.contains(&w.as_str()));
            if !question && !opener && (words.iter().any(|w| FIRST_PERSON.contains(&w.as_str())) || introduces(sentence)) {
                kept.push(sentence);
            }
        }
    }
    kept
}

/// Labels of the forms people fill in about themselves ("Name: Yusuf.").
const SELF_LABELS: &[&str] = &["name", "job", "work", "occupation", "home", "from", "location", "city", "age", "pronouns", "hobbies"];

/// A sentence that introduces the person without "I" or "my": a name and
/// "here" ("Elif here, a violinist from Istanbul."), or a form's label
/// ("Name: Yusuf.", "Job: electrician.").
fn introduces(sentence: &str) -> bool {
    let mut parts = without_greeting(sentence).split_whitespace();
    let (first, second, third) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next());
    // "here" closes its phrase: "Elif here, …", "Elif here." ("Tokyo here we come" is not one).
    let closed = second.ends_with([',', '.', '!', ';', '-']) || third.is_none() || third == Some("-");
    let here = first.chars().next().is_some_and(char::is_uppercase)
        && first.chars().all(char::is_alphabetic)
        && closed
        && second.trim_end_matches([',', '.', '!', ';', '-']).eq_ignore_ascii_case("here");
    let label = sentence
        .split_once(':')
        .is_some_and(|(label, rest)| !rest.trim().is_empty() && SELF_LABELS.contains(&label.trim().to_lowercase().as_str()));
    here || label
}

/// Words people open a message with before they say who they are ("Hey,
/// Tomasz here.").
const GREETINGS: &[&str] = &["hi", "hey", "hello", "hiya", "howdy", "greetings", "morning", "evening", "afternoon"];

/// `sentence` without an opening greeting closed by a comma or "!" ("Hey,
/// Tomasz here." reads as "Tomasz here.").
fn without_greeting(sentence: &str) -> &str {
    let trimmed = sentence.trim_start();
    trimmed
        .split_once([',', '!'])
        .filter(|(first, _)| GREETINGS.contains(&first.trim().to_lowercase().as_str()))
        .map_or(trimmed, |(_, rest)| rest.trim_start())
}

/// The names the user gives in a sentence, lower-cased: a capitalised word
/// after "I'm", "I am", "name is", "name:", "call me", "called" or "named",
/// after "my" or "our" and one more word ("my sister Ines"), or first and
/// followed by "here" ("Elif here, …").
pub(super) fn names_in(said: &str) -> Vec<String> {
    named(said).into_iter().map(|(name, _)| name).collect()
}

/// Whether the person gives their own name in `said`: "I'm Ottoline",
/// "I am Ada", "my name is Ines", "my name's Jo", "call me Jules", "Name:
/// Yusuf", "Elif here". A name given to someone of theirs ("my sister
/// Ines", "a dog called Pickle", "my son's name is Bo") is not their own.
pub(super) fn gives_own_name(said: &str) -> bool {
    named(said).iter().any(|(_, own)| *own)
}

/// Each name [`names_in`] reads, lower-cased, and whether it is the
/// person's own.
fn named(said: &str) -> Vec<(String, bool)> {
    let words: Vec<&str> = said.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '’')).filter(|w| !w.is_empty()).collect();
    let lower: Vec<String> = words.iter().map(|w| w.to_lowercase().replace('’', "'")).collect();
    let mut names = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if !w.chars().next().is_some_and(char::is_uppercase) || *w == "I" {
            continue;
        }
        let before = |k: usize| i.checked_sub(k).map(|j| lower[j].as_str());
        let after = |k: usize| lower.get(i + k).map(String::as_str);
        // "my name is", "name is" opening the sentence, "Name:", "my name's".
        let own_label = matches!(before(3), None | Some("my"));
        let own = matches!(before(1), Some("i'm" | "im"))
            || (after(1) == Some("here") && (i == 0 || (i == 1 && GREETINGS.contains(&lower[0].as_str()))))
            || matches!((before(2), before(1)), (Some("i"), Some("am")) | (Some("call"), Some("me")))
            || (matches!((before(2), before(1)), (Some("name"), Some("is"))) && own_label)
            || (before(1) == Some("name") && before(2).is_none())
            || (before(1) == Some("name's") && before(2) == Some("my"));
        let theirs = matches!(before(1), Some("called" | "named" | "name"))
            || matches!((before(2), before(1)), (Some("name"), Some("is")))
            || matches!(before(2), Some("my" | "our"));
        if own || theirs {
            names.push((lower[i].clone(), own));
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_statements_about_the_user_are_read() {
        for nothing in [
            "What is the capital of France?",
            "What should I cook tonight?",
            "Help me with my essay.",
            "If I were a cat I'd sleep all day.",
            "Marie Curie won two Nobel prizes.",
            "Can you tell me a joke",
            "",
        ] {
            assert_eq!(about_user(nothing), None, "{nothing:?}");
        }
        assert_eq!(about_user("I'm Ada and I live in Lyon."), Some("I'm Ada and I live in Lyon.".into()));
        assert_eq!(
            about_user("My dog is called Biscuit. What should I feed him? Our flat is small!"),
            Some("My dog is called Biscuit. Our flat is small!".into())
        );
        assert_eq!(about_user("I’ve moved to Porto"), Some("I’ve moved to Porto".into()), "a typographic apostrophe, no full stop");
        assert_eq!(about_user("Elif here, a violinist from Istanbul."), Some("Elif here, a violinist from Istanbul.".into()));
        assert_eq!(
            statements("Name: Yusuf. Job: electrician. Home: Cairo. Note: the meeting is at 5."),
            vec!["Name: Yusuf.", "Job: electrician.", "Home: Cairo."]
        );
        assert_eq!(about_user("Paris here is lovely. Is Tokyo here?"), None, "no one introduced, and a question");
        // A greeting before it: still them.
        assert_eq!(about_user("Hey, Tomasz here."), Some("Hey, Tomasz here.".into()));
        assert_eq!(about_user("Hello, Elif here, a violinist."), Some("Hello, Elif here, a violinist.".into()));
        assert_eq!(about_user("Hey, Paris here is lovely."), None, "not closed: no one introduced");
    }

    #[test]
    fn a_name_is_the_persons_own_only_where_they_give_it_as_theirs() {
        for own in [
            "Hi! I'm Ottoline, by the way.",
            "I am Ada.",
            "My name is Ines and I live in Lyon.",
            "My name's Jo.",
            "Please call me Jules.",
            "Name: Yusuf.",
            "Elif here, a violinist from Istanbul.",
            "Hey, Tomasz here.",
            "Also, I'm Radhika and I teach yoga in Pune.",
        ] {
            assert!(gives_own_name(own), "{own:?}");
        }
        for theirs in [
            "My sister Ines lives in Lyon.",
            "We adopted a greyhound called Pickle.",
            "My son's name is Bo.",
            "I live in Porto.",
            "I'm allergic to kiwi.",
        ] {
            assert!(!gives_own_name(theirs), "{theirs:?}");
        }
        // Every name read stays read, whoever's it is.
        assert_eq!(names_in("I'm Ada and my sister Ines has a cat called Tom."), vec!["ada", "ines", "tom"]);
    }
}
