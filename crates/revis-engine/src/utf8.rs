//! Incremental UTF-8 decoding of token pieces: a character split across
//! tokens is held back until it is whole, so every emitted piece is valid text.

/// Turns a stream of byte pieces into valid UTF-8 text.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds `bytes` and returns the text that is now complete. Bytes that can
    /// never become valid UTF-8 are replaced by U+FFFD; an incomplete
    /// character at the end is kept for the next call.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // SAFETY-free: `valid` was just checked by from_utf8.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let len = self.pending.len();
        self.pending.drain(..len - keep);
        out
    }

    /// Ends the stream: an incomplete character left over becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn holds_back_a_split_character() {
        let mut s = Utf8Stream::default();
        let bytes = "日本".as_bytes();
        assert_eq!(s.push(&bytes[..2]), "");
        assert_eq!(s.push(&bytes[2..4]), "日");
        assert_eq!(s.push(&bytes[4..]), "本");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn replaces_invalid_bytes_and_goes_on() {
        let mut s = Utf8Stream::default();
        assert_eq!(s.push(b"a\xffb"), "a\u{FFFD}b");
        assert_eq!(s.push(b"\xe6\x97"), "");
        assert_eq!(s.finish(), "\u{FFFD}");
    }

    proptest! {
        #[test]
        fn any_split_of_valid_text_round_trips(text in "\\PC{0,40}", cuts in proptest::collection::vec(0usize..200, 0..8)) {
            let bytes = text.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut s = Utf8Stream::default();
            let mut out = String::new();
            let mut prev = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                out.push_str(&s.push(&bytes[prev..c]));
                prev = c;
            }
            out.push_str(&s.finish());
            prop_assert_eq!(out, text);
        }
    }
}
