//! The recall parts of `revis-bench turn`: what a person said about
//! themselves, asked about later in the same conversation and in new ones.
//! Each person has a data directory of their own, as a person's revis holds
//! what that person said.

use revis_client::{Client, GenerateParams, Message, Priority, Runner, Sampling};
use revis_orchestrator::conversation::{Beside, Chat, asked_about, none_found};
use revis_orchestrator::{Policies, TaskKind};
use revis_store::Store;
use serde::Deserialize;

use super::row::{Row, greedy};

/// A recall conversation: turns, then a question about one of them.
#[derive(Deserialize)]
pub(super) struct Recall {
    turns: Vec<String>,
    ask: String,
    answers: Vec<String>,
}

/// A person who tells revis things about themselves, one conversation a
/// statement, and the questions about them asked in new conversations.
#[derive(Deserialize)]
pub(super) struct Person {
    person: String,
    said: Vec<String>,
    asked: Vec<Asked>,
}

/// A question about the person and the words a right answer holds (any one).
#[derive(Deserialize)]
struct Asked {
    ask: String,
    answers: Vec<String>,
}

fn rows(ways: &[&str], set: &str) -> Vec<Row> {
    ways.iter().map(|w| Row { set: set.into(), way: (*w).into(), right: 0, n: 0, loops: 0, chars: 0, examples: Vec::new() }).collect()
}

/// Whether `answer` holds one of `answers`, ignoring case.
fn holds(answer: &str, answers: &[String]) -> bool {
    answers.iter().any(|x| answer.to_lowercase().contains(&x.to_lowercase()))
}

/// Where a miss is lost: a stored fact holding the answer (else not
/// stored), one put beside the question (else stored but not found); both
/// empty when there is none, so a row counts them as answers.
fn where_lost(store: &Store, ask: &str, answers: &[String]) -> anyhow::Result<(String, String)> {
    let profile: Vec<String> = store.facts()?.into_iter().map(|f| f.text).collect();
    let stored = profile.iter().find(|f| holds(f, answers)).cloned().unwrap_or_default();
    let mut put = asked_about(&profile, ask);
    if put.is_empty() {
        put = none_found(&profile, ask);
    }
    let beside = put.into_iter().find(|f| holds(f, answers)).unwrap_or_default().to_owned();
    Ok((stored, beside))
}

const STORED: &str = "(where it is lost) a stored fact holds the answer";
const BESIDE: &str = "(where it is lost) a fact put beside the question holds it";

/// How a form's answers are drawn.
#[derive(Clone, Copy)]
enum Draw {
    /// The model's default sampling (its gears), [`SEEDS`] seeds.
    Gears,
    /// Greedy, once: every seed would give the same answer.
    Greedy,
}

/// The forms a question in a new conversation is asked in: the shipped one
/// first (the target reads its row).
const NEW_FORMS: [(&str, Beside, Draw); 3] = [
    ("the turn, a new conversation (the profile)", Beside::Before, Draw::Gears),
    ("the turn, a new conversation, greedy", Beside::Before, Draw::Greedy),
    ("the turn, a new conversation, the profile in the system message only", Beside::Off, Draw::Gears),
];

/// Seeds each question in a new conversation is asked with, per sampled
/// form: one sample a question left the forms' figures apart by less than
/// their noise.
const SEEDS: u64 = 2;

/// Counts `answer` in `row`, keeping the first few as examples.
fn count(row: &mut Row, ask: &str, answer: &str, answers: &[String]) {
    row.n += 1;
    row.right += usize::from(holds(answer, answers));
    if row.examples.len() < 3 {
        row.examples.push((ask.to_owned(), answer.chars().take(160).collect()));
    }
}

/// Asks `ask` in a new conversation in each of [`NEW_FORMS`] with each
/// seed, counting the answers in `rows` (the forms' rows, in order).
async fn ask_anew(
    chat: &mut Chat<Client>,
    store: &Store,
    ask: &str,
    answers: &[String],
    seed: u64,
    rows: &mut [Row],
) -> anyhow::Result<()> {
    for ((_, form, draw), row) in NEW_FORMS.iter().zip(rows.iter_mut()) {
        chat.facts_beside = *form;
        let draws: Vec<Sampling> = match draw {
            Draw::Gears => (0..SEEDS).map(|k| Sampling { seed: Some(seed + 1000 * k), ..Default::default() }).collect(),
            Draw::Greedy => vec![greedy()],
        };
        for sampling in draws {
            chat.sampling = sampling;
            chat.open(store.create_conversation("asked again")?);
            let answer = chat.send(ask, |_| {}).await?.text;
            chat.background_done().await;
            count(row, ask, &answer, answers);
        }
    }
    chat.facts_beside = Beside::default();
    Ok(())
}

