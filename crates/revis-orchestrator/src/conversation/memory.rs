//! The memory work a turn leaves behind, in the background: the answer
//! audited when asked (its verdict stored under [`audit_key`]), the facts
//! the user stated about themselves extracted into the profile (only from
//! what they said of themselves, [`about_user`], and only facts about them,
//! [`profile_facts`]), the profile consolidated once it
//! outgrows [`PROFILE_BUDGET`], and old turns summarised past [`TURN_BUDGET`].
//! Their results are stored and folded into the static part of later prompts.

use revis_client::{Runner, Tier};
use revis_store::{ConversationId, MessageState, Role, Store};
use serde_json::json;

use super::error::{ChatError, blocking};
use crate::prompt::PromptContext;
use crate::structured;
use crate::task::{Background, Policies, TaskKind};

/// Turns shown in full before older ones are summarised.
pub const TURN_BUDGET: usize = 12;

/// The settings key an answer's audit is stored under.
pub fn audit_key(reply: revis_store::MessageId) -> String {
    format!("audit/{reply}")
}

/// The background runner and the store the memory work goes through.
pub(super) struct Memory<D: Runner> {
    pub(super) daemon: D,
    pub(super) store: Store,
    pub(super) background: Background,
    pub(super) policies: Policies,
}

impl<D: Runner> Memory<D> {
    /// Checks an answer after it was given; the verdict is stored under [`audit_key`].
    pub(super) fn audit(&self, question: &str, reply: revis_store::MessageId, answer: &str) {
        let policy = *self.policies.get(TaskKind::Audit);
        let (daemon, store) = (self.daemon.clone(), self.store.clone());
        let task = format!("Check this answer for factual mistakes or unhelpfulness.\n\nQuestion: {question}\n\nAnswer: {answer}");
        let _done = self.background.submit(policy.rank, async move {
            let schema = json!({
                "type": "object",
                "properties": {
                    "ok": {"type": "boolean"},
                    "problems": {"type": "array", "items": {"type": "string", "maxLength": 160}, "maxItems": 3}
                },
                "required": ["ok", "problems"],
                "additionalProperties": false
            });
            match structured::run(&daemon, policy.tier, &task, &schema).await {
                Ok(v) => {
                    if let Err(e) = blocking(move || Ok(store.set_setting(&audit_key(reply), &v)?)).await {
                        tracing::warn!("storing an audit failed: {e}");
                    }
                }
                Err(e) => tracing::warn!("audit failed: {e}"),
            }
        });
    }

    /// Queues the extraction of the facts the user stated in `user_text` (message `user`) into the profile.
    /// Only the sentences that say something about the user are read
    /// ([`about_user`]); a message with none (a question, a request, a fact
    /// about the world) costs no call and adds nothing.
    pub(super) fn extract(&self, user_text: &str, user: revis_store::MessageId) {
        let Some(said) = about_user(user_text) else { return };
        let facts = *self.policies.get(TaskKind::ExtractFacts);
        let (daemon, store) = (self.daemon.clone(), self.store.clone());
        let _done = self.background.submit(facts.rank, async move {
            match extract_facts(&daemon, facts.tier, &said).await {
                Ok(v) => {
                    // Store calls fsync: off the async runtime.
                    let _ = tokio::task::spawn_blocking(move || store_facts(&store, &v, &said, user)).await;
                }
                Err(e) => tracing::warn!("profile extraction failed: {e}"),
            }
        });
    }

