//! The ensemble's arithmetic, with no I/O: cutting a draft back to a word
//! boundary, comparing drafts per byte, the members' weights, and mixing
//! the members' probabilities of candidate next words.

use crate::api::TokenLogprob;

/// A member's draft of the next span, cut back to a word boundary.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub text: String,
    /// Natural-log probability of the kept tokens under the drafter's model
    /// (the turn's end included, when the span ends the answer).
    pub logprob: f64,
    /// Tokens kept.
    pub tokens: u32,
    /// The drafter ended the answer within the span (its turn ended, or a
    /// stop string came).
    pub ends: bool,
}

impl Span {
    /// Log-probability per byte: how sure the drafter is of it. A span
    /// with no text (the turn ends at once) counts as one byte.
    pub fn per_byte(&self) -> f64 {
        per_byte(self.logprob, self.text.len())
    }
}

/// Log-probability per byte; no text counts as one byte.
pub fn per_byte(logprob: f64, bytes: usize) -> f64 {
    logprob / bytes.max(1) as f64
}

fn starts_a_word(piece: &[u8]) -> bool {
    piece.first().is_some_and(|b| b.is_ascii_whitespace())
}

/// The span a draft of `tokens` gives. A draft that `ended` is kept whole
/// (`text`: what the daemon sent, a stop string already cut away). One that
/// ran out of tokens is cut before its last token that starts a word, so
/// the next round starts on a word boundary; a draft that is one long word
/// is kept up to its last whole character.
pub fn cut(tokens: &[TokenLogprob], text: &str, ended: bool) -> Span {
    if ended {
        return Span { text: text.to_owned(), logprob: tokens.iter().map(|t| t.logprob).sum(), tokens: tokens.len() as u32, ends: true };
    }
    let keep = (1..tokens.len()).rev().find(|&i| starts_a_word(&tokens[i].piece)).unwrap_or(tokens.len());
    let mut bytes: Vec<u8> = tokens[..keep].iter().flat_map(|t| t.piece.iter().copied()).collect();
    if let Err(e) = std::str::from_utf8(&bytes) {
        bytes.truncate(e.valid_up_to());
    }
    Span {
        text: String::from_utf8(bytes).unwrap_or_default(),
        logprob: tokens[..keep].iter().map(|t| t.logprob).sum(),
        tokens: keep as u32,
        ends: false,
    }
}

/// Index of the best of `scores` (the first on a tie, so equal inputs give
/// the same winner every time); None when empty.
pub fn best(scores: &[f64]) -> Option<usize> {
    let mut at: Option<usize> = None;
    for (i, &s) in scores.iter().enumerate() {
        if s.is_nan() {
            continue;
        }
        if at.is_none_or(|a| s > scores[a]) {
            at = Some(i);
        }
    }
    at
}

/// How fast a losing member's weight falls (multiplicative weights:
/// w ← w·e^(−η·loss)).
pub const LEARNING_RATE: f64 = 0.3;
/// No weight falls below this share, so a member that faded out can come
/// back when its drafts start winning again.
pub const WEIGHT_FLOOR: f64 = 0.02;

/// The members' weights in `cross`: they follow how often each member's
/// drafts win, so a weak member fades out instead of dragging the answer
/// down.
#[derive(Clone, Debug, PartialEq)]
pub struct Weights(Vec<f64>);

impl Weights {
    pub fn equal(n: usize) -> Weights {
        Weights(vec![1.0 / n.max(1) as f64; n])
    }

    pub fn get(&self, i: usize) -> f64 {
        self.0.get(i).copied().unwrap_or(0.0)
    }

    pub fn as_slice(&self) -> &[f64] {
        &self.0
    }

