//! Summary statistics over the few samples a benchmark round gives.

/// Mean and spread of a set of samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// The middle sample (the mean of the two middle ones for an even count).
    pub median: f64,
    pub n: usize,
}

impl Summary {
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let finite: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
        if finite.is_empty() {
            return None;
        }
        let n = finite.len();
        let mean = finite.iter().sum::<f64>() / n as f64;
        let min = finite.iter().copied().fold(f64::INFINITY, f64::min);
        let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut sorted = finite;
        sorted.sort_by(f64::total_cmp);
        let median = if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
        Some(Summary { mean, min, max, median, n })
    }

    /// Half the range: what "± spread" means in the report.
    pub fn spread(&self) -> f64 {
        (self.max - self.min) / 2.0
    }

    /// `mean ± spread` with the given number of decimals.
    pub fn show(&self, decimals: usize) -> String {
        format!("{:.*} ± {:.*}", decimals, self.mean, decimals, self.spread())
    }

    /// `median (min–max)` with the given number of decimals.
    pub fn show_median(&self, decimals: usize) -> String {
        format!("{:.*} ({:.*}–{:.*})", decimals, self.median, decimals, self.min, decimals, self.max)
    }
}

/// `mean ± spread`, or "n/a" when there are no samples.
pub fn show(samples: &[f64], decimals: usize) -> String {
    Summary::of(samples).map_or_else(|| "n/a".to_owned(), |s| s.show(decimals))
}

/// `median (min–max)`, or "n/a" when there are no samples.
pub fn show_median(samples: &[f64], decimals: usize) -> String {
    Summary::of(samples).map_or_else(|| "n/a".to_owned(), |s| s.show_median(decimals))
}

/// Ratio of two medians, if both exist and the denominator is positive.
pub fn median_ratio(num: &[f64], den: &[f64]) -> Option<f64> {
    let (a, b) = (Summary::of(num)?, Summary::of(den)?);
    (b.median > 0.0).then(|| a.median / b.median)
}

/// Ratio of two means, if both exist and the denominator is positive.
pub fn ratio(num: &[f64], den: &[f64]) -> Option<f64> {
    let (a, b) = (Summary::of(num)?, Summary::of(den)?);
    (b.mean > 0.0).then(|| a.mean / b.mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_ratio() {
        let s = Summary::of(&[1.0, 2.0, 6.0]).unwrap();
        assert_eq!((s.mean, s.min, s.max, s.n), (3.0, 1.0, 6.0, 3));
        assert_eq!(s.spread(), 2.5);
        assert_eq!(s.show(1), "3.0 ± 2.5");
        assert_eq!(show(&[], 1), "n/a");
        assert_eq!(ratio(&[2.0, 4.0], &[3.0]), Some(1.0));
        assert_eq!(ratio(&[1.0], &[0.0]), None);
        assert!(Summary::of(&[f64::NAN]).is_none());
        assert_eq!(s.median, 2.0);
        assert_eq!(Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap().median, 2.5);
        assert_eq!(show_median(&[3.0, 1.0, 2.0], 1), "2.0 (1.0–3.0)");
        assert_eq!(median_ratio(&[1.0, 2.0, 9.0], &[4.0]), Some(0.5));
    }
}