/// The recall conversations: the turn (background work and all) and the
/// bare model given the same conversation, then the question in new
/// conversations ([`NEW_FORMS`]). Each conversation is one person with a
/// data directory of their own, as a person's revis holds what that person
/// said: thirty people in one store would have each asked about themselves
/// with the others' names and homes in their profile, and the later ones'
/// facts merged by consolidation or refused past the profile's size
/// (`MAX_PROFILE_FACTS`), which is not what a person meets.
pub(super) async fn recall(client: &Client, items: &[Recall], rules: &str) -> anyhow::Result<Vec<Row>> {
    let mut same = rows(&["the turn, same conversation", "bare model, greedy, same conversation", STORED, BESIDE], "recall");
    let mut anew = rows(&NEW_FORMS.map(|(name, ..)| name), "recall");
    for (i, it) in items.iter().enumerate() {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path())?.store;
        let mut chat = Chat::new(client.clone(), store.clone(), store.create_conversation("recall")?, Policies::default());
        chat.fit_to_model().await?;
        chat.rules = rules.to_owned();
        chat.max_tokens = Some(48);
        let mut history = Vec::new();
        for (k, t) in it.turns.iter().enumerate() {
            chat.sampling = Sampling { seed: Some((i * 10 + k) as u64), ..Default::default() };
            let done = chat.send(t, |_| {}).await?;
            chat.background_done().await;
            history.push(Message::user(t.as_str()));
            if !done.text.is_empty() {
                history.push(Message::assistant(done.text));
            }
        }
        let turn = chat.send(&it.ask, |_| {}).await?.text;
        chat.background_done().await;
        ask_anew(&mut chat, &store, &it.ask, &it.answers, (i * 10 + 9) as u64, &mut anew).await?;
        history.push(Message::user(it.ask.as_str()));
        let req = GenerateParams {
            tier: Policies::default().get(TaskKind::ChatAnswer).tier,
            messages: history,
            max_tokens: Some(48),
            sampling: greedy(),
            priority: Priority::User,
            ..Default::default()
        };
        let bare = Runner::generate(client, req, |_| {}).await?.text;
        let (stored, beside) = where_lost(&store, &it.ask, &it.answers)?;
        for (row, a) in same.iter_mut().zip([&turn, &bare, &stored, &beside]) {
            count(row, &it.ask, a, &it.answers);
        }
        eprintln!("revis-bench: turn recall {}/{}", i + 1, items.len());
    }
    // The same conversation's turn, the new conversations', then the bare model and where misses are lost.
    let mut same = same.into_iter();
    Ok(same.next().into_iter().chain(anew).chain(same).collect())
}

/// The people: each tells revis ten things, one new conversation a
/// statement (the turn, background work and all), then is asked about each
/// in new conversations ([`NEW_FORMS`]). The bare model has nothing to go
/// on in a new conversation, so it is not asked.
pub(super) async fn people(client: &Client, people: &[Person], rules: &str) -> anyhow::Result<Vec<Row>> {
    let mut anew = rows(&NEW_FORMS.map(|(name, ..)| name), "people");
    let mut lost = rows(&[STORED, BESIDE], "people");
    for (i, p) in people.iter().enumerate() {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path())?.store;
        let mut chat = Chat::new(client.clone(), store.clone(), store.create_conversation(&p.person)?, Policies::default());
        chat.fit_to_model().await?;
        chat.rules = rules.to_owned();
        chat.max_tokens = Some(48);
        for (k, said) in p.said.iter().enumerate() {
            if k > 0 {
                chat.open(store.create_conversation(&p.person)?);
            }
            chat.sampling = Sampling { seed: Some((i * 100 + k) as u64), ..Default::default() };
            chat.send(said, |_| {}).await?;
            chat.background_done().await;
        }
        for (k, q) in p.asked.iter().enumerate() {
            ask_anew(&mut chat, &store, &q.ask, &q.answers, (i * 100 + 50 + k) as u64, &mut anew).await?;
            let (stored, beside) = where_lost(&store, &q.ask, &q.answers)?;
            for (row, a) in lost.iter_mut().zip([&stored, &beside]) {
                count(row, &q.ask, a, &q.answers);
            }
        }
        eprintln!("revis-bench: turn people {}/{} ({})", i + 1, people.len(), p.person);
    }
    Ok(anew.into_iter().chain(lost).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_row_the_target_reads_is_the_form_a_chat_ships_with() {
        assert_eq!(NEW_FORMS[0].1, Beside::default());
        assert!(matches!(NEW_FORMS[0].2, Draw::Gears));
    }
}
