//! Prefix-cache planning, independent of any engine: where a prompt's batches
//! end, how much of an evaluated sequence a new prompt may reuse, and which
//! saved prefixes to keep (least recently used evicted within a budget).
//!
//! llama.cpp's numerics depend on how a prompt is split into batches. So a
//! prompt is always cut at the same places whatever is cached (its static
//! part, then its dynamic part, each in fixed-size chunks), and a cached
//! sequence is reused only up to a cut that both agree on. Prefill then
//! Generate gives exactly the text a cold Generate gives.

use crate::Token;

/// The ends of the batches a prompt of `len` tokens is evaluated in: the
/// static part `[0, split)` in chunks of `chunk`, then the rest the same way.
pub fn cuts(split: usize, len: usize, chunk: usize) -> Vec<usize> {
    assert!(chunk > 0, "chunk size must be positive");
    let split = split.min(len);
    let mut out = Vec::with_capacity(len / chunk + 2);
    for (start, end) in [(0, split), (split, len)] {
        let mut at = start;
        while at < end {
            at = (at + chunk).min(end);
            out.push(at);
        }
    }
    out
}

/// The chunk size of an answer already begun (`answer_prefix`): small, so
/// an answer continued again and again (an ensemble's rounds, each adding a
/// span) re-evaluates only its last few tokens, not the whole answer.
pub const ANSWER_CHUNK: usize = 16;

/// The ends of the batches of a prompt of `len` tokens whose static part
/// ends at `split` and whose answer already begun starts at `answer`: the
/// static part and the rest of the prompt in chunks of `chunk`, then the
/// answer so far in chunks of [`ANSWER_CHUNK`].
pub fn prompt_cuts(split: usize, answer: usize, len: usize, chunk: usize) -> Vec<usize> {
    let answer = answer.clamp(split.min(len), len);
    let mut out = cuts(split, answer, chunk);
    let mut at = answer;
    while at < len {
        at = (at + ANSWER_CHUNK.min(chunk)).min(len);
        out.push(at);
    }
    out
}

/// What a KV-cache sequence holds: its tokens and where its batches ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evaluated {
    pub tokens: Vec<Token>,
    /// Ascending batch ends; the last one equals `tokens.len()`.
    pub cuts: Vec<usize>,
}

impl Evaluated {
    /// The longest prefix of a prompt (`tokens` cut at `cuts`) that can be
    /// taken from this sequence with bit-identical results: it ends at a cut
    /// the two share, every earlier cut agrees, and it is at most `limit`.
    pub fn reusable(&self, tokens: &[Token], cuts: &[usize], limit: usize) -> usize {
        let common = self.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        let bound = common.min(limit);
        let mut best = 0;
        for (a, b) in self.cuts.iter().zip(cuts) {
            if a != b || *a > bound {
                break;
            }
            best = *a;
        }
        best
    }

    /// Keeps the first `n` tokens; `n` must be 0 or one of the cuts.
    pub fn truncate(&mut self, n: usize) {
        debug_assert!(n == 0 || self.cuts.contains(&n), "truncate at a non-cut {n}");
        self.tokens.truncate(n);
        self.cuts.retain(|&c| c <= n);
    }

    /// Records a batch that was just evaluated.
    pub fn push_batch(&mut self, batch: &[Token]) {
        if batch.is_empty() {
            return;
        }
        self.tokens.extend_from_slice(batch);
        self.cuts.push(self.tokens.len());
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// True if `self` is a prefix of `other`, batches included.
    fn is_prefix_of(&self, other: &Evaluated) -> bool {
        other.tokens.starts_with(&self.tokens) && other.cuts.starts_with(&self.cuts)
    }
}

/// A saved sequence and the engine's opaque copy of its state.
#[derive(Debug)]
pub struct Saved<S> {
    pub seq: Evaluated,
    pub state: S,
    pub bytes: usize,
    last_used: u64,
}

/// Saved prefixes of one model, least recently used evicted first.
#[derive(Debug)]
pub struct PrefixCache<S> {
    entries: Vec<Saved<S>>,
    max_entries: usize,
    budget_bytes: usize,
    clock: u64,
}

impl<S> PrefixCache<S> {
    pub fn new(max_entries: usize, budget_bytes: usize) -> Self {
        Self { entries: Vec::new(), max_entries, budget_bytes, clock: 0 }
    }

