//! Terminal input for `revis chat`: line editing with rustyline on a thread
//! of its own, reporting the first keystroke of each new line (the typing
//! signal that starts the pre-prefill) as well as finished lines.

use std::sync::mpsc as std_mpsc;

use rustyline::error::ReadlineError;
use rustyline::{Cmd, ConditionalEventHandler, Event, EventContext, EventHandler, KeyCode, KeyEvent, Modifiers, RepeatCount};
use tokio::sync::mpsc;

#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// The first key of a new line was pressed.
    TypingStarted,
    /// Another key was pressed on a line being typed: the line as it reads
    /// after that key, as far as can be told (a character typed or deleted
    /// at its end; other edits give the line before the key).
    Typing(String),
    /// Enter: a whole line.
    Line(String),
    /// Ctrl-D, Ctrl-C or the end of input.
    End,
}

/// Reports the first keystroke of an empty line, and later ones (so a pause
/// in typing can be noticed), then lets rustyline handle the key as usual.
struct FirstKey(mpsc::UnboundedSender<Input>);

impl ConditionalEventHandler for FirstKey {
    fn handle(&self, event: &Event, _: RepeatCount, _: bool, ctx: &EventContext) -> Option<Cmd> {
        if !ctx.line().is_empty() {
            let _ = self.0.send(Input::Typing(draft_after(ctx.line(), ctx.pos(), event)));
        } else if starts_message(event) {
            let _ = self.0.send(Input::TypingStarted);
        }
        None
    }
}

