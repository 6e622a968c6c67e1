//! The chat side of the I/O thread: one task owns the orchestrator's
//! [`Chat`] (one for the app's life, so its gates and background runner are
//! the app's), hands it the keystrokes (the typing signal), runs a turn and
//! stops it on request.

use revis_client::dispatch::Dispatcher;
use revis_orchestrator::Policies;
use revis_orchestrator::conversation::{Chat, ChatError};
use revis_store::{ConversationId, Store};
use tokio::sync::mpsc;

use crate::options::Options;
use crate::protocol::{Command, Event, Sink, plain_chat};

pub(crate) async fn chat_actor(daemon: Dispatcher, store: Store, opts: Options, mut rx: mpsc::UnboundedReceiver<Command>, sink: Sink) {
    let conversation = match blocking(&store, |s| match s.conversations()?.first() {
        Some(c) => Ok(c.id),
        None => s.create_conversation(""),
    })
    .await
    {
        Ok(id) => id,
        Err(e) => return sink.error("opening your conversations", e),
    };
    let mut chat = Chat::new(daemon, store.clone(), conversation, Policies::default());
    chat.sampling = opts.sampling;
    chat.max_tokens = opts.max_tokens;
    chat.titling = true;
    // The Memory view's switch, as the person last left it.
    chat.learn = crate::settings::learning(&opts.config);
    chat.typing_idle = opts.typing_idle;
    // The rules and checks measured for the models that answer (docs/QUALITY.md);
    // a daemon not answering yet leaves revis's defaults (the log says why).
    if let Err(e) = chat.fit_to_model().await {
        tracing::warn!("reading which models answer failed, revis's default rules stay: {}", plain_chat(&e));
    }
    forward_watches(&chat, &sink);
    list(&store, &sink).await;
    open(&store, &sink, conversation).await;

    while let Some(cmd) = rx.recv().await {
        match cmd {
            Command::Keystroke { first, draft } => {
                if let Err(e) = chat.keystroke(first, Some(&draft)) {
                    sink.error("warming up the answer", plain_chat(&e));
                }
            }
            Command::GoDeeper(reply) => {
                if !chat.deepen(reply).await {
                    sink.error("going deeper", "tier3 was already asked to follow this answer up");
                }
            }
            Command::InputCleared => chat.typing_stopped(),
            Command::SetLearning(on) => chat.learn = on,
            Command::OpenConversation(id) => {
                chat.open(id);
                open(&store, &sink, id).await;
            }
            Command::NewConversation => {
                let current = chat.conversation;
                let empty = blocking(&store, move |s| Ok(s.messages(current)?.is_empty())).await.unwrap_or(false);
                if !empty {
                    match blocking(&store, |s| s.create_conversation("")).await {
                        Ok(id) => chat.open(id),
                        Err(e) => sink.error("starting a conversation", e),
                    }
                }
                list(&store, &sink).await;
                open(&store, &sink, chat.conversation).await;
            }
            Command::Stop => {}
            Command::Send(text) => send(&chat, &store, &sink, &mut rx, &text).await,
            Command::Resend { from, text } => {
                // The message and what follows leave the store first; a refusal changes nothing.
                if let Err(e) = chat.rewind(from).await {
                    sink.send(Event::AnswerFailed(plain_chat(&e)));
                    open(&store, &sink, chat.conversation).await;
                    continue;
                }
                send(&chat, &store, &sink, &mut rx, &text).await;
            }
            Command::Continue(reply) => {
                // What was shown before goes on (read once the stopped text is on disk); a stop now keeps both parts.
                let _ = chat.saved().await;
                let before = blocking(&store, move |s| Ok(s.message(reply)?.map(|m| m.text).unwrap_or_default())).await.unwrap_or_default();
                let mut so_far = before;
                let turn = chat.continue_reply(reply, |t| {
                    so_far.push_str(t);
                    sink.send(Event::Delta(t.to_owned()));
                });
                let outcome = stream(&chat, turn, &mut rx, &sink).await;
                end_turn(&chat, &store, &sink, outcome, so_far, false).await;
            }
            other => sink.error("chat", format!("{} is not a chat command", describe(&other))),
        }
    }
}

/// Sends `text` and streams its answer to the UI, until it ends or is stopped.
async fn send(chat: &Chat<Dispatcher>, store: &Store, sink: &Sink, rx: &mut mpsc::UnboundedReceiver<Command>, text: &str) {
    let mut so_far = String::new();
    let turn = chat.send(text, |t| {
        so_far.push_str(t);
        sink.send(Event::Delta(t.to_owned()));
    });
    let outcome = stream(chat, turn, rx, sink).await;
    end_turn(chat, store, sink, outcome, so_far, true).await;
}

/// Streams a turn until it ends or the user stops it (None); keys pressed
/// meanwhile still reach the chat (the draft's check, the typing signal).
async fn stream(
    chat: &Chat<Dispatcher>,
    turn: impl Future<Output = Result<revis_client::Done, ChatError>>,
    rx: &mut mpsc::UnboundedReceiver<Command>,
    sink: &Sink,
) -> Option<Result<revis_client::Done, ChatError>> {
    let mut turn = std::pin::pin!(turn);
    loop {
        tokio::select! {
            r = &mut turn => break Some(r),
            c = rx.recv() => match c {
                Some(Command::Stop) | None => break None,
                // Only the draft is checked; typing resumes when the turn is over.
                Some(Command::Keystroke { first, draft }) => {
                    if let Err(e) = chat.keystroke(first, Some(&draft)) {
                        sink.error("warming up the answer", plain_chat(&e));
                    }
                }
                Some(Command::InputCleared) => chat.typing_stopped(),
                Some(other) => sink.error("while the answer streams", format!("{} waits until the answer is done or stopped", describe(&other))),
            },
        }
    }
    // Dropping the turn (on return) drops its stream: the daemon stops at the
    // next token; the prefix warmed for it counts as used.
}

