//! Stop strings over streamed text: text that might be the start of a stop
//! string is held back until it is known not to be one, so a stop string is
//! never sent, not even in part.

/// Filters streamed text against a set of stop strings.
#[derive(Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What [`StopMatcher::push`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Keep going; this text is safe to send.
    No(String),
    /// A stop string matched; this is the text before it. Generation ends.
    Yes(String),
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    pub fn push(&mut self, text: &str) -> Stopped {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return Stopped::No(std::mem::take(&mut self.held));
        }
        // Earliest full match wins.
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let before = self.held[..at].to_owned();
            self.held.clear();
            return Stopped::Yes(before);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut keep_from = self.held.len();
        for (i, _) in self.held.char_indices() {
            let tail = &self.held[i..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                keep_from = i;
                break;
            }
        }
        let out = self.held[..keep_from].to_owned();
        self.held.drain(..keep_from);
        Stopped::No(out)
    }

    /// The stream ended without a match: whatever was held back is plain text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                Stopped::No(t) => out.push_str(&t),
                Stopped::Yes(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_split_across_pieces_is_never_sent() {
        assert_eq!(run(&["\nUser:"], &["Hello", "\nUs", "er:", " more"]), ("Hello".into(), true));
    }

    #[test]
    fn false_start_is_released() {
        assert_eq!(run(&["END"], &["The E", "nd", " is near"]), ("The End is near".into(), false));
    }

    #[test]
    fn no_stops_passes_everything() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    /// What was sent never ends with the start of a stop string, so an
    /// answer continued elsewhere from the text already sent (the
    /// dispatcher's fallback) still sees any stop string whole.
    #[test]
    fn sent_text_never_ends_with_the_start_of_a_stop_string() {
        let stops = ["\nUser:", "END", "aab"];
        let text = "Hello\nUs then aa b and EN then \nUser: rest";
        for cut in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
            let mut sent = String::new();
            for piece in [&text[..cut], &text[cut..]] {
                match m.push(piece) {
                    Stopped::No(t) => sent.push_str(&t),
                    Stopped::Yes(t) => {
                        sent.push_str(&t);
                        break;
                    }
                }
                let open = (1..=sent.len())
                    .filter(|&n| sent.is_char_boundary(sent.len() - n))
                    .any(|n| stops.iter().any(|s| n < s.len() && s.starts_with(&sent[sent.len() - n..])));
                assert!(!open, "cut {cut}: sent {sent:?} ends with the start of a stop string");
            }
            assert_eq!(sent, "Hello\nUs then aa b and EN then ", "cut {cut}");
        }
    }

    #[test]
    fn earliest_of_several_matches() {
        assert_eq!(run(&["cd", "b"], &["abcd"]), ("a".into(), true));
    }
}
