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
        let message = user_text.to_owned();
        let facts = *self.policies.get(TaskKind::ExtractFacts);
        let (daemon, store) = (self.daemon.clone(), self.store.clone());
        let _done = self.background.submit(facts.rank, async move {
            match extract_facts(&daemon, facts.tier, &said).await {
                Ok(v) => {
                    // Store calls fsync: off the async runtime.
                    let _ = tokio::task::spawn_blocking(move || store_facts(&store, &v, &statements(&message), user)).await;
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

/// Stores the extracted facts that are new and pass [`profile_facts`],
/// each with the person's words it rests on (blocks).
fn store_facts(store: &Store, v: &serde_json::Value, statements: &[&str], source: revis_store::MessageId) {
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
/// that share a word with the question (not a first-person or asking word),
/// and the fact that fills the slot it asks for ("my name", "where do I
/// live"). A message about anything else gets none.
pub fn asked_about<'a>(profile: &'a [String], message: &str) -> Vec<&'a str> {
    let asked = words(message);
    // "Did I", "am I", "where do I": about them; "how do I" is a how-to question, not about them.
    let about_self = asked.iter().any(|w| matches!(w.as_str(), "my" | "me" | "mine" | "myself"))
        || asked.windows(2).any(|p| p[1] == "i" && matches!(p[0].as_str(), "did" | "am" | "was" | "have" | "had"))
        || asked.windows(3).any(|p| p[2] == "i" && p[1] == "do" && matches!(p[0].as_str(), "where" | "what" | "who"));
    if !about_self || profile.is_empty() {
        return Vec::new();
    }
    let has = |ws: &[&str]| asked.iter().any(|w| ws.contains(&w.as_str()));
    let slot = if has(&["name", "named", "call"]) {
        Some(Slot::Name)
    } else if has(&["live", "living", "town", "city", "home", "moved", "based", "country"]) {
        Some(Slot::Home)
    } else {
        None
    };
    let content: Vec<&String> =
        asked.iter().filter(|w| w.chars().count() >= 3 && !ASKING.contains(&w.as_str()) && !FIRST_PERSON.contains(&w.as_str())).collect();
    let mut scored: Vec<(usize, usize, &str)> = profile
        .iter()
        .enumerate()
        .filter_map(|(i, fact)| {
            let fw = words(fact);
            let shared = content.iter().filter(|w| fw.contains(w)).count();
            let fills = usize::from(slot.is_some() && slot_of(fact) == slot) * 2;
            (shared + fills > 0).then_some((shared + fills, i, fact.as_str()))
        })
        .collect();
    // Most shared first; among equals the newer (later in the profile).
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    scored.into_iter().take(3).map(|(_, _, f)| f).collect()
}

/// `message` as the model gets it: with the profile facts it asks about
/// ([`asked_about`]) after it, in the person's voice: a small model answers
/// from what is next to the question far more often than from the system
/// message (docs/QUALITY.md). What is stored and shown stays `message`.
pub fn with_what_was_said(profile: &[String], message: &str) -> String {
    let facts = asked_about(profile, message);
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
    format!("{message}\n\n(What I told you before: {})", told.join(" "))
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

/// Labels of the forms people fill in about themselves ("Name: Yusuf.").
const SELF_LABELS: &[&str] = &["name", "job", "work", "occupation", "home", "from", "location", "city", "age", "pronouns", "hobbies"];

/// A sentence that introduces the person without "I" or "my": a name and
/// "here" ("Elif here, a violinist from Istanbul."), or a form's label
/// ("Name: Yusuf.", "Job: electrician.").
fn introduces(sentence: &str) -> bool {
    let mut parts = sentence.split_whitespace();
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

/// A fact for the profile and the person's own words it rests on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Learned {
    /// The fact as the profile shows it and prompts carry it.
    pub text: String,
    /// The words of the person's message it rests on, exactly as written.
    pub said: String,
}

/// The facts of an extraction (`{"facts": [...]}`) that may go into the
/// profile, from a message's [`statements`]: about the user (they say "the
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
fn resting_on<'a>(fact: &str, statements: &[&'a str]) -> Option<&'a str> {
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

/// The names the user gives in a sentence, lower-cased: a capitalised word
/// after "I'm", "I am", "name is", "name:", "call me", "called" or "named",
/// after "my" or "our" and one more word ("my sister Ines"), or first and
/// followed by "here" ("Elif here, …").
fn names_in(said: &str) -> Vec<String> {
    let words: Vec<&str> = said.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '’')).filter(|w| !w.is_empty()).collect();
    let lower: Vec<String> = words.iter().map(|w| w.to_lowercase().replace('’', "'")).collect();
    let mut names = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if !w.chars().next().is_some_and(char::is_uppercase) || *w == "I" {
            continue;
        }
        let before = |k: usize| i.checked_sub(k).map(|j| lower[j].as_str());
        let after = |k: usize| lower.get(i + k).map(String::as_str);
        let introduced = matches!(before(1), Some("i'm" | "im" | "called" | "named" | "name"))
            || (after(1) == Some("here") && i == 0)
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
/// invented; a quotation only if the profile holds exactly it), and an old
/// fact is removed only if the merged list covers its words (nothing
/// dropped). A merged fact keeps the source and words of the old fact it
/// shares most words with. Returns how many facts there are after.
fn replace_facts(store: &Store, old: &[revis_store::Fact], merged: &serde_json::Value) -> Result<usize, ChatError> {
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
    }

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
        // "Hi! I'm Ottoline" fills no slot and shares no word: a name question finds it only when said as a name.
        let named = [profile.clone(), vec!["The user said: \"My name is Ottoline.\"".into()]].concat();
        assert_eq!(asked_about(&named, "Do you remember my name?"), vec![named[4].as_str()]);
        // Not about the person, or nothing shared: nothing added, the message unchanged.
        for m in ["What is the capital of Peru?", "How do I keep a cut avocado from going brown?", "Tell me a joke."] {
            assert!(asked_about(&profile, m).is_empty(), "{m}");
            assert_eq!(with_what_was_said(&profile, m), m);
        }
        assert_eq!(
            with_what_was_said(&profile, "What's my dog called again?"),
            "What's my dog called again?\n\n(What I told you before: \"We just adopted a rescue greyhound called Pickle.\")"
        );
        assert_eq!(
            with_what_was_said(&profile, "Where do I live?"),
            "Where do I live?\n\n(What I told you before: The user lives in Pune.)"
        );
    }
}
