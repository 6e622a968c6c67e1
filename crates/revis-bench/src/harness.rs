//! The shape every benchmark shares, written once: run it, print its
//! sections, keep its raw samples in `target/revis-bench/`, and with
//! `--write` put its sections into its document (docs/BENCHMARKS.md,
//! docs/QUALITY.md, docs/ENSEMBLE.md; the fault benchmark appends to
//! docs/RELIABILITY.md every time). Each benchmark says what it measures and
//! how it reports by implementing [`Bench`]; [`measure`] does the rest.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::options::{Common, Output};

/// Replaces a section of a document's text (the old text, the section) and returns the new text.
pub type Splice = Box<dyn Fn(&str, &str) -> String>;

/// A section of a report and where it goes.
pub struct Section {
    pub text: String,
    pub place: Place,
}

pub enum Place {
    /// Into the document with `--write`, between the section's markers (the splice).
    Marked(Splice),
    /// Appended under the document's results heading on every run (the fault benchmark's log).
    Appended,
}

/// Raw samples: the file under `target/revis-bench/`, its JSON, and what the message calls it.
pub struct Raw {
    pub file: String,
    pub json: String,
    pub what: &'static str,
}

impl Raw {
    pub fn new(file: impl Into<String>, data: &impl serde::Serialize, what: &'static str) -> anyhow::Result<Raw> {
        Ok(Raw { file: file.into(), json: serde_json::to_string_pretty(data)?, what })
    }
}

/// A benchmark: its settings are the value implementing it, built from its subcommand's options.
pub trait Bench {
    /// What a run measured.
    type Results;
    /// Its document in the workspace, unless --doc names another.
    const DOC: &'static str;
    /// What the document starts as when the file does not exist yet.
    const NEW_DOC: &'static str = "";

    /// Runs the measurements.
    async fn run(&self) -> anyhow::Result<Self::Results>;
    /// The sections of the report and where each goes.
    fn report(&self, results: &Self::Results) -> anyhow::Result<Vec<Section>>;
    /// The raw samples kept beside the report, if it keeps any.
    fn raw(&self, results: &Self::Results) -> anyhow::Result<Option<Raw>>;
}

/// Runs `bench`, prints its report, saves its raw samples and its sections.
pub async fn measure<B: Bench>(bench: &B, output: &Output) -> anyhow::Result<B::Results> {
    let results = bench.run().await?;
    let sections = bench.report(&results)?;
    for s in &sections {
        println!("{}", s.text);
    }
    let root = workspace_root();
    if let Some(raw) = bench.raw(&results)? {
        let path = root.join("target/revis-bench").join(&raw.file);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, raw.json)?;
        eprintln!("revis-bench: {} in {}", raw.what, path.display());
    }
    let doc = output.doc.clone().unwrap_or_else(|| root.join(B::DOC));
    let marked: Vec<(&Splice, &str)> = sections
        .iter()
        .filter_map(|s| match &s.place {
            Place::Marked(splice) => Some((splice, s.text.as_str())),
            Place::Appended => None,
        })
        .collect();
    if output.write && !marked.is_empty() {
        let mut text = std::fs::read_to_string(&doc).unwrap_or_else(|_| B::NEW_DOC.to_owned());
        for (splice, section) in marked {
            text = splice(&text, section);
        }
        if let Some(dir) = doc.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&doc, text)?;
        eprintln!("revis-bench: updated {}", doc.display());
    }
    for s in sections.iter().filter(|s| matches!(s.place, Place::Appended)) {
        crate::faults::append(&doc, &s.text)?;
        eprintln!("revis-bench: appended to {}", doc.display());
    }
    Ok(results)
}

/// The workspace this binary was built from.
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    here.canonicalize().unwrap_or(here)
}

/// The revisd to measure: --revisd, else the one next to this executable.
pub fn revisd_path(common: &Common) -> anyhow::Result<PathBuf> {
    let revisd = match &common.revisd {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("revisd"),
    };
    if !revisd.is_file() {
        bail!("no revisd at {}: build it first (cargo build --release -p revisd) or pass --revisd", revisd.display());
    }
    Ok(revisd)
}

/// The file of catalog model `name`, pulled when missing.
pub async fn model_file(name: &str) -> anyhow::Result<PathBuf> {
    let entry = revis_models::find(name).with_context(|| format!("{name} is not in the catalog"))?;
    let dir = revis_models::models_dir()?;
    tokio::task::spawn_blocking(move || {
        revis_models::pull(entry, &dir, &revis_models::PullOptions { progress: revis_models::Progress::Quiet, ..Default::default() })
    })
    .await?
    .map_err(Into::into)
}

/// The command line as a user would type it.
pub fn args_line() -> String {
    let rest: Vec<String> = std::env::args().skip(1).collect();
    let mut s = "cargo run --release -p revis-bench --".to_owned();
    for a in rest {
        s.push(' ');
        s.push_str(&a);
    }
    s
}

/// A section written between markers with `splice_marked`: the prefix of its begin marker, its end marker, and its heading.
pub fn marked(begin: &str, end: &str, heading: &str) -> Place {
    let (begin, end, heading) = (begin.to_owned(), end.to_owned(), heading.to_owned());
    Place::Marked(Box::new(move |old, section| crate::report::splice_marked(old, &begin, &end, &heading, section)))
}
