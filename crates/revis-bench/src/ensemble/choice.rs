//! Two-choice scoring (PIQA) with two models: each model alone, and the
//! score-level combinations, the scoring analogues of the ensemble's
//! generation methods. Pure functions over the scores, no I/O.
//!
//! An item's evidence from model m is its per-byte margin
//! `d_m = lp_m(sol2)/bytes(sol2) − lp_m(sol1)/bytes(sol1)` (positive: the
//! model prefers solution 2). Every rule below that is meant to be used
//! decides from the margins alone, never from labels; the set-level numbers
//! some of them need (a model's spread of margins) are computed over the
//! items being decided, without their labels. The rules that read labels
//! (the oracle, the best weights in hindsight) are bounds, and say so.
//!
//! The rule fixed before measuring is [`Rule::Calibrated`]. Why: suppose,
//! given the right answer y = ±1, model m's margin is `y·μ_m` plus Gaussian
//! noise of spread σ_m, independently of the other model. The Bayes
//! decision is then the sign of `Σ μ_m d_m / σ_m²`. μ_m cannot be estimated
//! without labels, but if the models are equally informative per unit of
//! their own noise (μ_m/σ_m equal, the neutral assumption) the weights
//! become 1/σ_m, and the spread of a model's margins over the set, E\[d²\] =
//! μ² + σ², is proportional to σ under that assumption. So: divide each
//! model's margin by the root mean square of its own margins over the set,
//! then add. The plain sum is the same rule with the scale of each model's
//! margins taken as equal, which it is not: a model whose margins are
//! twice as wide gets twice the vote whatever its accuracy.

/// One model's scores of one item's two solutions.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Scores {
    /// Natural-log probability of each solution (as a continuation).
    pub logprob: [f64; 2],
    /// Its length in bytes.
    pub bytes: [u32; 2],
}

impl Scores {
    /// The per-byte margin (acc_norm's): positive prefers solution 2.
    pub fn margin(&self) -> f64 {
        self.per_byte(1) - self.per_byte(0)
    }

    /// The whole-continuation margin (acc's).
    pub fn total_margin(&self) -> f64 {
        self.logprob[1] - self.logprob[0]
    }

    fn per_byte(&self, j: usize) -> f64 {
        self.logprob[j] / f64::from(self.bytes[j].max(1))
    }
}

/// One item: the right solution (0 or 1) and each model's scores.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub label: usize,
    pub models: Vec<Scores>,
}

/// A way of choosing a solution. Each is applied to a whole set of items
/// at once, since some read set-level, label-free statistics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// Model m alone, per byte (acc_norm).
    Alone(usize),
    /// Model m alone, whole continuation (acc).
    AloneTotal(usize),
    /// The model with the larger absolute per-byte margin decides.
    Confident,
    /// The sign of the sum of per-byte margins (= the sum of per-byte log-probabilities).
    Sum,
    /// The average of the two models' choice distributions (each a softmax
    /// of its per-byte log-probabilities over the two solutions).
    Mixture,
    /// The fixed rule: margins divided by each model's RMS margin over the set, summed.
    Calibrated,
    /// The model with the larger calibrated margin (margin ÷ its RMS) decides.
    CalibratedConfident,
    /// Unsupervised linear discriminant: a two-component Gaussian mixture
    /// (components ±μ, shared covariance) fitted to the margin vectors by
    /// EM without labels; the decision is the sign of μᵀΣ⁻¹d.
    Discriminant,
    /// Multiplicative weights learned from agreement: calibrated margins,
    /// weighted; after each item (in file order) a model that disagreed
    /// with the ensemble's choice has its weight multiplied by
    /// [`MW_BETA`]. No labels.
    AgreementWeights,
    /// Right when either model is right (reads labels: an upper bound).
    Oracle,
    /// The weighted sum of per-byte margins with the best weights for this
    /// very set (reads labels: the bound of every weighted sum).
    BestWeights,
}

/// [`Rule::AgreementWeights`]: the factor of a model that disagreed. Fixed
/// a priori (a model outvoted 7 times in a row keeps about half its weight).
pub const MW_BETA: f64 = 0.9;

impl Rule {
    /// Whether the rule reads the labels (and so is a bound, not a method).
    pub fn reads_labels(self) -> bool {
        matches!(self, Rule::Oracle | Rule::BestWeights)
    }
}

