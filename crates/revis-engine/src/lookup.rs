//! Speculation from the context (prompt lookup decoding), as pure logic.
//!
//! Much of what the orchestrator asks a model copies from its input (facts
//! quoted from the user's words, summaries, a continued answer). So the last
//! few tokens of the text so far are looked up earlier in the prompt and the
//! answer, and the tokens that followed them there are proposed as a draft.
//! The engine evaluates the last token and the draft in one batch and keeps
//! the longest prefix the model agrees with, plus the model's own next token.
//!
//! - [`find_draft`]: the n-gram lookup.
//! - [`Speculation`]: whether to draft at all and how long: it estimates how
//!   often a draft token is accepted and weighs that against what a batch of
//!   each size costs on this machine ([`BatchCosts`], measured as it runs), so
//!   it turns itself off where drafts are rarely right.
//! - Drafting stops when the sequence passes [`EXACT_CONTEXT`] tokens, where
//!   a batch stops decoding bit-identically to single tokens.
//! - Sampled answers: each position's token is [`draw`]n with one uniform
//!   number of its own, drafted or not, and a draft is kept exactly when it
//!   is the token drawn. It is kept with probability p(draft), as in
//!   speculative sampling with a one-token proposal, and the text is the one
//!   the seed gives without drafts (whether a draft is offered depends on
//!   what batches cost as the answer runs, so it must not decide the text).

use crate::Token;

/// The longest n-gram looked up; shorter ones are tried when it is not found.
pub const NGRAM_MAX: usize = 3;
/// The shortest n-gram looked up: single tokens match too often by chance.
pub const NGRAM_MIN: usize = 2;
/// The most draft tokens verified in one batch.
pub const MAX_DRAFT: usize = 8;
/// How far back the lookup searches, in tokens: it runs once per step.
pub const LOOKUP_WINDOW: usize = 4096;
/// Drafts are verified only while the sequence, draft included, is at most
/// this long. Past it, llama.cpp's CPU attention decodes a single token
/// another way than a batch (it splits the cache across threads once a
/// token attends over 512 cells or more, `nek1 >= 512` in ggml-cpu's
/// ops.cpp, and the cache is padded to 256 cells), so a verified draft
/// would no longer give bit-identical logits: measured after a 600-token
/// prompt, every row of batches of 2, 4 and 8 differed from single-token
/// decoding, with flash attention on and off
/// (`examples/batch_numerics.rs`), and a greedy answer changed words.
pub const EXACT_CONTEXT: usize = 256;

/// The tokens that followed the most recent earlier occurrence of the last
/// `n` tokens of `history` (the longest `n` from [`NGRAM_MAX`] down to
/// [`NGRAM_MIN`] that occurs), at most `max` of them. Empty when none occurs.
pub fn find_draft(history: &[Token], max: usize) -> &[Token] {
    let len = history.len();
    if max == 0 {
        return &[];
    }
    let floor = len.saturating_sub(LOOKUP_WINDOW);
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let key = &history[len - n..];
        // Starts of earlier occurrences, most recent first; the key itself
        // (starting at len - n) is not one.
        for start in (floor..len - n).rev() {
            if &history[start..start + n] == key {
                let from = start + n;
                return &history[from..(from + max).min(len)];
            }
        }
    }
    &[]
}

/// Mean decode time of a batch of each size from 1 to `MAX_DRAFT + 1`
/// tokens, on this model and machine, in microseconds. A size not measured
/// yet is estimated from a batch of one by [`PRIOR_SLOPE`].
#[derive(Clone, Debug)]
pub struct BatchCosts {
    us: [f64; MAX_DRAFT + 2],
    seen: [u32; MAX_DRAFT + 2],
}

/// Before a size is measured, a batch of n is taken to cost
/// `1 + PRIOR_SLOPE * (n - 1)` batches of one, a memory-bound machine's
/// figure. The probe at load measures every size before the first draft, so
/// it is rarely used (measured on the 2-core CPU here: 0.5 to 1.0).
pub const PRIOR_SLOPE: f64 = 0.15;
/// Weight of a new measurement in the running mean of a size's cost.
const COST_WEIGHT: f64 = 0.1;

impl Default for BatchCosts {
    fn default() -> Self {
        BatchCosts { us: [0.0; MAX_DRAFT + 2], seen: [0; MAX_DRAFT + 2] }
    }
}

impl BatchCosts {
    /// Records that a batch of `n` tokens took `us` microseconds.
    pub fn record(&mut self, n: usize, us: f64) {
        if n == 0 || n >= self.us.len() || !us.is_finite() || us <= 0.0 {
            return;
        }
        let w = if self.seen[n] < 10 { 1.0 / f64::from(self.seen[n] + 1) } else { COST_WEIGHT };
        self.us[n] += w * (us - self.us[n]);
        self.seen[n] = self.seen[n].saturating_add(1);
    }

