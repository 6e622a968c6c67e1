//! The evaluation sets of `revis-bench ensemble`, in the formats of `../shared/eval/`:
//! PIQA (`valid.jsonl`: one `{"goal", "sol1", "sol2"}` a line, and a labels
//! file: the same line says 0 or 1, the right solution) and the capitals
//! questions (`{"question", "answers": [..]}` a line). Every bad line is an
//! error naming its file and line.

use std::path::Path;

use anyhow::{Context, bail};
use serde_json::Value;

/// One PIQA item: a goal, two solutions, and which is right (0 or 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piqa {
    pub goal: String,
    pub sols: [String; 2],
    pub label: usize,
}

impl Piqa {
    /// lm-evaluation-harness's zero-shot prompt: what both solutions continue.
    pub fn prefix(&self) -> String {
        format!("Question: {}\nAnswer:", self.goal)
    }

    /// Solution `j` as the continuation of [`Piqa::prefix`].
    pub fn continuation(&self, j: usize) -> String {
        format!(" {}", self.sols[j])
    }

    /// The goal followed by the right solution, as plain text (the bits-per-byte text).
    pub fn text(&self) -> String {
        format!("{} {}", self.goal, self.sols[self.label])
    }
}

/// One capitals question and the names that count as right.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capital {
    pub question: String,
    pub answers: Vec<String>,
}

impl Capital {
    /// Exact match as the set's README defines it: the answer contains one
    /// of the accepted names, as written (case and accents included).
    pub fn is_right(&self, answer: &str) -> bool {
        self.answers.iter().any(|a| answer.contains(a.as_str()))
    }
}

/// Reads PIQA items and their labels (the same number of lines).
pub fn load_piqa(items: &Path, labels: &Path) -> anyhow::Result<Vec<Piqa>> {
    let text = std::fs::read_to_string(items).with_context(|| format!("reading {}", items.display()))?;
    let labels_text = std::fs::read_to_string(labels).with_context(|| format!("reading {}", labels.display()))?;
    parse_piqa(&text, &labels_text).with_context(|| format!("{} with {}", items.display(), labels.display()))
}

fn parse_piqa(items: &str, labels: &str) -> anyhow::Result<Vec<Piqa>> {
    let lines: Vec<&str> = items.lines().filter(|l| !l.trim().is_empty()).collect();
    let labels: Vec<&str> = labels.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.len() != labels.len() {
        bail!("{} items but {} labels: the files must have one line per item", lines.len(), labels.len());
    }
    let mut out = Vec::with_capacity(lines.len());
    for (i, (line, label)) in lines.iter().zip(&labels).enumerate() {
        let n = i + 1;
        let v: Value = serde_json::from_str(line).with_context(|| format!("item line {n} is not JSON"))?;
        let field = |k: &str| -> anyhow::Result<String> {
            match v.get(k).and_then(Value::as_str) {
                Some(s) if !s.trim().is_empty() => Ok(s.to_owned()),
                _ => bail!("item line {n}: `{k}` is missing, not a string, or empty"),
            }
        };
        let label = match label.trim() {
            "0" => 0,
            "1" => 1,
            other => bail!("label line {n} is {other:?}: it must be 0 or 1"),
        };
        out.push(Piqa { goal: field("goal")?, sols: [field("sol1")?, field("sol2")?], label });
    }
    if out.is_empty() {
        bail!("no items");
    }
    Ok(out)
}

/// Reads the capitals questions.
pub fn load_capitals(path: &Path) -> anyhow::Result<Vec<Capital>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_capitals(&text).with_context(|| path.display().to_string())
}

fn parse_capitals(text: &str) -> anyhow::Result<Vec<Capital>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let n = i + 1;
        let v: Value = serde_json::from_str(line).with_context(|| format!("line {n} is not JSON"))?;
        let question = match v.get("question").and_then(Value::as_str) {
            Some(q) if !q.trim().is_empty() => q.to_owned(),
            _ => bail!("line {n}: `question` is missing, not a string, or empty"),
        };
        let answers: Vec<String> = match v.get("answers").and_then(Value::as_array) {
            Some(a) => a.iter().filter_map(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned).collect(),
            None => bail!("line {n}: `answers` is missing or not a list"),
        };
        if answers.is_empty() {
            bail!("line {n}: `answers` names no accepted answer");
        }
        out.push(Capital { question, answers });
    }
    if out.is_empty() {
        bail!("no questions");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn piqa_items_pair_with_their_labels_and_give_the_harness_prompt() {
        let items = "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b \"}\n\n{\"goal\": \"h\", \"sol1\": \"c\", \"sol2\": \"d\"}\n";
        let got = parse_piqa(items, "1\n0\n").unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].prefix(), got[0].continuation(1), got[0].text()), ("Question: g\nAnswer:".into(), " b ".into(), "g b ".into()));
        assert_eq!(got[1].label, 0);
    }

    #[test]
    fn bad_piqa_files_name_the_line_and_the_rule() {
        let item = "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\"}";
        let err = |items: &str, labels: &str| format!("{:#}", parse_piqa(items, labels).unwrap_err());
        assert!(err(item, "0\n1\n").contains("1 items but 2 labels"));
        assert!(err(item, "2\n").contains("label line 1 is \"2\": it must be 0 or 1"));
        assert!(err("{\"goal\": \"g\", \"sol1\": \"a\"}", "0").contains("item line 1: `sol2`"));
        assert!(err("nope", "0").contains("item line 1 is not JSON"));
        assert!(err("", "").contains("no items"));
    }

    #[test]
    fn a_capital_counts_when_the_answer_contains_an_accepted_name() {
        let c = parse_capitals("{\"question\": \"What is the capital of X?\", \"answers\": [\"Kabul\", \"Kābul\"]}\n").unwrap();
        assert!(c[0].is_right("The capital of X is Kabul."));
        assert!(c[0].is_right("Kābul"));
        assert!(!c[0].is_right("kabul"), "as written, case included");
        assert!(!c[0].is_right("Paris"));
        let err = format!("{:#}", parse_capitals("\n{\"question\": \"q\", \"answers\": []}").unwrap_err());
        assert!(err.contains("line 2: `answers` names no accepted answer"), "{err}");
    }
}