/// The rule's accuracy on `items`, in percent, and (for [`Rule::BestWeights`])
/// the weight of the second model relative to the first that reached it.
pub fn accuracy(rule: Rule, items: &[Item]) -> (f64, Option<f64>) {
    if items.is_empty() {
        return (0.0, None);
    }
    let pct = |right: usize| 100.0 * right as f64 / items.len() as f64;
    match rule {
        Rule::Oracle => {
            let right = items.iter().filter(|it| it.models.iter().any(|s| choose(s.margin()) == it.label)).count();
            (pct(right), None)
        }
        Rule::BestWeights => {
            let (right, ratio) = best_weights(items);
            (pct(right), Some(ratio))
        }
        _ => {
            let picks = decide(rule, items);
            (pct(picks.iter().zip(items).filter(|(p, it)| **p == it.label).count()), None)
        }
    }
}

/// The solution each item gets under a label-free rule.
pub fn decide(rule: Rule, items: &[Item]) -> Vec<usize> {
    let scale = rms_margins(items);
    match rule {
        Rule::Alone(m) => items.iter().map(|it| choose(it.models[m].margin())).collect(),
        Rule::AloneTotal(m) => items.iter().map(|it| choose(it.models[m].total_margin())).collect(),
        Rule::Confident => items.iter().map(|it| choose(most_confident(it.models.iter().map(Scores::margin)))).collect(),
        Rule::Sum => items.iter().map(|it| choose(it.models.iter().map(Scores::margin).sum())).collect(),
        Rule::Mixture => items
            .iter()
            .map(|it| {
                let p2: f64 = it.models.iter().map(|s| logistic(s.margin())).sum::<f64>() / it.models.len() as f64;
                choose(p2 - 0.5)
            })
            .collect(),
        Rule::Calibrated => items.iter().map(|it| choose(calibrated(it, &scale).sum())).collect(),
        Rule::CalibratedConfident => items.iter().map(|it| choose(most_confident(calibrated(it, &scale)))).collect(),
        Rule::Discriminant => {
            let w = discriminant(items);
            items.iter().map(|it| choose(it.models.iter().zip(&w).map(|(s, w)| w * s.margin()).sum())).collect()
        }
        Rule::AgreementWeights => {
            let mut w = vec![1.0; scale.len()];
            items
                .iter()
                .map(|it| {
                    let z: Vec<f64> = calibrated(it, &scale).collect();
                    let pick = choose(z.iter().zip(&w).map(|(z, w)| z * w).sum());
                    for (w, z) in w.iter_mut().zip(&z) {
                        if choose(*z) != pick {
                            *w *= MW_BETA;
                        }
                    }
                    pick
                })
                .collect()
        }
        Rule::Oracle | Rule::BestWeights => panic!("{rule:?} reads labels: use accuracy()"),
    }
}

/// Solution 2 when the evidence is positive; solution 1 otherwise (a tie
/// goes to the first, as an argmax over [sol1, sol2] does).
fn choose(evidence: f64) -> usize {
    usize::from(evidence > 0.0)
}

