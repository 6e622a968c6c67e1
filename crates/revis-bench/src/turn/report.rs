//! The turn benchmark's section of docs/QUALITY.md: its targets, each
//! PASS or MISS with the figures, the accuracy of every way of answering
//! with its 95% interval, the profile's figures, and some answers as given.

use std::fmt::Write as _;

use super::{ModelTurns, Row};

/// The Wilson 95% interval of `k` successes in `n`, as fractions.
pub fn wilson(k: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (n, p, z) = (n as f64, k as f64 / n as f64, 1.96f64);
    let centre = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let half = z * ((p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt()) / (1.0 + z * z / n);
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

fn pct(x: f64) -> String {
    format!("{:.0}%", 100.0 * x)
}

fn cell(row: &Row) -> String {
    let (lo, hi) = wilson(row.right, row.n);
    format!("{} ({}–{}), {}/{}", pct(row.rate()), pct(lo), pct(hi), row.right, row.n)
}

/// PASS or MISS.
fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "MISS" }
}

/// The targets, each a line: PASS or MISS and the figures.
pub fn targets(r: &ModelTurns) -> Vec<String> {
    let mut out = Vec::new();
    for set in ["capitals", "piqa-chat"] {
        let Some(bare) = r.row(set, "bare model, greedy") else { continue };
        for way in [super::DRAWN, super::AFTER_40] {
            let Some(turn) = r.row(set, way) else { continue };
            out.push(format!(
                "{}: {set}, {way} ≥ the bare model greedy: {} against {}",
                verdict(turn.rate() >= bare.rate()),
                cell(turn),
                cell(bare)
            ));
        }
        if let (Some(s), Some(g)) = (r.row(set, super::DRAWN), r.row(set, "the turn, greedy")) {
            out.push(format!(
                "{}: {set}, default sampling ≥ 0.9 × greedy: {} against {}",
                verdict(s.rate() >= 0.9 * g.rate()),
                cell(s),
                cell(g)
            ));
        }
    }
    if let Some(p) = &r.profile {
        if let Some(n) = p.after_capitals {
            out.push(format!("{}: the profile holds 0 facts after the capitals questions: {n}", verdict(n == 0)));
        }
        if p.messages > 0 {
            let (precision, recall) = (p.precision(), p.recall());
            out.push(format!(
                "{}: profile precision ≥ 95%: {} ({} of {} stored)",
                verdict(precision >= 0.95),
                pct(precision),
                p.correct,
                p.stored
            ));
            out.push(format!("{}: profile recall ≥ 80%: {} ({} of {} facts)", verdict(recall >= 0.8), pct(recall), p.found, p.labelled));
        }
    }
    if let Some(m) = r.memory.as_ref().filter(|m| m.messages > 0) {
        let (precision, recall) = (m.precision(), m.recall());
        out.push(format!(
            "{}: first-person set, fact precision ≥ 97%: {} ({} of {} stored)",
            verdict(precision >= 0.97),
            pct(precision),
            m.correct,
            m.stored
        ));
        out.push(format!(
            "{}: first-person set, recall ≥ 85%: {} ({} of {} facts)",
            verdict(recall >= 0.85),
            pct(recall),
            m.found,
            m.labelled
        ));
    }
    if let Some(new) = r.row("recall", "the turn, a new conversation (the profile)") {
        out.push(format!("{}: recall in a new conversation ≥ 70%: {}", verdict(new.rate() >= 0.7), cell(new)));
    }
    if let Some(new) = r.row("people", "the turn, a new conversation (the profile)") {
        out.push(format!(
            "{}: recall in a new conversation ≥ 70%, one person's profile of ten facts: {}",
            verdict(new.rate() >= 0.7),
            cell(new)
        ));
    }
    if let Some((said, n)) = r.escalations {
        let rate = said as f64 / n.max(1) as f64;
        out.push(format!(
            "{}: tier1's false escalation on plain questions ≤ 10%: {} ({said} of {n}); the check is {} for this model",
            verdict(rate <= 0.10),
            pct(rate),
            if rate <= 0.10 { "allowed" } else { "off" }
        ));
    }
    out
}

/// The markers around one model's section of docs/QUALITY.md.
pub fn markers(model: &str) -> (String, String) {
    (format!("<!-- revis-bench:turn-{model}:begin"), format!("<!-- revis-bench:turn-{model}:end -->"))
}

/// One model's section of docs/QUALITY.md.
pub fn report(r: &ModelTurns, about: &str) -> String {
    let mut o = String::new();
    let (begin, end) = markers(&r.model);
    let _ = writeln!(o, "{begin} (written by revis-bench turn; edit outside the markers) -->\n");
    let _ = writeln!(o, "{about}\n");
    let rules = if r.chosen_rules.is_empty() { "none".to_owned() } else { format!("\"{}\"", r.chosen_rules) };
    let _ = writeln!(o, "The model's gears: rules {rules} ({}).\n", if r.measured { "measured" } else { "not measured: revis's defaults" });
    let _ = writeln!(o, "### Targets\n");
    for t in targets(r) {
        let _ = writeln!(o, "- {t}");
    }
    let _ = writeln!(o, "\n### Accuracy (95% Wilson interval), and answers that loop\n");
    let _ = writeln!(o, "| set | way | right | answers that repeat themselves | mean length (characters) |");
    let _ = writeln!(o, "|---|---|---|---|---|");
    for row in &r.rows {
        let right = if row.set.starts_with("loops") { "–".to_owned() } else { cell(row) };
        let _ = writeln!(o, "| {} | {} | {right} | {} of {} | {} |", row.set, row.way, row.loops, row.n, row.chars / row.n.max(1));
    }
    if let Some(p) = &r.profile
        && p.messages > 0
    {
        let _ = writeln!(
            o,
            "\nProfile on the mixed set ({} messages, {} facts about the user): {} stored, {} right, {} of the facts found.",
            p.messages, p.labelled, p.stored, p.correct, p.found
        );
    }
    if let Some(m) = r.memory.as_ref().filter(|m| m.messages > 0) {
        let _ = writeln!(
            o,
            "\nProfile on the first-person set ({} messages, {} facts): {} stored, {} right, {} of the facts found.",
            m.messages, m.labelled, m.stored, m.correct, m.found
        );
    }
    let _ = writeln!(o, "\n<details><summary>Some answers, as given (first 160 characters)</summary>\n");
    for row in &r.rows {
        for (q, a) in row.examples.iter().take(2) {
            let q: String = q.chars().take(80).collect();
            let _ = writeln!(o, "- {} / {}: {} → {}", row.set, row.way, q.replace('\n', " "), a.replace('\n', " ").replace('|', "\\|"));
        }
    }
    let _ = writeln!(o, "\n</details>\n");
    let _ = writeln!(o, "{end}");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_intervals_hold_the_rate() {
        let (lo, hi) = wilson(36, 97);
        assert!(lo < 36.0 / 97.0 && 36.0 / 97.0 < hi);
        assert!((lo - 0.28).abs() < 0.01 && (hi - 0.47).abs() < 0.01, "{lo} {hi}");
        assert_eq!(wilson(0, 0), (0.0, 1.0));
    }
}
