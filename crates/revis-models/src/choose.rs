//! Which catalog model fits a machine: a pure rule over its memory, its
//! measured speeds and the catalog.
//!
//! A model fits when both hold:
//!
//! * memory, with room to spare: the file (its weights are read into memory),
//!   plus its KV caches at the daemon's default context of [`CONTEXT_TOKENS`],
//!   one for each of the [`STREAMS`] answers it decodes together,
//!   plus [`RUNTIME_OVERHEAD_BYTES`] for compute buffers, saved prefixes and
//!   revisd itself, is at most [`MEMORY_SHARE`] of the machine's memory (the
//!   rest is the system's and the user's other programs');
//! * speed: the estimate of [`estimate`] reaches [`READING_SPEED_TOKENS_PER_S`].
//!
//! Decoding a token reads every weight once and multiplies and adds each
//! (two operations a parameter), so a token takes the longer of
//!
//! * reading: file size ÷ ([`DECODE_EFFICIENCY`] × read bandwidth), or
//!   faster where a real decode read faster ([`read_rate`]), and
//! * computing: 2 × parameters ÷ the operations per second the cores reach
//!   in llama.cpp's kernels. Measured from a real decode of a downloaded model
//!   on this machine where there is one ([`Machine::decode`]: `revisd
//!   measure-speed`); otherwise [`ARITHMETIC_SHARE`] of the arithmetic probe
//!   ([`crate::machine::dot_ops`]), the share measured on the development
//!   machine (docs/BENCHMARKS.md, "The default model's speed estimate").
//!
//! On a laptop's or desktop's cores the small models are compute-bound and
//! the large ones read-bound; on two cores everything up to several billion
//! parameters is compute-bound, which a bandwidth-only estimate missed
//! (it promised SmolLM2 280 tokens/s where it decodes 100-130).
//! A real decode of the smallest model counts that model's fixed costs per
//! token too, which weigh less in larger models: from it, the estimate for
//! larger ones errs slow.
//!
//! The choice is the largest file that fits; when none does, the smallest.

use crate::catalog::CatalogEntry;
use crate::machine::Machine;

/// The share of memory a model may take.
pub const MEMORY_SHARE: f64 = 0.5;
/// The share of the bandwidth limit decoding is expected to reach.
pub const DECODE_EFFICIENCY: f64 = 0.5;
/// Decode operations per second (2 × parameters × tokens/s) ÷ the arithmetic
/// probe's multiply-adds per second, where no real decode was measured.
/// Fitted on an Intel Xeon VM of 2 cores, where SmolLM2-135M and Gemma 3
/// 270M decode compute-bound (their speeds go as their parameters, not their
/// files): 1.3-1.6 on 1 and 2 threads (docs/BENCHMARKS.md, "The default
/// model's speed estimate"). Not measured on other CPUs: where a catalog
/// model is downloaded, its real decode replaces it.
pub const ARITHMETIC_SHARE: f64 = 1.45;
/// Tokens per second a streamed answer must reach: a reader takes about 240
/// words a minute (4 a second, about 5.3 tokens); 8 leaves a margin.
pub const READING_SPEED_TOKENS_PER_S: f64 = 8.0;
/// The context the memory estimate counts the KV cache for: the shortest a
/// model gets when `daemon.context` is unset ([`auto_context`]).
pub const CONTEXT_TOKENS: u64 = 4096;
/// Answers a model decodes together, each with a KV cache of its own: the
/// daemon's default `daemon.streams`.
pub const STREAMS: u64 = 4;
/// Compute buffers and revisd (384 MiB), plus the saved prefixes' default budget (256 MiB).
pub const RUNTIME_OVERHEAD_BYTES: u64 = 640 << 20;
/// Downloads larger than this are asked about first (unless `--yes`).
pub const ASK_ABOVE_BYTES: u64 = 1_000_000_000;

/// Bytes of memory each model's KV caches may take, when `models` (their
/// file sizes) are loaded together on a machine with `memory_bytes`: what
/// is left of [`MEMORY_SHARE`] of the memory after the files and each
/// model's [`RUNTIME_OVERHEAD_BYTES`], in equal parts.
pub fn kv_budget(memory_bytes: u64, models: &[u64]) -> u64 {
    let n = models.len().max(1) as u64;
    let taken = models.iter().sum::<u64>() + RUNTIME_OVERHEAD_BYTES * n;
    ((MEMORY_SHARE * memory_bytes as f64) as u64).saturating_sub(taken) / n
}

