//! A Generate's events folded into its finished answer: the prompt's length
//! and each piece of text handed on as they come, the deltas'
//! log-probabilities gathered, and the final [`Done`] completed with them.
//! Every loop that reads a Generate to its end folds through [`DoneFold`],
//! whatever it does besides (deadlines, retries, drafts).

use crate::api::{Done, Event, TokenLogprob};

/// What a Generate's events have carried so far that its [`Done`] does not:
/// the log-probabilities of the deltas (the daemon's Done has none).
#[derive(Debug, Default)]
pub struct DoneFold {
    logprobs: Vec<TokenLogprob>,
}

impl DoneFold {
    pub fn new() -> DoneFold {
        DoneFold::default()
    }

    /// Takes one event: a start's prompt length goes to `on_started`, a
    /// delta's text and token count to `on_text` (its log-probabilities are
    /// kept). The Done, which ends the answer, comes back with the
    /// log-probabilities gathered ([`Done::logprobs`]); any other event gives `None`.
    pub fn push(&mut self, event: Event, mut on_started: impl FnMut(u32), mut on_text: impl FnMut(&str, u32)) -> Option<Done> {
        match event {
            Event::Started { prompt_tokens, .. } => on_started(prompt_tokens),
            Event::Delta { text, tokens, logprobs } => {
                self.logprobs.extend(logprobs);
                on_text(&text, tokens);
            }
            Event::Done(done) => return Some(Done { logprobs: std::mem::take(&mut self.logprobs), ..done }),
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(text: &str, logprob: f64) -> Event {
        Event::Delta { text: text.into(), tokens: 1, logprobs: vec![TokenLogprob { logprob, ..TokenLogprob::default() }] }
    }

    #[test]
    fn the_done_carries_every_deltas_log_probabilities_and_the_text_goes_out_in_order() {
        let mut fold = DoneFold::new();
        let (mut started, mut text, mut tokens) = (None, String::new(), 0);
        let mut push = |fold: &mut DoneFold, ev| {
            fold.push(
                ev,
                |n| started = Some(n),
                |t, n| {
                    text.push_str(t);
                    tokens += n;
                },
            )
        };
        assert!(push(&mut fold, Event::Started { model: "m".into(), prompt_tokens: 7 }).is_none());
        assert!(push(&mut fold, delta("Hel", -0.5)).is_none());
        assert!(push(&mut fold, delta("lo", -1.5)).is_none());
        let done = push(&mut fold, Event::Done(Done { text: "Hello".into(), ..Done::default() })).unwrap();
        assert_eq!((started, text.as_str(), tokens), (Some(7), "Hello", 2));
        assert_eq!(done.logprobs.iter().map(|l| l.logprob).collect::<Vec<_>>(), [-0.5, -1.5]);
        assert_eq!(done.text, "Hello");
    }
}