    /// The cost of a batch of `n` relative to a batch of one.
    pub fn relative(&self, n: usize) -> f64 {
        let n = n.clamp(1, self.us.len() - 1);
        let prior = 1.0 + PRIOR_SLOPE * (n as f64 - 1.0);
        if n == 1 || self.seen[1] == 0 || self.seen[n] == 0 {
            return prior;
        }
        // Never below one batch of one: a batch of more tokens does not cost less.
        (self.us[n] / self.us[1]).max(1.0)
    }
}

/// Whether a generation drafts tokens from its context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Speculate {
    /// Plain decoding.
    Off,
    /// Draft where it is expected to pay ([`Speculation::plan`]).
    #[default]
    Auto,
    /// Draft whenever the lookup finds one (for comparisons and tests).
    Always,
}

impl std::str::FromStr for Speculate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Speculate::Off),
            "auto" => Ok(Speculate::Auto),
            "always" => Ok(Speculate::Always),
            _ => Err(format!("is \"{s}\"; it must be \"auto\", \"always\" or \"off\"")),
        }
    }
}

/// Drafting decisions for one generation.
#[derive(Clone, Debug)]
pub struct Speculation {
    always: bool,
    /// Running estimate of the chance that a draft token is accepted, given
    /// that the tokens before it were.
    accept: f64,
    /// Steps since the last draft was verified while drafting was off.
    idle: u32,
}

/// A generation starts assuming half of the draft tokens are right.
pub const PRIOR_ACCEPT: f64 = 0.5;
/// Weight of each verified draft token in the acceptance estimate.
const ACCEPT_WEIGHT: f64 = 0.15;
/// A draft is verified only if it is expected to give this much more than
/// plain decoding (so wrong estimates cost little).
pub const MARGIN: f64 = 0.03;
/// While drafting does not pay, one token is still drafted every this many
/// steps that have a draft, to notice when the text starts copying.
pub const PROBE_EVERY: u32 = 32;

impl Default for Speculation {
    fn default() -> Self {
        Speculation { always: false, accept: PRIOR_ACCEPT, idle: 0 }
    }
}

impl Speculation {
    /// Starts from an acceptance estimate (a session keeps the last
    /// generation's); with `always`, every draft found is verified.
    pub fn new(accept: f64, always: bool) -> Self {
        Speculation { always, accept: accept.clamp(0.0, 1.0), idle: 0 }
    }

    /// The acceptance estimate.
    pub fn acceptance(&self) -> f64 {
        self.accept
    }

    /// How many of `available` draft tokens to verify with the next token
    /// (0 = decode it alone): the length that gives the most tokens per unit
    /// of time, given the acceptance estimate and what batches cost.
    pub fn plan(&mut self, available: usize, costs: &BatchCosts) -> usize {
        let available = available.min(MAX_DRAFT);
        if available == 0 || self.always {
            return available;
        }
        let a = self.accept;
        let mut best = (0, 1.0 / costs.relative(1));
        // Expected tokens from verifying k drafts: 1 + a + a^2 + ... + a^k.
        let (mut expected, mut term) = (1.0, 1.0);
        for k in 1..=available {
            term *= a;
            expected += term;
            let rate = expected / costs.relative(k + 1);
            if rate > best.1 {
                best = (k, rate);
            }
        }
        if best.0 > 0 && best.1 >= (1.0 + MARGIN) / costs.relative(1) {
            self.idle = 0;
            return best.0;
        }
        self.idle += 1;
        if self.idle >= PROBE_EVERY {
            self.idle = 0;
            return 1;
        }
        0
    }

    /// Records a verified draft of `drafted` tokens of which the first
    /// `accepted` were right.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        let accepted = accepted.min(drafted);
        for _ in 0..accepted {
            self.accept += ACCEPT_WEIGHT * (1.0 - self.accept);
        }
        if accepted < drafted {
            self.accept -= ACCEPT_WEIGHT * self.accept;
        }
    }
}

