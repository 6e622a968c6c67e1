//! Picking from the logits, the parts done in revis rather than in
//! llama.cpp's sampler chain: top-k in one pass over the vocabulary (so the
//! chain sees k candidates, not a 49k/262k-entry array a token), greedy
//! under a grammar checking the best tokens first, and the distribution of
//! the candidates left.

use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;

use crate::Token;

/// Logits are scanned in blocks of this many: the largest of a block is a
/// loop the compiler vectorizes, and a block below the bar is skipped whole.
const BLOCK: usize = 16;

/// The largest of `xs` (NaN ignored; -inf when empty), with independent lanes
/// so the loop vectorizes.
fn block_max(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; BLOCK];
    let mut blocks = xs.chunks_exact(BLOCK);
    for b in &mut blocks {
        for (lane, &x) in lanes.iter_mut().zip(b) {
            if x > *lane {
                *lane = x;
            }
        }
    }
    let mut m = lanes.iter().copied().fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a });
    for &x in blocks.remainder() {
        if x > m {
            m = x;
        }
    }
    m
}

/// The first token with the highest logit, as llama.cpp's greedy sampler
/// picks: the maximum in vectorized blocks, then its first position.
pub fn argmax(logits: &[f32]) -> usize {
    let max = block_max(logits);
    logits.iter().position(|&l| l == max).unwrap_or(0)
}

/// The `k` highest logits, highest first (the first token wins a tie, as in
/// llama.cpp's greedy pick), in one pass over the vocabulary: a block whose
/// largest logit is not above the k-th best so far is skipped whole.
pub fn top_k_of(logits: &[f32], k: usize) -> Vec<LlamaTokenData> {
    let k = k.clamp(1, logits.len().max(1));
    let mut best: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
    for (n, block) in logits.chunks(BLOCK).enumerate() {
        if best.len() == k && block_max(block) <= best[k - 1].0 {
            continue;
        }
        for (j, &l) in block.iter().enumerate() {
            // A NaN logit (a broken model) is never a candidate.
            if l.is_nan() || (best.len() == k && l <= best[k - 1].0) {
                continue;
            }
            let at = best.partition_point(|&(b, _)| b >= l);
            best.insert(at, (l, n * BLOCK + j));
            best.truncate(k);
        }
    }
    best.into_iter().map(|(l, i)| LlamaTokenData::new(LlamaToken(i as i32), l, 0.0)).collect()
}

/// Tokens whose logits are highest that [`greedy_under`] checks first.
pub const CHECK_FIRST: usize = 8;

/// The token llama.cpp's chain of `grammar` then greedy picks from
/// `logits` (the highest logit the grammar allows, the first token on a
/// tie), accepted into `grammar`; but the grammar first checks only the
/// [`CHECK_FIRST`] highest. When one of them is allowed and its logit is
/// above every other token's, it is that pick, found without the grammar
/// looking at the whole vocabulary (49,152 tokens for SmolLM2, 262,144 for
/// Gemma 3). The grammar's cost a token grows with the vocabulary times its
/// open alternatives, so a large enum cost seconds an answer this way.
/// Otherwise the whole vocabulary, as the chain does it.
pub fn greedy_under(grammar: &mut LlamaSampler, logits: &[f32]) -> LlamaToken {
    let best = top_k_of(logits, CHECK_FIRST);
    let mut few = LlamaTokenDataArray::new(best.clone(), true);
    few.apply_sampler(grammar);
    // Outside the few, no logit is above the last of them.
    let floor = if best.len() < logits.len() { best.last().map_or(f32::NEG_INFINITY, |d| d.logit()) } else { f32::NEG_INFINITY };
    let allowed = few.data.iter().position(|d| d.logit() > f32::NEG_INFINITY);
    let token = match allowed {
        // The few are highest first, a tie in token order, as the grammar left them.
        Some(at) if best[at].logit() > floor => best[at].id(),
        _ => {
            let mut all = LlamaTokenDataArray::new(
                logits.iter().enumerate().map(|(t, &l)| LlamaTokenData::new(LlamaToken(t as i32), l, 0.0)).collect(),
                false,
            );
            all.apply_sampler(grammar);
            let max = all.data.iter().map(|d| d.logit()).fold(f32::NEG_INFINITY, f32::max);
            // As greedy: the first of the highest (the first token when the grammar allows none).
            all.data.iter().find(|d| d.logit() == max).map_or(LlamaToken(0), |d| d.id())
        }
    };
    grammar.accept(token);
    token
}

/// Probabilities of the candidates left (a softmax of their logits, in f64).
pub fn softmax(candidates: &[LlamaTokenData], out: &mut Vec<(Token, f64)>) {
    out.clear();
    let max = candidates.iter().map(|c| c.logit()).fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        // Nothing left with a finite logit (cannot happen with min_keep 1): the first.
        out.extend(candidates.first().map(|c| (c.id().0 as Token, 1.0)));
        return;
    }
    let mut sum = 0.0;
    for c in candidates {
        let l = c.logit();
        if l.is_finite() {
            let e = (f64::from(l) - f64::from(max)).exp();
            sum += e;
            out.push((c.id().0 as Token, e));
        }
    }
    for (_, q) in out.iter_mut() {
        *q /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// One pass gives what sorting the whole vocabulary gives: the k
        /// highest logits, highest first, the lower token id first on a tie.
        #[test]
        fn top_k_of_matches_a_full_sort(logits in proptest::collection::vec(-8i8..8, 1..200), k in 1usize..50) {
            let logits: Vec<f32> = logits.into_iter().map(f32::from).collect();
            let mut sorted: Vec<usize> = (0..logits.len()).collect();
            sorted.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
            sorted.truncate(k);
            let got: Vec<usize> = top_k_of(&logits, k).iter().map(|d| d.id().0 as usize).collect();
            prop_assert_eq!(got, sorted);
        }
    }

    proptest! {
        #[test]
        fn argmax_is_the_first_highest(logits in proptest::collection::vec(-8i8..8, 1..100)) {
            let logits: Vec<f32> = logits.into_iter().map(f32::from).collect();
            let mut best = 0;
            for (i, &l) in logits.iter().enumerate() {
                if l > logits[best] {
                    best = i;
                }
            }
            prop_assert_eq!(argmax(&logits), best);
        }
    }

    #[test]
    fn softmax_keeps_finite_candidates_and_sums_to_one() {
        let c = [
            LlamaTokenData::new(LlamaToken(3), 2.0, 0.0),
            LlamaTokenData::new(LlamaToken(4), f32::NEG_INFINITY, 0.0),
            LlamaTokenData::new(LlamaToken(5), 0.0, 0.0),
        ];
        let mut p = Vec::new();
        softmax(&c, &mut p);
        assert_eq!(p.iter().map(|x| x.0).collect::<Vec<_>>(), [3, 5], "a token the grammar ruled out is not drawn");
        assert!((p.iter().map(|x| x.1).sum::<f64>() - 1.0).abs() < 1e-12);
        assert!((p[0].1 / p[1].1 - 2f64.exp()).abs() < 1e-9);
    }
}
