//! Bits per byte of plain text under each model and under word-level
//! mixtures of them. Pure functions over the scores, no I/O.
//!
//! A text is scored as the continuation of its first word, so every model
//! is charged for the same bytes whatever its tokenizer (and whether or not
//! it begins with a BOS token). Bits per byte = −Σ ln p / ln 2 / bytes.
//!
//! The mixture works on words, never on token ids: a word is a run of
//! whitespace followed by a run of non-whitespace (`" ready"`), so both
//! vocabularies can be compared. A model's probability of a word is the
//! product of its tokens' probabilities, which is exact when its tokens
//! begin and end on word boundaries; where some model's token straddles a
//! boundary, the words on either side are joined into one unit for every
//! model, so each unit is scored by whole tokens of each model (counted and
//! reported). Each model's probability of a unit is its canonical
//! tokenization's, as bits per byte always are.
//!
//! Three mixtures, all proper language models, so their bits per byte are
//! comparable with each model's (equal weights throughout, w_m = 1/M):
//! - per word: `P(unit) = Σ_m w_m P_m(unit | text so far)`; it costs at
//!   most log2(M) bits per unit over the better model for that unit, and
//!   can beat both.
//! - gated per word (`merge`'s rule): the first model (the drafter) alone,
//!   except at units where its likeliest first token has a probability
//!   under the gate, where the per-word mixture is used. The gate is read
//!   at the unit's first position only, from the context, never from the
//!   word that follows, so the result stays a distribution.
//! - per text (Bayes): `P(text) = Σ_m w_m P_m(text)`, the weights following
//!   the posterior over the text so far; at most log2(M) bits per text over
//!   the better model for that text.

use revis_client::TokenLogprob;

/// One text's scores.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TextBits {
    /// Bytes scored (the continuation).
    pub bytes: usize,
    /// Natural-log probability of the continuation under each model.
    pub models: Vec<f64>,
    /// Under the per-word mixture with equal weights.
    pub per_word: f64,
    /// Under the gated per-word mixture, and at how many units the gate opened.
    pub gated: f64,
    pub opened: usize,
    /// Under the per-text (Bayes) mixture with equal prior weights.
    pub per_text: f64,
    /// Words in the continuation, and units after joining where a token straddles a boundary.
    pub words: usize,
    pub units: usize,
}

/// Where the words of `text` begin (byte offsets, the first is 0).
pub fn word_starts(text: &str) -> Vec<usize> {
    let mut starts = vec![0];
    let mut prev_space = true;
    for (i, c) in text.char_indices() {
        let space = c.is_whitespace();
        if space && !prev_space && i > 0 {
            starts.push(i);
        }
        prev_space = space;
    }
    if text.is_empty() {
        starts.clear();
    }
    starts
}

/// The bits per byte figures of one continuation, or why they cannot be
/// had: a model's tokens that do not spell the continuation, or a drafter
/// (the first model) whose tokens came without their likeliest alternative.
pub fn text_bits(continuation: &str, models: &[&[TokenLogprob]], gate: f32) -> Result<TextBits, String> {
    let len = continuation.len();
    let starts = word_starts(continuation);
    // Each model's token boundaries.
    let mut bounds: Vec<Vec<usize>> = Vec::with_capacity(models.len());
    for (m, tokens) in models.iter().enumerate() {
        let spelled: Vec<u8> = tokens.iter().flat_map(|t| t.piece.iter().copied()).collect();
        if spelled != continuation.as_bytes() {
            return Err(format!(
                "model {}'s tokens spell {:?}, not the continuation {:?}",
                m + 1,
                String::from_utf8_lossy(&spelled),
                continuation
            ));
        }
        let mut at = 0;
        let mut b = Vec::with_capacity(tokens.len());
        for t in tokens.iter() {
            b.push(at);
            at += t.piece.len();
        }
        bounds.push(b);
    }
    // Units: word starts that every model's tokens also start at.
    let units: Vec<usize> = starts.iter().copied().filter(|s| bounds.iter().all(|b| b.binary_search(s).is_ok())).collect();
    let unit_of = |offset: usize| units.partition_point(|&u| u <= offset).saturating_sub(1);
    let mut per_unit = vec![vec![0.0f64; units.len()]; models.len()];
    for (m, tokens) in models.iter().enumerate() {
        for (t, &at) in tokens.iter().zip(&bounds[m]) {
            per_unit[m][unit_of(at)] += t.logprob;
        }
    }
    // Where the drafter is unsure: its likeliest token at each unit's first position.
    let drafter = models.first().copied().unwrap_or_default();
    let mut unsure = Vec::with_capacity(units.len());
    for &u in &units {
        let i = bounds.first().map_or(0, |b| b.partition_point(|&x| x < u));
        match drafter.get(i).and_then(|t| t.top.first()) {
            Some(top) => unsure.push(top.logprob < f64::from(gate).ln()),
            None => return Err(format!("the drafter's token at byte {u} came without its likeliest alternative")),
        }
    }
    let w = (1.0 / models.len() as f64).ln();
    let totals: Vec<f64> = per_unit.iter().map(|u| u.iter().sum()).collect();
    let mixed: Vec<f64> = (0..units.len()).map(|u| log_sum_exp(per_unit.iter().map(|lp| lp[u] + w))).collect();
    let gated = (0..units.len()).map(|u| if unsure[u] { mixed[u] } else { per_unit[0][u] }).sum();
    Ok(TextBits {
        bytes: len,
        models: totals.clone(),
        per_word: mixed.iter().sum(),
        gated,
        opened: unsure.iter().filter(|u| **u).count(),
        per_text: log_sum_exp(totals.iter().map(|t| t + w)),
        words: starts.len(),
        units: units.len(),
    })
}