/// The context a model gets when the person set none: as long as it was
/// trained for, as far as [`STREAMS`]-many caches of `streams` fit in
/// `kv_budget`, in whole multiples of 256 tokens; never less than
/// [`CONTEXT_TOKENS`] (what the default-model choice counts) or the
/// trained context, whichever is shorter.
pub fn auto_context(shape: crate::Shape, streams: u32, kv_budget: u64) -> u32 {
    let per_token = shape.kv_bytes_per_token.max(1).saturating_mul(u64::from(streams.max(1)));
    let fits = (kv_budget / per_token / 256 * 256).min(u64::from(u32::MAX)) as u32;
    let trained = shape.trained_context.max(1);
    fits.clamp((CONTEXT_TOKENS as u32).min(trained), trained)
}

/// What a model would cost on a machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// File + [`STREAMS`] KV caches at [`CONTEXT_TOKENS`] + [`RUNTIME_OVERHEAD_BYTES`].
    pub memory_bytes: u64,
    /// Expected decoding speed: the slower of reading and computing (see the module's doc).
    pub tokens_per_s: f64,
    /// `memory_bytes` is within [`MEMORY_SHARE`] of the machine's memory.
    pub fits_memory: bool,
    /// `tokens_per_s` reaches [`READING_SPEED_TOKENS_PER_S`].
    pub reading_speed: bool,
}

impl Estimate {
    /// Both: the model fits this machine.
    pub fn fits(&self) -> bool {
        self.fits_memory && self.reading_speed
    }
}

/// What `entry` would cost on `machine`.
pub fn estimate(entry: &CatalogEntry, machine: &Machine) -> Estimate {
    let memory_bytes = entry.size + entry.kv_bytes_per_token * CONTEXT_TOKENS * STREAMS + RUNTIME_OVERHEAD_BYTES;
    let reading = entry.size.max(1) as f64 / read_rate(machine).max(1.0);
    let computing = 2.0 * entry.parameters() / decode_ops(machine).max(1.0);
    let tokens_per_s = 1.0 / reading.max(computing);
    Estimate {
        memory_bytes,
        tokens_per_s,
        fits_memory: memory_bytes as f64 <= MEMORY_SHARE * machine.memory_bytes as f64,
        reading_speed: tokens_per_s >= READING_SPEED_TOKENS_PER_S,
    }
}

/// Bytes per second a decode reads on `machine`: [`DECODE_EFFICIENCY`] of
/// its bandwidth, or more where its real decode read faster (a decode of
/// `tokens_per_s` reads its file that many times a second), so that the
/// model decoded is estimated at exactly what it did.
pub fn read_rate(machine: &Machine) -> f64 {
    let probed = DECODE_EFFICIENCY * machine.bandwidth.median;
    match &machine.decode {
        Some(d) => probed.max(d.size as f64 * d.tokens_per_s),
        None => probed,
    }
}

/// Operations per second a decode reaches on `machine`: from its real
/// decode when there is one, else [`ARITHMETIC_SHARE`] of its arithmetic probe.
pub fn decode_ops(machine: &Machine) -> f64 {
    match &machine.decode {
        Some(d) => 2.0 * d.parameters * d.tokens_per_s,
        None => ARITHMETIC_SHARE * machine.arithmetic.median,
    }
}

/// The model chosen for a machine, and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice<'a> {
    pub entry: &'a CatalogEntry,
    pub estimate: Estimate,
    /// False when nothing fits and this is the smallest model.
    pub fits: bool,
}

/// The largest model of `catalog` that fits `machine`, else the smallest.
///
/// # Panics
///
/// If `catalog` is empty.
pub fn choose<'a>(machine: &Machine, catalog: &'a [CatalogEntry]) -> Choice<'a> {
    let fitting = catalog.iter().filter(|e| estimate(e, machine).fits()).max_by_key(|e| e.size);
    match fitting {
        Some(entry) => Choice { entry, estimate: estimate(entry, machine), fits: true },
        None => {
            let entry = smallest(catalog);
            Choice { entry, estimate: estimate(entry, machine), fits: false }
        }
    }
}

/// The smallest model of `catalog` (the first of equals).
///
/// # Panics
///
/// If `catalog` is empty.
pub fn smallest(catalog: &[CatalogEntry]) -> &CatalogEntry {
    catalog.iter().min_by_key(|e| e.size).expect("a catalog with models")
}

