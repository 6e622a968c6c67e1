//! The `revis-bench ensemble` section of docs/ENSEMBLE.md, and the raw per-item scores.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::args::Part;
use super::bpb::bits_per_byte;
use super::choice::{self, Item, Rule};
use super::results::{Answers, Results};
use crate::machine::Machine;
use crate::report::verdict;

/// The better single model must be beaten by this many points (issue 13).
pub const PIQA_GAIN: f64 = 1.5;
/// An ensemble may fall at most this many points below its best member (issue 13).
pub const CAPITALS_SLACK: f64 = 1.0;

pub struct About<'a> {
    pub date: &'a str,
    pub command: &'a str,
    pub machine: &'a Machine,
    pub revisd: &'a Path,
    pub threads: u32,
    pub context: u32,
    pub elapsed: Duration,
    pub capitals_max_tokens: u32,
}

/// Issue 13's figures, measured before this benchmark existed: PIQA items
/// 0–499 per byte, and capitals on the dev set, by catalog name.
fn reference(model: &str) -> (Option<f64>, Option<f64>) {
    match model {
        "smollm2-135m-instruct" => (Some(67.2), Some(32.0)),
        "gemma3-270m" => (Some(69.0), Some(5.2)),
        _ => (None, None),
    }
}

/// The rules in the order shown, with their names and issue 13's reference on items 0–499.
fn rules(r: &Results) -> Vec<(Rule, String, Option<f64>)> {
    let name = |m: usize| r.members[m].name.as_str();
    vec![
        (Rule::Alone(0), format!("{} alone, per byte (acc_norm)", name(0)), reference(name(0)).0),
        (Rule::Alone(1), format!("{} alone, per byte (acc_norm)", name(1)), reference(name(1)).0),
        (Rule::AloneTotal(0), format!("{} alone, whole continuation (acc)", name(0)), None),
        (Rule::AloneTotal(1), format!("{} alone, whole continuation (acc)", name(1)), None),
        (Rule::Confident, "naive: the larger per-byte margin decides".into(), Some(68.2)),
        (Rule::Sum, "naive: plain sum of per-byte log-probabilities".into(), Some(68.2)),
        (Rule::Mixture, "mixture of the two choice distributions (= plain sum, see below)".into(), None),
        (Rule::Calibrated, "**calibrated sum** (the rule fixed before measuring)".into(), None),
        (Rule::CalibratedConfident, "calibrated, the larger margin decides".into(), None),
        (Rule::Discriminant, "unsupervised discriminant (EM, no labels)".into(), None),
        (Rule::AgreementWeights, format!("agreement weights (β = {})", choice::MW_BETA), None),
        (Rule::Oracle, "oracle: either model right (reads labels)".into(), Some(76.0)),
        (Rule::BestWeights, "best weighted sum for this very slice (reads labels)".into(), None),
    ]
}

/// The PIQA slices: items before the split, and from it.
fn slices(r: &Results) -> Vec<(String, &[Item])> {
    let n = r.piqa.len();
    let cut = r.piqa_split.min(n);
    let mut out = vec![(format!("items 0–{}", cut.saturating_sub(1)), &r.piqa[..cut])];
    if n > cut {
        out.push((format!("items {cut}–{}", n - 1), &r.piqa[cut..]));
    }
    out
}