    /// Queues a consolidation of the profile, which runs (after the turn's
    /// fact extraction, by rank) only if the profile outgrew [`PROFILE_BUDGET`].
    pub(super) fn consolidate(&self) {
        let policy = *self.policies.get(TaskKind::Consolidate);
        let (daemon, store) = (self.daemon.clone(), self.store.clone());
        let _done = self.background.submit(policy.rank, async move {
            let read = store.clone();
            let Ok(old) = blocking(move || Ok(read.facts()?)).await else { return };
            if old.len() <= PROFILE_BUDGET {
                return;
            }
            let list: String = old.iter().map(|f| format!("\n- {}", f.text)).collect();
            let task = format!(
                "Merge these facts about the user into a shorter list: combine facts that say the same thing, \
                 keep every distinct fact, add nothing new. Short sentences in the third person.\n\nFacts:{list}"
            );
            let schema = json!({
                "type": "object",
                "properties": {"facts": {"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 120}, "maxItems": PROFILE_BUDGET}},
                "required": ["facts"],
                "additionalProperties": false
            });
            match structured::run(&daemon, policy.tier, &task, &schema).await {
                Ok(v) => match blocking(move || replace_facts(&store, &old, &v)).await {
                    Ok(n) => tracing::debug!(facts = n, "profile consolidated"),
                    Err(e) => tracing::warn!("storing the consolidated profile failed: {e}"),
                },
                Err(e) => tracing::warn!("profile consolidation failed: {e}"),
            }
        });
    }

    /// Queues a summary of `conversation`'s old turns, folding in the
    /// previous one, if `ctx` (the next prompt's) shows more than [`TURN_BUDGET`] turns.
    pub(super) fn summarise(&self, conversation: ConversationId, ctx: PromptContext) {
        if ctx.turns.len() <= TURN_BUDGET {
            return;
        }
        let summarise = *self.policies.get(TaskKind::Summarise);
        let (daemon, store) = (self.daemon.clone(), self.store.clone());
        let _done = self.background.submit(summarise.rank, async move {
            // Summarise all but the last few turns, folding in the previous summary.
            let read = store.clone();
            let Ok((messages, covered)) = blocking(move || {
                // Only what the previous summary does not cover yet; it is folded in as text.
                Ok((read.messages(conversation)?, read.summary(conversation)?.map(|s| s.covers_up_to)))
            })
            .await
            else {
                return;
            };
            let keep = TURN_BUDGET / 2;
            let complete: Vec<_> =
                messages.into_iter().filter(|m| m.state == MessageState::Complete && covered.is_none_or(|c| m.id > c)).collect();
            if complete.len() <= keep {
                return;
            }
            let old = &complete[..complete.len() - keep];
            let mut text = ctx.summary.clone().map(|s| format!("Earlier summary: {s}\n")).unwrap_or_default();
            for m in old {
                text.push_str(if m.role == Role::User { "User: " } else { "Assistant: " });
                text.push_str(&m.text);
                text.push('\n');
            }
            let (task, schema) = summary_task(&text);
            match structured::run(&daemon, summarise.tier, &task, &schema).await {
                Ok(v) => {
                    if let (Some(s), Some(last)) = (v["summary"].as_str().map(str::to_owned), old.last().map(|m| m.id))
                        && let Err(e) = blocking(move || Ok(store.put_summary(conversation, last, &s)?)).await
                    {
                        tracing::warn!("storing a summary failed: {e}");
                    }
                }
                Err(e) => tracing::warn!("summary failed: {e}"),
            }
        });
    }
}

/// The summarising task for a conversation written out as `text` ("User:
/// ..." and "Assistant: ..." lines), and the schema of its answer.
pub fn summary_task(text: &str) -> (String, serde_json::Value) {
    let schema = json!({
        "type": "object",
        "properties": {"summary": {"type": "string", "minLength": 1, "maxLength": 800}},
        "required": ["summary"],
        "additionalProperties": false
    });
    (format!("Summarise this conversation in a few sentences, keeping names and decisions.\n\n{text}"), schema)
}

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

/// Stores the extracted facts that are new and pass [`profile_facts`] (blocks).
fn store_facts(store: &Store, v: &serde_json::Value, said: &str, source: revis_store::MessageId) {
    let mut known: Vec<String> = store.facts().map(|f| f.into_iter().map(|f| f.text).collect()).unwrap_or_default();
    for fact in profile_facts(v, said) {
        let fact = fact.as_str();
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
        match store.add_fact(fact, Some(source)) {
            Ok(_) => known.push(fact.to_owned()),
            Err(e) => tracing::warn!("storing a profile fact failed: {e}"),
        }
    }
}

/// The words of the first person ("I", "my", "we"...), lower-cased.
const FIRST_PERSON: &[&str] =
    &["i", "i'm", "im", "i've", "i'd", "i'll", "me", "my", "mine", "myself", "we", "we're", "we've", "we'll", "us", "our", "ours"];

/// The words of `text`, lower-cased, apostrophes kept (typographic ones made plain).
fn words(text: &str) -> Vec<String> {
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
            if !question && !opener && words.iter().any(|w| FIRST_PERSON.contains(&w.as_str())) {
                kept.push(sentence);
            }
        }
    }
    (!kept.is_empty()).then(|| kept.join(" "))
}