    /// The saved entry that gives the most reuse for a prompt, and how much.
    pub fn best(&self, tokens: &[Token], cuts: &[usize], limit: usize) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.seq.reusable(tokens, cuts, limit)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(_, n)| n)
    }

    pub fn get(&mut self, index: usize) -> &Saved<S> {
        self.clock += 1;
        self.entries[index].last_used = self.clock;
        &self.entries[index]
    }

    /// True if saving `seq` would add nothing (an entry already extends it).
    pub fn covers(&self, seq: &Evaluated) -> bool {
        self.entries.iter().any(|e| seq.is_prefix_of(&e.seq))
    }

    /// Saves a sequence. Entries it extends are dropped, then the least
    /// recently used go until the count and the byte budget hold. Returns
    /// how many entries were evicted.
    pub fn insert(&mut self, seq: Evaluated, state: S, bytes: usize) -> usize {
        self.entries.retain(|e| !e.seq.is_prefix_of(&seq));
        self.clock += 1;
        self.entries.push(Saved { seq, state, bytes, last_used: self.clock });
        let mut evicted = 0;
        while self.entries.len() > self.max_entries || (self.total_bytes() > self.budget_bytes && !self.entries.is_empty()) {
            let oldest = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used).unwrap_or(0);
            self.entries.remove(oldest);
            evicted += 1;
        }
        evicted
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn total_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// Drops everything; returns (entries, bytes) dropped.
    pub fn clear(&mut self) -> (usize, usize) {
        let dropped = (self.len(), self.total_bytes());
        self.entries.clear();
        dropped
    }

    /// The budget a single entry must fit in to be worth saving.
    pub fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn evaluated(tokens: &[Token], split: usize, chunk: usize) -> Evaluated {
        Evaluated { tokens: tokens.to_vec(), cuts: cuts(split, tokens.len(), chunk) }
    }

    #[test]
    fn cuts_follow_the_split_then_chunks() {
        assert_eq!(cuts(5, 12, 4), vec![4, 5, 9, 12]);
        assert_eq!(cuts(0, 5, 4), vec![4, 5]);
        assert_eq!(cuts(8, 8, 4), vec![4, 8]);
        assert_eq!(cuts(3, 0, 4), Vec::<usize>::new());
        // An answer already begun is cut in its own small chunks.
        assert_eq!(prompt_cuts(5, 12, 12, 4), cuts(5, 12, 4));
        assert_eq!(
            prompt_cuts(2, 6, 6 + 2 * ANSWER_CHUNK + 3, 512),
            vec![2, 6, 6 + ANSWER_CHUNK, 6 + 2 * ANSWER_CHUNK, 6 + 2 * ANSWER_CHUNK + 3]
        );
    }

    #[test]
    fn same_static_part_is_reused_to_the_split() {
        let sys: Vec<Token> = (0..300).collect();
        let mut a = sys.clone();
        a.extend([1000, 1001, 1002]);
        let mut b = sys.clone();
        b.extend([2000, 2001]);
        let cached = evaluated(&a, 300, 256);
        let want = cuts(300, b.len(), 256);
        assert_eq!(cached.reusable(&b, &want, b.len() - 1), 300);
    }

    #[test]
    fn a_different_split_limits_reuse_to_common_cuts() {
        let t: Vec<Token> = (0..600).collect();
        let cached = evaluated(&t, 300, 256);
        // Same tokens but split at 400: cuts 256, 400, ... vs 256, 300, ...
        assert_eq!(cached.reusable(&t, &cuts(400, 600, 256), 599), 256);
    }

    #[test]
    fn never_reuses_the_whole_prompt_past_the_limit() {
        let t: Vec<Token> = (0..10).collect();
        let cached = evaluated(&t, 10, 4);
        // Limit 9: cuts 4, 8 agree; 10 is past the limit.
        assert_eq!(cached.reusable(&t, &cuts(10, 10, 4), 9), 8);
    }

    #[test]
    fn generated_tokens_are_their_own_batches() {
        let mut seq = evaluated(&[1, 2, 3, 4], 4, 4);
        seq.push_batch(&[5]);
        seq.push_batch(&[6]);
        assert_eq!(seq.cuts, vec![4, 5, 6]);
        seq.truncate(4);
        assert_eq!(seq, evaluated(&[1, 2, 3, 4], 4, 4));
    }

    #[test]
    fn lru_eviction_by_count_and_budget() {
        let mut c = PrefixCache::new(2, 100);
        c.insert(evaluated(&[1], 1, 4), (), 10);
        c.insert(evaluated(&[2], 1, 4), (), 10);
        let _ = c.get(0); // [1] is now the most recent
        assert_eq!(c.insert(evaluated(&[3], 1, 4), (), 10), 1);
        assert!(c.best(&[1, 9], &[1, 2], 1).is_some());
        assert!(c.best(&[2, 9], &[1, 2], 1).is_none());
        assert_eq!(c.insert(evaluated(&[4], 1, 4), (), 95), 2);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn an_extension_replaces_its_prefix() {
        let mut c = PrefixCache::new(4, 1000);
        c.insert(evaluated(&[1, 2], 2, 4), (), 1);
        let mut longer = evaluated(&[1, 2], 2, 4);
        longer.push_batch(&[3]);
        assert!(!c.covers(&longer));
        c.insert(longer.clone(), (), 1);
        assert_eq!(c.len(), 1);
        assert!(c.covers(&evaluated(&[1, 2], 2, 4)));
    }

    proptest! {
        /// Reuse always ends on a cut of the new prompt, below the limit, on tokens that match.
        #[test]
        fn reuse_is_sound(
            a in proptest::collection::vec(0u32..4, 0..40),
            b in proptest::collection::vec(0u32..4, 1..40),
            sa in 0usize..40, sb in 0usize..40, chunk in 1usize..9,
        ) {
            let cached = evaluated(&a, sa, chunk);
            let want = cuts(sb, b.len(), chunk);
            let limit = b.len() - 1;
            let n = cached.reusable(&b, &want, limit);
            prop_assert!(n <= limit);
            prop_assert_eq!(&a[..n], &b[..n]);
            if n > 0 {
                let k = want.iter().position(|&c| c == n).expect("reuse ends on a cut");
                prop_assert_eq!(&cached.cuts[..=k], &want[..=k]);
            }
        }
    }
}
