//! The profile's store side: learned facts stored (a newer name or home
//! replacing the older), the consolidated list put in place of the old one,
//! a fact the person tells revis directly, and where a fact came from.

use revis_store::Store;

use super::learn::{grounded, profile_facts, resting_on};
use super::limits::{MAX_FACT_CHARS, MAX_PROFILE_FACTS};
use super::said::{FIRST_PERSON, words};
use super::slot::slot_of;
use crate::conversation::error::ChatError;

/// Stores the extracted facts that are new and pass [`profile_facts`],
/// each with the person's words it rests on (blocks).
pub(super) fn store_facts(store: &Store, v: &serde_json::Value, statements: &[&str], source: revis_store::MessageId) {
    let learned = profile_facts(v, statements);
    // A newer statement of where the person lives or what they are called
    // replaces the older one ("Actually I moved to Porto").
    for slot in learned.iter().filter_map(|l| slot_of(&l.said).or_else(|| slot_of(&l.text))) {
        for old in store.facts().unwrap_or_default() {
            let older = old.source.is_none_or(|s| s < source);
            let same = old.said.as_deref().and_then(slot_of).or_else(|| slot_of(&old.text)) == Some(slot);
            if older
                && same
                && let Err(e) = store.remove_fact(old.id)
            {
                tracing::warn!("replacing a profile fact failed: {e}");
            }
        }
    }
    let mut known: Vec<String> = store.facts().map(|f| f.into_iter().map(|f| f.text).collect()).unwrap_or_default();
    for learned in learned {
        let fact = learned.text.as_str();
        if known.iter().any(|k| k.eq_ignore_ascii_case(fact)) {
            continue;
        }
        if fact.chars().count() > MAX_FACT_CHARS {
            tracing::warn!("a profile fact of {} characters was not stored: the limit is {MAX_FACT_CHARS}", fact.chars().count());
            continue;
        }
        if known.len() >= MAX_PROFILE_FACTS {
            tracing::warn!("the profile holds {} facts, its limit ({MAX_PROFILE_FACTS}): a new one was not stored", known.len());
            break;
        }
        match store.add_fact_said(fact, Some(source), Some(&learned.said)) {
            Ok(_) => known.push(fact.to_owned()),
            Err(e) => tracing::warn!("storing a profile fact failed: {e}"),
        }
    }
}

/// Replaces `old` facts by the model's merged list, losing nothing: a
/// merged fact is kept only if it is grounded in the old facts (nothing
/// invented; a quotation only if the profile holds exactly it), and an old
/// fact is removed only if the merged list covers its words (nothing
/// dropped). A merged fact keeps the source and words of the old fact it
/// shares most words with. Returns how many facts there are after.
pub(super) fn replace_facts(store: &Store, old: &[revis_store::Fact], merged: &serde_json::Value) -> Result<usize, ChatError> {
    let old_text = old.iter().map(|f| f.text.as_str()).collect::<Vec<_>>().join("\n");
    let mut kept: Vec<String> = Vec::new();
    for fact in merged["facts"].as_array().into_iter().flatten().filter_map(|f| f.as_str()).map(str::trim) {
        // A quotation stays exactly one the profile holds: merging never rewords the person's words.
        let quotes_anew = fact.starts_with("The user said:") && !old.iter().any(|f| f.text == fact);
        if !quotes_anew && grounded(fact, &old_text) && !kept.iter().any(|k| k.eq_ignore_ascii_case(fact)) {
            kept.push(fact.to_owned());
        }
    }
    let merged_text = kept.join("\n");
    let covered: Vec<&revis_store::Fact> = old.iter().filter(|f| grounded(&f.text, &merged_text)).collect();
    if kept.is_empty() || kept.len() >= covered.len() {
        // Nothing merged (or nothing fewer): leave the profile as it is.
        return Ok(old.len());
    }
    for fact in &kept {
        // It keeps the source and the words of the old fact it shares most words with.
        let texts: Vec<&str> = old.iter().map(|f| f.text.as_str()).collect();
        let from = resting_on(fact, &texts).and_then(|t| old.iter().find(|f| f.text == t));
        store.add_fact_said(fact, from.and_then(|f| f.source), from.and_then(|f| f.said.as_deref()))?;
    }
    for f in &covered {
        store.remove_fact(f.id)?;
    }
    Ok(old.len() - covered.len() + kept.len())
}

