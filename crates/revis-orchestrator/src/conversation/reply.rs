//! Saving a reply while it streams, without losing what was shown: every
//! store write goes to one writer thread (sled blocks and fsyncs, so never on
//! the async runtime; one thread, so the writes land in the order they were
//! made), and [`OpenReply`] is a drop guard that hands the text shown so far
//! to that thread when the turn ends any way but complete: Stop or Ctrl-C
//! dropping the turn's future, a failed or dropped stream. The thread outlives
//! the dropped future; a process about to exit waits for it with
//! [`Writer::saved`].

use std::sync::mpsc;
use std::time::{Duration, Instant};

use revis_store::{MessageId, Store, StoreError};
use tokio::sync::oneshot;

use super::error::ChatError;

/// One write, with the store handle it goes to (the thread keeps none between
/// writes, so the database closes as soon as its last user is done with it).
struct Job {
    store: Store,
    op: Op,
}

enum Op {
    /// The text so far, not flushed (periodic).
    Save { id: MessageId, text: String },
    /// The reply was cut short: exactly the text shown, still incomplete, flushed.
    Cut { id: MessageId, text: String },
    /// The final text, complete, flushed; the outcome goes back.
    Complete { id: MessageId, text: String, done: oneshot::Sender<Result<(), StoreError>> },
    /// Answered when every write before it is done, with the first cut that failed since the last barrier.
    Barrier(oneshot::Sender<Option<StoreError>>),
}

/// The handle to the writer thread; cheap to clone. The thread ends when the
/// last handle is dropped, after the writes already handed to it.
#[derive(Clone)]
pub(crate) struct Writer {
    tx: mpsc::Sender<Job>,
}

impl Writer {
    /// Starts the writer thread.
    pub(crate) fn start() -> Writer {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("revis-reply-writer".into())
            .spawn(move || {
                let mut failed: Option<StoreError> = None;
                for Job { store, op } in rx {
                    match op {
                        Op::Save { id, text } => {
                            if let Err(e) = store.update_reply(id, &text) {
                                tracing::warn!("saving the partial reply {id} failed: {e}");
                            }
                        }
                        Op::Cut { id, text } => {
                            if let Err(e) = store.cut_reply(id, &text) {
                                tracing::warn!("saving the cut reply {id} failed: {e}");
                                failed.get_or_insert(e);
                            }
                        }
                        // The handle is dropped before the answer goes back: whoever waited
                        // may close the database and open it again at once.
                        Op::Complete { id, text, done } => {
                            let r = store.complete_reply(id, &text);
                            drop(store);
                            let _ = done.send(r);
                        }
                        Op::Barrier(done) => {
                            drop(store);
                            let _ = done.send(failed.take());
                        }
                    }
                }
            })
            .expect("the OS refused a thread for the reply writer");
        Writer { tx }
    }

    fn send(&self, store: &Store, op: Op) {
        // The thread only ends when every handle is gone, so this cannot fail while `self` exists.
        let _ = self.tx.send(Job { store: store.clone(), op });
    }

    /// Resolves when every write handed over so far is done; fails with the
    /// first cut reply that could not be saved since the last call.
    pub(crate) async fn saved(&self, store: &Store) -> Result<(), ChatError> {
        let (tx, rx) = oneshot::channel();
        self.send(store, Op::Barrier(tx));
        match rx.await {
            Ok(None) => Ok(()),
            Ok(Some(e)) => Err(e.into()),
            Err(_) => Err(ChatError::Writer("the reply writer thread ended".into())),
        }
    }
}

/// A reply whose stream is open. Feed it every piece of text as it is shown
/// ([`OpenReply::shown`]); end it with [`OpenReply::complete`]. Dropped any
/// other way, it saves the text shown as cut short.
pub(crate) struct OpenReply {
    writer: Writer,
    store: Store,
    id: MessageId,
    shown: String,
    save_every: Duration,
    saved_at: Instant,
    open: bool,
}