/// Draws from `p` (tokens and probabilities summing to 1) with `u` uniform in [0, 1).
pub fn draw(p: &[(Token, f64)], u: f64) -> Token {
    let mut target = u;
    let mut last = p.first().map_or(0, |&(t, _)| t);
    for &(t, q) in p {
        if q <= 0.0 {
            continue;
        }
        last = t;
        if target < q {
            return t;
        }
        target -= q;
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn the_longest_ngram_found_gives_what_followed_it_most_recently() {
        // "a b c d ... a b c e ... a b c" → the most recent "a b c" was followed by e.
        let h = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 9, 1, 2, 3];
        assert_eq!(find_draft(&h, 2), &[5, 6]);
        assert_eq!(find_draft(&h, 8), &[5, 6, 9, 1, 2, 3], "a draft may run up to the end");
    }

    #[test]
    fn a_shorter_ngram_is_tried_when_the_longer_is_not_found() {
        let h = [7, 2, 3, 4, 1, 2, 3];
        // "1 2 3" occurs once (at the end); "2 3" occurred before, followed by 4.
        assert_eq!(find_draft(&h, 4), &[4, 1, 2, 3]);
        assert!(find_draft(&[1, 2, 3, 4], 4).is_empty(), "no repeated n-gram");
        assert!(find_draft(&[5, 5], 4).is_empty(), "single tokens are not looked up");
        assert!(find_draft(&[], 4).is_empty());
        assert!(find_draft(&[1, 2, 1, 2], 0).is_empty());
    }

    proptest! {
        #[test]
        fn a_draft_continues_an_earlier_occurrence_of_the_suffix(h in proptest::collection::vec(0u32..4, 0..60), max in 0usize..10) {
            let d = find_draft(&h, max);
            prop_assert!(d.len() <= max);
            if !d.is_empty() {
                // Some n-gram of the allowed sizes ends the history and occurs
                // earlier, followed by exactly the draft.
                let ok = (NGRAM_MIN..=NGRAM_MAX).any(|n| {
                    h.len() > n && (0..h.len() - n).any(|s| {
                        h[s..s + n] == h[h.len() - n..] && h[s + n..].starts_with(d)
                            && (d.len() == max || s + n + d.len() == h.len())
                    })
                });
                prop_assert!(ok, "draft {:?} of {:?}", d, h);
            }
        }
    }

    fn costs(slope: f64) -> BatchCosts {
        let mut c = BatchCosts::default();
        for n in 1..=MAX_DRAFT + 1 {
            c.record(n, 1000.0 * (1.0 + slope * (n as f64 - 1.0)));
        }
        c
    }

    #[test]
    fn drafts_are_long_when_they_are_accepted_and_cheap() {
        let mut s = Speculation::default();
        for _ in 0..20 {
            s.record(4, 4);
        }
        assert!(s.acceptance() > 0.9);
        assert_eq!(s.plan(20, &costs(0.05)), MAX_DRAFT);
        assert_eq!(s.plan(3, &costs(0.05)), 3, "never more than the lookup found");
    }

    #[test]
    fn drafting_stops_where_drafts_are_rejected_and_only_probes() {
        let mut s = Speculation::default();
        for _ in 0..20 {
            s.record(2, 0);
        }
        assert!(s.acceptance() < 0.05);
        let c = costs(0.1);
        let drafted: usize = (0..PROBE_EVERY as usize * 4).map(|_| s.plan(8, &c)).sum();
        assert_eq!(drafted, 4, "one token drafted every {PROBE_EVERY} steps");
    }

    #[test]
    fn always_verifies_every_draft_found() {
        let mut s = Speculation::new(0.0, true);
        assert_eq!(s.plan(5, &costs(1.0)), 5);
        assert_eq!(s.plan(20, &costs(1.0)), MAX_DRAFT);
        assert_eq!("always".parse::<Speculate>(), Ok(Speculate::Always));
        assert!("yes".parse::<Speculate>().unwrap_err().contains("\"auto\""));
    }

    #[test]
    fn expensive_batches_need_a_higher_acceptance() {
        let mut s = Speculation::default();
        // a = 0.5: three drafts give 1.875 tokens; worth it if a batch of 4 costs 1.3, not 2.5.
        assert!(s.plan(3, &costs(0.1)) > 0);
        assert_eq!(s.plan(3, &costs(0.5)), 0);
    }

    #[test]
    fn unmeasured_sizes_use_the_prior_and_a_batch_never_costs_less_than_one() {
        let mut c = BatchCosts::default();
        assert!((c.relative(3) - (1.0 + 2.0 * PRIOR_SLOPE)).abs() < 1e-9);
        c.record(1, 1000.0);
        c.record(3, 900.0);
        assert_eq!(c.relative(3), 1.0);
        c.record(0, 5.0);
        c.record(MAX_DRAFT + 2, 5.0);
        c.record(2, f64::NAN);
        assert!((c.relative(2) - (1.0 + PRIOR_SLOPE)).abs() < 1e-9);
    }

    /// Draws follow p (a chi-square test over many uniforms), so a draft,
    /// kept when it is the token drawn, is kept with probability p(draft).
    #[test]
    fn draws_follow_the_distribution() {
        let p = [(10, 0.5), (11, 0.25), (12, 0.15), (13, 0.07), (14, 0.03)];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let trials = 200_000;
        let mut counts = [0u32; 5];
        for _ in 0..trials {
            counts[(draw(&p, rng.random()) - 10) as usize] += 1;
        }
        let chi2: f64 = p
            .iter()
            .zip(counts)
            .map(|(&(_, q), n)| {
                let expected = q * trials as f64;
                (f64::from(n) - expected).powi(2) / expected
            })
            .sum();
        // 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
        assert!(chi2 < 18.47, "chi2 {chi2:.1}, counts {counts:?}");
    }

    #[test]
    fn drawing_without_a_draft_follows_p() {
        let p = [(1, 0.2), (2, 0.0), (3, 0.8)];
        assert_eq!(draw(&p, 0.1), 1);
        assert_eq!(draw(&p, 0.2), 3, "a token of no probability is never drawn");
        assert_eq!(draw(&p, 0.999_999_9), 3);
    }
}