/// Bytes for people, in decimal units as Hugging Face shows them ("1.9 GB", "98 MB").
pub fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.0} MB", b / 1e6)
    } else {
        format!("{bytes} bytes")
    }
}

impl Machine {
    /// One line for people: "8 cores, 16.0 GB of memory read at 40 GB/s (±3%), 96 G multiply-adds/s (±2%)",
    /// then what the speeds rest on, then whether others were using it.
    pub fn describe(&self) -> String {
        let mut line = format!(
            "{} core{}, {} of memory read at {:.0} GB/s (±{:.0}%), {:.1} G multiply-adds/s (±{:.0}%)",
            self.cores,
            if self.cores == 1 { "" } else { "s" },
            human_bytes(self.memory_bytes),
            self.bandwidth.median / 1e9,
            self.bandwidth.spread() * 100.0,
            self.arithmetic.median / 1e9,
            self.arithmetic.spread() * 100.0,
        );
        if let Some(d) = &self.decode {
            line.push_str(&format!("; speeds scaled from {} decoding at {:.0} tokens/s here", d.model, d.tokens_per_s));
        }
        if let Some(load) = self.load.filter(|l| l.busy()) {
            line.push_str(&format!(
                "; BUSY: other programs kept about {:.1} of its {} cores busy while it was measured, so these speeds are \
                 for now and it does more when they stop",
                load.others_cores, self.cores
            ));
        }
        line
    }
}