/// The line as it will read after `event`, when that is plain: a character
/// typed, or Backspace, at the end of the line; otherwise the line as it is.
fn draft_after(line: &str, pos: usize, event: &Event) -> String {
    let mut out = line.to_owned();
    if pos != line.len() {
        return out;
    }
    if let Event::KeySeq(keys) = event {
        match keys.as_slice() {
            [KeyEvent(KeyCode::Char(c), m)] if !m.intersects(Modifiers::CTRL | Modifiers::ALT) => out.push(*c),
            [KeyEvent(KeyCode::Backspace, _)] => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// Whether a key pressed on an empty line begins a message: a character, a
/// paste, or a line recalled from history. Enter on nothing, Ctrl-D and
/// Ctrl-C (which end the chat), Esc, Tab and the like do not, so they start
/// no pre-prefill and hold no background work.
fn starts_message(event: &Event) -> bool {
    let Event::KeySeq(keys) = event else { return false };
    match keys.first() {
        Some(KeyEvent(KeyCode::Char(_), m)) => !m.intersects(Modifiers::CTRL | Modifiers::ALT),
        Some(KeyEvent(KeyCode::BracketedPasteStart | KeyCode::Up | KeyCode::Down, _)) => true,
        _ => false,
    }
}

/// Reads lines on a thread. After each `Line`, the thread waits for a
/// `next()` before showing the prompt again, so answers print undisturbed:
/// meanwhile keys typed are neither echoed into the answer nor lost
/// ([`hold_keys`]); the next prompt's line editor reads them, as a line
/// editor's type-ahead.
pub struct Terminal {
    pub events: mpsc::UnboundedReceiver<Input>,
    next: std_mpsc::Sender<()>,
    /// Prints above the line being edited (what arrives while the user types).
    printer: Option<Box<dyn rustyline::ExternalPrinter + Send>>,
    /// The terminal's settings while keys are held, to put back.
    held: Held,
}

/// The terminal's own settings, saved while [`hold_keys`] changed them.
type Held = std::sync::Arc<std::sync::Mutex<Option<libc::termios>>>;

/// While an answer prints: the terminal stops echoing keys and stops
/// waiting for whole lines (so they are readable at once by the next
/// prompt's editor), and Ctrl-C still signals (it stops the answer). Saves
/// the settings to put back in `held`; nothing when stdin is no terminal.
fn hold_keys(held: &Held) {
    // SAFETY: tcgetattr and tcsetattr on stdin with a termios of our own.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(0, &mut t) != 0 {
            return;
        }
        let saved = t;
        t.c_lflag &= !(libc::ECHO | libc::ICANON);
        t.c_cc[libc::VMIN] = 1;
        t.c_cc[libc::VTIME] = 0;
        if libc::tcsetattr(0, libc::TCSANOW, &t) == 0 {
            *held.lock().unwrap_or_else(|p| p.into_inner()) = Some(saved);
        }
    }
}

/// Puts back the settings [`hold_keys`] saved, if it did.
fn release_keys(held: &Held) {
    if let Some(saved) = held.lock().unwrap_or_else(|p| p.into_inner()).take() {
        // SAFETY: tcsetattr on stdin with the settings read from it.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &saved) };
    }
}

impl Drop for Terminal {
    /// The terminal as it was, even when revis ends while an answer prints
    /// (Ctrl-C), before the input thread could put it back.
    fn drop(&mut self) {
        release_keys(&self.held);
    }
}

impl Terminal {
    pub fn start(prompt: &'static str) -> rustyline::Result<Terminal> {
        let (tx, events) = mpsc::unbounded_channel();
        let (next, wait) = std_mpsc::channel::<()>();
        let mut editor = rustyline::DefaultEditor::new()?;
        editor.bind_sequence(Event::Any, EventHandler::Conditional(Box::new(FirstKey(tx.clone()))));
        let printer = editor.create_external_printer().ok().map(|p| Box::new(p) as Box<dyn rustyline::ExternalPrinter + Send>);
        let held = Held::default();
        let keys = held.clone();
        std::thread::Builder::new()
            .name("revis-input".into())
            .spawn(move || {
                loop {
                    match editor.readline(prompt) {
                        Ok(line) => {
                            if !line.trim().is_empty() {
                                let _ = editor.add_history_entry(line.as_str());
                            }
                            hold_keys(&keys);
                            let go_on = tx.send(Input::Line(line)).is_ok() && wait.recv().is_ok();
                            release_keys(&keys);
                            if !go_on {
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
        Ok(Terminal { events, next, printer, held })
    }

    /// Prints `text` (a whole line or more) without breaking the line being typed.
    pub fn print(&mut self, text: String) {
        match &mut self.printer {
            Some(p) => {
                if p.print(text.clone()).is_err() {
                    println!("{text}");
                }
            }
            None => println!("{text}"),
        }
    }

    /// Shows the prompt for the next line.
    pub fn next(&self) {
        let _ = self.next.send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode, m: Modifiers) -> Event {
        Event::KeySeq(vec![KeyEvent(code, m)])
    }

    #[test]
    fn the_draft_is_the_line_after_a_plain_key_at_its_end() {
        assert_eq!(draft_after("hell", 4, &key(KeyCode::Char('o'), Modifiers::NONE)), "hello");
        assert_eq!(draft_after("hello", 5, &key(KeyCode::Backspace, Modifiers::NONE)), "hell");
        assert_eq!(draft_after("hllo", 1, &key(KeyCode::Char('e'), Modifiers::NONE)), "hllo", "an edit inside the line: as it was");
        assert_eq!(draft_after("hello", 5, &KeyEvent::ctrl('W').into()), "hello");
    }

    #[test]
    fn only_keys_that_begin_a_message_start_typing() {
        assert!(starts_message(&key(KeyCode::Char('W'), Modifiers::SHIFT)));
        assert!(starts_message(&key(KeyCode::Char('w'), Modifiers::NONE)));
        assert!(starts_message(&key(KeyCode::BracketedPasteStart, Modifiers::NONE)));
        assert!(starts_message(&key(KeyCode::Up, Modifiers::NONE)), "a line recalled from history");
        assert!(!starts_message(&KeyEvent::ctrl('D').into()), "Ctrl-D ends the chat");
        assert!(!starts_message(&KeyEvent::ctrl('C').into()));
        assert!(!starts_message(&key(KeyCode::Enter, Modifiers::NONE)), "Enter on nothing sends nothing");
        assert!(!starts_message(&key(KeyCode::Esc, Modifiers::NONE)));
        assert!(!starts_message(&key(KeyCode::Char('x'), Modifiers::ALT)));
    }
}