/// A fact the person tells revis directly (`revis profile add`), as the
/// profile keeps it: in the first person ("I'm vegetarian") as their words,
/// `The user said: "I'm vegetarian"`, as a learned one is; otherwise as
/// written.
pub fn as_told(fact: &str) -> String {
    if words(fact).iter().any(|w| FIRST_PERSON.contains(&w.as_str())) { format!("The user said: \"{fact}\"") } else { fact.to_owned() }
}

/// Where and when a fact was said, in words, for the person (`revis
/// profile`, the GUI's Memory view): the conversation and message, how long
/// ago, and the words it rests on where the fact does not show them.
pub fn provenance(f: &revis_store::Fact, now_ms: u64) -> String {
    let s = now_ms.saturating_sub(f.created_ms) / 1000;
    let ago = match s {
        0..60 => "just now".to_owned(),
        60..3600 => format!("{} min ago", s / 60),
        3600..86_400 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86_400),
    };
    match (f.source, &f.said) {
        (Some(m), Some(said)) if !f.text.contains(said.as_str()) => {
            format!("from what you said in conversation {} (message {m}), {ago}: \"{said}\"", m.conversation)
        }
        (Some(m), _) => format!("from conversation {} (message {m}), {ago}", m.conversation),
        (None, _) => format!("added or merged {ago}"),
    }
}

/// What [`tell`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Told {
    /// Stored as this fact, in these words.
    Added(revis_store::FactId, String),
    /// The profile holds it already.
    Known(revis_store::FactId),
}

/// Stores a fact the person tells revis directly (`revis profile add`, the
/// GUI's Memory view), [`as_told`], once; a clear refusal for an empty
/// one, one over [`MAX_FACT_CHARS`], or a full profile ([`MAX_PROFILE_FACTS`]).
pub fn tell(store: &Store, fact: &str) -> Result<Told, ChatError> {
    let fact = fact.trim();
    if fact.is_empty() {
        return Err(ChatError::Refused("the fact is empty".into()));
    }
    let chars = fact.chars().count();
    if chars > MAX_FACT_CHARS {
        return Err(ChatError::Refused(format!(
            "the fact is {chars} characters; a fact holds at most {MAX_FACT_CHARS}: split it into shorter ones"
        )));
    }
    let facts = store.facts()?;
    let text = as_told(fact);
    if let Some(same) = facts.iter().find(|f| f.text.eq_ignore_ascii_case(&text)) {
        return Ok(Told::Known(same.id));
    }
    if facts.len() >= MAX_PROFILE_FACTS {
        return Err(ChatError::Refused(format!(
            "the profile holds {} facts, its limit ({MAX_PROFILE_FACTS}): forget some first",
            facts.len()
        )));
    }
    Ok(Told::Added(store.add_fact(&text, None)?, text))
}

#[cfg(test)]
mod tests {
    use revis_store::Store;
    use serde_json::json;

    use super::*;
    use crate::conversation::memory::said::statements;
    use crate::conversation::memory::slot::Slot;

    #[test]
    fn a_newer_home_or_name_replaces_the_older_one() {
        assert_eq!(slot_of("I live in Lyon."), Some(Slot::Home));
        assert_eq!(slot_of("Actually, I moved to Porto last month."), Some(Slot::Home));
        assert_eq!(slot_of("The user said: \"Call me Bea.\""), Some(Slot::Name));
        assert_eq!(slot_of("The user's name is Priya."), Some(Slot::Name));
        assert_eq!(slot_of("My sister lives in Porto."), None, "someone else's home");
        assert_eq!(slot_of("I love Lyon."), None);
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap().store;
        let c = store.create_conversation("").unwrap();
        let said = |text: &str| {
            let id = store.append_user(c, text).unwrap();
            store_facts(&store, &json!({"facts": []}), &statements(text), id);
        };
        said("I live in Lyon. I have a cat called Tom.");
        said("My name is Ada.");
        said("Actually, I moved to Porto last month.");
        let facts: Vec<String> = store.facts().unwrap().into_iter().map(|f| f.text).collect();
        assert_eq!(
            facts,
            [
                "The user said: \"I have a cat called Tom.\"",
                "The user said: \"My name is Ada.\"",
                "The user said: \"Actually, I moved to Porto last month.\""
            ]
        );
    }
}