/// After a turn: the answer's end told to the UI (done, failed, or stopped
/// with what was shown, saved first), the turn's stored ids, the list, and
/// typing resumed.
async fn end_turn(
    chat: &Chat<Dispatcher>,
    store: &Store,
    sink: &Sink,
    outcome: Option<Result<revis_client::Done, ChatError>>,
    shown: String,
    asked: bool,
) {
    match outcome {
        Some(Ok(done)) => sink.send(Event::AnswerDone { text: done.text.clone(), stats: stats(&done), tier: answer_tier() }),
        Some(Err(e)) => sink.send(Event::AnswerFailed(plain_chat(&e))),
        None => {
            // The dropped turn handed exactly what was shown to the store's writer
            // (kept, flagged incomplete): wait until it is on disk.
            if let Err(e) = chat.saved().await {
                sink.error("saving the stopped answer", plain_chat(&e));
            }
            sink.send(Event::AnswerStopped { text: shown });
        }
    }
    // The ids the UI needs to edit, regenerate or continue this turn.
    let conversation = chat.conversation;
    if let Ok(messages) = blocking(store, move |s| s.messages(conversation)).await
        && let Some(i) = messages.iter().rposition(|m| m.role == revis_store::Role::Assistant)
    {
        let user = messages[..i].iter().rev().find(|m| m.role == revis_store::Role::User).map(|m| m.id).filter(|_| asked);
        sink.send(Event::TurnIds { user, reply: messages[i].id });
    }
    list(store, sink).await;
    // Keys pressed while the answer streamed: typing resumes, and the
    // pre-prefill starts from the history that includes the answer.
    if let Err(e) = chat.resume_typing() {
        sink.error("warming up the answer", plain_chat(&e));
    }
}

/// The tier chat answers come from.
fn answer_tier() -> revis_client::Tier {
    Policies::default().get(revis_orchestrator::TaskKind::ChatAnswer).tier
}

fn describe(c: &Command) -> &'static str {
    match c {
        Command::NewConversation => "A new conversation",
        Command::OpenConversation(_) => "Opening another conversation",
        Command::Send(_) | Command::Resend { .. } => "Another message",
        Command::Continue(_) => "Continuing an answer",
        Command::SetLearning(_) => "Changing whether revis learns from this chat",
        _ => "That",
    }
}

fn stats(d: &revis_client::Done) -> String {
    format!(
        "{} prompt tokens ({} from the warm cache), {} generated at {:.1} tokens/s",
        d.prompt_tokens,
        d.cached_tokens,
        d.generated_tokens,
        d.generated_tokens as f64 / (d.generate_us.max(1) as f64 / 1e6)
    )
}

/// The pre-prefill phase and the gates, as they change.
fn forward_watches(chat: &Chat<Dispatcher>, sink: &Sink) {
    let mut notes = chat.notes();
    let s = sink.clone();
    tokio::spawn(async move {
        loop {
            match notes.recv().await {
                Ok(n) => s.send(Event::Note(n)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    });
    let mut phase = chat.watch_prefill();
    let s = sink.clone();
    tokio::spawn(async move {
        s.send(Event::Phase(*phase.borrow_and_update()));
        while phase.changed().await.is_ok() {
            s.send(Event::Phase(*phase.borrow_and_update()));
        }
    });
    let mut gates = chat.watch_gates();
    let s = sink.clone();
    tokio::spawn(async move {
        s.send(Event::Gates(*gates.borrow_and_update()));
        while gates.changed().await.is_ok() {
            s.send(Event::Gates(*gates.borrow_and_update()));
        }
    });
}

/// Store calls block: run them off the async runtime.
async fn blocking<T: Send + 'static>(
    store: &Store,
    f: impl FnOnce(&Store) -> Result<T, revis_store::StoreError> + Send + 'static,
) -> Result<T, String> {
    let s = store.clone();
    match tokio::task::spawn_blocking(move || f(&s)).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

async fn list(store: &Store, sink: &Sink) {
    match blocking(store, |s| s.conversations()).await {
        Ok(c) => sink.send(Event::Conversations(c)),
        Err(e) => sink.error("listing your conversations", e),
    }
}

async fn open(store: &Store, sink: &Sink, id: ConversationId) {
    let read = blocking(store, move |s| {
        let messages = s.messages(id)?;
        let mut records = std::collections::BTreeMap::new();
        for m in messages.iter().filter(|m| m.role == revis_store::Role::Assistant) {
            if let Ok(Some(r)) = revis_orchestrator::conversation::turn_record(s, m.id) {
                records.insert(m.id, r);
            }
        }
        Ok((messages, records))
    });
    match read.await {
        Ok((messages, records)) => sink.send(Event::Opened { id, messages, records }),
        Err(e) => sink.error("opening a conversation", e),
    }
}