    /// One round's outcome: `won[i]` says whether member i's draft won (a
    /// member whose draft was the same text as the winner's won too);
    /// None for a member that sat the round out, whose weight stays.
    pub fn update(&mut self, won: &[Option<bool>]) {
        if !won.contains(&Some(false)) {
            return;
        }
        for (w, outcome) in self.0.iter_mut().zip(won) {
            if *outcome == Some(false) {
                *w *= (-LEARNING_RATE).exp();
            }
        }
        let total: f64 = self.0.iter().sum();
        if total <= 0.0 {
            return;
        }
        self.0.iter_mut().for_each(|w| *w /= total);
        // Those under the floor are lifted to it, the others give the
        // difference in proportion to their weight; the sum stays 1.
        let lifted = self.0.iter().filter(|w| **w < WEIGHT_FLOOR).count() as f64 * WEIGHT_FLOOR;
        let rest: f64 = self.0.iter().filter(|w| **w >= WEIGHT_FLOOR).sum();
        if lifted > 0.0 && rest > 0.0 {
            let scale = (1.0 - lifted) / rest;
            self.0.iter_mut().for_each(|w| *w = if *w < WEIGHT_FLOOR { WEIGHT_FLOOR } else { *w * scale });
        }
    }
}

/// `cross`: each candidate's weighted sum of the members' per-byte
/// log-probabilities. `scores[m][c]` is member m's per-byte log-probability
/// of candidate c, None where m could not score it (it sat out); the
/// weights of those that did are renormalised per candidate.
pub fn cross(scores: &[Vec<Option<f64>>], weights: &Weights, candidates: usize) -> Vec<f64> {
    (0..candidates)
        .map(|c| {
            let (mut sum, mut total) = (0.0, 0.0);
            for (m, row) in scores.iter().enumerate() {
                if let Some(Some(s)) = row.get(c) {
                    sum += weights.get(m) * s;
                    total += weights.get(m);
                }
            }
            if total > 0.0 { sum / total } else { f64::NEG_INFINITY }
        })
        .collect()
}

/// `merge`: the mixture's probability of each candidate next word: the
/// weighted mean of the members' probabilities of that text. `logprobs[m][c]`
/// as in [`cross`], but whole log-probabilities, not per byte.
pub fn mix(logprobs: &[Vec<Option<f64>>], weights: &Weights, candidates: usize) -> Vec<f64> {
    (0..candidates)
        .map(|c| {
            let (mut p, mut total) = (0.0, 0.0);
            for (m, row) in logprobs.iter().enumerate() {
                if let Some(Some(lp)) = row.get(c) {
                    p += weights.get(m) * lp.exp();
                    total += weights.get(m);
                }
            }
            if total > 0.0 { p / total } else { 0.0 }
        })
        .collect()
}

/// The first position where the drafter is unsure: its likeliest token has
/// a probability under `gate`. Needs each token's alternatives.
pub fn unsure_at(tokens: &[TokenLogprob], gate: f32) -> Option<usize> {
    let gate = f64::from(gate).ln();
    tokens.iter().position(|t| t.top.first().is_some_and(|a| a.logprob < gate))
}

/// The candidate next words at an unsure position: the drafter's
/// alternatives there, as text (pieces that are not whole characters, or
/// have no text, are left out; duplicates once).
pub fn candidates(at: &TokenLogprob) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for a in &at.top {
        if let Ok(text) = std::str::from_utf8(&a.piece)
            && !text.is_empty()
            && !out.iter().any(|o| o == text)
        {
            out.push(text.to_owned());
        }
    }
    out
}