impl Choice<'_> {
    /// Why this model, in one sentence that names the numbers.
    pub fn explain(&self, machine: &Machine) -> String {
        let e = &self.estimate;
        let cost = format!(
            "{} ({}) needs about {} of memory and should write about {:.0} tokens/s here",
            self.entry.name,
            human_bytes(self.entry.size),
            human_bytes(e.memory_bytes),
            e.tokens_per_s
        );
        let half = human_bytes((MEMORY_SHARE * machine.memory_bytes as f64) as u64);
        if self.fits {
            format!(
                "{cost}: the largest catalog model within half this machine's memory ({half}) and at reading speed \
                 (at least {READING_SPEED_TOKENS_PER_S:.0} tokens/s)"
            )
        } else {
            format!(
                "no catalog model fits within half this machine's memory ({half}) at reading speed \
                 (at least {READING_SPEED_TOKENS_PER_S:.0} tokens/s), so the smallest: {cost}"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::catalog;
    use crate::machine::{Decode, Load, Probe};

    const GIB: u64 = 1 << 30;

    #[test]
    fn an_unset_context_follows_training_as_far_as_memory_allows() {
        let smol = crate::Shape { trained_context: 8192, kv_bytes_per_token: 23_040 };
        let gemma = crate::Shape { trained_context: 32768, kv_bytes_per_token: 18_432 };
        // 24 GB, one small model: all it was trained for.
        let big = kv_budget(24 * GIB, &[100 << 20]);
        assert_eq!(auto_context(smol, 4, big), 8192);
        assert_eq!(auto_context(gemma, 4, big), 32768);
        // 4 GB and three models of 1 GB: what fits, in multiples of 256.
        let budget = kv_budget(4 * GIB, &[GIB, GIB, GIB]);
        assert_eq!(budget, 0, "nothing left: {budget}");
        assert_eq!(auto_context(gemma, 4, budget), CONTEXT_TOKENS as u32, "never less than the default-model choice counts");
        let some = 1_000_000_000;
        let got = auto_context(gemma, 4, some);
        assert!(got.is_multiple_of(256) && u64::from(got) * 4 * 18_432 <= some && u64::from(got + 256) * 4 * 18_432 > some, "{got}");
        // A model trained for less than the floor gets its own length.
        assert_eq!(auto_context(crate::Shape { trained_context: 2048, kv_bytes_per_token: 1 }, 4, 0), 2048);
        // Streams multiply the cache.
        assert!(auto_context(gemma, 1, some) > auto_context(gemma, 4, some));
    }

    /// A machine of 8 cores with `memory_gib`, reading at `bandwidth_gb_s`,
    /// whose decodes reach `decode_gops` G operations a second (what its
    /// arithmetic probe gives, times [`ARITHMETIC_SHARE`]).
    fn machine(memory_gib: u64, bandwidth_gb_s: f64, decode_gops: f64) -> Machine {
        Machine {
            memory_bytes: memory_gib * GIB,
            bandwidth: Probe::exactly(bandwidth_gb_s * 1e9),
            arithmetic: Probe::exactly(decode_gops * 1e9 / ARITHMETIC_SHARE),
            cores: 8,
            load: None,
            decode: None,
        }
    }

    fn chosen(memory_gib: u64, bandwidth_gb_s: f64, decode_gops: f64) -> &'static str {
        choose(&machine(memory_gib, bandwidth_gb_s, decode_gops), catalog()).entry.name
    }

    #[test]
    fn the_choice_grows_with_the_machine() {
        // (memory GiB, bandwidth GB/s, decode G operations/s) → the model, from a small single-board computer to a workstation.
        let cases = [
            ((1, 5.0, 10.0), "smollm2-135m-instruct"),  // nothing fits: the smallest
            ((2, 10.0, 20.0), "smollm2-135m-instruct"), // Gemma 3 with its four caches needs 1.2 GB, over half of 2 GB
            // The development VM: 2 cores, 24 GB, 35 GB/s; its decodes reach about 35 G operations/s.
            // Qwen 2.5 1.5B computes 3 G operations a token: 11 tokens/s; the 3B models would write 5-6.
            ((24, 35.0, 35.0), "qwen2.5-1.5b-instruct"),
            ((4, 20.0, 60.0), "qwen2.5-1.5b-instruct"),
            ((8, 40.0, 120.0), "qwen2.5-3b-instruct"), // a laptop: a 3B with small caches, not the 8B that needs 8 GB
            ((8, 40.0, 40.0), "qwen2.5-1.5b-instruct"), // the same with two cores' arithmetic: a 3B would compute 6.5 tokens/s
            ((16, 60.0, 240.0), "llama3.2-3b-instruct"), // Phi 3.5's four caches take 6.4 GB; the 8B would read 6 tokens/s
            ((16, 100.0, 240.0), "llama3.1-8b-instruct"), // fast memory: the 8B at 10 tokens/s
            ((16, 100.0, 100.0), "llama3.2-3b-instruct"), // ... unless its cores cannot compute 16 G operations 8 times a second
            ((32, 120.0, 400.0), "gemma3-12b-it"),     // the 14B would write 6.7 tokens/s
            ((32, 200.0, 400.0), "qwen2.5-14b-instruct"),
            ((512, 1000.0, 4000.0), "qwen2.5-14b-instruct"), // the largest the catalog has
        ];
        let got: Vec<_> = cases.iter().map(|((m, b, o), _)| ((*m, *b, *o), chosen(*m, *b, *o))).collect();
        let want: Vec<_> = cases.iter().map(|(k, name)| (*k, *name)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_choice_fits_both_ways_and_nothing_larger_does() {
        for memory_gib in [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64] {
            for bandwidth in [5.0, 10.0, 20.0, 40.0, 60.0, 100.0, 200.0, 400.0] {
                for ops in [10.0, 35.0, 100.0, 400.0] {
                    let m = machine(memory_gib, bandwidth, ops);
                    let c = choose(&m, catalog());
                    assert_eq!(c.estimate, estimate(c.entry, &m));
                    if c.fits {
                        assert!(c.estimate.memory_bytes as f64 <= m.memory_bytes as f64 / 2.0, "{m:?}: {}", c.entry.name);
                        assert!(c.estimate.tokens_per_s >= READING_SPEED_TOKENS_PER_S, "{m:?}: {}", c.entry.name);
                    } else {
                        assert_eq!(c.entry, smallest(catalog()));
                        assert!(catalog().iter().all(|e| !estimate(e, &m).fits()), "{m:?}");
                    }
                    let larger_fits = catalog().iter().any(|e| e.size > c.entry.size && estimate(e, &m).fits());
                    assert!(!larger_fits, "{m:?}: a model larger than {} fits", c.entry.name);
                }
            }
        }
    }

    #[test]
    fn a_faster_machine_never_chooses_a_smaller_model() {
        let size = |m, b, o| choose(&machine(m, b, o), catalog()).entry.size;
        for m in [1, 2, 4, 8, 16, 32] {
            for b in [5.0, 20.0, 60.0, 200.0] {
                for o in [10.0, 40.0, 160.0] {
                    let here = size(m, b, o);
                    assert!(
                        size(m * 2, b, o) >= here && size(m, b * 2.0, o) >= here && size(m, b, o * 2.0) >= here,
                        "{m} GiB, {b} GB/s, {o} Gop/s"
                    );
                }
            }
        }
    }

    #[test]
    fn the_estimate_is_the_stated_arithmetic() {
        let qwen = crate::catalog::find("qwen2.5-3b-instruct").unwrap();
        // Read-bound: 120 G operations/s compute a token in 51 ms, 20 GB/s read 1.93 GB in 97 ms.
        let e = estimate(qwen, &machine(8, 40.0, 120.0));
        assert_eq!(e.memory_bytes, 1_930_000_000 + 36 * 2 * 128 * 4 * 4096 * 4 + (640 << 20));
        assert!((e.tokens_per_s - 0.5 * 40e9 / 1.93e9).abs() < 1e-9, "{e:?}");
        assert!(e.fits());
        // Compute-bound: two operations a parameter.
        let e = estimate(qwen, &machine(8, 40.0, 30.0));
        assert!((e.tokens_per_s - 30e9 / (2.0 * 3e9)).abs() < 1e-9, "{e:?}");
        assert!(!e.fits());
    }

    #[test]
    fn a_real_decode_sets_the_speed_of_its_model_and_scales_the_others() {
        let smol = crate::catalog::find("smollm2-135m-instruct").unwrap();
        let gemma = crate::catalog::find("gemma3-270m").unwrap();
        // The probe alone says one thing; the real decode is what counts.
        let m = machine(24, 35.0, 80.0);
        let decoded =
            m.clone().with_decode(Decode { model: smol.name.into(), parameters: smol.parameters(), size: smol.size, tokens_per_s: 110.0 });
        assert!((estimate(smol, &decoded).tokens_per_s - 110.0).abs() < 1e-9);
        // Gemma 3 270M has twice the parameters: half the speed, as it is compute-bound here.
        let g = estimate(gemma, &decoded).tokens_per_s;
        assert!((g - 110.0 * 135.0 / 270.0).abs() < 1e-6, "{g}");
        assert_ne!(estimate(smol, &m), estimate(smol, &decoded));
        // A decode faster than the bandwidth probe says reading allows (a probe on a busy moment):
        // the model decoded is still estimated at what it did, and reading a larger file is no faster.
        let slow_probe = machine(24, 1.0, 80.0).with_decode(Decode {
            model: smol.name.into(),
            parameters: smol.parameters(),
            size: smol.size,
            tokens_per_s: 110.0,
        });
        assert!((estimate(smol, &slow_probe).tokens_per_s - 110.0).abs() < 1e-9);
        assert!(estimate(gemma, &slow_probe).tokens_per_s <= 110.0 * smol.size as f64 / gemma.size as f64 + 1e-9);
    }

    #[test]
    fn the_choice_explains_itself_with_its_numbers() {
        let m = machine(8, 40.0, 120.0);
        expect_test::expect!["qwen2.5-3b-instruct (1.9 GB) needs about 3.2 GB of memory and should write about 10 tokens/s here: the largest catalog model within half this machine's memory (4.3 GB) and at reading speed (at least 8 tokens/s)"].assert_eq(&choose(&m, catalog()).explain(&m));
        let tiny = machine(1, 5.0, 10.0);
        expect_test::expect!["no catalog model fits within half this machine's memory (537 MB) at reading speed (at least 8 tokens/s), so the smallest: smollm2-135m-instruct (98 MB) needs about 1.1 GB of memory and should write about 25 tokens/s here"].assert_eq(&choose(&tiny, catalog()).explain(&tiny));
        expect_test::expect!["8 cores, 8.6 GB of memory read at 40 GB/s (±0%), 82.8 G multiply-adds/s (±0%)"].assert_eq(&m.describe());
        let measured = Machine {
            bandwidth: Probe { median: 35e9, low: 33e9, high: 36e9 },
            arithmetic: Probe { median: 12e9, low: 11e9, high: 12.5e9 },
            cores: 2,
            load: Some(Load { others_cores: 1.0 }),
            ..m
        };
        let smol = crate::catalog::find("smollm2-135m-instruct").unwrap();
        let measured =
            measured.with_decode(Decode { model: smol.name.into(), parameters: smol.parameters(), size: smol.size, tokens_per_s: 60.0 });
        expect_test::expect!["2 cores, 8.6 GB of memory read at 35 GB/s (±4%), 12.0 G multiply-adds/s (±6%); speeds scaled from smollm2-135m-instruct decoding at 60 tokens/s here; BUSY: other programs kept about 1.0 of its 2 cores busy while it was measured, so these speeds are for now and it does more when they stop"].assert_eq(&measured.describe());
    }
}
