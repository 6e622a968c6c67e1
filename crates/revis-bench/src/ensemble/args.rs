//! The options of `revis-bench ensemble`, its own and the shared groups,
//! and the parts it can run.

use std::path::PathBuf;

use clap::ValueEnum;

use crate::options::{Common, Output};

/// The options of `revis-bench ensemble`.
#[derive(clap::Args, Debug)]
pub struct EnsembleArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub output: Output,
    /// Parts to run.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = Part::ALL)]
    pub ensemble_parts: Vec<Part>,
    /// PIQA items, one JSON object (goal, sol1, sol2) a line. Default: ../shared/eval/piqa-dev/valid.jsonl.
    #[arg(long)]
    pub piqa: Option<PathBuf>,
    /// PIQA labels, 0 or 1 a line. Default: valid-labels.lst beside --piqa.
    #[arg(long)]
    pub piqa_labels: Option<PathBuf>,
    /// Capitals questions, one JSON object (question, answers) a line. Default: ../shared/eval/capitals-dev.jsonl.
    #[arg(long)]
    pub capitals: Option<PathBuf>,
    /// PIQA items scored: the first N (0: all).
    #[arg(long, default_value_t = 0)]
    pub ensemble_items: usize,
    /// PIQA items before this index are reported apart from the rest.
    #[arg(long, default_value_t = 500)]
    pub piqa_split: usize,
    /// Capitals questions asked: the first N (0: all).
    #[arg(long, default_value_t = 0)]
    pub capitals_items: usize,
    /// Longest capitals answer, in tokens.
    #[arg(long, default_value_t = 32)]
    pub capitals_max_tokens: u32,
    /// Tokens each member drafts per round (K) in the capitals parts.
    #[arg(long, default_value_t = 16)]
    pub span: u32,
    /// Texts for bits per byte: the first N PIQA items (0: all).
    #[arg(long, default_value_t = 300)]
    pub bits_items: usize,
}

/// A part of `revis-bench ensemble`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Part {
    Piqa,
    Capitals,
    Bits,
    /// The capitals questions again, the members on two machines (network
    /// namespaces over mutual TLS; needs root).
    TwoMachines,
}

impl Part {
    pub const ALL: [Part; 4] = [Part::Piqa, Part::Capitals, Part::Bits, Part::TwoMachines];

    pub fn name(self) -> &'static str {
        match self {
            Part::Piqa => "piqa",
            Part::Capitals => "capitals",
            Part::Bits => "bits",
            Part::TwoMachines => "two-machines",
        }
    }
}