fn logistic(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The margin with the largest magnitude (the first among equals).
fn most_confident(margins: impl Iterator<Item = f64>) -> f64 {
    margins.fold(0.0, |best, d| if d.abs() > best.abs() { d } else { best })
}

/// Each model's root mean square per-byte margin over the items (no labels).
pub fn rms_margins(items: &[Item]) -> Vec<f64> {
    let m = items.first().map_or(0, |it| it.models.len());
    (0..m)
        .map(|k| {
            let ss: f64 = items.iter().map(|it| it.models[k].margin().powi(2)).sum();
            (ss / items.len() as f64).sqrt()
        })
        .collect()
}

fn calibrated<'a>(it: &'a Item, scale: &'a [f64]) -> impl Iterator<Item = f64> + 'a {
    it.models.iter().zip(scale).map(|(s, sc)| if *sc > 0.0 { s.margin() / sc } else { 0.0 })
}

/// The weights μᵀΣ⁻¹ of the unsupervised discriminant over two models'
/// margins (see [`Rule::Discriminant`]): EM for the symmetric mixture
/// ½N(μ, Σ) + ½N(−μ, Σ), started from the calibrated sum's choices. The
/// sign is fixed so that the weights' sum is positive (each model does
/// better than chance). Other numbers of models: the calibrated weights.
fn discriminant(items: &[Item]) -> Vec<f64> {
    let scale = rms_margins(items);
    if scale.len() != 2 || items.len() < 3 {
        return scale.iter().map(|s| if *s > 0.0 { 1.0 / s } else { 0.0 }).collect();
    }
    let d: Vec<[f64; 2]> = items.iter().map(|it| [it.models[0].margin(), it.models[1].margin()]).collect();
    let n = d.len() as f64;
    // E[d dᵀ], fixed.
    let mut s = [[0.0; 2]; 2];
    for x in &d {
        for a in 0..2 {
            for b in 0..2 {
                s[a][b] += x[a] * x[b] / n;
            }
        }
    }
    // Responsibilities (2r − 1 = E[y | d]) from the calibrated sum's signs.
    let mut ey: Vec<f64> =
        d.iter().map(|x| if x[0] / scale[0].max(1e-12) + x[1] / scale[1].max(1e-12) > 0.0 { 1.0 } else { -1.0 }).collect();
    let mut w = [0.0; 2];
    for _ in 0..500 {
        let mu = [0, 1].map(|a| d.iter().zip(&ey).map(|(x, e)| e * x[a]).sum::<f64>() / n);
        let cov = [[s[0][0] - mu[0] * mu[0], s[0][1] - mu[0] * mu[1]], [s[1][0] - mu[1] * mu[0], s[1][1] - mu[1] * mu[1]]];
        let det = cov[0][0] * cov[1][1] - cov[0][1] * cov[1][0];
        if det.abs() < 1e-18 {
            break;
        }
        let next = [(cov[1][1] * mu[0] - cov[0][1] * mu[1]) / det, (cov[0][0] * mu[1] - cov[1][0] * mu[0]) / det];
        let moved = (next[0] - w[0]).abs() + (next[1] - w[1]).abs();
        w = next;
        // E[y | d] = tanh(μᵀΣ⁻¹d) for the symmetric mixture.
        ey = d.iter().map(|x| (w[0] * x[0] + w[1] * x[1]).tanh()).collect();
        if moved < 1e-9 {
            break;
        }
    }
    if w[0] + w[1] < 0.0 {
        w = [-w[0], -w[1]];
    }
    w.to_vec()
}

/// The most items any weighted sum `a·d₁ + b·d₂` (a, b ≥ 0) gets right, and
/// b/a for it (infinite: the second model alone). Exact: the decision only
/// changes where the weight ratio crosses some item's `−d₁/d₂`.
fn best_weights(items: &[Item]) -> (usize, f64) {
    if items.first().is_none_or(|it| it.models.len() != 2) {
        return (0, f64::NAN);
    }
    let right_at = |ratio: f64| {
        items
            .iter()
            .filter(|it| {
                let e = if ratio.is_infinite() { it.models[1].margin() } else { it.models[0].margin() + ratio * it.models[1].margin() };
                choose(e) == it.label
            })
            .count()
    };
    let mut cuts: Vec<f64> = items
        .iter()
        .filter_map(|it| {
            let (d1, d2) = (it.models[0].margin(), it.models[1].margin());
            let r = -d1 / d2;
            (d2 != 0.0 && r.is_finite() && r > 0.0).then_some(r)
        })
        .collect();
    cuts.sort_by(f64::total_cmp);
    // One ratio inside each interval between cuts, and the ends.
    let mut candidates = vec![0.0, f64::INFINITY];
    if let (Some(first), Some(last)) = (cuts.first(), cuts.last()) {
        candidates.push(first / 2.0);
        candidates.push(last * 2.0);
    }
    candidates.extend(cuts.windows(2).map(|w| (w[0] + w[1]) / 2.0));
    candidates.into_iter().map(|r| (right_at(r), r)).fold((0, f64::NAN), |best, c| if c.0 > best.0 { c } else { best })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An item whose models have per-byte margins `d` (one byte each side).
    fn item(label: usize, d: &[f64]) -> Item {
        Item { label, models: d.iter().map(|&d| Scores { logprob: [0.0, d], bytes: [1, 1] }).collect() }
    }

    #[test]
    fn margins_are_per_byte_and_ties_go_to_the_first_solution() {
        let s = Scores { logprob: [-10.0, -12.0], bytes: [5, 8] };
        assert!((s.margin() - 0.5).abs() < 1e-12, "−12/8 − (−10/5) = 0.5");
        assert!(s.total_margin() < 0.0, "the whole-continuation margin prefers the shorter one");
        assert_eq!(decide(Rule::Alone(0), &[item(0, &[0.0])]), vec![0]);
    }

    #[test]
    fn the_naive_rules_and_the_oracle() {
        // Model 0: wide margins, half right; model 1: narrow, all right.
        let items = [item(1, &[3.0, 0.1]), item(0, &[3.0, -0.1]), item(1, &[-3.0, 0.1]), item(0, &[-3.0, -0.1])];
        assert_eq!(accuracy(Rule::Alone(0), &items).0, 50.0);
        assert_eq!(accuracy(Rule::Alone(1), &items).0, 100.0);
        assert_eq!(accuracy(Rule::Confident, &items).0, 50.0, "the wide model always wins");
        assert_eq!(accuracy(Rule::Sum, &items).0, 50.0);
        assert_eq!(accuracy(Rule::Mixture, &items).0, 50.0);
        assert_eq!(accuracy(Rule::Oracle, &items).0, 100.0);
        let (best, ratio) = accuracy(Rule::BestWeights, &items);
        assert_eq!(best, 100.0);
        assert!(ratio.unwrap() > 30.0, "model 1 must outweigh model 0's width: {ratio:?}");
    }

    #[test]
    fn a_two_way_mixture_of_choice_distributions_is_the_sum() {
        // σ(a) + σ(b) > 1 ⇔ a + b > 0: the equal-weight mixture cannot differ from the sum.
        let items: Vec<Item> = (0..200).map(|i| item(i % 2, &[((i * 37) % 17) as f64 - 8.3, ((i * 11) % 13) as f64 - 6.1])).collect();
        assert_eq!(decide(Rule::Mixture, &items), decide(Rule::Sum, &items));
    }

    #[test]
    fn calibration_undoes_a_difference_of_scale() {
        // Two equally good models, the first's margins 100 times wider: the
        // plain sum is the first model; calibrated, the second breaks its ties
        // of conviction. Right answers: model 1 is right where model 0 is unsure.
        let items = [
            item(1, &[100.0, -0.5]),
            item(0, &[-100.0, 0.5]),
            item(1, &[-10.0, 1.0]),
            item(0, &[10.0, -1.0]),
            item(1, &[50.0, 0.9]),
            item(0, &[-50.0, -0.9]),
        ];
        assert_eq!(accuracy(Rule::Sum, &items).0, accuracy(Rule::Alone(0), &items).0);
        assert!(accuracy(Rule::Calibrated, &items).0 > accuracy(Rule::Sum, &items).0);
        let scaled: Vec<Item> = items.iter().map(|it| item(it.label, &[it.models[0].margin() / 100.0, it.models[1].margin()])).collect();
        for rule in [Rule::Calibrated, Rule::CalibratedConfident, Rule::Discriminant, Rule::AgreementWeights] {
            assert_eq!(decide(rule, &items), decide(rule, &scaled), "{rule:?} must not depend on a model's scale");
        }
    }

    #[test]
    fn the_discriminant_finds_the_informative_model_without_labels() {
        // Model 0: clusters at ±2 with little noise; model 1: noise only.
        let items: Vec<Item> = (0..400)
            .map(|i| {
                let y = if i % 2 == 0 { 1.0 } else { -1.0 };
                let noise = (((i * 7919) % 1000) as f64 / 1000.0 - 0.5) * 1.0;
                let junk = (((i * 104_729) % 1000) as f64 / 1000.0 - 0.5) * 6.0;
                item(usize::from(y > 0.0), &[2.0 * y + noise, junk])
            })
            .collect();
        let (w, rms) = (discriminant(&items), rms_margins(&items));
        assert!(w[0] > 0.0 && w[0] * rms[0] > 5.0 * w[1].abs() * rms[1], "model 1's share of the decision must be small: {w:?}");
        assert_eq!(accuracy(Rule::Discriminant, &items).0, 100.0);
    }

    #[test]
    fn agreement_weights_fade_a_model_that_is_outvoted() {
        // Model 0 is outvoted 20 times; then it is surer than model 1 and wrong:
        // with its weight faded, model 1 decides (the calibrated sum follows model 0).
        let mut items: Vec<Item> = (0..20).map(|_| item(1, &[-1.0, 2.0])).collect();
        items.push(item(1, &[-3.0, 1.5]));
        assert_eq!(decide(Rule::Calibrated, &items)[20], 0);
        assert_eq!(decide(Rule::AgreementWeights, &items)[20], 1);
        assert_eq!(accuracy(Rule::AgreementWeights, &items).0, 100.0);
    }
}
