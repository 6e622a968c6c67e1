//! The chat side of the I/O thread: one task owns the orchestrator's
//! [`Chat`] (one for the app's life, so its gates and background runner are
//! the app's), turns keystrokes into the typing signal, runs a turn and
//! stops it on request.

use revis_client::dispatch::Dispatcher;
use revis_orchestrator::Policies;
use revis_orchestrator::conversation::Chat;
use revis_store::{ConversationId, Store};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::options::Options;
use crate::protocol::{Command, Event, Sink, plain_chat};

/// How long a conversation title may be (the first message, cut).
const TITLE_CHARS: usize = 60;

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
    forward_watches(&chat, &sink);
    list(&store, &sink).await;
    open(&store, &sink, conversation).await;

    let mut typing_until: Option<Instant> = None;
    // Keys pressed while an answer streamed: the pre-prefill starts when it ends,
    // from the history that includes it.
    let mut typed_while_streaming = false;
    loop {
        let cmd = match typing_until {
            Some(deadline) => tokio::select! {
                c = rx.recv() => c,
                () = tokio::time::sleep_until(deadline) => {
                    // A pause in typing: background work may go on; the warm cache stays.
                    chat.typing_stopped();
                    typing_until = None;
                    continue;
                }
            },
            None => rx.recv().await,
        };
        let Some(cmd) = cmd else { break };
        match cmd {
            Command::Keystroke { first, draft } => {
                typing_until = Some(Instant::now() + opts.typing_idle);
                if (first || !chat.gates().state().typing)
                    && let Err(e) = chat.typing_started()
                {
                    sink.error("warming up the answer", plain_chat(&e));
                }
                chat.draft(&draft);
            }
            Command::GoDeeper(reply) => {
                if !chat.deepen(reply).await {
                    sink.error("going deeper", "tier3 was already asked to follow this answer up");
                }
            }
            Command::InputCleared => {
                typing_until = None;
                chat.typing_stopped();
            }
            Command::OpenConversation(id) => {
                chat.conversation = id;
                chat.pre_prefill().consumed();
                open(&store, &sink, id).await;
            }
            Command::NewConversation => {
                let current = chat.conversation;
                let empty = blocking(&store, move |s| Ok(s.messages(current)?.is_empty())).await.unwrap_or(false);
                if !empty {
                    match blocking(&store, |s| s.create_conversation("")).await {
                        Ok(id) => {
                            chat.conversation = id;
                            chat.pre_prefill().consumed();
                        }
                        Err(e) => sink.error("starting a conversation", e),
                    }
                }
                list(&store, &sink).await;
                open(&store, &sink, chat.conversation).await;
            }
            Command::Stop => {}
            Command::Send(text) => {
                typing_until = None;
                let conv = chat.conversation;
                let title: String = text.chars().take(TITLE_CHARS).collect();
                if let Err(e) = blocking(&store, move |s| {
                    if s.conversation(conv)?.is_some_and(|c| c.title.is_empty()) {
                        s.set_title(conv, &title)?;
                    }
                    Ok(())
                })
                .await
                {
                    sink.error("naming the conversation", e);
                }
                let mut so_far = String::new();
                let mut turn = Box::pin(chat.send(&text, |t| {
                    so_far.push_str(t);
                    sink.send(Event::Delta(t.to_owned()));
                }));
                let outcome = loop {
                    tokio::select! {
                        r = &mut turn => break Some(r),
                        c = rx.recv() => match c {
                            Some(Command::Stop) | None => break None,
                            Some(Command::Keystroke { draft, .. }) => {
                                typed_while_streaming = true;
                                chat.draft(&draft);
                            }
                            Some(Command::InputCleared) => typed_while_streaming = false,
                            Some(other) => sink.error("while the answer streams", format!("{} waits until the answer is done or stopped", describe(&other))),
                        },
                    }
                };
                // Dropping the turn drops its stream: the daemon stops at the next token.
                drop(turn);
                match outcome {
                    Some(Ok(done)) => sink.send(Event::AnswerDone { text: done.text.clone(), stats: stats(&done) }),
                    Some(Err(e)) => sink.send(Event::AnswerFailed(plain_chat(&e))),
                    None => {
                        chat.pre_prefill().consumed();
                        // The dropped turn handed exactly what was shown to the store's writer
                        // (kept, flagged incomplete): wait until it is on disk.
                        if let Err(e) = chat.saved().await {
                            sink.error("saving the stopped answer", plain_chat(&e));
                        }
                        sink.send(Event::AnswerStopped { text: so_far });
                    }
                }
                list(&store, &sink).await;
                if std::mem::take(&mut typed_while_streaming) {
                    typing_until = Some(Instant::now() + opts.typing_idle);
                    if let Err(e) = chat.typing_started() {
                        sink.error("warming up the answer", plain_chat(&e));
                    }
                }
            }
            other => sink.error("chat", format!("{} is not a chat command", describe(&other))),
        }
    }
}

fn describe(c: &Command) -> &'static str {
    match c {
        Command::NewConversation => "A new conversation",
        Command::OpenConversation(_) => "Opening another conversation",
        Command::Send(_) => "Another message",
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
    let mut phase = chat.pre_prefill().watch();
    let s = sink.clone();
    tokio::spawn(async move {
        s.send(Event::Phase(*phase.borrow_and_update()));
        while phase.changed().await.is_ok() {
            s.send(Event::Phase(*phase.borrow_and_update()));
        }
    });
    let mut gates = chat.gates().subscribe();
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