/// The text of `tokens` (their pieces joined), up to its last whole character.
pub fn text_of(tokens: &[TokenLogprob]) -> String {
    let mut bytes: Vec<u8> = tokens.iter().flat_map(|t| t.piece.iter().copied()).collect();
    if let Err(e) = std::str::from_utf8(&bytes) {
        bytes.truncate(e.valid_up_to());
    }
    String::from_utf8(bytes).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Alternative;

    fn tok(piece: &str, logprob: f64) -> TokenLogprob {
        TokenLogprob { piece: piece.as_bytes().to_vec(), logprob, top: Vec::new() }
    }

    #[test]
    fn a_draft_that_ran_out_is_cut_before_its_last_word() {
        let tokens = [tok(" The", -1.0), tok(" capital", -0.5), tok(" is", -0.25), tok(" Par", -2.0)];
        let span = cut(&tokens, " The capital is Par", false);
        assert_eq!(span, Span { text: " The capital is".into(), logprob: -1.75, tokens: 3, ends: false });
        assert!((span.per_byte() - (-1.75 / 15.0)).abs() < 1e-12);
        // A draft that ended is kept whole, with the turn's end counted.
        let ended = [tok(" Paris", -0.1), tok(".", -0.2), tok("", -0.3)];
        let span = cut(&ended, " Paris.", true);
        assert_eq!((span.text.as_str(), span.tokens, span.ends), (" Paris.", 3, true));
        assert!((span.logprob + 0.6).abs() < 1e-12);
    }

    #[test]
    fn one_long_word_is_kept_to_its_last_whole_character() {
        // "é" is two bytes; the draft stops after its first.
        let tokens = [
            TokenLogprob { piece: b" caf".to_vec(), logprob: -1.0, top: vec![] },
            TokenLogprob { piece: vec![0xC3], logprob: -0.5, top: vec![] },
        ];
        let span = cut(&tokens, "", false);
        assert_eq!(span.text, " caf");
        assert_eq!(text_of(&tokens), " caf");
    }

    #[test]
    fn the_best_score_wins_and_ties_go_to_the_first() {
        assert_eq!(best(&[-1.0, -0.5, -0.5]), Some(1));
        assert_eq!(best(&[f64::NAN, -3.0]), Some(1));
        assert_eq!(best(&[]), None);
    }

    #[test]
    fn a_member_that_keeps_losing_fades_but_never_vanishes() {
        let mut w = Weights::equal(2);
        for _ in 0..50 {
            w.update(&[Some(true), Some(false)]);
        }
        assert!(w.get(0) > 0.95, "{w:?}");
        assert!((w.get(1) - WEIGHT_FLOOR).abs() < 1e-12, "{w:?}");
        assert!((w.as_slice().iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // Sitting a round out changes nothing.
        let before = w.clone();
        w.update(&[None, None]);
        assert_eq!(w, before);
        // Winning again brings it back.
        for _ in 0..30 {
            w.update(&[Some(false), Some(true)]);
        }
        assert!(w.get(1) > 0.5, "{w:?}");
    }

    #[test]
    fn cross_weighs_each_members_view_and_skips_who_sat_out() {
        // Member 0 prefers candidate 0, member 1 strongly prefers candidate 1.
        let scores = vec![vec![Some(-0.1), Some(-0.2)], vec![Some(-2.0), Some(-0.1)]];
        let equal = cross(&scores, &Weights::equal(2), 2);
        assert_eq!(best(&equal), Some(1));
        // With member 1 faded out, member 0 decides.
        let mut w = Weights::equal(2);
        for _ in 0..20 {
            w.update(&[Some(true), Some(false)]);
        }
        assert_eq!(best(&cross(&scores, &w, 2)), Some(0));
        // A member that could not score counts for nothing.
        let partial = vec![vec![Some(-0.1), Some(-0.2)], vec![None, None]];
        assert_eq!(cross(&partial, &Weights::equal(2), 2), vec![-0.1, -0.2]);
    }

    #[test]
    fn the_mixture_averages_probabilities_not_logs() {
        let lp = vec![vec![Some(0.5f64.ln()), Some(0.4f64.ln())], vec![Some(0.1f64.ln()), Some(0.3f64.ln())]];
        let p = mix(&lp, &Weights::equal(2), 2);
        assert!((p[0] - 0.3).abs() < 1e-12 && (p[1] - 0.35).abs() < 1e-12, "{p:?}");
        assert_eq!(best(&p), Some(1));
    }

    #[test]
    fn unsure_positions_and_their_candidates() {
        let alt = |piece: &str, p: f64| Alternative { piece: piece.as_bytes().to_vec(), logprob: p.ln() };
        let sure = TokenLogprob { piece: b" The".to_vec(), logprob: 0.9f64.ln(), top: vec![alt(" The", 0.9), alt(" A", 0.05)] };
        let unsure = TokenLogprob {
            piece: b" Paris".to_vec(),
            logprob: 0.4f64.ln(),
            top: vec![
                alt(" Paris", 0.4),
                alt(" Lyon", 0.3),
                alt(" Paris", 0.1),
                alt("", 0.1),
                Alternative { piece: vec![0xC3], logprob: -3.0 },
            ],
        };
        assert_eq!(unsure_at(&[sure.clone(), unsure.clone()], 0.5), Some(1));
        assert_eq!(unsure_at(&[sure.clone(), unsure.clone()], 0.3), None);
        assert_eq!(candidates(&unsure), vec![" Paris".to_owned(), " Lyon".to_owned()]);
    }
}
