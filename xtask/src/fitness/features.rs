//! The bench's feature-unification list against the workspace's build.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, bail};

/// Packages that the bench's build and the workspace's build both compile,
/// with different features (crates/revis-bench/Cargo.toml names them to
/// make the two the same).
pub fn unification_problems(root: &Path) -> anyhow::Result<Vec<String>> {
    let features = |which: &[&str]| -> anyhow::Result<BTreeMap<(String, bool), BTreeSet<String>>> {
        let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(root)
            .args(["tree", "--offline", "-e", "normal,build", "-f", "{p}|{f}"])
            .args(which)
            .output()
            .context("cargo tree")?;
        if !out.status.success() {
            bail!("cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(by_unit(&String::from_utf8_lossy(&out.stdout)))
    };
    let workspace = features(&["--workspace"])?;
    let bench = features(&["-p", "revis-bench"])?;
    let mut problems = Vec::new();
    for ((pkg, host), theirs) in &bench {
        if let Some(ours) = workspace.get(&(pkg.clone(), *host))
            && ours != theirs
        {
            let pkg = format!("{pkg}{}", if *host { " (build side)" } else { "" });
            let missing: Vec<&String> = ours.difference(theirs).collect();
            let extra: Vec<&String> = theirs.difference(ours).collect();
            problems.push(format!(
                "{pkg} is built with other features for revis-bench than for the workspace (bench lacks {missing:?}, has beyond {extra:?}): name it with the workspace's features in crates/revis-bench/Cargo.toml's unification list"
            ));
        }
    }
    Ok(problems)
}

/// `cargo tree`'s indented output as each external package's features,
/// keyed by whether it is built for the host (a build script's or a proc
/// macro's dependency) or for the target: cargo resolves the two apart.
fn by_unit(tree: &str) -> BTreeMap<(String, bool), BTreeSet<String>> {
    let mut map: BTreeMap<(String, bool), BTreeSet<String>> = BTreeMap::new();
    let mut host: Vec<bool> = Vec::new();
    let mut marker: Vec<bool> = Vec::new();
    for line in tree.lines() {
        let prefix = line.chars().take_while(|c| !c.is_alphanumeric() && *c != '[').count();
        let depth = prefix / 4;
        let text: String = line.chars().skip(prefix).collect();
        if text.starts_with("[build-dependencies]") {
            // Written at the parent's indentation, for the lines below it.
            marker.resize(depth + 2, false);
            marker[depth + 1] = true;
            continue;
        }
        marker.resize(depth + 1, false);
        if text.starts_with('[') {
            continue; // [dev-dependencies]: not built for the programs
        }
        marker.truncate(depth + 1);
        let Some((pkg, feats)) = text.trim_end_matches(" (*)").split_once('|') else { continue };
        let on_host = depth > 0 && host.get(depth - 1).copied().unwrap_or(false) || marker[depth] || pkg.contains("(proc-macro)");
        host.truncate(depth);
        host.push(on_host);
        if pkg.contains("(/") {
            continue; // the workspace's own crates
        }
        let key = pkg.split(" (").next().unwrap_or(pkg).trim().to_owned();
        map.entry((key, on_host)).or_default().extend(feats.split(',').filter(|f| !f.is_empty()).map(str::to_owned));
    }
    map
}
