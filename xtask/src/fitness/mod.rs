//! Fitness checks on the tree's shape (`cargo xtask fitness`, run by `test`),
//! in the spirit of rust-analyzer's tidy tests: what review alone lets drift.
//!
//! - **No circles between rooms.** Within each crate, a module (a file) that
//!   names an item of another module depends on it; no chain of such
//!   dependencies may come back to where it started. A parent that re-exports
//!   or calls its child while the child uses the parent's items is a circle
//!   too: the shared item belongs in a room of its own. Test code
//!   (`#[cfg(test)]`) is left out.
//! - **A budget on a room's size**: [`BUDGET`] lines of non-test code per
//!   file, except the files named in [`OVER_BUDGET`], each with its reason.
//! - **The bench's feature-unification list holds**: every package the
//!   bench's own build and the workspace's build share is built with the same
//!   features (see crates/revis-bench/Cargo.toml).
//! - **ARCHITECTURE.md names what exists**: every path it quotes is a file or
//!   folder of the tree, and every name it quotes in code style is written
//!   somewhere in the code.
//!
//! The reading is lexical (comments and strings stripped, `use` trees
//! expanded, paths resolved through `crate`, `self`, `super`, child modules
//! and imported module names); it has no macro expansion, which these checks
//! do not need.

use std::path::Path;

use anyhow::bail;

mod architecture;
mod features;
mod lex;
mod modules;
mod tree;

use modules::ModuleTree;
use tree::{crate_dirs, rel};

/// Lines of non-test code a file may hold.
pub const BUDGET: usize = 600;

/// Files allowed over [`BUDGET`], each with the reason it is one room.
pub const OVER_BUDGET: &[(&str, &str)] = &[];

pub fn check(root: &Path) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    let crates = crate_dirs(root)?;
    for dir in &crates {
        let tree = ModuleTree::read(dir)?;
        for (scc, cycle) in tree.cycles() {
            let members: Vec<String> = scc.iter().map(|m| tree.describe(m, root)).collect();
            let names: Vec<String> = cycle.iter().map(|m| tree.describe(m, root)).collect();
            problems.push(format!("import circle among {} (for one: {})", members.join(", "), names.join(" → ")));
        }
        for (file, lines) in tree.sizes() {
            let rel = rel(root, &file);
            let allowed = OVER_BUDGET.iter().any(|(f, _)| *f == rel);
            if lines > BUDGET && !allowed {
                problems.push(format!(
                    "{rel}: {lines} lines of non-test code, over the budget of {BUDGET}: split it by job, or name it in OVER_BUDGET (xtask/src/fitness/mod.rs) with its reason"
                ));
            }
            if allowed && lines <= BUDGET {
                problems.push(format!("{rel} is named in OVER_BUDGET but holds {lines} lines: take it off the list"));
            }
        }
    }
    for (f, _) in OVER_BUDGET {
        if !root.join(f).exists() {
            problems.push(format!("{f} is named in OVER_BUDGET but does not exist"));
        }
    }
    problems.extend(features::unification_problems(root)?);
    problems.extend(architecture::problems(root)?);
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("xtask fitness: {p}");
        }
        bail!("{} fitness problem(s)", problems.len());
    }
    eprintln!(
        "xtask: fitness holds (no import circle, files within {BUDGET} lines or named, feature list unified, ARCHITECTURE.md's names exist)"
    );
    Ok(())
}