/// The facts of an extraction (`{"facts": [...]}`) that may go into the
/// profile: about the user (they say "the user", speak of them as he, she
/// or they, begin with a name the user gave themselves or someone of
/// theirs, "I'm Ada", "my sister Ines", or keep the user's own first person,
/// then stored as what the user said) and [`grounded`] in what they said
/// about themselves; the model's list numbering is dropped, and each is
/// kept once. "Paris is the capital of France", taken from "I live in
/// Paris", is not about the user.
pub fn profile_facts(extracted: &serde_json::Value, said: &str) -> Vec<String> {
    let names = names_in(said);
    let mut out: Vec<String> = Vec::new();
    for fact in extracted["facts"].as_array().into_iter().flatten().filter_map(|f| f.as_str()) {
        let fact = fact.trim().trim_start_matches(|c: char| c.is_ascii_digit() || matches!(c, '.' | ')' | '-' | '*' | ' ')).trim();
        let w = words(fact);
        let third = w
            .iter()
            .any(|w| matches!(w.as_str(), "user" | "user's" | "users" | "he" | "she" | "they" | "his" | "her" | "their" | "them" | "him"))
            || w.first().is_some_and(|first| names.contains(first));
        let first = w.iter().any(|w| FIRST_PERSON.contains(&w.as_str()));
        if !(third || first) || !grounded(fact, said) {
            continue;
        }
        let kept = if third { fact.to_owned() } else { format!("The user said: \"{fact}\"") };
        if !out.iter().any(|k| k.eq_ignore_ascii_case(&kept)) {
            out.push(kept);
        }
    }
    out
}

/// The names the user gives in `said`, lower-cased: a capitalised word
/// after "I'm", "I am", "name is", "call me", "called" or "named", or after
/// "my" or "our" and one more word ("my sister Ines").
fn names_in(said: &str) -> Vec<String> {
    let words: Vec<&str> = said.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '’')).filter(|w| !w.is_empty()).collect();
    let lower: Vec<String> = words.iter().map(|w| w.to_lowercase().replace('’', "'")).collect();
    let mut names = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if !w.chars().next().is_some_and(char::is_uppercase) || *w == "I" {
            continue;
        }
        let before = |k: usize| i.checked_sub(k).map(|j| lower[j].as_str());
        let introduced = matches!(before(1), Some("i'm" | "im" | "called" | "named"))
            || matches!((before(2), before(1)), (Some("i"), Some("am")) | (Some("name"), Some("is")) | (Some("call"), Some("me")))
            || matches!(before(2), Some("my" | "our"));
        if introduced {
            names.push(lower[i].clone());
        }
    }
    names
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

/// Facts kept in the profile before they are consolidated: merged, with
/// duplicates dropped, so the static part of every prompt stays short.
pub const PROFILE_BUDGET: usize = 12;

/// The most facts the profile holds, whatever consolidation achieves (a
/// small model may merge nothing): past it, new facts are not stored.
pub const MAX_PROFILE_FACTS: usize = 4 * PROFILE_BUDGET;

/// The longest fact stored, in characters (the extraction's schema asks
/// for at most 120).
pub const MAX_FACT_CHARS: usize = 160;

/// Replaces `old` facts by the model's merged list, losing nothing: a
/// merged fact is kept only if it is grounded in the old facts (nothing
/// invented), and an old fact is removed only if the merged list covers
/// its words (nothing dropped). Returns how many facts there are after.
fn replace_facts(store: &Store, old: &[revis_store::Fact], merged: &serde_json::Value) -> Result<usize, ChatError> {
    let old_text = old.iter().map(|f| f.text.as_str()).collect::<Vec<_>>().join("\n");
    let mut kept: Vec<String> = Vec::new();
    for fact in merged["facts"].as_array().into_iter().flatten().filter_map(|f| f.as_str()).map(str::trim) {
        if grounded(fact, &old_text) && !kept.iter().any(|k| k.eq_ignore_ascii_case(fact)) {
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
        store.add_fact(fact, None)?;
    }
    for f in &covered {
        store.remove_fact(f.id)?;
    }
    Ok(old.len() - covered.len() + kept.len())
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
    }

    #[test]
    fn only_grounded_facts_about_the_user_are_kept() {
        let own = json!({"facts": ["1. I'm 71 and took up painting.", "2. I'm 71 and took up painting.", "I am a famous astronaut."]});
        assert_eq!(
            profile_facts(&own, "I'm 71 and just took up watercolour painting."),
            vec!["The user said: \"I'm 71 and took up painting.\""]
        );
        let said = "My sister Ines lives in Porto and I teach maths.";
        let v = json!({"facts": [
            "The user's sister Ines lives in Porto.",
            "The user teaches maths.",
            "Porto is a city in Portugal.",
            "The user is a famous astronaut.",
        ]});
        assert_eq!(profile_facts(&v, said), vec!["The user's sister Ines lives in Porto.", "The user teaches maths."]);
        let named = json!({"facts": ["Ada lives in London.", "2. Ines is a nurse.", "3. Ines is a nurse.", "London is in England."]});
        assert_eq!(
            profile_facts(&named, "I'm Ada and I live in London; my sister Ines is a nurse."),
            vec!["Ada lives in London.", "Ines is a nurse."]
        );
        assert!(profile_facts(&json!({}), said).is_empty());
    }
}
