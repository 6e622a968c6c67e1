//! Sampling as data a model may carry: [`SamplingDefaults`] (what its makers
//! recommend) and the bounds of each setting. `lookup.rs` finds a model's: what
//! the GGUF file publishes, else what the catalog knows, else nothing (the daemon's own).

/// Sampling a model's makers recommend; each field is None where nothing is
/// known, and a request's own setting always wins over it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    pub top_k: Option<u32>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<u32>,
}

/// The bounds of the sampling settings: the daemon's request limits
/// (`revis-daemon/src/validate.rs` uses these), and the bounds a default
/// must keep to be used, so a default can never make a request that leaves
/// the setting unset invalid.
pub const MAX_TEMPERATURE: f32 = 2.0;
pub const MAX_TOP_K: u32 = 1000;
pub const MAX_REPEAT_PENALTY: f32 = 2.0;
pub const MAX_REPEAT_LAST_N: u32 = 4096;

impl SamplingDefaults {
    /// Nothing known.
    pub const NONE: SamplingDefaults =
        SamplingDefaults { temperature: None, top_k: None, top_p: None, min_p: None, repeat_penalty: None, repeat_last_n: None };

    /// Each field from `self`, else from `other`.
    pub fn or(self, other: SamplingDefaults) -> SamplingDefaults {
        SamplingDefaults {
            temperature: self.temperature.or(other.temperature),
            top_k: self.top_k.or(other.top_k),
            top_p: self.top_p.or(other.top_p),
            min_p: self.min_p.or(other.min_p),
            repeat_penalty: self.repeat_penalty.or(other.repeat_penalty),
            repeat_last_n: self.repeat_last_n.or(other.repeat_last_n),
        }
    }

    /// The same, less any value outside what the daemon accepts (a file may say anything).
    pub fn sane(self) -> SamplingDefaults {
        let keep = |v: Option<f32>, ok: fn(f32) -> bool| v.filter(|v| v.is_finite() && ok(*v));
        SamplingDefaults {
            temperature: keep(self.temperature, |t| (0.0..=MAX_TEMPERATURE).contains(&t)),
            top_k: self.top_k.filter(|k| *k <= MAX_TOP_K),
            top_p: keep(self.top_p, |p| p > 0.0 && p <= 1.0),
            min_p: keep(self.min_p, |p| (0.0..1.0).contains(&p)),
            repeat_penalty: keep(self.repeat_penalty, |r| (1.0..=MAX_REPEAT_PENALTY).contains(&r)),
            repeat_last_n: self.repeat_last_n.filter(|n| *n <= MAX_REPEAT_LAST_N),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_merge_one_by_one_and_wild_values_are_dropped() {
        let published = SamplingDefaults { temperature: Some(0.3), top_k: Some(5000), ..SamplingDefaults::NONE };
        let catalog = SamplingDefaults { temperature: Some(0.7), top_k: Some(20), top_p: Some(0.8), ..SamplingDefaults::NONE };
        assert_eq!(
            published.sane().or(catalog),
            SamplingDefaults { temperature: Some(0.3), top_k: Some(20), top_p: Some(0.8), ..SamplingDefaults::NONE }
        );
        let wild = SamplingDefaults {
            temperature: Some(f32::NAN),
            top_k: Some(40),
            top_p: Some(0.0),
            min_p: Some(1.0),
            repeat_penalty: Some(0.5),
            repeat_last_n: Some(1 << 20),
        };
        assert_eq!(wild.sane(), SamplingDefaults { top_k: Some(40), ..SamplingDefaults::NONE });
    }
}