/// The generated sections of the run, one per part it ran, each between
/// markers of its own, so a run of one part rewrites that part only.
pub fn sections(r: &Results, a: &About<'_>) -> Vec<(Part, String)> {
    let mut out = Vec::new();
    for part in Part::ALL {
        let mut o = String::new();
        let _ = writeln!(o, "{}", begin(part));
        let _ = writeln!(o, "- Date: {}; command: `{}`; {:.1} min in all.", a.date, a.command, a.elapsed.as_secs_f64() / 60.0);
        let m = a.machine;
        let _ = writeln!(o, "- Machine: {} ({} cores visible, {:.1} GiB memory), {}.", m.cpu, m.cores, m.memory_gib, m.os);
        let members: Vec<String> = r.members.iter().map(|m| format!("{} on {}", m.name, m.tier)).collect();
        if part == Part::TwoMachines {
            let _ = writeln!(
                o,
                "- Two `{}`: {} on this machine (core 0), {} on a node in a network namespace (core 1), paired and reached over mutual TLS across a veth; 1 thread each, context {}.\n",
                a.revisd.display(),
                r.members[0].name,
                r.members[1].name,
                a.context
            );
        } else {
            let _ = writeln!(
                o,
                "- One `{}` serving {}, {} threads, context {}.\n",
                a.revisd.display(),
                members.join(" and "),
                a.threads,
                a.context
            );
        }
        match part {
            Part::Piqa if !r.piqa.is_empty() => piqa(&mut o, r),
            Part::Capitals if !r.capitals.is_empty() => capitals(&mut o, r, &r.capitals, a),
            Part::Bits if !r.bits.is_empty() || !r.bits_skipped.is_empty() => bits(&mut o, r),
            Part::TwoMachines if !r.two_machines.is_empty() => capitals(&mut o, r, &r.two_machines, a),
            _ => continue,
        }
        let _ = writeln!(o, "{}", end(part));
        out.push((part, o));
    }
    out
}

fn begin(part: Part) -> String {
    format!(
        "<!-- revis-bench:ensemble-{}:begin (generated by `revis-bench ensemble --write`; edits inside are overwritten) -->",
        part.name()
    )
}

fn end(part: Part) -> String {
    format!("<!-- revis-bench:ensemble-{}:end -->", part.name())
}

/// Replaces the part's generated section of the document, or appends it under its heading.
pub fn splice(old: &str, part: Part, section: &str) -> String {
    let old = if old.trim().is_empty() { "# Ensembles" } else { old };
    let heading = match part {
        Part::Piqa => "## PIQA: latest run",
        Part::Capitals => "## Capitals: latest run",
        Part::Bits => "## Bits per byte: latest run",
        Part::TwoMachines => "## Two machines: latest run",
    };
    crate::report::splice_marked(old, &format!("<!-- revis-bench:ensemble-{}:begin", part.name()), &end(part), heading, section)
}

fn piqa(o: &mut String, r: &Results) {
    let slices = slices(r);
    let per_item = |k: usize| r.piqa_member_wall[k].as_secs_f64() * 1e3 / r.piqa.len().max(1) as f64;
    let _ = writeln!(
        o,
        "- PIQA, zero-shot ({} items scored, {:.1} min of Score calls: {:.0} ms an item for {}, {:.0} ms for {})\n",
        r.piqa.len(),
        r.piqa_wall.as_secs_f64() / 60.0,
        per_item(0),
        r.members[0].name,
        per_item(1),
        r.members[1].name,
    );
    let mut head = "| rule |".to_owned();
    let mut rule_line = "|---|".to_owned();
    for (name, items) in &slices {
        let _ = write!(head, " {name} ({}) |", items.len());
        rule_line.push_str("---|");
    }
    let _ = writeln!(o, "{head} issue 13, items 0–499 |\n{rule_line}---|");
    for (rule, name, reference) in rules(r) {
        let mut line = if rule.reads_labels() { format!("| *{name}* |") } else { format!("| {name} |") };
        for (_, items) in &slices {
            let (acc, ratio) = choice::accuracy(rule, items);
            match ratio {
                Some(x) if x.is_infinite() => {
                    let _ = write!(line, " {acc:.1} (second model alone) |");
                }
                Some(x) => {
                    let _ = write!(line, " {acc:.1} (weight ratio {x:.2}) |");
                }
                None => {
                    let _ = write!(line, " {acc:.1} |");
                }
            }
        }
        let _ = writeln!(o, "{line} {} |", reference.map_or(String::new(), |v| format!("{v:.1}")));
    }
    let _ = writeln!(o);
    for (name, items) in &slices {
        let best = (0..2).max_by(|&x, &y| choice::accuracy(Rule::Alone(x), items).0.total_cmp(&choice::accuracy(Rule::Alone(y), items).0));
        let best = best.unwrap_or(0);
        let best_acc = choice::accuracy(Rule::Alone(best), items).0;
        let fixed = choice::accuracy(Rule::Calibrated, items).0;
        let (won, lost) = against(&choice::decide(Rule::Calibrated, items), &choice::decide(Rule::Alone(best), items), items);
        let disagree: Vec<&Item> = items.iter().filter(|it| (it.models[0].margin() > 0.0) != (it.models[1].margin() > 0.0)).collect();
        let second_right = disagree.iter().filter(|it| usize::from(it.models[1].margin() > 0.0) == it.label).count();
        let scale = choice::rms_margins(items);
        let _ = writeln!(
            o,
            "- {name}: calibrated sum {fixed:.1} against the better model alone ({}, {best_acc:.1}): {:+.1} points (target ≥ +{PIQA_GAIN}: {}); \
             it is right on {won} items where that model is wrong and wrong on {lost} where it is right. The models disagree on {} items \
             ({:.1}%), and {} is right on {second_right} of them. RMS per-byte margins: {:.4} and {:.4} nats per byte.",
            r.members[best].name,
            fixed - best_acc,
            verdict(Some(fixed - best_acc), PIQA_GAIN, true),
            disagree.len(),
            100.0 * disagree.len() as f64 / items.len().max(1) as f64,
            r.members[1].name,
            scale[0],
            scale[1],
        );
    }
    let _ = writeln!(o);
}