fn log_sum_exp(xs: impl Iterator<Item = f64> + Clone) -> f64 {
    let max = xs.clone().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + xs.map(|x| (x - max).exp()).sum::<f64>().ln()
}

/// Bits per byte of a total natural-log probability over `bytes`.
pub fn bits_per_byte(logprob: f64, bytes: usize) -> f64 {
    -logprob / std::f64::consts::LN_2 / bytes.max(1) as f64
}

/// The first word of `text` (the prefix) and the rest (the continuation,
/// beginning with its whitespace); None when the text has one word only.
pub fn split_first_word(text: &str) -> Option<(&str, &str)> {
    let starts = word_starts(text);
    let at = *starts.get(1)?;
    Some((&text[..at], &text[at..]))
}

/// `merge`'s gate as the ensemble's settings have it by default: the
/// drafter's top token probability under which the members are mixed.
pub fn merge_gate() -> f32 {
    revis_client::ensemble::EnsembleSpec::default().gate
}

#[cfg(test)]
mod tests {
    use super::*;

    use revis_client::Alternative;

    /// Tokens with their log-probabilities; the likeliest alternative at each is `top` (a probability).
    fn toks(pieces: &[(&str, f64)], top: f64) -> Vec<TokenLogprob> {
        pieces
            .iter()
            .map(|(s, lp)| TokenLogprob {
                piece: s.as_bytes().to_vec(),
                logprob: *lp,
                top: vec![Alternative { piece: b"x".to_vec(), logprob: top.ln() }],
            })
            .collect()
    }

    #[test]
    fn words_begin_with_their_whitespace() {
        let t = " ready a  guinea pig ";
        let s = word_starts(t);
        let words: Vec<&str> = s.iter().zip(s.iter().skip(1).chain([&t.len()])).map(|(a, b)| &t[*a..*b]).collect();
        assert_eq!(words, [" ready", " a", "  guinea", " pig", " "]);
        assert_eq!(split_first_word("How do I"), Some(("How", " do I")));
        assert_eq!(split_first_word("dresser"), None);
        assert_eq!(split_first_word("é\tb"), Some(("é", "\tb")));
    }

    #[test]
    fn the_mixture_is_per_word_and_never_worse_than_one_bit_per_word() {
        let a = toks(&[(" ready", -1.0), (" a", -5.0)], 0.1);
        let b = toks(&[(" re", -2.0), ("ady", -1.0), (" a", -0.5)], 0.1);
        let r = text_bits(" ready a", &[&a, &b], 0.5).unwrap();
        assert_eq!((r.words, r.units, r.bytes), (2, 2, 8));
        assert_eq!(r.models, vec![-6.0, -3.5]);
        let expect = (0.5 * (-1.0f64).exp() + 0.5 * (-3.0f64).exp()).ln() + (0.5 * (-5.0f64).exp() + 0.5 * (-0.5f64).exp()).ln();
        assert!((r.per_word - expect).abs() < 1e-12);
        // Model 1 is better on word 1, model 2 on word 2: the word mixture beats both.
        assert!(r.per_word > r.models[0] && r.per_word > r.models[1]);
        assert!(r.per_text <= r.models[1] && r.per_text >= r.models[1] - 2f64.ln() - 1e-12);
        // The drafter is unsure everywhere: the gated mixture is the mixture.
        assert_eq!((r.gated, r.opened), (r.per_word, 2));
    }

    #[test]
    fn the_gate_mixes_only_where_the_drafter_is_unsure_at_a_word_start() {
        let mut a = toks(&[(" ready", -1.0), (" a", -5.0)], 0.9);
        a[1].top[0].logprob = 0.2f64.ln();
        let b = toks(&[(" ready", -3.0), (" a", -0.5)], 0.9);
        let r = text_bits(" ready a", &[&a, &b], 0.5).unwrap();
        assert_eq!(r.opened, 1);
        let expect = -1.0 + (0.5 * (-5.0f64).exp() + 0.5 * (-0.5f64).exp()).ln();
        assert!((r.gated - expect).abs() < 1e-12);
        let no_top: Vec<TokenLogprob> = a.iter().map(|t| TokenLogprob { top: Vec::new(), ..t.clone() }).collect();
        assert!(text_bits(" ready a", &[&no_top, &b], 0.5).unwrap_err().contains("without its likeliest alternative"));
    }

    #[test]
    fn a_token_across_a_word_boundary_joins_the_words() {
        let a = toks(&[(" a", -1.0), (" b", -1.0), (" c", -1.0)], 0.1);
        let b = toks(&[(" a b", -1.5), (" c", -0.5)], 0.1);
        let r = text_bits(" a b c", &[&a, &b], 0.5).unwrap();
        assert_eq!((r.words, r.units), (3, 2));
        let expect = (0.5 * (-2.0f64).exp() + 0.5 * (-1.5f64).exp()).ln() + (0.5 * (-1.0f64).exp() + 0.5 * (-0.5f64).exp()).ln();
        assert!((r.per_word - expect).abs() < 1e-12);
    }

    #[test]
    fn tokens_that_do_not_spell_the_text_are_an_error() {
        let a = toks(&[("▁a", -1.0)], 0.1);
        let err = text_bits(" a", &[&a], 0.5).unwrap_err();
        assert!(err.contains("model 1's tokens spell"), "{err}");
        assert!((bits_per_byte(-2f64.ln() * 4.0, 2) - 2.0).abs() < 1e-12);
    }
}