impl OpenReply {
    pub(crate) fn new(writer: Writer, store: Store, id: MessageId, save_every: Duration) -> OpenReply {
        OpenReply::resume(writer, store, id, String::new(), save_every)
    }

    /// A reply that already shows `shown` (one cut off, now continued): what
    /// is shown next follows it, and however this ends, it is saved with it.
    pub(crate) fn resume(writer: Writer, store: Store, id: MessageId, shown: String, save_every: Duration) -> OpenReply {
        OpenReply { writer, store, id, shown, save_every, saved_at: Instant::now(), open: true }
    }

    /// The text shown so far.
    pub(crate) fn text(&self) -> &str {
        &self.shown
    }

    /// `text` was handed to the user. Every `save_every` the text so far is
    /// also saved (unflushed), so a crash of the whole machine loses little.
    pub(crate) fn shown(&mut self, text: &str) {
        self.shown.push_str(text);
        if self.saved_at.elapsed() >= self.save_every {
            self.saved_at = Instant::now();
            self.writer.send(&self.store, Op::Save { id: self.id, text: self.shown.clone() });
        }
    }

    /// The stream failed: saves what was shown as cut short, and waits for it.
    pub(crate) async fn cut(mut self) -> Result<(), ChatError> {
        self.close_cut();
        self.writer.saved(&self.store).await
    }

    /// The stream ended: `final_text` is stored complete; waits for it.
    pub(crate) async fn complete(mut self, final_text: String) -> Result<(), ChatError> {
        self.open = false;
        let (tx, rx) = oneshot::channel();
        self.writer.send(&self.store, Op::Complete { id: self.id, text: final_text, done: tx });
        rx.await.map_err(|_| ChatError::Writer("the reply writer thread ended".into()))??;
        Ok(())
    }

    fn close_cut(&mut self) {
        if std::mem::replace(&mut self.open, false) {
            self.writer.send(&self.store, Op::Cut { id: self.id, text: std::mem::take(&mut self.shown) });
        }
    }
}

impl Drop for OpenReply {
    fn drop(&mut self) {
        self.close_cut();
    }
}

/// The shortest span an answer must repeat, verbatim, to count as looping
/// (a sentence; a short phrase said over and over repeats a span this long
/// after a few times).
pub const LOOP_SPAN: usize = 64;

/// Whether the last [`LOOP_SPAN`] bytes of `text` occur in it earlier: the answer has started to repeat itself (the small models'
/// failure: one sentence twenty times until the token limit). Code is
/// exempt: it repeats itself legitimately.
pub fn repeats_itself(text: &str) -> bool {
    if text.len() <= LOOP_SPAN || text.contains("```") {
        return false;
    }
    let mut at = text.len() - LOOP_SPAN;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    // Found earlier, overlapping or not (a short phrase over and over overlaps itself).
    text.find(&text[at..]).is_some_and(|first| first < at)
}

#[cfg(test)]
mod loop_tests {
    use super::*;

    #[test]
    fn a_sentence_said_again_is_a_loop_and_a_plain_answer_is_not() {
        let sentence = "The capital of France is Paris, a city on the Seine with many museums. ";
        assert!(!repeats_itself(sentence));
        let twice = format!("{sentence}{sentence}");
        assert!(repeats_itself(&twice));
        // A short phrase over and over: caught once it is longer than the span.
        let stutter = "Je ne sape pas. ".repeat(6);
        assert!(repeats_itself(&stutter));
        let answer = "Paris is the capital of France. It has been the seat of government since the tenth century, \
                      and it is home to about two million people within the city limits.";
        assert!(!repeats_itself(answer));
        // Code repeats itself legitimately.
        let code = format!("```\n{}```", "    println!(\"{{}}\", value_of_the_thing);\n".repeat(4));
        assert!(!repeats_itself(&code));
        // Multi-byte text: the span starts on a character boundary.
        assert!(repeats_itself(&"Ça va très bien, merci beaucoup, et vous ? ".repeat(4)));
    }
}