/// Items `a` gets right where `b` is wrong, and the other way round.
fn against(a: &[usize], b: &[usize], items: &[Item]) -> (usize, usize) {
    let mut won = 0;
    let mut lost = 0;
    for ((x, y), it) in a.iter().zip(b).zip(items) {
        match (*x == it.label, *y == it.label) {
            (true, false) => won += 1,
            (false, true) => lost += 1,
            _ => {}
        }
    }
    (won, lost)
}

/// Bytes per second of client wall time.
fn bytes_per_s(c: &Answers) -> f64 {
    c.bytes() as f64 / c.wall.as_secs_f64().max(1e-9)
}

fn capitals(o: &mut String, r: &Results, runs: &[Answers], a: &About<'_>) {
    let _ = writeln!(o, "- Capitals, exact match ({} questions, greedy, at most {} tokens)\n", r.capitals_total, a.capitals_max_tokens);
    let _ = writeln!(
        o,
        "| way of answering | right | % | issue 13 | generated tokens | bytes | bytes/s (client wall) | × the slower member | tokens/s (client wall) | round trips per 100 bytes | errors |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|");
    // The members alone come first: the slower of them is the reference of the speed target.
    let alone = &runs[..r.members.len().min(runs.len())];
    let slower = alone.iter().map(bytes_per_s).fold(f64::INFINITY, f64::min);
    for c in runs {
        let pct = 100.0 * c.right as f64 / r.capitals_total.max(1) as f64;
        let reference = reference(&c.method).1.map_or(String::new(), |v| format!("{v:.1}"));
        let wall_tps = c.generated_tokens as f64 / c.wall.as_secs_f64().max(1e-9);
        let trips = 100.0 * c.round_trips as f64 / c.bytes().max(1) as f64;
        let _ = writeln!(
            o,
            "| {} | {} | {pct:.1} | {reference} | {} | {} | {:.1} | {:.2} | {wall_tps:.1} | {trips:.2} | {} |",
            c.method,
            c.right,
            c.generated_tokens,
            c.bytes(),
            bytes_per_s(c),
            bytes_per_s(c) / slower,
            c.errors.len()
        );
    }
    let _ = writeln!(o);
    let best = alone.iter().map(|c| c.right).max().unwrap_or(0);
    for c in &runs[alone.len()..] {
        let points = 100.0 * (c.right as f64 - best as f64) / r.capitals_total.max(1) as f64;
        let speed = bytes_per_s(c) / slower;
        let _ = writeln!(
            o,
            "- {}: {points:+.1} points against the better member (target ≥ {:+.1}: {}); {speed:.2}× the slower member's bytes per second{}.",
            c.method,
            -CAPITALS_SLACK,
            verdict(Some(points), -CAPITALS_SLACK, true),
            if c.method.starts_with("`merge`") { String::new() } else { format!(" (target ≥ 0.5: {})", verdict(Some(speed), 0.5, true)) }
        );
    }
    for c in runs {
        for e in c.errors.iter().take(3) {
            let _ = writeln!(o, "- {}: {e}", c.method);
        }
    }
    let _ = writeln!(o);
}

