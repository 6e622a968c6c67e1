//! ARCHITECTURE.md's quoted paths and names against the tree.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::tree::TOP_LEVEL;

/// Paths ARCHITECTURE.md quotes that are not in the tree, and names it quotes
/// in code style that no source file writes.
pub fn problems(root: &Path) -> anyhow::Result<Vec<String>> {
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).context("reading ARCHITECTURE.md")?;
    let mut words = BTreeSet::new();
    let mut sources = Vec::new();
    collect_sources(root, &mut sources)?;
    for file in &sources {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let mut word = String::new();
        for c in text.chars().chain(std::iter::once(' ')) {
            if c.is_alphanumeric() || c == '_' {
                word.push(c);
            } else if !word.is_empty() {
                words.insert(std::mem::take(&mut word));
            }
        }
    }
    let mut problems = Vec::new();
    for quoted in quoted_code(&doc) {
        if let Some(path) = as_path(&quoted) {
            if !path_exists(root, path) {
                problems.push(format!("ARCHITECTURE.md quotes `{quoted}`, which is not in the tree"));
            }
        } else if let Some(name) = as_name(&quoted)
            && !words.contains(name)
        {
            problems.push(format!("ARCHITECTURE.md quotes `{quoted}`, but no source file writes `{name}`"));
        }
    }
    Ok(problems)
}

/// Files whose words count as written: code, the wire contract, manifests, scripts.
fn collect_sources(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with('.') && ![".ci", ".cargo", ".config"].contains(&name) || name == "target" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            collect_sources(&path, out)?;
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("rs" | "proto" | "toml" | "py" | "sh" | "plist" | "service"))
            || name == "run"
        {
            out.push(path);
        }
    }
    Ok(())
}

/// The `code spans` of a Markdown text, fenced blocks left out.
pub fn quoted_code(doc: &str) -> Vec<String> {
    // Code spans may wrap across lines (within a paragraph): read the text
    // outside fenced blocks as one, a line break inside a span a space.
    let mut prose = String::new();
    let mut fenced = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            prose.push('\n');
            continue;
        }
        if !fenced {
            prose.push_str(line.trim_start());
            prose.push(' ');
        }
    }
    prose.split('`').skip(1).step_by(2).map(|code| code.trim().to_owned()).collect()
}

/// A quoted path into the tree: starts with one of its top-level folders,
/// or is a source file's name (`turn.rs`, `revis.proto`).
pub fn as_path(q: &str) -> Option<&str> {
    let q = q.trim_end_matches('/');
    if q.contains(' ') || q.contains("::") {
        return None;
    }
    let into_tree = TOP_LEVEL.iter().any(|t| q.starts_with(t) || q == t.trim_end_matches('/'))
        || [".rs", ".proto"].iter().any(|e| q.ends_with(e)) && q.chars().all(|c| c.is_alphanumeric() || "_-./".contains(c));
    into_tree.then_some(q)
}

/// Whether a quoted path is in the tree: from the root, or (a bare or
/// partial file name) anywhere in a source folder.
fn path_exists(root: &Path, path: &str) -> bool {
    let path = path.split(':').next().unwrap_or(path);
    if path.contains('*') || root.join(path).exists() {
        return true;
    }
    let mut found = false;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for p in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if p.is_dir() && name != "target" && !name.starts_with('.') {
                found |= p.join(path).exists();
                stack.push(p);
            }
        }
    }
    found
}

/// The item a quoted Rust name refers to (its last segment): `Chat`,
/// `revis_models::choose`, `Dispatcher::run`, `KEEP_DECODE`.
pub fn as_name(q: &str) -> Option<&str> {
    let q = q.trim_end_matches("()").trim_end_matches('!');
    let ident =
        |s: &str| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_') && !s.starts_with(|c: char| c.is_ascii_digit());
    if !q.split("::").all(ident) {
        return None;
    }
    let last = q.rsplit("::").next()?;
    // A lone lower-case word is as likely prose or a command as a name.
    let namey = q.contains("::") || last.contains('_') || last.chars().any(|c| c.is_uppercase());
    namey.then_some(last)
}
