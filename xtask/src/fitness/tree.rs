//! The tree the checks read: where the crates are, its top-level folders,
//! and paths as the checks print them.

use std::path::{Path, PathBuf};

/// Where the workspace's crates keep their code (each has `src/`). The
/// end-to-end suite (`tests/`) is test code throughout and is not checked.
pub const CRATE_DIRS: &[&str] = &["crates/*", "revisd", "revis-gui", "xtask"];

/// The tree's top-level folders: a quoted path that starts with one is a
/// path into the tree.
pub const TOP_LEVEL: &[&str] =
    &["crates/", "revisd/", "revis-gui/", "proto/", "tests/", "docs/", "launchd/", "xtask/", "data/", ".ci/", ".config/", ".cargo/"];

pub fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).to_string_lossy().into_owned()
}

pub fn crate_dirs(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for pattern in CRATE_DIRS {
        if let Some(parent) = pattern.strip_suffix("/*") {
            let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join(parent))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.join("Cargo.toml").exists())
                .collect();
            dirs.sort();
            out.extend(dirs);
        } else {
            out.push(root.join(pattern));
        }
    }
    Ok(out)
}