fn bits(o: &mut String, r: &Results) {
    let bytes: usize = r.bits.iter().map(|b| b.bytes).sum();
    let words: usize = r.bits.iter().map(|b| b.words).sum();
    let units: usize = r.bits.iter().map(|b| b.units).sum();
    let _ = writeln!(o, "- Bits per byte ({} texts, {bytes} bytes scored, {:.1} min)\n", r.bits.len(), r.bits_wall.as_secs_f64() / 60.0);
    let _ = writeln!(o, "| model | bits per byte |\n|---|---|");
    for (m, member) in r.members.iter().enumerate() {
        let lp: f64 = r.bits.iter().map(|b| b.models[m]).sum();
        let _ = writeln!(o, "| {} alone | {:.4} |", member.name, bits_per_byte(lp, bytes));
    }
    let per_word: f64 = r.bits.iter().map(|b| b.per_word).sum();
    let per_text: f64 = r.bits.iter().map(|b| b.per_text).sum();
    let gated: f64 = r.bits.iter().map(|b| b.gated).sum();
    let opened: usize = r.bits.iter().map(|b| b.opened).sum();
    let _ = writeln!(o, "| mixture per word, equal weights | {:.4} |", bits_per_byte(per_word, bytes));
    let _ = writeln!(
        o,
        "| `merge`'s mixture: {} alone, mixed per word where its top token is under {} ({opened} of {units} words) | {:.4} |",
        r.members[0].name,
        super::bpb::merge_gate(),
        bits_per_byte(gated, bytes)
    );
    let _ = writeln!(o, "| mixture per text (Bayes), equal prior weights | {:.4} |", bits_per_byte(per_text, bytes));
    let _ = writeln!(
        o,
        "\n{words} words; {units} units after joining the words a token straddles ({} joins). Texts left out: {}.",
        words - units,
        r.bits_skipped.len()
    );
    for s in r.bits_skipped.iter().take(5) {
        let _ = writeln!(o, "- {s}");
    }
    let _ = writeln!(o);
}

/// Everything measured, per item, for reanalysis.
pub fn raw_json(r: &Results) -> serde_json::Value {
    json!({
        "members": r.members.iter().map(|m| json!({"model": m.name, "tier": m.tier.as_str()})).collect::<Vec<_>>(),
        "piqa_split": r.piqa_split,
        "piqa": r.piqa.iter().map(|it| json!({
            "label": it.label,
            "models": it.models.iter().map(|s| json!({"logprob": s.logprob, "bytes": s.bytes})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "two_machines": r.two_machines.iter().map(|c| json!({
            "method": c.method, "right": c.right, "answers": c.answers, "generated_tokens": c.generated_tokens,
            "wall_ms": c.wall.as_millis() as u64, "round_trips": c.round_trips, "errors": c.errors,
        })).collect::<Vec<_>>(),
        "capitals": r.capitals.iter().map(|c| json!({
            "method": c.method, "right": c.right, "answers": c.answers, "generated_tokens": c.generated_tokens,
            "generate_us": c.generate_us, "wall_ms": c.wall.as_millis() as u64, "round_trips": c.round_trips, "errors": c.errors,
        })).collect::<Vec<_>>(),
        "bits": r.bits.iter().map(|b| json!({
            "bytes": b.bytes, "models": b.models, "per_word": b.per_word, "gated": b.gated, "opened": b.opened,
            "per_text": b.per_text, "words": b.words, "units": b.units,
        })).collect::<Vec<_>>(),
        "bits_skipped": r.bits_skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_rewrites_its_own_section_only() {
        let section = |p: Part, body: &str| format!("{}\n{body}\n{}\n", begin(p), end(p));
        let doc = splice("# Ensembles\n\nintro\n", Part::Piqa, &section(Part::Piqa, "piqa 1"));
        let doc = splice(&doc, Part::Capitals, &section(Part::Capitals, "capitals 1"));
        assert!(doc.contains("## PIQA: latest run") && doc.contains("## Capitals: latest run"), "{doc}");
        let again = splice(&doc, Part::Capitals, &section(Part::Capitals, "capitals 2"));
        assert!(again.contains("piqa 1") && again.contains("capitals 2") && !again.contains("capitals 1"), "{again}");
        assert_eq!(again.matches("## Capitals: latest run").count(), 1);
        assert!(again.starts_with("# Ensembles\n\nintro\n"));
    }
}
