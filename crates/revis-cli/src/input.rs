//! Terminal input for `revis chat`: line editing with rustyline on a thread
//! of its own, reporting the first keystroke of each new line (the typing
//! signal that starts the pre-prefill) as well as finished lines.

use std::sync::mpsc as std_mpsc;

use rustyline::error::ReadlineError;
use rustyline::{Cmd, ConditionalEventHandler, Event, EventContext, EventHandler, RepeatCount};
use tokio::sync::mpsc;

#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// The first key of a new line was pressed.
    TypingStarted,
    /// Another key was pressed on a line being typed.
    Typing,
    /// Enter: a whole line.
    Line(String),
    /// Ctrl-D, Ctrl-C or the end of input.
    End,
}

/// Reports the first keystroke of an empty line, and later ones (so a pause
/// in typing can be noticed), then lets rustyline handle the key as usual.
struct FirstKey(mpsc::UnboundedSender<Input>);

impl ConditionalEventHandler for FirstKey {
    fn handle(&self, _: &Event, _: RepeatCount, _: bool, ctx: &EventContext) -> Option<Cmd> {
        let _ = self.0.send(if ctx.line().is_empty() { Input::TypingStarted } else { Input::Typing });
        None
    }
}

/// Reads lines on a thread. After each `Line`, the thread waits for a
/// `next()` before showing the prompt again, so answers print undisturbed.
pub struct Terminal {
    pub events: mpsc::UnboundedReceiver<Input>,
    next: std_mpsc::Sender<()>,
}

impl Terminal {
    pub fn start(prompt: &'static str) -> rustyline::Result<Terminal> {
        let (tx, events) = mpsc::unbounded_channel();
        let (next, wait) = std_mpsc::channel::<()>();
        let mut editor = rustyline::DefaultEditor::new()?;
        editor.bind_sequence(Event::Any, EventHandler::Conditional(Box::new(FirstKey(tx.clone()))));
        std::thread::Builder::new()
            .name("revis-input".into())
            .spawn(move || {
                loop {
                    match editor.readline(prompt) {
                        Ok(line) => {
                            if !line.trim().is_empty() {
                                let _ = editor.add_history_entry(line.as_str());
                            }
                            if tx.send(Input::Line(line)).is_err() || wait.recv().is_err() {
                                return;
                            }
                        }
                        Err(ReadlineError::Interrupted | ReadlineError::Eof) => {
                            let _ = tx.send(Input::End);
                            return;
                        }
                        Err(e) => {
                            eprintln!("revis: terminal input failed: {e}");
                            let _ = tx.send(Input::End);
                            return;
                        }
                    }
                }
            })
            .map_err(rustyline::error::ReadlineError::Io)?;
        Ok(Terminal { events, next })
    }

    /// Shows the prompt for the next line.
    pub fn next(&self) {
        let _ = self.next.send(());
    }
}
